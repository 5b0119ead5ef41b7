"""Test files and their helper modules are imported by basename (rootdir-relative imports, no
packages): two files with one name in different folders stop the whole run at collection (or
shadow each other). Keep basenames unique; conftest.py is pytest's own and may repeat."""

from __future__ import annotations

from collections import Counter
from pathlib import Path


def test_test_file_basenames_are_unique():
    names = Counter(
        p.name for p in Path(__file__).parent.rglob("*.py") if p.name != "conftest.py" and "__pycache__" not in p.parts
    )
    assert not [n for n, k in names.items() if k > 1], sorted(n for n, k in names.items() if k > 1)
