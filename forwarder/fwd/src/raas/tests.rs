use super::*;

const ACC: [f64; 3] = [0.001, 0.005, 0.050];

#[test]
fn nobody_over_target_keeps_the_minimum_and_shares_the_rest() {
    let a = allocate(16, [2, 1, 1], ACC, [0.0005, 0.004, 0.0]);
    assert_eq!(a, Alloc { class: [2, 1, 1], shared: 12 });
}

#[test]
fn extras_follow_the_relative_gap() {
    // metadata 3 ms over a 1 ms target (gap 2), large 150 ms over 50 (gap 2): an even split
    let a = allocate(10, [1, 1, 1], ACC, [0.003, 0.001, 0.150]);
    assert_eq!(a.class.iter().sum::<usize>() + a.shared, 10);
    assert_eq!(a, Alloc { class: [5, 1, 4], shared: 0 }, "7 extras: 3.5 each, the tie to metadata");
    // only large over: it takes every extra
    let a = allocate(10, [1, 1, 1], ACC, [0.0, 0.0, 0.5]);
    assert_eq!(a, Alloc { class: [1, 1, 8], shared: 0 });
    // gap 1 vs gap 3: a quarter and three quarters of 8
    let a = allocate(11, [1, 1, 1], ACC, [0.002, 0.0, 0.2]);
    assert_eq!(a, Alloc { class: [3, 1, 7], shared: 0 });
}

#[test]
fn allocation_is_exact_and_respects_minimums_for_any_input() {
    let delays = [0.0, 0.0005, 0.001, 0.002, 0.01, 0.04, 0.1, 1.0, f64::NAN, f64::INFINITY];
    for w in 3..20 {
        for m in &delays {
            for s in &delays {
                for l in &delays {
                    let a = allocate(w, [1, 1, 1], ACC, [*m, *s, *l]);
                    assert_eq!(a.class.iter().sum::<usize>() + a.shared, w, "{w} {m} {s} {l}");
                    assert!(a.class.iter().all(|&n| n >= 1));
                    for c in 0..3 {
                        let over = [*m, *s, *l][c] > ACC[c] && [*m, *s, *l][c].is_finite();
                        assert!(over || a.class[c] == 1, "a class within its target gets no extra");
                    }
                }
            }
        }
    }
}

#[test]
fn more_gap_never_means_fewer_workers() {
    let mut last = 0;
    for ms in [1.0, 2.0, 4.0, 8.0, 16.0, 64.0] {
        let a = allocate(16, [1, 1, 1], ACC, [ms / 1e3, 0.0, 0.1]);
        assert!(a.class[0] >= last, "{a:?}");
        last = a.class[0];
    }
    assert!(last > 10);
}

#[test]
fn roles_reserve_the_minimum_first() {
    let a = Alloc { class: [2, 1, 3], shared: 1 };
    let r = roles(&a, [1, 1, 1]);
    use Role::*;
    assert_eq!(r, vec![Reserved(0), Reserved(1), Reserved(2), Extra(0), Extra(2), Extra(2), Shared]);
    for role in r {
        assert_eq!(Role::from_code(role.code()), role);
    }
    assert_eq!(order_of(Reserved(2)), &[2]);
    assert_eq!(order_of(Extra(2))[0], 2);
    assert_eq!(order_of(Shared), &[0, 1, 2]);
}

#[test]
fn wrr_cycle_serves_every_class() {
    let c = wrr_cycle([4, 2, 1]);
    assert_eq!(c.len(), 7);
    assert_eq!(c.iter().filter(|&&x| x == 0).count(), 4);
    assert_eq!(c.iter().filter(|&&x| x == 2).count(), 1);
    assert_eq!(c[0], 0);
}

#[test]
fn a_tick_measures_the_cycle_and_reallocates() {
    let cfg = ThreadsConfig { scheduler: SchedulerKind::Raas, ..Default::default() };
    let s = Scheduler::new(cfg, 8, [4, 2, 1]);
    let q: ClassQueues<u32> = ClassQueues::new(QueueKind::Lockfree, [4, 4, 4]);
    let mut prev = s.waits.snapshot();
    s.waits.dequeued(0, Duration::from_millis(4));
    s.waits.dequeued(0, Duration::from_millis(2));
    q.push(2, 1).unwrap(); // waiting, nothing dequeued: the whole cycle
    let m = s.tick(&mut prev, Duration::from_millis(100), &q);
    assert!((m[0] - 0.003).abs() < 1e-9 && m[1] == 0.0 && (m[2] - 0.1).abs() < 1e-9, "{m:?}");
    // gaps 2 (metadata) and 1 (large): 5 extras → 3.33 and 1.67 → 3 + 2 (remainder)
    assert_eq!(s.alloc.iter().map(|a| a.load(Relaxed)).collect::<Vec<_>>(), vec![4, 1, 3, 0]);
    let mut idx_role: Vec<Role> = s.roles.iter().map(|r| Role::from_code(r.load(Relaxed))).collect();
    idx_role.truncate(3);
    assert_eq!(idx_role, vec![Role::Reserved(0), Role::Reserved(1), Role::Reserved(2)]);
    // a quiet cycle: back to the minimum, the rest shared
    let m = s.tick(&mut prev, Duration::from_millis(100), &ClassQueues::<u32>::new(QueueKind::Mutex, [1; 3]));
    assert_eq!(m, [0.0; 3]);
    assert_eq!(s.alloc.iter().map(|a| a.load(Relaxed)).collect::<Vec<_>>(), vec![1, 1, 1, 5]);
}

/// Issue 29: under the weights scheduler a waiting metadata request is taken first, whatever
/// the worker's place in the cycle, and data is not starved (one pick in `M + 1`).
#[test]
fn weights_take_waiting_metadata_first_with_a_bound() {
    let s = Scheduler::new(ThreadsConfig::default(), 4, [4, 2, 1]);
    for start in 0..7 {
        let q: ClassQueues<u32> = ClassQueues::new(QueueKind::Lockfree, [16, 16, 16]);
        for i in 0..3 {
            q.push(1, 10 + i).unwrap();
            q.push(2, 20 + i).unwrap();
        }
        q.push(0, 1).unwrap();
        let mut pos = start;
        assert_eq!(s.next(start % 4, &mut pos, &q).map(|(_, c)| c), Some(0), "cycle position {start}");
    }
    // Every class backlogged: at most 4 metadata in a row, then data (small 2 : large 1).
    let q: ClassQueues<u32> = ClassQueues::new(QueueKind::Mutex, [64, 64, 64]);
    for i in 0..30 {
        q.push(0, i).unwrap();
        q.push(1, i).unwrap();
        q.push(2, i).unwrap();
    }
    let s = Scheduler::new(ThreadsConfig::default(), 1, [4, 2, 1]);
    let mut pos = 0;
    let picks: Vec<usize> = (0..15).map(|_| s.next(0, &mut pos, &q).unwrap().1).collect();
    assert_eq!(picks, vec![0, 0, 0, 0, 1, 0, 0, 0, 0, 2, 0, 0, 0, 0, 1]);
}
