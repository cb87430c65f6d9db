"""Training data: corpus -> byte-level BPE -> packed fixed-length blocks -> seeded batches.

Corpus: by default the Python standard library source of the running interpreter (every *.py under
sysconfig's stdlib path, site-packages excluded, sorted by relative path so the order never
depends on the file system), plus user text / JSONL files. Files that are not valid UTF-8 are
skipped and counted (a byte-level tokenizer could take them, but a text corpus should not carry
mojibake). `corpus="synthetic"` generates token documents from a seeded low-entropy Markov chain
with no tokenizer at all, for fast loop-level tests.

The split into train/validation is by file (a hash of its name), so no file leaks across it and
adding a file does not move any other. The trained tokenizer and the tokenized corpus are cached
under `cache_dir/<key>/`, the key being a hash of the document names and contents, the vocab size
and the split, so a second run skips tokenizer training and encoding.

JSONL files (here and in fine-tuning data) are read by `iter_jsonl`, a line at a time with
bounded memory: a line longer than its limit (MAX_JSONL_LINE_BYTES here, 4 MiB; fine-tuning
records: sft_data.MAX_RECORD_BYTES) or JSON nested deeper than MAX_JSON_DEPTH (64) is refused
before it is parsed, as is a line that is not UTF-8, each as a DataError naming file:line.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from falsify.harness.files import atomic_path
from falsify.kernels.torch.bpe_tokenizer import (  # noqa: F401 (re-exported)
    EOS,
    FIM_MIDDLE,
    FIM_PREFIX,
    FIM_SUFFIX,
    SPECIAL_TOKENS,
    train_tokenizer,
)
from falsify.kernels.torch.bpe_tokenizer import decode_with as decode  # noqa: F401
from falsify.kernels.torch.bpe_tokenizer import encode_with as encode  # noqa: F401
from falsify.llm.checkpoint import make_temp_dir

# EOS, FIM_*, SPECIAL_TOKENS (ids 0..3, in this order; synthetic data uses the same),
# train_tokenizer, encode and decode are the tokenizer kernel's, whose contract checks the
# tokenizer they make: the loop runs that code, and the names stay importable from here.
CACHE_FORMAT = 1  # bump when the cached layout or tokenizer recipe changes
TEXT_SUFFIXES = (".py", ".txt", ".md", ".rst", ".jsonl")


class DataError(ValueError):
    """Bad data configuration or input; the message names the field or file."""


MAX_JSONL_LINE_BYTES = 4 * 2**20  # a document line; pretraining files are source-file sized
MAX_JSON_DEPTH = 64  # records are a few levels deep; json's parser recurses per level
# a JSON string (escapes included), matched without backtracking, so brackets inside strings
# are not counted as nesting
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')


def _json_depth(line: bytes) -> int:
    """Deepest [ / { nesting of one JSON text, without parsing (so without recursion)."""
    if line.count(b"[") + line.count(b"{") <= MAX_JSON_DEPTH:
        return 0  # cannot be deeper than the limit: skip the scan
    code = np.frombuffer(_JSON_STRING.sub(b"", line), dtype=np.uint8)
    steps = (np.isin(code, (ord("["), ord("{"))).astype(np.int64)
             - np.isin(code, (ord("]"), ord("}"))).astype(np.int64))
    return int(np.cumsum(steps).max(initial=0))


def iter_jsonl(path: str | Path, max_line_bytes: int = MAX_JSONL_LINE_BYTES,
               what: str = "line"):
    """(line number, parsed JSON value) for each non-blank line of a JSONL file, read a line at
    a time (memory bounded by `max_line_bytes`). Every refusal is a DataError `path:line: …`."""
    path = Path(path)
    try:
        fh = path.open("rb")
    except OSError as e:
        raise DataError(f"{path}: cannot read: {e.strerror or e}") from None
    with fh:
        n = 0
        while True:
            raw = fh.readline(max_line_bytes + 1)
            if not raw:
                return
            n += 1
            if len(raw) > max_line_bytes and not raw.endswith(b"\n"):
                raise DataError(f"{path}:{n}: {what} longer than {max_line_bytes:,} bytes "
                                f"(the limit for one {what}); not read further")
            try:
                text = raw.decode("utf-8-sig" if n == 1 else "utf-8")
            except UnicodeDecodeError as e:
                raise DataError(f"{path}:{n}: not UTF-8 (byte 0x{raw[e.start]:02x} at column "
                                f"{e.start + 1})") from None
            if not text.strip():
                continue
            depth = _json_depth(raw)
            if depth > MAX_JSON_DEPTH:
                raise DataError(f"{path}:{n}: JSON nested {depth} levels deep (the limit is "
                                f"{MAX_JSON_DEPTH})")
            try:
                value = json.loads(text)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{n}: invalid JSON ({e.msg} at column {e.colno})") \
                    from None
            except RecursionError:  # the scan above should make this unreachable
                raise DataError(f"{path}:{n}: JSON nested too deeply") from None
            yield n, value


@dataclass(frozen=True)
class DataSpec:
    corpus: str = "stdlib"  # "stdlib" | "synthetic" | "none"
    data_files: tuple[str, ...] = ()
    jsonl_field: str = "text"
    max_files: int | None = None
    max_bytes: int | None = None
    val_fraction: float = 0.05
    vocab_size: int = 2048
    synthetic_tokens: int = 200_000  # corpus="synthetic" only
    seed: int = 42  # synthetic generation only; batching/FIM take their own seeds

    def validate(self) -> None:
        if self.corpus not in ("stdlib", "synthetic", "none"):
            raise DataError(f"corpus={self.corpus!r}: must be 'stdlib', 'synthetic' or 'none'")
        if self.corpus == "none" and not self.data_files:
            raise DataError("corpus='none' needs data_files")
        if not 0.0 <= self.val_fraction < 1.0:
            raise DataError(f"val_fraction={self.val_fraction}: must be in [0, 1)")
        if self.vocab_size < 256 + len(SPECIAL_TOKENS) and self.corpus != "synthetic":
            raise DataError(f"vocab_size={self.vocab_size}: a byte-level BPE needs at least "
                            f"{256 + len(SPECIAL_TOKENS)} (256 bytes + special tokens)")


@dataclass
class Document:
    name: str
    text: str


@dataclass
class TokenDocs:
    """Documents as one token array plus boundaries: doc i is tokens[offsets[i]:offsets[i+1]]."""

    tokens: np.ndarray
    offsets: np.ndarray

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def doc(self, i: int) -> np.ndarray:
        return self.tokens[self.offsets[i]:self.offsets[i + 1]]

    @property
    def num_tokens(self) -> int:
        return int(self.tokens.shape[0])


@dataclass
class PreparedData:
    train: TokenDocs
    val: TokenDocs
    vocab_size: int
    special_ids: dict[str, int]
    key: str
    tokenizer: object | None = None  # tokenizers.Tokenizer; None for synthetic data
    cache_path: Path | None = None
    info: dict = field(default_factory=dict)


# ---------------------------------------------------------------------------------- corpus
def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files() -> list[Path]:
    root = stdlib_root()
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        # prune, not filter: site-packages can hold far more files than the stdlib itself
        dirnames[:] = [d for d in dirnames if d not in ("site-packages", "__pycache__")]
        files += [Path(dirpath) / f for f in filenames if f.endswith(".py")]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def _read_text(path: Path) -> str | None:
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        return None


def _user_documents(paths: tuple[str, ...], jsonl_field: str) -> list[Document]:
    docs: list[Document] = []
    for raw in paths:
        p = Path(raw)
        if not p.exists():
            raise DataError(f"data_files: {raw!r} does not exist")
        files = sorted(q for q in p.rglob("*") if q.suffix in TEXT_SUFFIXES) if p.is_dir() else [p]
        for f in files:
            if f.suffix == ".jsonl":
                for n, rec in iter_jsonl(f):
                    if not isinstance(rec, dict) or not isinstance(rec.get(jsonl_field), str):
                        raise DataError(f"{f}:{n}: no string field {jsonl_field!r} "
                                        "(set jsonl_field)")
                    docs.append(Document(f"{f}:{n}", rec[jsonl_field]))
            else:
                text = _read_text(f)
                if text is None:
                    raise DataError(f"data_files: {f} is not valid UTF-8")
                docs.append(Document(str(f), text))
    return docs


def _iter_documents(spec: DataSpec, counts: dict):
    if spec.corpus == "stdlib":
        root = stdlib_root()
        for p in stdlib_files():
            text = _read_text(p)
            if text is None:
                counts["skipped_non_utf8"] += 1
                continue
            yield Document("stdlib/" + p.relative_to(root).as_posix(), text)
    yield from _user_documents(tuple(spec.data_files), spec.jsonl_field)


def load_documents(spec: DataSpec) -> tuple[list[Document], dict]:
    """The corpus as documents, in a deterministic order, limited by max_files / max_bytes
    (first files in that order; a limit stops before the file that would exceed it)."""
    counts = {"skipped_non_utf8": 0}
    kept, nbytes = [], 0
    for d in _iter_documents(spec, counts):
        if spec.max_files is not None and len(kept) >= spec.max_files:
            break
        size = len(d.text.encode("utf-8"))
        if spec.max_bytes is not None and nbytes + size > spec.max_bytes and kept:
            break
        kept.append(d)
        nbytes += size
    if not kept:
        raise DataError("the corpus is empty (check corpus, data_files, max_files, max_bytes)")
    return kept, {"documents": len(kept), "bytes": nbytes, **counts}


def split_of(name: str, val_fraction: float) -> str:
    """'val' for a stable pseudo-random val_fraction of names, else 'train'."""
    h = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big") / 2.0**64
    return "val" if h < val_fraction else "train"


def split_documents(docs: list[Document], val_fraction: float):
    train = [d for d in docs if split_of(d.name, val_fraction) == "train"]
    val = [d for d in docs if split_of(d.name, val_fraction) == "val"]
    if val_fraction > 0 and not val and len(train) > 1:
        # Tiny corpora: the hash put nothing in val; move the last train file (deterministic).
        val = [train.pop()]
    if not train:
        raise DataError(f"val_fraction={val_fraction} left no training documents")
    return train, val


# ------------------------------------------------------------------------------- tokenizer
def load_tokenizer(path: str | Path):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path))


def save_tokenizer(tok, path: str | Path) -> None:
    with atomic_path(path, suffix=".json") as tmp:
        tok.save(str(tmp))


def _token_dtype(vocab_size: int):
    return np.uint16 if vocab_size <= 2**16 else np.int32


def _encode_docs(tok, texts: list[str], vocab_size: int) -> TokenDocs:
    encs = tok.encode_batch_fast(texts, add_special_tokens=False) if texts else []
    lens = np.array([len(e.ids) for e in encs], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    tokens = np.empty(int(offsets[-1]), dtype=_token_dtype(vocab_size))
    for e, a, b in zip(encs, offsets[:-1], offsets[1:]):
        tokens[a:b] = e.ids
    return TokenDocs(tokens, offsets)


# ------------------------------------------------------------------------------- synthetic
def synthetic_docs(vocab_size: int, n_tokens: int, seed: int, val_fraction: float):
    """Token documents from a seeded sparse Markov chain over ids >= 4 (ids 0..3 stay the special
    tokens): each token has 4 likely successors, so a model can learn it in a few hundred steps."""
    rng = np.random.default_rng([seed, 7])
    lo = len(SPECIAL_TOKENS)
    succ = rng.integers(lo, vocab_size, size=(vocab_size, 4))
    lengths = rng.integers(20, 200, size=n_tokens // 20 + 1)
    lengths = lengths[: int(np.searchsorted(np.cumsum(lengths), n_tokens)) + 1]
    docs = []
    for n in lengths:
        t = np.empty(int(n), dtype=np.int64)
        t[0] = rng.integers(lo, vocab_size)
        choice = rng.integers(0, 4, size=int(n))
        for i in range(1, int(n)):
            t[i] = succ[t[i - 1], choice[i]]
        docs.append(t)
    n_val = int(round(len(docs) * val_fraction))
    n_val = max(n_val, 1) if val_fraction > 0 else 0

    def td(ds):
        offsets = np.concatenate([[0], np.cumsum([len(d) for d in ds])]).astype(np.int64)
        tokens = (np.concatenate(ds) if ds else np.zeros(0)).astype(_token_dtype(vocab_size))
        return TokenDocs(tokens, offsets)

    return td(docs[: len(docs) - n_val]), td(docs[len(docs) - n_val:])


# ----------------------------------------------------------------------------- preparation
def _corpus_key(spec: DataSpec, train: list[Document], val: list[Document]) -> str:
    h = hashlib.sha256()
    h.update(json.dumps({"format": CACHE_FORMAT, "vocab": spec.vocab_size,
                         "special": SPECIAL_TOKENS}).encode())
    for split, docs in (("train", train), ("val", val)):
        for d in docs:
            h.update(f"{split}\0{d.name}\0".encode())
            h.update(hashlib.sha256(d.text.encode("utf-8")).digest())
    return h.hexdigest()


def prepare_data(spec: DataSpec, cache_dir: str | Path = ".falsify/cache") -> PreparedData:
    """Corpus -> (tokenizer, tokenized train/val documents), cached by content hash."""
    spec.validate()
    special = {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    if spec.corpus == "synthetic" and not spec.data_files:
        train, val = synthetic_docs(spec.vocab_size, spec.synthetic_tokens, spec.seed,
                                    spec.val_fraction)
        key = hashlib.sha256(json.dumps(
            ["synthetic", spec.vocab_size, spec.synthetic_tokens, spec.seed,
             spec.val_fraction]).encode()).hexdigest()
        return PreparedData(train, val, spec.vocab_size, special, key,
                            info={"documents": len(train) + len(val), "cached": False})
    if spec.corpus == "synthetic":
        raise DataError("corpus='synthetic' cannot be combined with data_files")
    docs, info = load_documents(spec)
    train_docs, val_docs = split_documents(docs, spec.val_fraction)
    key = _corpus_key(spec, train_docs, val_docs)
    path = Path(cache_dir) / key[:24]
    if (path / "meta.json").exists():
        tok = load_tokenizer(path / "tokenizer.json")
        train = TokenDocs(np.load(path / "train.npy"), np.load(path / "train_offsets.npy"))
        val = TokenDocs(np.load(path / "val.npy"), np.load(path / "val_offsets.npy"))
        info["cached"] = True
    else:
        tok = train_tokenizer([d.text for d in train_docs], spec.vocab_size)
        if tok.get_vocab_size() != spec.vocab_size:
            # BPE stops early when the corpus has fewer distinct merges than requested; a model
            # whose vocab disagrees with its tokenizer fails the plan check.
            raise DataError(f"vocab_size={spec.vocab_size}: the corpus only supports "
                            f"{tok.get_vocab_size()} tokens; use a smaller vocab or more data")
        for t, i in special.items():
            assert tok.token_to_id(t) == i, (t, tok.token_to_id(t))
        train = _encode_docs(tok, [d.text for d in train_docs], spec.vocab_size)
        val = _encode_docs(tok, [d.text for d in val_docs], spec.vocab_size)
        _write_cache(path, tok, train, val, {"key": key, "info": info,
                                             "train_docs": len(train), "val_docs": len(val)})
        info["cached"] = False
    info.update(train_documents=len(train), val_documents=len(val),
                train_tokens=train.num_tokens, val_tokens=val.num_tokens)
    return PreparedData(train, val, spec.vocab_size, special, key, tok, path, info)


def _write_cache(path: Path, tok, train: TokenDocs, val: TokenDocs, meta: dict) -> None:
    """Directory-level atomic write: fill a temp dir, then rename it into place. A concurrent
    writer that won the race leaves an identical entry; ours is discarded."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = make_temp_dir(path.parent, f".{path.name}-")
    try:
        tok.save(str(tmp / "tokenizer.json"))
        for name, arr in (("train", train.tokens), ("train_offsets", train.offsets),
                          ("val", val.tokens), ("val_offsets", val.offsets)):
            np.save(tmp / f"{name}.npy", arr)
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        try:
            os.replace(tmp, path)
        except OSError:
            if not (path / "meta.json").exists():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


# ------------------------------------------------------------------------ FIM and packing
def fim_psm(doc: np.ndarray, rng: np.random.Generator, ids: dict[str, int]) -> np.ndarray:
    """Prefix-Suffix-Middle: <fim_prefix> P <fim_suffix> S <fim_middle> M, with the two cut
    points uniform over token boundaries 0..len (so empty parts occur, as in SantaCoder).
    Cuts are at token, not character, boundaries: the cached tokens are reused unchanged."""
    i, j = np.sort(rng.integers(0, len(doc) + 1, size=2))
    return np.concatenate([[ids[FIM_PREFIX]], doc[:i], [ids[FIM_SUFFIX]], doc[j:],
                           [ids[FIM_MIDDLE]], doc[i:j]]).astype(doc.dtype)


def token_stream(docs: TokenDocs, eos_id: int, fim_rate: float = 0.0, fim_seed: int = 0,
                 special_ids: dict[str, int] | None = None) -> np.ndarray:
    """All documents, each followed by <|endoftext|>; a seeded fim_rate fraction in PSM form.
    Each document draws from its own generator ([fim_seed, index]) so the transform of one
    document does not depend on any other."""
    if not 0.0 <= fim_rate <= 1.0:
        raise DataError(f"fim_rate={fim_rate}: must be in [0, 1]")
    eos = np.array([eos_id], dtype=docs.tokens.dtype)
    if fim_rate == 0.0:
        parts = []
        for i in range(len(docs)):
            parts += [docs.doc(i), eos]
        return np.concatenate(parts) if parts else docs.tokens[:0]
    ids = special_ids or {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    parts = []
    for i in range(len(docs)):
        d = docs.doc(i)
        rng = np.random.default_rng([fim_seed, i])
        parts += [fim_psm(d, rng, ids) if rng.random() < fim_rate else d, eos]
    return np.concatenate(parts)


def num_blocks(stream_len: int, seq_len: int) -> int:
    """Blocks of seq_len inputs; block i reads stream[i·S : i·S + S + 1] (targets shifted by one,
    consecutive blocks share one boundary token so every token but the first is a target)."""
    return max(0, (stream_len - 1) // seq_len)


def steps_per_epoch(n_blocks: int, batch_size: int, grad_accum: int) -> int:
    """Steps per epoch: floor(sequences / batch / grad_accum)."""
    return n_blocks // (batch_size * grad_accum)


def block(stream: np.ndarray, i: int, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    a = i * seq_len
    return stream[a:a + seq_len], stream[a + 1:a + seq_len + 1]


class BatchSampler:
    """Seeded, resumable batches of packed blocks.

    Epoch e visits the blocks in the order of np.random.default_rng([seed, e]).permutation; an
    epoch is exactly steps_per_epoch optimizer steps of grad_accum micro-batches of batch_size
    blocks, the remainder is dropped, so epoch ends and optimizer steps line up and
    epochs × steps_per_epoch is the exact number of steps the data supports. The position
    (epoch, step in epoch) is all the state; `state_dict` / `load_state_dict` save and restore it.
    """

    def __init__(self, stream: np.ndarray, seq_len: int, batch_size: int, grad_accum: int,
                 epochs: int, seed: int, data_key: str = ""):
        self.stream, self.seq_len = stream, seq_len
        self.batch_size, self.grad_accum, self.epochs, self.seed = (
            batch_size, grad_accum, epochs, seed)
        self.n_blocks = num_blocks(len(stream), seq_len)
        self.steps_per_epoch = steps_per_epoch(self.n_blocks, batch_size, grad_accum)
        self.data_key = data_key
        self.epoch, self.step_in_epoch = 0, 0
        self._perm_epoch, self._perm = -1, None
        # the block indices of each micro-batch of the last step (a cached-teacher
        # distillation run looks its teacher's top-k up by block)
        self.last_blocks: list[np.ndarray] = []

    @property
    def total_steps(self) -> int:
        return self.epochs * self.steps_per_epoch

    def _permutation(self, epoch: int) -> np.ndarray:
        if self._perm_epoch != epoch:
            self._perm = np.random.default_rng([self.seed, epoch]).permutation(self.n_blocks)
            self._perm_epoch = epoch
        return self._perm

    def next_step(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """grad_accum micro-batches (inputs, targets), each int64 [batch_size, seq_len]."""
        if self.steps_per_epoch == 0 or self.epoch >= self.epochs:
            raise StopIteration(f"data exhausted after {self.epochs} epoch(s) of "
                                f"{self.steps_per_epoch} steps")
        perm = self._permutation(self.epoch)
        per_step = self.batch_size * self.grad_accum
        idx = perm[self.step_in_epoch * per_step:(self.step_in_epoch + 1) * per_step]
        micro = []
        self.last_blocks = []
        for m in range(self.grad_accum):
            blocks = idx[m * self.batch_size:(m + 1) * self.batch_size]
            self.last_blocks.append(blocks)
            rows = [block(self.stream, int(i), self.seq_len) for i in blocks]
            x = torch.from_numpy(np.stack([r[0] for r in rows]).astype(np.int64))
            y = torch.from_numpy(np.stack([r[1] for r in rows]).astype(np.int64))
            micro.append((x, y))
        self.step_in_epoch += 1
        if self.step_in_epoch == self.steps_per_epoch:
            self.epoch, self.step_in_epoch = self.epoch + 1, 0
        return micro

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "step_in_epoch": self.step_in_epoch,
                "n_blocks": self.n_blocks, "seed": self.seed, "batch_size": self.batch_size,
                "grad_accum": self.grad_accum, "data_key": self.data_key}

    def load_state_dict(self, state: dict) -> None:
        for k in ("n_blocks", "seed", "batch_size", "grad_accum", "data_key"):
            if state[k] != getattr(self, k):
                raise DataError(f"cannot restore data position: {k} was {state[k]!r} when the "
                                f"checkpoint was written, is {getattr(self, k)!r} now")
        self.epoch, self.step_in_epoch = int(state["epoch"]), int(state["step_in_epoch"])


def eval_batches(stream: np.ndarray, seq_len: int, batch_size: int, max_batches: int | None):
    """Deterministic validation batches: the first blocks in order."""
    n = num_blocks(len(stream), seq_len)
    if max_batches is not None:
        n = min(n, max_batches * batch_size)
    for a in range(0, n, batch_size):
        rows = [block(stream, i, seq_len) for i in range(a, min(a + batch_size, n))]
        yield (torch.from_numpy(np.stack([r[0] for r in rows]).astype(np.int64)),
               torch.from_numpy(np.stack([r[1] for r in rows]).astype(np.int64)))
