#!/usr/bin/env python3
"""Checks the include graph of include/kvstore against docs/DESIGN.md's "may include" rules.

Every header belongs to a box (its folder; the top-level headers are "base", "options" or "api").
A header may include headers of its own box and of the boxes listed for it below; anything else
is printed as "box: file includes other". Two more checks, each printed as a chain:
- no header includes itself through others ("cycle: a.hpp -> b.hpp -> a.hpp"): the files'
  include graph has no cycle, inside a box or across boxes;
- the table itself has no cycle between boxes ("may include cycle: reduce -> device -> reduce"):
  the boxes stay layered, whatever the headers do today. "api" (may include anything) is the top
  and is left out; the files' check covers it.
Any of these makes the script exit 1. Keep this table and the "Folders" section of
docs/DESIGN.md saying the same thing.

usage: check_layers.py [ROOT]   ROOT: the headers' folder (default: include/kvstore next to this
script), or a folder holding kvstore/ (a scratch copy of include/).
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent / "include" / "kvstore"

BASE = {"error.hpp", "key.hpp", "op.hpp", "fwd.hpp", "node.hpp"}
OPTIONS = {"options.hpp", "impl/options_env.hpp"}

# box -> boxes it may include (its own box always allowed). "api" may include anything.
MAY_INCLUDE = {
    "base": set(),
    "detail": {"base"},
    "engine": {"base", "detail/block_pool.hpp", "detail/prefetch.hpp"},
    "optim": {"base", "detail"},
    "reduce": {"base", "detail", "optim"},
    "local": {"base", "detail", "engine", "optim", "options", "reduce"},
    "device": {"base", "detail", "engine", "reduce", "optim", "options", "client/worker_store.hpp"},
    "wire": {"base", "detail", "optim/slots.hpp"},
    "transport": {"base", "detail", "wire/frame.hpp"},
    "options": {"base", "detail", "transport/security.hpp"},
    "client": {"base", "detail", "optim", "options", "wire", "transport", "engine", "reduce"},
    "server": {"base", "detail", "optim", "options", "wire", "transport"},
    "rendezvous": {"base", "detail", "options", "wire", "transport"},
    "decl": {"base", "detail", "options", "optim", "device/span.hpp"},
    "roles": {"base", "detail", "options", "server", "rendezvous", "decl",
              "client/colocated_roles.hpp"},
    "compat": {"base", "detail", "api", "options", "engine", "optim", "device"},
}

INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]kvstore/([^>"]+)[>"]', re.M)


def box_of(rel: str) -> str:
    if rel in BASE:
        return "base"
    if rel in OPTIONS:
        return "options"
    if "/" not in rel or rel.startswith("impl/"):
        return "api"  # the public headers and the bodies they include (impl/)
    return rel.split("/", 1)[0]


def allowed(src_box: str, dst: str) -> bool:
    dst_box = box_of(dst)
    if src_box == "api" or dst_box == src_box:
        return True
    rules = MAY_INCLUDE.get(src_box, set())
    return dst_box in rules or dst in rules


def find_cycles(graph: dict) -> list:
    """One cycle (a list of nodes, first == last) per strongly connected component that has one:
    the shortest through the component's least node. Deterministic: nodes are visited sorted."""
    index, low, on_stack, stack, comps = {}, {}, set(), [], []
    for root in sorted(graph):
        if root in index:
            continue
        # Tarjan's algorithm, iterative: (node, its successors not yet looked at).
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        work = [(root, iter(sorted(graph.get(root, ()))))]
        while work:
            node, succ = work[-1]
            for nxt in succ:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = set()
                    while True:
                        n = stack.pop()
                        on_stack.discard(n)
                        comp.add(n)
                        if n == node:
                            break
                    if len(comp) > 1 or node in graph.get(node, ()):
                        comps.append(comp)
    cycles = []
    for comp in comps:
        start = min(comp)
        # Breadth-first inside the component, back to start.
        parent, frontier, end = {start: None}, [start], None
        while frontier and end is None:
            nxt_frontier = []
            for n in frontier:
                for m in sorted(graph.get(n, ())):
                    if m == start:
                        end = n
                        break
                    if m in comp and m not in parent:
                        parent[m] = n
                        nxt_frontier.append(m)
                if end is not None:
                    break
            frontier = nxt_frontier
        chain = [start]  # walked back from start's predecessor: start, end, ..., start
        n = end
        while n is not None:
            chain.append(n)
            n = parent[n]
        cycles.append(chain[::-1])
    return sorted(cycles)


def box_graph(table: dict) -> dict:
    """The table as box -> boxes (a file named in a rule stands for its box); "api" left out."""
    graph = {}
    for box, rules in table.items():
        graph[box] = {box_of(r) if r.endswith(".hpp") else r for r in rules} - {box, "api"}
    return graph


def main(argv: list) -> int:
    root = pathlib.Path(argv[1]) if len(argv) > 1 else ROOT
    if (root / "kvstore").is_dir():
        root = root / "kvstore"
    if not root.is_dir():
        print(f"check_layers: {root} is not a folder", file=sys.stderr)
        return 2
    bad, files = [], {}
    for path in sorted(root.rglob("*.hpp")):
        rel = path.relative_to(root).as_posix()
        src_box = box_of(rel)
        files[rel] = set()
        for dst in INCLUDE.findall(path.read_text()):
            files[rel].add(dst)
            if not allowed(src_box, dst):
                bad.append(f"{src_box}: {rel} includes {dst}")
    file_cycles = find_cycles(files)
    box_cycles = find_cycles(box_graph(MAY_INCLUDE))
    for line in bad:
        print(line)
    for c in file_cycles:
        print("cycle: " + " -> ".join(c))
    for c in box_cycles:
        print("may include cycle: " + " -> ".join(c))
    if bad:
        print(f"check_layers: {len(bad)} include(s) against docs/DESIGN.md's rules", file=sys.stderr)
    if file_cycles:
        print(f"check_layers: {len(file_cycles)} include cycle(s) between headers", file=sys.stderr)
    if box_cycles:
        print(f"check_layers: {len(box_cycles)} cycle(s) between boxes in MAY_INCLUDE",
              file=sys.stderr)
    if bad or file_cycles or box_cycles:
        return 1
    print("check_layers: the include graph follows docs/DESIGN.md")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
