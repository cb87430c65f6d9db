"""Executable probes: the `run:` functions of training-kind checks, one module per kernel."""


def device(backend: str) -> str:
    """Where `backend`'s tensors live (harness.backends.device_for): "cuda" for Triton compiled
    for a GPU, "cpu" for the reference, torch and Triton under the interpreter.

    Probes draw their inputs on the CPU from seeded generators, so the values are bit-identical
    on every device, and then move them here with `.to(device(backend))` (a no-op returning the
    same tensor on the CPU)."""
    from falsify.harness import backends

    return backends.device_for(backend)
