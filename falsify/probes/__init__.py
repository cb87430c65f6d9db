"""Executable probes: the `run:` functions of training-kind checks, one module per kernel."""


def device(backend: str) -> str:
    """Where `backend`'s tensors live (harness.backends.device_for): "cuda" for Triton compiled
    for a GPU, "cpu" for the reference, torch and Triton under the interpreter.

    Probes draw their inputs on the CPU from seeded generators, so the values are bit-identical
    on every device, and then move them here with `.to(device(backend))` (a no-op returning the
    same tensor on the CPU)."""
    from falsify.harness import backends

    return backends.device_for(backend)


def watch_evaluation(model, hooked, evaluate, explicit, n_batches: int, seed: int) -> dict:
    """What an evaluation does to a model with dropout, for the loops' evaluation checks
    (train-loop-v1 TL-EVL-001, qlora-finetune-v1 QFT-EVL-001): `explicit(train)` is the probe's
    own no-grad loss over the batches in that mode, `evaluate()` the loop's, and a forward hook
    on `hooked` (the module every forward of the evaluation ends in) records, per forward,
    whether autograd was on, whether any module of `model` was training, and whether the
    output is part of a graph. The evaluation runs from train mode twice, then once from eval
    mode; each time the modes are compared before and after. Global RNG state is left as it
    was."""
    import torch

    def modes() -> list[bool]:
        return [m.training for m in model.modules()]

    seen = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        want, with_dropout = explicit(False), explicit(True)
        hook = hooked.register_forward_hook(lambda mod, args, out: seen.append(
            (torch.is_grad_enabled(), any(modes()), out.grad_fn is not None)))
        try:
            model.train()
            before = modes()
            first = evaluate()
            restored_train = modes() == before
            second = evaluate()
            model.eval()
            before = modes()
            evaluate()
            restored_eval = modes() == before
        finally:
            hook.remove()
            model.train()
    return {"first": first, "second": second, "explicit": want,
            "dropout_effect": abs(with_dropout - want), "forwards": len(seen),
            "expected_forwards": 3 * n_batches,
            "grad_enabled": sum(s[0] for s in seen), "train_mode": sum(s[1] for s in seen),
            "graph": sum(s[2] for s in seen), "restored_train": restored_train,
            "restored_eval": restored_eval}
