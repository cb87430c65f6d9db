"""`pv status`, `pv graph`, `pv equations`, `pv diff` and the modules behind them
(falsify/harness/latex.py, falsify/harness/graph.py, falsify/harness/diff.py). Verbs run in-process
through
falsify.cli.pv.main; contracts are copies of tests/fixtures/valid/softmax-lite-v1.yaml."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from falsify.cli.pv import main
from falsify.harness import graph
from falsify.harness.latex import to_latex
from falsify.harness.model import load_contract
from falsify.harness.project import library_dir

FIX = Path(__file__).parent / "fixtures"
BASE = FIX / "valid" / "softmax-lite-v1.yaml"
KATEX = Path(__file__).resolve().parents[1] / "site/docs/assets/vendor/katex/katex.min.js"


def base_text() -> str:
    return BASE.read_text(encoding="utf-8")


def edit(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, f"{old!r} occurs {text.count(old)} times"
    return text.replace(old, new)


def pv(capsys, *argv) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def write(tmp_path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


# ============================================================================ status


def test_status_counts_and_bindings(capsys):
    rc, out, _ = pv(capsys, "status", "--format", "json", BASE)
    assert rc == 0
    (row,) = json.loads(out)["contracts"]
    assert row["id"] == "softmax-lite-v1" and row["mode"] == "native" and row["version"] == "1.0.0"
    assert (row["equations"], row["obligations"], row["checks"], row["mutants"],
            row["symbolic_checks"]) == (1, 7, {"total": 8, "executable": 8}, 3, 2)
    assert row["bindings"] == {"softmax": {
        "reference": "falsify.reference.softmax:softmax",
        "torch": "falsify.kernels.torch.softmax:softmax"}}


def test_status_text_is_a_table(capsys):
    rc, out, _ = pv(capsys, "status", BASE)
    assert rc == 0
    row = next(line for line in out.splitlines() if line.startswith(" softmax-lite-v1")
               or line.startswith("softmax-lite-v1"))
    # a file named on the command line, outside the project's and the library's id space
    assert row.split()[:10] == ["softmax-lite-v1", "file", "1.0.0", "native", "1", "7", "8", "8",
                                "3", "2"]
    assert "falsify.kernels.torch.softmax:softmax" in out and "executable" in out


def test_status_of_the_repository_contracts(capsys):
    rc, out, _ = pv(capsys, "status", "--format", "json")
    assert rc == 0
    ids = {r["id"] for r in json.loads(out)["contracts"]}
    assert "softmax-kernel-v1" in ids


# ============================================================================ graph


def _chain(tmp_path, deps: dict[str, list[str]]) -> Path:
    """Contracts named by `deps`, each a copy of the baseline with its own id prefix."""
    for i, (name, ds) in enumerate(deps.items()):
        text = base_text().replace("SM-", f"S{i}-")
        dep_yaml = "  depends_on: []" if not ds else "  depends_on:\n" + "".join(
            f"    - {d}\n" for d in ds).rstrip("\n")
        write(tmp_path, f"{name}.yaml", edit(text, "  depends_on: []", dep_yaml))
    return tmp_path


def test_graph_topological_order(tmp_path, capsys):
    d = _chain(tmp_path, {"attention-v1": ["softmax-v1", "gemm-v1"], "softmax-v1": [],
                          "gemm-v1": [], "model-v1": ["attention-v1"]})
    rc, out, _ = pv(capsys, "graph", "--format", "json", d)
    assert rc == 0
    g = json.loads(out)
    order = g["order"]
    assert order.index("softmax-v1") < order.index("attention-v1") < order.index("model-v1")
    assert order.index("gemm-v1") < order.index("attention-v1")
    assert g["cycles"] == [] and g["missing"] == []
    rc, text, _ = pv(capsys, "graph", d)
    assert rc == 0 and "attention-v1  <- softmax-v1, gemm-v1" in text


def test_graph_of_one_file_finds_its_siblings(tmp_path, capsys):
    d = _chain(tmp_path, {"attention-v1": ["softmax-v1"], "softmax-v1": [], "other-v1": []})
    rc, out, _ = pv(capsys, "graph", "--format", "json", d / "attention-v1.yaml")
    assert rc == 0
    assert json.loads(out)["order"] == ["softmax-v1", "attention-v1"]


def test_graph_cycle_exits_1_and_names_it(tmp_path, capsys):
    d = _chain(tmp_path, {"a-v1": ["b-v1"], "b-v1": ["c-v1"], "c-v1": ["a-v1"], "d-v1": []})
    rc, out, err = pv(capsys, "graph", d)
    assert rc == 1
    assert "dependency cycle: a-v1 -> b-v1 -> c-v1 -> a-v1" in err
    rc, out, _ = pv(capsys, "graph", "--format", "json", d)
    g = json.loads(out)
    assert rc == 1 and g["cycles"] == [["a-v1", "b-v1", "c-v1", "a-v1"]]
    assert g["order"] == ["d-v1"] and set(g["blocked"]) == {"a-v1", "b-v1", "c-v1"}


def test_graph_missing_dependency_is_an_error_not_a_node(tmp_path, capsys):
    d = _chain(tmp_path, {"a-v1": ["ghost-v1"]})
    rc, out, err = pv(capsys, "graph", "--format", "json", d)
    assert rc == 1
    g = json.loads(out)
    assert g["nodes"] == ["a-v1"]
    assert g["missing"] == [{"contract": "a-v1", "index": 0, "depends_on": "ghost-v1"}]
    assert "a-v1 depends on 'ghost-v1'" in err and "a-v1.yaml:8" in err


MERMAID_LINE = re.compile(r'^  (?:[A-Za-z][A-Za-z0-9_]*\["[^"]*"\]|[A-Za-z][A-Za-z0-9_]* --> '
                          r'[A-Za-z][A-Za-z0-9_]*|classDef focus .*|class [A-Za-z0-9_]+ focus)$')


def test_graph_mermaid_is_valid(tmp_path, capsys):
    d = _chain(tmp_path, {"softmax-v1": [], "end": ["softmax-v1"], "0day-v1": ["end"],
                          "x.y-v1": ["0day-v1"]})
    rc, out, _ = pv(capsys, "graph", "--format", "mermaid", d)
    assert rc == 0
    lines = out.rstrip("\n").splitlines()
    assert lines[0] == "graph TD"
    assert all(MERMAID_LINE.match(line) for line in lines[1:]), out
    ids = re.findall(r"^  ([A-Za-z0-9_]+)\[", out, re.M)
    assert len(ids) == len(set(ids)) == 4
    assert "end" not in ids and not any(i[0].isdigit() for i in ids)  # keyword, digit
    assert '["x.y-v1"]' in out and '["0day-v1"]' in out
    # dependencies first: the edge runs from the dependency to its user
    assert "softmax_v1 --> c_end" in out


def test_mermaid_focus_for_the_docs():
    contracts = {"exp-v1": [], "softmax-v1": ["exp-v1"], "attention-v1": ["softmax-v1"],
                 "model-v1": ["attention-v1"], "gemm-v1": [], "other-v1": ["softmax-v1"]}
    text = graph.mermaid(contracts, focus="attention-v1")
    assert text.startswith("graph TD\n")
    assert "gemm" not in text and "other" not in text  # unrelated contracts are left out
    assert "exp_v1 --> softmax_v1" in text  # everything it depends on, transitively
    assert "softmax_v1 --> attention_v1" in text and "attention_v1 --> model_v1" in text
    assert "class attention_v1 focus" in text
    with pytest.raises(KeyError):
        graph.mermaid(contracts, focus="nope")


def test_a_wide_focus_is_drawn_left_to_right():
    """Six dependencies of one contract: top-down they make one row the page shrinks; with
    direction auto they stack in a column. A chain stays top-down."""
    wide = {f"k{i}-kernel-v1": [] for i in range(6)}
    wide["model-v1"] = sorted(wide)
    assert graph.mermaid(wide, focus="model-v1", direction="auto").startswith("graph LR\n")
    chain = {"a-v1": [], "b-v1": ["a-v1"], "c-v1": ["b-v1"]}
    assert graph.mermaid(chain, focus="b-v1", direction="auto").startswith("graph TD\n")
    with pytest.raises(ValueError, match="direction 'up'"):
        graph.mermaid(chain, direction="up")


def test_overview_groups_layers_and_leaves_out_isolated_contracts():
    contracts = {"ce-kernel-v1": [], "kd-kernel-v1": ["ce-kernel-v1"], "lonely-kernel-v1": [],
                 "train-v1": ["kd-kernel-v1"], "adamw-kernel-v1": []}
    text = graph.overview(contracts)
    lines = text.splitlines()
    assert lines[0] == "graph LR"
    k, lo = lines.index('  subgraph kernels["kernels"]'), lines.index('  subgraph loops["loops"]')
    assert k < lo
    assert lines[k + 1:k + 3] == ['    ce_kernel_v1["ce-kernel-v1"]',
                                  '    kd_kernel_v1["kd-kernel-v1"]'] and lines[k + 3] == "  end"
    assert lines[lo + 1:lo + 3] == ['    train_v1["train-v1"]', "  end"]
    assert "ce_kernel_v1 --> kd_kernel_v1" in text and "kd_kernel_v1 --> train_v1" in text
    assert "lonely" not in text and "adamw" not in text
    assert graph.isolated(graph.build(contracts)) == ["adamw-kernel-v1", "lonely-kernel-v1"]


def test_graph_dot(tmp_path, capsys):
    d = _chain(tmp_path, {"a-v1": ["b-v1"], "b-v1": []})
    rc, out, _ = pv(capsys, "graph", "--format", "dot", d)
    assert rc == 0 and out.startswith("digraph contracts {") and '"b-v1" -> "a-v1";' in out


def test_graph_algorithms_scale_without_recursion():
    n = 5000
    chain = {f"c{i}": [f"c{i - 1}"] if i else [] for i in range(n)}
    g = graph.build(chain)
    assert g.order[:2] == ["c0", "c1"] and g.ok
    ring = {f"c{i}": [f"c{(i + 1) % n}"] for i in range(n)}
    (cyc,) = graph.build(ring).cycles
    assert len(cyc) == n + 1 and cyc[0] == cyc[-1]


def test_graph_of_the_repository(capsys):
    rc, out, err = pv(capsys, "graph", "--format", "json")
    g = json.loads(out)
    assert "softmax-kernel-v1" in g["nodes"]
    assert rc == (1 if g["cycles"] or g["missing"] else 0)


# ============================================================================ LaTeX

GOLDEN = [
    ("σ(x)_i = exp(x_i − max(x)) / Σ_j exp(x_j − max(x))",
     r"\sigma(x)_i = \exp(x_i - \max(x)) / \sum_j \exp(x_j - \max(x))"),
    ("RMSNorm(x)_i = (x_i / RMS(x)) · γ_i where RMS(x) = √(Σ x_i² / n + ε)",
     r"\operatorname{RMSNorm}(x)_i = (x_i / \operatorname{RMS}(x)) \cdot \gamma_i\text{ where }"
     r"\operatorname{RMS}(x) = \sqrt{\sum x_i^2 / n + \varepsilon}"),
    ("∂L/∂W_base = 0 (no gradient flows to base weights)",
     r"\partial L/\partial W_{\mathrm{base}} = 0 (\text{no gradient flows to base weights})"),
    ("loss_batch = (1/B_s) · Σ_{i=1}^{B_s} loss(sample_i)",
     r"\mathrm{loss\_batch} = (1/B_s) \cdot \sum_{i=1}^{B_s} \operatorname{loss}"
     r"(\mathrm{sample}_i)"),
    ("NF4_LUT[i] = Φ⁻¹((i + 0.5) / 16) for i in [0..15], normalized to [-1, 1]",
     r"\mathrm{NF4\_LUT}[i] = \Phi^{-1}((i + 0.5) / 16)\text{ for i in }[0..15],"
     r"\text{ normalized to }[-1, 1]"),
    ("∂CE/∂x_i = softmax(x_i) - 1{i=label}",
     r"\partial\mathrm{CE}/\partial x_i = \operatorname{softmax}(x_i) - 1\{i=\text{label}\}"),
    ("peak_memory = O(B_s × T) not O(B_s × T × V)",
     r"\mathrm{peak\_memory} = O(B_s \times T)\text{ not }O(B_s \times T \times V)"),
    ("d₁·e^{m₁−m} + d₂·e^{m₂−m} = Σ_j e^{x_j − m}, m = max(m₁, m₂)",
     r"d_1\cdot e^{m_1-m} + d_2\cdot e^{m_2-m} = \sum_j e^{x_j - m}, m = \max(m_1, m_2)"),
    ("theta_t = theta_{t-1} - lr * (m_hat_t / (sqrt(v_hat_t) + eps) + lambda * theta_{t-1})",
     r"\theta_t = \theta_{t-1} - \mathrm{lr} \cdot (\hat{m}_t / (\sqrt{\hat{v}_t} + \varepsilon)"
     r" + \lambda \cdot \theta_{t-1})"),
    ("RoPE(x, m)_{2k} = x_{2k}·cos(mθ_k) - x_{2k+1}·sin(mθ_k), θ_k = 10000^(-2k/d)",
     r"\operatorname{RoPE}(x, m)_{2k} = x_{2k}\cdot\cos(m\theta_k) - x_{2k+1}\cdot"
     r"\sin(m\theta_k), \theta_k = 10000^{-2k/d}"),
    ("Attention(Q, K, V) = softmax(Q·Kᵀ / √d_k) · V",
     r"\operatorname{Attention}(Q, K, V) = \operatorname{softmax}(Q\cdot K^{\top} / \sqrt{d_k})"
     r" \cdot V"),
    ("‖g‖ ≤ c ⇒ ⟨a, b⟩ ≠ 0, x ∈ ℝ^n, k ∈ ℤ, n ∈ ℕ, y ≈ 1, t ≥ 1, k ∉ S, a → b ← c, |x| < ∞",
     r"\lVert g\rVert \le c \Rightarrow \langle a, b\rangle \ne 0, x \in \mathbb{R}^n, "
     r"k \in \mathbb{Z}, n \in \mathbb{N}, y \approx 1, t \ge 1, k \notin S, a \to b "
     r"\leftarrow c, |x| < \infty"),
    ("x ∈ ℝ^{m×n}, n ≥ 1, finite", r"x \in \mathbb{R}^{m\times n}, n \ge 1,\text{ finite}"),
    ("TFLOP_per_gemm(m, n, k) = 2 * m * n * k / 1e12",
     r"\operatorname{TFLOP\_per\_gemm}(m, n, k) = 2 \cdot m \cdot n \cdot k / 10^{12}"),
    ("L_δ(a) = ½a² if |a| ≤ δ, else δ(|a| - ½δ)",
     r"L_{\delta}(a) = \tfrac{1}{2}a^2\text{ if }|a| \le \delta,\text{ else }\delta(|a| - "
     r"\tfrac{1}{2}\delta)"),
    ("α β γ δ ε η θ κ λ μ ν π ρ σ τ φ ψ ω, Φ Ω Δ, Σ = Uᵀ, x³ x⁻¹ W₀ x_{ij}",
     r"\alpha \beta \gamma \delta \varepsilon \eta \theta \kappa \lambda \mu \nu \pi \rho "
     r"\sigma \tau \varphi \psi \omega, \Phi \Omega \Delta, \Sigma = U^{\top}, x^3 x^{-1} W_0 "
     r"x_{ij}"),
    ("C_cublas = alpha * op(A) * op(B) + beta * C\nwhere op(X) = X if transa=N",
     r"\begin{array}{l} C_{\mathrm{cublas}} = \alpha \cdot \operatorname{op}(A) \cdot "
     r"\operatorname{op}(B) + \beta \cdot C \\ \text{where }\operatorname{op}(X) = X"
     r"\text{ if transa}=N \end{array}"),
]


@pytest.mark.parametrize("formula, expected", GOLDEN, ids=[f"g{i}" for i in range(len(GOLDEN))])
def test_latex_golden(formula, expected):
    assert to_latex(formula) == expected


def _strip_text(tex: str) -> str:
    """`tex` without the contents of \\text{...} groups (nested braces respected)."""
    out, i = [], 0
    while i < len(tex):
        if tex.startswith("\\text{", i):
            depth, i = 1, i + len("\\text{")
            while i < len(tex) and depth:
                if tex[i] == "\\":
                    i += 2
                    continue
                depth += {"{": 1, "}": -1}.get(tex[i], 0)
                i += 1
            continue
        out.append(tex[i])
        i += 1
    return "".join(out)


def _balanced(tex: str) -> bool:
    depth, i = 0, 0
    while i < len(tex):
        if tex[i] == "\\":
            i += 2  # \{ \} \\ are not grouping
            continue
        depth += {"{": 1, "}": -1}.get(tex[i], 0)
        if depth < 0:
            return False
        i += 1
    return depth == 0


def _math_is_ascii_and_balanced(tex: str):
    assert _balanced(tex), tex
    assert _strip_text(tex).isascii(), tex


def _all_repository_math() -> list[tuple[str, str]]:
    """(where, LaTeX) for every formula, domain, codomain and invariant in contracts/ and in
    the compat fixtures, plus each hand-written `latex:` field."""
    out = []
    for p in sorted(library_dir().glob("*.yaml")) + sorted((FIX / "compat").glob("*.yaml")):
        c, _ = load_contract(p)
        for eq in c.equations.values():
            where = f"{c.id}:{eq.name}"
            out.append((where + ".formula", to_latex(eq.formula)))
            out += [(where + f".{k}", to_latex(getattr(eq, k))) for k in ("domain", "codomain")
                    if getattr(eq, k)]
            out += [(where + f".invariants[{i}]", to_latex(s)) for i, s in enumerate(eq.invariants)]
            if eq.latex:
                out.append((where + ".latex", eq.latex))
    return out


def test_every_repository_equation_converts_to_clean_latex():
    items = _all_repository_math()
    assert len(items) > 50
    for where, tex in items:
        if where.endswith(".latex"):
            continue  # hand-written; checked by KaTeX below
        _math_is_ascii_and_balanced(tex)


def _katex(items: list[str], lenient_unicode: bool = False) -> list[str | None]:
    """Render each string with the vendored KaTeX in strict mode; the error or None."""
    strict = "(c) => (c === 'unknownSymbol' ? 'ignore' : 'error')" if lenient_unicode \
        else "'error'"
    script = (
        "const katex = require(process.argv[1]);"
        "const items = JSON.parse(require('fs').readFileSync(0, 'utf8'));"
        f"const strict = {strict};"
        "console.log(JSON.stringify(items.map(s => { try { katex.renderToString(s, "
        "{throwOnError: true, strict, displayMode: true}); return null; } "
        "catch (e) { return String(e.message); } })));")
    res = subprocess.run(["node", "-e", script, str(KATEX)], input=json.dumps(items),
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


needs_katex = pytest.mark.skipif(not (shutil.which("node") and KATEX.exists()),
                                 reason="node or the vendored KaTeX is not available")


@needs_katex
def test_katex_accepts_every_repository_equation():
    items = _all_repository_math()
    errors = [(w, t, e) for (w, t), e in zip(items, _katex([t for _, t in items])) if e]
    assert not errors, "\n".join(f"{w}: {t}\n  {e}" for w, t, e in errors)


@needs_katex
def test_katex_accepts_the_goldens():
    assert _katex([g for _, g in GOLDEN]) == [None] * len(GOLDEN)


PIECES = st.sampled_from(list("xyzAB_^{}()[]|/*+-=<>.,;:!?'\"`~#$%&\\@ \n0123456789")
                         + list("αβγδεθλμσφωΣΠΦΩΔ²³⁻¹ᵀ₀₁ᵢ·×≤≥≠≈∈∉⇒→←∞√‖⟨⟩ℝℤℕ″’“”∂∇½")
                         + ["sqrt", "exp", "max", "for all", "x_i", "beta1", "m_hat_t",
                            "\u0304", "中", "\u00a0", "\u200b", "\x00", "sum_", "**", "1e-6"])
FORMULAS = st.lists(PIECES, max_size=30).map("".join) | st.text(max_size=40)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(FORMULAS)
def test_to_latex_is_total(formula):
    tex = to_latex(formula)
    assert isinstance(tex, str)
    _math_is_ascii_and_balanced(tex)


@needs_katex
def test_katex_accepts_random_formulas():
    """What to_latex makes of random symbol soup still parses (unknown characters land in
    \\text{}, which strict KaTeX only warns about)."""
    samples = []

    @settings(max_examples=1500, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(FORMULAS)
    def collect(formula):
        samples.append((formula, to_latex(formula)))

    collect()
    errors = [(f, t, e) for (f, t), e in zip(samples, _katex([t for _, t in samples], True))
              if e]
    assert not errors, "\n".join(f"{f!r} -> {t}\n  {e}" for f, t, e in errors[:5])


# ============================================================================ equations


def test_equations_latex_uses_the_latex_field(capsys):
    rc, out, _ = pv(capsys, "equations", "--format", "latex", BASE)
    assert rc == 0
    c, _ = load_contract(BASE)
    assert c.equations["softmax"].latex in out
    assert "\\section*{softmax-lite-v1}" in out and "\\begin{itemize}" in out
    assert "\\textbf{Domain:} \\( x \\in \\mathbb{R}^{m\\times n}" in out


def test_equations_text_and_json(capsys):
    rc, out, _ = pv(capsys, "equations", BASE)
    assert rc == 0 and "formula:    σ(x)_i = exp(x_i − max(x))" in out
    rc, out, _ = pv(capsys, "equations", "--format", "json", BASE)
    (c,) = json.loads(out)["contracts"]
    (eq,) = c["equations"]
    assert eq["latex_source"] == "latex field" and eq["bindings"]["torch"].endswith(":softmax")


def test_equations_derives_latex_without_a_latex_field(tmp_path, capsys):
    text = base_text()
    start = text.index("    latex: ")
    text = text[:start] + text[text.index("    domain:"):]
    p = write(tmp_path, "softmax-lite-v1.yaml", text)
    rc, out, _ = pv(capsys, "equations", "--format", "latex", p)
    assert rc == 0 and GOLDEN[0][1] in out


# ============================================================================ diff


def _pair(tmp_path, new_text: str, old_text: str | None = None):
    old = write(tmp_path, "old.yaml", old_text or base_text())
    new = write(tmp_path, "new.yaml", new_text)
    return old, new


def _diff(capsys, old, new):
    rc, out, _ = pv(capsys, "diff", "--format", "json", old, new)
    return rc, json.loads(out)


def _bump(text: str, version: str) -> str:
    return edit(text, "  version: 1.0.0", f"  version: {version}")


LOOSER = ('float32: {atol: "(n + 4) * eps"}\n        float16: {atol: "eps + n * 6.0e-8"}\n'
          '    if_fails: "normalizer')


def test_diff_loosened_tolerance_demands_major(tmp_path, capsys):
    """The acceptance case: only a tolerance was loosened."""
    new = edit(base_text(), LOOSER, LOOSER.replace("(n + 4) * eps", "(n + 40) * eps"))
    old, newp = _pair(tmp_path, _bump(new, "1.1.0"))
    rc, out, _ = pv(capsys, "diff", old, newp)
    assert rc == 1
    assert "FALSIFY-SM-001 check.tolerance.float32.atol" in out and "loosened" in out
    assert "need a major bump (1.0.0 -> 2.0.0 or later)" in out
    rc, d = _diff(capsys, old, newp)
    (ch,) = d["changes"]
    assert (ch["key"], ch["field"], ch["bump"]) == ("FALSIFY-SM-001",
                                                    "check.tolerance.float32.atol", "major")
    assert d["required"] == "major" and d["declared"] == "minor" and not d["ok"]
    _, newp = _pair(tmp_path, _bump(new, "2.0.0"))
    assert pv(capsys, "diff", old, newp)[0] == 0


@pytest.mark.parametrize("old_val, new_val, bump", [
    ("1.0e-6 * eps", "1.0e-5 * eps", "major"),  # numerically larger
    ("1.0e-6 * eps", "1.0e-7 * eps", "minor"),  # tighter
    ("1.0e-6 * eps", "eps * 1.0e-6", "patch"),  # same value, rewritten
])
def test_diff_tolerance_expressions_are_evaluated(tmp_path, capsys, old_val, new_val, bump):
    marker = 'float32: {atol: "1.0e-6 * eps", rtol: "(n + 4) * eps"}\n        float16: ' \
             '{atol: 6.0e-8, rtol: "eps"}\n    if_fails: "kernel differs'
    new = edit(base_text(), marker, marker.replace(old_val, new_val, 1))
    _, d = _diff(capsys, *_pair(tmp_path, _bump(new, "2.0.0")))
    (ch,) = d["changes"]
    assert ch["bump"] == bump and ch["field"] == "check.tolerance.float32.atol"


def test_diff_adding_an_rtol_is_loosening(tmp_path, capsys):
    new = edit(base_text(), LOOSER, LOOSER.replace('{atol: "(n + 4) * eps"}',
                                                   '{atol: "(n + 4) * eps", rtol: 1.0e-3}'))
    _, d = _diff(capsys, *_pair(tmp_path, new))
    (ch,) = d["changes"]
    assert ch["bump"] == "major" and ch["field"].endswith("float32.rtol")


def test_diff_wording_is_a_patch_and_needs_a_bump(tmp_path, capsys):
    new = edit(base_text(), 'if_fails: "overflow or cancellation at large logits"',
               'if_fails: "overflow, or cancellation at large logits"')
    new = edit(new, "property: Shift invariance", "property: Shift invariance of the rows")
    old, newp = _pair(tmp_path, new)
    rc, d = _diff(capsys, old, newp)
    assert rc == 1 and d["required"] == "patch" and d["declared"] == "none"
    assert {c["bump"] for c in d["changes"]} == {"patch"}
    _, newp = _pair(tmp_path, _bump(new, "1.0.1"))
    assert _diff(capsys, old, newp)[0] == 0


def test_diff_removing_and_adding(tmp_path, capsys):
    text = base_text()
    start = text.index("  - id: MUT-SM-002")
    end = text.index("  - id: MUT-SM-004")
    new = text[:start] + text[end:]  # a mutant removed
    _, d = _diff(capsys, *_pair(tmp_path, _bump(new, "1.1.0")))
    (ch,) = d["changes"]
    assert (ch["section"], ch["key"], ch["what"], ch["bump"]) == \
        ("mutants", "MUT-SM-002", "removed", "major")
    # the reverse edit adds it: minor
    rc, d = _diff(capsys, *_pair(tmp_path, _bump(text, "1.1.0"), old_text=new))
    assert rc == 0 and d["required"] == "minor"


def test_diff_removed_check_and_binding_are_major(tmp_path, capsys):
    text = base_text()
    new = edit(text, "      torch: falsify.kernels.torch.softmax:softmax\n", "")
    _, d = _diff(capsys, *_pair(tmp_path, new))
    fields = {(c["section"], c["field"], c["bump"]) for c in d["changes"]}
    assert ("equations", "bindings.torch", "major") in fields
    assert any(c["field"] == "runs" and c["what"] == "removed" for c in d["changes"])


def test_diff_input_narrowing_and_widening(tmp_path, capsys):
    narrow = edit(base_text(), "values: [-30.0, 30.0]", "values: [-10.0, 10.0]")
    _, d = _diff(capsys, *_pair(tmp_path, narrow))
    assert [c["bump"] for c in d["changes"]] == ["major"]
    wide = edit(base_text(), "dims: {m: [1, 8], n: [1, 300]}", "dims: {m: [1, 8], n: [1, 500]}")
    _, d = _diff(capsys, *_pair(tmp_path, wide))
    assert [(c["field"], c["bump"]) for c in d["changes"]] == [("dims.n", "minor")]
    fewer = edit(base_text(), "  rows:\n    dtypes: [float32, float16]",
                 "  rows:\n    dtypes: [float32]")
    _, d = _diff(capsys, *_pair(tmp_path, fewer))
    assert ("inputs", "dtypes", "removed", "major") in {
        (c["section"], c["field"], c["what"], c["bump"]) for c in d["changes"]}


def test_diff_predicate_change_is_major_but_formatting_is_a_patch(tmp_path, capsys):
    new = edit(base_text(), 'predicate: "(y >= 0) & (y <= 1)"', 'predicate: "(y >= 0)"')
    _, d = _diff(capsys, *_pair(tmp_path, new))
    assert [(c["field"], c["bump"]) for c in d["changes"]] == [("check.predicate", "major")]
    new = edit(base_text(), 'predicate: "(y >= 0) & (y <= 1)"', 'predicate: "(y>=0)&(y<=1)"')
    _, d = _diff(capsys, *_pair(tmp_path, new))
    assert [(c["field"], c["bump"]) for c in d["changes"]] == [("check.predicate", "patch")]


def test_diff_formal_statement_change_is_major(tmp_path, capsys):
    new = edit(base_text(), 'formal: "0 ≤ σ(x)_i ≤ 1"', 'formal: "0 < σ(x)_i ≤ 1"')
    _, d = _diff(capsys, *_pair(tmp_path, new))
    assert [(c["key"], c["field"], c["bump"]) for c in d["changes"]] == \
        [("SM-BND-001", "formal", "major")]


def test_diff_identical_and_backwards(tmp_path, capsys):
    old, new = _pair(tmp_path, base_text())
    rc, out, _ = pv(capsys, "diff", old, new)
    assert rc == 0 and "no changes" in out
    _, new = _pair(tmp_path, _bump(base_text(), "0.9.0"))
    rc, out, _ = pv(capsys, "diff", old, new)
    assert rc == 1 and "went backwards" in out


def test_diff_compat_contract_tolerance(tmp_path, capsys):
    text = (FIX / "compat" / "cublas-gemm-v1.yaml").read_text(encoding="utf-8")
    new = edit(text, "    tolerance: 1e-2\n", "    tolerance: 1e-1\n")
    old, newp = _pair(tmp_path, new, old_text=text)
    rc, d = _diff(capsys, old, newp)
    (ch,) = d["changes"]
    assert (ch["key"], ch["field"], ch["bump"]) == ("CUBLAS-EQV-001", "tolerance", "major")
    assert rc == 1


def test_diff_compat_inserted_obligation_does_not_renumber(tmp_path, capsys):
    """Derived ids shift when an obligation is inserted; they are matched by property."""
    text = (FIX / "compat" / "cublas-gemm-v1.yaml").read_text(encoding="utf-8")
    new = edit(text, "proof_obligations:\n", "proof_obligations:\n  - type: invariant\n"
                                             "    property: \"A new first invariant\"\n\n")
    _, d = _diff(capsys, *_pair(tmp_path, new, old_text=text))
    assert [(c["what"], c["bump"]) for c in d["changes"]] == [("added", "minor")]


def test_diff_usage_errors(tmp_path, capsys):
    assert pv(capsys, "diff", BASE)[0] == 2  # one file
    assert pv(capsys, "diff", BASE, tmp_path / "missing.yaml")[0] == 2
    assert pv(capsys, "diff", BASE, tmp_path)[0] == 2  # a directory


def test_diff_compat_reworded_obligation_is_a_patch(tmp_path, capsys):
    text = (FIX / "compat" / "cublas-gemm-v1.yaml").read_text(encoding="utf-8")
    new = edit(text, 'property: "cuBLAS GEMM matches PTX GEMM"',
               'property: "cuBLAS GEMM output matches the PTX GEMM"')
    _, d = _diff(capsys, *_pair(tmp_path, new, old_text=text))
    assert [(c["key"], c["field"], c["bump"]) for c in d["changes"]] == \
        [("CUBLAS-EQV-001", "property", "patch")]
