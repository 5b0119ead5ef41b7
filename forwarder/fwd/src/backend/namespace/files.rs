//! Regular files of the namespace: create (placement, open marker, the sidecar linked into
//! place; no object: objects are made by the first write), open (access checked, marker, re-check against a racing unlink) and
//! release (open counts, marker, an orphan's last close).
use std::ffi::CStr;
use std::fs;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;

use pharos_fwd_proto::{errno, validate_path, Attr, Ctx, Layout, OpenHandle};

use super::super::layout::{layout_text, local_layout};
use super::super::{eno, random_u64, werr, Backend, Placer, Res};
use super::swap::lock_shared;
use super::{attr_of_stat, caller, file_attr, Namespace};
use crate::nsfs;

impl Namespace {
    /// Creates (or, without `O_EXCL` in `flags` and when it exists, opens) a regular file for
    /// the caller `ctx` (its job picks the placement pool; it owns the file, with the
    /// parent's group in a setgid directory). Returns its attr, layout and open handle, and
    /// counts it open on its targets. The sidecar is written as an unnamed file
    /// (`O_TMPFILE`, with the caller's credentials) and linked into place, so other daemons
    /// never see it half-written and the kernel decides EEXIST races.
    /// In a node-local store (`backend/nodelocal.rs`), the file is on the store's target, with no
    /// placement and no open marker, and its sidecar is made in place (`namespace/inplace.rs`).
    pub fn create(
        &self,
        b: &Backend,
        path: &str,
        mode: u32,
        flags: i32,
        token: u64,
        ctx: &Ctx,
    ) -> Res<(Attr, Layout, OpenHandle)> {
        let excl = flags & libc::O_EXCL != 0;
        if validate_path(path)?.is_empty() {
            return Err(eno(errno::EISDIR, "namespace root"));
        }
        if !excl {
            match self.open(b, path, flags & !libc::O_TRUNC, ctx) {
                Err(e) if e.errno == errno::ENOENT => {}
                r => return r,
            }
        }
        nsfs::private_umask();
        // Permission to create there first (search and write), before anything is placed.
        let (d, name) = self.parent(path)?;
        if let Some(ti) = self.local {
            return match self.create_in_place(b, &d, &name, ti, mode, token, ctx)? {
                Some(made) => Ok(made),
                None => self.create_found(b, path, (&d, &name), flags, token, ctx),
            };
        }
        let g = caller(ctx);
        let staged = nsfs::openat(d.as_raw_fd(), c".", libc::O_TMPFILE | libc::O_WRONLY, mode & 0o7777);
        drop(g);
        let mut staged = staged.map_err(werr)?;
        let local = self.local;
        let l = match local {
            Some(ti) => local_layout(random_u64(), ti),
            None => b.placement.place(&b.targets, &ctx.job_id),
        };
        // No object is made here: a stripe's object is made by its first write (or an
        // extending truncate), and a missing one reads as a hole ([`super::super::DataPath`]).
        let mut made = Vec::new();
        let cleanup = |made: &Vec<PathBuf>| {
            for m in made.iter().rev() {
                let _ = fs::remove_dir(m);
            }
        };
        if l.is_progressive() {
            // Components are placed by their first write; their records go here.
            let d = b.placement.comp_dir(l.oid);
            fs::DirBuilder::new().mode(0o700).create(&d).map_err(werr)?;
            made.push(d);
        }
        // The open is recorded before the name appears: an unlink right after the link
        // already sees it.
        let h = match b.mark(&l) {
            Ok(h) => h,
            Err(e) => {
                cleanup(&made);
                return Err(e);
            }
        };
        let res = staged.write_all(layout_text(&l, token).as_bytes()).and_then(|()| {
            let _g = caller(ctx);
            nsfs::link_tmpfile(&staged, d.as_raw_fd(), &name)
        });
        let st = res.is_ok().then(|| nsfs::fstat(staged.as_raw_fd()));
        drop(staged);
        if let Err(e) = res {
            if local.is_none() {
                b.opens.remove_marker(l.oid, h);
            }
            cleanup(&made);
            if e.raw_os_error() == Some(errno::EEXIST) {
                return self.create_found(b, path, (&d, &name), flags, token, ctx);
            }
            return Err(werr(e));
        }
        for &ti in Placer::whole_file_targets(&l) {
            b.targets[ti as usize].shm.add_open(1);
        }
        // A file just made has no object yet (its first write makes them): its attributes are
        // its sidecar's (as linked: no lookup), size and blocks 0.
        let attr = st.expect("linked").map_err(werr).map(|st| Attr { size: 0, blocks: 0, ..attr_of_stat(&st) });
        match attr {
            Ok(a) => Ok((a, l, h)),
            Err(e) => {
                let _ = self.release(b, &l, h);
                Err(e)
            }
        }
    }

    /// A create of `path` (`at`: its directory and name) found the name taken: a replay of this
    /// very create (same `token`) that succeeded earlier opens it, as does a create without
    /// `O_EXCL`; else `EEXIST`.
    fn create_found(
        &self,
        b: &Backend,
        path: &str,
        at: (&OwnedFd, &CStr),
        flags: i32,
        token: u64,
        ctx: &Ctx,
    ) -> Res<(Attr, Layout, OpenHandle)> {
        if let Ok((_, tok, _)) = self.layout_or_adopt(at.0, at.1, token) {
            if tok == token && token != 0 {
                return self.open(b, path, libc::O_RDWR, ctx);
            }
        }
        if flags & libc::O_EXCL == 0 {
            return self.open(b, path, flags & !libc::O_TRUNC, ctx);
        }
        Err(eno(errno::EEXIST, "file exists"))
    }

    /// The access an open with `flags` needs (`O_TRUNC` needs write permission).
    fn access_mode(flags: i32) -> libc::c_int {
        let m = match flags & libc::O_ACCMODE {
            libc::O_WRONLY => libc::W_OK,
            libc::O_RDWR => libc::R_OK | libc::W_OK,
            _ => libc::R_OK,
        };
        if flags & libc::O_TRUNC != 0 {
            m | libc::W_OK
        } else {
            m
        }
    }

    /// Opens an existing regular file with open(2) `flags` (access checked on the file with
    /// the caller's credentials; `O_TRUNC` truncates): returns attr, layout and open handle,
    /// and counts it open. The open is recorded (marker) before it is reported, so a later
    /// unlink keeps the data until [`Backend::release`].
    pub fn open(&self, b: &Backend, path: &str, flags: i32, ctx: &Ctx) -> Res<(Attr, Layout, OpenHandle)> {
        let truncate = flags & libc::O_TRUNC != 0;
        for _ in 0..16 {
            let (d, name) = self.parent(path)?;
            let obj = nsfs::open_obj(d.as_raw_fd(), &name).map_err(werr)?;
            let st = nsfs::fstat(obj.as_raw_fd()).map_err(werr)?;
            match st.st_mode & libc::S_IFMT {
                libc::S_IFDIR => return Err(eno(errno::EISDIR, "is a directory")),
                libc::S_IFLNK => return Err(eno(errno::ELOOP, "a symbolic link")),
                libc::S_IFREG => {}
                _ => return Err(eno(errno::EINVAL, "not a regular file")),
            }
            let g = caller(ctx);
            nsfs::access_fd(obj.as_raw_fd(), Self::access_mode(flags)).map_err(werr)?;
            drop(g);
            let (l, _, f) = self.layout_at(&d, &name)?;
            // Held until the open is recorded: a migration's switch waits for it, or this
            // open sees the new sidecar below ([`super::swap`]).
            lock_shared(&f)?;
            if nsfs::fstat(f.as_raw_fd()).map_err(werr)?.st_ino != st.st_ino {
                continue; // another file took the name since the access check
            }
            b.check_layout(&l)?;
            let h = b.mark(&l)?;
            // Still the same file under this name? Else an unlink or rename raced us: the
            // objects may already be going; drop this open and look again.
            let sidecar = match self.layout_at(&d, &name) {
                // The same layout, not only the same object: a migration may have moved
                // the objects (same oid, other targets) before this open was recorded.
                Ok((now, _, f)) if now == l => f,
                Ok(_) => {
                    b.unmark(&l, h);
                    continue;
                }
                Err(e) => {
                    b.unmark(&l, h);
                    return Err(e);
                }
            };
            for &ti in Placer::whole_file_targets(&l) {
                b.targets[ti as usize].shm.add_open(1);
            }
            let done = (|| {
                if truncate {
                    b.data.truncate(b, &l, 0)?;
                }
                // The sidecar the name holds (just checked): no lookup or read again.
                let st = nsfs::fstat(sidecar.as_raw_fd()).map_err(werr)?;
                file_attr(b, &st, &l)
            })();
            return match done {
                Ok(a) => Ok((a, l, h)),
                Err(e) => {
                    let _ = self.release(b, &l, h);
                    Err(e)
                }
            };
        }
        Err(eno(errno::EIO, "file replaced too often during open"))
    }

    /// Releases open `h` (served by any daemon) of the file with layout `l`.
    pub fn release(&self, b: &Backend, l: &Layout, h: OpenHandle) -> Res<()> {
        b.check_layout(l)?;
        for &ti in Placer::whole_file_targets(l) {
            b.targets[ti as usize].shm.add_open(-1);
        }
        if l.is_progressive() {
            // The component this open was writing (recorded by whichever daemon served it).
            b.placement.leave(&b.targets, &b.opens, l, h);
        }
        b.unmark(l, h);
        Ok(())
    }
}
