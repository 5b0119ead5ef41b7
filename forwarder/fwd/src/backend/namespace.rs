//! The namespace (MDT): lookup and attributes, readdir, directories, symbolic and hard
//! links, special files, unlink and rename, create/open/release of regular files, setattr
//! and the setuid/setgid clearing of writes. Every name is resolved from the namespace
//! root's fd with the caller's credentials ([`crate::nsfs`]), so the forwarding node's
//! kernel applies POSIX's permission rules.
use std::ffi::{CStr, CString};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::PathBuf;

use pharos_fwd_proto::{
    errno, validate_path, Attr, Ctx, DirEntry, Kind, Layout, OpenHandle, SetAttr, Time, READDIR_PAGE_BYTES,
};

use super::layout::{layout_text, parse_layout};
use super::{eno, t, werr, Backend, Res};
use crate::nsfs::{self, Caller};

const SUIDGID: u32 = libc::S_ISUID | libc::S_ISGID;

/// The mode bits a write by a caller without `CAP_FSETID` clears (Linux's
/// `setattr_should_drop_suidgid`): setuid always, setgid when group-execute is set or the
/// caller is not in the file's group (`in_group`).
fn killed_by_write(mode: u32, in_group: bool) -> u32 {
    let mut kill = mode & libc::S_ISUID;
    if mode & libc::S_ISGID != 0 && (mode & libc::S_IXGRP != 0 || !in_group) {
        kill |= libc::S_ISGID;
    }
    kill
}

fn kind_of_mode(mode: u32) -> Kind {
    match mode & libc::S_IFMT {
        libc::S_IFREG => Kind::File,
        libc::S_IFDIR => Kind::Dir,
        libc::S_IFLNK => Kind::Symlink,
        libc::S_IFIFO => Kind::Fifo,
        libc::S_IFSOCK => Kind::Socket,
        libc::S_IFCHR => Kind::CharDev,
        libc::S_IFBLK => Kind::BlockDev,
        _ => Kind::Other,
    }
}

impl Backend {
    /// Resolves a request path inside the namespace.
    pub fn ns_path(&self, path: &str) -> Res<PathBuf> {
        let comps = validate_path(path)?;
        let mut p = self.ns.clone();
        for c in comps {
            p.push(c);
        }
        Ok(p)
    }

    /// The caller's credentials on this thread until the guard drops (see [`crate::nsfs`]).
    fn caller(&self, ctx: &Ctx) -> Caller {
        Caller::assume(ctx.uid, ctx.gid, &ctx.groups)
    }

    /// The directory holding `path` (an `O_PATH` fd; the namespace root itself for the root)
    /// and the last component (`.` for the root). Resolved with the thread's credentials
    /// (search permission), never through a symlink nor out of the namespace.
    fn parent(&self, path: &str) -> Res<(OwnedFd, CString)> {
        let comps = validate_path(path)?;
        let Some((last, dirs)) = comps.split_last() else {
            return Ok((self.ns_fd.try_clone().map_err(werr)?, c".".to_owned()));
        };
        let name = nsfs::cstr(last).map_err(werr)?;
        if dirs.is_empty() {
            return Ok((self.ns_fd.try_clone().map_err(werr)?, name));
        }
        // Directories a few thousand bytes at a time: a path below the namespace root may be
        // longer than PATH_MAX (see `pharos_fwd_proto::MAX_PATH`).
        let mut d: Option<OwnedFd> = None;
        let mut chunk = String::new();
        for (i, c) in dirs.iter().enumerate() {
            if !chunk.is_empty() {
                chunk.push('/');
            }
            chunk.push_str(c);
            if i + 1 < dirs.len() && chunk.len() + 1 + dirs[i + 1].len() < 3072 {
                continue;
            }
            let rel = nsfs::cstr(&chunk).map_err(werr)?;
            let from = d.as_ref().unwrap_or(&self.ns_fd).as_raw_fd();
            d = Some(nsfs::open_beneath(from, &rel).map_err(|e| match e.raw_os_error() {
                // A symlink on the way (RESOLVE_NO_SYMLINKS): a client never sends one.
                Some(libc::ELOOP) | Some(libc::EXDEV) => eno(errno::ELOOP, "symlink in a request path"),
                _ => werr(e),
            })?);
            chunk.clear();
        }
        Ok((d.expect("at least one directory"), name))
    }

    /// Reads the layout sidecar `name` of directory `dir` (as the daemon: sidecars may have
    /// any mode); also returns the open sidecar (its link count tells when the last name
    /// went).
    fn layout_at(&self, dir: &OwnedFd, name: &CStr) -> Res<(Layout, u64, File)> {
        // O_NOATIME: reading the layout is not an access of the file (its atime is the sidecar's).
        let ro = libc::O_RDONLY | libc::O_NOFOLLOW;
        let mut f = match nsfs::openat(dir.as_raw_fd(), name, ro | libc::O_NOATIME, 0) {
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => nsfs::openat(dir.as_raw_fd(), name, ro, 0),
            r => r,
        }
        .map_err(werr)?;
        let mut s = String::new();
        std::io::Read::read_to_string(&mut f, &mut s).map_err(werr)?;
        let (l, tok) = parse_layout(&s).ok_or_else(|| eno(errno::EIO, format!("corrupt layout sidecar {name:?}")))?;
        Ok((l, tok, f))
    }

    /// Reads the layout sidecar of a namespace file (request path).
    pub fn read_layout(&self, path: &str) -> Res<(Layout, u64)> {
        let (d, name) = self.parent(path)?;
        self.layout_at(&d, &name).map(|(l, t, _)| (l, t))
    }

    /// The attributes of `name` in `dir` whose `lstat` is `st`: a regular file's size,
    /// blocks and times come from its data objects too (its sidecar is read as the daemon).
    fn attr_at(&self, dir: &OwnedFd, name: &CStr, st: &libc::stat) -> Res<Attr> {
        let kind = kind_of_mode(st.st_mode);
        let mut a = Attr {
            ino: st.st_ino,
            kind,
            perm: st.st_mode & 0o7777,
            nlink: st.st_nlink as u32,
            uid: st.st_uid,
            gid: st.st_gid,
            size: st.st_size as u64,
            blocks: st.st_blocks as u64,
            rdev: if matches!(kind, Kind::CharDev | Kind::BlockDev) { st.st_rdev } else { 0 },
            atime: t(st.st_atime, st.st_atime_nsec),
            mtime: t(st.st_mtime, st.st_mtime_nsec),
            ctime: t(st.st_ctime, st.st_ctime_nsec),
        };
        if kind == Kind::File {
            let (l, _, _) = self.layout_at(dir, name)?;
            let (size, blocks, mtime, ctime) = self.data_stat(&l)?;
            a.size = size;
            a.blocks = blocks;
            // Data writes and truncates change the objects' times, name operations the
            // sidecar's: the file's are the newer of each.
            a.mtime = a.mtime.max(mtime);
            a.ctime = a.ctime.max(ctime);
        }
        Ok(a)
    }

    /// Attributes of `path` (lookup and getattr), with the caller's search permissions.
    pub fn getattr(&self, path: &str, ctx: &Ctx) -> Res<Attr> {
        let g = self.caller(ctx);
        let (d, name) = self.parent(path)?;
        let st = nsfs::lstat(d.as_raw_fd(), &name).map_err(werr)?;
        drop(g);
        self.attr_at(&d, &name, &st)
    }

    /// One page of the directory `path` from `cookie` (0 = start; else an entry's `next`),
    /// at most [`READDIR_PAGE_BYTES`] of names; `true` = the end was reached. `.` and `..`
    /// come as the file system lists them.
    pub fn readdir(&self, path: &str, cookie: u64, ctx: &Ctx) -> Res<(Vec<DirEntry>, bool)> {
        let g = self.caller(ctx);
        let (d, name) = self.parent(path)?;
        let f = nsfs::openat(d.as_raw_fd(), &name, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW, 0)
            .map_err(werr)?;
        drop(g);
        let dir = unsafe { libc::fdopendir(f.as_raw_fd()) };
        if dir.is_null() {
            return Err(werr(io::Error::last_os_error()));
        }
        std::mem::forget(f); // owned by the DIR stream now
        struct Closer(*mut libc::DIR);
        impl Drop for Closer {
            fn drop(&mut self) {
                unsafe { libc::closedir(self.0) };
            }
        }
        let _close = Closer(dir);
        if cookie != 0 {
            unsafe { libc::seekdir(dir, cookie as libc::c_long) };
        }
        let (mut out, mut bytes) = (Vec::new(), 0usize);
        loop {
            if bytes >= READDIR_PAGE_BYTES {
                return Ok((out, false));
            }
            unsafe { *libc::__errno_location() = 0 };
            let e = unsafe { libc::readdir64(dir) };
            if e.is_null() {
                let err = io::Error::last_os_error();
                if err.raw_os_error().unwrap_or(0) != 0 {
                    return Err(werr(err));
                }
                return Ok((out, true));
            }
            let e = unsafe { &*e };
            let cname = unsafe { CStr::from_ptr(e.d_name.as_ptr()) };
            let Ok(n) = cname.to_str() else { continue };
            let kind = match e.d_type {
                libc::DT_REG => Kind::File,
                libc::DT_DIR => Kind::Dir,
                libc::DT_LNK => Kind::Symlink,
                libc::DT_FIFO => Kind::Fifo,
                libc::DT_SOCK => Kind::Socket,
                libc::DT_CHR => Kind::CharDev,
                libc::DT_BLK => Kind::BlockDev,
                _ => nsfs::lstat(unsafe { libc::dirfd(dir) }, cname)
                    .map(|st| kind_of_mode(st.st_mode))
                    .unwrap_or(Kind::Other),
            };
            bytes += n.len() + 32;
            out.push(DirEntry { name: n.to_string(), ino: e.d_ino, kind, next: e.d_off as u64 });
        }
    }

    pub fn mkdir(&self, path: &str, mode: u32, ctx: &Ctx) -> Res<Attr> {
        if validate_path(path)?.is_empty() {
            return Err(eno(errno::EEXIST, "namespace root"));
        }
        nsfs::private_umask();
        let g = self.caller(ctx);
        let (d, name) = self.parent(path)?;
        nsfs::mkdirat(d.as_raw_fd(), &name, mode & 0o7777).map_err(werr)?;
        let st = nsfs::lstat(d.as_raw_fd(), &name).map_err(werr)?;
        drop(g);
        self.attr_at(&d, &name, &st)
    }

    pub fn rmdir(&self, path: &str, ctx: &Ctx) -> Res<()> {
        if validate_path(path)?.is_empty() {
            return Err(eno(errno::EBUSY, "namespace root"));
        }
        let _g = self.caller(ctx);
        let (d, name) = self.parent(path)?;
        nsfs::unlinkat(d.as_raw_fd(), &name, libc::AT_REMOVEDIR).map_err(werr)
    }

    /// A symbolic link `path` → `target`.
    pub fn symlink(&self, path: &str, target: &str, ctx: &Ctx) -> Res<Attr> {
        if validate_path(path)?.is_empty() {
            return Err(eno(errno::EEXIST, "namespace root"));
        }
        let target = nsfs::cstr(target).map_err(werr)?;
        let g = self.caller(ctx);
        let (d, name) = self.parent(path)?;
        nsfs::symlinkat(&target, d.as_raw_fd(), &name).map_err(werr)?;
        let st = nsfs::lstat(d.as_raw_fd(), &name).map_err(werr)?;
        drop(g);
        self.attr_at(&d, &name, &st)
    }

    pub fn readlink(&self, path: &str, ctx: &Ctx) -> Res<String> {
        let _g = self.caller(ctx);
        let (d, name) = self.parent(path)?;
        let b = nsfs::readlinkat(d.as_raw_fd(), &name).map_err(werr)?;
        String::from_utf8(b).map_err(|_| eno(errno::EIO, "symlink target is not UTF-8"))
    }

    /// A hard link `to` of `from`: both names share the sidecar, hence the layout and data.
    pub fn link(&self, from: &str, to: &str, ctx: &Ctx) -> Res<Attr> {
        if validate_path(to)?.is_empty() {
            return Err(eno(errno::EEXIST, "namespace root"));
        }
        let g = self.caller(ctx);
        let (a, an) = self.parent(from)?;
        let (b, bn) = self.parent(to)?;
        nsfs::linkat(a.as_raw_fd(), &an, b.as_raw_fd(), &bn, 0).map_err(werr)?;
        let st = nsfs::lstat(b.as_raw_fd(), &bn).map_err(werr)?;
        drop(g);
        self.attr_at(&b, &bn, &st)
    }

    /// A FIFO, socket or device node (the type bits of `mode`); a regular file gets a
    /// layout like [`Backend::create`] (and is not left open).
    pub fn mknod(&self, path: &str, mode: u32, rdev: u64, ctx: &Ctx) -> Res<Attr> {
        if validate_path(path)?.is_empty() {
            return Err(eno(errno::EEXIST, "namespace root"));
        }
        if mode & libc::S_IFMT == libc::S_IFREG || mode & libc::S_IFMT == 0 {
            let (a, l, h) = self.create(path, mode & 0o7777, libc::O_CREAT | libc::O_EXCL, 0, ctx)?;
            self.release(&l, h)?;
            return Ok(a);
        }
        nsfs::private_umask();
        let g = self.caller(ctx);
        let (d, name) = self.parent(path)?;
        nsfs::mknodat(d.as_raw_fd(), &name, mode, rdev).map_err(werr)?;
        let st = nsfs::lstat(d.as_raw_fd(), &name).map_err(werr)?;
        drop(g);
        self.attr_at(&d, &name, &st)
    }

    /// The open sidecar and layout of `name` in `dir` when it is a regular file (to tell,
    /// after a name operation, whether its last name went: link count 0).
    fn file_at(&self, dir: &OwnedFd, name: &CStr) -> Option<(Layout, File)> {
        let st = nsfs::lstat(dir.as_raw_fd(), name).ok()?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return None;
        }
        self.layout_at(dir, name).ok().map(|(l, _, f)| (l, f))
    }

    /// After a name of the file (`l`, open sidecar `f`) went: its data goes too when that was
    /// the last name (hard links share the sidecar; its link count says).
    fn name_gone(&self, l: &Layout, f: &File) {
        if nsfs::fstat(f.as_raw_fd()).map(|st| st.st_nlink == 0).unwrap_or(false) {
            self.drop_file(l);
        }
    }

    pub fn unlink(&self, path: &str, ctx: &Ctx) -> Res<()> {
        if validate_path(path)?.is_empty() {
            return Err(eno(errno::EISDIR, "namespace root"));
        }
        let g = self.caller(ctx);
        let (d, name) = self.parent(path)?;
        drop(g);
        let file = self.file_at(&d, &name);
        let g = self.caller(ctx);
        nsfs::unlinkat(d.as_raw_fd(), &name, 0).map_err(werr)?;
        drop(g);
        if let Some((l, f)) = file {
            self.name_gone(&l, &f);
        }
        Ok(())
    }

    pub fn rename(&self, from: &str, to: &str, noreplace: bool, ctx: &Ctx) -> Res<()> {
        if validate_path(from)?.is_empty() || validate_path(to)?.is_empty() {
            return Err(eno(errno::EBUSY, "namespace root"));
        }
        let g = self.caller(ctx);
        let (a, an) = self.parent(from)?;
        let (b, bn) = self.parent(to)?;
        drop(g);
        let replaced = self.file_at(&b, &bn);
        let flags = if noreplace { libc::RENAME_NOREPLACE } else { 0 };
        let g = self.caller(ctx);
        nsfs::renameat2(a.as_raw_fd(), &an, b.as_raw_fd(), &bn, flags).map_err(werr)?;
        drop(g);
        // The replaced file's data goes with its last name (not when both names were links
        // of one file: then rename does nothing).
        if let Some((l, f)) = replaced {
            self.name_gone(&l, &f);
        }
        Ok(())
    }

    /// Creates (or, without `O_EXCL` in `flags` and when it exists, opens) a regular file for
    /// the caller `ctx` (its job picks the placement pool; it owns the file, with the
    /// parent's group in a setgid directory). Returns its attr, layout and open handle, and
    /// counts it open on its targets. The sidecar is written as an unnamed file
    /// (`O_TMPFILE`, with the caller's credentials) and linked into place, so other daemons
    /// never see it half-written and the kernel decides EEXIST races.
    pub fn create(&self, path: &str, mode: u32, flags: i32, token: u64, ctx: &Ctx) -> Res<(Attr, Layout, OpenHandle)> {
        let excl = flags & libc::O_EXCL != 0;
        if validate_path(path)?.is_empty() {
            return Err(eno(errno::EISDIR, "namespace root"));
        }
        if !excl {
            match self.open(path, flags & !libc::O_TRUNC, ctx) {
                Err(e) if e.errno == errno::ENOENT => {}
                r => return r,
            }
        }
        nsfs::private_umask();
        // Permission to create there first (search and write), before anything is placed.
        let g = self.caller(ctx);
        let (d, name) = self.parent(path)?;
        let staged = nsfs::openat(d.as_raw_fd(), c".", libc::O_TMPFILE | libc::O_WRONLY, mode & 0o7777);
        drop(g);
        let mut staged = staged.map_err(werr)?;
        let l = self.place(&ctx.job_id);
        let mut made = Vec::new();
        let cleanup = |made: &Vec<PathBuf>| {
            for m in made.iter().rev() {
                let _ = if m.is_dir() { fs::remove_dir(m) } else { fs::remove_file(m) };
            }
        };
        if l.is_progressive() {
            // Components are placed by their first write; their records go here.
            let d = self.comp_dir(l.oid);
            fs::DirBuilder::new().mode(0o700).create(&d).map_err(werr)?;
            made.push(d);
        }
        for &(s, ti) in &self.objects(&l)? {
            let op = self.obj_path(ti, l.oid, s);
            if let Err(e) = OpenOptions::new().write(true).create_new(true).mode(0o600).open(&op) {
                cleanup(&made);
                return Err(werr(e));
            }
            made.push(op);
        }
        // The open is recorded before the name appears: an unlink right after the link
        // already sees it.
        let h = match self.add_marker(l.oid) {
            Ok(h) => h,
            Err(e) => {
                cleanup(&made);
                return Err(e);
            }
        };
        let res = staged.write_all(layout_text(&l, token).as_bytes()).and_then(|()| {
            let _g = self.caller(ctx);
            nsfs::link_tmpfile(&staged, d.as_raw_fd(), &name)
        });
        drop(staged);
        if let Err(e) = res {
            self.remove_marker(l.oid, h);
            cleanup(&made);
            if e.raw_os_error() == Some(errno::EEXIST) {
                // A replay of this very create (same token) succeeded earlier: open it.
                if let Ok((_, tok, _)) = self.layout_at(&d, &name) {
                    if tok == token && token != 0 {
                        return self.open(path, libc::O_RDWR, ctx);
                    }
                }
                if !excl {
                    return self.open(path, flags & !libc::O_TRUNC, ctx);
                }
            }
            return Err(werr(e));
        }
        for &ti in Self::whole_file_targets(&l) {
            self.targets[ti as usize].shm.add_open(1);
        }
        let attr = nsfs::lstat(d.as_raw_fd(), &name).map_err(werr).and_then(|st| self.attr_at(&d, &name, &st));
        match attr {
            Ok(a) => Ok((a, l, h)),
            Err(e) => {
                let _ = self.release(&l, h);
                Err(e)
            }
        }
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

    /// Opens an existing regular file with open(2) `flags` (access checked with the caller's
    /// credentials; `O_TRUNC` truncates): returns attr, layout and open handle, and counts it
    /// open. The open is recorded (marker) before it is reported, so a later unlink keeps
    /// the data until [`Backend::release`].
    pub fn open(&self, path: &str, flags: i32, ctx: &Ctx) -> Res<(Attr, Layout, OpenHandle)> {
        let truncate = flags & libc::O_TRUNC != 0;
        for _ in 0..16 {
            let g = self.caller(ctx);
            let (d, name) = self.parent(path)?;
            let st = nsfs::lstat(d.as_raw_fd(), &name).map_err(werr)?;
            match st.st_mode & libc::S_IFMT {
                libc::S_IFDIR => return Err(eno(errno::EISDIR, "is a directory")),
                libc::S_IFLNK => return Err(eno(errno::ELOOP, "a symbolic link")),
                libc::S_IFREG => {}
                _ => return Err(eno(errno::EINVAL, "not a regular file")),
            }
            nsfs::access(d.as_raw_fd(), &name, Self::access_mode(flags)).map_err(werr)?;
            drop(g);
            let (l, _, _) = self.layout_at(&d, &name)?;
            self.check_layout(&l)?;
            let h = self.add_marker(l.oid)?;
            // Still the same file under this name? Else an unlink or rename raced us: the
            // objects may already be going; drop this open and look again.
            match self.layout_at(&d, &name) {
                Ok((now, _, _)) if now.oid == l.oid => {}
                Ok(_) => {
                    self.unmark(&l, h);
                    continue;
                }
                Err(e) => {
                    self.unmark(&l, h);
                    return Err(e);
                }
            }
            for &ti in Self::whole_file_targets(&l) {
                self.targets[ti as usize].shm.add_open(1);
            }
            let done = (|| {
                if truncate {
                    self.truncate(&l, 0)?;
                }
                let st = nsfs::lstat(d.as_raw_fd(), &name).map_err(werr)?;
                self.attr_at(&d, &name, &st)
            })();
            return match done {
                Ok(a) => Ok((a, l, h)),
                Err(e) => {
                    let _ = self.release(&l, h);
                    Err(e)
                }
            };
        }
        Err(eno(errno::EIO, "file replaced too often during open"))
    }

    /// Releases open `h` (served by any daemon) of the file with layout `l`.
    pub fn release(&self, l: &Layout, h: OpenHandle) -> Res<()> {
        self.check_layout(l)?;
        for &ti in Self::whole_file_targets(l) {
            self.targets[ti as usize].shm.add_open(-1);
        }
        if l.is_progressive() {
            // The component this open was writing (recorded by whichever daemon served it).
            let mut writing = self.writing.lock().unwrap();
            writing.remove(&h);
            if let Some(t) = self.counted_target(l.oid, h) {
                self.set_counted_target(l.oid, h, None);
                self.targets[t as usize].shm.add_open(-1);
            }
        }
        self.unmark(l, h);
        Ok(())
    }

    /// Changes attributes of `path` with the caller's credentials (chown, chmod and
    /// utimensat rules are the kernel's); a size change needs write permission unless it
    /// comes through a file open for writing (ftruncate): `by_fd` is the object id of the
    /// open's verified write capability, honoured only while `path` holds that object.
    ///
    /// A truncate by a caller without `CAP_FSETID` also clears setuid/setgid: the client's
    /// kernel (FUSE without `handle_killpriv`) sends the mode with those bits cleared along
    /// with the size. That mode is the truncate's side effect, not a chmod: it is applied
    /// as the daemon once the size change is allowed (the caller need not own the file), as
    /// the local kernel does (`ATTR_FORCE`). Any other mode is a chmod with the caller's
    /// rights.
    pub fn setattr(&self, path: &str, set: &SetAttr, by_fd: Option<u64>, ctx: &Ctx) -> Res<Attr> {
        let mut g = self.caller(ctx);
        let (d, name) = self.parent(path)?;
        let st = nsfs::lstat(d.as_raw_fd(), &name).map_err(werr)?;
        let fmt = st.st_mode & libc::S_IFMT;
        let by_fd = match by_fd {
            Some(oid) if fmt == libc::S_IFREG => {
                drop(g); // the sidecar is read as the daemon
                let same = self.layout_at(&d, &name)?.0.oid == oid;
                g = self.caller(ctx);
                same
            }
            _ => false,
        };
        let cur = st.st_mode & 0o7777;
        let kill_mode = match (set.size, set.mode.map(|m| m & 0o7777)) {
            (Some(_), Some(m)) if m != cur && m | (cur & SUIDGID) == cur => Some(m),
            _ => None,
        };
        if set.size.is_some() {
            match fmt {
                libc::S_IFREG => {}
                libc::S_IFDIR => return Err(eno(errno::EISDIR, "is a directory")),
                _ => return Err(eno(errno::EINVAL, "not a regular file")),
            }
            if !by_fd {
                nsfs::access(d.as_raw_fd(), &name, libc::W_OK).map_err(werr)?;
            }
        }
        // Only for a chown: chown(-1, -1) is not a no-op (it clears setuid, and a non-owner
        // gets EPERM on such a file).
        if set.uid.is_some() || set.gid.is_some() {
            nsfs::fchownat(d.as_raw_fd(), &name, set.uid, set.gid).map_err(werr)?;
        }
        if let Some(mode) = set.mode.filter(|_| kill_mode.is_none()) {
            if fmt == libc::S_IFLNK {
                return Err(eno(libc::EOPNOTSUPP, "mode of a symbolic link"));
            }
            nsfs::fchmodat(d.as_raw_fd(), &name, mode & 0o7777).map_err(werr)?;
        }
        drop(g);
        if let Some(mode) = kill_mode {
            nsfs::fchmodat(d.as_raw_fd(), &name, mode).map_err(werr)?;
        }
        let layout = if fmt == libc::S_IFREG { Some(self.layout_at(&d, &name)?.0) } else { None };
        if let (Some(size), Some(l)) = (set.size, &layout) {
            self.truncate(l, size)?;
        }
        if set.atime.is_some() || set.mtime.is_some() {
            let ts = |x: &Option<Option<Time>>| match x {
                None => libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_OMIT },
                Some(None) => libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_NOW },
                Some(Some(t)) => libc::timespec { tv_sec: t.sec, tv_nsec: t.nsec as i64 },
            };
            let times = [ts(&set.atime), ts(&set.mtime)];
            // Through an open file, "now" needs no permission (ftruncate's time update).
            let now_only = set.atime.is_none_or(|t| t.is_none()) && set.mtime.is_none_or(|t| t.is_none());
            let g = if by_fd && now_only { None } else { Some(self.caller(ctx)) };
            nsfs::utimensat(d.as_raw_fd(), &name, &times).map_err(werr)?;
            drop(g);
            if let Some(l) = &layout {
                for (idx, ti) in self.objects(l)? {
                    let q = nsfs::cstr(&self.obj_path(ti, l.oid, idx).to_string_lossy()).map_err(werr)?;
                    // A component placed but never written has no object yet.
                    match nsfs::utimensat(libc::AT_FDCWD, &q, &times) {
                        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(werr(e)),
                        _ => {}
                    }
                }
            }
        }
        let st = nsfs::lstat(d.as_raw_fd(), &name).map_err(werr)?;
        self.attr_at(&d, &name, &st)
    }

    /// Clears setuid, and setgid as Linux does ([`killed_by_write`]), of the regular file
    /// `path` when it still holds `l`'s object and open `h` is recorded: the side effect of
    /// a write by `ctx` without `CAP_FSETID` (see `Op::KillSuidgid`). Done as the daemon, as
    /// the local kernel does it for any writer (the writer need not own the file).
    pub fn kill_suidgid(&self, path: &str, l: &Layout, h: OpenHandle, ctx: &Ctx) -> Res<()> {
        self.check_layout(l)?;
        if !self.marker_path(l.oid, h).exists() {
            return Err(eno(errno::EBADF, "no such open"));
        }
        let (d, name) = self.parent(path)?;
        let st = nsfs::lstat(d.as_raw_fd(), &name).map_err(werr)?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG || self.layout_at(&d, &name)?.0.oid != l.oid {
            return Ok(()); // the name holds another file now: nothing of this one to clear
        }
        let mode = st.st_mode & 0o7777;
        let in_group = st.st_gid == ctx.gid || ctx.groups.contains(&st.st_gid);
        let kill = killed_by_write(mode, in_group);
        if kill != 0 {
            nsfs::fchmodat(d.as_raw_fd(), &name, mode & !kill).map_err(werr)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::testutil::*;
    use crate::backend::IoInfo;

    fn user(uid: u32, gid: u32, groups: &[u32]) -> Ctx {
        Ctx { uid, gid, groups: groups.to_vec(), ..Default::default() }
    }

    #[test]
    fn hard_links_share_data_and_the_last_name_drops_it() {
        let (d, b) = backend(2);
        let c = Ctx::default();
        let (_, l, h) = b.create("f", 0o644, EXCL, 1, &c).unwrap();
        let mut info = IoInfo::default();
        b.write(&l, h, 0, b"linked", &mut info).unwrap();
        b.release(&l, h).unwrap();
        let a = b.link("f", "g", &c).unwrap();
        assert_eq!((a.nlink, a.size, a.kind), (2, 6, Kind::File));
        assert_eq!(b.getattr("f", &c).unwrap().ino, a.ino);
        assert_eq!(b.link("f", "g", &c).unwrap_err().errno, errno::EEXIST);
        // Rename of one link onto the other does nothing (POSIX).
        b.rename("f", "g", false, &c).unwrap();
        assert_eq!(b.getattr("f", &c).unwrap().nlink, 2);
        b.unlink("f", &c).unwrap();
        assert_eq!(b.getattr("g", &c).unwrap().nlink, 1);
        let (_, l2, h2) = b.open("g", libc::O_RDONLY, &c).unwrap();
        assert_eq!(b.read(&l2, 0, 100, &mut info).unwrap(), b"linked");
        b.release(&l2, h2).unwrap();
        assert_eq!(obj_count(&d), 1);
        // Rename over the last name of a file: its data goes.
        b.create("h", 0o644, EXCL, 2, &c).map(|(_, l, h)| b.release(&l, h)).unwrap().unwrap();
        b.rename("h", "g", false, &c).unwrap();
        assert_eq!(obj_count(&d), 1);
        b.unlink("g", &c).unwrap();
        assert_eq!(obj_count(&d), 0);
        assert_eq!(
            b.mkdir("dir", 0o755, &c).map(|_| b.link("dir", "dir2", &c)).unwrap().unwrap_err().errno,
            errno::EPERM
        );
    }

    #[test]
    fn symlinks_special_files_and_paged_readdir() {
        let (_d, b) = backend(1);
        let c = Ctx::default();
        let a = b.symlink("l", "../somewhere/else", &c).unwrap();
        assert_eq!((a.kind, a.size), (Kind::Symlink, 17));
        assert_eq!(b.readlink("l", &c).unwrap(), "../somewhere/else");
        assert_eq!(b.open("l", libc::O_RDONLY, &c).unwrap_err().errno, errno::ELOOP);
        b.mkdir("d", 0o755, &c).unwrap();
        b.symlink("up", "d", &c).unwrap();
        // A symlink is never followed inside a request path.
        assert_eq!(b.getattr("up/x", &c).unwrap_err().errno, errno::ELOOP);
        assert_eq!(b.mknod("p", libc::S_IFIFO | 0o640, 0, &c).unwrap().kind, Kind::Fifo);
        assert_eq!(b.mknod("s", libc::S_IFSOCK | 0o600, 0, &c).unwrap().kind, Kind::Socket);
        let dev = libc::makedev(1, 3);
        let a = b.mknod("null", libc::S_IFCHR | 0o600, dev, &c).unwrap();
        assert_eq!((a.kind, a.rdev), (Kind::CharDev, dev));
        let a = b.mknod("reg", libc::S_IFREG | 0o600, 0, &c).unwrap();
        assert_eq!((a.kind, a.perm, a.size), (Kind::File, 0o600, 0));
        b.read_layout("reg").unwrap();
        // A directory larger than one page comes in several pages, every entry once.
        let names: Vec<String> = (0..3000).map(|i| format!("{i:0>120}")).collect();
        for n in &names {
            fs::File::create(b.ns_path(&format!("d/{n}")).unwrap()).unwrap();
        }
        let (mut got, mut cookie, mut pages) = (Vec::new(), 0, 0);
        loop {
            let (es, eof) = b.readdir("d", cookie, &c).unwrap();
            pages += 1;
            if let Some(last) = es.last() {
                cookie = last.next;
            }
            got.extend(es.into_iter().map(|e| e.name).filter(|n| n != "." && n != ".."));
            if eof {
                break;
            }
        }
        assert!(pages >= 2, "{pages} pages");
        got.sort();
        assert_eq!(got, names);
    }

    #[test]
    fn writes_and_truncates_by_others_clear_setuid_and_setgid() {
        assert_eq!(killed_by_write(0o4777, true), 0o4000);
        assert_eq!(killed_by_write(0o2777, true), 0o2000);
        assert_eq!(killed_by_write(0o2767, true), 0, "setgid without group-execute, a member");
        assert_eq!(killed_by_write(0o2767, false), 0o2000, "setgid without group-execute, not a member");
        assert_eq!(killed_by_write(0o6777, true), 0o6000);
        assert_eq!(killed_by_write(0o1777, false), 0);
        let (_d, b) = backend(1);
        if unsafe { libc::geteuid() } != 0 {
            return; // the daemon cannot chmod others' files then
        }
        let (root, u1) = (Ctx::default(), user(65534, 65534, &[]));
        let perm = |p: &str| b.getattr(p, &root).unwrap().perm;
        for (mode, left) in [(0o4777, 0o777), (0o2777, 0o777), (0o6777, 0o777), (0o2767, 0o767), (0o777, 0o777)] {
            let (_, l, h) = b.create("f", mode, EXCL, 0, &root).unwrap();
            b.setattr("f", &SetAttr { mode: Some(mode), ..Default::default() }, None, &root).unwrap();
            b.kill_suidgid("f", &l, h, &u1).unwrap();
            assert_eq!(perm("f"), left, "{mode:o}");
            // Not an open any more (or never one): refused.
            b.release(&l, h).unwrap();
            assert_eq!(b.kill_suidgid("f", &l, h, &u1).unwrap_err().errno, errno::EBADF);
            b.unlink("f", &root).unwrap();
        }
        // Another file under the name keeps its bits.
        let (_, l, h) = b.create("f", 0o4777, EXCL, 0, &root).unwrap();
        b.rename("f", "g", false, &root).unwrap();
        b.create("f", 0o644, EXCL, 0, &root).map(|(_, l, h)| b.release(&l, h)).unwrap().unwrap();
        b.setattr("f", &SetAttr { mode: Some(0o4777), ..Default::default() }, None, &root).unwrap();
        b.kill_suidgid("f", &l, h, &u1).unwrap();
        assert_eq!(perm("f"), 0o4777);
        b.release(&l, h).unwrap();
        // A truncate by a non-owner with write permission: the size and the mode without the
        // bits (as the client's kernel sends them) are applied; a chmod with it is refused.
        b.setattr("g", &SetAttr { mode: Some(0o6777), ..Default::default() }, None, &root).unwrap();
        let trunc = |mode| SetAttr { size: Some(1), mode: Some(mode), ..Default::default() };
        assert_eq!(b.setattr("g", &trunc(0o6755), None, &u1).unwrap_err().errno, errno::EPERM);
        let a = b.setattr("g", &trunc(0o777), None, &u1).unwrap();
        assert_eq!((a.perm, a.size), (0o777, 1));
        // Times and sizes alone (root's truncate: no mode) keep the bits.
        b.setattr("g", &SetAttr { mode: Some(0o6777), ..Default::default() }, None, &root).unwrap();
        b.setattr("g", &SetAttr { atime: Some(None), mtime: Some(None), ..Default::default() }, None, &u1).unwrap();
        b.setattr("g", &SetAttr { size: Some(0), ..Default::default() }, None, &root).unwrap();
        assert_eq!(perm("g"), 0o6777);
    }

    #[test]
    fn permissions_are_the_callers() {
        let (_d, b) = backend(1);
        if unsafe { libc::geteuid() } != 0 {
            return; // the checks are the daemon's own credentials then
        }
        let root = Ctx::default();
        let (u1, u2) = (user(65534, 65534, &[]), user(65533, 65533, &[4242]));
        b.mkdir("pub", 0o777, &root).unwrap();
        b.mkdir("priv", 0o755, &root).unwrap();
        assert_eq!(b.create("priv/f", 0o644, EXCL, 0, &u1).unwrap_err().errno, errno::EACCES);
        assert_eq!(b.mkdir("priv/d", 0o755, &u1).unwrap_err().errno, errno::EACCES);
        // The caller owns what it creates; others cannot open it for writing, chown or chmod it.
        let (a, l, h) = b.create("pub/f", 0o644, EXCL, 0, &u1).unwrap();
        b.release(&l, h).unwrap();
        assert_eq!((a.uid, a.gid, a.perm), (65534, 65534, 0o644));
        assert_eq!(b.open("pub/f", libc::O_WRONLY, &u2).unwrap_err().errno, errno::EACCES);
        b.open("pub/f", libc::O_RDONLY, &u2).map(|(_, l, h)| b.release(&l, h)).unwrap().unwrap();
        let chmod = SetAttr { mode: Some(0o600), ..Default::default() };
        assert_eq!(b.setattr("pub/f", &chmod, None, &u2).unwrap_err().errno, errno::EPERM);
        let chown = SetAttr { uid: Some(65533), ..Default::default() };
        assert_eq!(b.setattr("pub/f", &chown, None, &u1).unwrap_err().errno, errno::EPERM);
        let trunc = SetAttr { size: Some(0), ..Default::default() };
        assert_eq!(b.setattr("pub/f", &trunc, None, &u2).unwrap_err().errno, errno::EACCES);
        // utimensat: "now" for both needs write permission; one of them alone, ownership.
        let now = SetAttr { atime: Some(None), mtime: Some(None), ..Default::default() };
        assert_eq!(b.setattr("pub/f", &now, None, &u2).unwrap_err().errno, errno::EACCES);
        let mnow = SetAttr { mtime: Some(None), ..Default::default() };
        assert_eq!(b.setattr("pub/f", &mnow, None, &u2).unwrap_err().errno, errno::EPERM);
        // Group membership through supplementary groups: 4242 may write a g+w file of group 4242.
        b.setattr("pub/f", &SetAttr { gid: Some(4242), mode: Some(0o664), ..Default::default() }, None, &root).unwrap();
        b.open("pub/f", libc::O_WRONLY, &u2).map(|(_, l, h)| b.release(&l, h)).unwrap().unwrap();
        // Sticky directory: only the owner removes or renames its entries.
        b.setattr("pub", &SetAttr { mode: Some(0o1777), ..Default::default() }, None, &root).unwrap();
        assert_eq!(b.unlink("pub/f", &u2).unwrap_err().errno, errno::EPERM);
        assert_eq!(b.rename("pub/f", "pub/g", false, &u2).unwrap_err().errno, errno::EPERM);
        b.unlink("pub/f", &u1).unwrap();
        // setgid directory: new entries get its group; a non-member's setgid bit is cleared.
        b.setattr("pub", &SetAttr { mode: Some(0o2777), gid: Some(4242), ..Default::default() }, None, &root).unwrap();
        let a = b.mkdir("pub/sub", 0o755, &u1).unwrap();
        assert_eq!(a.gid, 4242);
        assert_eq!(a.perm & 0o2000, 0o2000, "directories inherit setgid");
        let (a, l, h) = b.create("pub/g", 0o2755, EXCL, 0, &u1).unwrap();
        b.release(&l, h).unwrap();
        assert_eq!((a.gid, a.perm & 0o2000), (4242, 0));
    }

    #[test]
    fn create_is_exclusive_and_replayable() {
        let (_d, b) = backend(2);
        b.create("f", 0o644, EXCL, 42, &Ctx::default()).unwrap();
        assert_eq!(b.create("f", 0o644, EXCL, 43, &Ctx::default()).unwrap_err().errno, errno::EEXIST);
        // Same token: the replay of a create that already happened succeeds.
        b.create("f", 0o644, EXCL, 42, &Ctx::default()).unwrap();
        assert_eq!(b.ns_path("../x").unwrap_err().errno, errno::EINVAL);
    }
}
