//! `pharos-mount`: the Pharos compute-node FUSE client. See forwarder/README.md.
mod creds;
mod fs;
mod rpc;

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::get;
use axum::{Json, Router};
use clap::Parser;
use fuser::MountOption;
use pharos_fwd_proto::auth::{admin_guard, AdminToken, SiteKey};
use pharos_fwd_proto::daemon;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::info::Info;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use serde_json::{json, Value};

use crate::fs::{PharosFs, Shared};
use crate::rpc::{Mapping, Rpc, Slots};

/// Threads sending write-back creates (`--writeback-creates`), each with its own connections.
const WRITEBACK_THREADS: usize = 1;

/// Bytes per shared-memory slot: the largest FUSE request (max_write, and max_pages 256 for reads).
const SHM_SLOT_SIZE: usize = 1 << 20;

/// A random non-zero u64 (create tokens).
pub fn random_token() -> u64 {
    let mut b = [0u8; 8];
    unsafe { libc::getrandom(b.as_mut_ptr() as *mut libc::c_void, 8, 0) };
    u64::from_le_bytes(b) | 1
}

#[derive(Parser, Debug)]
#[command(name = "pharos-mount", version, about = "Pharos compute-node FUSE client")]
struct Cli {
    /// Mount point (an existing empty directory).
    #[arg(long, env = "PHAROS_MOUNT_POINT")]
    mountpoint: PathBuf,
    /// A forwarding node NAME=HOST:PORT (repeatable, in ring order).
    #[arg(
        long = "fwd",
        value_name = "NAME=HOST:PORT",
        env = "PHAROS_MOUNT_FWD",
        value_delimiter = ',',
        required = true
    )]
    fwd: Vec<String>,
    /// Forwarding nodes reserved for dedicated allocation by the control loop (repeatable):
    /// never this client's default node, last in failover order for jobs not mapped to them.
    #[arg(long = "reserved", value_name = "NAME", env = "PHAROS_MOUNT_RESERVED", value_delimiter = ',')]
    reserved: Vec<String>,
    /// Index of this compute node: the default forwarding node is index mod #shared nodes.
    #[arg(long, env = "PHAROS_MOUNT_NODE_INDEX", default_value_t = 0)]
    node_index: usize,
    /// Name of this compute node (in every request's record).
    #[arg(long, env = "PHAROS_MOUNT_COMPUTE_NODE")]
    compute_node: Option<String>,
    /// Initial per-job mapping JOB=NODE[:NODE...] (repeatable).
    #[arg(long = "job-map", value_name = "JOB=NODE[:NODE...]")]
    job_map: Vec<String>,
    /// Admin HTTP listener (loopback), host:port.
    #[arg(long, env = "PHAROS_MOUNT_ADMIN", default_value = "127.0.0.1:7501")]
    admin: String,
    /// I/O threads (concurrent requests in flight).
    #[arg(long, env = "PHAROS_MOUNT_THREADS", default_value_t = 16)]
    threads: usize,
    /// Slots of the shared-memory data region (issue 12, item 1): 1 MiB each, a sealed memfd
    /// offered to every forwarding daemon on this host; 0 = data always on the socket.
    #[arg(long, env = "PHAROS_MOUNT_SHM_SLOTS", default_value_t = 32)]
    shm_slots: usize,
    /// Let the kernel send concurrent writes to one file (FOPEN_PARALLEL_DIRECT_WRITES, Linux
    /// ≥ 6.2; ignored before): without it, FUSE passes one write per file at a time, so the
    /// ranks of an N-1 job wait for each other at the mount, not at the forwarding node.
    /// Writes that extend the file stay serialised by the kernel.
    #[arg(long, env = "PHAROS_MOUNT_PARALLEL_WRITES", default_value_t = true, action = clap::ArgAction::Set)]
    parallel_writes: bool,
    /// Attribute and entry TTL, ms (0 = no caching: every stat and lookup is a request). The
    /// forwarding nodes this mount lists push what other mounts change through them
    /// (`--invalidations`), so the TTL bounds staleness only where no push comes (a node not
    /// listed, a watch connection being re-made).
    #[arg(long, env = "PHAROS_MOUNT_ATTR_TTL_MS", default_value_t = 10_000)]
    attr_ttl_ms: u64,
    /// Keep a watch connection to every listed forwarding node and drop from the kernel's
    /// caches what other mounts change (FUSE_NOTIFY_INVAL_ENTRY / _INODE).
    #[arg(long, env = "PHAROS_MOUNT_INVALIDATIONS", default_value_t = true, action = clap::ArgAction::Set)]
    invalidations: bool,
    /// Answer lookups of names absent from a directory this mount made and holds, without a
    /// request (the lookup before each create in a job's own directory: mdtest -u, N-N
    /// per-rank directories). The forwarding node records the mount as the directory's holder
    /// and recalls it, acknowledged, before it answers another mount's create there: once that
    /// create returns, this mount asks the daemon again (a holder not watching that node: its
    /// --attr-ttl-ms).
    #[arg(long, env = "PHAROS_MOUNT_ANSWER_ABSENT_NAMES", default_value_t = true, action = clap::ArgAction::Set)]
    answer_absent_names: bool,
    /// Write-back creates in node-local rank directories (`<mount>/.nodelocal/<job>/<rank>`,
    /// written by this compute node only) and in directories this mount holds (recalled by the
    /// forwarding node first when another mount looks there): a create there is answered by the mount and sent to
    /// the forwarding node in the background, at most this many pending at once (a create
    /// beyond waits); 0 = every create waits for the forwarding node. A pending create is lost
    /// if the mount dies; fsync of the file or its directory, and the unmount, wait for them.
    /// With N > 0, every file's release is also answered at once and sent in those batches.
    #[arg(long, env = "PHAROS_MOUNT_WRITEBACK_CREATES", default_value_t = 256)]
    writeback_creates: usize,
    /// Time a forwarding node may take to answer a request, ms.
    #[arg(long, env = "PHAROS_MOUNT_RPC_TIMEOUT_MS", default_value_t = 60000)]
    rpc_timeout_ms: u64,
    /// Written once the FUSE mount is live.
    #[arg(long, env = "PHAROS_MOUNT_READY_FILE")]
    ready_file: Option<PathBuf>,
    /// The site key (a root-only file, the same as the daemons'): proves this mount to the
    /// forwarding daemons and them to it.
    #[arg(long, env = "PHAROS_MOUNT_KEY_FILE")]
    key_file: PathBuf,
    /// The admin token (a root-only file): required on the admin interface but GET /status.
    /// Without it, the admin interface answers only GET /status.
    #[arg(long, env = "PHAROS_MOUNT_ADMIN_TOKEN_FILE")]
    admin_token_file: Option<PathBuf>,
}

struct AdminState {
    sh: Arc<Shared>,
    token: Option<AdminToken>,
}

/// Counters and nodes (open, like the daemon's); the job table is `GET /mapping` (token).
async fn status(State(a): State<Arc<AdminState>>) -> Json<Value> {
    let mut v = a.sh.rpc.status();
    v["ops"] = json!(a.sh.ops.load(Ordering::Relaxed));
    v["lookups_answered_locally"] = json!(a.sh.complete.answered.load(Ordering::Relaxed));
    v["directory_recalls"] = json!(a.sh.complete.recalls.load(Ordering::Relaxed));
    v["getattrs_answered_locally"] = json!(a.sh.dir_attrs.answered.load(Ordering::Relaxed));
    v["deferred_creates"] = json!(a.sh.wb.answered.load(Ordering::Relaxed));
    v["deferred_create_errors"] = json!(a.sh.wb.errors.load(Ordering::Relaxed));
    v["pending_creates"] = json!(a.sh.wb.pending());
    v["writeback_queued"] = json!(a.sh.wb.queued());
    v["deferred_unlinks"] = json!(a.sh.wb.unlinks_answered.load(Ordering::Relaxed));
    v["deferred_unlink_errors"] = json!(a.sh.wb.unlink_errors.load(Ordering::Relaxed));
    v["writeback_batches"] = json!(a.sh.wb.batches.load(Ordering::Relaxed));
    Json(v)
}

/// The admin token check in front of every route (the daemon's rule:
/// [`pharos_fwd_proto::auth::admin_refusal`]).
async fn guard(State(a): State<Arc<AdminState>>, req: Request, next: Next) -> Response {
    admin_guard(a.token.as_ref(), req, next).await
}

async fn get_mapping(State(a): State<Arc<AdminState>>) -> Json<Value> {
    let r = &a.sh.rpc;
    Json(json!({
        "jobs": r.mapping.load_full().jobs,
        "default": r.nodes[r.default_idx].name,
        "compute_node": r.compute_node,
        "nodes": r.nodes.iter().map(|n| json!({"name": n.name, "addr": n.addr, "reserved": n.reserved})).collect::<Vec<_>>(),
    }))
}

/// The mount's counters (`/status`: FUSE operations, per forwarding node requests, failures and
/// state, failovers, replays) as Prometheus families, read at each scrape (`GET /metrics`).
struct MountCollector(Arc<Shared>);

impl std::fmt::Debug for MountCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MountCollector").field("compute_node", &self.0.rpc.compute_node).finish()
    }
}

fn counter(e: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> std::fmt::Result {
    ConstCounter::new(v).encode(e.encode_descriptor(name, help, None, MetricType::Counter)?)
}

impl Collector for MountCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
        let st = self.0.rpc.status();
        let nodes = st["nodes"].as_array().cloned().unwrap_or_default();
        let node = |n: &Value| [("node", n["name"].as_str().unwrap_or("").to_string())];
        let num = |v: &Value, k: &str| v[k].as_u64().unwrap_or(0);
        counter(
            &mut e,
            "pharos_mount_fuse_operations",
            "FUSE operations answered",
            self.0.ops.load(Ordering::Relaxed),
        )?;
        for (name, help, key) in [
            ("pharos_mount_requests", "Requests sent to a forwarding node (each try of a failover counts)", "requests"),
            (
                "pharos_mount_request_failures",
                "Requests a forwarding node did not answer (connect, send or reply failed)",
                "failures",
            ),
        ] {
            let mut f = e.encode_descriptor(name, help, None, MetricType::Counter)?;
            for n in &nodes {
                ConstCounter::new(num(n, key)).encode(f.encode_family(&node(n))?)?;
            }
        }
        let help = "1 while a forwarding node is held down after a failure, else 0";
        let mut f = e.encode_descriptor("pharos_mount_node_down", help, None, MetricType::Gauge)?;
        for n in &nodes {
            ConstGauge::new(n["down"].as_bool().unwrap_or(false) as i64).encode(f.encode_family(&node(n))?)?;
        }
        let help = "Requests tried on another forwarding node than their first";
        counter(&mut e, "pharos_mount_failovers", help, num(&st, "failovers"))?;
        let help = "Idempotent requests replayed after a node failed during them";
        counter(&mut e, "pharos_mount_replays", help, num(&st, "replays"))?;
        let help = "Pooled connections found closed by their daemon (a restart) and replaced before a request";
        counter(&mut e, "pharos_mount_stale_connections", help, num(&st, "stale_connections"))?;
        let help = "Changes other mounts made, pushed by the forwarding nodes (dropped from the kernel's caches)";
        counter(&mut e, "pharos_mount_invalidations", help, num(&st, "invalidations"))?;
        let help = "Lookups answered 'no such name' by the mount itself (directories it made and knows whole)";
        counter(
            &mut e,
            "pharos_mount_lookups_answered_locally",
            help,
            self.0.complete.answered.load(Ordering::Relaxed),
        )?;
        let help = "Directories this mount held that a forwarding node recalled (another mount added a name there)";
        counter(&mut e, "pharos_mount_directory_recalls", help, self.0.complete.recalls.load(Ordering::Relaxed))?;
        let help = "Unlinks answered by the mount in directories it holds or node-local rank directories (sent to the forwarding node after)";
        counter(&mut e, "pharos_mount_deferred_unlinks", help, self.0.wb.unlinks_answered.load(Ordering::Relaxed))?;
        let help = "Write-back unlinks the forwarding node refused after the mount had answered (the directory's next fsync gets the errno)";
        counter(&mut e, "pharos_mount_deferred_unlink_errors", help, self.0.wb.unlink_errors.load(Ordering::Relaxed))?;
        let help = "Creates in node-local rank directories and directories the mount holds answered by the mount (write-back: sent to the forwarding node after)";
        counter(&mut e, "pharos_mount_deferred_creates", help, self.0.wb.answered.load(Ordering::Relaxed))?;
        let help = "Write-back creates the forwarding node refused after the mount had answered (the file's next operation gets the errno)";
        counter(&mut e, "pharos_mount_deferred_create_errors", help, self.0.wb.errors.load(Ordering::Relaxed))?;
        let help = "Write-back creates not yet answered by the forwarding node";
        let f = e.encode_descriptor("pharos_mount_pending_creates", help, None, MetricType::Gauge)?;
        ConstGauge::new(self.0.wb.pending() as i64).encode(f)?;
        let shm = &st["shm"];
        let help = "Data requests sent through the shared-memory region (WriteShm/ReadShm)";
        counter(&mut e, "pharos_mount_shm_requests", help, num(shm, "requests"))?;
        let help = "Data requests holding a slot sent on a connection without the region (data on the socket)";
        counter(&mut e, "pharos_mount_shm_fallbacks", help, num(shm, "fallbacks"))?;
        let help = "Data requests that found no free shared-memory slot (a pooled buffer instead)";
        counter(&mut e, "pharos_mount_shm_exhausted", help, num(shm, "exhausted"))
    }
}

fn metrics_registry(sh: Arc<Shared>) -> Registry {
    let mut reg = Registry::default();
    let cn = sh.rpc.compute_node.clone();
    reg.register_collector(Box::new(MountCollector(sh)));
    let v = env!("CARGO_PKG_VERSION").to_string();
    let build = Info::new(vec![("service", "mount".to_string()), ("version", v), ("compute_node", cn)]);
    reg.register("pharos_build", "The running Pharos component and its version", build);
    reg
}

async fn put_mapping(
    State(a): State<Arc<AdminState>>,
    Json(m): Json<Mapping>,
) -> Result<Json<Value>, (StatusCode, Json<Value>)> {
    a.sh.rpc.validate(&m).map_err(|e| (StatusCode::BAD_REQUEST, Json(json!({"error": e}))))?;
    // The nodes the moved jobs leave flush this compute node's gathered writes first (rpc/remap.rs).
    let (sh, jobs) = (a.sh.clone(), m.jobs.clone());
    let flushed = tokio::task::spawn_blocking(move || sh.rpc.remap(m))
        .await
        .map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, Json(json!({"error": format!("remap: {e}")}))))?;
    Ok(Json(json!({"jobs": jobs, "flushed": flushed})))
}

fn run(cli: Cli) -> Result<(), String> {
    let mut nodes = Vec::new();
    for f in &cli.fwd {
        let (n, a) = f.split_once('=').ok_or_else(|| format!("--fwd {f:?}: expected NAME=HOST:PORT"))?;
        if nodes.iter().any(|(m, _): &(String, String)| m == n) {
            return Err(format!("--fwd: node {n} given twice"));
        }
        nodes.push((n.to_string(), a.to_string()));
    }
    if !cli.mountpoint.is_dir() {
        return Err(format!("--mountpoint {}: not a directory", cli.mountpoint.display()));
    }
    let key = SiteKey::from_file(&cli.key_file).map_err(|e| format!("--key-file {e}"))?;
    let token = match &cli.admin_token_file {
        Some(f) => Some(AdminToken::from_file(f).map_err(|e| format!("--admin-token-file {e}"))?),
        None => None,
    };
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default().trim().to_string();
    let compute_node = cli.compute_node.clone().unwrap_or_else(|| format!("{host}-cn{}", cli.node_index));
    let timeout = Duration::from_millis(cli.rpc_timeout_ms.max(1));
    let mut rpc = Rpc::new(nodes, &cli.reserved, cli.node_index, timeout, compute_node, key)
        .map_err(|e| format!("--reserved: {e}"))?;
    if cli.shm_slots > 0 {
        if cli.shm_slots > 1000 {
            return Err(format!("--shm-slots {}: at most 1000 (1 MiB each)", cli.shm_slots));
        }
        match Slots::new(cli.shm_slots, SHM_SLOT_SIZE) {
            Ok(s) => rpc.shm = Some(s),
            Err(e) => log::warn!("no shared-memory data region ({e}): data goes on the socket"),
        }
    }
    let mut m = Mapping::default();
    for j in &cli.job_map {
        let (job, ns) = j.split_once('=').ok_or_else(|| format!("--job-map {j:?}: expected JOB=NODE[:NODE...]"))?;
        m.jobs.insert(job.to_string(), ns.split(':').map(String::from).collect());
    }
    rpc.validate(&m).map_err(|e| format!("--job-map: {e}"))?;
    rpc.mapping.store(Arc::new(m));
    let admin_l = std::net::TcpListener::bind(&cli.admin).map_err(|e| format!("--admin {}: {e}", cli.admin))?;
    let admin_addr = admin_l.local_addr().map_err(|e| format!("--admin {}: {e}", cli.admin))?;

    let mut fs = PharosFs::new(rpc, cli.threads.max(1), Duration::from_millis(cli.attr_ttl_ms), cli.parallel_writes);
    // A held directory is answered for here only while a recall can reach this mount: through
    // its watch connections (none with --invalidations false or --attr-ttl-ms 0).
    let recallable = cli.invalidations && cli.attr_ttl_ms > 0;
    if cli.answer_absent_names && !recallable {
        log::info!("--answer-absent-names: off without invalidations (no recall could reach this mount)");
    }
    Arc::get_mut(&mut fs.sh).expect("not shared yet").answer_absent = cli.answer_absent_names && recallable;
    if cli.writeback_creates > 0 && cli.attr_ttl_ms == 0 {
        log::info!("--writeback-creates: off with --attr-ttl-ms 0 (the mount knows no directory whole)");
    }
    fs.start_writeback(cli.writeback_creates, WRITEBACK_THREADS);
    let sh = fs.sh.clone();
    let a_sh = fs.sh.clone();
    let sh_term = fs.sh.clone();
    let opts = [
        MountOption::FSName("pharos".into()),
        MountOption::Subtype("pharos".into()),
        MountOption::AllowOther,
        MountOption::DefaultPermissions,
        MountOption::RW,
    ];
    let session = fuser::spawn_mount2(fs, &cli.mountpoint, &opts)
        .map_err(|e| format!("mount {}: {e}", cli.mountpoint.display()))?;
    // The mount is live once a stat of the mount point is answered by this file system.
    std::fs::metadata(&cli.mountpoint).map_err(|e| format!("mount {} not answering: {e}", cli.mountpoint.display()))?;

    let reg = Arc::new(metrics_registry(sh.clone()));
    let metrics = move || {
        let reg = reg.clone();
        async move {
            let mut text = String::new();
            prometheus_client::encoding::text::encode(&mut text, &reg).expect("writing to a String");
            ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], text)
        }
    };
    let st = Arc::new(AdminState { sh, token });
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio");
        rt.block_on(async move {
            admin_l.set_nonblocking(true).expect("nonblocking");
            let l = tokio::net::TcpListener::from_std(admin_l).expect("admin listener");
            let app = Router::new()
                .route("/status", get(status))
                .route("/mapping", get(get_mapping).put(put_mapping))
                .route("/metrics", get(metrics))
                .layer(middleware::from_fn_with_state(st.clone(), guard))
                .with_state(st);
            if let Err(e) = axum::serve(l, app).await {
                log::error!("admin server: {e}");
            }
        })
    });

    let term = daemon::term_flag()?;
    if cli.invalidations && cli.attr_ttl_ms > 0 {
        for i in 0..a_sh.rpc.nodes.len() {
            let (sh, term, notifier) = (a_sh.clone(), term.clone(), session.notifier());
            std::thread::Builder::new()
                .name(format!("mount-watch-{i}"))
                .spawn(move || sh.rpc.watch(i, &|c| sh.changed_elsewhere(c, |c| invalidate(&notifier, c)), &term))
                .map_err(|e| format!("spawn watch thread: {e}"))?;
        }
    }
    {
        // A write-back create the daemon refused: its name and inode leave the kernel's caches
        // (the name was never made), from a thread of its own.
        let (tx, rx) = std::sync::mpsc::channel::<(u64, String, u64)>();
        let tx = std::sync::Mutex::new(tx);
        let f: crate::fs::RefusedHook = Box::new(move |parent, name, ino| {
            let _ = tx.lock().unwrap().send((parent, name.to_string(), ino));
        });
        let _ = a_sh.wb.on_refused.set(f);
        let notifier = session.notifier();
        std::thread::Builder::new()
            .name("mount-refused".into())
            .spawn(move || {
                for (parent, name, ino) in rx {
                    let _ = notifier.inval_entry(parent, std::ffi::OsStr::new(&name));
                    let _ = notifier.inval_inode(ino, -1, 0);
                }
            })
            .map_err(|e| format!("spawn thread: {e}"))?;
    }
    if let Some(f) = &cli.ready_file {
        daemon::write_ready_file(f, &[("mountpoint", &cli.mountpoint.display()), ("admin", &admin_addr)])?;
    }
    log::info!("pharos-mount: {} mounted (admin {})", cli.mountpoint.display(), admin_addr);
    while !term.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(50));
    }
    log::info!("pharos-mount: unmounting {}", cli.mountpoint.display());
    // The creates answered here reach the forwarding nodes first (a durability point).
    let left = sh_term.wb.pending();
    if left > 0 && !sh_term.wb.drain(timeout) {
        log::error!("{} write-back creates not sent before the unmount (of {left})", sh_term.wb.pending());
    }
    sh_term.wb.close();
    // Lazy unmount first so a busy mount point cannot keep us alive; then end the session.
    if let Ok(c) = std::ffi::CString::new(cli.mountpoint.as_os_str().as_encoded_bytes()) {
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
    drop(session);
    Ok(())
}

/// Drops what `changes` name from the kernel's caches (an entry or inode the kernel does not
/// hold answers ENOENT: nothing to drop).
fn invalidate(n: &fuser::Notifier, changes: &[pharos_fwd_proto::Change]) {
    use pharos_fwd_proto::Change;
    for c in changes {
        let r = match c {
            Change::Entry { parent, name } => n.inval_entry(*parent, std::ffi::OsStr::new(name)),
            // offset -1: the attributes only (no page cache: files are direct I/O).
            Change::Inode { ino } => n.inval_inode(*ino, -1, 0),
            Change::Recall { .. } => continue, // the mount's own table only (fs/complete.rs)
        };
        if let Err(e) = r {
            if e.raw_os_error() != Some(libc::ENOENT) {
                log::debug!("invalidation {c:?}: {e}");
            }
        }
    }
}

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    daemon::exit_on_error("pharos-mount", run(Cli::parse()));
}
