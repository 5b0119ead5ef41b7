//! Attributes and entries between the wire and FUSE: the daemon's [`Attr`], [`Kind`] and
//! [`Time`] as fuser's [`FileAttr`], [`FileType`] and [`SystemTime`], FUSE's times to set as
//! the wire's, and the namespace path of a directory entry.
use std::ffi::OsStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{FileAttr, FileType, TimeOrNow};
use pharos_fwd_proto::{errno, Attr, Kind, Time};

use super::STALE;

/// A wire time as a system time (times before the epoch become the epoch).
fn ftime(t: Time) -> SystemTime {
    if t.sec >= 0 {
        UNIX_EPOCH + Duration::new(t.sec as u64, t.nsec)
    } else {
        UNIX_EPOCH
    }
}

/// The FUSE file type of a wire kind (`Other` shows as a regular file).
pub(super) fn ftype(k: Kind) -> FileType {
    match k {
        Kind::Dir => FileType::Directory,
        Kind::Symlink => FileType::Symlink,
        Kind::Fifo => FileType::NamedPipe,
        Kind::Socket => FileType::Socket,
        Kind::CharDev => FileType::CharDevice,
        Kind::BlockDev => FileType::BlockDevice,
        Kind::File | Kind::Other => FileType::RegularFile,
    }
}

/// FUSE attributes of the daemon's `a`, as inode `ino` of the kernel (block size 1 MiB).
pub(super) fn fattr(a: &Attr, ino: u64) -> FileAttr {
    FileAttr {
        ino,
        size: a.size,
        blocks: a.blocks,
        atime: ftime(a.atime),
        mtime: ftime(a.mtime),
        ctime: ftime(a.ctime),
        crtime: ftime(a.ctime),
        kind: ftype(a.kind),
        perm: (a.perm & 0o7777) as u16,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev as u32,
        blksize: 1 << 20,
        flags: 0,
    }
}

/// Placeholder attributes of inode `ino` of kind `kind` (sent with a zero TTL: the kernel
/// asks for the real ones before it uses them).
pub(super) fn no_attrs(ino: u64, kind: FileType) -> FileAttr {
    let t = UNIX_EPOCH;
    FileAttr {
        ino,
        size: 0,
        blocks: 0,
        atime: t,
        mtime: t,
        ctime: t,
        crtime: t,
        kind,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 0,
        flags: 0,
    }
}

/// The namespace path of `name` in the directory at `parent` (`""` = the root). Errors:
/// `EINVAL` for a name that is not UTF-8, `ENOENT` when the directory is gone (stale).
pub(super) fn join(parent: &str, name: &OsStr) -> Result<String, i32> {
    let name = name.to_str().ok_or(errno::EINVAL)?;
    if parent == STALE {
        return Err(errno::ENOENT);
    }
    Ok(if parent.is_empty() { name.to_string() } else { format!("{parent}/{name}") })
}

/// A time to set as the wire's: `None` = leave, `Some(None)` = now, else the time.
pub(super) fn tott(t: Option<TimeOrNow>) -> Option<Option<Time>> {
    t.map(|t| match t {
        TimeOrNow::Now => None,
        TimeOrNow::SpecificTime(st) => {
            let d = st.duration_since(UNIX_EPOCH).unwrap_or_default();
            Some(Time { sec: d.as_secs() as i64, nsec: d.subsec_nanos() })
        }
    })
}
