use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pharos_fwd_proto::Ctx;

use super::alloc::{allocate, Demand, Pacer};
use super::journal::{decide, Decision, Entry, Journal};
use super::*;
use crate::backend::testutil::*;
use crate::backend::{IoInfo, Placement, Pool};

fn d(min: f64, priority: i32, max: Option<f64>) -> Demand {
    Demand { min_mb_s: min, priority, max_mb_s: max }
}

/// Three tasks with different minimums and priorities: each gets at least its minimum, the
/// remainder goes to the highest priority first (up to its max), then the next.
#[test]
fn modm_minimums_then_priority_order() {
    let tasks = [d(10.0, 1, None), d(30.0, 5, Some(60.0)), d(20.0, 3, None)];
    let a = allocate(&tasks, 200.0);
    assert!(!a.scaled);
    // 60 of minimums; 140 left: task 1 (prio 5) up to its max 60 (+30), then task 2 (prio 3)
    // takes the remaining 110; task 0 (prio 1) keeps its minimum.
    assert_eq!(a.rates, vec![10.0, 60.0, 130.0]);
    for (r, t) in a.rates.iter().zip(&tasks) {
        assert!(*r >= t.min_mb_s);
    }
    assert!((a.rates.iter().sum::<f64>() - 200.0).abs() < 1e-9);
    // Everyone capped: the cap is not all used, nobody exceeds its max.
    let a = allocate(&[d(10.0, 1, Some(15.0)), d(5.0, 2, Some(5.0))], 100.0);
    assert_eq!(a.rates, vec![15.0, 5.0]);
    // Equal priorities: the earlier task first.
    assert_eq!(allocate(&[d(1.0, 0, None), d(1.0, 0, None)], 10.0).rates, vec![9.0, 1.0]);
}

/// Minimums above the cap: scaled down proportionally, flagged, never above the cap.
#[test]
fn modm_cap_below_the_sum_of_minimums_scales_them() {
    let a = allocate(&[d(50.0, 9, None), d(30.0, 1, None), d(20.0, 5, None)], 50.0);
    assert!(a.scaled);
    assert_eq!(a.rates, vec![25.0, 15.0, 10.0]);
    assert_eq!(allocate(&[d(5.0, 0, None)], 0.0).rates, vec![0.0]);
    assert_eq!(allocate(&[d(f64::NAN, 0, None), d(-3.0, 1, None)], 4.0).rates, vec![0.0, 4.0]);
    assert!(allocate(&[], 10.0).rates.is_empty());
}

/// The pacer holds a task to its rate: 20 units of 100 kB at 10 MB/s take 0.2 s or more.
#[test]
fn pacer_enforces_the_rate() {
    let mut p = Pacer::default();
    let t0 = Instant::now();
    for _ in 0..20 {
        std::thread::sleep(p.wait(Instant::now(), 100_000, 10.0).unwrap());
    }
    let took = t0.elapsed().as_secs_f64();
    assert!((0.2..0.5).contains(&took), "{took}");
    assert!(p.wait(Instant::now(), 1, 0.0).is_none());
}

fn entry(b: &Backend, path: &str, source: u32) -> (Plan, Entry) {
    let p = copy::plan(b, path, source, None).unwrap();
    let e = Entry {
        id: 7,
        path: p.path.clone(),
        oid: p.oid,
        old_sidecar: p.old_text.clone(),
        new_sidecar: p.new_text.clone(),
        objects: p.objects.clone(),
        switched: false,
    };
    (p, e)
}

fn striped_file(b: &Backend, name: &str, n: usize) -> (pharos_fwd_proto::Layout, Vec<u8>) {
    b.placement.store(Arc::new(Placement { stripe_count: Some(2), stripe_size: Some(4096), ..Default::default() }));
    let (_, l, h) = b.create(name, 0o640, EXCL, 1, &Ctx::default()).unwrap();
    let data: Vec<u8> = (0..n as u32).map(|i| (i * 7 % 253) as u8).collect();
    b.write(&l, h, 0, &data, &mut IoInfo::default()).unwrap();
    b.release(&l, h).unwrap();
    (l, data)
}

fn read_all(b: &Backend, path: &str) -> Vec<u8> {
    let (l, _) = b.read_layout(path).unwrap();
    b.read(&l, 0, 1 << 20, &mut IoInfo::default()).unwrap()
}

/// Journal decisions and recovery: an entry whose copy was made but whose sidecar was not
/// switched rolls back (copies removed, old objects and data intact); one whose sidecar was
/// switched rolls forward (old objects removed, data read through the new layout); a live
/// owner's entry (locked) is not touched.
#[test]
fn journal_rolls_back_and_forward() {
    let (dir, b) = backend(4);
    let (l, data) = striped_file(&b, "a", 30_000);
    let src = l.targets[0];
    let (p, e) = entry(&b, "a", src);
    let dst = p.objects[0].2;
    assert!(!l.targets.contains(&dst));
    let live = Live::default();
    live.set_rate(1000.0);
    let io: Box<CopyIo> = Box::new(|_, _, _, _, _, _, _| {});
    copy::copy(&b, &p, 4096, &live, &*io).unwrap();
    assert_eq!(decide(&e, Some(&e.old_sidecar)), Decision::RollBack);
    assert_eq!(decide(&e, Some(&e.new_sidecar)), Decision::RollForward);
    assert_eq!(decide(&e, None), Decision::Keep);
    // A crash after the copy, before the switch: rolled back.
    let j = Journal::open(&dir.path().join("mdt"), b.placement.tmp_dir()).unwrap();
    let held = j.begin(&e).unwrap();
    assert_eq!(Migrations::recover(&b).unwrap(), (0, 0, 0), "a live owner's entry is left alone");
    drop(held); // the owner dies
    let dst_obj = b.targets[dst as usize].obj_path(p.oid, 0);
    assert!(dst_obj.exists());
    assert_eq!(Migrations::recover(&b).unwrap(), (1, 0, 0));
    assert!(!dst_obj.exists(), "the partial copy is removed");
    assert_eq!(read_all(&b, "a"), data);
    // A crash after the switch, before the old objects went: rolled forward.
    copy::copy(&b, &p, 4096, &live, &*io).unwrap();
    let held = j.begin(&e).unwrap();
    b.ns.swap_layout("a", &e.old_sidecar, &e.new_sidecar, b.placement.tmp_dir(), &|| Ok(())).unwrap();
    drop(held);
    let src_obj = b.targets[src as usize].obj_path(p.oid, 0);
    assert!(src_obj.exists());
    assert_eq!(Migrations::recover(&b).unwrap(), (0, 1, 0));
    assert!(!src_obj.exists(), "the old object is removed");
    let (now, _) = b.read_layout("a").unwrap();
    assert!(!now.targets.contains(&src) && now.targets.contains(&dst));
    assert_eq!(read_all(&b, "a"), data);
    assert_eq!(std::fs::read_dir(dir.path().join("mdt/migrations")).unwrap().count(), 0);
}

/// The switch keeps the sidecar's mode and refuses when the name holds another layout or the
/// check declines.
#[test]
fn switch_keeps_mode_and_refuses_changed_layouts() {
    let (_d, b) = backend(3);
    striped_file(&b, "f", 10_000);
    let (_p, e) = entry(&b, "f", b.read_layout("f").unwrap().0.targets[1]);
    let tmp = b.placement.tmp_dir();
    let r = b.ns.swap_layout("f", &e.old_sidecar, &e.new_sidecar, tmp, &|| Err("open".into()));
    assert!(matches!(r, Err(crate::backend::namespace::SwapRefused::Check(ref w)) if w == "open"), "{r:?}");
    let r = b.ns.swap_layout("f", &e.new_sidecar, &e.old_sidecar, tmp, &|| Ok(()));
    assert!(matches!(r, Err(crate::backend::namespace::SwapRefused::Changed(_))), "{r:?}");
    b.ns.swap_layout("f", &e.old_sidecar, &e.new_sidecar, tmp, &|| Ok(())).unwrap();
    assert_eq!(b.getattr("f", &Ctx::default()).unwrap().perm, 0o640);
}

/// Units of migration I/O seen: (target, write?, bytes).
type Seen = Arc<Mutex<Vec<(u32, bool, u64)>>>;

fn engine(b: Arc<Backend>, cap: f64) -> (Arc<Migrations>, Seen) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s2 = seen.clone();
    let io: Box<CopyIo> = Box::new(move |t, _, w, _, n, _, _| s2.lock().unwrap().push((t, w, n)));
    let s = Settings { max_total_mb_s: cap, max_active: 4, retry_s: 0.1 };
    (Migrations::start(b, s, io).unwrap(), seen)
}

fn wait_state(m: &Migrations, id: u64, want: &[State], secs: u64) -> View {
    let t0 = Instant::now();
    loop {
        let v = m.list().0.into_iter().find(|v| v.id == id).unwrap();
        if want.contains(&v.state) || t0.elapsed() > Duration::from_secs(secs) {
            return v;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The engine end to end on a backend: a file moves off its target and reads back the same;
/// an open file is deferred, not switched, and moves once closed; a cancel rolls back.
#[test]
fn engine_moves_defers_open_files_and_cancels() {
    let (dir, b) = backend(4);
    let (l, data) = striped_file(&b, "f", 100_000);
    let src = l.targets[1];
    let b = Arc::new(b);
    let (m, seen) = engine(b.clone(), 500.0);
    // Open: deferred, the layout unchanged.
    let (_, lo, h) = b.open("f", libc::O_RDWR, &Ctx::default()).unwrap();
    let src_name = b.targets[src as usize].name.clone();
    let req = |min| Request {
        source_target: src_name.clone(),
        paths: None,
        min_mb_s: Some(min),
        max_mb_s: None,
        priority: Some(1),
        unit_bytes: Some(8192),
        pool: None,
    };
    let ids = m.submit(&req(50.0)).unwrap();
    assert_eq!(ids.len(), 1);
    let v = wait_state(&m, ids[0], &[State::Deferred, State::Done, State::Failed], 10);
    assert_eq!(v.state, State::Deferred, "{v:?}");
    assert_eq!(b.read_layout("f").unwrap().0, lo);
    // A write through the open handle still lands; closing lets the task finish.
    b.write(&lo, h, 0, &data[..10], &mut IoInfo::default()).unwrap();
    b.release(&lo, h).unwrap();
    let v = wait_state(&m, ids[0], &[State::Done, State::Failed], 10);
    assert_eq!(v.state, State::Done, "{v:?}");
    let (now, _) = b.read_layout("f").unwrap();
    assert!(!now.targets.contains(&src), "{now:?}");
    assert_eq!(read_all(&b, "f"), data);
    assert!(!b.targets[src as usize].obj_path(l.oid, 1).exists());
    let s = seen.lock().unwrap();
    assert!(s.iter().any(|&(t, w, _)| t == src && !w) && s.iter().any(|&(t, w, _)| t != src && w));
    drop(s);
    // A slow task cancelled mid-copy: rolled back, the file intact where it was.
    let (l2, data2) = striped_file(&b, "g", 400_000);
    let src2 = l2.targets[0];
    let mut r = req(0.2);
    r.source_target = b.targets[src2 as usize].name.clone();
    r.paths = Some(vec!["g".into()]);
    m.set_settings(Settings { max_total_mb_s: 0.2, max_active: 4, retry_s: 0.1 }).unwrap();
    let id = m.submit(&r).unwrap()[0];
    let v = wait_state(&m, id, &[State::Copying], 5);
    assert_eq!(v.state, State::Copying);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(m.cancel(id), Some(State::Copying));
    let v = wait_state(&m, id, &[State::Cancelled], 5);
    assert_eq!(v.state, State::Cancelled, "{v:?}");
    assert_eq!(b.read_layout("g").unwrap().0, l2);
    assert_eq!(read_all(&b, "g"), data2);
    assert!(b
        .targets
        .iter()
        .enumerate()
        .all(|(i, t)| l2.targets.contains(&(i as u32)) || !t.obj_path(l2.oid, 0).exists()));
    assert_eq!(std::fs::read_dir(dir.path().join("mdt/migrations")).unwrap().count(), 0);
    assert_eq!(m.list().0.iter().filter(|v| v.live_rate_check()).count(), 0);
}

impl View {
    /// A finished task has no rate allocated.
    fn live_rate_check(&self) -> bool {
        self.state.finished() && self.rate_mb_s != 0.0
    }
}

/// Another daemon (a second backend on the same MDT and targets) that read a file before it
/// moved off a target and back keeps no open file of the removed object: it reads what was
/// written after the moves.
#[test]
fn other_daemons_reopen_moved_objects() {
    let (dir, a) = backend(3);
    let pool = Pool {
        targets: vec!["ost0".into(), "ost1".into()],
        max_perf: Default::default(),
        stripe_count: None,
        component_size: None,
    };
    let p = Placement { pools: [("p".to_string(), pool)].into(), default_pool: Some("p".into()), ..Default::default() };
    a.placement.store(Arc::new(p));
    let (_, l, h) = a.create("f", 0o644, EXCL, 1, &Ctx::default()).unwrap();
    a.write(&l, h, 0, &[1u8; 5000], &mut IoInfo::default()).unwrap();
    a.release(&l, h).unwrap();
    let other = backend_on(&dir, 3);
    assert_eq!(other.read(&l, 0, 5000, &mut IoInfo::default()).unwrap(), vec![1u8; 5000]);
    let a = Arc::new(a);
    let (m, _) = engine(a.clone(), 1000.0);
    let name = |t: u32| a.targets[t as usize].name.clone();
    for _ in 0..2 {
        let src = a.read_layout("f").unwrap().0.targets[0];
        let r = Request {
            source_target: name(src),
            paths: Some(vec!["f".into()]),
            min_mb_s: Some(100.0),
            max_mb_s: None,
            priority: None,
            unit_bytes: Some(4096),
            pool: None,
        };
        let id = m.submit(&r).unwrap()[0];
        assert_eq!(wait_state(&m, id, &[State::Done, State::Failed], 10).state, State::Done);
    }
    let (back, _) = a.read_layout("f").unwrap();
    assert_eq!(back.targets, l.targets, "moved off and back again");
    let (_, l2, h) = a.open("f", libc::O_RDWR, &Ctx::default()).unwrap();
    a.write(&l2, h, 0, &[2u8; 5000], &mut IoInfo::default()).unwrap();
    let seen = other.read(&l2, 0, 5000, &mut IoInfo::default()).unwrap();
    assert!(seen.len() == 5000 && seen.iter().all(|&x| x == 2), "the other daemon read the removed object");
    a.release(&l2, h).unwrap();
}
