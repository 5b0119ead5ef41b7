"""Every third-party package the shipped code imports is declared in pyproject.toml's
``[project] dependencies`` (issue 26, item 8: ``straggler.py`` imported scipy, which arrived only
as scikit-learn's dependency; a resolver may drop or change such a package under us).

The imports are read from the AST of every module of the wheel's packages (function-level
imports included), standard-library and first-party names left out; each top-level name is
mapped to the distributions that provide it (``importlib.metadata.packages_distributions``) and
one of them must be a direct dependency.
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import re
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = (
    "core/pharos_core",
    "pipeline/pharos_pipeline",
    "analytics/pharos_analytics",
    "api/pharos_api",
    "agents/pharos_agents",
)
GENERATED = ("pipeline/pharos_pipeline/wire/pharos",)


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared() -> set[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return {_norm(re.split(r"[<>=!~;\[ ]", d, maxsplit=1)[0]) for d in project["dependencies"]}


def imported_top_names() -> dict[str, list[str]]:
    """Top-level module name -> the files importing it (third-party names only)."""
    out: dict[str, list[str]] = {}
    for pkg in PACKAGES:
        for f in sorted((REPO / pkg).rglob("*.py")):
            rel = f.relative_to(REPO).as_posix()
            if any(rel.startswith(g) for g in GENERATED):
                continue
            for node in ast.walk(ast.parse(f.read_text(), rel)):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                for n in names:
                    top = n.split(".")[0]
                    if top in sys.stdlib_module_names or top.startswith("pharos_") or top == "__future__":
                        continue
                    out.setdefault(top, []).append(rel)
    return out


def test_every_imported_package_is_a_declared_dependency():
    deps = declared()
    providers = md.packages_distributions()
    undeclared = {}
    for top, files in sorted(imported_top_names().items()):
        dists = {_norm(d) for d in providers.get(top, [])}
        if not dists & deps:
            undeclared[top] = (sorted(dists) or ["(not installed)"], sorted(set(files))[:3])
    assert not undeclared, "imported but not declared in [project] dependencies: " + "; ".join(
        f"{top} (from {', '.join(d)}; in {', '.join(f)})" for top, (d, f) in undeclared.items()
    )


def test_the_check_sees_imports():
    names = imported_top_names()
    assert "fastapi" in names and "sklearn" in names  # a scan that finds nothing would pass vacuously
