"""One job pattern everywhere (issue 10): Beacon's volume dominance decides a job's pattern, and
`pharos job`, `pharos jobs`, `pharos diagnose` and the API (jobs and diagnosis routers) report
the same one, for every shared Darshan log and for synthetic traced jobs, among them "almost
all N-N writes + a tiny N-1 read of one input file" (N-N everywhere, where the fan-in over all
files says N-M).

Real chDB store, real FastAPI app served by uvicorn on loopback, the real typer CLI (CliRunner)."""

from __future__ import annotations

import time

import pytest
from pharos_synthetic_jobs import MiB, event, rec
from pharos_testkit import DARSHAN_LOGS, assert_one_pattern, cli_json, need_darshan, served
from typer.testing import CliRunner

from pharos_analytics.pattern import decide_pattern
from pharos_api.app import create_app
from pharos_api.cli import app as cli_app
from pharos_core.settings import Settings
from pharos_core.store import migrate, open_store
from pharos_pipeline.darshan_import import import_log

runner = CliRunner()
N = 8


def test_decide_pattern_rule():
    # two modes: more than half; three or more: more than a third; else the fan-in pattern
    assert decide_pattern([("N-1", 1), ("N-N", 99)], "N-M") == "N-N"
    assert decide_pattern([("N-1", 50), ("N-N", 50)], "N-M") == "N-M"  # not MORE than half
    assert decide_pattern([("N-1", 51), ("N-N", 49)], "N-M") == "N-1"
    assert decide_pattern([("1-1", 34), ("N-N", 33), ("N-1", 33)], "N-M") == "1-1"
    assert decide_pattern([("1-1", 33), ("N-N", 33), ("N-1", 34)], "N-M") == "N-1"
    assert decide_pattern([("1-1", 30), ("N-N", 30), ("N-1", 30), ("N-M", 10)], "N-M") == "N-M"
    assert decide_pattern([("N-N", 5), ("N-N", 5)], "N-M") == "N-N"  # same mode adds up
    assert decide_pattern([("none", 0), ("N-1", 0)], "1-1") == "1-1"  # no volume: fan-in
    with pytest.raises(ValueError):
        decide_pattern([("N-N", -1)], "none")


def synthetic_rows() -> tuple[list[dict], list[dict], dict[str, str]]:
    """Traced jobs and the pattern each must get."""
    rows: list[dict] = []
    # nn_input: N ranks write 64 MiB each to their own file; every rank reads 4 KiB of one input.
    for r in range(N):
        rows.append(rec("nn_input", r, "read", "/scratch/in/config", 4096, 4096, 1, start=1, end=1.1, dur=0.01))
        rows.append(rec("nn_input", r, "write", f"/scratch/out/{r}", MiB, MiB, 64, start=2, end=6, dur=3))
    # n1_mostly: N ranks write one shared file (32 MiB each) and each reads 1 KiB of its own log.
    for r in range(N):
        rows.append(rec("n1_mostly", r, "write", "/scratch/shared.h5", MiB, MiB, 32, start=2, end=5, dur=2))
        rows.append(rec("n1_mostly", r, "read", f"/scratch/log.{r}", 1024, 1024, 1, start=6, end=6.1, dur=0.01))
    # even: half the bytes N-N writes, half N-1 reads: no mode dominates -> fan-in (N-M).
    for r in range(N):
        rows.append(rec("even", r, "write", f"/scratch/e.{r}", MiB, MiB, 2, start=2, end=3, dur=0.5))
        rows.append(rec("even", r, "read", "/scratch/e.in", MiB, MiB, 2, start=4, end=5, dur=0.5))
    # n1_side (issue 24): N ranks write one shared file; rank 0 also writes a 4 KiB results file
    # and every rank appends a line to one shared log: N-1 by volume (fan-in over the files: N-M).
    for r in range(N):
        rows.append(rec("n1_side", r, "write", "/scratch/ior.dat", MiB, MiB, 16, start=2, end=5, dur=2))
        rows.append(rec("n1_side", r, "write", "/scratch/ior.log", 80, 80, 1, start=5, end=5.1, dur=0.01))
    rows.append(rec("n1_side", 0, "write", "/scratch/results.txt", 4096, 4096, 1, start=5.2, end=5.3, dur=0.01))
    # nm_side: two groups of N/2 ranks each write their own shared file (N-M, as subfiling does),
    # and rank 0 a results file: still N-M (neither shared file carries the shared volume).
    for r in range(N):
        rows.append(rec("nm_side", r, "write", f"/scratch/sub.{r % 2}", MiB, MiB, 8, start=2, end=5, dur=2))
    rows.append(rec("nm_side", 0, "write", "/scratch/nm-results.txt", 4096, 4096, 1, start=5.2, end=5.3, dur=0.01))
    expected = {"nn_input": "N-N", "n1_mostly": "N-1", "even": "N-M", "n1_side": "N-1", "nm_side": "N-M"}
    events = [event(j, "start", 0, name=j, ranks=N) for j in expected] + [
        event(j, "end", 10, exit_code=0) for j in expected
    ]
    return rows, events, expected


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A store with every shared Darshan log (one job each) and the synthetic jobs, served."""
    root = need_darshan(DARSHAN_LOGS)
    store = open_store(Settings(state_dir=tmp_path_factory.mktemp("patterns")))
    migrate(store)
    t0 = time.monotonic()
    logs = sorted(root.rglob("*.darshan"))  # all of them, partial_data_dxt's 1,000,000 DXT segments too
    darshan_jobs: dict[str, str] = {}
    for p in logs:
        r = import_log(store, p, job_id=f"darshan-{p.parent.name}-{p.stem[:40]}")
        assert r.status == "imported", (p, r.error)
        darshan_jobs[r.job_id] = str(p.relative_to(root))
    rows, events, expected = synthetic_rows()
    store.insert_rows("io_requests", rows)
    store.insert_rows("job_events", events)
    print(f"\n[patterns] {len(logs)} Darshan logs imported in {time.monotonic() - t0:.1f} s")
    app = create_app(store, Settings(state_dir=tmp_path_factory.getbasetemp(), api_auth="none"))
    with served(app) as url:
        yield url, darshan_jobs, expected
    store.close()


def test_every_view_agrees(world):
    url, darshan_jobs, expected = world
    jobs = assert_one_pattern(url, [*expected, *darshan_jobs])
    listed = {j["job_id"]: j for j in cli_json(url, "jobs", "--limit", "1000")["items"]}
    table = []
    for jid, job in jobs.items():
        table.append((darshan_jobs.get(jid, jid), job["pattern"], job["patterns"], job["fan_in_pattern"]))
        if jid in expected:
            assert job["pattern"] == expected[jid], (jid, job["pattern"], job["patterns"])
    print("\n[patterns] job -> pattern (reads/writes detail, fan-in over all files)")
    for name, p, d, f in table:
        print(f"  {name[:70]:70s} {p:4s} read {d['read']:4s} write {d['write']:4s} fan-in {f}")
    # the case: N-N writes + a tiny N-1 read of one input file
    nn = cli_json(url, "job", "nn_input")
    assert (nn["pattern"], nn["patterns"], nn["fan_in_pattern"]) == ("N-N", {"read": "N-1", "write": "N-N"}, "N-M")
    # side files (issue 24): the write direction is decided by volume, the fan-in stays as detail
    side = cli_json(url, "job", "n1_side")
    assert (side["pattern"], side["patterns"]["write"], side["fan_in_pattern"]) == ("N-1", "N-1", "N-M")
    # a counter-only job (no DXT) has its bytes in the list
    counters_only = [j for j in darshan_jobs if listed[j]["source"] == "darshan-counters"]
    assert counters_only and any(listed[j]["bytes_written"] + listed[j]["bytes_read"] > 0 for j in counters_only)


def test_diagnose_text_shows_the_pattern_and_its_detail(world):
    url, _, _ = world
    r = runner.invoke(cli_app, ["diagnose", "nn_input", "--api", url], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "pattern: N-N" in r.output and "writes N-N, reads N-1" in r.output
    j = runner.invoke(cli_app, ["job", "nn_input", "--api", url], env={"COLUMNS": "200"})
    assert "pattern N-N" in j.output and "all files together N-M" in j.output
