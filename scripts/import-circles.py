#!/usr/bin/env python3
"""Import circles between sibling modules of src/ (house rule: no import circles).

For every module, its child modules are the nodes; A -> B when any file of A's
subtree names an item of B's subtree (`use crate::...`, `use super::...`, or an
inline `crate::`/`super::` path), re-exports followed to the module that defines
the item. A parent naming its children, or a child its ancestors, is no edge
(that is Rust's layout, not a circle). Test modules (`#[cfg(test)] mod tests`)
are left out. Prints each circle and the count; exits 1 when there is one.

Usage: scripts/import-circles.py [SRC_DIR]
"""

import re
import sys
from pathlib import Path

SRC = Path(sys.argv[1] if len(sys.argv) > 1 else "src")


def module_of(path: Path) -> tuple:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts in (["lib"], ["main"]):
        return ()
    return tuple(parts)


def code_of(text: str) -> str:
    """The text without comments, strings' content, and the trailing test module."""
    cut = re.search(r"#\[cfg\(test\)\]\s*(pub(\(crate\))?\s+)?mod tests", text)
    if cut:
        text = text[: cut.start()]
    text = re.sub(r"//[^\n]*", "", text)
    return re.sub(r'"(\\.|[^"\\])*"', '""', text)


def expand(tree: str) -> list:
    """`a::{b, c::{d, e}}` -> ['a::b', 'a::c::d', 'a::c::e'] (`self` kept as the prefix)."""
    tree = re.sub(r"\s+", "", tree)
    brace = tree.find("{")
    if brace < 0:
        return [re.sub(r"\bas\w+$", "", tree)]
    prefix, inner = tree[:brace], tree[brace + 1 : tree.rfind("}")]
    items, depth, start = [], 0, 0
    for i, ch in enumerate(inner + ","):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        elif ch == "," and depth == 0:
            if inner[start:i]:
                items.append(inner[start:i])
            start = i + 1
    out = []
    for item in items:
        for path in expand(item):
            out.append(prefix.rstrip(":") if path == "self" else prefix + path)
    return out


def resolve(module: tuple, path: str, modules: set):
    """The (module, rest) that `path`, written in `module`, names; None if outside the crate."""
    segs = [s for s in path.split("::") if s]
    if not segs:
        return None
    if segs[0] == "crate":
        base, segs = (), segs[1:]
    elif segs[0] in ("super", "self"):
        base = module
        while segs and segs[0] in ("super", "self"):
            if segs[0] == "super":
                base = base[:-1]
            segs = segs[1:]
    elif module + (segs[0],) in modules:  # a child named without self::
        base = module
    else:
        return None
    target = base
    while segs and target + (segs[0],) in modules:
        target, segs = target + (segs[0],), segs[1:]
    return target, segs


def main() -> int:
    files = {module_of(p): p for p in SRC.rglob("*.rs")}
    modules = set(files)
    code = {m: code_of(p.read_text()) for m, p in files.items()}
    uses = {}
    reexports = {}  # (module, name) -> (module, rest)
    for m, text in code.items():
        paths = []
        for vis, tree in re.findall(r"(pub(?:\([^)]*\))?\s+)?use\s+([^;]+);", text):
            for path in expand(tree):
                paths.append(path)
                hit = resolve(m, path, modules)
                if vis and hit and hit[1]:
                    reexports[(m, hit[1][-1])] = hit
        paths += re.findall(r"\b(?:crate|super)(?:::\w+)+", text)
        uses[m] = paths

    def target(hit):
        seen = 0
        while hit and hit[1] and (hit[0], hit[1][0]) in reexports and seen < 20:
            hit, seen = reexports[(hit[0], hit[1][0])], seen + 1
        return hit[0] if hit else None

    edges = {}
    for m, paths in uses.items():
        for path in paths:
            t = target(resolve(m, path, modules))
            if t is None:
                continue
            common = 0
            while common < min(len(m), len(t)) and m[common] == t[common]:
                common += 1
            if common == len(m) or common == len(t):
                continue  # an ancestor or a descendant
            parent = m[:common]
            edges.setdefault(parent, {}).setdefault(m[common], set()).add(t[common])

    circles = []
    for parent, graph in sorted(edges.items()):
        index, low, stack, on, counter = {}, {}, [], set(), [0]

        def visit(v):
            index[v] = low[v] = counter[0]
            counter[0] += 1
            stack.append(v)
            on.add(v)
            for w in graph.get(v, ()):
                if w not in index:
                    visit(w)
                    low[v] = min(low[v], low[w])
                elif w in on:
                    low[v] = min(low[v], index[w])
            if low[v] == index[v]:
                scc = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    scc.append(w)
                    if w == v:
                        break
                if len(scc) > 1:
                    circles.append((parent, sorted(scc)))

        for v in sorted(graph):
            if v not in index:
                visit(v)
    for parent, scc in circles:
        where = "::".join(parent) or "crate"
        print(f"circle in {where}: {' <-> '.join(scc)}")
    print(f"import circles: {len(circles)}")
    return 1 if circles else 0


if __name__ == "__main__":
    sys.exit(main())
