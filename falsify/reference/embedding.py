"""Embedding lookup: out[..., :] = table[ids[...], :]; backward scatter-adds rows of dy.

    d_table[v] = Σ_{positions p with ids[p] = v} dy[p]     (repeated ids accumulate)

ids outside [0, V) are an error (raised here too, never wrapped or clamped).
"""

import numpy as np


def _ids(ids, vocab):
    ids = np.asarray(ids)
    if ids.dtype.kind not in "iu":
        raise TypeError(f"embedding: ids must be integers, got {ids.dtype}")
    if vocab == 0:  # a table of no rows: no id is valid, even in an empty lookup
        raise ValueError("embedding: the table has V = 0 rows")
    if ids.size and (ids.min() < 0 or ids.max() >= vocab):
        raise ValueError(f"embedding: ids must lie in [0, {vocab}), got [{ids.min()}, {ids.max()}]")
    return ids.astype(np.int64)


def embedding(ids, table):
    table = np.asarray(table, dtype=np.float64)
    return table[_ids(ids, table.shape[0])]


def embedding_backward(ids, table, dy):
    table = np.asarray(table, dtype=np.float64)
    ids = _ids(ids, table.shape[0])
    d_table = np.zeros_like(table)
    rows = np.asarray(dy, dtype=np.float64).reshape(-1, table.shape[1])
    np.add.at(d_table, ids.reshape(-1), rows)  # unbuffered: repeated ids accumulate
    return {"table": d_table}
