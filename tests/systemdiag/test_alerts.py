"""Alerts through the real Alertmanager (Debian prometheus-alertmanager, loopback, no cluster)
and the generic JSON webhook; the detection loop's fault-to-alert latency on live data."""

from __future__ import annotations

import threading
import time

import httpx
import pharos_sysdiag_sim as sim

from pharos_analytics.alerts import Alerter, AlertmanagerSink, Condition, DetectionLoop, WebhookSink
from pharos_analytics.diagnosis_config import DiagnosisConfig


def _am_alerts(url: str) -> list[dict]:
    return [a for a in httpx.get(url + "/api/v2/alerts", timeout=5).json() if a["labels"].get("source") == "pharos"]


def _wait(pred, timeout: float, step: float = 0.25):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(step)
    return pred()


def _cond(key="fail_slow_target:ost9", node="ost9", ratio="5.0"):
    return Condition(
        key,
        {"alertname": "PharosFailSlowTarget", "severity": "critical", "target": node, "job": "", "source": "pharos"},
        {"summary": f"{node} slow", "rel_service": ratio},
        time.time_ns() - 3 * 10**9,
    )


def test_alertmanager_receives_deduplicates_and_resolves(alertmanager, receiver, store):
    cfg = DiagnosisConfig(alert_resend_s=0.5, alert_ends_after_s=120)
    al = Alerter([AlertmanagerSink(alertmanager), WebhookSink(receiver.url + "/hook")], cfg, store)
    al.update([_cond()])
    got = _wait(lambda: _am_alerts(alertmanager), 10)
    assert len(got) == 1 and got[0]["labels"]["target"] == "ost9" and got[0]["status"]["state"] == "active"
    fp, starts = got[0]["fingerprint"], got[0]["startsAt"]
    # the same open condition, re-sent with new numbers: still one alert, same identity and start
    time.sleep(0.6)
    al.update([_cond(ratio="6.5")])
    got = _wait(lambda: [a for a in _am_alerts(alertmanager) if a["annotations"]["rel_service"] == "6.5"], 10)
    assert len(_am_alerts(alertmanager)) == 1 and got[0]["fingerprint"] == fp and got[0]["startsAt"] == starts
    # a second condition is a second alert
    al.update([_cond(), _cond("fail_slow_target:ost8", "ost8")])
    assert _wait(lambda: len(_am_alerts(alertmanager)) == 2, 10)
    # the conditions clear: endsAt = now, Alertmanager resolves them (gone from the active list,
    # and its own webhook notification says "resolved")
    al.update([])
    assert _wait(lambda: _am_alerts(alertmanager) == [], 10)
    am_notes = _wait(
        lambda: [
            b
            for p, b in receiver.bodies
            if p == "/am"
            and b["status"] == "resolved"
            and any(a["labels"].get("target") == "ost9" for a in b["alerts"])
        ],
        20,
    )
    assert am_notes, f"Alertmanager sent no resolved notification: {receiver.bodies}"
    hook = [b for p, b in receiver.bodies if p == "/hook"]
    states = [(a["key"], a["status"]) for b in hook for a in b["alerts"]]
    assert ("fail_slow_target:ost9", "firing") in states and ("fail_slow_target:ost9", "resolved") in states
    assert all(b["version"] == "pharos.alerts.v1" for b in hook)
    logged = store.query(
        "SELECT state, sink, accepted FROM alert_log WHERE key = 'fail_slow_target:ost9' ORDER BY time"
    )
    assert {(r["state"], r["sink"], int(r["accepted"])) for r in logged} == {
        ("firing", "alertmanager", 1),
        ("firing", "webhook", 1),
        ("resolved", "alertmanager", 1),
        ("resolved", "webhook", 1),
    }


def test_fault_to_alert_latency_live(alertmanager, store):
    """Live: 1 s metrics intervals inserted as they close; ost2 slowed 4x from s=12 to s=40;
    the loop (default detection period) must alert within 60 s of the fault's first slow
    interval, then resolve it."""
    cfg = DiagnosisConfig(
        failslow_windows_s=[5, 20, 60],
        alertmanager_url=alertmanager,
        interference_window_s=5,
        interference_lookback_s=120,
    )
    assert cfg.detect_period_s == 10
    cl = sim.Cluster()
    t0 = (time.time_ns() // sim.NS + 1) * sim.NS
    fault_s, clear_s, total = 12, 40, 95
    rows = sim.simulate(
        cl,
        sim.proportionate_jobs("live", 0.6 * sum(cl.targets.values()), cl.fwd_nodes),
        t0,
        total,
        seed=5,
        faults=[sim.Fault("target", "ost2", 4.0, fault_s, clear_s)],
    )
    by_s: dict[int, dict[str, list]] = {}
    for table in ("target_metrics", "io_requests"):
        for r in rows[table]:
            ts = r["time"] if table == "target_metrics" else r["start"]
            by_s.setdefault(int(ts.split(".")[0]) - t0 // sim.NS, {}).setdefault(table, []).append(r)
    stop = threading.Event()

    def feed():
        for s in range(total):
            wait = t0 / 1e9 + s + 1 - time.time()  # an interval is shipped when it closes
            if stop.wait(max(0.0, wait)):
                return
            for table, rs in by_s.get(s, {}).items():
                store.insert_rows(table, rs)

    feeder = threading.Thread(target=feed, daemon=True)
    loop = DetectionLoop(store, lambda: cfg)
    feeder.start()
    loop.start()
    try:
        fault_ns = t0 + fault_s * sim.NS
        got = _wait(lambda: [a for a in _am_alerts(alertmanager) if a["labels"].get("target") == "ost2"], 75)
        assert got, f"no alert within 75 s; loop: {loop.status()}"
        lat = [x for x in loop.alerter.latencies if x["key"] == "fail_slow_target:ost2"]
        accepted_after_fault = (lat[0]["accepted_ns"] - fault_ns) / 1e9
        onset_err = (lat[0]["onset_ns"] - fault_ns) / 1e9
        print(
            f"fault start -> alert accepted by Alertmanager: {accepted_after_fault:.1f} s "
            f"(detection period {cfg.detect_period_s:g} s, shortest window {cfg.failslow_windows_s[0]:g} s; "
            f"detected onset {onset_err:+.0f} s from the injected start; cycle {loop.last['duration_s']} s)"
        )
        assert 0 < accepted_after_fault <= 60
        assert abs(onset_err) <= 2
        assert [a["labels"]["severity"] for a in got] == ["critical"]
        # no other alert (healthy targets, forwarders, the 10 MB/s target)
        assert {a["labels"].get("target") or a["labels"].get("node") for a in _am_alerts(alertmanager)} == {"ost2"}
        # the fault clears at s=40: the alert resolves within the shortest window + a period
        assert _wait(
            lambda: not [a for a in _am_alerts(alertmanager) if a["labels"].get("target") == "ost2"],
            max(5.0, t0 / 1e9 + clear_s + 5 + 2 * cfg.detect_period_s + 5 - time.time()),
        )
        resolved_after = time.time() - (t0 / 1e9 + clear_s)
        print(f"fault cleared -> alert resolved after {resolved_after:.1f} s")
        n = store.query("SELECT count() AS n FROM anomalies WHERE key = 'fail_slow_target:ost2' AND active = 1")
        assert int(n[0]["n"]) >= 1
    finally:
        stop.set()
        loop.stop()
        feeder.join(5)
