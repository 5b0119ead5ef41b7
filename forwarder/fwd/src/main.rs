//! `pharos-fwd`: the Pharos forwarding daemon. See forwarder/README.md.
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use pharos_fwd::admin::{self, AdminState};
use pharos_fwd::backend::cache::{PageCache, Policy as CachePolicy};
use pharos_fwd::backend::migrate::{Migrations, Plan, Settings as MigrationSettings};
use pharos_fwd::backend::{Backend, Placement};
use pharos_fwd::clock::wall_ns;
use pharos_fwd::metrics::MetricsShipper;
use pharos_fwd::records::{migration_record, RecordSink};
use pharos_fwd::server::{Config, Server};
use pharos_fwd_proto::auth::{AdminToken, SiteKey};
use pharos_fwd_proto::daemon;
use pharos_wire::sink::{Sink, SinkConfig};

#[derive(Parser, Debug)]
#[command(name = "pharos-fwd", version, about = "Pharos I/O forwarding daemon")]
struct Cli {
    /// Request listener (loopback), host:port.
    #[arg(long, env = "PHAROS_FWD_LISTEN", default_value = "127.0.0.1:7400")]
    listen: String,
    /// Admin HTTP listener (loopback), host:port.
    #[arg(long, env = "PHAROS_FWD_ADMIN", default_value = "127.0.0.1:7401")]
    admin: String,
    /// Name of this forwarding node (records, metrics, producer id).
    #[arg(long, env = "PHAROS_FWD_NODE", default_value = "fwd0")]
    node_name: String,
    /// Namespace (MDT) directory; the tree lives in <mdt>/ns.
    #[arg(long, env = "PHAROS_FWD_MDT")]
    mdt: PathBuf,
    /// A storage target NAME=DIR (repeatable).
    #[arg(long = "target", value_name = "NAME=DIR")]
    targets: Vec<String>,
    /// Directory holding targets ost0..ost<N-1> (with --target-count).
    #[arg(long, env = "PHAROS_FWD_TARGETS_ROOT")]
    targets_root: Option<PathBuf>,
    #[arg(long, env = "PHAROS_FWD_TARGET_COUNT", default_value_t = 0)]
    target_count: usize,
    /// Token-bucket limit NAME=MB/s of a target (repeatable; shared by all daemons).
    #[arg(long = "limit", value_name = "NAME=MBPS")]
    limits: Vec<String>,
    /// Injected latency NAME=MS added to every request of a target (repeatable).
    #[arg(long = "latency-ms", value_name = "NAME=MS")]
    latencies: Vec<String>,
    /// Injected service-time factor NAME=F (>= 1) of a target (repeatable).
    #[arg(long = "slowdown", value_name = "NAME=F")]
    slowdowns: Vec<String>,
    /// Initial placement document: JSON text, or @FILE.
    #[arg(long, env = "PHAROS_FWD_PLACEMENT")]
    placement: Option<String>,
    /// Worker threads.
    #[arg(long, env = "PHAROS_FWD_WORKERS", default_value_t = 16)]
    workers: usize,
    /// Weights of the metadata, small-data and large-data queues.
    #[arg(long, env = "PHAROS_FWD_WEIGHTS", default_value = "4,2,1")]
    weights: String,
    /// Masters, queue kind, scheduler (issue 12, items 2 and 5).
    #[command(flatten)]
    threads: pharos_fwd::raas::ThreadsArgs,
    /// Capacity of each request queue.
    #[arg(long, env = "PHAROS_FWD_QUEUE_DEPTH", default_value_t = 128)]
    queue_depth: usize,
    /// Data requests up to this many bytes are "small".
    #[arg(long, env = "PHAROS_FWD_SMALL_MAX", default_value_t = 65536)]
    small_max: u64,
    /// Page cache of file data on this forwarding node, MiB (0: off). Sees the writes of the
    /// site's other daemons through the shared data generations: see backend/cache.rs.
    #[arg(long, env = "PHAROS_FWD_CACHE_MB", default_value_t = 0)]
    cache_mb: u64,
    /// Replacement policy of the page cache: fgf-lru (fine-grained-first LRU, Li & Sun) or
    /// lru (Linux's active/inactive two-list LRU, the baseline).
    #[arg(long, env = "PHAROS_FWD_CACHE_POLICY", default_value = "fgf-lru")]
    cache_policy: String,
    /// Reads up to this many bytes are fine-grained for the page cache.
    #[arg(long, env = "PHAROS_FWD_CACHE_FINE_MAX", default_value_t = 65536)]
    cache_fine_max: u64,
    /// Gather-Arrange-Scatter of writes per compute node (Ohta et al. 2010): on or off.
    /// Off by default: gathered writes reach the targets (and other daemons) at the node's
    /// buffer limit, when the node is idle for --gas-flush-ms (at the latest 20 x that after
    /// its oldest write), or at the file's read, stat, fsync or close.
    #[arg(long, env = "PHAROS_FWD_GAS", default_value = "off")]
    gas: String,
    /// Gather buffer of each compute node, KiB.
    #[arg(long, env = "PHAROS_FWD_GAS_BUFFER_KB", default_value_t = 16384)]
    gas_buffer_kb: u64,
    /// Idle time of a compute node after which its gathered writes are flushed, ms (and 20 x
    /// this the oldest age of a gathered write).
    #[arg(long, env = "PHAROS_FWD_GAS_FLUSH_MS", default_value_t = 5)]
    gas_flush_ms: u64,
    /// Connections served at once.
    #[arg(long, env = "PHAROS_FWD_MAX_CONNS", default_value_t = 512)]
    max_conns: u32,
    /// Accept the shared-memory data region of a mount on the same host (issue 12, item 1):
    /// its data then moves through a sealed memfd instead of the socket.
    #[arg(long, env = "PHAROS_FWD_SHM_DATA", default_value_t = true, action = clap::ArgAction::Set)]
    shm_data: bool,
    /// Kafka bootstrap servers.
    #[arg(long, env = "PHAROS_KAFKA_BOOTSTRAP", default_value = "127.0.0.1:19092")]
    brokers: String,
    /// Do not ship records and metrics (they are still counted).
    #[arg(long, env = "PHAROS_FWD_NO_KAFKA")]
    no_kafka: bool,
    #[arg(long, env = "PHAROS_FWD_TOPIC", default_value = "pharos.io.requests")]
    topic: String,
    #[arg(long, env = "PHAROS_FWD_METRICS_TOPIC", default_value = "pharos.target.metrics")]
    metrics_topic: String,
    /// Target metrics interval, ms.
    #[arg(long, env = "PHAROS_FWD_METRICS_INTERVAL_MS", default_value_t = 1000)]
    metrics_interval_ms: u32,
    /// Written (with the listen addresses) once the daemon serves.
    #[arg(long, env = "PHAROS_FWD_READY_FILE")]
    ready_file: Option<PathBuf>,
    /// The site key (a root-only file, the same on every daemon and mount of the site):
    /// connection handshake and capabilities.
    #[arg(long, env = "PHAROS_FWD_KEY_FILE")]
    key_file: PathBuf,
    /// The admin token (a root-only file): required on the admin interface but GET /status.
    /// Without it, the admin interface answers only GET /status.
    #[arg(long, env = "PHAROS_FWD_ADMIN_TOKEN_FILE")]
    admin_token_file: Option<PathBuf>,
    /// Online migration (admin `/migrations`; journal `<mdt>/migrations`): on or off.
    #[arg(long, env = "PHAROS_FWD_MIGRATION", default_value_t = true, action = clap::ArgAction::Set)]
    migration: bool,
    /// Total cap of all migration tasks, MB/s (MODM; `PUT /migrations` changes it).
    #[arg(long, env = "PHAROS_FWD_MIGRATION_MAX_MB_S", default_value_t = 200.0)]
    migration_max_mb_s: f64,
    /// Migration tasks copying at once.
    #[arg(long, env = "PHAROS_FWD_MIGRATION_MAX_ACTIVE", default_value_t = 4)]
    migration_max_active: usize,
}

fn kv(s: &str, what: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .ok_or_else(|| format!("{what} {s:?}: expected NAME=VALUE"))
}

fn run(cli: Cli) -> Result<(), String> {
    let mut targets: Vec<(String, PathBuf)> = Vec::new();
    for t in &cli.targets {
        let (n, d) = kv(t, "--target")?;
        targets.push((n, PathBuf::from(d)));
    }
    if let Some(root) = &cli.targets_root {
        if cli.target_count == 0 {
            return Err("--targets-root needs --target-count > 0".into());
        }
        for i in 0..cli.target_count {
            targets.push((format!("ost{i}"), root.join(format!("ost{i}"))));
        }
    }
    if targets.is_empty() {
        return Err("no storage targets: give --target NAME=DIR or --targets-root DIR --target-count N".into());
    }
    let mut names = std::collections::HashSet::new();
    for (n, _) in &targets {
        if !names.insert(n.clone()) {
            return Err(format!("target {n} given twice"));
        }
    }
    let weights: Vec<u32> = cli
        .weights
        .split(',')
        .map(|w| w.trim().parse::<u32>())
        .collect::<Result<_, _>>()
        .map_err(|_| format!("--weights {:?}: expected three integers", cli.weights))?;
    if weights.len() != 3 || weights.contains(&0) {
        return Err(format!("--weights {:?}: expected three integers >= 1", cli.weights));
    }
    let policy: CachePolicy = cli.cache_policy.parse().map_err(|e| format!("--cache-policy: {e}"))?;
    let gas = match cli.gas.as_str() {
        "on" | "true" | "1" => true,
        "off" | "false" | "0" => false,
        g => return Err(format!("--gas {g:?}: expected on or off")),
    };
    if gas && !(4..=1 << 20).contains(&cli.gas_buffer_kb) {
        return Err(format!("--gas-buffer-kb {}: expected 4..=1048576", cli.gas_buffer_kb));
    }
    if gas && !(1..=60_000).contains(&cli.gas_flush_ms) {
        return Err(format!("--gas-flush-ms {}: expected 1..=60000", cli.gas_flush_ms));
    }
    if cli.metrics_interval_ms == 0 {
        return Err("--metrics-interval-ms must be > 0".into());
    }
    let key = SiteKey::from_file(&cli.key_file).map_err(|e| format!("--key-file {e}"))?;
    let admin_token = match &cli.admin_token_file {
        Some(f) => Some(AdminToken::from_file(f).map_err(|e| format!("--admin-token-file {e}"))?),
        None => None,
    };
    let backend = Backend::new(&cli.mdt, &targets).map_err(|e| format!("backend: {e}"))?;
    if cli.cache_mb > 1 << 20 {
        return Err(format!("--cache-mb {}: at most {} (1 TiB)", cli.cache_mb, 1u64 << 20));
    }
    if cli.cache_mb > 0 {
        let _ = backend.cache.set(PageCache::new(cli.cache_mb, policy, cli.cache_fine_max));
        log::info!("page cache on ({} MiB, {})", cli.cache_mb, policy.name());
    }
    // Opens of daemons that died are dropped; unlinked files nobody holds open go.
    let gc = backend.gc();
    log::info!("pharos-fwd {}: daemon id {:016x}; start gc: {gc:?}", cli.node_name, backend.daemon_id);
    let find = |n: &str| backend.target_index(n).ok_or_else(|| format!("unknown target {n}"));
    for l in &cli.limits {
        let (n, v) = kv(l, "--limit")?;
        let v: f64 = v.parse().map_err(|_| format!("--limit {l}: bad number"))?;
        backend.targets[find(&n)? as usize].shm.set_max_perf(v);
    }
    for l in &cli.latencies {
        let (n, v) = kv(l, "--latency-ms")?;
        let v: f64 = v.parse().map_err(|_| format!("--latency-ms {l}: bad number"))?;
        backend.targets[find(&n)? as usize].shm.set_added_latency_ns((v * 1e6) as u64);
    }
    for l in &cli.slowdowns {
        let (n, v) = kv(l, "--slowdown")?;
        let v: f64 = v.parse().map_err(|_| format!("--slowdown {l}: bad number"))?;
        if v < 1.0 {
            return Err(format!("--slowdown {l}: factor must be >= 1"));
        }
        backend.targets[find(&n)? as usize].shm.set_slowdown(v);
    }
    if let Some(p) = &cli.placement {
        let text = match p.strip_prefix('@') {
            Some(f) => std::fs::read_to_string(f).map_err(|e| format!("--placement {f}: {e}"))?,
            None => p.clone(),
        };
        let pl: Placement = serde_json::from_str(&text).map_err(|e| format!("--placement: {e}"))?;
        backend.validate_placement(&pl).map_err(|e| format!("--placement: {e}"))?;
        backend.placement.store(Arc::new(pl));
    }
    let listener = TcpListener::bind(&cli.listen).map_err(|e| format!("--listen {}: {e}", cli.listen))?;
    let admin_l = TcpListener::bind(&cli.admin).map_err(|e| format!("--admin {}: {e}", cli.admin))?;
    // Port 0 asks the kernel for a free port: the ready file carries the bound addresses.
    let listen_addr = listener.local_addr().map_err(|e| format!("--listen {}: {e}", cli.listen))?;
    let admin_addr = admin_l.local_addr().map_err(|e| format!("--admin {}: {e}", cli.admin))?;
    let producer_id = format!("pharos-fwd-{}-{}-{:x}", cli.node_name, std::process::id(), wall_ns());
    let host = cli.node_name.clone();
    let brokers = if cli.no_kafka { None } else { Some(cli.brokers.as_str()) };
    let sink = match brokers {
        Some(b) => {
            let mut sc = SinkConfig::new(b, &cli.topic, &producer_id, &host);
            sc.close_timeout = Duration::from_secs(10);
            Some(Sink::new(sc).map_err(|e| format!("kafka sink: {e}"))?)
        }
        None => None,
    };
    let records = Arc::new(RecordSink::new(sink));
    let mut shipper = MetricsShipper::new(brokers, &cli.metrics_topic, &format!("{producer_id}-metrics"), &host)?;
    let cfg = Config {
        shm_data: cli.shm_data,
        node_name: cli.node_name.clone(),
        workers: cli.workers.max(1),
        weights: [weights[0], weights[1], weights[2]],
        queue_depth: [cli.queue_depth, cli.queue_depth, (cli.queue_depth / 2).max(1)],
        small_max: cli.small_max,
        max_conns: cli.max_conns,
        key,
        threads: cli.threads.config(cli.workers.max(1))?,
    };
    let backend = Arc::new(backend);
    if gas {
        log::warn!("gather-arrange-scatter on: other daemons see a write once flushed (at most 20 x --gas-flush-ms)");
        backend.enable_gas((cli.gas_buffer_kb << 10) as usize, Duration::from_millis(cli.gas_flush_ms));
    }
    let server = Server::new(cfg, backend, records.clone());
    server.start(listener);
    let migrations = if cli.migration {
        // Entries of dead daemons' migrations first (after the open-marker GC above).
        let n = Migrations::recover(&server.backend).map_err(|e| format!("migration journal: {e}"))?;
        log::info!("migration journal: {} rolled back, {} rolled forward, {} kept", n.0, n.1, n.2);
        let (rec, node, b) = (records.clone(), cli.node_name.clone(), server.backend.clone());
        let io = Box::new(move |t: u32, p: &Plan, write: bool, off: u64, len: u64, ns: u64, took: Duration| {
            let target = &b.targets[t as usize].name;
            rec.push(migration_record(&node, &p.path, target, p.oid, write, off, len, ns, took));
        });
        let s = MigrationSettings {
            max_total_mb_s: cli.migration_max_mb_s,
            max_active: cli.migration_max_active.max(1),
            ..Default::default()
        };
        Some(Migrations::start(server.backend.clone(), s, io).map_err(|e| format!("migration: {e}"))?)
    } else {
        None
    };
    admin::spawn(
        admin_l,
        Arc::new(AdminState {
            server: server.clone(),
            metrics_stats: Box::new(shipper.stats_handle()),
            token: admin_token,
            migrations,
        }),
    );

    let term = daemon::term_flag()?;
    if let Some(f) = &cli.ready_file {
        daemon::write_ready_file(f, &[("listen", &listen_addr), ("admin", &admin_addr)])?;
    }
    log::info!("pharos-fwd {} serving on {} (admin {})", cli.node_name, listen_addr, admin_addr);
    let interval = Duration::from_millis(cli.metrics_interval_ms as u64);
    let mut next = Instant::now() + interval;
    let mut start_ns = wall_ns();
    while !term.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(20));
        if Instant::now() >= next {
            let m = server.stats.take(&server.backend, &cli.node_name, start_ns, cli.metrics_interval_ms);
            shipper.ship(m);
            start_ns = wall_ns();
            next += interval;
        }
    }
    log::info!("pharos-fwd {}: SIGTERM, flushing records", cli.node_name);
    server.stop.store(true, Ordering::Relaxed);
    server.backend.gas_flush_all();
    records.flush(Duration::from_secs(10));
    shipper.flush(Duration::from_secs(5));
    Ok(())
}

/// The daemon's entry point (also of `pharos-fwd-hooks`, the test build: `src/bin/`).
pub fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    daemon::exit_on_error("pharos-fwd", run(Cli::parse()));
}
