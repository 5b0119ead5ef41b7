"""The repository's shape, checked: no source module over ``MAX_MODULE_LINES`` lines, no
first-party import cycle (Python modules, Rust modules of a crate), and the tests' own layout
(helper modules with unique basenames, test packages that shadow no library).

Module sizes: ``*.py`` under core/ pipeline/ analytics/ api/ agents/ dashboards/ bench/ (the whole
file), ``*.rs``, ``*.c`` and ``*.h`` under forwarder/ agents/ proto/ (a ``.rs`` file up to its
first ``#[cfg(test)]`` inline module). Not counted: tests (tests/, a crate's tests/ folder, a Rust
module declared ``#[cfg(test)] mod x;``), generated code (pipeline/pharos_pipeline/wire/pharos,
protoc's; vmlinux.h, bpftool's; the dashboards' JSON is not Python), build outputs (target/,
node_modules/).

Import cycles: Python, every ``import`` / ``from ... import`` in the AST of every module of the
first-party packages (function-level imports and ``if TYPE_CHECKING:`` imports included: a cycle
held by a deferred import is still a cycle); an edge goes to the module named, or to the package
(its ``__init__``) when the name imported is not a submodule. Rust, per crate, module = file: the
``crate::`` / ``super::`` / ``self::`` paths of a file's non-test code (``use`` items and paths in
code, comments removed), each resolved to the deepest file module it names; a parent's plain
``child::`` paths (its ``mod child;`` facade and re-exports) are not edges, a child's ``super::``
paths are. A failure names each cycle with the lines that make its edges.
"""

from __future__ import annotations

import ast
import itertools
import re
from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent

#: No source module over this many lines (docs/architecture.md: "one idea in one obvious place").
MAX_MODULE_LINES = 600

PY_DIRS = ("core", "pipeline", "analytics", "api", "agents", "dashboards", "bench")
NATIVE_DIRS = ("forwarder", "agents", "proto")
GENERATED = (REPO / "pipeline/pharos_pipeline/wire/pharos", REPO / "agents/ebpf/src/bpf/vmlinux.h")
SKIP_PARTS = {"target", "node_modules", "__pycache__", ".venv", "build", "tests", "benches", "examples"}
#: First-party import name -> its folder.
PY_PACKAGES = {
    "pharos_core": REPO / "core/pharos_core",
    "pharos_pipeline": REPO / "pipeline/pharos_pipeline",
    "pharos_analytics": REPO / "analytics/pharos_analytics",
    "pharos_api": REPO / "api/pharos_api",
    "pharos_agents": REPO / "agents/pharos_agents",
    "pharos_dashboards": REPO / "dashboards/pharos_dashboards",
}

_CFG_TEST = re.compile(r"^\s*#\[cfg\((?:all\()?test\b")
_MOD_DECL = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*([;{])")


def _rel(p: Path) -> str:
    return p.relative_to(REPO).as_posix()


def _sources(dirs: tuple[str, ...], suffixes: tuple[str, ...]) -> list[Path]:
    out = []
    for d in dirs:
        for p in sorted((REPO / d).rglob("*")):
            rel_parts = p.relative_to(REPO).parts
            if p.suffix not in suffixes or not p.is_file() or SKIP_PARTS.intersection(rel_parts):
                continue
            if any(p.is_relative_to(g) for g in GENERATED):
                continue
            out.append(p)
    return out


# --- Rust: module trees, test-only modules, non-test text ---------------------------------------


def _rust_decls(lines: list[str]) -> list[tuple[str, str, bool]]:
    """(name, ';' or '{', declared under #[cfg(test)]) of each ``mod`` item of a file."""
    out, under_test = [], False
    for line in lines:
        if _CFG_TEST.match(line):
            under_test = True
            continue
        m = _MOD_DECL.match(line)
        if m:
            out.append((m.group(1), m.group(2), under_test))
        if line.strip() and not line.strip().startswith(("#[", "//")):
            under_test = False
    return out


def _non_test_lines(lines: list[str]) -> list[str]:
    """A .rs file's lines up to its first ``#[cfg(test)]`` inline module (``mod x {``)."""
    for i, line in enumerate(lines):
        if _CFG_TEST.match(line):
            for nxt in lines[i + 1 :]:
                if nxt.strip().startswith(("#[", "//")) or not nxt.strip():
                    continue
                m = _MOD_DECL.match(nxt)
                if m and m.group(2) == "{":
                    return lines[:i]
                break
    return lines


def _child_file(parent: Path, name: str) -> Path | None:
    base = parent.parent if parent.name in ("lib.rs", "main.rs", "mod.rs") else parent.with_suffix("")
    for cand in (base / f"{name}.rs", base / name / "mod.rs"):
        if cand.exists():
            return cand
    return None


def _rust_crates() -> list[tuple[Path, dict[tuple[str, ...], Path]]]:
    """(crate root file, module path -> file) of every crate root (src/lib.rs, src/main.rs,
    src/bin/*.rs) under NATIVE_DIRS, non-test modules only."""
    roots = []
    for d in NATIVE_DIRS:
        for cargo in sorted((REPO / d).rglob("Cargo.toml")):
            if SKIP_PARTS.intersection(cargo.relative_to(REPO).parts):
                continue
            src = cargo.parent / "src"
            roots += [p for p in (src / "lib.rs", src / "main.rs") if p.exists()]
            roots += sorted((src / "bin").glob("*.rs")) if (src / "bin").is_dir() else []
    crates = []
    for root in roots:
        tree: dict[tuple[str, ...], Path] = {(): root}
        todo = [((), root)]
        while todo:
            path, f = todo.pop()
            for name, kind, test in _rust_decls(f.read_text().splitlines()):
                if kind == ";" and not test and (child := _child_file(f, name)):
                    tree[(*path, name)] = child
                    todo.append(((*path, name), child))
        crates.append((root, tree))
    return crates


def _rust_test_files() -> set[Path]:
    """Files of modules declared ``#[cfg(test)] mod x;`` (and everything below them)."""
    out: set[Path] = set()
    for f in _sources(NATIVE_DIRS, (".rs",)):
        for name, kind, test in _rust_decls(f.read_text().splitlines()):
            if kind == ";" and test and (child := _child_file(f, name)):
                out.add(child)
                sub = child.parent if child.name == "mod.rs" else child.with_suffix("")
                out.update(sub.rglob("*.rs") if sub.is_dir() else ())
    return out


# --- (a) module sizes ---------------------------------------------------------------------------


def module_sizes() -> dict[str, int]:
    """Counted lines of every source module (see the module docstring)."""
    sizes = {}
    for p in _sources(PY_DIRS, (".py",)):
        sizes[_rel(p)] = len(p.read_text().splitlines())
    test_only = _rust_test_files()
    for p in _sources(NATIVE_DIRS, (".rs", ".c", ".h")):
        if p in test_only:
            continue
        lines = p.read_text().splitlines()
        sizes[_rel(p)] = len(_non_test_lines(lines) if p.suffix == ".rs" else lines)
    return sizes


def test_no_source_module_over_the_size_limit():
    sizes = module_sizes()
    assert len(sizes) > 100, f"too few source modules found ({len(sizes)}): is the layout as this test expects?"
    over = sorted(((n, f) for f, n in sizes.items() if n > MAX_MODULE_LINES), reverse=True)
    assert not over, (
        f"{len(over)} module(s) over {MAX_MODULE_LINES} lines (split along the lines their contents draw):\n"
        + ("\n".join(f"  {n:5d}  {f}" for n, f in over))
    )


# --- (b) import cycles --------------------------------------------------------------------------

Edges = dict[str, dict[str, str]]  # module -> {imported module: "file:line" of the first import}


def _py_modules() -> dict[str, Path]:
    mods = {}
    for pkg, folder in PY_PACKAGES.items():
        for p in sorted(folder.rglob("*.py")):
            if "__pycache__" in p.parts:
                continue
            parts = [pkg, *p.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            mods[".".join(parts)] = p
    return mods


def python_import_edges() -> Edges:
    mods = _py_modules()

    def known(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    edges: Edges = {m: {} for m in mods}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str | None] = []
            if isinstance(node, ast.Import):
                targets = [known(a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package
                    for _ in range(node.level - 1):
                        base = base.rpartition(".")[0]
                    base = f"{base}.{node.module}" if node.module else base
                else:
                    base = node.module or ""
                for a in node.names:
                    full = f"{base}.{a.name}"
                    targets.append(full if full in mods else known(base))
            for t in targets:
                if t and t != mod:
                    edges[mod].setdefault(t, f"{_rel(path)}:{node.lineno}")
    return edges


_USE = re.compile(r"\buse\s+([^;]+);", re.S)
_PATH = re.compile(r"\b(?:crate|super|self)(?:\s*::\s*\w+)+")


def _expand_use(tree: str) -> list[str]:
    """``a::{b, c::{d, e}}`` -> ``a::b``, ``a::c::d``, ``a::c::e`` (``as`` renames dropped)."""
    tree = re.sub(r"\s+", "", re.sub(r"\bas\b\s*\w+", "", tree))
    if "{" not in tree:
        return [tree]
    i = tree.index("{")
    prefix, body = tree[:i], tree[i + 1 : tree.rindex("}")]
    parts, depth, cur = [], 0, ""
    for ch in body:
        depth += ch == "{"
        depth -= ch == "}"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [x for p in parts if p for x in _expand_use(prefix + p)]


def _strip_rust_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def rust_import_edges() -> Edges:
    """Per crate, module (file) -> modules (files) its non-test code names; keys are
    ``crate-folder::module::path`` (``crate`` for the root)."""
    edges: Edges = {}
    for root, tree in _rust_crates():
        crate = _rel(root.parent.parent)
        name = {p: f"{crate}({root.stem})::" + ("::".join(p) or "crate") for p in tree}
        for path, f in tree.items():
            lines = _non_test_lines(f.read_text().splitlines())
            text = _strip_rust_comments("\n".join(lines))
            found: list[tuple[str, int]] = []
            for m in _USE.finditer(text):
                line = text.count("\n", 0, m.start()) + 1
                found += [(p, line) for p in _expand_use(m.group(1))]
            rest = _USE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
            found += [(m.group(0), rest.count("\n", 0, m.start()) + 1) for m in _PATH.finditer(rest)]
            out = edges.setdefault(name[path], {})
            for p, line in found:
                segs = [s for s in re.sub(r"\s+", "", p).split("::") if s]
                if not segs or segs[0] not in ("crate", "super", "self"):
                    continue
                cur: tuple[str, ...] = () if segs[0] == "crate" else path
                i = 1 if segs[0] == "crate" else 0
                while i < len(segs) and segs[i] in ("super", "self"):
                    cur = cur[:-1] if segs[i] == "super" else cur
                    i += 1
                for s in segs[i:]:
                    if (*cur, s) not in tree:
                        break
                    cur = (*cur, s)
                if cur != path and cur in tree:
                    out.setdefault(name[cur], f"{_rel(f)}:{line}")
    return edges


def find_cycles(edges: Edges) -> list[list[str]]:
    """One cycle (``[a, b, ..., a]``) per strongly connected component of more than one module
    (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    comps: list[list[str]] = []

    def strong(v: str) -> None:  # iterative Tarjan (deep graphs would hit the recursion limit)
        work = [(v, iter(sorted(edges.get(v, ()))))]
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        while work:
            node, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                    break
                if w in on:
                    low[node] = min(low[node], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == node:
                            break
                    if len(comp) > 1:
                        comps.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            strong(v)
    cycles = []
    for comp in comps:  # a shortest cycle through the component's first module (BFS)
        members, start = set(comp), comp[0]
        prev: dict[str, str] = {}
        frontier, seen, found = [start], {start}, None
        while frontier and not found:
            nxt = []
            for u in frontier:
                for w in sorted(edges.get(u, ())):
                    if w == start:
                        found = u
                        break
                    if w in members and w not in seen:
                        seen.add(w)
                        prev[w] = u
                        nxt.append(w)
                if found:
                    break
            frontier = nxt
        path = [found]
        while path[-1] != start:
            path.append(prev[path[-1]])
        cycles.append([*reversed(path), start])
    return sorted(cycles)


def _cycle_report(kind: str, edges: Edges, cycles: list[list[str]]) -> str:
    out = [f"{len(cycles)} {kind} import cycle(s):"]
    for c in cycles:
        out.append("  " + " -> ".join(c))
        out += [f"      {a} -> {b}  ({edges[a][b]})" for a, b in itertools.pairwise(c)]
    return "\n".join(out)


def test_no_python_import_cycle():
    edges = python_import_edges()
    assert len(edges) > 50, f"too few first-party modules found ({len(edges)})"
    cycles = find_cycles(edges)
    assert not cycles, _cycle_report("Python", edges, cycles)


def test_no_rust_module_cycle():
    edges = rust_import_edges()
    assert len(edges) > 20, f"too few Rust modules found ({len(edges)})"
    cycles = find_cycles(edges)
    assert not cycles, _cycle_report("Rust (module = file)", edges, cycles)


def test_find_cycles_names_the_cycle():
    """The checker itself: a known cycle is found and named, an acyclic graph passes."""
    assert find_cycles({"a": {"b": "x:1"}, "b": {"c": "x:2"}, "c": {"a": "x:3"}, "d": {"a": "x:4"}}) == [
        ["a", "b", "c", "a"]
    ]
    assert find_cycles({"a": {"b": ""}, "b": {"c": ""}, "c": {}}) == []
    assert _expand_use("crate::{a::X, b::{c, d as e}}") == ["crate::a::X", "crate::b::c", "crate::b::d"]


# --- helper basenames ---------------------------------------------------------------------------


def test_helper_module_basenames_are_unique():
    """Tests are packages, so test files may share a basename; their helper modules are imported
    by bare name from the folders on pyproject's pythonpath, so two helpers with one name would
    shadow each other."""
    names = Counter(
        p.name
        for p in TESTS.rglob("*.py")
        if p.name not in ("conftest.py", "__init__.py")
        and not p.name.startswith("test_")
        and "__pycache__" not in p.parts
        and "data" not in p.relative_to(TESTS).parts
    )
    assert not [n for n, k in names.items() if k > 1], sorted(n for n, k in names.items() if k > 1)


def test_test_packages_shadow_no_library():
    """tests/<folder> are packages; a library of the same name (tests/darshan: the darshan
    library) must still be the one imported, so tests/ is appended to sys.path, not prepended
    (tests/conftest.py)."""
    import importlib.machinery
    import importlib.util
    import sys

    others = [p for p in sys.path if Path(p or ".").resolve() != TESTS]
    for folder in sorted(p.parent for p in TESTS.glob("*/__init__.py")):
        library = importlib.machinery.PathFinder.find_spec(folder.name, others)
        if library is None or library.origin is None:  # no library (or a namespace folder) of that name
            continue
        spec = importlib.util.find_spec(folder.name)
        assert spec and spec.origin == library.origin, (
            f"`import {folder.name}` imports {spec and spec.origin}, not the library {library.origin}"
        )
