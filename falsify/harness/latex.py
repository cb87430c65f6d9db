"""Unicode formulas, as contracts write them, to LaTeX that KaTeX and LaTeX both accept.

Contracts write math the way people type it: `σ(x)_i = exp(x_i − max(x)) / Σ_j exp(x_j − max(x))`,
`√(Σ x_i² / n + ε)`, `x_i for all i`. `to_latex` tokenizes that text and renders each token:
Unicode symbols become commands, `x_i`/`x_{ij}`/`m₁`/`x²`/`⁻¹` become scripts, function names
become operators, runs of English words become `\\text{...}`. It never raises, whatever the
input: an unknown character ends up inside `\\text{}`, and a brace that does not close is
printed as a literal `\\{`. Output is ASCII except inside `\\text{}`.

`equation_latex(eq)` prefers an equation's hand-written `latex:` field.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

GREEK = {
    "α": r"\alpha", "β": r"\beta", "γ": r"\gamma", "δ": r"\delta", "ε": r"\varepsilon",
    "ϵ": r"\epsilon", "ζ": r"\zeta", "η": r"\eta", "θ": r"\theta", "ϑ": r"\vartheta",
    "ι": r"\iota", "κ": r"\kappa", "λ": r"\lambda", "μ": r"\mu", "ν": r"\nu", "ξ": r"\xi",
    "ο": "o", "π": r"\pi", "ρ": r"\rho", "ς": r"\varsigma", "σ": r"\sigma", "τ": r"\tau",
    "υ": r"\upsilon", "φ": r"\varphi", "ϕ": r"\phi", "χ": r"\chi", "ψ": r"\psi",
    "ω": r"\omega", "µ": r"\mu",
    "Γ": r"\Gamma", "Δ": r"\Delta", "Θ": r"\Theta", "Λ": r"\Lambda", "Ξ": r"\Xi",
    "Φ": r"\Phi", "Ψ": r"\Psi", "Ω": r"\Omega", "Υ": r"\Upsilon",
    # capitals that look Latin render as Latin letters
    "Α": "A", "Β": "B", "Ε": "E", "Ζ": "Z", "Η": "H", "Ι": "I", "Κ": "K", "Μ": "M",
    "Ν": "N", "Ο": "O", "Ρ": "P", "Τ": "T", "Χ": "X",
}
# Σ and Π in formulas are sums and products, not variables.
BIG_OPS = {"Σ": r"\sum", "∑": r"\sum", "Π": r"\prod", "∏": r"\prod", "∫": r"\int",
           "∮": r"\oint", "⋃": r"\bigcup", "⋂": r"\bigcap"}
SYMBOLS = {
    "−": "-", "–": "-", "—": "-", "·": r"\cdot", "⋅": r"\cdot", "∙": r"\cdot", "×": r"\times",
    "÷": r"\div", "±": r"\pm", "∓": r"\mp", "≤": r"\le", "⩽": r"\le", "≥": r"\ge",
    "⩾": r"\ge", "≠": r"\ne", "≈": r"\approx", "≃": r"\simeq", "≅": r"\cong",
    "≡": r"\equiv", "∼": r"\sim", "∝": r"\propto", "≪": r"\ll", "≫": r"\gg",
    "∈": r"\in", "∉": r"\notin", "∋": r"\ni", "⊂": r"\subset", "⊆": r"\subseteq",
    "⊃": r"\supset", "⊇": r"\supseteq", "∪": r"\cup", "∩": r"\cap", "∅": r"\emptyset",
    "∖": r"\setminus", "⇒": r"\Rightarrow", "⟹": r"\Longrightarrow", "⇐": r"\Leftarrow",
    "⇔": r"\Leftrightarrow", "⟺": r"\Longleftrightarrow", "→": r"\to", "⟶": r"\longrightarrow",
    "←": r"\leftarrow", "↔": r"\leftrightarrow", "↦": r"\mapsto", "↑": r"\uparrow",
    "↓": r"\downarrow", "∞": r"\infty", "∂": r"\partial", "∇": r"\nabla", "∀": r"\forall",
    "∃": r"\exists", "∄": r"\nexists", "¬": r"\neg", "∧": r"\land", "∨": r"\lor",
    "⊕": r"\oplus", "⊗": r"\otimes", "⊙": r"\odot", "∘": r"\circ", "⊤": r"\top",
    "⊥": r"\perp", "∥": r"\parallel", "ℓ": r"\ell", "ℏ": r"\hbar", "°": r"^{\circ}",
    "…": r"\ldots", "⋯": r"\cdots", "⋮": r"\vdots", "⋱": r"\ddots",
    "⌈": r"\lceil", "⌉": r"\rceil", "⌊": r"\lfloor", "⌋": r"\rfloor", "⟨": r"\langle",
    "⟩": r"\rangle", "〈": r"\langle", "〉": r"\rangle", "√": r"\surd",
    "ℝ": r"\mathbb{R}", "ℤ": r"\mathbb{Z}", "ℕ": r"\mathbb{N}", "ℚ": r"\mathbb{Q}",
    "ℂ": r"\mathbb{C}", "𝔼": r"\mathbb{E}", "½": r"\tfrac{1}{2}", "¼": r"\tfrac{1}{4}",
    "¾": r"\tfrac{3}{4}", "⅓": r"\tfrac{1}{3}", "√̅": r"\surd", "✓": r"\checkmark",
    "«": r"\ll", "»": r"\gg", "“": r"\text{``}", "”": r"\text{''}",
}
# primes are superscripts: x'' after x^2 needs braces, so they go through one handler
PRIMES = {"'": 1, "′": 1, "’": 1, "‘": 1, "`": 1, "″": 2, "‴": 3}
# symbols that are operands (can carry scripts: ℝ^n, ∞^2), not operators
SYMBOL_ATOMS = set("ℝℤℕℚℂ𝔼∞∅ℓℏ⊤½¼¾⅓∂∇")
SUPERSCRIPTS = dict(zip("⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻⁼⁽⁾ⁿⁱᵀᵗᵏᵈ",
                        list("0123456789+-=()ni") + [r"\top", "t", "k", "d"]))
SUBSCRIPTS = dict(zip("₀₁₂₃₄₅₆₇₈₉₊₋₌₍₎ₐₑₒₓₕₖₗₘₙₚₛₜᵢⱼᵣᵤᵥ", "0123456789+-=()aeoxhklmnpstijruv"))
# combining accents over the previous symbol: x̄, x̂, x̃, ẋ, x⃗
COMBINING = {"\u0304": r"\bar", "\u0305": r"\overline", "\u0302": r"\hat", "\u0303": r"\tilde",
             "\u0307": r"\dot", "\u0308": r"\ddot", "\u20d7": r"\vec"}
ASCII_ESCAPES = {"&": r"\&", "%": r"\%", "#": r"\#", "$": r"\$", "~": r"\sim",
                 "\\": r"\backslash", '"': r"\text{''}", "*": r"\cdot",
                 "{": r"\{", "}": r"\}", "_": r"\_", "^": r"\wedge"}
TWO_CHAR = {"<=": r"\le", ">=": r"\ge", "!=": r"\ne", "==": "=", "->": r"\to",
            "=>": r"\Rightarrow", "<-": r"\leftarrow", ">>": r"\gg", "<<": r"\ll",
            "||": r"\|", "...": r"\ldots", "..": ".."}
# Words that are operators in LaTeX (\exp ...) or should look like one.
TEX_OPS = {"exp", "log", "ln", "max", "min", "sin", "cos", "tan", "tanh", "sinh", "cosh",
           "arcsin", "arccos", "arctan", "det", "dim", "arg", "sup", "inf", "lim", "gcd",
           "deg", "ker", "Pr", "lg", "sec", "csc", "cot", "hom", "liminf", "limsup"}
NAMED_OPS = {"softmax", "argmax", "argmin", "sigmoid", "sign", "sgn", "diag", "tr", "mean",
             "var", "std", "erf", "relu", "gelu", "silu", "swiglu", "logsumexp", "clip",
             "rank", "round", "floor", "ceil", "abs", "cov", "rms", "RMS", "norm", "cdiv"}
BIG_WORDS = {"sum": r"\sum", "prod": r"\prod", "Sum": r"\sum", "Prod": r"\prod"}
GREEK_WORDS = {
    "alpha": r"\alpha", "beta": r"\beta", "gamma": r"\gamma", "delta": r"\delta",
    "epsilon": r"\varepsilon", "eps": r"\varepsilon", "zeta": r"\zeta", "eta": r"\eta",
    "theta": r"\theta", "kappa": r"\kappa", "lambda": r"\lambda", "lambd": r"\lambda",
    "mu": r"\mu", "nu": r"\nu", "xi": r"\xi", "pi": r"\pi", "rho": r"\rho",
    "sigma": r"\sigma", "tau": r"\tau", "phi": r"\varphi", "chi": r"\chi", "psi": r"\psi",
    "omega": r"\omega", "Gamma": r"\Gamma", "Delta": r"\Delta", "Theta": r"\Theta",
    "Lambda": r"\Lambda", "Sigma": r"\Sigma", "Phi": r"\Phi", "Psi": r"\Psi",
    "Omega": r"\Omega",
}
ACCENTS = {"hat": r"\hat", "bar": r"\bar", "tilde": r"\tilde", "dot": r"\dot", "vec": r"\vec"}
# Single words that read as prose even alone ("x ≥ 0 where ...").
CONNECTIVES = {"for", "all", "any", "each", "every", "where", "when", "if", "iff", "and",
               "or", "not", "with", "else", "otherwise", "then", "s.t.", "of", "in", "on",
               "to", "is", "are", "per", "over", "some", "no", "at", "by", "as", "so", "but"}

_TOKEN = re.compile(r"""
    (?P<nl>\n)
  | (?P<ws>[ \t\r\f\v]+)
  | (?P<hex>0[xX][0-9A-Fa-f]+)
  | (?P<num>\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)
  | (?P<ident>[A-Za-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)*)
  | (?P<op2>\.\.\.|<=|>=|!=|==|->|=>|<-|>>|<<|\|\||\*\*|\.\.)
  | (?P<sup>[⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻⁼⁽⁾ⁿⁱᵀᵗᵏᵈ]+)
  | (?P<sub>[₀₁₂₃₄₅₆₇₈₉₊₋₌₍₎ₐₑₒₓₕₖₗₘₙₚₛₜᵢⱼᵣᵤᵥ]+)
  | (?P<ch>.)
""", re.VERBOSE | re.DOTALL | re.ASCII)

_WORD = re.compile(r"[A-Za-z]+$")
_TEXT_SPECIALS = {"\\": r"\textbackslash{}", "{": r"\{", "}": r"\}", "_": r"\_", "#": r"\#",
                  "$": r"\$", "%": r"\%", "&": r"\&", "^": r"\textasciicircum{}",
                  "~": r"\textasciitilde{}"}


@dataclass
class Tok:
    kind: str
    text: str
    ws_before: bool = False


@dataclass
class Piece:
    tex: str
    kind: str  # var | name | num | op | open | close | text | big
    ws_before: bool = False
    sub: bool = False  # already carries a subscript / superscript: a second one needs braces
    sup: bool = False


def text_escape(s: str) -> str:
    """Escape a string for `\\text{...}` (and for LaTeX text mode)."""
    return "".join(_TEXT_SPECIALS.get(c, c) for c in s)


def _clean(s: str) -> str:
    """Unicode spaces become spaces, invisible format characters disappear."""
    out = []
    for c in s:
        cat = unicodedata.category(c)
        if c == "\n":
            out.append(c)
        elif cat in ("Zs", "Zl", "Zp") or (cat == "Cc"):
            out.append(" ")
        elif cat in ("Cf", "Cs", "Co", "Cn") or (cat.startswith("M") and c not in COMBINING):
            continue  # invisible, or a combining mark we cannot place
        else:
            out.append(c)
    return "".join(out)


def _tokens(line: str) -> list[Tok]:
    toks, ws = [], False
    for m in _TOKEN.finditer(line):
        kind = m.lastgroup
        if kind == "ws":
            ws = True
            continue
        toks.append(Tok(kind, m.group(), ws))
        ws = False
    return toks


MAX_NESTING = 24  # deeper {…}/(…) groups print as literal brackets: bounded recursion


def _pairs(toks: list[Tok]) -> dict[int, int]:
    """Index of each `{`/`(` token -> index of its closing token, in one pass."""
    out, stacks = {}, {"{": [], "(": []}
    closers = {"}": "{", ")": "("}
    for i, t in enumerate(toks):
        if t.kind != "ch":
            continue
        if t.text in stacks:
            stacks[t.text].append(i)
        elif t.text in closers and stacks[closers[t.text]]:
            out[stacks[closers[t.text]].pop()] = i
    return out


def _is_word(t: Tok) -> bool:
    return (t.kind == "ident" and bool(_WORD.match(t.text)) and t.text not in GREEK_WORDS
            and t.text != "sqrt")


def _script_follows(toks: list[Tok], i: int) -> bool:
    """True when toks[i] is followed directly by a call, index or script: it is a name then."""
    if i + 1 >= len(toks) or toks[i + 1].ws_before:
        return False
    n = toks[i + 1]
    return n.kind in ("sup", "sub") or (n.kind == "ch" and n.text in "([_^{") or (
        n.kind == "op2" and n.text == "**")


def _capital_not_operator(toks: list[Tok], i: int) -> bool:
    """Σ/Π at toks[i] is a sum/product unless nothing follows to sum over: Σ = U Λ Uᵀ, (Σ),
    Σ⁻¹, Σ^{-1}, Σ Ω are the letters."""
    nxt = toks[i + 1] if i + 1 < len(toks) else None
    if nxt is None:
        return True
    if nxt.kind == "op2":
        return nxt.text not in ("||", "**")
    if nxt.kind == "sup":
        return nxt.text.startswith("⁻")
    if nxt.kind != "ch":
        return False
    t = nxt.text
    if t in ")],;=<>|" or (t in GREEK and t.isupper()):
        return True
    if t in SYMBOLS:
        return t not in SYMBOL_ATOMS and t not in "−-"
    if t == "^":
        rest = "".join(x.text for x in toks[i + 2:i + 4])
        return rest.startswith(("-", "−", "{-", "{−"))
    return False


def _name_tex(name: str) -> str:
    return r"\mathrm{" + name.replace("_", r"\_") + "}"


def _base_tex(part: str) -> tuple[str, str]:
    """LaTeX for the first part of an identifier, plus a subscript split off its digits."""
    m = re.match(r"^([A-Za-z]+?)([0-9]+)$", part)
    if m and (m.group(1) in GREEK_WORDS or len(m.group(1)) == 1):
        return (GREEK_WORDS.get(m.group(1), m.group(1)), m.group(2))  # beta1 -> \beta_1
    if part in GREEK_WORDS:
        return GREEK_WORDS[part], ""
    if len(part) == 1:
        return part, ""
    return _name_tex(part), ""


def _base_tex_plain(part: str) -> str:
    if part in GREEK_WORDS:
        return GREEK_WORDS[part]
    return part if len(part) == 1 else _name_tex(part)


def _sub_tex(parts: list[str]) -> str:
    if len(parts) == 1:
        p = parts[0]
        if p in GREEK_WORDS:
            return GREEK_WORDS[p]
        if len(p) <= 2 or p.isdigit():
            return p
        return _name_tex(p)
    return _name_tex("_".join(parts))


def _ident(text: str, call: bool) -> Piece:
    """An identifier: a variable (x, x_i, W_base, beta1), a name (packed_byte), an operator
    (exp, softmax) or, when called, a function name."""
    if call:
        if text in TEX_OPS:
            return Piece("\\" + text, "fn")
        if text in BIG_WORDS:
            return Piece(BIG_WORDS[text], "big")
        if text in GREEK_WORDS:
            return Piece(GREEK_WORDS[text], "var")
        if len(text) > 1 and not re.match(r"^[A-Za-z]_", text):
            return Piece(r"\operatorname{" + text.replace("_", r"\_") + "}", "fn")
    if text in TEX_OPS:
        return Piece("\\" + text, "fn")
    if text in NAMED_OPS:
        return Piece(r"\operatorname{" + text + "}", "fn")
    if text in BIG_WORDS:
        return Piece(BIG_WORDS[text], "big")
    parts = text.split("_")
    if (parts[0] in TEX_OPS or parts[0] in BIG_WORDS or parts[0] in NAMED_OPS) and \
            len(parts) == 2 and (len(parts[1]) <= 2 or parts[1] in GREEK_WORDS):
        op = BIG_WORDS.get(parts[0]) or ("\\" + parts[0] if parts[0] in TEX_OPS else
                                         r"\operatorname{" + parts[0] + "}")
        sub = _sub_tex(parts[1:])
        return Piece(f"{op}_{{{sub}}}" if len(sub) > 1 else f"{op}_{sub}",
                     "big" if parts[0] in BIG_WORDS else "fn", sub=True)  # max_j, sum_j
    base, digits = _base_tex(parts[0]) if len(parts) == 1 else (_base_tex_plain(parts[0]), "")
    rest = parts[1:]
    if rest and rest[0] in ACCENTS and (len(parts[0]) == 1 or parts[0] in GREEK_WORDS):
        base = f"{ACCENTS[rest[0]]}{{{base}}}"  # m_hat_t -> \hat{m}_t
        rest = rest[1:]
    if digits:
        rest = [digits] + rest
    if not rest:
        return Piece(base, "name" if base.startswith(r"\mathrm") else "var")
    single = len(parts[0]) == 1 or parts[0] in GREEK_WORDS or digits
    if single:
        sub = _sub_tex(rest)
        return Piece(f"{base}_{{{sub}}}" if len(sub) > 1 else f"{base}_{sub}", "var", sub=True)
    last = parts[-1]
    if len(parts) >= 2 and (len(last) == 1 or last.isdigit()):
        sub = last if len(last) == 1 else "{" + last + "}"
        return Piece(f"{_name_tex('_'.join(parts[:-1]))}_{sub}", "name", sub=True)
    return Piece(_name_tex(text), "name")


def _number(text: str) -> Piece:
    m = re.match(r"^([0-9]+(?:\.[0-9]+)?)[eE]([-+]?[0-9]+)$", text)
    if not m:
        return Piece(text, "num")
    mant, exp = m.group(1), str(int(m.group(2)))  # 1.0e-06 -> 1.0 \times 10^{-6}
    if mant == "1":
        return Piece(f"10^{{{exp}}}", "num", sup=True)
    return Piece(f"{mant} \\times 10^{{{exp}}}", "num", sup=True)


class _Renderer:
    def __init__(self, toks: list[Tok], script: bool = False, depth: int = 0):
        self.toks = toks
        self.out: list[Piece] = []
        self.script_ctx = script  # inside _{...} / ^{...}: "ij", "2k", "t+1" are indices
        self.depth = depth
        self.pairs = _pairs(toks) if depth < MAX_NESTING else {}
        self.norms = 0  # ‖ seen so far: odd ones open, even ones close

    def group(self, i: int, j: int, script: bool = False) -> str:
        return render_tokens(self.toks[i + 1:j], script, self.depth + 1)

    # scripts -------------------------------------------------------------------------
    def attach(self, kind: str, tex: str, ws: bool):
        """Attach `_tex`/`^tex` to the last piece, bracing it when it already has one."""
        mark = "_" if kind == "sub" else "^"
        body = tex if len(tex) == 1 and tex.isalnum() else "{" + tex + "}"
        if not self.out or self.out[-1].kind in ("op", "open") or ws:
            self.out.append(Piece("{}" + mark + body, "var", ws, sub=kind == "sub",
                                  sup=kind == "sup"))
            return
        last = self.out[-1]
        if (kind == "sub" and (last.sub or last.sup)) or (kind == "sup" and last.sup):
            last.tex, last.sub, last.sup = "{" + last.tex + "}", False, False
        last.tex += mark + body
        last.sub |= kind == "sub"
        last.sup |= kind == "sup"

    def script_arg(self, i: int) -> tuple[str, int] | None:
        """The argument of `_`/`^` at toks[i]: a {group}, a (group) whose parens are dropped
        for `^`, a token, or a signed number. Returns (tex, next index)."""
        toks = self.toks
        if i >= len(toks) or toks[i].ws_before:
            return None
        t = toks[i]
        if t.kind == "ch" and t.text in "{(":
            j = self.pairs.get(i)
            if j is None:
                return None
            return self.group(i, j, script=True), j + 1
        if t.kind == "ident":
            p = _ident(t.text, False)
            return p.tex, i + 1
        if t.kind in ("num", "hex"):
            return _number(t.text).tex, i + 1
        if t.kind == "ch" and (t.text in GREEK or t.text in SYMBOLS):
            return GREEK.get(t.text) or SYMBOLS[t.text], i + 1
        if t.kind == "ch" and t.text in "-+" and i + 1 < len(toks) and \
                toks[i + 1].kind in ("num", "ident") and not toks[i + 1].ws_before:
            nxt = self.script_arg(i + 1)
            if nxt:
                return t.text + nxt[0], nxt[1]
        if t.kind == "ch" and t.text in "−":
            nxt = self.script_arg(i + 1)
            if nxt:
                return "-" + nxt[0], nxt[1]
        return None

    # main loop -----------------------------------------------------------------------
    def run(self) -> list[Piece]:
        toks, i = self.toks, 0
        while i < len(toks):
            t = toks[i]
            if _is_word(t) and not _script_follows(toks, i) and not (
                    self.script_ctx and len(t.text) <= 3):
                i = self.words(i)
                continue
            i = self.one(i)
        return self.out

    def words(self, i: int) -> int:
        """A run of plain words (numbers and alphanumerics may sit inside) separated by
        spaces: prose like "for all i" becomes \\text{for all} i."""
        toks, j = self.toks, i
        run = [i]
        while j + 1 < len(toks) and toks[j + 1].ws_before and (
                _is_word(toks[j + 1]) or (toks[j + 1].kind in ("num", "ident")
                                          and "_" not in toks[j + 1].text)) \
                and not _script_follows(toks, j + 1):
            j += 1
            run.append(j)
        # a run starts and ends on a real word; numbers, names and single letters at its
        # ends stay math ("x finite" -> x \text{ finite}, "for all i" -> \text{for all} i)
        def real(k):
            return _is_word(toks[k]) and len(toks[k].text) > 1

        while len(run) > 1 and not real(run[-1]):
            run.pop()
        if len(run) > 1 and not real(run[0]):
            return self.one(i)
        words = [toks[k].text for k in run]
        prose = len(words) >= 2 or (words[0] in CONNECTIVES) or (
            words[0].islower() and len(words[0]) >= 4 and words[0] not in TEX_OPS
            and words[0] not in NAMED_OPS and words[0] not in BIG_WORDS)
        if not prose:
            return self.one(i)
        lead = " " if toks[i].ws_before and self.out else ""
        after = run[-1] + 1
        trail = " " if after < len(toks) and toks[after].ws_before else ""
        body = text_escape(" ".join(words))
        self.out.append(Piece(r"\text{" + lead + body + trail + "}", "text", toks[i].ws_before))
        return after

    def one(self, i: int) -> int:
        """Translate the token at i; return the index of the next untranslated token."""
        t = self.toks[i]
        handler = {"ident": self._ident_tok, "num": self._num_tok, "hex": self._hex_tok,
                   "sup": self._script_tok, "sub": self._script_tok,
                   "op2": self._op2_tok}.get(t.kind, self._char)
        return handler(i, t, t.ws_before)

    def _ident_tok(self, i: int, t, ws: bool) -> int:
        toks = self.toks
        call = i + 1 < len(toks) and not toks[i + 1].ws_before and toks[i + 1].kind == "ch" \
            and toks[i + 1].text == "("
        if self.script_ctx and not call and re.fullmatch(r"[A-Za-z]{1,3}", t.text) \
                and t.text not in GREEK_WORDS and t.text not in TEX_OPS:
            self.out.append(Piece(t.text, "var", ws))  # x_{ij}: two indices, not a word
            return i + 1
        if t.text == "sqrt":
            return self.sqrt(i + 1, ws, spaced=not call)
        p = _ident(t.text, call)
        p.ws_before = ws
        self.out.append(p)
        return i + 1

    def _num_tok(self, i: int, t, ws: bool) -> int:
        p = _number(t.text)
        p.ws_before = ws
        self.out.append(p)
        return i + 1

    def _hex_tok(self, i: int, t, ws: bool) -> int:
        self.out.append(Piece(r"\mathtt{" + t.text + "}", "num", ws))
        return i + 1

    def _script_tok(self, i: int, t, ws: bool) -> int:
        table = SUPERSCRIPTS if t.kind == "sup" else SUBSCRIPTS
        parts = [table[c] for c in t.text]
        self.attach(t.kind, " ".join(parts) if any("\\" in x for x in parts)
                    else "".join(parts), ws)  # ᵀⁱ -> {\top i}, not \topi
        return i + 1

    def _op2_tok(self, i: int, t, ws: bool) -> int:
        if t.text == "**":
            return self.script("sup", i, ws)
        self.out.append(Piece(TWO_CHAR[t.text], "open" if t.text == "||" else "op", ws))
        return i + 1

    def _char(self, i: int, t, ws: bool) -> int:
        """One character token: scripts, primes, braces, norms, accents, operators, Greek."""
        c = t.text
        if c == "_":
            return self.script("sub", i, ws)
        if c == "^":
            return self.script("sup", i, ws)
        if c == "√":
            return self.sqrt(i + 1, ws)
        if c in PRIMES:
            return self._prime(i, c, ws)
        if c == "{":
            return self._brace(i, ws)
        if c == "‖":
            self.out.append(Piece(r"\lVert" if self.norms % 2 == 0 else r"\rVert",
                                  "open" if self.norms % 2 == 0 else "close", ws))
            self.norms += 1
            return i + 1
        if c in COMBINING:
            if self.out and self.out[-1].kind in ("var", "num", "name"):
                last = self.out[-1]
                last.tex = f"{COMBINING[c]}{{{last.tex}}}"
                last.sub = last.sup = False
            return i + 1
        if c in BIG_OPS:
            if c in "ΣΠ" and _capital_not_operator(self.toks, i):
                self.out.append(Piece(r"\Sigma" if c == "Σ" else r"\Pi", "var", ws))  # matrix Σ
            else:
                self.out.append(Piece(BIG_OPS[c], "big", ws))
            return i + 1
        if c in GREEK:
            return self._greek(i, c, ws)
        if c in SYMBOLS:
            if c == "°" and self.out:
                self.attach("sup", r"\circ", ws)
            else:
                self.out.append(Piece(SYMBOLS[c], "var" if c in SYMBOL_ATOMS else "op", ws))
            return i + 1
        self.out.append(self._plain_char(c, ws))
        return i + 1

    def _prime(self, i: int, c: str, ws: bool) -> int:
        primes = "'" * PRIMES[c]
        last = self.out[-1] if self.out else None
        if last is None or last.kind in ("op", "open") or ws:
            self.out.append(Piece("{}" + primes, "var", ws, sup=True))
        else:
            if last.sup and not last.tex.endswith("'"):
                last.tex = "{" + last.tex + "}"
            last.tex += primes
            last.sup = True
        return i + 1

    def _brace(self, i: int, ws: bool) -> int:
        j = self.pairs.get(i)
        if j is not None:
            self.out.append(Piece(r"\{" + self.group(i, j) + r"\}", "var", ws))
            return j + 1
        self.out.append(Piece(r"\{", "open", ws))
        return i + 1

    def _greek(self, i: int, c: str, ws: bool) -> int:
        self.out.append(Piece(GREEK[c], "var", ws))
        nxt = self.toks[i + 1] if i + 1 < len(self.toks) else None
        if nxt and nxt.kind == "num" and not nxt.ws_before and re.fullmatch(r"[0-9]{1,2}",
                                                                             nxt.text):
            self.attach("sub", nxt.text, False)  # β1 -> \beta_1
            return i + 2
        return i + 1

    @staticmethod
    def _plain_char(c: str, ws: bool) -> Piece:
        if c in ASCII_ESCAPES:
            return Piece(ASCII_ESCAPES[c], "op", ws)
        if c in "([":
            return Piece(c, "open", ws)
        if c in ")]":
            return Piece(c, "close", ws)
        if c.isascii():
            return Piece(c, "op", ws)
        name = unicodedata.name(c, "")
        if name.startswith("MATHEMATICAL") or unicodedata.category(c).startswith("L"):
            decomposed = unicodedata.normalize("NFKD", c)
            if decomposed.isascii() and decomposed.isalnum():
                return Piece(decomposed, "var", ws)  # 𝑥 -> x, é in a formula -> e
        return Piece(r"\text{" + text_escape(c) + "}", "var", ws)

    def script(self, kind: str, i: int, ws: bool) -> int:
        arg = self.script_arg(i + 1)
        if arg is None:
            self.out.append(Piece(r"\_" if kind == "sub" else r"\wedge", "op", ws))
            return i + 1
        self.attach(kind, arg[0], ws)
        return arg[1]

    def sqrt(self, i: int, ws: bool, spaced: bool = False) -> int:
        """`√(...)`, `sqrt(...)` or `√x`: i is the index after the root sign."""
        toks = self.toks
        if i < len(toks) and toks[i].kind == "ch" and toks[i].text == "(":
            j = self.pairs.get(i)
            if j is not None:
                self.out.append(Piece(r"\sqrt{" + self.group(i, j) + "}", "var", ws))
                return j + 1
        if i < len(toks) and (spaced or not toks[i].ws_before):
            sub = _Renderer(toks[i:i + 1])
            sub.one(0)
            j = i + 1
            # keep the radicand's scripts under the root: √x_i, √d², √x₁
            while j < len(toks) and not toks[j].ws_before and toks[j].kind in ("sup", "sub"):
                sub.toks = toks[:j + 1]
                sub.one(j)
                j += 1
            if sub.out and sub.out[0].kind in ("var", "num", "name"):
                self.out.append(Piece(r"\sqrt{" + " ".join(p.tex for p in sub.out) + "}",
                                      "var", ws))
                return j
        self.out.append(Piece(r"\surd", "op", ws))
        return i


_COMMAND_END = re.compile(r"\\[A-Za-z]+$")


def _join(pieces: list[Piece]) -> str:
    out = []
    for k, p in enumerate(pieces):
        prev = pieces[k - 1] if k else None
        sep = " " if p.ws_before and prev else ""
        if prev is None:
            pass
        elif p.ws_before and ((prev.kind == "name" and p.kind in ("name", "num", "var"))
                              or (prev.kind in ("num", "var") and p.kind == "name")
                              or (prev.kind == "num" and p.kind == "num")):
            sep = r"\ "  # "165 TFLOP" must not render as 165TFLOP
        elif not sep and p.tex[:1].isascii() and (p.tex[:1].isalnum() or p.tex[:1] == "@") \
                and _COMMAND_END.search(prev.tex[-40:]):
            sep = " "  # \alpha x, not \alphax (KaTeX reads @ as a letter in command names)
        if prev is not None and (prev.kind == "text" or p.kind == "text") and not sep.strip():
            sep = ""  # the \text{} carries its own spaces
        out.append(sep + p.tex)
    return "".join(out)


def render_tokens(toks: list[Tok], script: bool = False, depth: int = 0) -> str:
    return _join(_Renderer(toks, script, depth).run())


def to_latex(formula: str) -> str:
    """LaTeX (math mode, no delimiters) for a Unicode formula. Multi-line formulas become a
    left-aligned array, one row per line."""
    if not isinstance(formula, str):
        formula = str(formula)
    lines = [ln.strip() for ln in _clean(formula).split("\n")]
    rows = [render_tokens(_tokens(ln)) for ln in lines if ln]
    if not rows:
        return ""
    if len(rows) == 1:
        return rows[0]
    return r"\begin{array}{l} " + r" \\ ".join(rows) + r" \end{array}"


def equation_latex(eq) -> str:
    """An equation's LaTeX: its hand-written `latex:` field, else derived from `formula`."""
    return eq.latex if getattr(eq, "latex", None) else to_latex(getattr(eq, "formula", "") or "")
