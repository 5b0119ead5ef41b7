"""Straggler attribution (issue 10, item 1): the resource the slow files share.

Pure-logic unit tests of the judge (TOKIO darshan_bad_ost correlation + Beacon ratio), then a
real chDB store with live-style forwarder-layer rows (a slowed target), Darshan counters with
LUSTRE OST ids, the anomalies rows and GET /v1/anomalies, and every shared Darshan log that
carries LUSTRE records (what each gives is printed and asserted)."""

from __future__ import annotations

import json
from datetime import datetime

import pytest
from fastapi.testclient import TestClient
from pharos_diag_rows import T0, MiB, S, req, start_event
from pharos_diag_rows import ctr as _ctr
from pharos_testkit import DARSHAN_LOGS, need_darshan
from rich.console import Console

from pharos_analytics.diagnosis_config import DiagnosisConfig
from pharos_analytics.insights import job_insights
from pharos_analytics.straggler import (
    FileObs,
    job_stragglers,
    judge,
    ost_of,
    parse_layout,
    record_straggler_anomalies,
)
from pharos_api.app import create_app
from pharos_core.settings import Settings
from pharos_core.store import ns_to_datetime64
from pharos_pipeline.darshan_import import import_log

CFG = DiagnosisConfig()


def obs(n_files=16, n_targets=8, slow=None, factor=4.0, jitter=0.15, size=64 * MiB):
    """N-N files placed round-robin on targets; files on ``slow`` take ``factor`` x longer."""
    out = []
    for i in range(n_files):
        t = f"ost{i % n_targets}"
        base = 1.0 + jitter * ((i * 7) % 5 - 2) / 2  # deterministic +-15 % spread
        out.append(FileObs(f"/out/{i}", size, base * (factor if t == slow else 1.0), (i,), {"target": (t,)}))
    return out


# -- pure logic ---------------------------------------------------------------------------------


@pytest.mark.parametrize("slow", ["ost0", "ost3", "ost7"])
def test_judge_blames_only_the_slowed_target(slow):
    vs = judge(obs(slow=slow), "target", CFG)
    assert len(vs) == 8
    assert [v.resource for v in vs if v.blamed] == [slow]
    v = next(v for v in vs if v.resource == slow)
    assert v.coefficient < -0.5 and v.p_value < 0.05 and v.ratio == pytest.approx(4.0, rel=0.3)


def test_judge_blames_nothing_without_a_slow_target_or_with_one_file_per_target():
    assert not any(v.blamed for v in judge(obs(), "target", CFG))
    # one file per target: a slow file and a slow target cannot be told apart -> not judged
    assert judge(obs(n_files=8, slow="ost2"), "target", CFG) == []
    # a 1.5x slowdown is below Beacon's ratio (2x): correlated, but not blamed
    assert not any(v.blamed for v in judge(obs(slow="ost2", factor=1.5, jitter=0.0), "target", CFG))
    # tiny files (latency, not bandwidth) are left out
    assert judge(obs(slow="ost2", size=1000), "target", CFG) == []


def test_judge_striped_files_share_their_weight():
    # files striped over 2 OSTs each (1/2 per OST, TOKIO's columns); OST5 is in the slow ones
    o = []
    for i in range(12):
        a, b = f"OST{i % 6}", f"OST{(i + 1) % 6}"
        slow = "OST5" in (a, b)
        o.append(FileObs(f"f{i}", 8 * MiB, 4.0 if slow else 1.0 + 0.05 * (i % 3), (i,), {"ost": (a, b)}))
    blamed = [v.resource for v in judge(o, "ost", CFG) if v.blamed]
    assert blamed == ["OST5"]


# -- live-style forwarder rows in a real store ----------------------------------------------------


def fwd_rows(job, slow_target, ranks=16, targets=8, writes=8):
    """An N-N job of ``ranks`` ranks, rank r's file on target r mod ``targets`` (round-robin), through
    fwd0/fwd1 from compute node cn0; the slow target serves each 1 MiB write in 4x the time."""
    rows = []
    for r in range(ranks):
        tgt = f"ost{r % targets}"
        for i in range(writes):
            dur = (0.02 + 0.002 * (r % 3)) * (4 if tgt == slow_target else 1)
            x = req(job, r, "write", f"/{job}/data.{r}", i * MiB, MiB, t=1 + i * 0.1, dur=dur, layer="forwarder")
            x |= {"target": tgt, "forwarding_node": f"fwd{r % 2}", "compute_node": "cn0"}
            rows.append(x)
            c = req(job, r, "write", f"/mnt/{job}/data.{r}", i * MiB, MiB, t=1 + i * 0.1, dur=dur + 0.001)
            rows.append(c)
    return rows


@pytest.fixture(scope="module")
def live_jobs(store):
    rows = fwd_rows("strag-ost5", "ost5") + fwd_rows("strag-healthy", None)
    store.insert_rows("io_requests", rows)
    store.insert_rows("job_events", [start_event("strag-ost5", 16), start_event("strag-healthy", 16)])
    return store


def test_live_rows_name_the_slow_target(live_jobs):
    rep = job_stragglers(live_jobs, "strag-ost5")
    assert rep.source == "trace" and rep.observations == 16
    assert [(f.resource_type, f.resource) for f in rep.findings] == [("target", "ost5")]
    f = rep.findings[0]
    assert f.files == ["/strag-ost5/data.13", "/strag-ost5/data.5"] and f.ranks == [5, 13]
    # forwarding nodes and the compute node were judged too: none blamed (ost5's ranks 5 and 13 go
    # through fwd1, but fwd1's 8 files have a median not 2x below fwd0's; one compute node: no peers)
    assert not any(v.blamed for v in rep.verdicts if v.resource_type != "target")
    ins = {i.id: i for i in job_insights(live_jobs, "strag-ost5").insights}
    s = ins["straggler_resource"]
    assert s.severity == "high" and s.source == "trace" and "storage target ost5" in s.title
    assert s.evidence["resource"] == "ost5" and s.evidence["ratio"] > 3 and s.evidence["coefficient"] < -0.5
    assert "data.5" in s.message and "ranks 5, 13" in s.message
    assert "straggler_resource" not in {i.id for i in job_insights(live_jobs, "strag-healthy").insights}
    assert job_stragglers(live_jobs, "strag-healthy").findings == []


def test_slow_target_is_stored_once_and_listed_in_anomalies(live_jobs, tmp_path):
    now = T0 + 3600 * S
    record_straggler_anomalies(live_jobs, "strag-ost5", now_ns=now)
    record_straggler_anomalies(live_jobs, "strag-ost5", now_ns=now + S)  # the same evidence: not stored again
    record_straggler_anomalies(live_jobs, "strag-healthy", now_ns=now)
    rows = live_jobs.query(
        "SELECT key, node, node_type, job_id, start, end, evidence FROM anomalies WHERE kind = 'straggler_resource'"
    )
    assert [(r["key"], r["node"], r["node_type"], r["job_id"]) for r in rows] == [
        ("straggler_resource:strag-ost5:target:ost5", "ost5", "target", "strag-ost5")
    ]
    assert rows[0]["start"] is not None and rows[0]["end"] is not None and rows[0]["start"] < rows[0]["end"]
    ev = json.loads(rows[0]["evidence"])
    assert ev["n_files"] == 2 and ev["ranks"] == [5, 13] and ev["verdict"]["blamed"]
    app = create_app(live_jobs, Settings(state_dir=tmp_path, api_auth="none"))
    with TestClient(app) as c:
        items = c.get("/v1/anomalies", params={"kind": "straggler_resource", "since_s": 10**7}).json()["items"]
    assert [(i["node"], i["job_id"], i["node_type"]) for i in items] == [("ost5", "strag-ost5", "target")]
    start, end = (datetime.fromisoformat(items[0][k].replace("Z", "+00:00")) for k in ("start", "end"))
    assert (end - start).total_seconds() == pytest.approx(0.7 + 0.08, abs=0.02)  # the job's I/O time range
    # `pharos anomalies` shows such a row as evidence from the job, not as a "cleared" live condition
    from pharos_api.cli_system import anomalies_table

    console = Console(width=200, record=True)
    console.print(anomalies_table({"source": "stored", "as_of": None, "items": items}))
    row = next(ln for ln in console.export_text().splitlines() if "straggler_resource" in ln)
    assert "job evidence" in row and "cleared" not in row, row


# -- Darshan counters with OST ids (the real importer's counter names, synthetic numbers) ---------


def counter_rows(job, slow_ost, files=16, osts=8):
    rows = []
    for i in range(files):
        ost = i % osts
        t = (0.5 + 0.05 * (i % 3)) * (4 if ost == slow_ost else 1)
        rid = 1000 + i
        for counter, value in (("POSIX_BYTES_WRITTEN", 256 * MiB), ("POSIX_WRITES", 256), ("POSIX_F_WRITE_TIME", t)):
            rows.append(_ctr(job, "POSIX", i, rid, f"/lus/out.{i}", counter, value))
        for counter, value in (("LUSTRE_STRIPE_COUNT", 1), ("LUSTRE_OSTS", 1), (f"LUSTRE_OST_ID_{ost}", 1)):
            rows.append(_ctr(job, "LUSTRE", i, rid, f"/lus/out.{i}", counter, value))
    return rows


def test_counters_name_the_slow_ost(store):
    store.insert_rows("darshan_counters", counter_rows("ctr-ost6", 6) + counter_rows("ctr-none", None))
    rep = job_stragglers(store, "ctr-ost6")
    assert rep.source == "counters" and rep.observations == 16
    assert [(f.resource_type, f.resource) for f in rep.findings] == [("ost", "OST6")]
    assert rep.findings[0].ranks == [6, 14]
    ins = {i.id: i for i in job_insights(store, "ctr-ost6").insights}
    assert ins["straggler_resource"].evidence["resource"] == "OST6" and ins["straggler_resource"].source == "counters"
    assert job_stragglers(store, "ctr-none").findings == []


# -- DXT requests mapped to OSTs through the files' stripes -------------------------------------------


def test_layout_maps_offsets_to_osts():
    # plain layout: 1 MiB stripes over OSTs 6, 0, 3 (zeros kept); PFL: first 4 MiB on OST 9, then
    # 2 MiB stripes over 1 and 2 to the end of the file
    c0 = "LUSTRE_COMP0_"
    c1 = "LUSTRE_COMP1_"
    plain = {f"{c0}STRIPE_SIZE": MiB, f"{c0}STRIPE_COUNT": 3, f"{c0}EXT_START": 0, f"{c0}EXT_END": -1}
    plain = parse_layout([*plain.items(), (f"{c0}OST_0", 6), (f"{c0}OST_1", 0), (f"{c0}OST_2", 3)])
    assert [ost_of(plain, o) for o in (0, MiB - 1, MiB, 2 * MiB + 5, 3 * MiB, 10 * MiB)] == [6, 6, 0, 3, 6, 0]
    pfl = {f"{c0}STRIPE_SIZE": MiB, f"{c0}EXT_START": 0, f"{c0}EXT_END": 4 * MiB, f"{c0}OST_0": 9}
    pfl |= {f"{c1}STRIPE_SIZE": 2 * MiB, f"{c1}EXT_START": 4 * MiB, f"{c1}EXT_END": -1}
    pfl = parse_layout([*pfl.items(), (f"{c1}OST_0", 1), (f"{c1}OST_1", 2)])
    assert [ost_of(pfl, o) for o in (0, 4 * MiB - 1, 4 * MiB, 6 * MiB, 8 * MiB)] == [9, 9, 1, 2, 1]
    assert parse_layout([("LUSTRE_COMP0_STRIPE_SIZE", MiB)]) == []  # no OST list: no layout
    assert ost_of(pfl[:1], 5 * MiB) is None  # beyond every extent


def striped_job(job, slow_ost, files=8, osts=4, mib_per_file=16):
    """An N-N Darshan-like job: rank i writes /lus/s.i in 1 MiB requests (DXT rows), each file
    striped over ALL ``osts`` OSTs (1 MiB stripes, the OST order rotated per file), so every file
    is on every OST and the per-file columns carry no contrast; a request on ``slow_ost`` takes
    4x longer. Returns (darshan_counters rows, io_requests rows)."""
    ctr, reqs = [], []
    for i in range(files):
        rid, path = 5000 + i, f"/lus/s.{i}"
        order = [(i + k) % osts for k in range(osts)]
        total = 0.0
        for b in range(mib_per_file):
            ost = order[b % osts]
            dur = (0.01 + 0.001 * ((i + b) % 3)) * (4 if ost == slow_ost else 1)
            reqs.append(req(job, i, "write", path, b * MiB, MiB, t=1 + b * 0.05, dur=dur))
            total += dur
        for counter, value in (("POSIX_BYTES_WRITTEN", mib_per_file * MiB), ("POSIX_F_WRITE_TIME", total)):
            ctr.append(_ctr(job, "POSIX", i, rid, path, counter, value))
        layout = [("LUSTRE_STRIPE_SIZE", MiB), ("LUSTRE_STRIPE_COUNT", osts), ("LUSTRE_OSTS", osts)]
        layout += [(f"LUSTRE_OST_ID_{o}", 1) for o in order]
        layout += [("LUSTRE_COMP0_STRIPE_SIZE", MiB), ("LUSTRE_COMP0_STRIPE_COUNT", osts)]
        layout += [("LUSTRE_COMP0_EXT_START", 0), ("LUSTRE_COMP0_EXT_END", -1)]
        layout += [(f"LUSTRE_COMP0_OST_{k}", o) for k, o in enumerate(order)]
        ctr += [_ctr(job, "LUSTRE", i, rid, path, c, v) for c, v in layout]
    return ctr, reqs


def test_dxt_requests_name_the_slow_ost_of_striped_files(store):
    for job, slow in (("dxt-ost2", 2), ("dxt-none", None)):
        ctr, reqs = striped_job(job, slow)
        store.insert_rows("darshan_counters", ctr)
        store.insert_rows("io_requests", reqs)
    rep = job_stragglers(store, "dxt-ost2")
    # 8 files x 4 OSTs: one observation per (file, OST)
    assert rep.source == "dxt" and rep.observations == 32
    assert [(f.resource_type, f.resource) for f in rep.findings] == [("ost", "OST2")]
    f = rep.findings[0]
    assert f.ranks == list(range(8)) and len(f.files) == 8 and all(x.endswith("[OST2]") for x in f.files)
    assert f.verdict.ratio == pytest.approx(4.0, rel=0.25)
    ins = {i.id: i for i in job_insights(store, "dxt-ost2").insights}
    assert ins["straggler_resource"].evidence["resource"] == "OST2" and ins["straggler_resource"].source == "trace"
    healthy = job_stragglers(store, "dxt-none")
    assert healthy.source == "dxt" and healthy.findings == [] and len(healthy.verdicts) == 4
    # the per-file columns alone cannot see it: every file is on every OST
    from pharos_analytics.straggler import _counter_obs, attribute

    assert attribute(_counter_obs(store, "dxt-ost2")[0], CFG, ("ost",))[1] == []


# -- the shared Darshan logs that carry LUSTRE records ------------------------------------------------

#: log -> (data files with an OST and >= straggler_min_file_bytes, OSTs among them, blamed OSTs)
LUSTRE_LOGS = {
    # 64 procs, STDIO + LUSTRE only (no POSIX records): nothing to correlate
    "apmpi/darshan-apmpi-2nodes-64mpi.darshan": (0, 0, []),
    # one shared file on one OST (4 ranks, 1 stripe): one OST, no peers
    "apmpi_apxc/mpi-io-test.darshan": (1, 1, []),
    # 3 big files, each striped over all 56 OSTs: every OST carries every file -> no contrast
    "e3sm_io_heatmaps_and_dxt/e3sm_io_heatmap_only.darshan": (3, 56, []),
    # the ranks' time imbalance is within files: the slow and the fast ranks write the same file on
    # OST 27; the one big shared file (3981085427) is alone on OST 29: one file per OST -> not judged
    "imbalanced_io/imbalanced-io.darshan": (2, 2, []),
    # IOR, 16 ranks, one shared file on one OST
    "ior_daos/snyder_ior-POSIX_id1057716-202103_11-8-64415-6936117869459351096_1.darshan": (1, 1, []),
    # 65536 ranks, one shared file on one OST
    "skew_io/skew-app.darshan": (1, 1, []),
}


def test_lustre_logs_blame_no_ost_where_imbalance_does_not_follow_osts(store):
    print("\n[straggler] shared Darshan logs with LUSTRE records:")
    for rel, (n_obs, n_osts, blamed) in LUSTRE_LOGS.items():
        r = import_log(store, need_darshan(DARSHAN_LOGS / rel))
        assert r.status == "imported", r.error
        rep = job_stragglers(store, r.job_id)
        used = [o for o in _obs(store, r.job_id) if o.bytes >= CFG.straggler_min_file_bytes]
        osts = {x for o in used for x in o.resources["ost"]}
        judged = [(v.resource, v.files, v.peer_files, v.coefficient, v.ratio) for v in rep.verdicts]
        print(
            f"  {rel[:60]:60s} source {rep.source} files {len(used)} OSTs {len(osts)} judged {judged} "
            f"blamed {rep.findings}"
        )
        # none of them has DXT requests on a file striped over several OSTs: judged per file
        assert rep.source in ("counters", "none"), (rel, rep.source)
        assert (len(used), len(osts)) == (n_obs, n_osts), rel
        assert [f.resource for f in rep.findings] == blamed, rel
        assert "straggler_resource" not in {i.id for i in job_insights(store, r.job_id).insights}
        n = store.query(
            "SELECT count() AS n FROM anomalies WHERE kind = 'straggler_resource' AND job_id = {j:String}",
            {"j": r.job_id},
        )[0]["n"]
        assert int(n) == 0
    # the importer keeps the OST ids: imbalanced_io's data files sit on OSTs 9, 27 and 29
    ids = store.query(
        "SELECT groupUniqArray(counter) AS c FROM darshan_counters WHERE job_id = '1452113755' "
        "AND startsWith(counter, 'LUSTRE_OST_ID_')"
    )[0]["c"]
    assert {"LUSTRE_OST_ID_9", "LUSTRE_OST_ID_27", "LUSTRE_OST_ID_29"} <= set(ids)


def _obs(store, job_id):
    from pharos_analytics.straggler import _counter_obs

    return [o for o in _counter_obs(store, job_id)[0] if o.resources["ost"]]


def test_detection_works_off_a_backlog_of_ended_jobs_a_few_per_cycle(store, monkeypatch):
    """After a start the periodic detection finds every job that ended in the look-back; it
    attributes ``straggler_jobs_per_cycle`` of them per cycle (oldest end first), each once."""
    from pharos_analytics.alerts import DetectionLoop

    jobs = [f"strag-bl{k}" for k in range(5)]
    store.insert_rows("io_requests", [r for k, j in enumerate(jobs) for r in fwd_rows(j, f"ost{k + 1}")])
    ends = [
        start_event(j, 16) | {"kind": "end", "time": ns_to_datetime64(T0 + (10 + k) * S)} for k, j in enumerate(jobs)
    ]
    store.insert_rows("job_events", [start_event(j, 16) for j in jobs] + ends)
    monkeypatch.setenv("PHAROS_DIAGNOSIS_STRAGGLER_JOBS_PER_CYCLE", "2")
    loop = DetectionLoop(store, DiagnosisConfig)

    def blamed() -> list[tuple[str, str]]:
        sql = "SELECT job_id, node FROM anomalies WHERE kind = 'straggler_resource' AND job_id LIKE 'strag-bl%'"
        return sorted((r["job_id"], r["node"]) for r in store.query(sql))

    now = T0 + 100 * S
    assert loop.run_once(now)["straggler_backlog"] == 3
    assert blamed() == [("strag-bl0", "ost1"), ("strag-bl1", "ost2")]
    assert loop.run_once(now + 10 * S)["straggler_backlog"] == 1
    last = loop.run_once(now + 20 * S)
    assert last["straggler_backlog"] == 0 and last["straggler_dropped"] == 0
    assert blamed() == [(j, f"ost{k + 1}") for k, j in enumerate(jobs)]
    assert loop.run_once(now + 30 * S)["straggler_resources"] == 0  # nothing attributed twice
    assert blamed() == [(j, f"ost{k + 1}") for k, j in enumerate(jobs)]
