"""Test files are collected by basename (rootdir-relative imports, no packages): two files with
one name in different folders stop the whole run at collection. Keep basenames unique."""

from __future__ import annotations

from collections import Counter
from pathlib import Path


def test_test_file_basenames_are_unique():
    names = Counter(p.name for p in Path(__file__).parent.rglob("test_*.py"))
    assert not [n for n, k in names.items() if k > 1], sorted(n for n, k in names.items() if k > 1)
