"""The contract dependency graph (`metadata.depends_on`): order, cycles, and renderings.

Edges are drawn from a dependency to the contract that uses it, so reading a picture top-down
(mermaid) or left-right (dot) follows the topological order: dependencies first. A
`depends_on` naming no known contract is an error (`Graph.missing`), never a phantom node.
All algorithms are iterative, so a 10,000-contract chain cannot overflow the stack.
"""

from __future__ import annotations

import heapq
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass
class Graph:
    deps: dict[str, list[str]]  # contract -> its existing dependencies (declared order)
    missing: list[tuple[str, int, str]] = field(default_factory=list)  # (contract, index, name)
    cycles: list[list[str]] = field(default_factory=list)  # [a, b, ..., a]
    order: list[str] = field(default_factory=list)  # dependencies first; `blocked` last
    blocked: list[str] = field(default_factory=list)  # on or behind a cycle: no order exists

    @property
    def nodes(self) -> list[str]:
        return sorted(self.deps)

    @property
    def dependents(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {n: [] for n in self.deps}
        for n, ds in self.deps.items():
            for d in ds:
                out[d].append(n)
        return {n: sorted(v) for n, v in out.items()}

    @property
    def ok(self) -> bool:
        return not self.missing and not self.cycles


def _depends_on(contracts) -> dict[str, list[str]]:
    """Accept Contract objects (anything with .id and .depends_on), or a mapping
    id -> Contract, or id -> list of dependency ids."""
    if isinstance(contracts, Mapping):
        items = [(k, v if isinstance(v, (list, tuple)) else v.depends_on)
                 for k, v in contracts.items()]
    else:
        items = [(c.id, c.depends_on) for c in contracts]
    return {str(k): [str(d) for d in v] for k, v in items}


def build(contracts: Iterable | Mapping) -> Graph:
    declared = _depends_on(contracts)
    deps, missing = {}, []
    for n, ds in declared.items():
        keep = []
        for i, d in enumerate(ds):
            if d not in declared:
                missing.append((n, i, d))
            elif d not in keep:
                keep.append(d)
        deps[n] = keep
    g = Graph(deps=deps, missing=missing)
    g.cycles = find_cycles(deps)
    g.order = topo_order(deps)
    g.blocked = g.order[len(_kahn(deps)):]
    return g


def _kahn(deps: dict[str, list[str]]) -> list[str]:
    """Kahn's algorithm, smallest id first among the ready ones (deterministic). Nodes on or
    behind a cycle never become ready and are left out."""
    indeg = {n: len(ds) for n, ds in deps.items()}
    users: dict[str, list[str]] = {n: [] for n in deps}
    for n, ds in deps.items():
        for d in ds:
            users[d].append(n)
    ready = [n for n, k in indeg.items() if k == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        n = heapq.heappop(ready)
        order.append(n)
        for u in users[n]:
            indeg[u] -= 1
            if indeg[u] == 0:
                heapq.heappush(ready, u)
    return order


def topo_order(deps: dict[str, list[str]]) -> list[str]:
    """Every node, dependencies first; nodes that cannot be ordered (cycles) follow, sorted."""
    order = _kahn(deps)
    placed = set(order)
    return order + sorted(n for n in deps if n not in placed)


def _sccs(deps: dict[str, list[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components, iteratively."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for root in sorted(deps):
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack.add(node)
            ds = deps[node]
            if i < len(ds):
                work.append((node, i + 1))
                d = ds[i]
                if d not in index:
                    work.append((d, 0))
                elif d in on_stack:
                    low[node] = min(low[node], index[d])
                continue
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                out.append(sorted(comp))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return out


def find_cycles(deps: dict[str, list[str]]) -> list[list[str]]:
    """One shortest cycle per strongly connected component, as [a, b, ..., a] starting at its
    smallest id (so the same graph always names the same cycle)."""
    cycles = []
    for comp in _sccs(deps):
        members = set(comp)
        start = comp[0]
        if len(comp) == 1 and start not in deps[start]:
            continue
        # breadth-first from start inside the component until we are back at start
        prev: dict[str, str] = {}
        frontier, found = [start], None
        while frontier and found is None:
            nxt = []
            for n in frontier:
                for d in deps[n]:
                    if d not in members:
                        continue
                    if d == start:
                        found = n
                        break
                    if d not in prev:
                        prev[d] = n
                        nxt.append(d)
                if found is not None:
                    break
            frontier = nxt
        path, n = [start], found
        while n is not None and n != start:
            path.append(n)
            n = prev.get(n)
        cycles.append([start] + list(reversed(path[1:])) + [start])
    return sorted(cycles)


# ---------------------------------------------------------------------------- renderings

MERMAID_RESERVED = {"end", "graph", "subgraph", "flowchart", "style", "class", "classdef",
                    "click", "linkstyle", "direction", "call", "href", "default"}


def _mermaid_ids(nodes: Iterable[str]) -> dict[str, str]:
    """Stable mermaid-safe ids: [A-Za-z0-9_] only, never a keyword, never starting with a
    digit (or o/x, which mermaid can read as an edge end), unique."""
    out: dict[str, str] = {}
    used: set[str] = set()
    for n in sorted(nodes):
        base = re.sub(r"[^A-Za-z0-9_]", "_", n) or "node"
        if base.lower() in MERMAID_RESERVED or not base[0].isalpha() or base[0] in "oxOX":
            base = "c_" + base
        ident, k = base, 2
        while ident in used:
            ident, k = f"{base}_{k}", k + 1
        used.add(ident)
        out[n] = ident
    return out


def _mermaid_label(s: str) -> str:
    s = s.replace("#", "#35;").replace('"', "#quot;").replace("<", "#lt;").replace(">", "#gt;")
    return '"' + s + '"'


def mermaid(contracts, focus: str | None = None, direction: str = "TD") -> str:
    """A `graph TD` mermaid diagram (`direction` "LR": left to right; "auto": LR when the
    widest rank holds at least as many contracts as there are ranks, as the docs pages draw
    it: a contract with six dependencies then stacks them in a column instead of spreading
    them over one row that the page shrinks below a readable size). `contracts`: Contract
    objects, a mapping id -> Contract or id -> dependency ids, or a Graph. With `focus` (a
    contract's docs page), only that contract, everything it depends on and everything that
    depends on it are drawn, and the focus node is highlighted. Dependencies that name no
    known contract are not drawn (`pv graph` reports them)."""
    g = contracts if isinstance(contracts, Graph) else build(contracts)
    nodes = g.order
    if focus is not None:
        if focus not in g.deps:
            raise KeyError(f"unknown contract {focus!r}")
        near = _reach(g.deps, focus) | _reach(g.dependents, focus)
        nodes = [n for n in g.order if n in near]
    if direction == "auto":
        ranks, widest = _shape(g, nodes)
        direction = "LR" if widest >= ranks else "TD"
    if direction not in ("TD", "LR"):
        raise ValueError(f"direction {direction!r}: TD, LR or auto")
    ids = _mermaid_ids(nodes)
    lines = [f"graph {direction}"]
    lines += [f"  {ids[n]}[{_mermaid_label(n)}]" for n in nodes]
    for n in nodes:
        for d in g.deps[n]:
            if d in ids:
                lines.append(f"  {ids[d]} --> {ids[n]}")
    if focus is not None:
        lines.append("  classDef focus stroke-width:3px,font-weight:bold")
        lines.append(f"  class {ids[focus]} focus")
    return "\n".join(lines) + "\n"


# Kernel contracts are named <name>-kernel-vN; the others (train-loop-v1, distill-v1, ...)
# check the training loops built from kernels.
LAYERS = ("kernels", "loops")


def layer_of(contract_id: str) -> str:
    return "kernels" if re.search(r"-kernel-v\d+$", contract_id) else "loops"


def isolated(g: Graph) -> list[str]:
    """Contracts that depend on no other and that no other depends on, sorted."""
    users = g.dependents
    return sorted(n for n in g.deps if not g.deps[n] and not users[n])


def overview(contracts) -> str:
    """The docs index's diagram of every dependency: a `graph LR` (dependencies left of their
    users) with one box per layer, kernels then loops. Contracts without any dependency edge
    are left out (`isolated`; the page lists them): drawn top-down, thirty-odd contracts sit in
    one rank that the page shrinks to 4 px labels, while left to right the widest rank is a
    column and the diagram is only as wide as its dependency depth."""
    g = contracts if isinstance(contracts, Graph) else build(contracts)
    alone = set(isolated(g))
    nodes = [n for n in g.order if n not in alone]
    ids = _mermaid_ids(nodes)
    lines = ["graph LR"]
    for layer in LAYERS:
        mine = [n for n in nodes if layer_of(n) == layer]
        if mine:
            lines.append(f"  subgraph {layer}[{_mermaid_label(layer)}]")
            lines += [f"    {ids[n]}[{_mermaid_label(n)}]" for n in mine]
            lines.append("  end")
    for n in nodes:
        for d in g.deps[n]:
            lines.append(f"  {ids[d]} --> {ids[n]}")
    return "\n".join(lines) + "\n"


def _shape(g: Graph, nodes: list[str]) -> tuple[int, int]:
    """(ranks, contracts in the widest rank) of the diagram of `nodes` (in `g.order`)."""
    keep, depth = set(nodes), {}
    for n in nodes:
        depth[n] = 1 + max((depth[d] for d in g.deps[n] if d in keep and d in depth),
                           default=-1)
    per = [list(depth.values()).count(r) for r in set(depth.values())]
    return len(per), max(per, default=0)


def _reach(edges: dict[str, list[str]], start: str) -> set[str]:
    seen, todo = {start}, [start]
    while todo:
        for m in edges[todo.pop()]:
            if m not in seen:
                seen.add(m)
                todo.append(m)
    return seen


def _dot_id(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def dot(g: Graph) -> str:
    on_cycle = {(c[i], c[i + 1]) for c in g.cycles for i in range(len(c) - 1)}
    lines = ["digraph contracts {", "  rankdir=LR;", "  node [shape=box];"]
    lines += [f"  {_dot_id(n)};" for n in g.order]
    for n in g.order:
        for d in g.deps[n]:
            attr = " [color=red]" if (n, d) in on_cycle else ""
            lines.append(f"  {_dot_id(d)} -> {_dot_id(n)}{attr};")
    for n, _, d in g.missing:
        lines.append(f"  // error: {n} depends on {d}, which is not a known contract")
    lines.append("}")
    return "\n".join(lines) + "\n"


def text(g: Graph) -> str:
    n_edges = sum(len(v) for v in g.deps.values())
    lines = [f"{len(g.deps)} contract(s), {n_edges} dependency edge(s)",
             "Topological order (dependencies first):"]
    width = len(str(len(g.order)))
    blocked = set(g.blocked)
    for i, n in enumerate(g.order, 1):
        ds = g.deps[n]
        lines.append(f"  {i:>{width}}. {n}" + (f"  <- {', '.join(ds)}" if ds else "")
                     + ("  [no order: on or behind a cycle]" if n in blocked else ""))
    return "\n".join(lines)


def as_dict(g: Graph) -> dict:
    return {
        "nodes": g.order,
        "edges": [{"contract": n, "depends_on": d} for n in g.order for d in g.deps[n]],
        "order": [n for n in g.order if n not in g.blocked],
        "blocked": g.blocked,
        "cycles": g.cycles,
        "missing": [{"contract": n, "index": i, "depends_on": d} for n, i, d in g.missing],
    }


def as_json(g: Graph) -> str:
    return json.dumps(as_dict(g), indent=2)
