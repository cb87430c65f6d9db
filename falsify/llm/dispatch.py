"""Parity-gated dispatch: which backend runs each kernel of the model, chosen from the results
ledger by a policy (the run config's `backend` field).

Policies:
- `fastest-verified`: per kernel, the fastest backend that is *verified* for the run's dtype and
  device. "Fastest" is read from a `falsify bench kernels --save-baseline` file (config field
  `bench_baseline`): the kernel's "normal" row, forward+backward where measured. A kernel with
  one verified backend needs no timing; with several and no timing for them, the run stops and
  says which file to write: a guess is not a choice.
- `prefer:<backend>`: that backend for every kernel it is verified for; for the others, as
  `fastest-verified` over the remaining backends, and the log says why.
- `reference`: the torch backend for every kernel (PyTorch's operators and the project's plain
  formulations: the baseline the other backends are measured against), taken because it was
  asked for; its ledger status is recorded beside it, verified or not.

Verified (kernel k, backend b, dtype v, device d) means, from the ledger (config field `ledger`,
default the project's):
1. the contract whose `metadata.kernel` is k has, for every check run that the plan requires on
   b at variant v or at a variant that is no dtype (proofs, static compiles, the dtypes probe),
   a passed result for the current contract text and implementation source (the entry's
   `impl_sha`, falsify.harness.fingerprint). A stale, failed, skipped or missing result is not
   verified, and the reason names the first one.
2. On a GPU, the contract's `device` checks on b (the GPU against the CPU) passed on that very
   GPU model (the entry's `gpu`); without a GPU, a `device` check skipped for want of one counts.
3. For the kernels the model-parity-v1 contract binds, its checks on b passed the same way: the
   whole model on b stayed within the depth's budget against the float64 reference. The
   training step's kernels (AdamW, clipping, schedule) and the fused LM-head loss are outside
   that contract; the reason says so.

A backend without a verified result is never chosen silently: `fastest-verified` and `prefer`
stop with the reasons when no backend is verified for a kernel.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from falsify.llm.ops import FASTEST, PREFER, REFERENCE, is_policy  # noqa: F401 (re-exported)
from falsify.llm.ops import POLICY_BACKENDS as CANDIDATES  # in the order ties are broken

log = logging.getLogger(__name__)

DTYPE_VARIANTS = ("float16", "bfloat16", "float32", "float64")
PARITY_CONTRACT = "model-parity-v1"
# the bench row's column holding each backend's time (falsify/bench/kernels.py save_baseline)
TIME_COLUMN = {"torch": "ours_ms", "triton": "triton_ms"}


class DispatchError(RuntimeError):
    """No backend can be chosen for a kernel under the policy, or its inputs are unusable."""


def check_policy(backend: str) -> str | None:
    """Why `backend` is not a valid policy, or None."""
    from falsify.llm.ops import backend_error

    return backend_error(backend) if is_policy(backend) else f"{backend!r} is not a policy"


@dataclass(frozen=True)
class Context:
    """What verification is judged against: the ledger, the timings, the run's dtype and GPU."""

    ledger: Path | None  # None: no project and no `ledger` field
    baseline: Path | None  # `falsify bench kernels --save-baseline` file, or None
    dtype: str  # a contract variant: float32 | bfloat16
    gpu: str | None  # the CUDA device's name, None on the CPU

    @property
    def device(self) -> str:
        return f"cuda ({self.gpu})" if self.gpu else "cpu"


@dataclass(frozen=True)
class Choice:
    backend: str
    reason: str


def default_ledger() -> Path | None:
    from falsify.harness.project import find_project

    p = find_project()
    return p.ledger_path if p else None


# ------------------------------------------------------------------------------ evidence
class Evidence:
    """The ledger and the contracts, read once per resolution."""

    def __init__(self, ctx: Context):
        from falsify.harness import ledger
        from falsify.harness.project import find_project, id_space

        self.ctx = ctx
        if ctx.ledger is None:
            raise DispatchError("no ledger to verify kernels against: no falsify project was "
                                "found from the working directory (falsify init), and the config "
                                "has no `ledger` field")
        if not Path(ctx.ledger).is_file():
            raise DispatchError(f"ledger {ctx.ledger} does not exist: run `falsify run` to "
                                "check the kernels first")
        try:
            self.data = ledger.load(Path(ctx.ledger))
        except ledger.LedgerError as e:
            raise DispatchError(str(e)) from None
        self.space = id_space(find_project())
        self._by_kernel: dict[str, object] | None = None

    def contract_for(self, kernel: str):
        """The contract whose metadata.kernel is `kernel`: the library's, or the project's
        override of it (every contract of the id space is read once)."""
        from falsify.harness.model import load_contract

        if self._by_kernel is None:
            self._by_kernel = {}
            for _, entry in sorted(self.space.items()):
                c, _ = load_contract(entry.path)
                if c.kernel:
                    self._by_kernel.setdefault(c.kernel, c)
        return self._by_kernel.get(kernel)

    @cached_property
    def gate(self):
        """The model parity contract, or None where the id space has none."""
        from falsify.harness.model import load_contract

        e = self.space.get(PARITY_CONTRACT)
        return load_contract(e.path)[0] if e else None

    def unmet(self, c, backend: str) -> str | None:
        """The first required run of contract `c` on `backend` that is not a current pass for
        this dtype and device, described; None when every one is."""
        from falsify.harness.coverage import current, skipped_for_gpu
        from falsify.harness.ledger import run_key
        from falsify.harness.plan import runs

        gpu, seen = self.ctx.gpu, 0
        for t in c.checks:
            for r in runs(c, t):
                if r.backend != backend:
                    continue
                if r.variant in DTYPE_VARIANTS and r.variant != self.ctx.dtype:
                    continue
                seen += r.variant == self.ctx.dtype
                where = f"{c.id} {t.id} on {backend}/{r.variant}"
                e = self.data["runs"].get(run_key(dict(contract=c.id, check=t.id,
                                                       backend=backend, variant=r.variant)))
                if e is None:
                    return f"{where}: no result"
                if not current(c, e, t):
                    return f"{where}: stale (the contract or the implementation changed since)"
                if t.kind == "device":
                    if gpu is None and skipped_for_gpu(e):
                        continue
                    if gpu is not None and e.get("gpu") != gpu:
                        return (f"{where}: {e['outcome']} on "
                                f"{e.get('gpu') or 'a machine without a GPU'}, not on {gpu}")
                if e["outcome"] != "passed":
                    return f"{where}: {e['outcome']}"
        if not seen:
            return f"{c.id} has no check on {backend} at {self.ctx.dtype}"
        return None

    def verified(self, kernel: str, backend: str) -> tuple[bool, str]:
        """(verified, why) for one kernel on one backend."""
        c = self.contract_for(kernel)
        if c is None:
            return False, f"no contract has metadata.kernel {kernel!r}"
        bad = self.unmet(c, backend)
        if bad:
            return False, bad
        gate = self.gate
        if gate is None or kernel not in gate.equations:
            return True, f"{c.id} passed on {backend}/{self.ctx.dtype} ({PARITY_CONTRACT} " \
                         f"does not cover {kernel})"
        bad = self.unmet(gate, backend)
        if bad:
            return False, f"{c.id} passed, but the model parity gate did not: {bad}"
        return True, f"{c.id} and {PARITY_CONTRACT} passed on {backend}/{self.ctx.dtype}"


# ------------------------------------------------------------------------------ timings
def load_timings(path: Path | None, gpu: str | None) -> dict | None:
    """kernel -> backend -> ms from a bench baseline file; None without one."""
    if path is None:
        return None
    from falsify.errors import UsageError
    from falsify.llm.bench_baseline import load_baseline

    try:
        doc = load_baseline(Path(path))
    except UsageError as e:
        raise DispatchError(f"bench_baseline: {e}") from None
    there = (doc.get("machine") or {}).get("gpu")
    if there != gpu:
        raise DispatchError(f"bench_baseline {path} was measured "
                            f"{'on ' + there if there else 'without a GPU'}; this run is on "
                            f"{gpu or 'the CPU'}: time the kernels here "
                            "(falsify bench kernels --save-baseline FILE)")
    best: dict[str, tuple] = {}
    for r in doc["rows"]:
        # the "normal" shape before the large one, the training pass (fwd+bwd) before the
        # forward alone
        rank = (r.get("size") != "normal", r["pass"] != "fwd+bwd")
        if r["kernel"] not in best or rank < best[r["kernel"]][0]:
            best[r["kernel"]] = (rank, r)

    def ms(v) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0

    return {k: {b: float(r[col]) for b, col in TIME_COLUMN.items() if ms(r.get(col))}
            | {"_row": f"{r['shape']} {r['pass']}"} for k, (_, r) in best.items()}


# ------------------------------------------------------------------------------ policies
def _fastest(kernel: str, verified: dict[str, str], timings: dict | None,
             baseline: Path | None) -> Choice:
    names = list(verified)
    if len(names) == 1:
        return Choice(names[0], f"the only verified backend: {verified[names[0]]}")
    t = (timings or {}).get(kernel, {})
    timed = {b: t[b] for b in names if b in t}
    if not timed:
        src = f"{baseline} has no row timing them" if baseline else "no bench_baseline is set"
        raise DispatchError(f"{kernel}: {', '.join(names)} are all verified and {src}: write "
                            "one with `falsify bench kernels --save-baseline FILE` and set "
                            "bench_baseline=FILE, or choose with backend=prefer:<backend>")
    b = min(timed, key=timed.get)
    others = ", ".join(f"{o} {timed[o]:.3g} ms" for o in timed if o != b)
    untimed = [o for o in names if o not in timed]
    return Choice(b, f"fastest verified: {timed[b]:.3g} ms ({t['_row']}, {baseline})"
                  + (f" vs {others}" if others else "")
                  + (f"; {', '.join(untimed)} verified but not timed here" if untimed else "")
                  + f"; {verified[b]}")


def choose(kernel: str, policy: str, runnable: dict[str, str | None], ev: Evidence | None,
           timings: dict | None, ctx: Context,
           missing: str = "no ledger to report its status") -> Choice:
    """One kernel's backend under `policy`. `runnable`: backend -> why it cannot run here (None
    when it can); `ev` is None only under `reference` without a usable ledger (`missing`
    says why)."""
    if policy == REFERENCE:
        if ev is None:
            return Choice("torch", f"policy reference ({missing})")
        ok, why = ev.verified(kernel, "torch")
        return Choice("torch", f"policy reference; {'verified' if ok else 'NOT verified'}: {why}")
    verified, refused = {}, []
    for b in CANDIDATES:
        if runnable.get(b):
            refused.append(f"{b} cannot run here ({runnable[b]})")
            continue
        ok, why = ev.verified(kernel, b)
        if ok:
            verified[b] = why
        else:
            refused.append(f"{b}: {why}")
    if policy.startswith(PREFER):
        want = policy[len(PREFER):]
        if want in verified:
            return Choice(want, f"preferred and verified: {verified[want]}")
        if not verified:
            raise DispatchError(f"{kernel}: no backend is verified for {ctx.dtype} on "
                                f"{ctx.device} — " + "; ".join(refused))
        c = _fastest(kernel, verified, timings, ctx.baseline)
        why_not = next(r for r in refused if r.startswith(want))
        return Choice(c.backend, f"{want} not verified ({why_not}); {c.reason}")
    if not verified:
        raise DispatchError(f"{kernel}: no backend is verified for {ctx.dtype} on "
                            f"{ctx.device} — " + "; ".join(refused))
    c = _fastest(kernel, verified, timings, ctx.baseline)
    if refused:
        c = Choice(c.backend, c.reason + "; not chosen: " + "; ".join(refused))
    return c


def resolve(policy: str, kernels: list[str], runnable: dict[str, str | None],
            ctx: Context) -> dict[str, Choice]:
    """kernel -> Choice for every kernel, each logged."""
    bad = check_policy(policy)
    if bad:
        raise DispatchError(f"backend={policy!r}: {bad}")
    ev, missing = None, "no ledger to report its status"
    if policy != REFERENCE:
        ev = Evidence(ctx)
    elif ctx.ledger is not None:
        try:  # `reference` needs no ledger: without one it says so beside each kernel
            ev = Evidence(ctx)
        except DispatchError as e:
            missing = str(e)
    timings = load_timings(ctx.baseline, ctx.gpu) if policy != REFERENCE else None
    out = {}
    for k in kernels:
        out[k] = choose(k, policy, runnable, ev, timings, ctx, missing)
        log.info("dispatch %s: %s -> %s (%s)", policy, k, out[k].backend, out[k].reason)
    return out


def record(choices: dict[str, Choice], ctx: Context) -> dict:
    """What the run config and every checkpoint keep of the choice."""
    return {"ledger": str(ctx.ledger) if ctx.ledger else None,
            "bench_baseline": str(ctx.baseline) if ctx.baseline else None,
            "dtype": ctx.dtype, "device": ctx.device,
            "kernels": {k: {"backend": c.backend, "reason": c.reason}
                        for k, c in choices.items()}}


def configure(policy: str, ctx: Context):
    """Resolve `policy` for every kernel of the model's bundle and install the result
    (falsify/llm/ops.install): the model built afterwards in this process runs it. A host kernel
    (the schedule: float64 scalars, one implementation) is verified on its one backend at
    float64 like any other kernel."""
    import dataclasses

    from falsify.llm import ops

    can = ops.runnable()
    fixed = [k for k in ops.ALL_KERNELS if k in ops.HOST_KERNELS]
    choices = resolve(policy, [k for k in ops.ALL_KERNELS if k not in fixed], can, ctx)
    for k in fixed:
        only = ops.HOST_KERNELS[k]
        one = {b: (None if b == only else "no implementation") for b in CANDIDATES}
        choices.update(resolve(REFERENCE if policy == REFERENCE else FASTEST, [k], one,
                               dataclasses.replace(ctx, dtype="float64")))
    return ops.install(policy, {k: c.backend for k, c in choices.items()},
                       record(choices, ctx))
