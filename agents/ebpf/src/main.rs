//! pharos-agent: per-request I/O tracing of HPC jobs with eBPF.
//!
//! Kernel side: `src/bpf/iotrace.bpf.c` (syscall and block tracepoints, in-kernel cgroup
//! filter, Beacon-style online merging of contiguous requests). User space: `tracer` (load,
//! attach, ring buffer, sweeper), `registry` (cgroup → job, rank, paths), `record`
//! (event → pharos.v1.IoRecord), `metrics` (Prometheus text), and the Kafka sink of
//! `pharos-wire`.
mod metrics;
mod record;
mod registry;
mod tracer;

use std::io::Write;
use std::mem::MaybeUninit;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Parser;
use pharos_wire::sink::{Sink, SinkConfig};

/// Exit code of a startup check that failed.
const EXIT_STARTUP: i32 = 2;
const BTF_PATH: &str = "/sys/kernel/btf/vmlinux";
const SLURM_SCOPE: &str = "system.slice/slurmstepd.scope";

/// pharos-agent: eBPF I/O tracing of HPC jobs (syscall and block layer) into Kafka.
#[derive(Parser, Debug, Clone)]
#[command(version, about)]
pub struct Cli {
    /// Kafka bootstrap servers.
    #[arg(long, env = "PHAROS_KAFKA_BOOTSTRAP", default_value = "127.0.0.1:19092")]
    brokers: String,
    /// Kafka topic of IoBatch messages.
    #[arg(long, env = "PHAROS_TOPIC_REQUESTS", default_value = "pharos.io.requests")]
    topic: String,
    /// Host name written into records (default: this machine's host name).
    #[arg(long, env = "PHAROS_HOST")]
    host: Option<String>,
    /// Folder under the cgroup2 mount whose job_<ID> cgroups are traced (created if missing).
    #[arg(long, env = "PHAROS_CGROUP_PARENT", default_value = "pharos")]
    cgroup_parent: String,
    /// Idle threads' pending merged records are flushed within about this many ms.
    #[arg(long, env = "PHAROS_FLUSH_MS", default_value_t = 100)]
    flush_ms: u64,
    /// Records per Kafka batch, at most.
    #[arg(long, env = "PHAROS_BATCH_MAX_RECORDS", default_value_t = 4096)]
    batch_max_records: usize,
    /// A batch leaves at most this many ms after its first record. Every batch is one insert of
    /// the pipeline (on a single-node stack, ~0.1-0.2 s of its CPU beside the job: at 200 ms,
    /// 5 a second during a job); a larger value trades record latency for that CPU.
    #[arg(long, env = "PHAROS_BATCH_MAX_MS", default_value_t = 200)]
    batch_max_ms: u64,
    /// Heartbeat: an empty batch leaves when no batch left for this many ms (0: none). The
    /// pipeline's io_batches rows are the agent's liveness timeline (docs/architecture.md).
    #[arg(long, env = "PHAROS_HEARTBEAT_MS", default_value_t = 2000)]
    heartbeat_ms: u64,
    /// Records waiting for Kafka, at most (beyond: dropped and counted as overflow_drops).
    #[arg(long, env = "PHAROS_QUEUE_MAX_RECORDS", default_value_t = 262144)]
    queue_max_records: usize,
    /// Prometheus metrics listen address ("" disables).
    #[arg(long, env = "PHAROS_METRICS_ADDR", default_value = "127.0.0.1:9435")]
    metrics_addr: String,
    /// File written once every probe is attached.
    #[arg(long, env = "PHAROS_READY_FILE")]
    ready_file: Option<PathBuf>,
    /// Print records as JSON lines on stdout instead of sending them to Kafka.
    #[arg(long, env = "PHAROS_STDOUT_JSON")]
    stdout_json: bool,
    /// With --stdout-json: send to Kafka as well.
    #[arg(long, env = "PHAROS_KAFKA_TOO")]
    kafka_too: bool,
    /// Do not record block-layer requests of tasks outside jobs.
    #[arg(long, env = "PHAROS_BLOCK_JOBS_ONLY")]
    block_jobs_only: bool,
    /// Extra watched root cgroups (paths relative to the cgroup2 mount), up to 8 roots in all.
    #[arg(long = "watch-cgroup", env = "PHAROS_WATCH_CGROUPS", value_delimiter = ',')]
    watch_cgroups: Vec<String>,
    /// Seconds between stats lines on stderr.
    #[arg(long, env = "PHAROS_STATS_SECS", default_value_t = 10)]
    stats_secs: u64,
    /// Verbose logging on stderr.
    #[arg(short, long, env = "PHAROS_VERBOSE")]
    verbose: bool,
}

fn fail(msg: impl std::fmt::Display) -> ! {
    eprintln!("pharos-agent: {msg}");
    std::process::exit(EXIT_STARTUP);
}

/// True when the effective capabilities allow loading tracing programs.
fn can_load_bpf() -> bool {
    const CAP_SYS_ADMIN: u32 = 21;
    const CAP_PERFMON: u32 = 38;
    const CAP_BPF: u32 = 39;
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else { return false };
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    let has = |c: u32| eff & (1u64 << c) != 0;
    has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON))
}

/// Mount point of the cgroup v2 hierarchy, from /proc/mounts.
fn cgroup2_mount() -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/mounts").ok()?;
    mounts.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() > 2 && f[2] == "cgroup2").then(|| PathBuf::from(f[1].replace("\\040", " ")))
    })
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    if unsafe { libc::gethostname(buf.as_mut_ptr() as *mut libc::c_char, buf.len()) } == 0 {
        let n = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        return String::from_utf8_lossy(&buf[..n]).into_owned();
    }
    "localhost".into()
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// CLOCK_REALTIME - CLOCK_MONOTONIC, in ns (bpf_ktime_get_ns is CLOCK_MONOTONIC).
fn wall_offset_ns() -> u64 {
    let m1 = clock_ns(libc::CLOCK_MONOTONIC);
    let r = clock_ns(libc::CLOCK_REALTIME);
    let m2 = clock_ns(libc::CLOCK_MONOTONIC);
    r.wrapping_sub(m1 / 2 + m2 / 2)
}

/// Level of `dir` below the cgroup2 root (the root is level 0).
fn cgroup_level(cg2: &Path, dir: &Path) -> u32 {
    dir.strip_prefix(cg2).map(|r| r.components().count() as u32).unwrap_or(0)
}

/// Timeout of one ring buffer poll of the main loop: `until_sweep` (time left until the next
/// sweep) at most `cap`, rounded up to whole milliseconds. `ring_buffer__poll` takes whole
/// milliseconds: a remainder under 1 ms, truncated to 0, returns at once, so the loop would spin
/// (epoll_wait without sleeping) for the last millisecond before every sweep, 20 times a second.
fn poll_timeout(until_sweep: Duration, cap: Duration) -> Duration {
    Duration::from_millis(until_sweep.min(cap).as_nanos().div_ceil(1_000_000) as u64)
}

struct Logger(bool);
impl log::Log for Logger {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= if self.0 { log::Level::Debug } else { log::Level::Warn }
    }
    fn log(&self, r: &log::Record) {
        if self.enabled(r.metadata()) && r.target().starts_with("pharos") {
            eprintln!("pharos-agent: {}: {}", r.level().as_str().to_lowercase(), r.args());
        }
    }
    fn flush(&self) {}
}

fn main() {
    let cli = Cli::parse();
    let _ = log::set_boxed_logger(Box::new(Logger(cli.verbose))).map(|()| log::set_max_level(log::LevelFilter::Debug));

    // Startup checks: one clear line on stderr and exit code 2, never a panic.
    if !can_load_bpf() {
        fail("needs root (CAP_BPF, CAP_PERFMON) to load eBPF programs");
    }
    if !Path::new(BTF_PATH).exists() {
        fail(format_args!("kernel BTF not found at {BTF_PATH} (needs CONFIG_DEBUG_INFO_BTF)"));
    }
    let Some(cg2) = cgroup2_mount() else { fail("no cgroup2 file system mounted (see /proc/mounts)") };
    if let Err(e) = tracer::tracefs() {
        fail(e);
    }
    let parent = cg2.join(cli.cgroup_parent.trim_matches('/'));
    if let Err(e) = std::fs::create_dir_all(&parent) {
        fail(format_args!("cannot create cgroup {}: {e}", parent.display()));
    }
    let mut root_dirs = vec![parent];
    let slurm = cg2.join(SLURM_SCOPE);
    if slurm.is_dir() {
        root_dirs.push(slurm);
    }
    for w in &cli.watch_cgroups {
        let d = cg2.join(w.trim_matches('/'));
        if d.is_dir() && !root_dirs.contains(&d) {
            root_dirs.push(d);
        }
    }
    if root_dirs.len() > tracer::MAX_ROOTS {
        fail(format_args!("at most {} watched cgroup roots", tracer::MAX_ROOTS));
    }
    let roots: Vec<(u64, u32)> = root_dirs
        .iter()
        .map(|d| {
            let ino =
                std::fs::metadata(d).map(|m| m.ino()).unwrap_or_else(|e| fail(format_args!("{}: {e}", d.display())));
            (ino, cgroup_level(&cg2, d))
        })
        .collect();

    let mut storage = MaybeUninit::uninit();
    let mut fallback_storage = MaybeUninit::uninit();
    let cfg = tracer::Config { roots, block_all: !cli.block_jobs_only };
    let mut tracer = tracer::Tracer::load(&mut storage, &mut fallback_storage, &cfg).unwrap_or_else(|e| fail(e));
    if let Err(e) = run(&cli, &mut tracer, root_dirs) {
        fail(format_args!("{e:#}"));
    }
}

fn run(cli: &Cli, tracer: &mut tracer::Tracer<'_>, root_dirs: Vec<PathBuf>) -> anyhow::Result<()> {
    let host = cli.host.clone().unwrap_or_else(hostname);
    let stop = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGINT, stop.clone())?;
    signal_hook::flag::register(signal_hook::consts::SIGTERM, stop.clone())?;

    let sink = if !cli.stdout_json || cli.kafka_too {
        let start = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos();
        let producer_id = format!("{host}:agent:{}:{start}", std::process::id());
        let mut sc = SinkConfig::new(&cli.brokers, &cli.topic, &producer_id, &host);
        sc.batch_max_records = cli.batch_max_records;
        sc.batch_max_ms = cli.batch_max_ms;
        sc.heartbeat = Duration::ZERO; // from the moment every probe is attached, below
        sc.queue_max_records = cli.queue_max_records;
        Some(Sink::new(sc).map_err(|e| anyhow::anyhow!("kafka producer: {e}"))?)
    } else {
        None
    };

    let mut registry = registry::Registry::new(root_dirs.clone());
    let (procs, fds) = registry.backfill();
    log::debug!("backfill: {procs} processes, {fds} open files in watched cgroups");

    let conv = std::cell::RefCell::new(record::Converter {
        host: host.clone(),
        wall_offset_ns: wall_offset_ns(),
        registry,
        sink: sink.as_ref(),
        stdout: cli.stdout_json.then(|| std::io::BufWriter::with_capacity(1 << 16, std::io::stdout())),
        stats: Default::default(),
    });
    let mut rbb = libbpf_rs::RingBufferBuilder::new();
    rbb.add(tracer.events_map(), |data: &[u8]| {
        if let Some(ev) = tracer::parse(data) {
            conv.borrow_mut().handle(&ev);
        }
        0
    })?;
    let rb = rbb.build()?;

    tracer.attach()?;
    log::debug!("system calls traced with {:?} tracepoints", tracer.mode);
    if !tracer.disabled.is_empty() {
        log::warn!("tracepoints missing on this kernel, programs disabled: {}", tracer.disabled.join(", "));
    }
    let metrics = metrics::Server::start(&cli.metrics_addr)?;
    if let Some(s) = &sink {
        // a heartbeat says "tracing": the first leaves now, then one whenever the agent is idle
        s.set_heartbeat(Duration::from_millis(cli.heartbeat_ms))?;
    }
    if let Some(p) = &cli.ready_file {
        std::fs::write(p, format!("{}\n", std::process::id()))?;
    }
    eprintln!(
        "pharos-agent: tracing {} programs, roots {}, output {}",
        tracer.attached,
        root_dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(","),
        match (&sink, cli.stdout_json) {
            (Some(_), true) => format!("kafka {} {} + stdout", cli.brokers, cli.topic),
            (Some(_), false) => format!("kafka {} {}", cli.brokers, cli.topic),
            _ => "stdout".into(),
        }
    );

    let sweep_every = Duration::from_millis((cli.flush_ms / 2).max(10));
    let sweep_age = sweep_every;
    let mut last_sweep = Instant::now();
    let mut last_counters = Instant::now();
    let mut last_stats = Instant::now();
    let mut kernel = record::KernelCounters::default();
    while !stop.load(Ordering::Relaxed) {
        let left = poll_timeout(sweep_every.saturating_sub(last_sweep.elapsed()), Duration::from_millis(20));
        if let Err(e) = rb.poll(left) {
            if !stop.load(Ordering::Relaxed) {
                log::warn!("ring buffer poll: {e}");
            }
        }
        if last_sweep.elapsed() >= sweep_every {
            tracer.sweep(sweep_age)?;
            last_sweep = Instant::now();
            rb.consume()?;
        }
        if last_counters.elapsed() >= Duration::from_secs(1) {
            last_counters = Instant::now();
            kernel = conv.borrow_mut().kernel_counters(&tracer.counters());
            metrics.update(&conv.borrow().stats, &kernel, sink.as_ref().map(|s| s.stats()));
        }
        if cli.stats_secs > 0 && last_stats.elapsed() >= Duration::from_secs(cli.stats_secs) {
            last_stats = Instant::now();
            eprintln!(
                "pharos-agent: {}",
                record::summary(&conv.borrow().stats, &kernel, sink.as_ref().map(|s| s.stats()))
            );
        }
        conv.borrow_mut().flush_stdout();
    }

    // Clean shutdown: stop new calls, let calls in flight return, emit every pending record,
    // drain the ring buffer, then flush Kafka. No record is lost.
    tracer.detach(Duration::from_millis(50));
    for _ in 0..100 {
        rb.consume()?;
        if tracer.sweep(Duration::ZERO)? == 0 {
            break;
        }
    }
    rb.consume()?;
    kernel = conv.borrow_mut().kernel_counters(&tracer.counters());
    conv.borrow_mut().flush_stdout();
    let stats = conv.borrow().stats.clone();
    drop(rb);
    drop(conv);
    let sink_stats = sink.map(|s| s.close());
    eprintln!("pharos-agent: stopped: {}", record::summary(&stats, &kernel, sink_stats));
    std::io::stdout().flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poll_timeout_never_rounds_a_wait_down_to_zero() {
        let cap = Duration::from_millis(20);
        assert_eq!(poll_timeout(Duration::from_micros(300), cap), Duration::from_millis(1));
        assert_eq!(poll_timeout(Duration::from_micros(10_400), cap), Duration::from_millis(11));
        assert_eq!(poll_timeout(Duration::from_millis(35), cap), cap);
        assert_eq!(poll_timeout(Duration::ZERO, cap), Duration::ZERO); // the sweep is due
    }
}
