//! Test helpers of the backend's modules: backends on a tmp dir, object counts, pools.
use std::fs;
use std::path::PathBuf;
use std::sync::Arc;

use pharos_fwd_proto::OpenHandle;

use super::{Backend, Placement, Pool};

pub(super) const NOH: OpenHandle = OpenHandle { daemon: 0, id: 0 };
pub(super) const EXCL: i32 = libc::O_CREAT | libc::O_EXCL | libc::O_RDWR;

pub(super) fn backend(n: usize) -> (tempfile::TempDir, Backend) {
    let d = tempfile::tempdir().unwrap();
    let ts: Vec<(String, PathBuf)> = (0..n).map(|i| (format!("ost{i}"), d.path().join(format!("ost{i}")))).collect();
    let b = Backend::new(&d.path().join("mdt"), &ts).unwrap();
    (d, b)
}

pub(super) fn obj_count(d: &tempfile::TempDir) -> usize {
    (0..4)
        .map(|i| {
            fs::read_dir(d.path().join(format!("ost{i}")))
                .map(|it| it.flatten().filter(|e| !e.file_name().to_string_lossy().starts_with('.')).count())
                .unwrap_or(0)
        })
        .sum()
}

pub(super) fn backend_on(d: &tempfile::TempDir, n: usize) -> Backend {
    let ts: Vec<(String, PathBuf)> = (0..n).map(|i| (format!("ost{i}"), d.path().join(format!("ost{i}")))).collect();
    Backend::new(&d.path().join("mdt"), &ts).unwrap()
}

pub(super) fn progressive(b: &Backend, perf: &[f64], cs: u64) {
    let names: Vec<String> = (0..perf.len()).map(|i| format!("ost{i}")).collect();
    let max_perf = names.iter().cloned().zip(perf.iter().copied()).collect();
    let pool = Pool { targets: names, max_perf, stripe_count: None, component_size: Some(cs) };
    let p = Placement { pools: [("p".to_string(), pool)].into(), default_pool: Some("p".into()), ..Default::default() };
    b.validate_placement(&p).unwrap();
    b.placement.store(Arc::new(p));
}

pub(super) fn counts(b: &Backend) -> Vec<i64> {
    b.targets.iter().map(|t| t.shm.open_count()).collect()
}
