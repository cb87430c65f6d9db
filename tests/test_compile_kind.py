"""The compile check kind: torch.compile against eager, forward and backward, graph breaks
counted, a recompilation for a new size refused unless declared, no silent fallback when
compilation cannot run; V029/V030; the softmax mutant that is
wrong only when compiled dies to this kind and to no other."""

from __future__ import annotations

import pytest

from falsify.harness import backends, runtime
from falsify.harness.kinds import compile as compile_kind
from falsify.harness.plan import equation_of, runs
from tests.test_check_semantics import contract_dict, first_case, load, run_check

FNS = "tests.fixtures.compile_fns"
ROWS = {"dtypes": ["float32"], "dims": {"m": [1, 6], "n": [1, 40]},
        "args": {"x": {"shape": ["m", "n"], "values": [-3.0, 3.0]}},
        "examples": [{"m": 3, "n": 17}]}
TOL = {"why": "tanh: a few ulp", "float32": {"atol": "4 * eps", "rtol": "4 * eps"}}
PARITY = {"kind": "parity", "input": "rows", "tolerance": TOL}
GRADIENT = {"kind": "gradient", "input": "rows", "wrt": ["x"], "backward": "f_backward",
            "backends": ["torch"], "tolerance": TOL}
COMPILE = {"kind": "compile", "input": "rows", "parity": "FALSIFY-FIX-001",
           "gradient": "FALSIFY-FIX-002"}


def _contract(tmp_path, fn, compile_check=None, **kw):
    eqs = {"f": {"reference": f"{FNS}:reference", "torch": f"{FNS}:{fn}"},
           "f_backward": {"reference": f"{FNS}:reference_backward"}}
    checks = [PARITY, dict(GRADIENT, equation="f"), dict(compile_check or COMPILE,
                                                          equation="f")]
    return load(tmp_path, contract_dict(eqs, {"rows": ROWS}, checks), **kw)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    compile_kind.reset()
    yield
    compile_kind.reset()


def _run(c, n=2):
    return run_check(c, n, "torch", "float32", first_case(c, n, "float32"))


def test_honest_kernel_compiles_and_agrees_forward_and_backward(tmp_path):
    detail = _run(_contract(tmp_path, "honest"))
    assert detail["graph_breaks"] == 0 and detail["backward"] is True
    assert detail["graphs"] >= 1 and detail["dynamic"] is True


def test_a_path_taken_only_when_compiled_fails(tmp_path):
    c = _contract(tmp_path, "wrong_when_compiled")
    run_check(c, 0, "torch", "float32", first_case(c, 0, "float32"))  # parity: eager is right
    with pytest.raises(runtime.CheckFailed, match=r"compiled \(got\) vs eager \(reference\), "
                                                  r"output 0") as e:
        _run(c)
    assert "from FALSIFY-FIX-001's a" in str(e.value)


def test_a_backward_wrong_only_when_compiled_fails(tmp_path):
    c = _contract(tmp_path, "backward_wrong_when_compiled")
    run_check(c, 1, "torch", "float32", first_case(c, 1, "float32"))  # eager gradient is right
    with pytest.raises(runtime.CheckFailed, match=r"eager \(reference\), d/dx"):
        _run(c)


def test_graph_breaks_fail_unless_allowed_and_are_reported(tmp_path):
    with pytest.raises(runtime.CheckFailed, match=r"1 graph break\(s\) under torch.compile "
                                                  r"\(max_graph_breaks: 0\)"):
        _run(_contract(tmp_path, "breaks_the_graph"))
    compile_kind.reset()
    allowed = _contract(tmp_path, "breaks_the_graph", dict(COMPILE, max_graph_breaks=1))
    assert _run(allowed)["graph_breaks"] == 1


def _two_sizes(c, n=2):
    """The check run on two cases of different row counts (both ≥ 2): one compiled function
    serves both, as it serves a check's examples."""
    from falsify.harness import cases

    spec = c.inputs[c.checks[n].spec["input"]]
    first = cases.pinned_cases(spec, "float32", None)[0]
    run_check(c, n, "torch", "float32", first)
    other = dict(spec, examples=[{"m": 5, "n": 17}])
    return run_check(c, n, "torch", "float32", cases.pinned_cases(other, "float32", None)[0])


def test_a_recompile_for_a_new_size_fails_unless_the_dim_is_declared(tmp_path):
    assert _two_sizes(_contract(tmp_path, "honest"))["shape_recompiles"] == []
    compile_kind.reset()
    with pytest.raises(runtime.CheckFailed, match=r"1 recompilation\(s\) for a new tensor size "
                                                  r"under torch.compile: x.shape\[0\] \(m\) 3 → 5"):
        _two_sizes(_contract(tmp_path, "chunked_over_rows"))
    compile_kind.reset()
    declared = dict(COMPILE, specializes={"dims": ["m"], "why": "a chunk loop"})
    detail = _two_sizes(_contract(tmp_path, "chunked_over_rows", declared))
    assert detail["shape_recompiles"] == ["x.shape[0] (m) 3 → 5"]


def test_hitting_the_recompile_limit_names_the_sizes_that_forced_it(tmp_path):
    import torch._dynamo

    # Dynamo's own patch (monkeypatch's undo would delete the config entry)
    want = (r"FailOnRecompileLimitHit.*1 of the recompilations were for a new tensor size: "
            r"x.shape\[0\] 3 → 5")
    with torch._dynamo.config.patch(recompile_limit=1), \
            pytest.raises(runtime.CheckFailed, match=want):
        _two_sizes(_contract(tmp_path, "chunked_over_rows"))


def test_shape_recompiles_ignore_sizes_zero_and_one():
    texts = ["0/0: tensor 'x' size mismatch at index 0. expected 8, actual 5",
             "0/1: tensor 'x' size mismatch at index 0. expected 5, actual 1",
             "0/2: tensor 'kwargs['w']' size mismatch at index 1. expected 0, actual 3",
             "0/3: tensor 'kwargs['w']' size mismatch at index 1. expected 3, actual 4",
             "0/4: label_smoothing == 0.1", "0/0: tensor 'x' size mismatch at index 0. "
             "expected 8, actual 5"]
    assert compile_kind.shape_recompiles(texts) == [("w", 1, 3, 4), ("x", 0, 8, 5)]


def test_v029_specializes_names_a_dim_of_the_input(tmp_path):
    bad = dict(COMPILE, specializes={"dims": ["T"], "why": "a chunk loop"})
    rep = _contract(tmp_path, "honest", bad, expect_errors=True)
    assert any(f.rule == "V029" and "specializes names 'T', not a dim of input 'rows'"
               in f.message for f in rep.errors), rep.errors


def test_the_cross_entropy_mutant_that_chunks_over_t_when_compiled_is_killed():
    """MUT-CE-006: bit-identical eagerly, a recompilation per sequence length compiled."""
    r = runtime.assert_killed("cross-entropy-kernel-v1", "MUT-CE-006")
    assert r.killed_by.startswith("FALSIFY-CE-029") and "recompilation" in r.message, r


def test_no_cxx_compiler_is_an_error_not_a_pass(tmp_path, monkeypatch):
    import torch._inductor.exc as inductor_exc
    from torch._inductor import cpp_builder

    def missing():
        raise inductor_exc.InvalidCxxCompiler()

    monkeypatch.setattr(cpp_builder, "get_cpp_compiler", missing)
    with pytest.raises(compile_kind.CompileUnavailable, match="needs a C\\+\\+ compiler") as e:
        _run(_contract(tmp_path, "honest"))
    assert not runtime.is_falsification(e.value)


def test_dynamo_disabled_is_an_error_not_a_pass(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHDYNAMO_DISABLE", "1")
    with pytest.raises(compile_kind.CompileUnavailable, match="TORCHDYNAMO_DISABLE") as e:
        _run(_contract(tmp_path, "honest"))
    assert not runtime.is_falsification(e.value)


def test_doubled_bound_is_the_triangle_inequality():
    atol, rtol = compile_kind.doubled(1e-6, 0.5)
    assert atol == pytest.approx(4e-6) and rtol == pytest.approx(2.0)
    # |c − e| ≤ |c − r| + |e − r| with both at the parity bound around a reference r
    r, a, rho = 10.0, 1e-3, 1e-2
    e, c = r + (a + rho * r), r - (a + rho * r)
    at, rt = compile_kind.doubled(a, rho)
    assert abs(c - e) <= at + rt * abs(e) + 1e-12
    with pytest.raises(ValueError, match="bounds nothing"):
        compile_kind.doubled(0.0, 1.0)


# ---------------------------------------------------------------- V029, V030
@pytest.mark.parametrize("check, message", [
    ({"kind": "compile", "input": "rows"}, "a compile check needs a bound"),
    (dict(COMPILE, parity="FALSIFY-FIX-002"), "is not a parity check of"),
    (dict(COMPILE, gradient="FALSIFY-FIX-001"), "is not a gradient check of"),
    (dict(COMPILE, parity="FALSIFY-FIX-404"), "'FALSIFY-FIX-404' is not a parity check"),
])
def test_v029_compile_check_bounds(tmp_path, check, message):
    rep = _contract(tmp_path, "honest", check, expect_errors=True)
    assert any(f.rule == "V029" and message in f.message for f in rep.errors), rep.errors


def test_v029_a_parity_check_without_the_dtype(tmp_path):
    eqs = {"f": {"reference": f"{FNS}:reference", "torch": f"{FNS}:honest"}}
    rows = dict(ROWS, dtypes=["float32", "float16"])
    data = contract_dict(eqs, {"rows": rows}, [
        dict(PARITY, dtypes=["float32"]),
        {"kind": "compile", "input": "rows", "parity": "FALSIFY-FIX-001"}])
    rep = load(tmp_path, data, expect_errors=True)
    assert any(f.rule == "V029" and "declares no tolerance for float16" in f.message
               for f in rep.errors), rep.errors


def test_v030_backward_not_compiled(tmp_path):
    rep = _contract(tmp_path, "honest", {"kind": "compile", "input": "rows",
                                         "parity": "FALSIFY-FIX-001"},
                    expect_errors=True)
    assert any(f.rule == "V030" and "forward compiled, backward not" in f.message
               for f in rep.errors), rep.errors


# ---------------------------------------------------------------- the softmax mutant
SM = "softmax-kernel-v1"
MUTANT = "MUT-SM-008"
COMPILE_CHECK = "FALSIFY-SM-015"


def test_softmax_mutant_wrong_only_when_compiled_is_killed_by_the_compile_check():
    r = runtime.kill_mutant(SM, MUTANT)
    assert r.killed and r.killed_by.startswith(COMPILE_CHECK), r
    assert "compiled (got) vs eager" in r.message and "nan" in r.message


def test_softmax_mutant_passes_every_other_check_of_the_torch_binding():
    """Eagerly the mutant is the honest kernel: parity (FALSIFY-SM-005/006 included), the
    properties, determinism, batch invariance and dtypes all pass."""
    c = runtime.contract(SM)
    m = next(m for m in c.mutants if m.id == MUTANT)
    others = [t for t in c.checks if t.spec and t.kind != "compile"
              and equation_of(c, t) == m.equation
              and any(r.backend == "torch" for r in runs(c, t))]
    assert {"FALSIFY-SM-005", "FALSIFY-SM-006"} <= {t.id for t in others}
    with backends.overriding(f"{SM}:{m.equation}.{m.backend}", m.with_):
        for t in others:
            for r in runs(c, t):
                if r.backend == "torch":
                    runtime.run_with_hypothesis(c, t.id, "torch", r.variant)


def test_declared_reads_forward_and_backward_from_the_contracts():
    from falsify.harness.audit import MATRIX_KINDS, declared

    assert MATRIX_KINDS[-1] == "compile"
    assert declared(runtime.contract("rmsnorm-kernel-v1"), "compile") == {
        "forward and backward": ["torch"], "forward": []}
    assert declared(runtime.contract(SM), "compile") == {"forward and backward": [],
                                                         "forward": ["torch"]}


def test_compiled_embedding_refuses_negative_and_past_the_end_ids():
    """Compiled, the embedding skips its eager range check (a Tensor.item() graph break):
    Inductor's indexing assert must refuse what check_args refuses, a negative id included,
    which plain indexing would wrap to a row from the end."""
    import torch

    from falsify.kernels.torch.embedding import embedding

    compiled = torch.compile(embedding, dynamic=True)
    table = torch.randn(10, 4)
    assert torch.equal(compiled(torch.tensor([0, 9, 3]), table), table[[0, 9, 3]])
    for bad in ([1, 10], [-1, 2]):
        with pytest.raises(RuntimeError, match="index out of bounds"):
            compiled(torch.tensor(bad), table)


def test_compiled_cross_entropy_refuses_labels_outside_the_vocabulary():
    """Compiled, the label range check (a Tensor.item() graph break) gives way to Inductor's
    gather assert; a negative label that is not ignore_index must not wrap."""
    import torch

    from falsify.kernels.torch.cross_entropy import cross_entropy

    compiled = torch.compile(cross_entropy, dynamic=True)
    z = torch.randn(2, 7)
    ok = torch.tensor([3, -100])
    assert torch.allclose(compiled(z, ok), cross_entropy(z, ok), rtol=1e-6)
    for bad in ([1, 7], [-1, 2]):
        with pytest.raises(RuntimeError, match="index out of bounds"):
            compiled(z, torch.tensor(bad))
