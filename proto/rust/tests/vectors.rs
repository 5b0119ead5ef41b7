//! Decodes every `proto/vectors/<name>.binpb` and compares it field by field with
//! `<name>.json` (protobuf canonical JSON, original field names).
use std::path::PathBuf;

use pharos_wire::{IoBatch, JobEvent};
use prost::Message;
use serde_json::Value;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../vectors")
}

fn load(name: &str) -> (Vec<u8>, Value) {
    let bin = std::fs::read(dir().join(format!("{name}.binpb")))
        .unwrap_or_else(|e| panic!("vector {name}.binpb missing: {e}"));
    let json = std::fs::read_to_string(dir().join(format!("{name}.json")))
        .unwrap_or_else(|e| panic!("vector {name}.json missing: {e}"));
    (bin, serde_json::from_str(&json).unwrap_or_else(|e| panic!("{name}.json: {e}")))
}

/// Compares `got` with `want` key by key, naming the first differing field path.
fn assert_json_eq(path: &str, got: &Value, want: &Value) {
    match (got, want) {
        (Value::Object(g), Value::Object(w)) => {
            for (k, wv) in w {
                let gv = g.get(k).unwrap_or_else(|| panic!("{path}.{k}: missing in decoded message"));
                assert_json_eq(&format!("{path}.{k}"), gv, wv);
            }
            for k in g.keys() {
                assert!(w.contains_key(k), "{path}.{k}: decoded message has it, JSON vector does not");
            }
        }
        (Value::Array(g), Value::Array(w)) => {
            assert_eq!(g.len(), w.len(), "{path}: length differs");
            for (i, (gv, wv)) in g.iter().zip(w).enumerate() {
                assert_json_eq(&format!("{path}[{i}]"), gv, wv);
            }
        }
        _ => assert_eq!(got, want, "{path} differs"),
    }
}

/// Decodes `name`.binpb as `M`, checks it equals `name`.json both ways: decoded → canonical
/// JSON compared field by field, and JSON → message compared with the decoded one.
fn check<M>(name: &str) -> M
where
    M: Message + Default + PartialEq + std::fmt::Debug + serde::Serialize + serde::de::DeserializeOwned,
{
    let (bin, json) = load(name);
    let decoded = M::decode(bin.as_slice()).unwrap_or_else(|e| panic!("{name}.binpb: {e}"));
    let as_json = serde_json::to_value(&decoded).unwrap();
    assert_json_eq(name, &as_json, &json);
    let from_json: M = serde_json::from_value(json).unwrap_or_else(|e| panic!("{name}.json: {e}"));
    assert_eq!(decoded, from_json, "{name}: JSON and binary disagree");
    assert_eq!(decoded.encode_to_vec(), bin, "{name}: re-encoding differs");
    decoded
}

#[test]
fn every_vector_has_a_test() {
    let mut names: Vec<String> = std::fs::read_dir(dir())
        .unwrap()
        .filter_map(|e| {
            let p = e.unwrap().path();
            (p.extension()? == "binpb").then(|| p.file_stem().unwrap().to_string_lossy().into_owned())
        })
        .collect();
    names.sort();
    assert_eq!(names, ["batch_basic", "batch_empty", "job_end", "job_start", "metrics_basic"]);
}

#[test]
fn batch_basic() {
    let b: IoBatch = check("batch_basic");
    // Spot checks on the typed values, independent of the JSON mapping.
    assert_eq!(b.seq, 17);
    assert_eq!(b.records.len(), 3);
    let r = &b.records[0];
    assert_eq!(r.op(), pharos_wire::Op::Pwrite);
    assert_eq!(r.layer(), pharos_wire::Layer::Client);
    assert_eq!(r.file_type(), pharos_wire::FileType::Regular);
    assert_eq!((r.dev, r.offset, r.count, r.rank, r.fd), (0x800001, 1 << 32, 256, 3, 7));
    assert_eq!(b.records[1].result, -2);
    // The forwarder record's request identity (v1 fields 26, 27).
    assert_eq!((b.records[2].request_id, b.records[2].replay), ((1 << 62) + 5, true));
    assert_eq!((r.request_id, r.replay), (0, false));
    assert_eq!(b.drops[0].ringbuf_drops, 5);
}

#[test]
fn batch_empty() {
    let b: IoBatch = check("batch_empty");
    assert!(b.records.is_empty());
    assert_eq!(b.producer_id, "p");
}

#[test]
fn job_start() {
    let e: JobEvent = check("job_start");
    assert_eq!(e.kind(), pharos_wire::v1::job_event::Kind::Start);
}

#[test]
fn metrics_basic() {
    let b: pharos_wire::v1::TargetMetricsBatch = check("metrics_basic");
    assert_eq!((b.seq, b.metrics.len()), (3, 2));
    let m = &b.metrics[0];
    assert_eq!((m.target.as_str(), m.queue_depth, m.throttled), ("ost3", 7, true));
    assert_eq!((m.max_perf_mb_s, m.slowdown), (50.0, 4.0));
    assert_eq!(m.service_ns_sum, 95_000_000);
}

#[test]
fn job_end() {
    let e: JobEvent = check("job_end");
    assert_eq!(e.kind(), pharos_wire::v1::job_event::Kind::End);
    assert_eq!(e.exit_code, 3);
}
