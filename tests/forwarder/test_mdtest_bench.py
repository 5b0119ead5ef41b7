"""bench/mdtest.py's pure parts: the phases read from mdtest's SUMMARY rate table (the format of
mdtest 4.x, IOR's), its --help, and its refusal without a runnable --mdtest. The bench itself
(root, FUSE, an mdtest build) runs outside `make test`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
# bench/ and what benchkit puts first on sys.path (tests/, whose folders would shadow libraries
# of their name: test_layout.py) only while the bench is imported.
_saved = list(sys.path)
sys.path.insert(0, str(BENCH))
from mdtest import parse_rates, ranks_list  # noqa: E402

sys.path[:] = _saved

pytestmark = pytest.mark.unit

OUTPUT = """\
mdtest-4.1.0+dev was launched with 2 total task(s) on 1 node(s)
Command line used: mdtest '-F' '-u' '-n' '500' '-d' 'd'
WARNING: Read bytes is 0, thus, a read test will actually just open/close
2 tasks, 1000 files

SUMMARY rate (in ops/sec): (of 1 iterations)
   Operation                     Max            Min           Mean        Std Dev
   ---------                     ---            ---           ----        -------
   File creation              102427.507     102427.507     102427.507          0.000
   File stat                  715385.298     715385.298     715385.298          0.000
   File read                  475760.436     475760.436     475760.436          0.000
   File removal               226903.111     226903.111     226903.111          0.000
   Tree creation               11618.571      11618.571      11618.571          0.000
   Tree removal                  612.754        612.754        612.754          0.000
-- finished at 11/26/2026 17:29:43 --
"""


def test_the_means_of_the_file_phases_are_read_and_phases_at_zero_left_out():
    assert parse_rates(OUTPUT) == {"create": 102427.507, "stat": 715385.298, "read": 475760.436, "remove": 226903.111}
    assert parse_rates(OUTPUT.replace("475760.436", "0.000")) == {
        "create": 102427.507,
        "stat": 715385.298,
        "remove": 226903.111,
    }
    assert parse_rates("mdtest failed before its summary\n") == {}


def test_rank_counts_are_a_comma_list():
    assert ranks_list("2,8") == [2, 8]
    assert ranks_list("0") == []
    with pytest.raises(Exception, match="rank counts"):
        ranks_list("two")


def test_help_explains_the_bench_and_mdtest_is_required():
    run = [sys.executable, str(BENCH / "mdtest.py")]
    h = subprocess.run([*run, "--help"], capture_output=True, text=True, timeout=60)
    assert h.returncode == 0 and "bindfs -o direct_io" in h.stdout and "--mdtest" in h.stdout
    r = subprocess.run(run, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "--mdtest" in r.stderr
    r = subprocess.run([*run, "--mdtest", str(BENCH / "no-such-mdtest")], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "not an executable file" in r.stderr
