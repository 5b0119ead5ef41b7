//! Kernel events → pharos.v1.IoRecord, with attribution from the registry, into the sink
//! and/or stdout (JSON lines, protobuf canonical JSON).
use std::collections::{BTreeMap, HashMap};
use std::io::Write;

use pharos_wire::sink::{Sink, SinkStats};
use pharos_wire::{FileType, IoRecord, Layer, Op};

use crate::registry::Registry;
use crate::tracer::{self, Event};

/// Counters of the user-space side.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    /// Ring-buffer records decoded.
    pub records_received: u64,
    /// Per op name: (requests = sum of count, bytes = sum of max(result, 0) * count).
    pub per_op: BTreeMap<&'static str, (u64, u64)>,
}

/// Kernel-side loss counters summed over all cgroups.
#[derive(Clone, Debug, Default)]
pub struct KernelCounters {
    pub ringbuf_drops: u64,
    pub unmerged_fallbacks: u64,
}

pub struct Converter<'s, W: Write> {
    pub host: String,
    /// CLOCK_REALTIME - CLOCK_MONOTONIC (ns).
    pub wall_offset_ns: u64,
    pub registry: Registry,
    pub sink: Option<&'s Sink>,
    pub stdout: Option<W>,
    pub stats: Stats,
}

/// pharos.v1.FileType of an i_mode (0: unknown).
pub fn file_type(mode: u32) -> FileType {
    if mode == 0 {
        return FileType::Unspecified;
    }
    match mode & libc::S_IFMT {
        libc::S_IFREG => FileType::Regular,
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFIFO => FileType::Pipe,
        libc::S_IFSOCK => FileType::Socket,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        libc::S_IFLNK => FileType::Symlink,
        _ => FileType::Other,
    }
}

/// Absolute path from the kernel's leaf-first, NUL-separated components.
pub fn dentry_path(bytes: &[u8], truncated: bool) -> String {
    let comps: Vec<String> =
        bytes.split(|&b| b == 0).filter(|c| !c.is_empty()).map(|c| String::from_utf8_lossy(c).into_owned()).collect();
    let mut p = String::with_capacity(bytes.len() + 4);
    if truncated {
        p.push_str("...");
    }
    for c in comps.iter().rev() {
        p.push('/');
        p.push_str(c);
    }
    if p.is_empty() {
        p.push('/');
    }
    p
}

fn cstr(bytes: &[u8]) -> String {
    let n = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..n]).into_owned()
}

impl<W: Write> Converter<'_, W> {
    /// Converts one event and hands the record on.
    pub fn handle(&mut self, e: &Event<'_>) {
        let ev = &e.ev;
        if ev.op == tracer::OP_EXEC {
            // not a request: a chunk of the environment of a process that exec'd, for its rank
            let truncated = ev.flags & tracer::F_ENV_TRUNCATED != 0;
            let sent = if truncated { tracer::ENV_CHUNK * tracer::ENV_CHUNKS } else { ev.size };
            self.registry.exec_chunk(ev.pid, ev.cgroup_id, ev.offset, e.path, sent, truncated);
            return;
        }
        if ev.op == tracer::OP_FORK {
            // not a request either: the child has its parent's rank until it execs
            self.registry.forked(ev.pid, ev.tid, ev.cgroup_id);
            return;
        }
        self.stats.records_received += 1;
        let op = Op::try_from(ev.op as i32).unwrap_or(Op::Unspecified);
        let is_block = matches!(op, Op::BlockRead | Op::BlockWrite | Op::BlockOther);
        let path_op = matches!(op, Op::Stat | Op::Unlink | Op::Mkdir | Op::Rename | Op::Open)
            && ev.path_kind == tracer::PATH_USER;
        let job_id = self.registry.job(ev.cgroup_id);
        let rank = self.registry.rank(ev.pid, ev.cgroup_id);
        let mut fd = ev.fd;
        let path = match ev.path_kind {
            tracer::PATH_DENTRY => dentry_path(e.path, ev.flags & tracer::F_PATH_TRUNCATED != 0),
            tracer::PATH_USER => self.registry.absolute(ev.pid, ev.fd, &cstr(e.path)),
            _ if is_block => String::new(),
            _ => self.registry.path_of(ev.pid, ev.fd, ev.dev, ev.ino),
        };
        if path_op || is_block {
            fd = -1;
        }
        if op == Op::Open && ev.result >= 0 {
            self.registry.opened(ev.pid, ev.result as i32, ev.dev, ev.ino, &path);
        } else if op == Op::Close && ev.result == 0 {
            self.registry.closed(ev.pid, ev.fd);
        }
        let count = ev.count.max(1);
        let rec = IoRecord {
            start_ns: ev.start_ns.wrapping_add(self.wall_offset_ns),
            duration_ns: ev.duration_ns,
            end_ns: ev.end_ns.wrapping_add(self.wall_offset_ns),
            layer: Layer::Client as i32,
            host: self.host.clone(),
            job_id,
            rank,
            pid: ev.pid,
            tid: ev.tid,
            comm: tracer::comm(ev),
            op: op as i32,
            dev: ev.dev,
            inode: ev.ino,
            path,
            file_type: file_type(ev.mode) as i32,
            fd,
            offset: ev.offset,
            size: ev.size,
            result: ev.result,
            count,
            ..Default::default()
        };
        let s = self.stats.per_op.entry(op.as_str_name()).or_default();
        s.0 += count as u64;
        s.1 += ev.result.max(0) as u64 * count as u64;
        if let Some(out) = self.stdout.as_mut() {
            if let Ok(line) = serde_json::to_string(&rec) {
                let _ = writeln!(out, "{line}");
            }
        }
        if let Some(sink) = self.sink {
            let _ = sink.push(rec); // a full queue is counted by the sink (overflow_drops)
        }
    }

    pub fn flush_stdout(&mut self) {
        if let Some(out) = self.stdout.as_mut() {
            let _ = out.flush();
        }
    }

    /// Reports the kernel's per-cgroup counters per job to the sink; returns the totals.
    pub fn kernel_counters(&mut self, per_cgroup: &HashMap<u64, tracer::ph_counters>) -> KernelCounters {
        let mut per_job: BTreeMap<String, (u64, u64)> = BTreeMap::new();
        let mut total = KernelCounters::default();
        for (cg, c) in per_cgroup {
            let job = self.registry.job(*cg);
            let e = per_job.entry(job).or_default();
            e.0 += c.ringbuf_drops;
            e.1 += c.unmerged_fallbacks;
            total.ringbuf_drops += c.ringbuf_drops;
            total.unmerged_fallbacks += c.unmerged_fallbacks;
        }
        if let Some(sink) = self.sink {
            for (job, (d, u)) in per_job {
                sink.report_kernel_counters(&job, d, u);
            }
        }
        total
    }
}

/// The one-line stats summary.
pub fn summary(s: &Stats, k: &KernelCounters, sink: Option<SinkStats>) -> String {
    let mut line = format!(
        "records_received={} ringbuf_drops={} unmerged_fallbacks={}",
        s.records_received, k.ringbuf_drops, k.unmerged_fallbacks
    );
    if let Some(ss) = sink {
        line += &format!(
            " records_sent={} batches_sent={} overflow_drops={} delivery_failures={}",
            ss.records_sent, ss.batches_sent, ss.overflow_drops, ss.delivery_failures
        );
    }
    let (req, bytes) = s.per_op.values().fold((0, 0), |a, v| (a.0 + v.0, a.1 + v.1));
    line + &format!(" requests={req} bytes={bytes}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_from_components() {
        assert_eq!(dentry_path(b"c\0b\0a\0", false), "/a/b/c");
        assert_eq!(dentry_path(b"", false), "/");
        assert_eq!(dentry_path(b"x\0", true), ".../x");
    }

    #[test]
    fn file_types() {
        assert_eq!(file_type(0o100644), FileType::Regular);
        assert_eq!(file_type(0o010600), FileType::Pipe);
        assert_eq!(file_type(0o140777), FileType::Socket);
        assert_eq!(file_type(0o020620), FileType::CharDevice);
        assert_eq!(file_type(0), FileType::Unspecified);
    }
}
