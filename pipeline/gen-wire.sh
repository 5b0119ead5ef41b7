#!/bin/sh
# The wire contract's Python code (protoc, from grpcio-tools in the uv environment) and a copy of
# the .proto next to it, the schema ClickHouse's Protobuf input reads (pharos_pipeline.columnar).
# Run from the repository root by `make proto` and by the Dockerfile. $1: the Python (default
# `uv run --frozen --no-sync python`).
set -eu
PY=${1:-uv run --frozen --no-sync python}
$PY -m grpc_tools.protoc -I proto --python_out=pipeline/pharos_pipeline/wire \
  --pyi_out=pipeline/pharos_pipeline/wire proto/pharos/v1/io.proto
cp proto/pharos/v1/io.proto pipeline/pharos_pipeline/wire/pharos/v1/io.proto
