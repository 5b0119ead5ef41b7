from __future__ import annotations

import pytest

from pharos_analytics.pattern import (
    PATTERNS,
    SYSTEM_PREFIXES,
    classify_fan_in,
    classify_pattern,
    is_system_path,
)


@pytest.mark.parametrize(
    "pairs, expected",
    [
        ([], "none"),
        ([(0, "/d/out")], "1-1"),
        ([(0, "/d/out")] * 5, "1-1"),  # duplicates are one pair
        ([(-1, "/d/out")], "1-1"),  # the unknown rank is one rank
        ([(0, "/d/a"), (0, "/d/b")], "1-N"),
        ([(r, "/d/shared") for r in range(8)], "N-1"),
        ([(r, f"/d/out.{r}") for r in range(8)], "N-N"),
        ([(r, f"/d/out.{r}.{k}") for r in range(4) for k in range(3)], "N-N"),  # several files each
        ([(0, "/d/a"), (1, "/d/b")], "N-N"),
        ([(r, f"/d/f{r // 4}") for r in range(16)], "N-M"),  # 16 ranks on 4 files
        ([(0, "/d/a"), (1, "/d/a"), (1, "/d/b")], "N-M"),  # one shared, M == R
        ([(r, f"/d/out.{r}") for r in range(4)] + [(r, "/d/in") for r in range(4)], "N-M"),
        ([(0, "/d/a"), (0, "/d/b"), (1, "/d/b"), (1, "/d/c"), (2, "/d/c")], "N-M"),  # M == R, chained
        ([((5, "cn01"), (1, 2)), ((6, "cn02"), (1, 2))], "N-1"),  # any hashable ids
    ],
)
def test_classify_pattern(pairs, expected):
    assert classify_pattern(pairs) == expected
    assert expected in PATTERNS


def test_classify_pattern_accepts_an_iterator():
    assert classify_pattern((r, "/d/x") for r in range(3)) == "N-1"


@pytest.mark.parametrize(
    "r, m, fan, expected",
    [
        (0, 0, 0, "none"),
        (3, 0, 0, "none"),
        (0, 3, 0, "none"),
        (1, 1, 1, "1-1"),
        (1, 9, 1, "1-N"),
        (9, 1, 9, "N-1"),
        (9, 9, 1, "N-N"),
        (9, 3, 3, "N-M"),
        (2, 5, 2, "N-M"),
    ],
)
def test_classify_fan_in(r, m, fan, expected):
    assert classify_fan_in(r, m, fan) == expected


@pytest.mark.parametrize("args", [(-1, 1, 1), (1, -1, 1), (2, 2, 3)])
def test_classify_fan_in_rejects_impossible_statistics(args):
    with pytest.raises(ValueError):
        classify_fan_in(*args)


@pytest.mark.parametrize(
    "path, system",
    [
        ("/usr/lib/libc.so.6", True),
        ("/usr", True),
        ("/lib64/ld-linux-x86-64.so.2", True),
        ("/etc/passwd", True),
        ("/proc/self/maps", True),
        ("/sys/fs/cgroup", True),
        ("/dev/null", True),
        ("/bin/sh", True),
        ("/sbin/init", True),
        ("/run/lock", True),
        ("/var/lib/dpkg/status", True),
        ("/usrdata/x", False),
        ("/library/x", False),
        ("/var/tmp/x", False),
        ("/var/library", False),
        ("/scratch/out", False),
        ("/home/u/etc/x", False),
        ("", False),
        ("relative/usr", False),
    ],
)
def test_is_system_path(path, system):
    assert is_system_path(path) is system


def test_system_prefixes_cover_the_documented_folders():
    assert set(SYSTEM_PREFIXES) == {
        "/usr",
        "/lib",
        "/lib64",
        "/etc",
        "/proc",
        "/sys",
        "/dev",
        "/bin",
        "/sbin",
        "/run",
        "/var/lib",
        "/var/spool",
    }
