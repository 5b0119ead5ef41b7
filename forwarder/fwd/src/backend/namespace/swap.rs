//! Replacing a regular file's layout sidecar (online migration, `backend/migrate.rs`): the new
//! sidecar is written whole in `<mdt>/tmp` with the old one's owner, mode and times, fsynced,
//! and `rename(2)`d over the old name, so every reader sees the old layout or the new one.
//!
//! Opens and truncates by name take a shared `flock` on the sidecar they read and check, once
//! holding it, that the name still holds that sidecar ([`lock_shared`]); the switch holds an
//! exclusive `flock` on the old sidecar from its checks to the rename. So an open either
//! finished (its open marker is seen by the switch's check, which then declines) or reads the
//! new sidecar after the rename: no open keeps the old layout past a switch.
use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use pharos_fwd_proto::errno;

use super::super::{eno, random_u64, werr, Res};
use super::Namespace;
use crate::nsfs;

/// Takes a shared `flock` on a sidecar (released when the file is closed).
pub(super) fn lock_shared(f: &File) -> Res<()> {
    nsfs::flock(f.as_raw_fd(), libc::LOCK_SH).map_err(werr)
}

/// Why a switch did not happen.
#[derive(Debug)]
pub enum SwapRefused {
    /// The caller's check (under the lock) declined, with its reason.
    Check(String),
    /// The name no longer holds the old sidecar (renamed, removed, replaced), or the file has
    /// other hard links (renaming over one name would split them).
    Changed(String),
    /// An I/O error.
    Io(String),
}

impl Namespace {
    /// Replaces the sidecar `old` of the regular file `path` by one holding `new` (texts of
    /// `backend/layout.rs`), staged in `tmp` (on the namespace's file system). `check` runs
    /// under the exclusive lock, once the name is known to hold `old`, and may decline (no
    /// open may be recorded, no write may have happened since a copy began). The sidecar's
    /// inode number changes; its owner, mode, atime and mtime are kept.
    pub(in crate::backend) fn swap_layout(
        &self,
        path: &str,
        old: &str,
        new: &str,
        tmp: &Path,
        check: &dyn Fn() -> Result<(), String>,
    ) -> Result<(), SwapRefused> {
        let io = |e: io::Error| SwapRefused::Io(e.to_string());
        let wio = |e: pharos_fwd_proto::WireError| SwapRefused::Changed(e.msg);
        let (d, name) = self.parent(path).map_err(wio)?;
        let mut f = nsfs::openat(d.as_raw_fd(), &name, libc::O_RDONLY | libc::O_NOFOLLOW, 0)
            .map_err(|e| SwapRefused::Changed(format!("{path}: {e}")))?;
        nsfs::flock(f.as_raw_fd(), libc::LOCK_EX).map_err(io)?;
        let st = nsfs::fstat(f.as_raw_fd()).map_err(io)?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(SwapRefused::Changed(format!("{path}: not a regular file")));
        }
        if st.st_nlink != 1 {
            return Err(SwapRefused::Changed(format!("{path}: {} hard links", st.st_nlink)));
        }
        let mut text = String::new();
        f.read_to_string(&mut text).map_err(io)?;
        let now = nsfs::lstat(d.as_raw_fd(), &name).map_err(|e| SwapRefused::Changed(format!("{path}: {e}")))?;
        if text != old || now.st_ino != st.st_ino || now.st_dev != st.st_dev {
            return Err(SwapRefused::Changed(format!("{path}: its layout changed")));
        }
        check().map_err(SwapRefused::Check)?;
        let staged = tmp.join(format!("sidecar-{:016x}", random_u64()));
        let res = (|| -> io::Result<()> {
            let mut s = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&staged)?;
            s.write_all(new.as_bytes())?;
            // chown first: it clears setuid/setgid, which the chmod then restores.
            nsfs::cvt(unsafe { libc::fchown(s.as_raw_fd(), st.st_uid, st.st_gid) })?;
            nsfs::cvt(unsafe { libc::fchmod(s.as_raw_fd(), st.st_mode & 0o7777) })?;
            let times = [
                libc::timespec { tv_sec: st.st_atime, tv_nsec: st.st_atime_nsec },
                libc::timespec { tv_sec: st.st_mtime, tv_nsec: st.st_mtime_nsec },
            ];
            nsfs::cvt(unsafe { libc::futimens(s.as_raw_fd(), times.as_ptr()) })?;
            s.sync_all()?;
            let from = CString::new(staged.as_os_str().as_encoded_bytes()).map_err(|_| io::Error::other("NUL"))?;
            nsfs::renameat2(libc::AT_FDCWD, &from, d.as_raw_fd(), &name, 0)?;
            nsfs::openat(d.as_raw_fd(), c".", libc::O_RDONLY | libc::O_DIRECTORY, 0)?.sync_all()
        })();
        if res.is_err() {
            let _ = std::fs::remove_file(&staged);
        }
        res.map_err(io)
    }

    /// The layout sidecar's text of `path` (recovery compares it with its journal).
    pub(in crate::backend) fn sidecar_text(&self, path: &str) -> Res<Option<String>> {
        let (d, name) = self.parent(path)?;
        match nsfs::openat(d.as_raw_fd(), &name, libc::O_RDONLY | libc::O_NOFOLLOW, 0) {
            Ok(mut f) => {
                let mut s = String::new();
                f.read_to_string(&mut s).map_err(|_| eno(errno::EIO, "sidecar is not text"))?;
                Ok(Some(s))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(werr(e)),
        }
    }
}
