//! End-to-end tests of pharos-agent.
//!
//! Root tests (`cargo test --release -p pharos-agent -- --ignored`, as root) start the real
//! agent with `--stdout-json`, run a workload in a `pharos/job_<id>` cgroup (the workload is
//! this test binary re-executed with PHAROS_AGENT_TEST_CHILD set, entering the cgroup before
//! exec) and check the agent's records against the workload's exact request counts.
//!
//! The binary has its own `main` (`harness = false`, libtest-mimic keeps libtest's flags,
//! filters and `--ignored`): a re-executed child runs its workload and exits before any test
//! is listed, so the workload entry point is not a test that passes by doing nothing.
use std::collections::{BTreeMap, HashSet};
use std::ffi::CString;
use std::io::Write as _;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const AGENT: &str = env!("CARGO_BIN_EXE_pharos-agent");
const CHILD_ENV: &str = "PHAROS_AGENT_TEST_CHILD";

fn cgroup2() -> PathBuf {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    mounts
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f[2] == "cgroup2").then(|| PathBuf::from(f[1]))
        })
        .expect("no cgroup2 mount")
}

struct Agent {
    child: Child,
    _dir: tempfile::TempDir,
}

impl Agent {
    fn start() -> Agent {
        let dir = tempfile::tempdir().unwrap();
        let ready = dir.path().join("ready");
        let mut child = Command::new(AGENT)
            .args(["--stdout-json", "--metrics-addr", "", "--block-jobs-only", "--stats-secs", "0"])
            .arg("--ready-file")
            .arg(&ready)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let t = Instant::now();
        while !ready.exists() {
            if let Some(status) = child.try_wait().unwrap() {
                panic!("agent exited before it was ready: {status} (its stderr is above)");
            }
            assert!(t.elapsed() < Duration::from_secs(60), "agent not ready after 60 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        Agent { child, _dir: dir }
    }

    /// SIGTERM, wait, and parse every JSON line the agent printed.
    fn stop(mut self) -> Vec<Value> {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let out = std::mem::replace(&mut self.child, Command::new("true").spawn().unwrap()).wait_with_output().unwrap();
        assert!(out.status.success(), "agent exit status {:?}", out.status);
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON line {l}: {e}")))
            .collect()
    }
}

/// A `pharos/job_<id>` cgroup, removed on drop.
struct JobCgroup(PathBuf);

impl JobCgroup {
    fn new(id: &str) -> JobCgroup {
        let p = cgroup2().join("pharos").join(format!("job_{id}"));
        std::fs::create_dir_all(&p).unwrap();
        JobCgroup(p)
    }
}

impl Drop for JobCgroup {
    fn drop(&mut self) {
        for _ in 0..50 {
            if std::fs::remove_dir(&self.0).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Re-executes this test binary as a workload `mode` with `arg`, optionally inside `cgroup`,
/// with the environment variables `env` added.
fn spawn_child(mode: &str, arg: &Path, cgroup: Option<&Path>, env: &[(&str, &str)]) -> Child {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.env(CHILD_ENV, format!("{mode}:{}", arg.display())).envs(env.iter().copied()).stdout(Stdio::null());
    if let Some(cg) = cgroup {
        let procs = CString::new(cg.join("cgroup.procs").to_str().unwrap()).unwrap();
        unsafe {
            cmd.pre_exec(move || {
                // Join the job's cgroup before exec (async-signal-safe calls only).
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let mut buf = [0u8; 16];
                let mut n = libc::getpid() as u32;
                let mut i = buf.len();
                loop {
                    i -= 1;
                    buf[i] = b'0' + (n % 10) as u8;
                    n /= 10;
                    if n == 0 {
                        break;
                    }
                }
                let rc = libc::write(fd, buf[i..].as_ptr() as *const libc::c_void, buf.len() - i);
                libc::close(fd);
                if rc < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    cmd.spawn().unwrap()
}

const N_WRITES: u64 = 1000;
const N_PWRITES: u64 = 500;
const MIB: u64 = 1 << 20;
const N_READS: u64 = 256;
const READ_SIZE: u64 = 16384;

/// Workload of the main test: N sequential 4 KiB write()s, N 1 MiB pwrite()s, fsync, then
/// sequential reads.
fn workload_io(path: &Path) {
    let f = std::fs::OpenOptions::new().create(true).write(true).truncate(true).open(path).unwrap();
    let buf = vec![7u8; 4096];
    for _ in 0..N_WRITES {
        assert_eq!(unsafe { libc::write(std::os::fd::AsRawFd::as_raw_fd(&f), buf.as_ptr() as _, 4096) }, 4096);
    }
    let big = vec![9u8; MIB as usize];
    for i in 0..N_PWRITES {
        f.write_all_at(&big, N_WRITES * 4096 + i * MIB).unwrap();
    }
    f.sync_all().unwrap();
    drop(f);
    let f = std::fs::File::open(path).unwrap();
    let mut rb = vec![0u8; READ_SIZE as usize];
    for _ in 0..N_READS {
        let n = unsafe { libc::read(std::os::fd::AsRawFd::as_raw_fd(&f), rb.as_mut_ptr() as _, READ_SIZE as usize) };
        assert_eq!(n as u64, READ_SIZE);
    }
}

/// Race workload: threads doing bursts of small contiguous writes separated by idle gaps of
/// 40..120 ms, so the kernel sweeper and the owning thread race for the pending record.
const RACE_THREADS: u64 = 3;
const RACE_BURSTS: u64 = 40;
const RACE_SIZE: usize = 512;

fn race_burst_len(t: u64, b: u64) -> u64 {
    1 + (t * 7919 + b * 104729) % 37
}

fn workload_race(dir: &Path) {
    let threads: Vec<_> = (0..RACE_THREADS)
        .map(|t| {
            let path = dir.join(format!("race{t}"));
            std::thread::spawn(move || {
                let f = std::fs::File::create(&path).unwrap();
                let fd = std::os::fd::AsRawFd::as_raw_fd(&f);
                let buf = vec![1u8; RACE_SIZE];
                for b in 0..RACE_BURSTS {
                    for _ in 0..race_burst_len(t, b) {
                        assert_eq!(unsafe { libc::write(fd, buf.as_ptr() as _, RACE_SIZE) }, RACE_SIZE as isize);
                    }
                    let gap = 40 + (t * 31 + b * 17) % 81; // 40..120 ms
                    std::thread::sleep(Duration::from_millis(gap));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

/// Workload of the process outside any job: plain writes.
fn workload_outside(path: &Path) {
    let mut f = std::fs::File::create(path).unwrap();
    for _ in 0..2000 {
        f.write_all(&[3u8; 4096]).unwrap();
    }
}

/// Workload of a short-lived rank: one 4 KiB write, then exit at once.
fn workload_quick(path: &Path) {
    std::fs::write(path, [5u8; 4096]).unwrap();
}

/// Workload of a short-lived rank that forks (no exec) a process doing its one 4 KiB write, as
/// fio's job processes do: the forked process exits at once; the rank waits for it, then exits.
fn workload_fork_quick(path: &Path) {
    let path = CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: the child calls only async-signal-safe functions (open, write, close, _exit).
    unsafe {
        let pid = libc::fork();
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC, 0o644);
            let buf = [5u8; 4096];
            let ok = fd >= 0 && libc::write(fd, buf.as_ptr() as _, 4096) == 4096;
            libc::close(fd);
            libc::_exit(if ok { 0 } else { 1 });
        }
        let mut status = 0;
        assert_eq!(libc::waitpid(pid, &mut status, 0), pid);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "forked writer failed");
    }
}

/// Entry point of a re-executed child (`spec` is `mode:arg` from CHILD_ENV).
fn child_main(spec: &str) {
    let (mode, arg) = spec.split_once(':').unwrap();
    match mode {
        "io" => workload_io(Path::new(arg)),
        "race" => workload_race(Path::new(arg)),
        "outside" => workload_outside(Path::new(arg)),
        "quick" => workload_quick(Path::new(arg)),
        "forkquick" => workload_fork_quick(Path::new(arg)),
        m => panic!("unknown workload {m}"),
    }
}

fn u(v: &Value, k: &str) -> u64 {
    match &v[k] {
        Value::String(s) => s.parse().unwrap(),
        Value::Number(n) => n.as_u64().unwrap(),
        Value::Null => 0,
        x => panic!("{k}: {x}"),
    }
}

fn i(v: &Value, k: &str) -> i64 {
    match &v[k] {
        Value::String(s) => s.parse().unwrap(),
        Value::Number(n) => n.as_i64().unwrap(),
        Value::Null => 0,
        x => panic!("{k}: {x}"),
    }
}

fn s<'a>(v: &'a Value, k: &str) -> &'a str {
    v[k].as_str().unwrap_or("")
}

/// (requests, bytes) per op over `records`.
fn totals<'a>(records: impl Iterator<Item = &'a Value>) -> BTreeMap<String, (u64, u64)> {
    let mut t: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for r in records {
        let e = t.entry(s(r, "op").to_string()).or_default();
        let c = u(r, "count");
        e.0 += c;
        e.1 += i(r, "result").max(0) as u64 * c;
    }
    t
}

fn is_root() -> bool {
    unsafe { libc::geteuid() == 0 }
}

fn traces_job_io_exactly() {
    assert!(is_root());
    let me = std::process::id();
    let job = format!("agenttest_{me}");
    let cg = JobCgroup::new(&job);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("data.bin");
    let outside_file = dir.path().join("outside.bin");

    let agent = Agent::start();
    let mut outside = spawn_child("outside", &outside_file, None, &[("PHAROS_RANK", "9")]);
    let mut inside = spawn_child("io", &file, Some(&cg.0), &[("PHAROS_RANK", "2")]);
    assert!(inside.wait().unwrap().success());
    assert!(outside.wait().unwrap().success());
    let inside_pid = inside.id();
    let outside_pid = outside.id();
    std::thread::sleep(Duration::from_millis(300));
    let records = agent.stop();

    let ino = std::fs::metadata(&file).unwrap().ino();
    let path = file.to_str().unwrap();
    let mine: Vec<&Value> = records.iter().filter(|r| s(r, "job_id") == job).collect();
    assert!(!mine.is_empty(), "no records of job {job} among {}", records.len());
    // The child's own joining of the cgroup (open, write, close of cgroup.procs) happens before
    // its exec, with the test's environment: not yet the rank's.
    let cgroupfs = std::fs::metadata(cgroup2()).unwrap().dev();
    let cgroupfs = ((libc::major(cgroupfs) as u64) << 20) | libc::minor(cgroupfs) as u64;
    for r in &mine {
        assert_eq!(u(r, "pid") as u32, inside_pid, "record of another process in the job: {r}");
        if u(r, "dev") != cgroupfs {
            assert_eq!(i(r, "rank"), 2, "rank: {r}");
        }
        assert_eq!(s(r, "layer"), "LAYER_CLIENT");
    }
    let on_file: Vec<&Value> = mine.iter().copied().filter(|r| u(r, "inode") == ino).collect();
    for r in &on_file {
        assert_eq!(s(r, "path"), path, "path of {r}");
        assert_eq!(s(r, "file_type"), "FILE_TYPE_REGULAR");
    }
    let t = totals(on_file.iter().copied());
    eprintln!("totals on {path}: {t:?}");
    assert_eq!(t["OP_WRITE"], (N_WRITES, N_WRITES * 4096));
    assert_eq!(t["OP_PWRITE"], (N_PWRITES, N_PWRITES * MIB));
    assert_eq!(t["OP_READ"], (N_READS, N_READS * READ_SIZE));
    assert_eq!(t["OP_FSYNC"].0, 1);
    assert_eq!(t["OP_OPEN"].0, 2);
    assert_eq!(t["OP_CLOSE"].0, 2);
    let write_records = on_file.iter().filter(|r| s(r, "op") == "OP_WRITE").count() as u64;
    assert!(write_records * 10 < N_WRITES, "sequential writes not merged: {write_records} records");
    // The merged runs are contiguous: each starts where the previous ended.
    let mut next = 0;
    for r in on_file.iter().filter(|r| s(r, "op") == "OP_WRITE") {
        assert_eq!(u(r, "offset"), next, "{r}");
        next += u(r, "count") * 4096;
    }
    // Nothing from the process outside the job cgroup.
    let outside_path = outside_file.to_str().unwrap();
    assert!(
        !records.iter().any(|r| u(r, "pid") as u32 == outside_pid || s(r, "path") == outside_path),
        "records of a process outside the job"
    );
    let seen: HashSet<&str> = mine.iter().map(|r| s(r, "op")).collect();
    eprintln!("ops seen for the job: {seen:?}; {} records of the job, {write_records} WRITE records", mine.len());
}

fn merging_is_exact_when_sweeper_races_owner() {
    assert!(is_root());
    let job = format!("agentrace_{}", std::process::id());
    let cg = JobCgroup::new(&job);
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start();
    let mut child = spawn_child("race", dir.path(), Some(&cg.0), &[("PHAROS_RANK", "0")]);
    assert!(child.wait().unwrap().success());
    std::thread::sleep(Duration::from_millis(200));
    let records = agent.stop();
    for t in 0..RACE_THREADS {
        let path = dir.path().join(format!("race{t}"));
        let ino = std::fs::metadata(&path).unwrap().ino();
        let want: u64 = (0..RACE_BURSTS).map(|b| race_burst_len(t, b)).sum();
        let recs: Vec<&Value> = records
            .iter()
            .filter(|r| s(r, "job_id") == job && u(r, "inode") == ino && s(r, "op") == "OP_WRITE")
            .collect();
        let got = totals(recs.iter().copied());
        assert_eq!(got["OP_WRITE"], (want, want * RACE_SIZE as u64), "thread {t}");
        // Offsets tile the file exactly: no request lost or counted twice.
        let mut runs: Vec<(u64, u64)> = recs.iter().map(|r| (u(r, "offset"), u(r, "count"))).collect();
        runs.sort();
        let mut next = 0;
        for (off, c) in runs {
            assert_eq!(off, next, "thread {t}: gap or overlap at {off}");
            next += c * RACE_SIZE as u64;
        }
        eprintln!("thread {t}: {want} writes in {} records", recs.len());
    }
}

/// MPI ranks as `pharos run -- mpiexec` starts them: all in the job's `rank_0` cgroup with the
/// inherited PHAROS_RANK=0, each with its own PMI_RANK, living a few ms (exec, one write, exit):
/// gone before the agent reads their first record. Each record must still carry its PMI_RANK
/// (the kernel reads the environment at exec), not the cgroup's rank 0; also for every fourth
/// rank, whose environment holds 100 KiB before PMI_RANK (sent in several chunks), and for every
/// odd rank, whose write comes from a process it forked without exec (fio's job processes: the
/// kernel's fork event gives it the parent's rank).
fn short_lived_ranks_keep_their_rank() {
    assert!(is_root());
    let job = format!("agentquick_{}", std::process::id());
    let cg = JobCgroup::new(&job);
    let rank0 = JobCgroup({
        let p = cg.0.join("rank_0");
        std::fs::create_dir_all(&p).unwrap();
        p
    });
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::start();
    const N: usize = 48;
    let big = "x".repeat(100 << 10);
    let mut children = Vec::new();
    for i in 0..N {
        let rank = (i + 1).to_string();
        let mut env = vec![("PHAROS_RANK", "0"), ("PMI_RANK", rank.as_str()), ("PMI_SIZE", "49")];
        if i % 4 == 0 {
            env.push(("AAA_PADDING", big.as_str())); // sorted first: before PMI_RANK
        }
        let file = dir.path().join(format!("q{i}"));
        let mode = if i % 2 == 1 { "forkquick" } else { "quick" };
        children.push((spawn_child(mode, &file, Some(&rank0.0), &env), i as i64 + 1, file));
    }
    let mut ranks = BTreeMap::new(); // inode of the rank's file -> its rank
    for (child, rank, file) in &mut children {
        assert!(child.wait().unwrap().success());
        ranks.insert(std::fs::metadata(file).unwrap().ino(), *rank);
    }
    std::thread::sleep(Duration::from_millis(300));
    let records = agent.stop();
    let mut wrong = Vec::new();
    let mut seen = 0;
    for r in records.iter().filter(|r| s(r, "job_id") == job && s(r, "op") == "OP_WRITE") {
        let Some(&rank) = ranks.get(&u(r, "inode")) else { continue };
        seen += 1;
        if i(r, "rank") != rank {
            wrong.push((u(r, "pid"), rank, i(r, "rank")));
        }
    }
    eprintln!("{N} short-lived ranks: {seen} write records, {} with a wrong rank {wrong:?}", wrong.len());
    assert_eq!(seen, N, "one write record per rank");
    assert!(wrong.is_empty(), "(pid, PMI_RANK, record's rank): {wrong:?}");
}

fn unprivileged_start_fails_with_one_line() {
    let mut cmd = if is_root() {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all", AGENT]);
        c
    } else {
        Command::new(AGENT)
    };
    let out = cmd.args(["--stdout-json", "--metrics-addr", ""]).output().unwrap();
    assert!(!out.status.success(), "status {:?}", out.status);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "stderr: {err}");
    assert!(err.contains("needs root"), "stderr: {err}");
    assert!(out.stdout.is_empty());
}

fn main() -> std::process::ExitCode {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        child_main(&spec);
        return std::process::ExitCode::SUCCESS;
    }
    let args = libtest_mimic::Arguments::from_args();
    let root = |name: &'static str, f: fn()| {
        libtest_mimic::Trial::test(name, move || {
            f();
            Ok(())
        })
        .with_ignored_flag(true)
    };
    let tests = vec![
        root("traces_job_io_exactly", traces_job_io_exactly),
        root("merging_is_exact_when_sweeper_races_owner", merging_is_exact_when_sweeper_races_owner),
        root("short_lived_ranks_keep_their_rank", short_lived_ranks_keep_their_rank),
        libtest_mimic::Trial::test("unprivileged_start_fails_with_one_line", || {
            unprivileged_start_fails_with_one_line();
            Ok(())
        }),
    ];
    libtest_mimic::run(&args, tests).exit_code()
}
