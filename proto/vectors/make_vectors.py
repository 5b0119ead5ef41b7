"""Write the wire contract's test vectors: <name>.binpb (serialized message) beside
<name>.json (the same message in protobuf's canonical JSON, enum names as strings, 64-bit
integers as strings). Every language's tests decode each .binpb and compare it with the .json.

Run: uv run python proto/vectors/make_vectors.py   (the vectors are checked in; re-run only
when the schema changes, and keep old vectors decoding).
"""

from pathlib import Path

from google.protobuf import json_format

from pharos_pipeline.wire import io_pb2

HERE = Path(__file__).resolve().parent


def vectors():
    merged = io_pb2.IoRecord(
        start_ns=1_763_700_000_123_456_789,
        duration_ns=1_234_567,
        end_ns=1_763_700_000_125_000_000,
        layer=io_pb2.LAYER_CLIENT,
        host="cn001",
        job_id="4242",
        rank=3,
        pid=12345,
        tid=12346,
        comm="fio",
        op=io_pb2.OP_PWRITE,
        dev=0x800001,
        inode=987654321,
        path="/scratch/run/out.3",
        file_type=io_pb2.FILE_TYPE_REGULAR,
        fd=7,
        offset=1 << 32,
        size=4096,
        result=4096,
        count=256,
    )
    failed = io_pb2.IoRecord(
        start_ns=1_763_700_001_000_000_000,
        duration_ns=900,
        end_ns=1_763_700_001_000_000_900,
        layer=io_pb2.LAYER_CLIENT,
        host="cn001",
        job_id="4242",
        rank=0,
        pid=12340,
        tid=12340,
        comm="ior",
        op=io_pb2.OP_OPEN,
        path="/scratch/missing",
        fd=-1,
        result=-2,
        count=1,
    )
    forwarded = io_pb2.IoRecord(
        start_ns=1_763_700_002_000_000_000,
        duration_ns=50_000,
        end_ns=1_763_700_002_000_060_000,
        layer=io_pb2.LAYER_FORWARDER,
        host="fwd0",
        job_id="4242",
        rank=1,
        op=io_pb2.OP_WRITE,
        size=1 << 20,
        result=1 << 20,
        count=1,
        offset=3 << 20,
        compute_node="cn002",
        forwarding_node="fwd0",
        target="ost3",
        object_id=77,
        queue_wait_ns=10_000,
        fd=-1,
        request_id=(1 << 62) + 5,
        replay=True,
    )
    yield (
        "batch_basic",
        io_pb2.IoBatch(
            schema_version=1,
            producer_id="cn001:agent:12000:1763700000000000000",
            seq=17,
            created_ns=1_763_700_002_500_000_000,
            host="cn001",
            records=[merged, failed, forwarded],
            drops=[
                io_pb2.DropCounters(
                    job_id="4242", ringbuf_drops=5, delivery_failures=0, overflow_drops=1, unmerged_fallbacks=2
                )
            ],
        ),
    )
    yield "batch_empty", io_pb2.IoBatch(schema_version=1, producer_id="p", seq=0)
    yield (
        "job_start",
        io_pb2.JobEvent(
            schema_version=1,
            job_id="4242",
            kind=io_pb2.JobEvent.KIND_START,
            time_ns=1_763_699_999_000_000_000,
            name="fio",
            command=["fio", "--name=w", "--rw=write"],
            user="alice",
            ranks=4,
            host="cn001",
            cgroup="/pharos/job_4242",
        ),
    )
    yield (
        "metrics_basic",
        io_pb2.TargetMetricsBatch(
            schema_version=1,
            producer_id="fwd0:fwd:4242:1763700000000000000",
            seq=3,
            created_ns=1_763_700_003_000_000_000,
            host="fwd0",
            metrics=[
                io_pb2.TargetMetrics(
                    target="ost3",
                    forwarding_node="fwd0",
                    time_ns=1_763_700_002_000_000_000,
                    interval_ms=1000,
                    bytes_read=1 << 20,
                    bytes_written=50 << 20,
                    read_ops=1,
                    write_ops=50,
                    metadata_ops=4,
                    latency_p50_ns=900_000,
                    latency_p95_ns=4_000_000,
                    latency_p99_ns=9_000_000,
                    latency_max_ns=12_000_000,
                    queue_depth=7,
                    throttled=True,
                    max_perf_mb_s=50.0,
                    slowdown=4.0,
                    added_latency_ns=1_000_000,
                    service_ns_sum=95_000_000,
                ),
                io_pb2.TargetMetrics(
                    target="ost0",
                    forwarding_node="fwd0",
                    time_ns=1_763_700_002_000_000_000,
                    interval_ms=1000,
                    slowdown=1.0,
                ),
            ],
        ),
    )
    yield (
        "job_end",
        io_pb2.JobEvent(
            schema_version=1,
            job_id="4242",
            kind=io_pb2.JobEvent.KIND_END,
            time_ns=1_763_700_010_000_000_000,
            name="fio",
            ranks=4,
            host="cn001",
            exit_code=3,
        ),
    )


def main() -> None:
    for name, msg in vectors():
        (HERE / f"{name}.binpb").write_bytes(msg.SerializeToString(deterministic=True))
        (HERE / f"{name}.json").write_text(
            json_format.MessageToJson(msg, preserving_proto_field_name=True, indent=2, sort_keys=True) + "\n"
        )
        print(f"wrote {name}")


if __name__ == "__main__":
    main()
