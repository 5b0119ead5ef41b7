"""docker-compose.yml as Debian's docker-compose (1.29.2) reads it: the services, what they are
built from, what they mount, their ports, health checks and the configuration they hand to each
other. The Pharos variables are parsed by Pharos's own settings classes."""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml
from deploy_testkit import COMPOSE_FILE, REPO, REQUIRED_ENV, dockerfile_stages, render_compose, run_compose

SERVICES = {
    "kafka",
    "pharos-topics",
    "clickhouse",
    "pharos-server",
    "pipeline",
    "prometheus",
    "alertmanager",
    "grafana",
}
#: Services that run once and exit (no health check, no restart).
ONE_SHOT = {"pharos-topics"}
#: (service, container port) the compute and forwarding nodes must reach: the only ports not on loopback.
HOST_FACING = {("kafka", 9094), ("pharos-server", 8400)}


def env_of(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(e.split("=", 1) for e in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}


def ports_of(service: dict) -> list[tuple[str, int, int]]:
    """(host ip, host port, container port) of each published port, short or long syntax."""
    out = []
    for p in service.get("ports") or []:
        if isinstance(p, dict):
            out.append((p.get("host_ip", "0.0.0.0"), int(p["published"]), int(p["target"])))
            continue
        parts = str(p).split("/")[0].split(":")
        ip = parts[0] if len(parts) == 3 else "0.0.0.0"
        out.append((ip, int(parts[-2]), int(parts[-1])))
    return out


def bind_mounts(service: dict) -> list[tuple[str, str]]:
    """(source, target) of each bind mount (absolute source after docker-compose config)."""
    out = []
    for v in service.get("volumes") or []:
        if isinstance(v, dict):
            if v.get("type") == "bind":
                out.append((v["source"], v["target"]))
            continue
        src, _, rest = str(v).partition(":")
        if src.startswith(("/", ".")):
            out.append((src, rest.split(":")[0]))
    return out


def named_volumes(service: dict) -> list[str]:
    out = []
    for v in service.get("volumes") or []:
        src = v.get("source") if isinstance(v, dict) and v.get("type") == "volume" else None
        if src is None and isinstance(v, str) and not v.startswith(("/", ".")):
            src = v.split(":")[0]
        if src:
            out.append(src)
    return out


def test_docker_compose_accepts_the_file_with_the_expected_services(compose):
    assert set(compose["services"]) == SERVICES
    res = run_compose("config", "--services")
    assert res.returncode == 0, res.stderr
    assert set(res.stdout.split()) == SERVICES
    assert compose["services"]["pipeline"]["profiles"] == ["scale-out"]


@pytest.mark.parametrize("var", sorted(REQUIRED_ENV))
def test_required_variables_must_be_set(var):
    res = run_compose("config", **{var: None})
    assert res.returncode != 0, f"docker-compose config accepted the file without {var}"
    assert var in res.stderr


def test_host_daemons_run_on_the_hosts_not_in_compose(compose):
    """The agent, the FUSE client and the forwarding daemons belong on the nodes: nothing here
    needs the host's kernel, PID namespace or /dev/fuse."""
    text = COMPOSE_FILE.read_text()
    for svc_name, svc in compose["services"].items():
        command = " ".join(svc.get("command") or []) if isinstance(svc.get("command"), list) else svc.get("command")
        assert not re.search(r"pharos[ -](agent|fwd|mount)\b", command or ""), svc_name
        assert not svc.get("privileged"), svc_name
        assert svc.get("pid") != "host", svc_name
        assert not svc.get("devices"), svc_name
        assert not any(src in ("/sys", "/proc", "/dev/fuse") for src, _ in bind_mounts(svc)), svc_name
    assert "9094" in text and "8400" in text  # the header says where hosts connect


def test_every_build_has_its_dockerfile_and_target(compose):
    built = {n: s["build"] for n, s in compose["services"].items() if "build" in s}
    assert set(built) == {"pharos-topics", "pharos-server", "pipeline"}
    for name, build in built.items():
        context = Path(build["context"])
        dockerfile = context / build.get("dockerfile", "Dockerfile")
        assert dockerfile.is_file(), f"{name}: {dockerfile} missing"
        assert dockerfile.resolve() == (REPO / "Dockerfile").resolve()
        assert build.get("target") in dockerfile_stages(dockerfile), f"{name}: no stage {build.get('target')}"


def test_every_mounted_file_is_in_the_repository(compose):
    declared = set(compose.get("volumes") or {})
    mounts = 0
    for name, svc in compose["services"].items():
        for src, target in bind_mounts(svc):
            path = Path(src)
            assert path.exists(), f"{name} mounts {src} -> {target}, which does not exist"
            assert path.resolve().is_relative_to(REPO), f"{name} mounts {src} from outside the repository"
            mounts += 1
        for vol in named_volumes(svc):
            assert vol in declared, f"{name}: volume {vol} not declared"
    assert mounts >= 7


def test_images_are_pinned(compose):
    for name, svc in compose["services"].items():
        if "build" in svc:
            continue
        image = svc["image"]
        repo, _, tag = image.rpartition(":")
        assert repo and tag and tag != "latest" and re.search(r"\d+\.\d+", tag), f"{name}: {image} is not pinned"


def test_every_service_has_a_health_check_and_a_restart_policy(compose):
    stages = dockerfile_stages()
    for name, svc in compose["services"].items():
        hc = svc.get("healthcheck") or {}
        if name in ONE_SHOT:
            assert svc.get("restart") in (None, "no"), name
            continue
        assert svc.get("restart") in ("unless-stopped", "always"), f"{name}: restart policy {svc.get('restart')}"
        if hc:
            assert not hc.get("disable"), name
            assert hc.get("test") and hc["test"][0] in ("CMD", "CMD-SHELL"), name
        else:  # built here: the image's own HEALTHCHECK
            stage = stages[svc["build"]["target"]]
            assert any(i == "HEALTHCHECK" for i, _ in stage), f"{name}: no health check in compose or its image"


def test_only_the_host_facing_ports_leave_loopback(compose):
    seen = set()
    for name, svc in compose["services"].items():
        for ip, _host_port, port in ports_of(svc):
            seen.add((name, port))
            if (name, port) not in HOST_FACING:
                assert ip == "127.0.0.1", f"{name}:{port} is published on {ip}, not loopback"
    assert seen >= HOST_FACING
    # The API leaves loopback only with token authentication (pharos serve refuses otherwise).
    assert env_of(compose["services"]["pharos-server"])["PHAROS_API_AUTH"] == "token"
    # A site publishes them on its nodes' network.
    narrowed = render_compose(KAFKA_EXTERNAL_BIND="10.1.2.3", PHAROS_API_BIND="10.1.2.3")
    for name, port in HOST_FACING:
        assert ("10.1.2.3", port, port) in ports_of(narrowed["services"][name])


def test_kafka_listeners_for_the_stack_and_for_the_hosts(compose):
    env = env_of(compose["services"]["kafka"])
    listeners = dict(x.split("://") for x in env["KAFKA_LISTENERS"].split(","))
    advertised = dict(x.split("://") for x in env["KAFKA_ADVERTISED_LISTENERS"].split(","))
    protocols = dict(x.split(":") for x in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    assert set(listeners) == set(protocols) == {"PLAINTEXT", "CONTROLLER", "EXTERNAL"}
    assert advertised["EXTERNAL"] == f"{REQUIRED_ENV['KAFKA_EXTERNAL_HOST']}:9094"
    assert advertised["PLAINTEXT"] == "kafka:9092"
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
    assert compose["services"]["pharos-topics"]["command"] == ["pharos", "topics"]


def test_pharos_settings_from_the_compose_environment(compose, monkeypatch, tmp_path):
    """The Pharos containers' variables and pharos.toml, read by Pharos's settings classes, name
    the stack's Kafka, ClickHouse and Alertmanager; the control loop stays a dry run until the
    site lists its hosts."""
    from pharos_analytics.control.config import ControlConfig
    from pharos_analytics.diagnosis_config import DiagnosisConfig
    from pharos_core.settings import Settings

    services = compose["services"]
    for name in ("pharos-server", "pharos-topics", "pipeline"):
        assert env_of(services[name]) == env_of(services["pharos-server"]), name
    env = env_of(services["pharos-server"])
    config_dir = {t: Path(s) for s, t in bind_mounts(services["pharos-server"])}["/etc/pharos"]
    assert env["PHAROS_CONFIG"] == "/etc/pharos/pharos.toml"
    for k in [k for k in os.environ if k.startswith("PHAROS_")]:
        monkeypatch.delenv(k)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("PHAROS_CONFIG", str(config_dir / "pharos.toml"))  # where the container has it
    s = Settings()
    assert s.kafka_bootstrap == "kafka:9092"
    assert s.exposure_error() is None
    assert s.topic_replication_factor == 1 and s.topic_partitions == 4
    url = urlparse(s.clickhouse_url)
    ch = env_of(services["clickhouse"])
    assert (url.hostname, url.port, url.username, url.password, url.path.strip("/")) == (
        "clickhouse",
        8123,
        ch["CLICKHOUSE_USER"],
        ch["CLICKHOUSE_PASSWORD"],
        ch["CLICKHOUSE_DB"],
    )
    am = urlparse(DiagnosisConfig().alertmanager_url)
    assert am.hostname in services and am.port == 9093
    control = ControlConfig()
    assert control.dry_run is True and control.mount_admin_urls == [] and control.fwd_admin_urls == {}
    # a site's own folder (PHAROS_CONFIG_DIR) with its hosts, as the committed file's comments show them
    site = tmp_path / "site"
    site.mkdir()
    (site / "pharos.toml").write_text(
        (config_dir / "pharos.toml")
        .read_text()
        .replace("dry_run = true", "dry_run = false")
        .replace("mount_admin_urls = []", 'mount_admin_urls = ["http://cn001:7501"]')
        .replace("fwd_admin_urls = {}", 'fwd_admin_urls = { fwd0 = "http://fn01:7401" }')
    )
    rendered = render_compose(PHAROS_CONFIG_DIR=str(site))
    assert {t: s for s, t in bind_mounts(rendered["services"]["pharos-server"])}["/etc/pharos"] == str(site)
    monkeypatch.setenv("PHAROS_CONFIG", str(site / "pharos.toml"))
    control = ControlConfig()
    assert not control.dry_run
    assert control.mount_admin_urls == ["http://cn001:7501"] and control.fwd_admin_urls == {"fwd0": "http://fn01:7401"}


def test_grafana_gets_what_the_provisioning_reads(compose):
    from pharos_dashboards.grafana import PLUGIN_VERSION

    grafana = compose["services"]["grafana"]
    env = env_of(grafana)
    mounts = dict((t, Path(s)) for s, t in bind_mounts(grafana))
    prov = REPO / "dashboards" / "provisioning"
    for kind in ("datasources", "dashboards", "alerting"):
        assert mounts[f"/etc/grafana/provisioning/{kind}"].resolve() == prov / kind
    for f in prov.rglob("*.yaml"):
        for var in re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", f.read_text()):
            assert env.get(var), f"{f.name} reads ${{{var}}}, which grafana's environment does not set"
    provider = yaml.safe_load((prov / "dashboards" / "pharos.yaml").read_text())["providers"][0]
    assert mounts[provider["options"]["path"]].resolve() == REPO / "dashboards" / "json"
    assert env["PHAROS_CLICKHOUSE_HOST"] in compose["services"]
    assert env["PHAROS_CLICKHOUSE_USER"] == "grafana"  # the read-only user of deploy/clickhouse/initdb
    assert env["PHAROS_CLICKHOUSE_PASSWORD"] == env_of(compose["services"]["clickhouse"])["GRAFANA_CLICKHOUSE_PASSWORD"]
    assert env["GF_PLUGINS_PREINSTALL_SYNC"] == f"grafana-clickhouse-datasource@{PLUGIN_VERSION}"


def test_prometheus_scrapes_pharos_and_alerts_to_the_stack(compose):
    services = compose["services"]
    mounts = dict((t, Path(s)) for s, t in bind_mounts(services["prometheus"]))
    cfg = yaml.safe_load(mounts["/etc/prometheus/prometheus.yml"].read_text())
    targets = {t for job in cfg["scrape_configs"] for sc in job.get("static_configs", []) for t in sc["targets"]}
    api_port = env_of(services["pharos-server"])["PHAROS_API_PORT"]
    assert f"pharos-server:{api_port}" in targets
    am_targets = {t for am in cfg["alerting"]["alertmanagers"] for sc in am["static_configs"] for t in sc["targets"]}
    assert am_targets == {"alertmanager:9093"}
    assert any(p == 9093 for _, _, p in ports_of(services["alertmanager"]))
    am_mounts = dict((t, s) for s, t in bind_mounts(services["alertmanager"]))
    assert "--config.file=/etc/alertmanager/alertmanager.yml" in services["alertmanager"]["command"]
    assert "/etc/alertmanager/alertmanager.yml" in am_mounts


def test_operations_doc_names_the_images_and_services(compose):
    """docs/operations.md says which images and services the stack runs: it must not drift."""
    doc = (REPO / "docs" / "operations.md").read_text()
    for name, svc in compose["services"].items():
        assert f"`{name}`" in doc, f"docs/operations.md does not mention the service {name}"
        if "build" not in svc:
            assert f"`{svc['image']}`" in doc, f"docs/operations.md does not name {svc['image']}"
