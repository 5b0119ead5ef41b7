//! One file's migration: plan (which objects move where), copy in bounded units through the
//! targets' I/O path (token bucket, injected latency and slowdown of [`Target`]), switch the
//! layout sidecar (`namespace/swap.rs`), remove the old objects; and the roll-back and
//! roll-forward of a journal entry.
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use pharos_fwd_proto::Layout;

use super::super::layout::{layout_text, parse_layout};
use super::super::{Backend, Target};
use super::journal::Entry;
use super::{CopyIo, Live};
use crate::clock::wall_ns;

/// The plan of one file's migration.
#[derive(Clone, Debug)]
pub struct Plan {
    pub path: String,
    pub old_text: String,
    pub new_text: String,
    pub oid: u64,
    /// (object index, source target, destination target).
    pub objects: Vec<(u64, u32, u32)>,
    /// Bytes of the source objects when planned.
    pub bytes: u64,
}

/// Plans moving the objects of `path` that live on target `source` to one destination chosen
/// by the placement ([`super::super::Placer::migration_target`]). Errors (as text): not a
/// regular file, a progressive layout (its component records are immutable and cached by
/// every daemon: not migrated), nothing on `source`, no destination.
pub fn plan(b: &Backend, path: &str, source: u32, pool: Option<&str>) -> Result<Plan, String> {
    let old_text = b.ns.sidecar_text(path).map_err(|e| e.msg)?.ok_or_else(|| format!("{path}: no such file"))?;
    let (l, token) = parse_layout(&old_text).ok_or_else(|| format!("{path}: not a layout sidecar"))?;
    if l.is_progressive() {
        return Err(format!("{path}: progressive layouts are not migrated"));
    }
    if !l.targets.contains(&source) {
        return Err(format!("{path}: no object on {}", b.targets[source as usize].name));
    }
    let dst = b
        .placement
        .migration_target(&b.targets, &l.targets, source, pool)
        .ok_or_else(|| format!("{path}: no healthy destination target"))?;
    let mut new = Layout { targets: l.targets.clone(), ..l.clone() };
    let mut objects = Vec::new();
    let mut bytes = 0;
    for (s, t) in new.targets.iter_mut().enumerate() {
        if *t == source {
            *t = dst;
            objects.push((s as u64, source, dst));
            bytes += b.targets[source as usize]
                .open_obj(l.oid, s as u64, false)
                .and_then(|f| f.metadata())
                .map_or(0, |m| m.len());
        }
    }
    Ok(Plan { path: path.to_string(), new_text: layout_text(&new, token), old_text, oid: l.oid, objects, bytes })
}

/// Why a copy stopped before its end.
#[derive(Debug)]
pub enum Stop {
    /// Cancelled or pinned meanwhile.
    Asked,
    Io(String),
}

/// A missing object is `None`.
fn existing(t: &Target, oid: u64, idx: u64) -> io::Result<Option<File>> {
    match t.open_obj(oid, idx, false) {
        Ok(f) => Ok(Some(f)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Copies the plan's source objects to their destinations in units of `unit` bytes, each unit
/// paced at the task's allocated rate (`live`), read and written through the targets' gates
/// and slowdown, and reported to `io`. A destination ends with the source's size and times,
/// fsynced; a source object that does not exist leaves none.
pub fn copy(b: &Backend, p: &Plan, unit: u64, live: &Live, io: &CopyIo) -> Result<(), Stop> {
    let e = |x: io::Error| Stop::Io(x.to_string());
    let mut pacer = super::alloc::Pacer::default();
    let mut buf = vec![0u8; unit.max(4096) as usize];
    live.bytes_done.store(0, Relaxed);
    for &(idx, s, d) in &p.objects {
        let (src_t, dst_t) = (&b.targets[s as usize], &b.targets[d as usize]);
        let Some(src) = existing(src_t, p.oid, idx).map_err(e)? else {
            let _ = dst_t.remove_obj(p.oid, idx);
            continue;
        };
        let dst = dst_t.open_obj(p.oid, idx, true).map_err(e)?;
        dst.set_len(0).map_err(e)?;
        let mut off = 0u64;
        loop {
            let len = src.metadata().map_err(e)?.len();
            if off >= len {
                break;
            }
            let n = (len - off).min(buf.len() as u64);
            loop {
                if live.stop.load(Relaxed) != 0 {
                    return Err(Stop::Asked);
                }
                match pacer.wait(Instant::now(), n, live.rate()) {
                    Some(w) => {
                        std::thread::sleep(w);
                        break;
                    }
                    None => std::thread::sleep(Duration::from_millis(50)),
                }
            }
            let (ns0, t0) = (wall_ns(), Instant::now());
            src_t.gate(n);
            let got = src.read_at(&mut buf[..n as usize], off).map_err(e)?;
            src_t.stretch(t0.elapsed());
            io(s, p, false, off, got as u64, ns0, t0.elapsed());
            if got == 0 {
                break; // shrunk meanwhile: the write generation tells the caller
            }
            let (ns1, t1) = (wall_ns(), Instant::now());
            dst_t.gate(got as u64);
            dst.write_all_at(&buf[..got], off).map_err(e)?;
            dst_t.stretch(t1.elapsed());
            io(d, p, true, off, got as u64, ns1, t1.elapsed());
            off += got as u64;
            live.bytes_done.fetch_add(got as u64, Relaxed);
        }
        let md = src.metadata().map_err(e)?;
        dst.set_len(md.len()).map_err(e)?;
        let times = [
            libc::timespec { tv_sec: md.atime(), tv_nsec: md.atime_nsec() },
            libc::timespec { tv_sec: md.mtime(), tv_nsec: md.mtime_nsec() },
        ];
        crate::nsfs::cvt(unsafe { libc::futimens(dst.as_raw_fd(), times.as_ptr()) }).map_err(e)?;
        dst.sync_all().map_err(e)?;
    }
    Ok(())
}

/// Removes the destination copies of entry `e` (roll back: the old layout is in force).
pub fn remove_copies(b: &Backend, e: &Entry) {
    for &(idx, _, d) in &e.objects {
        b.data.forget_obj(d, e.oid, idx);
        let _ = b.targets[d as usize].remove_obj(e.oid, idx);
    }
}

/// Removes the source objects of entry `e` (roll forward: the new layout is in force); every
/// daemon reopens the file's objects ([`Backend::moves`]).
pub fn remove_sources(b: &Backend, e: &Entry) {
    b.moves.bump(e.oid);
    for &(idx, s, _) in &e.objects {
        b.data.forget_obj(s, e.oid, idx);
        let _ = b.targets[s as usize].remove_obj(e.oid, idx);
    }
}
