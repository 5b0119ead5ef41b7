from __future__ import annotations

import pytest

from pharos_analytics.pattern import (
    PATTERNS,
    SYSTEM_PREFIXES,
    DirectionFanIn,
    classify_fan_in,
    classify_pattern,
    direction_pattern,
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


KiB, MiB = 1 << 10, 1 << 20


@pytest.mark.parametrize(
    "files, expected",
    [
        ([], ("none", "none")),
        # 4 ranks on one shared file + rank 0's 4 KiB results file: N-1 by volume, N-M by fan-in
        ([({0, 1, 2, 3}, 16 * MiB), ({0}, 4 * KiB)], ("N-1", "N-M")),
        # ... and a shared log every rank appends to: still one dominant shared file
        ([({0, 1, 2, 3}, 16 * MiB), ({0, 1, 2, 3}, 320), ({0}, 4 * KiB)], ("N-1", "N-M")),
        # N-N with rank 0's side file
        ([({r}, MiB) for r in range(4)] + [({0}, KiB)], ("N-N", "N-N")),
        # subfiling: two shared files of comparable volume -> N-M, whatever the side file
        ([({0, 1}, 8 * MiB), ({2, 3}, 6 * MiB), ({0}, KiB)], ("N-M", "N-M")),
        # the side file carries the volume: it is the pattern
        ([({0, 1, 2, 3}, KiB), ({0}, 64 * MiB)], ("1-1", "N-M")),
        # two groups of equal volume: no mode dominates -> fan-in
        ([({0, 1, 2, 3}, MiB)] + [({r}, MiB // 4) for r in range(4)], ("N-M", "N-M")),
        # no bytes at all (e.g. reads at EOF): the fan-in
        ([({0, 1}, 0), ({0}, 0)], ("N-M", "N-M")),
        ([({0}, 10), ({0}, 10)], ("1-N", "1-N")),
        ([(set(), 10)], ("none", "none")),  # a file without ranks is ignored
    ],
)
def test_direction_pattern_by_volume(files, expected):
    assert direction_pattern(DirectionFanIn.of_files(files)) == expected


def test_direction_fan_in_groups():
    s = DirectionFanIn.of_files([({0, 1, 2, 3}, 100), ({0, 1}, 50), ({0}, 7), ({5}, 3)])
    assert (s.n_ranks, s.n_files, s.max_fan_in) == (5, 4, 4)
    assert (s.shared_files, s.shared_ranks, s.shared_bytes, s.top_shared_bytes) == (2, 4, 150, 100)
    assert (s.private_files, s.private_ranks, s.private_bytes) == (2, 2, 10)
    with pytest.raises(ValueError):
        direction_pattern(DirectionFanIn(n_ranks=1, n_files=1, max_fan_in=1, private_files=1, private_bytes=-1))
