# Pharos images, installed from the same lock files as `make` (docs/operations.md).
#
#   target server (default; what docker-compose.yml builds): `pharos serve` (pipeline, analytics,
#     control loop, API) and the `pharos` CLI, the Python environment from uv.lock (`uv sync --frozen`,
#     as `make python`), the wire contract generated as `make proto`; runs as user pharos (uid 10001).
#   target host-binaries: pharos-agent, pharos-fwd and pharos-mount built from Cargo.lock
#     (`cargo build --release --locked`, as `make build`) for the compute and forwarding nodes:
#       docker build --target host-binaries --output type=local,dest=dist .
#
# The server stages come first: a builder without BuildKit builds every stage up to its target,
# so building the server never compiles the Rust workspace.

ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm
ARG UV_IMAGE=ghcr.io/astral-sh/uv:0.13.9
ARG RUST_IMAGE=rust:1.95-bookworm

FROM ${UV_IMAGE} AS uv

# ---- Python: the environment of uv.lock ------------------------------------------------------
FROM ${PYTHON_IMAGE} AS python-build
COPY --from=uv /uv /uvx /bin/
ENV UV_FROZEN=1 \
    UV_LINK_MODE=copy \
    UV_COMPILE_BYTECODE=1 \
    UV_PYTHON_DOWNLOADS=never \
    UV_PROJECT_ENVIRONMENT=/app/.venv
WORKDIR /app
# The locked packages first (this layer is rebuilt only when the lock changes); the dev group is
# installed for grpcio-tools, which generates the wire contract below, and removed afterwards.
COPY pyproject.toml uv.lock README.md ./
RUN uv sync --frozen --no-install-project
COPY proto proto
COPY core core
COPY pipeline pipeline
COPY analytics analytics
COPY api api
COPY agents/pharos_agents agents/pharos_agents
RUN sh pipeline/gen-wire.sh \
 && uv sync --frozen --no-dev \
 && /app/.venv/bin/python -c "from pharos_pipeline import columnar; import pharos_api.server; columnar.proto_schema()"

# ---- the Pharos server ------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS server
RUN groupadd --system --gid 10001 pharos \
 && useradd --system --uid 10001 --gid pharos --home-dir /var/lib/pharos --create-home \
      --shell /usr/sbin/nologin pharos
COPY --from=python-build /app /app
# PHAROS_CONFIG: an optional pharos.toml (mount it there); PHAROS_* variables override it.
ENV PATH=/app/.venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HOME=/var/lib/pharos \
    PHAROS_CONFIG=/etc/pharos/pharos.toml \
    PHAROS_STATE_DIR=/var/lib/pharos \
    PHAROS_API_HOST=0.0.0.0 \
    PHAROS_API_AUTH=token
WORKDIR /var/lib/pharos
USER 10001:10001
EXPOSE 8400
# GET /v1/health: 200 when the API answers and its store answers SELECT 1, 503 otherwise.
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/v1/health' % os.environ.get('PHAROS_API_PORT', '8400'), timeout=4)"]
CMD ["pharos", "serve"]

# ---- Rust: the host binaries of Cargo.lock ----------------------------------------------------
FROM ${RUST_IMAGE} AS rust-build
# What `make build` needs (the Makefile's APT_PACKAGES): clang and bpftool for the BPF object,
# libelf/zlib for libbpf, cmake for librdkafka, protoc for the wire contract.
# hadolint ignore=DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      clang llvm libelf-dev zlib1g-dev pkg-config bpftool libbpf-dev cmake protobuf-compiler \
      libzstd-dev liblz4-dev libssl-dev libcurl4-openssl-dev libfuse3-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Cargo.toml Cargo.lock rustfmt.toml ./
COPY proto proto
COPY agents/ebpf agents/ebpf
COPY forwarder forwarder
# The agent's build dumps vmlinux.h from the build machine's /sys/kernel/btf/vmlinux (CO-RE: any
# BTF kernel will do); without one, put a header at agents/ebpf/src/bpf/vmlinux.h before building.
RUN if [ -f agents/ebpf/src/bpf/vmlinux.h ]; then export PHAROS_VMLINUX_H="$PWD/agents/ebpf/src/bpf/vmlinux.h"; fi \
 && cargo build --release --locked -p pharos-agent -p pharos-fwd -p pharos-mount \
 && mkdir -p /out \
 && cp target/release/pharos-agent target/release/pharos-fwd target/release/pharos-mount /out/

FROM scratch AS host-binaries
COPY --from=rust-build /out/ /
