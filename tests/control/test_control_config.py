"""One set-up of the configuration sources for Settings, DiagnosisConfig and ControlConfig
(pharos_core.settings.PharosSettings), the metadata-heavy rate shared by the diagnosis and DFRA,
the mount's node order that keeps reserved forwarding nodes out of its default mapping, the
forwarding layer's site key and admin token (made by `pharos up`, sent by the control loop), and
the PeriodicLoop of the detection and control loops. Pure logic."""

from __future__ import annotations

import logging
import stat
import threading
import time

import httpx
import pytest

from pharos_analytics.alerts import DetectionLoop
from pharos_analytics.control.config import ControlConfig
from pharos_analytics.control.dfra import JobHistory, NodeState, classify, decide
from pharos_analytics.control.loop import ControlLoop
from pharos_analytics.diagnosis_config import DiagnosisConfig
from pharos_analytics.periodic import PeriodicLoop
from pharos_api.cli import fwd_auth_args, mount_node_index, mount_node_order, mount_reserved
from pharos_core.settings import PharosSettings, Settings


def test_one_source_setup_reads_each_table_and_env_wins(tmp_path, monkeypatch):
    f = tmp_path / "p.toml"
    f.write_text("fwd_nodes = 6\n[diagnosis]\nphase_gap_s = 4\n[control]\ndry_run = true\nperiod_s = 3\n")
    monkeypatch.setenv("PHAROS_CONFIG", str(f))
    assert all(issubclass(c, PharosSettings) for c in (Settings, DiagnosisConfig, ControlConfig))
    assert (Settings().fwd_nodes, DiagnosisConfig().phase_gap_s, ControlConfig().dry_run) == (6, 4, True)
    assert ControlConfig().period_s == 3
    monkeypatch.setenv("PHAROS_CONTROL_PERIOD_S", "7")
    monkeypatch.setenv("PHAROS_FWD_NODES", "5")
    assert (ControlConfig().period_s, Settings().fwd_nodes) == (7, 5)  # environment over file
    assert ControlConfig(period_s=9).period_s == 9  # arguments over environment
    monkeypatch.setenv("PHAROS_CONFIG", str(tmp_path / "missing.toml"))
    assert (Settings().fwd_nodes, DiagnosisConfig().phase_gap_s, ControlConfig().dry_run) == (5, 1.0, False)


def test_a_file_without_a_table_leaves_that_class_its_defaults(tmp_path, monkeypatch):
    """A settings file with only [control] (the dry-run switch an admin flips) must not stop
    `pharos serve`: DiagnosisConfig keeps its defaults instead of raising KeyError."""
    f = tmp_path / "p.toml"
    f.write_text("[control]\ndry_run = true\n")
    monkeypatch.setenv("PHAROS_CONFIG", str(f))
    assert DiagnosisConfig().phase_gap_s == DiagnosisConfig.model_fields["phase_gap_s"].default
    assert ControlConfig().dry_run is True
    assert Settings().fwd_nodes == Settings.model_fields["fwd_nodes"].default
    f.write_text("[diagnosis]\nphase_gap_s = 4\n")
    assert (DiagnosisConfig().phase_gap_s, ControlConfig().dry_run) == (4, False)


def test_metadata_heavy_rate_is_the_diagnosis_threshold(monkeypatch):
    assert "dfra_metadata_heavy_ops_s" not in ControlConfig.model_fields
    h = JobHistory(1, ["a"], "1-1", 1e6, 100, 5000, 1500.0, 1, 1e6, 1, span_s=10.0)
    cfg = ControlConfig(reserved_nodes=["fwd1"])
    assert classify(h, cfg, DiagnosisConfig())[0] == "dedicated"  # 1,500 >= 1,000 ops/s (Beacon)
    assert classify(h, cfg, DiagnosisConfig(metadata_rate_ops_s=2000))[0] == "default"
    monkeypatch.setenv("PHAROS_DIAGNOSIS_METADATA_RATE_OPS_S", "2000")  # read when no config is given
    assert classify(h, cfg)[0] == "default"
    d = decide("j", h, [NodeState("fwd0"), NodeState("fwd1", reserved=True)], "fwd0", 1e8, cfg)
    assert (d.klass, d.nodes) == ("default", ["fwd0"])


def test_mount_default_node_is_never_a_reserved_one():
    assert ControlConfig.model_fields["reserved_nodes"].default == ["fwd2", "fwd3"]
    assert Settings.model_fields["fwd_nodes"].default == 4  # pharos up: 2 default + 2 reserved daemons
    s = Settings(fwd_nodes=4)
    assert mount_node_order(s) == ["fwd0", "fwd1", "fwd2", "fwd3"]
    # pharos-mount's default is nodes[index mod len]: fwd0, fwd1, fwd0, ... never fwd2/fwd3
    defaults = [mount_node_order(s)[mount_node_index(Settings(fwd_nodes=4, compute_node_index=i))] for i in range(5)]
    assert defaults == ["fwd0", "fwd1", "fwd0", "fwd1", "fwd0"]
    assert mount_node_order(Settings(fwd_nodes=2)) == ["fwd0", "fwd1"]
    # pharos-mount --reserved (PHAROS_MOUNT_RESERVED) gets only nodes that exist
    assert mount_reserved(s) == ["fwd2", "fwd3"] and mount_reserved(Settings(fwd_nodes=3)) == ["fwd2"]
    assert mount_reserved(Settings(fwd_nodes=2)) == []
    # DFRA's static mapping: blocks of consecutive compute nodes per forwarding node (Sunway: 512)
    blocks = [
        mount_node_order(s)[
            mount_node_index(Settings(fwd_nodes=4, compute_node_index=i, compute_nodes_per_forwarding_node=2))
        ]
        for i in range(5)
    ]
    assert blocks == ["fwd0", "fwd0", "fwd1", "fwd1", "fwd0"]


def test_mount_order_puts_reserved_nodes_last(monkeypatch):
    monkeypatch.setenv("PHAROS_CONTROL_RESERVED_NODES", '["fwd0"]')
    s = Settings(fwd_nodes=3, compute_node_index=1)
    assert mount_node_order(s) == ["fwd1", "fwd2", "fwd0"] and mount_node_index(s) == 1  # default fwd2
    monkeypatch.setenv("PHAROS_CONTROL_RESERVED_NODES", '["fwd0", "fwd1", "fwd2"]')
    assert mount_node_index(Settings(fwd_nodes=3, compute_node_index=4)) == 1  # all reserved: all nodes
    assert mount_reserved(Settings(fwd_nodes=3)) == []  # pharos-mount refuses to have no shared node


def test_fwd_secrets_made_once_private_and_sent_by_the_control_loop(tmp_path):
    s = Settings(state_dir=tmp_path / "state")
    s.ensure_fwd_secrets()
    key, token = s.fwd_key_path, s.fwd_admin_token_path
    assert (key, token) == (tmp_path / "state" / "fwd.key", tmp_path / "state" / "fwd-admin.token")
    for f in (key, token):
        assert stat.S_IMODE(f.stat().st_mode) == 0o600 and len(f.read_text().strip()) == 64
    assert key.read_text() != token.read_text()
    made = key.read_text()
    s.ensure_fwd_secrets()  # never replaced: the running daemons and mount hold it
    assert key.read_text() == made
    assert fwd_auth_args(s) == ["--key-file", str(key), "--admin-token-file", str(token)]
    # A configured file is never made: every node of a site must hold the same one.
    site = Settings(state_dir=tmp_path / "s2", fwd_key_file=tmp_path / "k", fwd_admin_token_file=tmp_path / "t")
    site.ensure_fwd_secrets()
    assert not (tmp_path / "k").exists() and not (tmp_path / "t").exists()
    assert site.fwd_admin_headers() == {}

    # The control loop's admin calls carry the token: [control] admin_token_file, else the settings'.
    seen = []

    def answer(req: httpx.Request) -> httpx.Response:
        seen.append(req.headers.get("authorization"))
        return httpx.Response(200, json={})

    client = httpx.Client(transport=httpx.MockTransport(answer))
    own = tmp_path / "own.token"
    own.write_text("own-token\n")
    for cfg, want in ((ControlConfig(), token.read_text().strip()), (ControlConfig(admin_token_file=own), "own-token")):
        loop = ControlLoop(None, s, lambda cfg=cfg: cfg, client=client)
        assert loop._http("PUT", "http://127.0.0.1:1/mapping", {"jobs": {}}) == ({}, "")
        assert seen.pop() == f"Bearer {want}"


class Flaky(PeriodicLoop):
    thread_name = "flaky-test"
    cycle_name = "flaky"

    def __init__(self, period_s: float) -> None:
        super().__init__(period_s, logging.getLogger("pharos.test.flaky"))
        self.ran = threading.Event()

    def run_once(self) -> dict:
        self.cycles += 1
        if self.cycles == 1:
            raise RuntimeError("first cycle fails")
        if self.cycles >= 3:
            self.ran.set()
        return {}


def test_periodic_loop_survives_a_failing_cycle_and_stops(caplog):
    loop = Flaky(0.01)
    with caplog.at_level(logging.ERROR, logger="pharos.test.flaky"):
        assert loop.start() is loop and loop.start() is loop  # one thread only
        assert loop.ran.wait(5)
        loop.stop(5)
    assert not loop._thread.is_alive() and loop._thread.name == "flaky-test"
    assert [r.getMessage() for r in caplog.records] == ["flaky cycle failed"]
    n = loop.cycles
    time.sleep(0.05)
    assert loop.cycles == n


def test_period_zero_starts_no_thread():
    loop = Flaky(0)
    loop.start()
    assert loop._thread is None
    loop.stop()


@pytest.mark.parametrize("cls", [DetectionLoop, ControlLoop])
def test_both_server_loops_are_periodic_loops(cls):
    assert issubclass(cls, PeriodicLoop) and cls.run_once is not PeriodicLoop.run_once
    assert {DetectionLoop: "sysdiag", ControlLoop: "control"}[cls] == cls.thread_name
