"""GEMM contract: the executable probe of the output-buffer contract."""

from __future__ import annotations

from falsify.probes import device

CONTRACT = "gemm-kernel-v1"


def _bound(backend):
    from falsify.harness import backends, runtime

    return backends.function(runtime.contract(CONTRACT), "gemm", backend)


def out_buffer_probe(backend, dtype="float32", m=5, n=7, k=3, fn=None):
    """Bad calls must raise before anything is written. Every bad `out` is a view inside a
    NaN-filled guard buffer twice its size, so a wrapper that skipped the check and launched
    anyway writes NaN-detectable values (and stays inside our allocation). Unless `fn` is
    given, the function is the contract's binding looked up at call time (mutants included).

    Returns counts: bad calls tried, how many raised, how many left their guard buffer
    untouched, and whether a good call (the positive control) wrote exactly its view."""
    import torch

    fn = fn or _bound(backend)
    dev = device(backend)
    dt = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(7)
    a = torch.randn(m, k, generator=gen).to(dt)
    b = torch.randn(k, n, generator=gen).to(dt)
    c = torch.randn(m, n, generator=gen).to(dt)
    a, b, c = a.to(dev), b.to(dev), c.to(dev)

    # Guard buffers are allocated on the device and `out` is a view into them: a moved copy of
    # a view would not alias its buffer.
    def guarded(shape, dtype=dt):
        numel = 1
        for s in shape:
            numel *= s
        buf = torch.full((2 * numel + 16,), float("nan"), dtype=dtype, device=dev)
        return buf, buf[8:8 + numel].view(shape)

    bad = {
        "out undersized by one column": dict(out_shape=(m, n - 1)),
        "out undersized by one row": dict(out_shape=(m - 1, n)),
        "out transposed shape (same numel)": dict(out_shape=(n, m)),
        "out flat with M*N elements": dict(out_shape=(m * n,)),
        "out wrong dtype": dict(out_shape=(m, n), out_dtype=torch.float64),
        "beta != 0 without c": dict(kw=dict(beta=1.0)),
        "c wrongly shaped": dict(kw=dict(c=c[:, : n - 1], beta=1.0)),
        "inner dimensions differ": dict(kw=dict(b=b[: k - 1])),
    }
    failures, raised, untouched = [], 0, 0
    for name, spec in bad.items():
        kw = dict(a=a, b=b)
        kw.update(spec.get("kw", {}))
        buf = None
        if "out_shape" in spec:
            buf, kw["out"] = guarded(spec["out_shape"], spec.get("out_dtype", dt))
        try:
            fn(**kw)
            failures.append(f"{name}: did not raise")
        except (ValueError, TypeError):
            raised += 1
        if buf is None or bool(torch.isnan(buf).all()):
            untouched += 1
        else:
            failures.append(f"{name}: wrote into the buffer before raising")
    # Positive control: a correctly shaped strided view inside the guard buffer.
    buf = torch.full((m * (n + 3) + 32,), float("nan"), dtype=dt, device=dev)
    out = buf[16:16 + m * (n + 3)].view(m, n + 3)[:, :n]
    res = fn(a=a, b=b, out=out)
    want = (a.double() @ b.double())
    inside = torch.zeros_like(buf, dtype=torch.bool)
    inside[16:16 + m * (n + 3)].view(m, n + 3)[:, :n] = True
    tol = 1e-5 if dt == torch.float32 else 2e-3 * k
    control_ok = (res.data_ptr() == out.data_ptr()
                  and bool(torch.isnan(buf[~inside]).all())
                  and bool(((out.double() - want).abs() <= tol).all()))
    if not control_ok:
        failures.append("positive control: a correct out view was not filled exactly")
    return {"cases": len(bad), "raised": raised, "untouched": untouched,
            "control_ok": control_ok, "failures": "; ".join(failures)}
