"""SwiGLU contract: the aliasing probe."""

from falsify.probes import device

CONTRACT = "swiglu-kernel-v1"


def aliasing_probe(backend, dtype="float32", m=3, n=40):
    """Exercise the in-place backward's aliasing rule on the contract's bound
    `swiglu_backward_inplace` (looked up through the harness, so mutants are what runs):
    the legal call must return gate's and up's own storage and leave dy alone; every illegal
    aliasing (up is gate, partial overlaps, dy overlapping an output) must raise before anything
    is written."""
    import torch

    from falsify.harness import backends, runtime

    fn = backends.function(runtime.contract(CONTRACT), "swiglu_backward_inplace", backend)
    dev = device(backend)
    dt = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(m * 100 + n)

    def fresh(rows=m, cols=n):
        return (torch.randn(rows, cols, generator=gen) * 4).to(dt).to(dev)

    gate, up, dy = fresh(), fresh(), fresh()
    dy0 = dy.clone()
    d_gate, d_up = fn(gate, up, dy)
    in_place = (d_gate.data_ptr() == gate.data_ptr() and d_up.data_ptr() == up.data_ptr()
                and d_gate.shape == gate.shape and d_up.shape == up.shape)

    # Shared storage for the illegal cases, made on dev before slicing: its views alias it.
    buf = fresh(2 * m + 1, n)
    other = fresh()
    bad_cases = {
        "up is gate": (buf[:m], buf[:m], other),
        "up overlaps gate": (buf[:m], buf[1:m + 1], other),
        "dy is gate": (buf[:m], other, buf[:m]),
        "dy overlaps up": (other, buf[m:2 * m], buf[m + 1:2 * m + 1]),
    }
    rejected, untouched = [], True
    for name, (g, u, d) in bad_cases.items():
        snap = buf.clone(), other.clone()
        try:
            fn(g, u, d)
        except ValueError:
            rejected.append(name)
        untouched = untouched and torch.equal(buf, snap[0]) and torch.equal(other, snap[1])
        buf.copy_(snap[0])
        other.copy_(snap[1])
    return {"in_place": bool(in_place), "dy_untouched": bool(torch.equal(dy, dy0)),
            "bad_cases": len(bad_cases), "rejects": len(rejected),
            "untouched_after_reject": bool(untouched),
            "accepted": ", ".join(sorted(set(bad_cases) - set(rejected)))}
