"""`falsify run --shard K/N`: split the selected contracts over N machines.

The unit is the contract: a contract's checks and mutants run in one shard, so each shard's
ledger holds whole contracts and `pv ledger merge` never sees one key from two shards. The
split is greedy longest-first over the seconds the balance ledger records per contract (its
checks and mutants together): the longest contract goes to the least-loaded shard, ties to the
lowest shard number. A contract with no recorded seconds is placed by a stable hash of its id,
so a contract new to the ledger does not reshuffle the others. Every shard must read the same
balance ledger, or two shards could compute different splits.
"""

from __future__ import annotations

import hashlib
import re

from falsify.errors import UsageError


def parse(text: str) -> tuple[int, int]:
    """'K/N' with 1 <= K <= N."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text or "")
    if not m:
        raise UsageError(f"--shard {text!r}: expected K/N, e.g. 1/4")
    k, n = int(m[1]), int(m[2])
    if n < 1 or not 1 <= k <= n:
        raise UsageError(f"--shard {text!r}: need 1 <= K <= N (K={k}, N={n})")
    return k, n


def seconds(data: dict) -> dict[str, float]:
    """Recorded seconds per contract id, checks and mutants together."""
    out: dict[str, float] = {}
    for section in ("runs", "mutants"):
        for e in data.get(section, {}).values():
            d = e.get("duration_s")
            if d is not None:
                out[e["contract"]] = out.get(e["contract"], 0.0) + float(d)
    return out


def _hash_shard(contract_id: str, n: int) -> int:
    return int(hashlib.sha256(contract_id.encode()).hexdigest(), 16) % n


def partition(ids: list[str], durations: dict[str, float], n: int) -> list[list[str]]:
    """N lists of contract ids, each in the order of `ids`; the same input gives the same
    split on every machine (no dict order, no randomness)."""
    load = [0.0] * n
    where: dict[str, int] = {}
    timed = sorted((i for i in set(ids) if durations.get(i)), key=lambda i: (-durations[i], i))
    for cid in timed:
        s = min(range(n), key=lambda j: (load[j], j))
        where[cid] = s
        load[s] += durations[cid]
    for cid in ids:
        where.setdefault(cid, _hash_shard(cid, n))
    return [[i for i in ids if where[i] == s] for s in range(n)]


def select(contracts: list, spec: str, balance: dict) -> list:
    """The contracts of shard K of N, from parsed `contracts` and a loaded balance ledger."""
    k, n = parse(spec)
    mine = set(partition([c.id for c in contracts], seconds(balance), n)[k - 1])
    return [c for c in contracts if c.id in mine]
