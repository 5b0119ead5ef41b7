use super::*;
use crate::backend::testutil::*;
use crate::backend::{Backend, IoInfo};
use pharos_fwd_proto::Ctx;
use std::sync::Arc;

#[test]
fn performance_aware_placement_follows_max_perf() {
    let (_d, b) = backend(3);
    let mut pools = BTreeMap::new();
    let perf: BTreeMap<String, f64> =
        [("ost0", 10.0), ("ost1", 30.0), ("ost2", 20.0)].iter().map(|(k, v)| (k.to_string(), *v)).collect();
    pools.insert(
        "p".to_string(),
        Pool {
            targets: vec!["ost0".into(), "ost1".into(), "ost2".into()],
            max_perf: perf,
            stripe_count: None,
            component_size: None,
        },
    );
    let p = Placement { pools, default_pool: Some("p".into()), ..Default::default() };
    b.validate_placement(&p).unwrap();
    b.placement.store(Arc::new(p));
    let mut counts = [0; 3];
    for i in 0..12 {
        let (_, l, _) = b.create(&format!("f{i}"), 0o644, EXCL, 0, &Ctx::default()).unwrap();
        counts[l.targets[0] as usize] += 1;
    }
    // D'Hondt allocation of 12 files over 10:30:20.
    assert_eq!(counts, [2, 6, 4]);
    let bad = Placement { default_pool: Some("nope".into()), ..Default::default() };
    assert!(b.validate_placement(&bad).is_err());
}

#[test]
fn component_size_must_be_a_positive_multiple_of_the_alignment() {
    let (_d, b) = backend(2);
    let mut bad = Placement {
        pools: [(
            "p".to_string(),
            Pool {
                targets: vec!["ost0".into()],
                max_perf: BTreeMap::new(),
                stripe_count: None,
                component_size: Some(1000),
            },
        )]
        .into(),
        ..Default::default()
    };
    assert!(b.validate_placement(&bad).is_err());
    bad.pools.get_mut("p").unwrap().component_size = Some(0);
    assert!(b.validate_placement(&bad).is_err());
}

#[test]
fn sequential_writers_move_their_count_and_spread_by_performance() {
    let (d, a) = backend(3);
    let b = backend_on(&d, 3); // a second daemon on the same backend
    progressive(&a, &[10.0, 30.0, 20.0], 4096);
    let mut info = IoInfo::default();
    let mut opens = Vec::new();
    for i in 0..6 {
        let (_, l, h) = a.create(&format!("f{i}"), 0o644, EXCL, 0, &Ctx::default()).unwrap();
        // Each writer holds its first component: the rule spreads them 10:30:20.
        a.write(&l, h, 0, &[1; 100], &mut info).unwrap();
        opens.push((l, h));
    }
    assert_eq!(counts(&a), vec![1, 3, 2]);
    // Moving on to the next component moves the count (through either daemon).
    let (l0, h0) = opens[0].clone();
    let t0 = a.component(&l0, 0, false).unwrap().unwrap();
    b.write(&l0, h0, 4096, &[2; 100], &mut info).unwrap();
    let t1 = b.component(&l0, 1, false).unwrap().unwrap();
    let mut want = vec![1, 3, 2];
    want[t0 as usize] -= 1;
    want[t1 as usize] += 1;
    assert_eq!(counts(&a), want);
    // A write back on the first daemon, whose memory is stale, still moves the right count.
    a.write(&l0, h0, 0, &[3; 10], &mut info).unwrap();
    want[t1 as usize] -= 1;
    want[t0 as usize] += 1;
    assert_eq!(counts(&a), want);
    // Releases through the other daemon drop every count.
    for (l, h) in &opens {
        b.release(l, *h).unwrap();
    }
    assert_eq!(counts(&a), vec![0, 0, 0]);
    // A dead daemon's open: the start-time GC drops its count with its marker.
    let dead = backend_on(&d, 3);
    progressive(&dead, &[10.0, 30.0, 20.0], 4096);
    let (_, l, h) = dead.create("g", 0o644, EXCL, 0, &Ctx::default()).unwrap();
    dead.write(&l, h, 0, &[1; 10], &mut info).unwrap();
    assert_eq!(counts(&a).iter().sum::<i64>(), 1);
    drop(dead);
    assert_eq!(a.gc().stale_markers, 1);
    assert_eq!(counts(&a), vec![0, 0, 0]);
    // The open goes on through a live daemon, uncounted, and its release drops nothing.
    a.write(&l, h, 4096, &[1; 10], &mut info).unwrap();
    a.release(&l, h).unwrap();
    assert_eq!(counts(&a), vec![0, 0, 0]);
    assert_eq!(a.read(&l, 0, 8192, &mut info).unwrap().len(), 4096 + 10);
}

#[test]
fn concurrent_component_placement_has_one_winner() {
    let d = tempfile::tempdir().unwrap();
    let daemons: Vec<Arc<Backend>> = (0..2).map(|_| Arc::new(backend_on(&d, 4))).collect();
    progressive(&daemons[0], &[10.0, 10.0, 10.0, 10.0], 4096);
    let (_, l, _) = daemons[0].create("f", 0o644, EXCL, 0, &Ctx::default()).unwrap();
    for round in 0..50u64 {
        let barrier = Arc::new(std::sync::Barrier::new(8));
        let threads: Vec<_> = (0..8)
            .map(|i| {
                let (b, l, bar) = (daemons[i % 2].clone(), l.clone(), barrier.clone());
                // Each racer sees other counts, so their choices differ.
                b.targets[i % 4].shm.add_open(1);
                std::thread::spawn(move || {
                    bar.wait();
                    let mut info = IoInfo::default();
                    b.write(&l, NOH, round * 4096 + i as u64 * 512, &[i as u8 + 1; 512], &mut info).unwrap();
                    b.component(&l, round, false).unwrap().unwrap()
                })
            })
            .collect();
        let seen: Vec<u32> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        assert!(seen.iter().all(|&t| t == seen[0]), "round {round}: {seen:?}");
        for t in &daemons[0].targets {
            t.shm.add_open(-2);
        }
        // Every racer's bytes are in the one object.
        let mut info = IoInfo::default();
        let r = daemons[1].read(&l, round * 4096, 4096, &mut info).unwrap();
        for i in 0..8 {
            assert!(r[i * 512..(i + 1) * 512].iter().all(|&x| x == i as u8 + 1), "round {round} racer {i}");
        }
    }
    assert_eq!(fs::read_dir(d.path().join(format!("mdt/components/{:016x}", l.oid))).unwrap().count(), 50);
    assert_eq!(obj_count(&d), 50);
    assert_eq!(fs::read_dir(d.path().join("mdt/tmp")).unwrap().count(), 0, "no staged records left");
}

/// The placement document's schema, shared with the control loop.
const SCHEMA: &str = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../proto/placement/placement.schema.json"));

mod schema {
    use serde_json::Value;

    /// `#/$defs/..` references of `root`, resolved.
    fn resolve<'a>(root: &'a Value, s: &'a Value) -> &'a Value {
        match s.get("$ref").and_then(Value::as_str) {
            Some(r) => root.pointer(r.trim_start_matches('#')).unwrap_or_else(|| panic!("unresolved {r}")),
            None => s,
        }
    }

    fn types(s: &Value) -> Vec<&str> {
        match &s["type"] {
            Value::String(t) => vec![t.as_str()],
            Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        }
    }

    fn has_type(v: &Value, t: &str) -> bool {
        match t {
            "object" => v.is_object(),
            "array" => v.is_array(),
            "string" => v.is_string(),
            "number" => v.is_number(),
            "integer" => v.is_u64() || v.is_i64(),
            "null" => v.is_null(),
            "boolean" => v.is_boolean(),
            _ => panic!("type {t} not handled by this checker"),
        }
    }

    /// Validates `v` against schema `s` (the keywords the placement schema uses); the
    /// errors with their JSON pointers.
    pub fn validate(root: &Value, s: &Value, v: &Value, at: &str, errs: &mut Vec<String>) {
        let s = resolve(root, s);
        let ts = types(s);
        if !ts.is_empty() && !ts.iter().any(|t| has_type(v, t)) {
            errs.push(format!("{at}: {v} is not of type {ts:?}"));
            return;
        }
        if let Some(x) = v.as_f64() {
            if s.get("minimum").and_then(Value::as_f64).is_some_and(|m| x < m) {
                errs.push(format!("{at}: {x} below the minimum"));
            }
            if s.get("maximum").and_then(Value::as_f64).is_some_and(|m| x > m) {
                errs.push(format!("{at}: {x} above the maximum"));
            }
            if s.get("multipleOf").and_then(Value::as_f64).is_some_and(|m| x % m != 0.0) {
                errs.push(format!("{at}: {x} not a multiple"));
            }
        }
        if let Some(a) = v.as_array() {
            if s.get("minItems").and_then(Value::as_u64).is_some_and(|m| (a.len() as u64) < m) {
                errs.push(format!("{at}: too few items"));
            }
            if let Some(items) = s.get("items") {
                for (i, x) in a.iter().enumerate() {
                    validate(root, items, x, &format!("{at}/{i}"), errs);
                }
            }
        }
        if let Some(o) = v.as_object() {
            let props = s.get("properties").and_then(Value::as_object);
            for r in s.get("required").and_then(Value::as_array).into_iter().flatten() {
                if !o.contains_key(r.as_str().unwrap()) {
                    errs.push(format!("{at}: {r} required"));
                }
            }
            for (k, x) in o {
                let here = format!("{at}/{k}");
                match (props.and_then(|p| p.get(k)), s.get("additionalProperties")) {
                    (Some(p), _) => validate(root, p, x, &here, errs),
                    (None, Some(Value::Bool(false))) => errs.push(format!("{here}: not in the schema")),
                    (None, Some(extra)) => validate(root, extra, x, &here, errs),
                    (None, None) => {}
                }
            }
        }
    }

    /// A value of schema `s` with every property present (not null where another type is
    /// allowed), each map with one entry.
    pub fn sample(root: &Value, s: &Value) -> Value {
        let s = resolve(root, s);
        let t = types(s).into_iter().find(|&t| t != "null").expect("a non-null type");
        let min = s.get("minimum").and_then(Value::as_u64);
        match t {
            "object" => {
                let mut o = serde_json::Map::new();
                for (k, p) in s.get("properties").and_then(Value::as_object).into_iter().flatten() {
                    o.insert(k.clone(), sample(root, p));
                }
                if let Some(extra) = s.get("additionalProperties").filter(|x| x.is_object()) {
                    o.insert("ost0".into(), sample(root, extra));
                }
                Value::Object(o)
            }
            "array" => Value::Array(vec![sample(root, &s["items"])]),
            "string" => Value::String("ost0".into()),
            "integer" => Value::from(min.unwrap_or(0).max(s.get("multipleOf").and_then(Value::as_u64).unwrap_or(1))),
            "number" => Value::from(12.5),
            _ => panic!("type {t} not handled by the sampler"),
        }
    }
}

fn keys(v: &serde_json::Value) -> Vec<String> {
    v.as_object().unwrap().keys().cloned().collect()
}

/// A document with every field set (every pool field in one pool).
fn full_document() -> Placement {
    let pool = Pool {
        targets: vec!["ost0".into(), "ost1".into()],
        max_perf: [("ost0".to_string(), 50.0), ("ost1".to_string(), 12.5)].into(),
        stripe_count: Some(1),
        component_size: Some(2 << 20),
    };
    Placement {
        pools: [("fast".to_string(), pool)].into(),
        default_pool: Some("fast".into()),
        job_pools: [("42".to_string(), "fast".to_string())].into(),
        stripe_size: Some(1 << 20),
        stripe_count: Some(2),
    }
}

/// The serde types and the shared schema have the same fields, both ways: a document with
/// every field serialises to exactly the schema's properties and validates; a document
/// made from the schema with every property parses (unknown fields are refused) and
/// serialises back to the same properties.
#[test]
fn placement_types_match_the_shared_schema() {
    let root: serde_json::Value = serde_json::from_str(SCHEMA).unwrap();
    let pool_schema = &root["$defs"]["pool"];
    let full = serde_json::to_value(full_document()).unwrap();
    assert_eq!(keys(&full), keys(&root["properties"]), "Placement fields vs the schema's properties");
    assert_eq!(keys(&full["pools"]["fast"]), keys(&pool_schema["properties"]), "Pool fields vs the schema's");
    let mut errs = Vec::new();
    schema::validate(&root, &root, &full, "", &mut errs);
    assert!(errs.is_empty(), "{errs:?}");
    let (_d, b) = backend(2);
    b.validate_placement(&full_document()).unwrap();
    // The default document too (what GET /placement shows before any PUT).
    schema::validate(&root, &root, &serde_json::to_value(Placement::default()).unwrap(), "", &mut errs);
    assert!(errs.is_empty(), "{errs:?}");
    // From the schema to the types.
    let sample = schema::sample(&root, &root);
    let parsed: Placement = serde_json::from_value(sample.clone()).expect("every schema property is a field");
    let back = serde_json::to_value(&parsed).unwrap();
    assert_eq!(keys(&back), keys(&sample));
    assert_eq!(keys(&back["pools"]["ost0"]), keys(&sample["pools"]["ost0"]));
    schema::validate(&root, &root, &back, "", &mut errs);
    assert!(errs.is_empty(), "{errs:?}");
    // The checker itself refuses what the schema does.
    for bad in [
        serde_json::json!({"stripe_sise": 4096}),
        serde_json::json!({"pools": {"p": {"targets": ["ost0"], "max_pref": {}}}}),
        serde_json::json!({"pools": {"p": {"max_perf": {}}}}),
        serde_json::json!({"pools": {"p": {"targets": ["ost0"], "component_size": 1000}}}),
    ] {
        let mut errs = Vec::new();
        schema::validate(&root, &root, &bad, "", &mut errs);
        assert!(!errs.is_empty(), "{bad}");
    }
}

/// A misspelled field is refused with serde's message naming it (instead of being dropped,
/// which left the placement silently different from the one meant).
#[test]
fn misspelled_fields_are_refused() {
    let e = serde_json::from_str::<Placement>(r#"{"pools": {}, "defualt_pool": "p"}"#).unwrap_err();
    assert!(e.to_string().contains("unknown field `defualt_pool`, expected one of"), "{e}");
    let e = serde_json::from_str::<Placement>(r#"{"pools": {"p": {"targets": ["ost0"], "max_pref": {"ost0": 5}}}}"#)
        .unwrap_err();
    assert!(e.to_string().contains("unknown field `max_pref`"), "{e}");
    serde_json::from_str::<Placement>(r#"{"pools": {"p": {"targets": ["ost0"], "max_perf": {"ost0": 5}}}}"#).unwrap();
}
