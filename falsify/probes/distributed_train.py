"""distributed-train-v1's probes: the real DistributedTrainer (falsify/llm/distributed.py) in W
spawned processes on gloo, against one process running the plain Trainer on the same global
batches.

The ranks rendezvous through a FileStore in a temporary directory (no port to collide with
a neighbouring test). They are fresh interpreters, so the harness's binding override (a mutant)
does not reach them by itself: the parent passes each data-parallel piece as its
`module:function` binding, and every rank imports that.
"""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

CONTRACT = "distributed-train-v1"
PIECES = {"shard": "shard", "global_counts": "global_counts", "grad_scale": "grad_scale",
          "clip": "clip_gradients", "checkpoint_state": "checkpoint_state",
          "commit": "wait_for_ranks"}
EPS32 = 2.0 ** -24


def _refs() -> dict:
    from falsify.harness import backends, runtime

    c = runtime.contract(CONTRACT)
    return {field: backends.binding_ref(c, eq, "torch")[0] for eq, field in PIECES.items()}


def _config():
    from falsify.llm import run as RUN

    # clip and Andon out of reach: the pre-clip norm is compared, and AdamW sees the gradient
    return RUN.tiny_config("unused", max_steps=10, warmup_steps=0, grad_clip=1e9,
                           andon_grad_norm=1e9, device="cpu", backend="torch")


def global_batches(steps: int, world: int, rows: int, grad_accum: int, seq: int, vocab: int,
                   seed: int) -> list:
    """`steps` steps of `grad_accum` global micro-batches [rows·world, seq]. The last rank's rows
    keep only 2 to 4 targets per row: the ranks count very different numbers of tokens, which
    is where a mean of per-rank means departs from the token-weighted loss."""
    import torch

    from falsify.llm.trainer import IGNORE_INDEX

    g = torch.Generator().manual_seed(seed)
    out = []
    for t in range(steps):
        micro = []
        for m in range(grad_accum):
            x = torch.randint(4, vocab, (rows * world, seq), generator=g)
            y = torch.randint(4, vocab, (rows * world, seq), generator=g)
            y[(world - 1) * rows:, : seq - 2 - (t + m) % 3] = IGNORE_INDEX
            micro.append((x, y))
        out.append(micro)
    return out


def _digest(trainer) -> str:
    """sha256 of every parameter and AdamW moment (whole, under FSDP), in optimizer order."""
    from falsify.llm.distributed import full

    h = hashlib.sha256()
    for p in trainer.params:
        h.update(full(p.detach()).contiguous().numpy().tobytes())
        st = trainer.optimizer.state.get(p, {})
        for k in ("exp_avg", "exp_avg_sq"):
            if k in st:
                h.update(full(st[k]).contiguous().numpy().tobytes())
    return h.hexdigest()


def _join(rank: int, world: int, tmp: str) -> None:
    """Join the probe's gloo group; a peer that is gone fails a collective within 2 minutes
    instead of the default half hour."""
    import datetime

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=120))


def _rank_parts(rank: int, world: int, refs: dict, parallel: str):
    """(DistParts with the bound pieces, train config, model config, a factory of a fresh
    model and its DistributedTrainer)."""
    import torch

    from falsify.harness import backends
    from falsify.llm import config as LC
    from falsify.llm import distributed as D
    from falsify.llm.model import build_model
    from falsify.llm.trainer import LoopParts

    pieces = {k: backends.resolve(v) for k, v in refs.items()}
    clip = pieces.pop("clip_gradients")
    dparts = D.DistParts(**pieces)
    cfg = _config()
    mcfg = LC.model_config(cfg)

    def make():
        model = build_model(mcfg, "torch", seed=0)
        tr = D.DistributedTrainer(model, cfg, torch.device("cpu"),
                                  parts=LoopParts(clip_gradients=clip),
                                  world=D.World(rank, world, "gloo"), dparts=dparts,
                                  parallel=parallel)
        _MADE.append(tr)
        return model, tr
    return dparts, cfg, mcfg, make


_MADE: list = []  # this rank's trainers, released before the group goes (_leave)


def _leave() -> None:
    """Release every trainer this rank made, then destroy the group (distributed.leave)."""
    from falsify.llm import distributed as D

    while _MADE:
        _MADE.pop().release()
    D.leave(completed=False)


def _rank_main(rank: int, world: int, tmp: str, refs: dict, steps: int, rows: int,
               seed: int, parallel: str) -> None:
    """One rank: join the group, train `steps` steps on its shards, save what it saw."""
    import torch

    from falsify.llm import distributed as D

    _join(rank, world, tmp)
    try:
        dparts, cfg, mcfg, make = _rank_parts(rank, world, refs, parallel)
        model, tr = make()
        batches = global_batches(steps, world, rows, cfg.grad_accum, mcfg.max_seq_len,
                                 mcfg.vocab_size, seed)
        read, stats, digests = [], [], []
        for micro in batches:
            mine = dparts.shard(micro, rank, world)
            # which global rows this rank read (random rows: each is unique in its batch)
            read.append([[int((gx == r).all(1).nonzero()[0]) for r in x]
                         for (gx, _), (x, _) in zip(micro, mine, strict=True)])
            st = tr.train_step(mine)
            stats.append((st.loss, st.grad_norm, st.tokens))
            digests.append(_digest(tr))
        params = {n: D.full(p.detach()).clone() for n, p in model.named_parameters()}
        torch.save({"read": read, "stats": stats, "digests": digests, "params": params},
                   Path(tmp) / f"rank{rank}.pt")
    finally:
        _leave()


def _single(steps: int, world: int, rows: int, seed: int) -> dict:
    """The plain Trainer in this process on the same global batches."""
    import torch

    from falsify.llm import config as LC
    from falsify.llm.model import build_model
    from falsify.llm.trainer import LoopParts, Trainer

    cfg = _config()
    mcfg = LC.model_config(cfg)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = build_model(mcfg, "torch", seed=0)
        init = {n: p.detach().clone() for n, p in model.named_parameters()}
        tr = Trainer(model, cfg, torch.device("cpu"), parts=LoopParts())
        stats = [tr.train_step(m) for m in global_batches(
            steps, world, rows, cfg.grad_accum, mcfg.max_seq_len, mcfg.vocab_size, seed)]
    finally:
        torch.set_num_threads(threads)
    lrs = [tr.lr(t) for t in range(steps)]
    return {"stats": [(s.loss, s.grad_norm, s.tokens) for s in stats], "init": init,
            "params": {n: p.detach().clone() for n, p in model.named_parameters()},
            "lrs": lrs}


_MEMO: dict = {}


def ddp_equivalence_run(backend: str = "torch", dtype: str = "float32", world: int = 2,
                        steps: int = 3, rows: int = 2, seed: int = 0,
                        parallel: str = "ddp") -> dict:
    """`world` ranks × `rows` rows per micro-batch against one process × rows·world rows, on the
    same global batches: per-step loss, pre-clip gradient norm and token count, the final
    weights, the ranks' replicas after every step, and which rows each rank read. The three
    checks read one run; the key holds every piece's binding, so a run with a mutant bound is
    never answered from one without it."""
    refs = _refs()
    return _memoised((world, steps, rows, seed, parallel, tuple(sorted(refs.items()))),
                     lambda: _equivalence(refs, world, steps, rows, seed, parallel))


def _memoised(key: tuple, compute):
    """One run per key (the checks of an obligation share it)."""
    if key not in _MEMO:
        _MEMO[key] = compute()
    return _MEMO[key]


def _equivalence(refs: dict, world: int, steps: int, rows: int, seed: int,
                 parallel: str) -> dict:
    import torch
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(_rank_main, args=(world, tmp, refs, steps, rows, seed, parallel),
                           nprocs=world, start_method="spawn", join=True)
        ranks = [torch.load(Path(tmp) / f"rank{r}.pt") for r in range(world)]
    one = _single(steps, world, rows, seed)
    ddp = ranks[0]["stats"]
    rel = lambda a, b: abs(a - b) / abs(b)  # noqa: E731
    # rows read: per step and micro-batch, disjoint across ranks and together every row
    disjoint = union = True
    for t in range(steps):
        for m in range(len(ranks[0]["read"][t])):
            sets = [set(r["read"][t][m]) for r in ranks]
            disjoint &= sum(len(s) for s in sets) == len(set().union(*sets))
            union &= set().union(*sets) == set(range(rows * world))
    upd = max(float(torch.linalg.vector_norm(one["params"][n] - one["init"][n]))
              for n in one["init"])
    drift = max(float(torch.linalg.vector_norm(ranks[0]["params"][n] - one["params"][n]))
                for n in one["init"])
    return {"steps": len(ddp), "world": world, "parallel": parallel,
            "loss_rel": max(rel(a[0], b[0]) for a, b in zip(ddp, one["stats"], strict=True)),
            "gnorm_rel": max(rel(a[1], b[1]) for a, b in zip(ddp, one["stats"], strict=True)),
            "tokens_equal": [a[2] for a in ddp] == [b[2] for b in one["stats"]],
            "param_rel": drift / upd,
            "replicas_identical": all(r["digests"] == ranks[0]["digests"] for r in ranks),
            "disjoint": disjoint, "union_is_batch": union, "eps32": EPS32}


# --------------------------------------------------------------------------- checkpoints
def _whole_state(trainer) -> dict:
    """Every parameter and AdamW tensor, whole (gathered under FSDP: collective)."""
    from falsify.llm.distributed import full

    out = {}
    for name, p in zip(trainer.param_names, trainer.params, strict=True):
        out[name] = full(p.detach()).clone()
        for k, v in trainer.optimizer.state.get(p, {}).items():
            out[f"{name}.{k}"] = full(v).clone()
    return out


def _ckpt_rank_main(rank: int, world: int, tmp: str, refs: dict, rows: int, seed: int,
                    parallel: str, slow_rank: int, slow_s: float) -> None:
    """One rank: 2 steps, a sharded save (rank `slow_rank` writes its RNG file `slow_s` late),
    a third step; then a fresh model and trainer restored from the checkpoint take the third
    step again."""
    import time

    import torch
    import torch.distributed as dist

    from falsify.llm import checkpoint as C
    from falsify.llm import sharded_checkpoint as SC
    from falsify.llm.checkpoint_load import load_checkpoint

    _join(rank, world, tmp)
    out = {"lost": [], "damage": None, "load_error": None}
    try:
        dparts, cfg, mcfg, make = _rank_parts(rank, world, refs, parallel)
        batches = global_batches(3, world, rows, cfg.grad_accum, mcfg.max_seq_len,
                                 mcfg.vocab_size, seed)
        model, tr = make()
        for micro in batches[:2]:
            tr.train_step(dparts.shard(micro, rank, world))
        whole = _whole_state(tr)
        real_save_file = SC.save_file

        def slow_save_file(tensors, path, **kw):  # the late rank's part of the checkpoint
            time.sleep(slow_s)
            try:
                real_save_file(tensors, path, **kw)
            except Exception:  # safetensors' own error for a missing directory, among others
                if Path(path).parent.is_dir():
                    raise
                out["lost"].append(rank)  # its directory was renamed into place without it

        if rank == slow_rank:
            SC.save_file = slow_save_file
        try:
            ck = SC.save(Path(tmp) / "run", tr.step, model, tr.optimizer, tr.param_names,
                         rank=rank, world_size=world, data_state={}, config={},
                         state_fn=dparts.checkpoint_state, wait=dparts.wait_for_ranks)
        finally:
            SC.save_file = real_save_file
        if rank == 0:
            try:
                C.verify_checkpoint(ck)
            except C.CheckpointDamaged as e:
                out["damage"] = str(e)
            torch.save(whole, Path(tmp) / "whole.pt")
        tr.train_step(dparts.shard(batches[2], rank, world))
        out["want"] = _digest(tr)
        model2, tr2 = make()
        try:
            state = load_checkpoint(ck, model2, tr2.optimizer, tr2.param_names)
        except C.CheckpointError as e:  # a rank's own RNG file missing fails that rank only
            out["load_error"] = str(e)
        loaded = torch.tensor([0 if out["load_error"] else 1])
        dist.all_reduce(loaded, op=dist.ReduceOp.MIN)  # so every rank trains, or none
        if loaded.item():
            tr2.step = int(state["step"])
            tr2.train_step(dparts.shard(batches[2], rank, world))
            out["got"] = _digest(tr2)
        out["ckpt"] = str(ck)
        torch.save(out, Path(tmp) / f"ckpt{rank}.pt")
    finally:
        _leave()


def _single_load(ckpt: Path) -> dict:
    """The sharded checkpoint read by one process (no process group): its whole state. This
    process's RNG states are put back afterwards (loading a checkpoint sets them)."""
    import torch

    from falsify.llm import checkpoint as C
    from falsify.llm import config as LC
    from falsify.llm.checkpoint_load import load_checkpoint
    from falsify.llm.model import build_model
    from falsify.llm.trainer import LoopParts, Trainer

    cfg = _config()
    js, tensors = C.rng_state()
    try:
        model = build_model(LC.model_config(cfg), "torch", seed=1)  # not the saved weights
        tr = Trainer(model, cfg, torch.device("cpu"), parts=LoopParts())
        load_checkpoint(ckpt, model, tr.optimizer, tr.param_names)
        return _whole_state(tr)
    finally:
        C.set_rng_state(js, tensors)


def sharded_checkpoint_run(backend: str = "torch", dtype: str = "float32", world: int = 2,
                           rows: int = 2, seed: int = 0, parallel: str = "fsdp",
                           slow_s: float = 1.5) -> dict:
    """A sharded checkpoint after 2 steps of `world` ranks (the last rank's part written
    `slow_s` late): whether rank 0 found it complete the moment it was committed, which rank's
    write found no directory, whether a restore on `world` ranks takes step 3 bit for bit as
    the uninterrupted run did, and whether one process reads the ranks' whole state exactly."""
    refs = _refs()
    return _memoised(("ckpt", world, rows, seed, parallel, slow_s, tuple(sorted(refs.items()))),
                     lambda: _checkpoint(refs, world, rows, seed, parallel, slow_s))


def _checkpoint(refs: dict, world: int, rows: int, seed: int, parallel: str,
                slow_s: float) -> dict:
    import torch
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(_ckpt_rank_main,
                           args=(world, tmp, refs, rows, seed, parallel, world - 1, slow_s),
                           nprocs=world, start_method="spawn", join=True)
        ranks = [torch.load(Path(tmp) / f"ckpt{r}.pt") for r in range(world)]
        whole = torch.load(Path(tmp) / "whole.pt")
        single, single_error = None, None
        try:
            single = _single_load(Path(ranks[0]["ckpt"]))
        except Exception as e:  # noqa: BLE001 (reported in the result, which the check reads)
            single_error = f"{type(e).__name__}: {e}"
    single_equal = single is not None and single.keys() == whole.keys() and all(
        torch.equal(single[k], whole[k]) for k in whole)
    return {"world": world, "parallel": parallel,
            "complete_at_commit": ranks[0]["damage"] is None, "damage": ranks[0]["damage"],
            "lost_writes": sorted(r for o in ranks for r in o["lost"]),
            "load_errors": [o["load_error"] for o in ranks if o["load_error"]],
            "resume_identical": all(o.get("got") is not None and o["got"] == o["want"]
                                    for o in ranks),
            "single_equal": single_equal, "single_error": single_error}
