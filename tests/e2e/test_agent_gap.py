"""No silent gap when an agent dies (issue 15, item 5), on the real stack: Kafka broker, the eBPF
agent on this kernel, the pipeline on chDB, the API, real fio through `pharos run`.

A 2-rank fio job writes 128 MiB at a bounded rate (about 8 s); its agent is SIGKILLed about 3 s in.
Then: the job's summary is ``complete: false`` with a gap on this host from the dead agent's last
batch (just before the kill) to the job's end, and fewer bytes than fio wrote; `pharos job`
prints the warning; `pharos status` shows the agent ``dead``; `pharos up --detach` starts it
again (only it), `pharos status` shows it running with a fresh heartbeat, and the next job is
complete with exactly fio's bytes. No forwarding layer (the job writes to a local folder): the
agent is what is under test. Bounded: every wait has a deadline, the stack is stopped at the end.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import httpx
import pytest
from pharos_testkit import LIVE_STACK_MARKS, pharos_run, running_stack

from pharos_analytics.coverage import producer_pid
from pharos_api import cli as cli_mod
from pharos_api import stack
from pharos_api.demo import fio_totals, wait_for_summary

pytestmark = LIVE_STACK_MARKS

MiB = 1 << 20
ENV = {  # nothing else running in the server: the control loop and detection are not under test
    "PHAROS_CONTROL_PERIOD_S": "0",
    "PHAROS_DIAGNOSIS_DETECT_PERIOD_S": "0",
}


def fio(data: Path, size_mib: int, rate: str) -> list[str]:
    return [
        "sh",
        "-c",
        f"exec fio --name=gap --ioengine=psync --rw=write --bs=1m --size={size_mib}m --rate={rate} --fallocate=none --end_fsync=1 "
        f"--output-format=json --disk_util=0 --filename={data}/f.$PHAROS_RANK",
    ]


def cli(settings, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`pharos ARGS` as a user types it: its own process, the stack's settings as PHAROS_* variables."""
    env = dict(os.environ, **stack.settings_env(settings))
    return subprocess.run(
        [sys.executable, "-m", "pharos_api.cli", *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def components(settings) -> dict[str, dict]:
    """What `pharos status --json` says of the components, computed in this process (polled)."""
    producers = httpx.get(f"{settings.api_url}/v1/producers", timeout=30).json()["items"]
    return {c["name"]: c for c in stack.status(settings, producers)}


def written(d: Path) -> int:
    return sum(f.stat().st_size for f in d.glob("f.*"))


def ts(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    with running_stack(tmp_path_factory.mktemp("gap"), "pharos-gap", ENV, fwd_nodes=0, run_hint=False) as s:
        yield s


def test_killed_agent_gap_status_restart_next_job_complete(live, tmp_path):
    settings, host = live, socket.gethostname()
    t0 = time.monotonic()

    def lap(what: str) -> None:
        print(f"[gap] {time.monotonic() - t0:5.1f} s: {what}")

    job1, job2 = f"gap-killed-{os.getpid()}", f"gap-after-{os.getpid()}"
    (tmp_path / "d1").mkdir()
    (tmp_path / "d2").mkdir()

    # 1. 2 ranks x 64 MiB at 8 MiB/s each (~8 s); SIGKILL the agent ~3 s into the writing
    agent_pid = stack.pid_of(settings, "agent")
    assert agent_pid
    argv, env = pharos_run(settings, job1, fio(tmp_path / "d1", 64, "8m"), ranks=2, output_dir=tmp_path / "o1")
    run = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    # ~3 s of writing: 48 of the 128 MiB written (pharos run may start slowly); no fallocate, so
    # the files grow as fio writes
    deadline = time.monotonic() + 60
    while written(tmp_path / "d1") < 48 * MiB and time.monotonic() < deadline and run.poll() is None:
        time.sleep(0.1)
    assert run.poll() is None, "the job ended before the agent could be killed"
    killed_at = time.time()
    os.kill(agent_pid, signal.SIGKILL)
    os.waitpid(agent_pid, 0)  # our child (stack.start): reap it, as init would
    assert run.wait(timeout=60) == 0, run.stderr.read()
    fio1 = fio_totals([tmp_path / "o1" / f"rank_{r}.out" for r in range(2)])
    assert fio1["bytes_written"] == 128 * MiB

    lap("job 1 done")
    # 2. the job is incomplete, with the gap where the agent was dead
    s = wait_for_summary(settings.api_url, job1, 0, timeout_s=60)
    assert s is not None and s["state"] == "finished", s
    assert 0 < s["bytes_written"] < fio1["bytes_written"], "the dead agent's share must be missing"
    assert s["complete"] is False, s["gaps"]
    assert s["coverage"]["checked"] == "agents" and host in s["coverage"]["hosts"]
    (gap,) = s["gaps"]
    assert gap["host"] == host and producer_pid(gap["producer"]) == agent_pid
    assert killed_at - 2.5 <= ts(gap["start"]) <= killed_at + 0.1, (killed_at, gap)  # its last batch
    assert ts(gap["end"]) == pytest.approx(ts(s["end"]), abs=1e-3)  # silent to the job's end
    print(
        f"\n[gap] agent {agent_pid} killed at {killed_at:.2f}; job {s['start']} - {s['end']}: "
        f"{s['bytes_written']} of {fio1['bytes_written']} bytes; gap {gap['start']} - {gap['end']}"
    )
    shown = cli(settings, "job", job1)
    assert shown.returncode == 0 and "WARNING: INCOMPLETE" in shown.stdout, shown.stdout

    lap("job 1 incomplete")
    # 3. pharos status: the agent is dead (the rest runs); exit code 1
    st = cli(settings, "status", "--json", timeout=30)
    assert st.returncode == 1
    comps = {c["name"]: c for c in json.loads(st.stdout)["components"]}
    assert comps["agent"]["state"] == "dead" and "gone" in comps["agent"]["detail"], comps["agent"]
    assert all(c["state"] == "running" for n, c in comps.items() if n != "agent"), comps
    human = cli(settings, "status", timeout=30)
    assert "dead" in human.stdout and human.returncode == 1

    # 4. pharos up starts the dead agent again, and only it
    others = {n: c["pid"] for n, c in comps.items() if n != "agent"}
    up = cli(settings, "up", "--detach")
    assert up.returncode == 0, up.stdout + up.stderr
    assert "starting agent (it was dead" in up.stdout, up.stdout
    deadline = time.monotonic() + 30
    while (comps := components(settings))["agent"]["state"] != "running" and time.monotonic() < deadline:
        time.sleep(0.5)
    print(f"[gap] restarted agent: {comps['agent']}")
    assert comps["agent"]["state"] == "running", comps["agent"]
    assert comps["agent"]["pid"] != agent_pid and comps["agent"]["heartbeat_age_s"] <= settings.silence_s
    assert {n: c["pid"] for n, c in comps.items() if n != "agent"} == others

    lap("agent restarted by pharos up")
    # 5. the next job is traced in full, and complete
    argv, env = pharos_run(settings, job2, fio(tmp_path / "d2", 16, "16m"), ranks=2, output_dir=tmp_path / "o2")
    assert subprocess.run(argv, env=env, capture_output=True, timeout=60).returncode == 0
    fio2 = fio_totals([tmp_path / "o2" / f"rank_{r}.out" for r in range(2)])
    s2 = wait_for_summary(settings.api_url, job2, fio2["bytes_written"], timeout_s=60)
    assert s2 is not None and s2["bytes_written"] == fio2["bytes_written"] == 32 * MiB, s2
    assert s2["complete"] is True and s2["gaps"] == [], s2["gaps"]
    # the first job's gap now names the restarted agent as the next one heard
    (gap,) = httpx.get(f"{settings.api_url}/v1/jobs/{job1}", timeout=30).json()["gaps"]
    assert producer_pid(gap["next_producer"]) == comps["agent"]["pid"]

    lap("job 2 complete")
    # 6. the foreground `pharos up` watches the stack: an agent that dies is back within seconds
    log = tmp_path / "up.log"
    env = dict(os.environ, **stack.settings_env(settings))
    with open(log, "w") as out:
        sup = subprocess.Popen([sys.executable, "-m", "pharos_api.cli", "up"], env=env, stdout=out, stderr=out)
    try:
        deadline = time.monotonic() + 60
        while "Press Ctrl-C" not in log.read_text() and time.monotonic() < deadline:
            assert sup.poll() is None, log.read_text()
            time.sleep(0.5)
        pid2 = comps["agent"]["pid"]
        os.kill(pid2, signal.SIGKILL)  # not our child now: init reaps it
        deadline = time.monotonic() + 20 + cli_mod.SUPERVISE_S
        while time.monotonic() < deadline:
            agent = components(settings)["agent"]
            if agent["state"] == "running" and agent["pid"] != pid2:
                break
            time.sleep(0.5)
        assert agent["state"] == "running" and agent["pid"] != pid2, (agent, log.read_text())
        assert "starting agent (it was dead" in log.read_text()
        lap("agent restarted by the foreground pharos up")
    finally:
        sup.send_signal(signal.SIGINT)  # Ctrl-C: the foreground `pharos up` stops the stack
        sup.wait(120)
    lap("stack stopped by Ctrl-C")
    assert all(c["state"] == "stopped" for c in stack.status(settings))
