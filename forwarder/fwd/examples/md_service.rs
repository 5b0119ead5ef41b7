//! Service time of the backend's metadata operations (issue 29): µs per operation of
//! mkdir, create, release, getattr, lookup of a missing name, unlink and rmdir, each
//! repeated N times (default 2000) on a fresh backend of 4 targets in a tmp dir (`TMPDIR`),
//! striped over `--stripes` targets (default 1; `PHAROS_MD_STRIPES`). Prints one line per
//! operation; no pass/fail. Run: `cargo run --release --example md_service -- [N]`.
use std::path::PathBuf;
use std::time::Instant;

use pharos_fwd::backend::{Backend, Placement, Pool};
use pharos_fwd_proto::Ctx;

fn main() {
    let n: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(2000);
    let stripes: u32 = std::env::var("PHAROS_MD_STRIPES").ok().and_then(|s| s.parse().ok()).unwrap_or(1);
    let d = tempfile::tempdir().unwrap();
    let ts: Vec<(String, PathBuf)> = (0..4).map(|i| (format!("ost{i}"), d.path().join(format!("ost{i}")))).collect();
    let b = Backend::new(&d.path().join("mdt"), &ts).unwrap();
    let pool = Pool {
        targets: (0..4).map(|i| format!("ost{i}")).collect(),
        max_perf: Default::default(),
        stripe_count: Some(stripes),
        component_size: None,
    };
    let p = Placement { pools: [("p".to_string(), pool)].into(), default_pool: Some("p".into()), ..Default::default() };
    b.validate_placement(&p).unwrap();
    b.placement.store(std::sync::Arc::new(p));
    let c = Ctx::default();
    let excl = libc::O_CREAT | libc::O_EXCL | libc::O_RDWR;
    let time = |name: &str, f: &mut dyn FnMut(usize)| {
        let t0 = Instant::now();
        for i in 0..n {
            f(i);
        }
        println!("{name:<16} {:8.1} us/op", t0.elapsed().as_secs_f64() * 1e6 / n as f64);
    };
    println!("{n} ops each, {stripes} stripe(s), in {}", d.path().display());
    b.mkdir("d", 0o755, &c).unwrap();
    time("mkdir", &mut |i| {
        b.mkdir(&format!("d/sub{i}"), 0o755, &c).unwrap();
    });
    let mut opens = Vec::with_capacity(n);
    time("create", &mut |i| {
        let (_, l, h) = b.create(&format!("d/f{i}"), 0o644, excl, 0, &c).unwrap();
        opens.push((l, h));
    });
    let mut it = opens.drain(..);
    time("release", &mut |_| {
        let (l, h) = it.next().unwrap();
        b.release(&l, h).unwrap();
    });
    time("getattr", &mut |i| {
        b.getattr(&format!("d/f{i}"), &c).unwrap();
    });
    time("lookup-missing", &mut |i| {
        b.getattr(&format!("d/none{i}"), &c).unwrap_err();
    });
    time("open+release", &mut |i| {
        let (_, l, h) = b.open(&format!("d/f{i}"), libc::O_RDONLY, &c).unwrap();
        b.release(&l, h).unwrap();
    });
    time("unlink", &mut |i| {
        b.unlink(&format!("d/f{i}"), &c).unwrap();
    });
    time("rmdir", &mut |i| {
        b.rmdir(&format!("d/sub{i}"), &c).unwrap();
    });
}
