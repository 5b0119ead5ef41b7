//! Creates made in place in a node-local store (`backend/nodelocal.rs`): the sidecar is made by
//! name (`O_CREAT|O_EXCL`) and written under an exclusive `flock`, instead of an unnamed file
//! (`O_TMPFILE`) written and then linked. Same kernel checks (search and write permission on the
//! directory, as the caller), one system call and the orphan-list updates of `O_TMPFILE` fewer:
//! a node-local create cost the daemon ~30 % less CPU (`bench/nodelocal.py`, issue 27).
//!
//! The price is a moment where the name holds an empty sidecar (between the create and the
//! write), or forever if the daemon stopped there. Every reader ([`Namespace::layout_at`]) that
//! finds a node-local sidecar empty or unreadable takes a shared lock (waiting for a creator
//! still writing) and reads again; still empty, it *adopts* the file: under the exclusive lock,
//! if still empty, it writes a fresh node-local layout itself. A creator that finds its sidecar
//! adopted (not empty once it holds the lock) takes that layout and puts its own create token
//! in. So every daemon sees one layout for a file, and a file whose creator stopped is an empty
//! file with a layout of its own (no object exists before a layout is known). A replay of the
//! create (same token) adopts with its token, so it finds "its" file as with a linked sidecar.
use std::ffi::CStr;
use std::fs::File;
use std::io::{Read, Seek, Write};
use std::os::fd::{AsRawFd, OwnedFd};

use pharos_fwd_proto::{errno, Attr, Ctx, Layout, OpenHandle};

use super::super::layout::{layout_text, local_layout, parse_layout};
use super::super::{eno, random_u64, werr, Backend, Placer, Res};
use super::{attr_of_stat, caller, Namespace};
use crate::nsfs;

/// `flock(f, op)`.
fn flock(f: &File, op: libc::c_int) -> Res<()> {
    nsfs::flock(f.as_raw_fd(), op).map_err(werr)
}

/// The sidecar's text from offset 0 (`None`: not UTF-8).
fn read_all(mut f: &File) -> Res<Option<String>> {
    f.rewind().map_err(werr)?;
    let mut buf = Vec::with_capacity(256);
    f.read_to_end(&mut buf).map_err(werr)?;
    Ok(String::from_utf8(buf).ok())
}

/// Replaces the sidecar's text (under the exclusive lock).
fn rewrite(mut f: &File, text: &str) -> Res<()> {
    f.set_len(0).map_err(werr)?;
    f.rewind().map_err(werr)?;
    f.write_all(text.as_bytes()).map_err(werr)
}

impl Namespace {
    /// Creates regular file `name` in directory `d` of node-local store `ti` in place (see the
    /// module docs): attr (size 0), layout (one stripe on `ti`), open handle. `Ok(None)` when
    /// the name exists (`EEXIST`: the caller's replay and `O_EXCL` rules apply).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn create_in_place(
        &self,
        b: &Backend,
        d: &OwnedFd,
        name: &CStr,
        ti: u32,
        mode: u32,
        token: u64,
        ctx: &Ctx,
    ) -> Res<Option<(Attr, Layout, OpenHandle)>> {
        let g = caller(ctx);
        let made = nsfs::openat(
            d.as_raw_fd(),
            name,
            libc::O_CREAT | libc::O_EXCL | libc::O_RDWR | libc::O_NOFOLLOW,
            mode & 0o7777,
        );
        drop(g);
        let f = match made {
            Ok(f) => f,
            Err(e) if e.raw_os_error() == Some(errno::EEXIST) => return Ok(None),
            Err(e) => return Err(werr(e)),
        };
        flock(&f, libc::LOCK_EX)?;
        // Its attributes as made (the times differ from the sidecar's after the write below by
        // that write: the mount's own write-back creates give times of their own as well).
        let st = nsfs::fstat(f.as_raw_fd()).map_err(werr)?;
        let l = if st.st_size == 0 {
            let l = local_layout(random_u64(), ti);
            (&f).write_all(layout_text(&l, token).as_bytes()).map_err(werr)?;
            l
        } else {
            // Adopted by a reader in the moment before the lock: its layout, this create's token.
            let text = read_all(&f)?.unwrap_or_default();
            let (l, _) =
                parse_layout(&text).ok_or_else(|| eno(errno::EIO, format!("corrupt layout sidecar {name:?}")))?;
            rewrite(&f, &layout_text(&l, token))?;
            l
        };
        drop(f); // the lock with it
        let h = b.mark(&l)?;
        for &t in Placer::whole_file_targets(&l) {
            b.targets[t as usize].shm.add_open(1);
        }
        Ok(Some((Attr { size: 0, blocks: 0, ..attr_of_stat(&st) }, l, h)))
    }

    /// The layout and token of node-local sidecar `name` in `d` (open as `f`), read empty or
    /// unreadable without a lock: read again under a shared lock, else adopted with `token`
    /// (module docs). `EIO` for a sidecar that is neither empty nor a layout, or when the
    /// daemon cannot open it for writing to adopt it.
    pub(super) fn settle_in_place(&self, d: &OwnedFd, name: &CStr, f: &File, token: u64) -> Res<(Layout, u64)> {
        let corrupt = || eno(errno::EIO, format!("corrupt layout sidecar {name:?}"));
        let Some(ti) = self.local else { return Err(corrupt()) };
        flock(f, libc::LOCK_SH)?;
        let text = read_all(f)?;
        flock(f, libc::LOCK_UN)?;
        match text.as_deref() {
            Some("") => {}
            Some(s) => return parse_layout(s).ok_or_else(corrupt),
            None => return Err(corrupt()),
        }
        // Empty with no creator writing it: adopt it (as the daemon: the caller may only read).
        let w = nsfs::openat(d.as_raw_fd(), name, libc::O_RDWR | libc::O_NOFOLLOW, 0)
            .map_err(|e| eno(errno::EIO, format!("sidecar {name:?} being created, cannot adopt it: {e}")))?;
        let same = |a: &File, b: &File| -> Res<bool> {
            let (x, y) = (nsfs::fstat(a.as_raw_fd()).map_err(werr)?, nsfs::fstat(b.as_raw_fd()).map_err(werr)?);
            Ok((x.st_dev, x.st_ino) == (y.st_dev, y.st_ino))
        };
        if !same(f, &w)? {
            return Err(eno(errno::EIO, format!("sidecar {name:?} replaced while being read")));
        }
        flock(&w, libc::LOCK_EX)?;
        match read_all(&w)?.as_deref() {
            Some("") => {
                let l = local_layout(random_u64(), ti);
                rewrite(&w, &layout_text(&l, token))?;
                Ok((l, token))
            }
            Some(s) => parse_layout(s).ok_or_else(corrupt),
            None => Err(corrupt()),
        }
    }
}
