"""Issue 28 item 3: the histories of many jobs read at once (``dfra.job_histories``: one history
query for all (name, user, command) keys, one metrics read for all their runs) are each job's own
``job_history``: the newest ``dfra_history_runs`` finished runs of its name, user and command, the
job itself left out, runs without I/O then dropped. On a real chDB store, against the rule
written out here from the rows inserted."""

from __future__ import annotations

from dataclasses import dataclass

import control_rows as cr
import pytest

from pharos_analytics.control.config import ControlConfig
from pharos_analytics.control.dfra import job_histories, job_history

T0 = 1_760_000_000 * cr.NS
CFG = ControlConfig(dfra_history_runs=3)
SIM = ["sim", "-n", "8"]
ODD = ["a b", "it's\t\\x", "[1,2]"]  # quotes, a tab, a backslash, brackets: the parameters' escaping


@dataclass
class Run:
    job_id: str
    name: str
    user: str
    command: list[str]
    start_s: int
    end_s: int | None  # None: not ended
    io: str = "data"  # "data" (N-N writes), "meta" (stats only), "" (no request)
    end_name: str | None = None  # the end event's name when not the start's

    @property
    def finished(self) -> bool:
        # the rule: a start and an end event with the run's name and user
        return self.end_s is not None and (self.end_name is None or self.end_name == self.name)


RUNS = [
    # sim/alice/SIM: 6 ended with I/O (two start in the same second), one without I/O, one not ended
    *(Run(f"s{t}", "sim", "alice", SIM, t, t + 5) for t in (0, 10, 20, 30, 40)),
    Run("s40b", "sim", "alice", SIM, 40, 46),
    Run("s50", "sim", "alice", SIM, 50, 55, io=""),
    Run("s60", "sim", "alice", SIM, 60, None),
    Run("s45", "sim", "alice", SIM, 45, 49, end_name=""),  # its end event has no name: not ended
    # the same name and user, another command
    Run("o1", "sim", "alice", ["sim", "other"], 15, 18),
    Run("o2", "sim", "alice", ["sim", "other"], 35, 38, io="meta"),
    # another user
    Run("b1", "sim", "bob", SIM, 5, 9),
    Run("b2", "sim", "bob", SIM, 25, 29),
    Run("b3", "sim", "bob", SIM, 65, None),
    # metadata only, no I/O at all
    Run("p1", "post", "alice", ["post"], 12, 14, io="meta"),
    Run("p2", "post", "alice", ["post"], 22, 24, io=""),
    Run("p3", "post", "alice", ["post"], 32, 34, io=""),
    # a name and command with quotes, tabs and backslashes
    Run("q1", "it's", "carol", ODD, 8, 9),
    Run("q2", "it's", "carol", ODD, 18, 19),
    Run("q3", "it's", "carol", ["a b"], 28, 29),
    # no name
    Run("n1", "", "alice", ["anon"], 3, 4),
]


def _rows(run: Run) -> tuple[list[dict], list[dict]]:
    start = T0 + run.start_s * cr.NS
    ev = cr.job_events(
        run.job_id, start, None if run.end_s is None else T0 + run.end_s * cr.NS, run.name, run.user, run.command
    )
    if run.end_name is not None:
        ev[1]["name"] = run.end_name
    if run.io == "data":
        req = cr.requests(run.job_id, start, 2, 4 + run.start_s % 7)
    elif run.io == "meta":
        req = cr.requests(run.job_id, start, 1, 0, metadata_per_rank=3 + run.start_s % 5)
    else:
        req = []
    return ev, req


@pytest.fixture(scope="module")
def runs_store(store):
    for run in RUNS:
        ev, req = _rows(run)
        store.insert_rows("job_events", ev)
        if req:
            store.insert_rows("io_requests", req)
    return store


def expected_jobs(job_id: str, name: str, user: str, command: list[str] | None) -> list[str] | None:
    """The rule from the rows inserted: newest CFG.dfra_history_runs finished runs (start time
    descending, then job id descending) of the name, user and command, the job left out, then
    those with I/O; None when none or no name."""
    if not name:
        return None
    same = [
        r
        for r in RUNS
        if r.name == name and r.user == user and r.finished and (not command or r.command == command)
        if r.job_id != job_id
    ]
    same.sort(key=lambda r: (r.start_s, r.job_id), reverse=True)
    kept = [r.job_id for r in same[: CFG.dfra_history_runs] if r.io]
    return kept or None


#: Every run asking for its own history (finished ones are among their key's runs), and jobs
#: that are not runs: without a command (any), with an empty one, twice the same, unknown names.
ASKS = [(r.job_id, r.name, r.user, r.command) for r in RUNS] + [
    ("", "sim", "alice", None),
    ("", "sim", "alice", []),
    ("s40", "sim", "alice", None),
    ("new1", "sim", "alice", SIM),
    ("new2", "sim", "alice", SIM),
    ("new1", "sim", "alice", SIM),
    ("new3", "sim", "bob", None),
    ("new4", "post", "alice", None),
    ("new5", "it's", "carol", None),
    ("new6", "sim", "carol", SIM),
    ("new7", "nothing", "alice", None),
    ("new8", "", "alice", None),
]


def test_histories_read_at_once_are_each_jobs_own(runs_store):
    got = job_histories(runs_store, ASKS, CFG)
    assert len(got) == len(ASKS)
    for ask, h in zip(ASKS, got, strict=True):
        job_id, name, user, command = ask
        assert h == job_history(runs_store, name, user, command, CFG, job_id=job_id), ask
        assert (h.jobs if h else None) == expected_jobs(*ask), ask
        if h is not None:
            assert h.runs == len(h.jobs) <= CFG.dfra_history_runs
    # the newest three finished runs: s50 (no I/O), then the tie at 40 s by job id; s45's end has no name
    sim = job_history(runs_store, "sim", "alice", SIM, CFG, job_id="new1")
    assert sim.jobs == ["s40b", "s40"] and sim.runs == 2
    assert job_history(runs_store, "sim", "alice", SIM, CFG, job_id="s40b").jobs == ["s40", "s30"]
    assert job_history(runs_store, "sim", "alice", None, CFG).jobs == ["s40b", "s40"]  # o2 is older
    post = job_history(runs_store, "post", "alice", ["post"], CFG)
    assert post.jobs == ["p1"] and post.bytes == 0 and post.metadata_ops == 3 + 12 % 5
    odd = job_history(runs_store, "it's", "carol", ODD, CFG)
    # the runs' own numbers: q2 wrote 2 ranks x (4 + 18 % 7) MiB, q1 2 x (4 + 8 % 7) MiB
    assert odd.jobs == ["q2", "q1"] and odd.bytes == (2 * 8 + 2 * 5) * cr.MiB / 2
