//! Directory holders (issue 29, item 1: lookups of absent names answered by the mount, with
//! coherence). A mount that makes a directory may be recorded as its *holder*: the mount's id
//! in the directory's extended attribute `trusted.pharos.holder` on the MDT, so that every
//! forwarding node sharing the namespace sees it. The holder knows every name there (it made
//! the directory empty and sees its own changes) and answers lookups of names it did not make
//! with "no such name" itself. A name another mount adds there is preceded by a recall of the
//! holder (`server/holders.rs`), and the attribute is removed: one recall per directory, as an
//! NFSv4 directory delegation or a Lustre LDLM lock is recalled once by a conflicting client.
//!
//! The attribute is in the `trusted` namespace (set and read by the daemon as root, outside a
//! [`crate::nsfs::Caller`] guard; invisible to users, and never forwarded: the mount forwards
//! no xattrs). A file system without it (`EOPNOTSUPP`) or a daemon without `CAP_SYS_ADMIN`
//! holds nothing: mounts then ask the daemon for every lookup, as before.
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use pharos_fwd_proto::validate_path;

use super::super::{werr, Res};
use super::Namespace;
use crate::nsfs;

const NAME: &std::ffi::CStr = c"trusted.pharos.holder";

impl Namespace {
    /// The directory `dir` (request path) opened for its attributes (not through a symlink, not
    /// out of the namespace).
    fn open_dir_fd(&self, dir: &str) -> Res<OwnedFd> {
        let (d, name) = match validate_path(dir)?.is_empty() {
            true => (self.root_fd.try_clone().map_err(werr)?, c".".to_owned()),
            false => self.parent(dir)?,
        };
        let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        // SAFETY: a valid directory fd and a NUL-terminated name; the fd returned is owned here.
        let fd = nsfs::cvt(unsafe { libc::openat(d.as_raw_fd(), name.as_ptr(), flags) }).map_err(werr)?;
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// Records mount `mount` as the holder of directory `dir`. False when the file system or
    /// the daemon's privileges do not allow it (nothing held).
    pub fn set_holder(&self, dir: &str, mount: u64) -> bool {
        let Ok(fd) = self.open_dir_fd(dir) else { return false };
        let v = mount.to_le_bytes();
        // SAFETY: a valid fd, a NUL-terminated name and 8 bytes of value.
        unsafe { libc::fsetxattr(fd.as_raw_fd(), NAME.as_ptr(), v.as_ptr().cast(), v.len(), 0) == 0 }
    }

    /// The holder of directory `dir`, if a mount other than `origin` holds it (the caller
    /// recalls it, then [`Namespace::clear_holder`]). None when nobody or `origin` holds it,
    /// or `dir` is not a directory.
    pub fn holder_unless(&self, dir: &str, origin: u64) -> Option<u64> {
        let fd = self.open_dir_fd(dir).ok()?;
        let mut v = [0u8; 8];
        // SAFETY: a valid fd, a NUL-terminated name and an 8-byte buffer.
        let n = unsafe { libc::fgetxattr(fd.as_raw_fd(), NAME.as_ptr(), v.as_mut_ptr().cast(), v.len()) };
        if n != 8 {
            return None; // ENODATA (nobody), EOPNOTSUPP, or not ours
        }
        Some(u64::from_le_bytes(v)).filter(|h| *h != origin)
    }

    /// Directory `dir` is held by nobody from now (after its holder's recall; two recalls at
    /// once both clear it, harmlessly).
    pub fn clear_holder(&self, dir: &str) {
        if let Ok(fd) = self.open_dir_fd(dir) {
            // SAFETY: a valid fd and a NUL-terminated name.
            unsafe { libc::fremovexattr(fd.as_raw_fd(), NAME.as_ptr()) };
        }
    }
}
