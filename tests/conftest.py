"""Fixtures shared by every test folder, and the marks that say what a test needs.

Tests are packages (``tests/__init__.py``, ``tests/<folder>/__init__.py``); their helper modules
(forwarder_testkit, pharos_synthetic_jobs, ...) are imported by bare name from the folders listed
in pyproject's ``[tool.pytest.ini_options] pythonpath``, and those of tests/ (pharos_testkit,
mpi_testkit, slurm_testkit) from tests/, which this file appends to ``sys.path``: appended, not
prepended, since its package tests/darshan would shadow the darshan library.

Shared fixtures, defined here once:

- ``store``: one real chDB store per test module (migrated; closed at the module's end, since
  chDB allows one open data directory per process). A folder says what it starts with by
  overriding ``store_builder`` (tests/analytics, tests/api: the synthetic jobs; tests/dashboards:
  those plus the dashboards' rows); tests/pipeline overrides ``store`` itself with one store per
  test in the test's own state dir (its pipeline opens that directory too).
- ``app`` (the API on ``store``), ``client`` (a TestClient on ``app``), ``api_url`` (``app``
  served by uvicorn on a free loopback port): module scope; a test module overrides ``app`` when
  it needs other settings or routers, and ``client`` / ``api_url`` follow.
- ``monkeypatch_module``: a module-scoped MonkeyPatch (environment for module-scoped fixtures).
- ``kafka_broker``: one real Kafka broker per test session (KRaft, loopback, free ports, tmp
  data dir), used by the pipeline and forwarding-layer tests; each test makes its own topics.
  Skips only when Java is missing; missing jars are fetched with pipeline/kafka/fetch.sh.

Marks (``pytest_collection_modifyitems``): a test is marked by what it needs, from the fixtures it
uses (``FIXTURE_NEEDS``) and the external programs it runs (``TEST_NEEDS``, found by auditing a
run), and ``slow`` (``SLOW``: pure but over a minute); a test with no such mark and no ``e2e`` /
``root`` / ``evaluation`` mark gets ``unit``: pure Python plus the embedded chDB, no apt package,
no Kafka, no root, no FUSE, no external server. ``make test-unit`` runs ``-m unit``.

Skips cannot hide in CI: under ``PHAROS_REQUIRE_ALL=1`` (``make test`` sets it unless told
otherwise, and CI runs ``make test``) every skipped test is reported as failed with its reason,
since CI's machine has root, FUSE, fio, Java and the Darshan corpus; the session always ends
with a one-line skip count.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

_TESTS = Path(__file__).resolve().parent
if str(_TESTS) not in sys.path:
    sys.path.append(str(_TESTS))

from pharos_testkit import open_migrated_store, served, start_kafka_broker  # noqa: E402

from pharos_core.settings import Settings  # noqa: E402
from pharos_core.store import Store  # noqa: E402
from pharos_pipeline.broker import KafkaBroker  # noqa: E402

#: What a test needs, as marks (registered in pyproject.toml), from the fixtures it uses.
FIXTURE_NEEDS = {
    "kafka_broker": "kafka",
    "binaries": "fuse",  # tests/forwarder: root, /dev/fuse, fio, the release pharos-fwd / pharos-mount
    "fwd_binaries": "fuse",  # tests/control: the same daemons and mounts
    "alertmanager": "servers",  # the real Alertmanager (Debian prometheus-alertmanager)
    "compose": "tools",  # docker-compose config
}

#: What a test needs beyond its fixtures: the programs it runs that `make setup` installs (apt, npm)
#: or that need the network, found by auditing the processes each test spawns (sys.addaudithook on
#: subprocess.Popen, children included). Keys: a module, or a test in it (every parametrisation),
#: relative to tests/.
TEST_NEEDS = {
    "api/test_report_chromium.py": "tools",  # chromium (playwright) renders the report
    "dashboards/test_dashboards_generated.py::test_dashboards_type_check_against_grafana_schema": "tools",  # node
    "dashboards/test_dashboards_generated.py::test_type_check_rejects_what_grafana_would_not_read": "tools",  # node
    "dashboards/test_dashboards_generated.py::test_health_queries_parse_as_promql": "tools",  # promtool
    "dashboards/test_dashboards_generated.py::test_deploy_scrape_config_is_valid_and_has_the_jobs_the_health_dashboard_reads": "tools",  # promtool
    "deploy/test_compose_file.py::test_required_variables_must_be_set": "tools",  # docker-compose
    "deploy/test_deploy_configs.py::test_promtool_accepts_the_prometheus_config": "tools",  # promtool
    "deploy/test_deploy_configs.py::test_amtool_accepts_the_alertmanager_config": "tools",  # amtool
    "deploy/test_deploy_configs.py::test_alertmanager_takes_pharos_alerts_with_the_deploy_config": "servers",
    "deploy/test_dockerfile.py::test_every_workspace_member_is_in_the_rust_context": "tools",  # cargo metadata --locked
    "deploy/test_dockerfile.py::test_the_python_stage_builds_from_uv_lock": "tools",  # uv sync of a clean copy
    "pipeline/test_kafka_cluster.py": "kafka",  # its own three-node Kafka cluster
}

#: Pure tests too slow for the inner loop (over a minute each on 2 cores; `make test` runs them).
SLOW = {
    "analytics/test_pattern_everywhere.py::test_every_view_agrees": "every Darshan log of the corpus, 1,000,000 DXT segments",
    "analytics/test_pattern_everywhere.py::test_diagnose_text_shows_the_pattern_and_its_detail": "the same store",
    "api/test_schemathesis.py::test_api_conforms_to_its_schema": "schemathesis fuzzes every route",
}

#: Marks that keep a test out of ``unit``.
NOT_UNIT = {"kafka", "fuse", "servers", "tools", "slow", "e2e", "root", "evaluation"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        needs = {FIXTURE_NEEDS[f] for f in getattr(item, "fixturenames", ()) if f in FIXTURE_NEEDS}
        try:
            rel = item.path.resolve().relative_to(_TESTS).as_posix()
        except ValueError:
            rel = ""
        for key in (rel, f"{rel}::{getattr(item, 'originalname', item.name)}"):
            if key in TEST_NEEDS:
                needs.add(TEST_NEEDS[key])
            if key in SLOW:
                needs.add("slow")
        for mark in sorted(needs):
            item.add_marker(getattr(pytest.mark, mark))
        if not NOT_UNIT.intersection(m.name for m in item.iter_markers()):
            item.add_marker(pytest.mark.unit)


# --- the chDB store and the API on it ---------------------------------------------------------


@pytest.fixture(scope="session")
def store_builder() -> Callable[[Path], Store]:
    """How ``store`` is made from a fresh state dir: migrated and empty here; a folder's
    conftest.py overrides this to start with rows of its own."""
    return lambda state_dir: open_migrated_store(Settings(state_dir=state_dir))


@pytest.fixture(scope="module")
def store(request, tmp_path_factory, store_builder) -> Store:
    """A real chDB store per test module (``store_builder``), closed at the module's end (chDB
    allows one open data directory per process)."""
    s = store_builder(tmp_path_factory.mktemp(request.path.parent.name))
    yield s
    s.close()


@pytest.fixture(scope="module")
def app(store, tmp_path_factory):
    """The API (``pharos_api.app.create_app``) on ``store``, state in the session's tmp dir."""
    from pharos_api.app import create_app

    return create_app(store, Settings(state_dir=tmp_path_factory.getbasetemp(), api_auth="none"))


@pytest.fixture(scope="module")
def client(app):
    """A TestClient on ``app`` (its lifespan runs)."""
    with TestClient(app) as c:
        yield c


@pytest.fixture(scope="module")
def api_url(app):
    """``app`` served by uvicorn on a free loopback port, in a thread."""
    with served(app) as url:
        yield url


@pytest.fixture(scope="module")
def monkeypatch_module():
    """A MonkeyPatch undone at the module's end (for module-scoped fixtures)."""
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


# --- the real Kafka broker --------------------------------------------------------------------


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory) -> KafkaBroker:
    broker = start_kafka_broker(lambda: tmp_path_factory.mktemp("kafka"), tmp_path_factory.mktemp("pharos-state"))
    yield broker
    broker.stop()


# --- skips cannot hide in CI ------------------------------------------------------------------

REQUIRE_ALL = os.environ.get("PHAROS_REQUIRE_ALL", "0") == "1"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under PHAROS_REQUIRE_ALL=1 a skip (marker, fixture or test body) becomes a failure."""
    outcome = yield
    rep = outcome.get_result()
    if REQUIRE_ALL and rep.skipped and not hasattr(rep, "wasxfail"):
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        rep.outcome = "failed"
        rep.longrepr = (
            f"skipped under PHAROS_REQUIRE_ALL=1 (CI's setting, where every suite can run): {reason}\n"
            "Install what is missing (make setup) or run with PHAROS_REQUIRE_ALL=0 to allow skips."
        )
        rep.user_properties.append(("required_but_skipped", reason))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    skipped = len(terminalreporter.stats.get("skipped", []))
    converted = sum(
        1
        for rep in terminalreporter.stats.get("failed", []) + terminalreporter.stats.get("error", [])
        if any(k == "required_but_skipped" for k, _ in getattr(rep, "user_properties", []))
    )
    mode = "PHAROS_REQUIRE_ALL=1: skips fail" if REQUIRE_ALL else "PHAROS_REQUIRE_ALL=0: skips allowed"
    terminalreporter.write_line(
        f"pharos skip check ({mode}): {skipped} skipped, {converted} required test(s) skipped and failed"
    )
