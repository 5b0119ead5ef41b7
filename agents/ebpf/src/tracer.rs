//! Kernel side handle: opens, configures, loads and attaches the `iotrace` BPF object,
//! decodes ring-buffer events, runs the pending-record sweeper and reads the per-cgroup
//! loss counters. Knows nothing about jobs (see `registry`).
use std::collections::HashMap;
use std::ffi::CStr;
use std::mem::MaybeUninit;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use libbpf_rs::skel::{OpenSkel, Skel, SkelBuilder};
use libbpf_rs::{Link, MapCore, MapFlags, OpenObject};

mod skel {
    include!(concat!(env!("OUT_DIR"), "/iotrace.skel.rs"));
}
pub use skel::types::{ph_counters, ph_env_event, ph_event, ph_root};
use skel::*;

/// `ph_event.path_kind` values (iotrace.h).
pub const PATH_DENTRY: u8 = 1;
pub const PATH_USER: u8 = 2;
/// `ph_event.flags` bits (iotrace.h).
pub const F_PATH_TRUNCATED: u8 = 1;
pub const F_ENV_TRUNCATED: u8 = 4;
/// `ph_event.op` of an exec event (iotrace.h PH_OP_EXEC, not a wire Op): `path` holds a chunk
/// (from byte `offset`, of `size` in all) of the environment of a process that exec'd in a
/// watched cgroup.
pub const OP_EXEC: u32 = 255;
/// `ph_event.op` of a fork event (iotrace.h PH_OP_FORK, not a wire Op): a process of a watched
/// cgroup (`pid`) forked a process (`tid`, its pid).
pub const OP_FORK: u32 = 254;
/// Environment bytes per exec event (iotrace.h PH_ENV_CHUNK, from the event's layout) and exec
/// events per exec (PH_ENV_CHUNKS), at most: the kernel sends at most ENV_CHUNK * ENV_CHUNKS
/// bytes of an environment.
pub const ENV_CHUNK: u64 = (std::mem::size_of::<ph_env_event>() - std::mem::size_of::<ph_event>()) as u64;
pub const ENV_CHUNKS: u64 = 16;
pub const MAX_ROOTS: usize = 8;

/// A decoded ring-buffer event: the fixed part and, for OPEN and path ops, the path bytes (for
/// exec events, the environment).
pub struct Event<'a> {
    pub ev: ph_event,
    pub path: &'a [u8],
}

/// Parses one ring-buffer sample. None when it is shorter than `ph_event`.
pub fn parse(data: &[u8]) -> Option<Event<'_>> {
    let n = std::mem::size_of::<ph_event>();
    if data.len() < n {
        return None;
    }
    // SAFETY: ph_event is plain old data generated from the object's BTF; length checked.
    let ev: ph_event = unsafe { std::ptr::read_unaligned(data.as_ptr() as *const ph_event) };
    let len = (ev.path_len as usize).min(data.len() - n);
    Some(Event { ev, path: &data[n..n + len] })
}

static LIBBPF_LOG: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn libbpf_print(level: libbpf_rs::PrintLevel, msg: String) {
    let mut log = LIBBPF_LOG.lock().unwrap();
    if log.len() > 4000 {
        log.remove(0);
    }
    if !matches!(level, libbpf_rs::PrintLevel::Debug) {
        log.push(msg.trim_end().to_string());
    }
}

/// One line saying which program failed, from libbpf's log.
fn load_failure_hint() -> String {
    let log = LIBBPF_LOG.lock().unwrap();
    if std::env::var_os("PHAROS_LIBBPF_LOG").is_some() {
        for l in log.iter() {
            eprintln!("{l}");
        }
    }
    log.iter()
        .rev()
        .find(|l| l.contains("prog '") && (l.contains("failed") || l.contains("error")))
        .or_else(|| log.iter().rev().find(|l| l.contains("libbpf:")))
        .map(|l| l.replace('\n', " "))
        .unwrap_or_default()
}

/// Where tracefs is mounted (mounted at /sys/kernel/tracing if needed).
///
/// Two agents starting at once on a machine where tracefs is not mounted yet (a fresh boot, a
/// test binary starting two agents) race to mount it: the loser gets EBUSY while the winner's
/// mount appears, so a failed mount waits up to 2 s for another process's mount before failing.
pub fn tracefs() -> Result<&'static Path> {
    let mounted = || {
        ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"].into_iter().find(|p| Path::new(p).join("events").is_dir())
    };
    if let Some(p) = mounted() {
        return Ok(Path::new(p));
    }
    let rc = unsafe {
        libc::mount(c"nodev".as_ptr(), c"/sys/kernel/tracing".as_ptr(), c"tracefs".as_ptr(), 0, std::ptr::null())
    };
    if rc == 0 {
        return Ok(Path::new("/sys/kernel/tracing"));
    }
    let err = std::io::Error::last_os_error();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while std::time::Instant::now() < deadline {
        if let Some(p) = mounted() {
            return Ok(Path::new(p));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Err(anyhow!("cannot mount tracefs at /sys/kernel/tracing: {err}"))
}

pub struct Config {
    /// Watched root cgroups: (cgroup id, level below the cgroup2 root).
    pub roots: Vec<(u64, u32)>,
    /// Record block-layer requests of tasks outside the watched cgroups (no job).
    pub block_all: bool,
}

/// Syscall number -> `enum ph_sys` (iotrace.h) of every traced system call, for the two
/// `tp_btf/sys_enter` / `sys_exit` programs. Empty where the table is not known: the
/// per-syscall tracepoints are used there.
fn syscall_table() -> Vec<(i64, u8)> {
    #[cfg(target_arch = "x86_64")]
    {
        use skel::types::ph_sys as k;
        let t = [
            (libc::SYS_read, k::PH_SYS_READ),
            (libc::SYS_write, k::PH_SYS_WRITE),
            (libc::SYS_pread64, k::PH_SYS_PREAD64),
            (libc::SYS_pwrite64, k::PH_SYS_PWRITE64),
            (libc::SYS_readv, k::PH_SYS_READV),
            (libc::SYS_writev, k::PH_SYS_WRITEV),
            (libc::SYS_close, k::PH_SYS_CLOSE),
            (libc::SYS_fsync, k::PH_SYS_FSYNC),
            (libc::SYS_fdatasync, k::PH_SYS_FDATASYNC),
            (libc::SYS_fstat, k::PH_SYS_NEWFSTAT),
            (libc::SYS_open, k::PH_SYS_OPEN),
            (libc::SYS_openat, k::PH_SYS_OPENAT),
            (libc::SYS_openat2, k::PH_SYS_OPENAT2),
            (libc::SYS_stat, k::PH_SYS_NEWSTAT),
            (libc::SYS_lstat, k::PH_SYS_NEWLSTAT),
            (libc::SYS_newfstatat, k::PH_SYS_NEWFSTATAT),
            (libc::SYS_statx, k::PH_SYS_STATX),
            (libc::SYS_unlink, k::PH_SYS_UNLINK),
            (libc::SYS_unlinkat, k::PH_SYS_UNLINKAT),
            (libc::SYS_mkdir, k::PH_SYS_MKDIR),
            (libc::SYS_mkdirat, k::PH_SYS_MKDIRAT),
            (libc::SYS_rename, k::PH_SYS_RENAME),
            (libc::SYS_renameat, k::PH_SYS_RENAMEAT),
            (libc::SYS_renameat2, k::PH_SYS_RENAMEAT2),
        ];
        t.iter().map(|(nr, kind)| (*nr, kind.0 as u8)).collect()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        Vec::new()
    }
}

/// How system calls are traced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyscallMode {
    /// Two BTF raw tracepoint programs (`tp_btf/sys_enter`, `tp_btf/sys_exit`) dispatching on
    /// the syscall number.
    Raw,
    /// One program pair per system call (`tracepoint/syscalls/sys_{enter,exit}_*`).
    PerSyscall,
}

fn is_raw_syscall_sec(sec: &str) -> bool {
    sec == "tp_btf/sys_enter" || sec == "tp_btf/sys_exit"
}

fn is_enter_sec(sec: &str) -> bool {
    sec == "tp_btf/sys_enter" || sec.contains("sys_enter_") || sec.starts_with("raw_tp/block_rq_issue")
}

/// The loaded and attached tracer.
pub struct Tracer<'obj> {
    skel: IotraceSkel<'obj>,
    enter_links: Vec<Link>,
    exit_links: Vec<Link>,
    /// Programs switched off because their tracepoint is missing on this kernel.
    pub disabled: Vec<String>,
    pub attached: usize,
    pub mode: SyscallMode,
}

impl<'obj> Tracer<'obj> {
    /// Opens, configures and loads the object. Errors name the failing step.
    ///
    /// System calls are traced by the two raw tracepoint programs when they load and attach
    /// here (the attachment is tried and undone), else, with `fallback` as the object's
    /// storage, by the per-syscall tracepoints. PHAROS_SYSCALL_TRACEPOINTS=1 forces the latter.
    pub fn load(
        storage: &'obj mut MaybeUninit<OpenObject>,
        fallback: &'obj mut MaybeUninit<OpenObject>,
        cfg: &Config,
    ) -> Result<Tracer<'obj>> {
        libbpf_rs::set_print(Some((libbpf_rs::PrintLevel::Info, libbpf_print)));
        if cfg.roots.len() > MAX_ROOTS {
            return Err(anyhow!("at most {MAX_ROOTS} watched cgroup roots"));
        }
        let table = syscall_table();
        let forced = std::env::var_os("PHAROS_SYSCALL_TRACEPOINTS").is_some_and(|v| v != "0" && !v.is_empty());
        let reason = if forced {
            "PHAROS_SYSCALL_TRACEPOINTS set".to_string()
        } else if table.is_empty() {
            "no syscall number table for this architecture".to_string()
        } else {
            match Self::load_mode(storage, cfg, SyscallMode::Raw, &table).and_then(|mut t| {
                t.try_attach_raw()?;
                Ok(t)
            }) {
                Ok(t) => return Ok(t),
                Err(e) => format!("{e:#}"),
            }
        };
        if forced || table.is_empty() {
            log::debug!("raw syscall tracepoints not used ({reason}): per-syscall tracepoints");
        } else {
            log::warn!("raw syscall tracepoints unusable ({reason}): per-syscall tracepoints instead");
        }
        Self::load_mode(fallback, cfg, SyscallMode::PerSyscall, &table)
    }

    fn load_mode(
        storage: &'obj mut MaybeUninit<OpenObject>,
        cfg: &Config,
        mode: SyscallMode,
        table: &[(i64, u8)],
    ) -> Result<Tracer<'obj>> {
        let tracefs = tracefs()?;
        let mut open =
            IotraceSkelBuilder::default().open(storage).map_err(|e| anyhow!("opening the BPF object failed: {e}"))?;
        let rodata = open.maps.rodata_data.as_deref_mut().context("no .rodata in the BPF object")?;
        for (i, (id, level)) in cfg.roots.iter().enumerate() {
            rodata.roots[i] = ph_root { id: *id, level: *level, pad: 0 };
        }
        rodata.nroots = cfg.roots.len() as u32;
        rodata.block_all = cfg.block_all;
        if mode == SyscallMode::Raw {
            for &(nr, kind) in table {
                if let Some(slot) = usize::try_from(nr).ok().and_then(|n| rodata.sys_kind.get_mut(n)) {
                    *slot = kind;
                }
            }
        }

        // Attach type chosen at run time: the syscall programs of the other mode, and those
        // whose tracepoint this kernel lacks, are switched off so the rest still loads.
        let mut disabled = Vec::new();
        for mut prog in open.open_object_mut().progs_mut() {
            let sec = prog.section().to_string_lossy().into_owned();
            if is_raw_syscall_sec(&sec) {
                prog.set_autoload(mode == SyscallMode::Raw);
                continue;
            }
            let present = if let Some(tp) = sec.strip_prefix("tracepoint/syscalls/") {
                if mode == SyscallMode::Raw {
                    prog.set_autoload(false);
                    continue;
                }
                tracefs.join("events/syscalls").join(tp).is_dir()
            } else if let Some(tp) = sec.strip_prefix("tracepoint/") {
                tracefs.join("events").join(tp).is_dir()
            } else if let Some(tp) = sec.strip_prefix("raw_tp/") {
                tracefs.join("events/block").join(tp).is_dir()
            } else {
                true
            };
            if !present {
                disabled.push(prog.name().to_string_lossy().into_owned());
                prog.set_autoload(false);
            }
        }
        let skel = open.load().map_err(|e| {
            let hint = load_failure_hint();
            anyhow!("loading eBPF programs failed: {e}{}{hint}", if hint.is_empty() { "" } else { ": " })
        })?;
        Ok(Tracer { skel, enter_links: Vec::new(), exit_links: Vec::new(), disabled, attached: 0, mode })
    }

    /// Attaches the raw syscall programs (exit first) and detaches them again: proves that
    /// they can be used before the per-syscall ones are given up.
    fn try_attach_raw(&mut self) -> Result<()> {
        let obj = self.skel.object();
        let mut links = Vec::new();
        for want in ["tp_btf/sys_exit", "tp_btf/sys_enter"] {
            let prog = obj
                .progs_mut()
                .find(|p| p.section().to_string_lossy() == want)
                .ok_or_else(|| anyhow!("no {want} program in the object"))?;
            links.push(prog.attach().map_err(|e| anyhow!("attaching {want} failed: {e}"))?);
        }
        while let Some(l) = links.pop() {
            drop(l); // enter first
        }
        Ok(())
    }

    /// Attaches every loaded program but the sweeper; exits before enters so that no call is
    /// entered without its exit being watched.
    pub fn attach(&mut self) -> Result<()> {
        let obj = self.skel.object();
        let mut enters = Vec::new();
        let mut exits = Vec::new();
        let mut progs: Vec<_> = obj.progs_mut().collect();
        progs.sort_by_key(|p| is_enter_sec(&p.section().to_string_lossy()));
        for prog in progs {
            let sec = prog.section().to_string_lossy().into_owned();
            let name = prog.name().to_string_lossy().into_owned();
            if !prog.autoload() || sec == "raw_tp" {
                continue;
            }
            let link = prog.attach().map_err(|e| anyhow!("attaching {name} ({sec}) failed: {e}"))?;
            if is_enter_sec(&sec) {
                enters.push(link);
            } else {
                exits.push(link);
            }
        }
        self.attached = enters.len() + exits.len();
        self.enter_links = enters;
        self.exit_links = exits;
        Ok(())
    }

    /// Detaches entry probes, waits `grace` for calls in flight to return, then the rest.
    pub fn detach(&mut self, grace: Duration) {
        self.enter_links.clear();
        std::thread::sleep(grace);
        self.exit_links.clear();
        std::thread::sleep(Duration::from_millis(5));
    }

    pub fn events_map(&self) -> &dyn MapCore {
        &self.skel.maps.events
    }

    /// Runs the sweeper once: emits every pending record whose run started at least
    /// `min_age` ago (zero: all). Returns how many it emitted.
    pub fn sweep(&self, min_age: Duration) -> Result<u32> {
        let mut ctx = (min_age.as_nanos() as u64).to_ne_bytes();
        let input = libbpf_rs::ProgramInput {
            context_in: Some(&mut ctx[..]),
            context_out: None,
            data_in: None,
            data_out: None,
            cpu: 0,
            flags: 0,
            repeat: 0,
            _non_exhaustive: (),
        };
        let out = self.skel.progs.sweep.test_run(input).context("running the sweeper")?;
        Ok(out.return_value)
    }

    /// Kernel-side loss counters per cgroup id (cumulative).
    pub fn counters(&self) -> HashMap<u64, ph_counters> {
        let map = &self.skel.maps.counters;
        let mut out = HashMap::new();
        for key in map.keys() {
            if let Ok(Some(v)) = map.lookup(&key, MapFlags::ANY) {
                if key.len() == 8 && v.len() >= std::mem::size_of::<ph_counters>() {
                    let id = u64::from_ne_bytes(key[..8].try_into().unwrap());
                    // SAFETY: plain old data of the checked size.
                    let c: ph_counters = unsafe { std::ptr::read_unaligned(v.as_ptr() as *const ph_counters) };
                    out.insert(id, c);
                }
            }
        }
        out
    }
}

/// `comm` bytes of an event as a string.
pub fn comm(ev: &ph_event) -> String {
    let bytes: Vec<u8> = ev.comm.iter().map(|&c| c as u8).collect();
    CStr::from_bytes_until_nul(&bytes)
        .map(|c| c.to_string_lossy().into_owned())
        .unwrap_or_else(|_| String::from_utf8_lossy(&bytes).into_owned())
}
