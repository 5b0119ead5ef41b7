"""`pharos down` stops only its own processes (issue 15, item 7): a pid file is checked against
the process it names (start time, boot id, command line) before any signal. A stale pid file
pointing at an unrelated process (here a `sleep` this test starts, leading its own process group
as the stack's components do) is reported and removed, and the process lives on; a real
component (a binary named like one) is stopped; `pharos status` tells dead from stopped."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pharos_api import stack
from pharos_core.settings import Settings


@pytest.fixture
def settings(tmp_path):
    return Settings(state_dir=tmp_path / "state", fwd_nodes=0)


@pytest.fixture
def sleeper(tmp_path):
    """An unrelated process in a session (and process group) of its own; killed at the end."""
    p = subprocess.Popen(["sleep", "300"], start_new_session=True)
    yield p
    p.kill()
    p.wait()


def alive(p: subprocess.Popen) -> bool:
    return p.poll() is None


def pid_file(settings, name: str) -> Path:
    return settings.state_dir / "run" / f"{name}.pid"


def stale_files(settings, pid: int) -> dict[str, str]:
    """Pid files of every kind of staleness, all naming ``pid`` (not a Pharos process)."""
    ticks = stack.proc_stat(pid)[2]
    return {
        "agent": str(pid),  # an older version's bare pid: the command line decides
        "broker": json.dumps({"pid": pid, "start_ticks": ticks + 1, "boot_id": stack.boot_id()}),  # pid reused
        "serve": json.dumps({"pid": pid, "start_ticks": ticks, "boot_id": "another-boot"}),  # before a reboot
    }


def write(settings, files: dict[str, str]) -> None:
    pid_file(settings, "x").parent.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        pid_file(settings, name).write_text(text)


def test_proc_stat_fields_after_a_command_name_with_spaces_and_parens(tmp_path):
    odd = tmp_path / "a b) c"
    shutil.copy("/bin/sleep", odd)
    p = subprocess.Popen([str(odd), "30"], start_new_session=True)
    try:
        state, pgrp, ticks = stack.proc_stat(p.pid)
        assert state in "RS" and pgrp == p.pid
        assert ticks == int(Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    finally:
        p.kill()
        p.wait()
    assert stack.proc_stat(p.pid) is None


def test_stop_does_not_signal_an_unrelated_process(settings, sleeper):
    write(settings, stale_files(settings, sleeper.pid))
    said = []
    stack.stop(settings, grace_s=2, progress=said.append)
    time.sleep(0.3)
    assert alive(sleeper), "pharos down signalled a process that is not its own"
    assert not list((settings.state_dir / "run").glob("*.pid")), "stale pid files are removed"
    assert len([s for s in said if "stale pid file, not signalling" in s]) == 3, said
    assert any("before a reboot" in s for s in said) and any("another process" in s for s in said), said
    assert any("not Pharos's agent" in s and "sleep 300" in s for s in said), said


def test_pharos_down_command_leaves_it_alone(settings, sleeper):
    write(settings, stale_files(settings, sleeper.pid))
    env = dict(os.environ, PHAROS_STATE_DIR=str(settings.state_dir), PHAROS_FWD_NODES="0")
    r = subprocess.run([sys.executable, "-m", "pharos_api.cli", "down"], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "not signalling" in r.stdout and "Pharos is down" in r.stdout
    time.sleep(0.3)
    assert alive(sleeper)


def test_status_and_identity(settings, sleeper, tmp_path):
    write(settings, stale_files(settings, sleeper.pid))
    rows = {r["name"]: r for r in stack.status(settings)}
    assert {n: r["state"] for n, r in rows.items()} == {
        "broker": "dead",
        "agent": "dead",
        "serve": "dead",
    }
    assert not rows["agent"]["ready"] and "not Pharos's agent" in rows["agent"]["detail"]
    assert stack.pid_of(settings, "agent") is None and not pid_file(settings, "agent").exists()
    assert {r["name"]: r["state"] for r in stack.status(settings)}["agent"] == "stopped"
    assert alive(sleeper)


def test_a_real_component_is_stopped(settings, tmp_path):
    """A process that is the component (the binary `pharos agent` execs, started and recorded as
    `pharos up` does) is found running and stopped, its process group with it."""
    exe = tmp_path / "pharos-agent"
    # a session leader with a child in its group, which then execs "pharos-agent"
    p = subprocess.Popen(["bash", "-c", f"sleep 300 & exec -a {exe} sleep 301"], start_new_session=True)
    deadline = time.monotonic() + 10
    while stack._cmdline(p.pid)[:1] != [str(exe)] and time.monotonic() < deadline:
        time.sleep(0.05)
    group = [q for q in group_of(p.pid) if q != p.pid]
    assert len(group) == 1
    try:
        (settings.state_dir / "run").mkdir(parents=True)
        stack.write_pid_file(settings, "agent", p.pid)
        rec = json.loads(pid_file(settings, "agent").read_text())
        assert rec == {"pid": p.pid, "start_ticks": stack.proc_stat(p.pid)[2], "boot_id": stack.boot_id()}
        assert stack.probe(settings, "agent") == ("running", p.pid, "")
        said = []
        stack.stop_component(settings, "agent", grace_s=5, progress=said.append)
        assert said == [f"stopping agent (pid {p.pid})"]
        assert stack.proc_stat(p.pid) is None  # gone (stop_component reaped its own child)
        deadline = time.monotonic() + 5
        while group_of(p.pid) and time.monotonic() < deadline:  # SIGTERM went to the whole group
            time.sleep(0.05)
        assert not group_of(p.pid)
        assert not pid_file(settings, "agent").exists()
        # it died: a pid file left behind reads as dead, and pharos up would start it again
        stack.write_pid_file(settings, "agent", os.getpid())
        pid_file(settings, "agent").write_text(json.dumps({"pid": p.pid, "start_ticks": 1, "boot_id": stack.boot_id()}))
        state, pid, why = stack.probe(settings, "agent")
        assert (state, pid) == ("dead", p.pid) and "gone" in why
    finally:
        p.kill()
        p.wait()
        for q in group_of(p.pid):
            os.kill(q, 9)


def group_of(pgrp: int) -> list[int]:
    """Live processes of process group ``pgrp`` (zombies left out)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and (st := stack.proc_stat(int(d.name))) and st[1] == pgrp and st[0] != "Z":
            out.append(int(d.name))
    return out


def test_supervisor_restarts_dead_components_with_backoff(tmp_path):
    """The foreground `pharos up`'s supervisor: a dead component is started again; one that does
    not come back (here the agent, whose binary is missing) is retried after 5 s, then 10 s; once
    everything is stopped (`pharos down`), nothing is restarted."""
    settings = Settings(state_dir=tmp_path / "state", fwd_nodes=0, agent_binary=tmp_path / "missing")
    # a running "broker": a process whose command line is the broker's
    broker = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)", "pharos_api.cli", "broker"], start_new_session=True
    )
    gone = subprocess.Popen(["true"])
    gone.wait()
    try:
        write(settings, {"agent": json.dumps({"pid": gone.pid, "start_ticks": 1, "boot_id": stack.boot_id()})})
        stack.write_pid_file(settings, "broker", broker.pid)
        assert [stack.probe(settings, n)[0] for n in ("broker", "agent")] == ["running", "dead"]
        said = []
        sup = stack.Supervisor(settings, progress=said.append)
        assert sup.tick() == [] and sup.retry["agent"][1] == 5.0, said
        assert said[0].startswith("starting agent (it was dead: process")
        assert any("agent did not come back (next try in 5 s)" in s and "make build" in s for s in said), said
        assert stack.probe(settings, "agent")[0] == "stopped"
        n = len(said)
        assert sup.tick() == [] and len(said) == n  # not due yet: no try
        sup.retry["agent"] = (0.0, 5.0)
        assert sup.tick() == [] and sup.retry["agent"][1] == 10.0
        # `pharos down` (the broker stopped too): everything is stopped, nothing is restarted
        stack.stop(settings, grace_s=5)
        assert broker.wait(5) is not None
        sup.retry["agent"] = (0.0, 10.0)
        n = len(said)
        assert sup.tick() == [] and sup.retry == {} and len(said) == n
    finally:
        broker.kill()
        broker.wait()
