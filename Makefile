# Pharos: every target does its own set-up, idempotently. New machine: `make demo`, `make test`.
SHELL := /bin/bash
.DEFAULT_GOAL := help
export PATH := $(HOME)/.cargo/bin:$(HOME)/.local/bin:$(PATH)

STAMPS := build/.stamps
APT_PACKAGES := clang llvm libelf-dev zlib1g-dev pkg-config bpftool libbpf-dev fuse3 libfuse3-dev libcurl4-openssl-dev \
	fio protobuf-compiler cmake libzstd-dev liblz4-dev libssl-dev util-linux procps prometheus-alertmanager mpich libmpich-dev \
	slurmctld slurmd slurm-client munge libslurm-dev chromium docker-compose prometheus bindfs
UV := uv
RUN := $(UV) run --frozen

.PHONY: help setup deps python proto build kafka dashboards demo test test-unit test-forwarder test-agent test-pipeline \
	test-analytics test-api test-dashboards lint evaluate bench down clean

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | expand -t 17

setup: deps python proto build kafka ## Install and build everything (idempotent)

deps: $(STAMPS)/apt ## Debian packages, Java/Maven if missing, uv
	@command -v $(UV) >/dev/null || python3 -m pip install --quiet uv

$(STAMPS)/apt: Makefile
	@mkdir -p $(STAMPS)
	@missing=$$(for p in $(APT_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	command -v java >/dev/null || missing="$$missing openjdk-17-jre-headless"; \
	command -v mvn >/dev/null || missing="$$missing maven"; \
	command -v cargo >/dev/null || missing="$$missing cargo rust-clippy rustfmt"; \
	command -v npm >/dev/null || missing="$$missing nodejs npm"; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  if [ "$$(id -u)" != 0 ]; then echo "make: need root to install:$$missing" >&2; exit 1; fi; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi
	@touch $@

python: deps ## The Python environment from uv.lock
	@$(UV) sync --frozen --quiet

proto: python ## Generate the wire contract's Python code (Rust generates at build)
	@sh pipeline/gen-wire.sh "$(RUN) python"

build: deps build/slurm/pharos_spank.so ## Build the eBPF agent, forwarding daemon, FUSE client (Rust, release) and the Slurm plugin (C)
	@cargo build --release --quiet -p pharos-agent -p pharos-fwd -p pharos-mount

# The Pharos SPANK plugin (agents/slurm), against Debian's slurm/spank.h; libcurl talks to the API.
SPANK_SRC := $(wildcard agents/slurm/*.c)
build/slurm/pharos_spank.so: $(SPANK_SRC) $(wildcard agents/slurm/*.h) $(STAMPS)/apt
	@mkdir -p $(@D)
	@gcc -O2 -g -Wall -Wextra -Werror -Wno-format-truncation -shared -fPIC -o $@ $(SPANK_SRC) -lcurl

kafka: deps ## Fetch the pinned Kafka jars with Maven into build/kafka (git-ignored)
	@bash pipeline/kafka/fetch.sh build/kafka

# Grafana dashboards as code: regenerate the committed JSON, alert rules and provisioning files, then
# type-check the dashboards against @grafana/schema (npm ci of dashboards/package-lock.json, git-ignored node_modules).
dashboards: python ## Regenerate dashboards/ (JSON, alert rules, provisioning) and type-check them (tsc --strict)
	@cd dashboards && $(RUN) python -m pharos_dashboards
	@cd dashboards && lock=$$(sha256sum package-lock.json | cut -d' ' -f1); \
	  [ "$$(cat node_modules/.pharos-lock.sha256 2>/dev/null)" = "$$lock" ] || \
	  { npm ci --no-audit --no-fund --loglevel=error && echo "$$lock" > node_modules/.pharos-lock.sha256; }
	@cd dashboards && node typecheck/check.mjs json

demo: setup ## The main job: stack up, three traced fio jobs, their summaries
	@$(RUN) pharos demo

# CI's setting: every suite can run, so a skipped test fails (PHAROS_REQUIRE_ALL=0 make test allows skips).
PHAROS_REQUIRE_ALL ?= 1
export PHAROS_REQUIRE_ALL

test: setup lint ## All tests: linters, Rust (incl. root eBPF tests), Python (unit + end-to-end); skips fail
	@cargo test --release --quiet --workspace
	@cargo test --release --quiet -p pharos-agent -- --ignored
	@$(RUN) pytest -q -rsfE --durations=25 -m "not evaluation"

# The fast inner loop: no Debian packages, Kafka, root, FUSE or external server; `uv` and `cargo`
# only. Rust: the unit tests (--lib --bins) of the crates that build without Debian packages
# (pharos-attribution, pharos-fwd-proto, pharos-mount: fuser without libfuse), and of pharos-wire
# and pharos-fwd when protoc and cmake are there (their build.rs runs protoc; rdkafka builds
# librdkafka with cmake); not pharos-agent (clang, bpftool, libbpf). Python: the tests marked
# `unit` (tests/conftest.py marks every test by what it needs).
RUST_UNIT_CRATES := -p pharos-attribution -p pharos-fwd-proto -p pharos-mount
WIRE_PY := pipeline/pharos_pipeline/wire/pharos/v1/io_pb2.py

test-unit: $(WIRE_PY) ## Fast loop (< 3 min warm): Rust unit tests + pure-Python tests (-m unit); no apt, Kafka, root, FUSE
	@if command -v protoc >/dev/null && command -v cmake >/dev/null; then crates="$(RUST_UNIT_CRATES) -p pharos-wire -p pharos-fwd"; \
	  else crates="$(RUST_UNIT_CRATES)"; echo "test-unit: protoc or cmake missing: not testing pharos-wire, pharos-fwd (make setup)"; fi; \
	  cargo test --release --quiet --lib --bins $$crates
	@$(RUN) pytest -q -rsfE -m unit

# the wire contract's Python code for test-unit, without `make proto`'s Debian packages
$(WIRE_PY): proto/pharos/v1/io.proto
	@command -v $(UV) >/dev/null || python3 -m pip install --quiet uv
	@sh pipeline/gen-wire.sh "$(RUN) python"

# One component: its Rust crates (every test, as in make test) and its Python test folders.
test-forwarder: setup ## Forwarding layer: pharos-fwd, pharos-fwd-proto, pharos-mount, tests/forwarder
	@cargo test --release --quiet -p pharos-fwd-proto -p pharos-fwd -p pharos-mount
	@$(RUN) pytest -q -rsfE -m "not evaluation" tests/forwarder

test-agent: setup ## eBPF agent: pharos-agent (incl. its root tests), pharos-attribution, tests/agents
	@cargo test --release --quiet -p pharos-agent -p pharos-attribution
	@cargo test --release --quiet -p pharos-agent -- --ignored
	@$(RUN) pytest -q -rsfE -m "not evaluation" tests/agents

test-pipeline: setup ## Ingestion: pharos-wire (Rust sink), tests/pipeline, tests/darshan (Kafka, chDB, Darshan import)
	@cargo test --release --quiet -p pharos-wire
	@$(RUN) pytest -q -rsfE -m "not evaluation" tests/pipeline tests/darshan

test-analytics: setup ## Analytics: tests/analytics, diagnosis, systemdiag, control
	@$(RUN) pytest -q -rsfE -m "not evaluation" tests/analytics tests/diagnosis tests/systemdiag tests/control

test-api: setup ## API and CLI: tests/api
	@$(RUN) pytest -q -rsfE -m "not evaluation" tests/api

test-dashboards: setup ## Grafana dashboards: tests/dashboards
	@$(RUN) pytest -q -rsfE -m "not evaluation" tests/dashboards

lint: setup ## ruff (lint + format check), rustfmt --check, clippy -D warnings
	@$(RUN) ruff check --quiet .
	@$(RUN) ruff format --check --quiet .
	@cargo fmt --all --check
	@cargo clippy --release --quiet --workspace --all-targets -- -D warnings
	@cargo clippy --release --quiet -p pharos-fwd --features test-hooks --all-targets -- -D warnings

evaluate: setup ## Live figures: patterns, fail-slow precision/recall, interference, fault-to-alert latency (also in make test); placement hints (evaluation only); the cluster rig with its fault schedule, and the forwarding optimisations on it; the labelled diagnosis suite (100 cases); learned DFRA classes vs exact match
	@$(RUN) pytest -q -s tests/live
	@$(RUN) pytest -q -s -m evaluation tests
	@$(RUN) python bench/cluster.py --faults
	@$(RUN) python bench/cluster_forwarding.py
	@$(RUN) python bench/diagnosis_suite.py --cases 100 --seed 1 --json build/diagnosis_suite.json
	@$(RUN) python bench/dfra_class_model.py

bench: setup ## Benchmarks: agent overhead, forwarding layer vs direct, placement, control loop (interference cured, placement hints), ingest, online migration, node-local mode
	@$(RUN) python bench/agent_overhead.py
	@$(RUN) python bench/forwarder.py
	@$(RUN) python bench/forwarder.py --cases 64KiB --baseline-mount-args "--parallel-writes false"
	@$(RUN) python bench/forwarder_threads.py
	@$(RUN) python bench/fgf_lru.py
	@$(RUN) python bench/forwarder_gas.py
	@$(RUN) python bench/forwarder_gas.py --socket
	@$(RUN) python bench/placement.py
	@$(RUN) python bench/interference.py --rounds 2
	@$(RUN) python bench/placement_hints.py --rounds 2
	@$(RUN) python bench/ingest.py --rounds 2 --with-queries --stored 10000000
	@$(RUN) python bench/migration.py
	@$(RUN) python bench/nodelocal.py

down: ## Stop a stack left running by `make demo`
	@$(RUN) pharos down

clean: down ## Remove build outputs and the embedded stack's data
	rm -rf build target .pharos
