"""Byte-level BPE, the classic way: pure Python, integers and strings only, no floats.

    text → split on added tokens (leftmost-longest; each becomes its one id)
         → each other segment: GPT-2 pre-tokenizer regex → pieces
         → each piece: UTF-8 bytes → one symbol per byte (GPT-2's bytes_to_unicode table)
         → merge loop: repeatedly merge the adjacent pair of lowest merge rank (leftmost
           first among equal ranks) until no adjacent pair has a rank → vocab ids

`ByteLevelBPE.from_json` reads the vocabulary, the ranked merges, the added tokens and the
pre-tokenizer settings from a `tokenizers` tokenizer.json and refuses any setting it does not
implement (a normalizer, BPE dropout, add_prefix_space, ...): it never guesses. The contract
bpe-tokenizer-kernel-v1 holds HF `tokenizers` to it, id for id.

Character classes. GPT-2's pattern needs \\p{L} (letters), \\p{N} (numbers) and \\s, which
Python's `re` lacks; they are built here from `unicodedata` (general categories L*, N*) and the
Unicode White_Space property. The answer therefore depends on the Unicode version of this
Python's database, and a character assigned in a later version (a letter to `tokenizers`' regex
library, unassigned here) is classified differently: the equivalence holds for text of
characters this Python's database assigns (the contract draws such text for it).

The contract's entry points (`encode`, `decode`, `byte_tokens`) take a `vocab_size` naming the
tokenizer under test: the fixture file falsify/contracts/fixtures/bpe-tokenizer-<vocab_size>.json
the contract ships (the project's recipe trained on a fixed slice of the standard library). It
is read here as a data file beside the package, not through any module of ours; everything
computed from it is independent of `tokenizers` and of the backend under test.
"""

from __future__ import annotations

import json
import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

# Unicode's White_Space property (PropList.txt; unchanged since Unicode 6.3). Python's
# str.isspace also accepts U+001C..U+001F (separators by bidi class), which \s does not.
WHITE_SPACE = ("\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006"
               "\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")
MAX_CODE_POINT = 0x10FFFF


class TokenizerSpecError(ValueError):
    """A tokenizer.json this reference does not implement; the message names the field."""


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte → symbol table: printable Latin-1 bytes stand for themselves, the other 68
    (controls, space, 0x7F-0xA0, 0xAD) are moved to U+0100 upward in byte order, so every
    byte has a visible one-character symbol and a vocabulary is plain strings."""
    keep = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
            + list(range(ord("®"), ord("ÿ") + 1)))
    table, n = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + n)
            n += 1
    return table


BYTE_TO_SYMBOL = bytes_to_unicode()
SYMBOL_TO_BYTE = {s: b for b, s in BYTE_TO_SYMBOL.items()}


def _ranges(pred) -> str:
    """A regex character class body for the code points where pred(chr(cp)) holds."""
    parts, start = [], None
    for cp in range(MAX_CODE_POINT + 2):
        inside = cp <= MAX_CODE_POINT and not 0xD800 <= cp <= 0xDFFF and pred(chr(cp))
        if inside and start is None:
            start = cp
        elif not inside and start is not None:
            lo, hi = re.escape(chr(start)), re.escape(chr(cp - 1))
            parts.append(lo if start == cp - 1 else f"{lo}-{hi}")
            start = None
    return "".join(parts)


@lru_cache(maxsize=1)
def gpt2_pattern() -> re.Pattern:
    """GPT-2's pre-tokenizer, as `tokenizers`' ByteLevel(use_regex=True) writes it:
    's|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+
    Both engines backtrack and take the first alternative that matches, leftmost."""
    letters = _ranges(lambda c: unicodedata.category(c)[0] == "L")
    numbers = _ranges(lambda c: unicodedata.category(c)[0] == "N")
    space = "".join(re.escape(c) for c in WHITE_SPACE)
    return re.compile(
        rf"'s|'t|'re|'ve|'m|'ll|'d| ?[{letters}]+| ?[{numbers}]+| ?[^{space}{letters}{numbers}]+"
        rf"|[{space}]+(?![^{space}])|[{space}]+")


def _require(cond: bool, where: str, what: str) -> None:
    if not cond:
        raise TokenizerSpecError(f"tokenizer.json {where}: {what} (the reference implements "
                                 "byte-level BPE without it)")


@dataclass(frozen=True)
class ByteLevelBPE:
    vocab: dict[str, int]
    ranks: dict[tuple[str, str], int]
    added: dict[str, int]  # added tokens (the special tokens): content -> id
    use_regex: bool

    @classmethod
    def from_json(cls, text: str) -> ByteLevelBPE:
        spec = json.loads(text)
        model = spec.get("model") or {}
        _require(model.get("type") == "BPE", "model.type", f"{model.get('type')!r} is not BPE")
        for key in ("dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix"):
            _require(model.get(key) is None, f"model.{key}", f"{model.get(key)!r} is set")
        for key in ("fuse_unk", "byte_fallback", "ignore_merges"):
            _require(not model.get(key), f"model.{key}", "is true")
        _require(spec.get("normalizer") is None, "normalizer", "a normalizer is set")
        pre = spec.get("pre_tokenizer") or {}
        _require(pre.get("type") == "ByteLevel", "pre_tokenizer.type",
                 f"{pre.get('type')!r} is not ByteLevel")
        _require(not pre.get("add_prefix_space"), "pre_tokenizer.add_prefix_space", "is true")
        dec = spec.get("decoder") or {}
        _require(dec.get("type") == "ByteLevel", "decoder.type",
                 f"{dec.get('type')!r} is not ByteLevel")
        vocab = dict(model.get("vocab") or {})
        ranks = {}
        for r, m in enumerate(model.get("merges") or []):
            a, b = m.split(" ", 1) if isinstance(m, str) else m  # both tokenizers formats
            _require(a in vocab and b in vocab and a + b in vocab, f"model.merges[{r}]",
                     f"{a!r} + {b!r} has a part or a result outside the vocabulary")
            ranks.setdefault((a, b), r)  # a repeated pair keeps its first (lowest) rank
        added = {}
        for i, t in enumerate(spec.get("added_tokens") or []):
            for key in ("lstrip", "rstrip", "single_word"):
                _require(not t.get(key), f"added_tokens[{i}].{key}", "is true")
            added[t["content"]] = int(t["id"])
        return cls(vocab, ranks, added, bool(pre.get("use_regex", True)))

    # ------------------------------------------------------------------------- encode
    def split_added(self, text: str) -> list[tuple[str, bool]]:
        """(segment, is_added_token): added tokens matched leftmost-longest, never split."""
        if not self.added:
            return [(text, False)] if text else []
        alts = sorted(self.added, key=len, reverse=True)  # first alternative = longest
        pat = re.compile("|".join(re.escape(a) for a in alts))
        out, pos = [], 0
        for m in pat.finditer(text):
            if m.start() > pos:
                out.append((text[pos:m.start()], False))
            out.append((m.group(), True))
            pos = m.end()
        if pos < len(text):
            out.append((text[pos:], False))
        return out

    def pretokenize(self, segment: str) -> list[str]:
        return gpt2_pattern().findall(segment) if self.use_regex else [segment]

    def merge(self, symbols: list[str]) -> list[str]:
        """The merge loop: while some adjacent pair has a rank, merge the pair of lowest rank
        (the leftmost of equal ranks). One merge at a time, so a pair a merge creates competes
        by its own rank at once."""
        word = list(symbols)
        while len(word) > 1:
            best = None
            for i in range(len(word) - 1):
                r = self.ranks.get((word[i], word[i + 1]))
                if r is not None and (best is None or r < best[0]):
                    best = (r, i)
            if best is None:
                break
            i = best[1]
            word[i:i + 2] = [word[i] + word[i + 1]]
        return word

    def encode(self, text: str) -> list[int]:
        ids = []
        for segment, is_added in self.split_added(text):
            if is_added:
                ids.append(self.added[segment])
                continue
            for piece in self.pretokenize(segment):
                symbols = [BYTE_TO_SYMBOL[b] for b in piece.encode("utf-8")]
                for tok in self.merge(symbols):
                    if tok not in self.vocab:
                        raise TokenizerSpecError(f"tokenizer.json model.vocab: no token "
                                                 f"{tok!r} (byte symbols must all be there)")
                    ids.append(self.vocab[tok])
        return ids

    # ------------------------------------------------------------------------- decode
    def decode(self, ids) -> str:
        """ids → token strings → bytes (each symbol back to its byte; a token with a
        character outside the table, like a special token with a space, as its own UTF-8,
        which is what `tokenizers`' ByteLevel decoder does) → strict UTF-8."""
        inverse = {i: t for t, i in self.vocab.items()}
        inverse.update({i: t for t, i in self.added.items()})
        out = bytearray()
        for i in ids:
            tok = inverse.get(int(i))
            if tok is None:
                raise ValueError(f"decode: id {int(i)} is not in the vocabulary")
            if all(c in SYMBOL_TO_BYTE for c in tok):
                out += bytes(SYMBOL_TO_BYTE[c] for c in tok)
            else:
                out += tok.encode("utf-8")
        return out.decode("utf-8")  # strict: a cut multi-byte character is an error

    def byte_token_ids(self) -> list[int]:
        """The id of each byte's one-symbol token, in byte order; -1 where it is missing."""
        return [self.vocab.get(BYTE_TO_SYMBOL[b], -1) for b in range(256)]


# ---------------------------------------------------------------- the contract's entry points
# The tokenizers under test, one file per vocabulary the contract draws; shared with the torch
# backend so both sides read the same file.
FIXTURE_VOCABS = (300, 1024)
FIXTURE_DIR = Path(__file__).resolve().parents[1] / "contracts" / "fixtures"
FIXTURE_NAME = "bpe-tokenizer-{vocab_size}.json"


@lru_cache(maxsize=8)
def _model(vocab_size: int) -> ByteLevelBPE:
    if vocab_size not in FIXTURE_VOCABS:
        raise ValueError(f"vocab_size={vocab_size!r}: no tokenizer fixture (the contract's are "
                         f"{', '.join(map(str, FIXTURE_VOCABS))})")
    path = FIXTURE_DIR / FIXTURE_NAME.format(vocab_size=vocab_size)
    return ByteLevelBPE.from_json(path.read_text(encoding="utf-8"))


def encode(text: str, vocab_size: int) -> np.ndarray:
    return np.asarray(_model(vocab_size).encode(text), dtype=np.int64)


def decode(ids, vocab_size: int) -> str:
    return _model(vocab_size).decode([int(i) for i in ids])


def byte_tokens(vocab_size: int) -> np.ndarray:
    """The ids of the 256 single-byte tokens, ascending (-1 for each missing byte)."""
    return np.sort(np.asarray(_model(vocab_size).byte_token_ids(), dtype=np.int64))


def vocab_check(tokenizer_vocab: int, model_vocab: int) -> str:
    """The rule preflight enforces: '' when the sizes agree, else a refusal naming both."""
    if tokenizer_vocab == model_vocab:
        return ""
    return f"tokenizer vocab {tokenizer_vocab} != model vocab_size {model_vocab}"
