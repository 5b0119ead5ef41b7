//! The namespace (MDT): lookup and attributes, readdir, directories, symbolic and hard
//! links, special files, unlink and rename, create/open/release of regular files, setattr
//! and the setuid/setgid clearing of writes. The forwarding node's kernel applies POSIX's
//! permission rules with the caller's credentials ([`crate::nsfs`]) where the client's
//! kernel checks them, and nowhere else:
//!
//! * A request path's directories are resolved from the namespace root's fd as the daemon
//!   ([`Namespace::parent`]): search permission on the components a lookup walks is checked
//!   by the client's kernel, on the components the calling process really walks (a process
//!   whose working directory or `*at` directory fd is inside a directory works relative to
//!   it, whatever its ancestors' modes, as on a local file system).
//! * A name operation (create, mkdir, mknod, symlink, link, unlink, rmdir, rename) is an
//!   `*at` call relative to the parent directory, with the caller's credentials: search and
//!   write permission on that directory, sticky-directory and hard-link rules are checked
//!   by the forwarding node's kernel, as the client's kernel checks them on its lookup of the
//!   last component.
//! * An operation on an object itself (getattr, readlink, readdir, open, setattr) reaches it
//!   as the daemon (`O_PATH`) and checks, with the caller's credentials, what the kernel
//!   checks on the object (read/write permission of an open, a readdir and a truncate;
//!   ownership for chmod, chown and given times), by its fd: no search permission on its
//!   directory, which a process may not have (`stat(".")`, `ls` in its working directory).
//!
//! Regular files are created, opened and released in `namespace/files.rs`.
//!
//! [`Namespace`] owns the namespace root; the operations that touch a file's data or opens
//! take the [`Backend`] it is part of (placement at create, open markers, the data path's
//! sizes, truncates and removals).
use std::ffi::{CStr, CString};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use pharos_fwd_proto::{
    errno, validate_path, Attr, Ctx, DirEntry, Kind, Layout, OpenHandle, SetAttr, Time, READDIR_PAGE_BYTES,
};

use super::layout::parse_layout;
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

/// The attributes of the namespace entry whose `lstat` is `st` (a regular file's size,
/// blocks and times are its sidecar's: the caller adds its objects').
fn attr_of_stat(st: &libc::stat) -> Attr {
    let kind = kind_of_mode(st.st_mode);
    Attr {
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
    }
}

/// The attributes of the regular file with layout `l` whose sidecar's `stat` is `st`: size and
/// blocks from its objects, times the newer of the sidecar's and the objects'.
fn file_attr(b: &Backend, st: &libc::stat, l: &Layout) -> Res<Attr> {
    let mut a = attr_of_stat(st);
    let (size, blocks, mtime, ctime) = b.data.data_stat(b, l)?;
    a.size = size;
    a.blocks = blocks;
    // Data writes and truncates change the objects' times, name operations the
    // sidecar's: the file's are the newer of each.
    a.mtime = a.mtime.max(mtime);
    a.ctime = a.ctime.max(ctime);
    Ok(a)
}

/// The caller's credentials on this thread until the guard drops (see [`crate::nsfs`]).
fn caller(ctx: &Ctx) -> Caller {
    Caller::assume(ctx.uid, ctx.gid, &ctx.groups)
}

/// The namespace directory `<mdt>/ns` and its root's `O_PATH` fd, from which every name is
/// resolved.
pub(super) struct Namespace {
    root: PathBuf,
    root_fd: OwnedFd,
    /// A node-local store's target (`backend/nodelocal.rs`): its files live on that target and
    /// their opens have no marker; None for the MDT's namespace.
    local: Option<u32>,
}

impl Namespace {
    pub(super) fn new(root: PathBuf) -> io::Result<Namespace> {
        Ok(Namespace { root_fd: nsfs::open_dir(&root)?, root, local: None })
    }

    /// The node-local store of target `ti` rooted at `root` (`<target>/.nodelocal`).
    pub(super) fn local(root: PathBuf, ti: u32) -> io::Result<Namespace> {
        Ok(Namespace { root_fd: nsfs::open_dir(&root)?, root, local: Some(ti) })
    }

    /// The namespace directory.
    pub(super) fn root(&self) -> &Path {
        &self.root
    }

    /// Resolves a request path inside the namespace.
    pub fn path(&self, path: &str) -> Res<PathBuf> {
        let comps = validate_path(path)?;
        let mut p = self.root.clone();
        for c in comps {
            p.push(c);
        }
        Ok(p)
    }

    /// The directory holding `path` (an `O_PATH` fd; the namespace root itself for the root)
    /// and the last component (`.` for the root). Resolved as the daemon (call it outside a
    /// [`Caller`] guard): the client's kernel checked search permission on the components the
    /// caller walked (see the module docs). Never through a symlink nor out of the namespace.
    fn parent(&self, path: &str) -> Res<(OwnedFd, CString)> {
        let comps = validate_path(path)?;
        let Some((last, dirs)) = comps.split_last() else {
            return Ok((self.root_fd.try_clone().map_err(werr)?, c".".to_owned()));
        };
        let name = nsfs::cstr(last).map_err(werr)?;
        if dirs.is_empty() {
            return Ok((self.root_fd.try_clone().map_err(werr)?, name));
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
            let from = d.as_ref().unwrap_or(&self.root_fd).as_raw_fd();
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
        self.layout_or_adopt(dir, name, 0)
    }

    /// [`Namespace::layout_at`]; a node-local sidecar still empty is adopted with create token
    /// `token` (`namespace/inplace.rs`).
    fn layout_or_adopt(&self, dir: &OwnedFd, name: &CStr, token: u64) -> Res<(Layout, u64, File)> {
        // O_NOATIME: reading the layout is not an access of the file (its atime is the sidecar's).
        let ro = libc::O_RDONLY | libc::O_NOFOLLOW;
        let mut f = match nsfs::openat(dir.as_raw_fd(), name, ro | libc::O_NOATIME, 0) {
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => nsfs::openat(dir.as_raw_fd(), name, ro, 0),
            r => r,
        }
        .map_err(werr)?;
        // Plain reads into a page (a sidecar is one line; read_to_string would stat and seek
        // first), more pages only for a long one.
        let mut buf = vec![0u8; 4096];
        let mut n = 0;
        loop {
            if n == buf.len() {
                buf.resize(2 * n, 0);
            }
            match std::io::Read::read(&mut f, &mut buf[n..]) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(werr(e)),
            }
        }
        let (l, tok) = match std::str::from_utf8(&buf[..n]).ok().and_then(parse_layout) {
            Some(x) => x,
            // Empty or torn: a node-local create in place (else `EIO`, a corrupt sidecar).
            None => self.settle_in_place(dir, name, &f, token)?,
        };
        Ok((l, tok, f))
    }

    /// [`Namespace::layout_at`] with a shared lock on the sidecar, checked after the lock to
    /// still be the one `name` holds (a migration switches sidecars under an exclusive lock:
    /// `namespace/swap.rs`).
    fn layout_locked(&self, dir: &OwnedFd, name: &CStr) -> Res<(Layout, File)> {
        for _ in 0..16 {
            let (l, _, f) = self.layout_at(dir, name)?;
            swap::lock_shared(&f)?;
            if self.layout_at(dir, name)?.0 == l {
                return Ok((l, f));
            }
        }
        Err(eno(errno::EIO, "layout replaced too often"))
    }

    /// Reads the layout sidecar of a namespace file (request path).
    pub fn read_layout(&self, path: &str) -> Res<(Layout, u64)> {
        let (d, name) = self.parent(path)?;
        self.layout_at(&d, &name).map(|(l, t, _)| (l, t))
    }

    /// The attributes of `name` in `dir` whose `lstat` is `st`: a regular file's size,
    /// blocks and times come from its data objects too (its sidecar is read as the daemon).
    fn attr_at(&self, b: &Backend, dir: &OwnedFd, name: &CStr, st: &libc::stat) -> Res<Attr> {
        if kind_of_mode(st.st_mode) == Kind::File {
            let (l, _, _) = self.layout_at(dir, name)?;
            return file_attr(b, st, &l);
        }
        Ok(attr_of_stat(st))
    }

    /// Attributes of `path` (lookup and getattr), with the caller's search permissions.
    /// A stat needs no permission on the object; the search permission of the lookup that
    /// reached it is the client kernel's (see the module docs).
    pub fn getattr(&self, b: &Backend, path: &str, _ctx: &Ctx) -> Res<Attr> {
        let (d, name) = self.parent(path)?;
        let st = nsfs::lstat(d.as_raw_fd(), &name).map_err(werr)?;
        self.attr_at(b, &d, &name, &st)
    }

    /// One page of the directory `path` from `cookie` (0 = start; else an entry's `next`),
    /// at most [`READDIR_PAGE_BYTES`] of names; `true` = the end was reached. `.` and `..`
    /// come as the file system lists them. Needs read permission on the directory.
    pub fn readdir(&self, path: &str, cookie: u64, ctx: &Ctx) -> Res<(Vec<DirEntry>, bool)> {
        let (d, name) = self.parent(path)?;
        let f = nsfs::openat(d.as_raw_fd(), &name, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW, 0)
            .map_err(werr)?;
        let g = caller(ctx);
        nsfs::access_fd(f.as_raw_fd(), libc::R_OK).map_err(werr)?;
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

    pub fn mkdir(&self, b: &Backend, path: &str, mode: u32, ctx: &Ctx) -> Res<Attr> {
        if validate_path(path)?.is_empty() {
            return Err(eno(errno::EEXIST, "namespace root"));
        }
        nsfs::private_umask();
        let (d, name) = self.parent(path)?;
        let g = caller(ctx);
        nsfs::mkdirat(d.as_raw_fd(), &name, mode & 0o7777).map_err(werr)?;
        drop(g);
        let st = nsfs::lstat(d.as_raw_fd(), &name).map_err(werr)?;
        self.attr_at(b, &d, &name, &st)
    }

    pub fn rmdir(&self, path: &str, ctx: &Ctx) -> Res<()> {
        if validate_path(path)?.is_empty() {
            return Err(eno(errno::EBUSY, "namespace root"));
        }
        let (d, name) = self.parent(path)?;
        let _g = caller(ctx);
        nsfs::unlinkat(d.as_raw_fd(), &name, libc::AT_REMOVEDIR).map_err(werr)
    }

    /// A symbolic link `path` → `target`.
    pub fn symlink(&self, b: &Backend, path: &str, target: &str, ctx: &Ctx) -> Res<Attr> {
        if validate_path(path)?.is_empty() {
            return Err(eno(errno::EEXIST, "namespace root"));
        }
        let target = nsfs::cstr(target).map_err(werr)?;
        let (d, name) = self.parent(path)?;
        let g = caller(ctx);
        nsfs::symlinkat(&target, d.as_raw_fd(), &name).map_err(werr)?;
        drop(g);
        let st = nsfs::lstat(d.as_raw_fd(), &name).map_err(werr)?;
        self.attr_at(b, &d, &name, &st)
    }

    /// Reading a symlink needs no permission on it (see [`Namespace::getattr`]).
    pub fn readlink(&self, path: &str, _ctx: &Ctx) -> Res<String> {
        let (d, name) = self.parent(path)?;
        let b = nsfs::readlinkat(d.as_raw_fd(), &name).map_err(werr)?;
        String::from_utf8(b).map_err(|_| eno(errno::EIO, "symlink target is not UTF-8"))
    }

    /// A hard link `to` of `from`: both names share the sidecar, hence the layout and data.
    pub fn link(&self, b: &Backend, from: &str, to: &str, ctx: &Ctx) -> Res<Attr> {
        if validate_path(to)?.is_empty() {
            return Err(eno(errno::EEXIST, "namespace root"));
        }
        let (a, an) = self.parent(from)?;
        let (d, dn) = self.parent(to)?;
        let g = caller(ctx);
        nsfs::linkat(a.as_raw_fd(), &an, d.as_raw_fd(), &dn, 0).map_err(werr)?;
        drop(g);
        let st = nsfs::lstat(d.as_raw_fd(), &dn).map_err(werr)?;
        self.attr_at(b, &d, &dn, &st)
    }

    /// A FIFO, socket or device node (the type bits of `mode`); a regular file gets a
    /// layout like [`Backend::create`] (and is not left open).
    pub fn mknod(&self, b: &Backend, path: &str, mode: u32, rdev: u64, ctx: &Ctx) -> Res<Attr> {
        if validate_path(path)?.is_empty() {
            return Err(eno(errno::EEXIST, "namespace root"));
        }
        if mode & libc::S_IFMT == libc::S_IFREG || mode & libc::S_IFMT == 0 {
            let (a, l, h) = self.create(b, path, mode & 0o7777, libc::O_CREAT | libc::O_EXCL, 0, ctx)?;
            self.release(b, &l, h)?;
            return Ok(a);
        }
        nsfs::private_umask();
        let (d, name) = self.parent(path)?;
        let g = caller(ctx);
        nsfs::mknodat(d.as_raw_fd(), &name, mode, rdev).map_err(werr)?;
        drop(g);
        let st = nsfs::lstat(d.as_raw_fd(), &name).map_err(werr)?;
        self.attr_at(b, &d, &name, &st)
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
    fn name_gone(&self, b: &Backend, l: &Layout, f: &File) {
        if nsfs::fstat(f.as_raw_fd()).map(|st| st.st_nlink == 0).unwrap_or(false) {
            b.drop_file(l);
        }
    }

    pub fn unlink(&self, b: &Backend, path: &str, ctx: &Ctx) -> Res<()> {
        if validate_path(path)?.is_empty() {
            return Err(eno(errno::EISDIR, "namespace root"));
        }
        let (d, name) = self.parent(path)?;
        let file = self.file_at(&d, &name);
        let g = caller(ctx);
        nsfs::unlinkat(d.as_raw_fd(), &name, 0).map_err(werr)?;
        drop(g);
        if let Some((l, f)) = file {
            self.name_gone(b, &l, &f);
        }
        Ok(())
    }

    pub fn rename(&self, b: &Backend, from: &str, to: &str, noreplace: bool, ctx: &Ctx) -> Res<()> {
        if validate_path(from)?.is_empty() || validate_path(to)?.is_empty() {
            return Err(eno(errno::EBUSY, "namespace root"));
        }
        let (a, an) = self.parent(from)?;
        let (d, dn) = self.parent(to)?;
        let replaced = self.file_at(&d, &dn);
        let flags = if noreplace { libc::RENAME_NOREPLACE } else { 0 };
        let g = caller(ctx);
        nsfs::renameat2(a.as_raw_fd(), &an, d.as_raw_fd(), &dn, flags).map_err(werr)?;
        drop(g);
        // The replaced file's data goes with its last name (not when both names were links
        // of one file: then rename does nothing).
        if let Some((l, f)) = replaced {
            self.name_gone(b, &l, &f);
        }
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
    /// rights. Each check is on the object itself, by its fd (see the module docs).
    pub fn setattr(&self, b: &Backend, path: &str, set: &SetAttr, by_fd: Option<u64>, ctx: &Ctx) -> Res<Attr> {
        let (d, name) = self.parent(path)?;
        let obj = nsfs::open_obj(d.as_raw_fd(), &name).map_err(werr)?;
        let obj = obj.as_raw_fd();
        let st = nsfs::fstat(obj).map_err(werr)?;
        let fmt = st.st_mode & libc::S_IFMT;
        let by_fd = match by_fd {
            // The sidecar is read as the daemon.
            Some(oid) if fmt == libc::S_IFREG => self.layout_at(&d, &name)?.0.oid == oid,
            _ => false,
        };
        let g = caller(ctx);
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
                nsfs::access_fd(obj, libc::W_OK).map_err(werr)?;
            }
        }
        // Only for a chown: chown(-1, -1) is not a no-op (it clears setuid, and a non-owner
        // gets EPERM on such a file).
        if set.uid.is_some() || set.gid.is_some() {
            nsfs::fchown_obj(obj, set.uid, set.gid).map_err(werr)?;
        }
        if let Some(mode) = set.mode.filter(|_| kill_mode.is_none()) {
            if fmt == libc::S_IFLNK {
                return Err(eno(libc::EOPNOTSUPP, "mode of a symbolic link"));
            }
            nsfs::fchmod_obj(obj, mode & 0o7777).map_err(werr)?;
        }
        drop(g);
        if let Some(mode) = kill_mode {
            nsfs::fchmod_obj(obj, mode).map_err(werr)?;
        }
        // A regular file's sidecar, share-locked and checked to still be the name's, so a
        // migration's switch does not happen between reading the layout and truncating it.
        let (layout, _held) = if fmt == libc::S_IFREG {
            let (l, f) = self.layout_locked(&d, &name)?;
            (Some(l), Some(f))
        } else {
            (None, None)
        };
        if let (Some(size), Some(l)) = (set.size, &layout) {
            b.data.truncate(b, l, size)?;
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
            let g = if by_fd && now_only { None } else { Some(caller(ctx)) };
            nsfs::utimens_obj(obj, &times).map_err(werr)?;
            drop(g);
            if let Some(l) = &layout {
                for (idx, ti) in b.placement.objects(&b.targets, l)? {
                    let q = nsfs::cstr(&b.targets[ti as usize].obj_path(l.oid, idx).to_string_lossy()).map_err(werr)?;
                    // A component placed but never written has no object yet.
                    match nsfs::utimensat(libc::AT_FDCWD, &q, &times) {
                        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(werr(e)),
                        _ => {}
                    }
                }
            }
        }
        let st = nsfs::lstat(d.as_raw_fd(), &name).map_err(werr)?;
        self.attr_at(b, &d, &name, &st)
    }

    /// Clears setuid, and setgid as Linux does ([`killed_by_write`]), of the regular file
    /// `path` when it still holds `l`'s object and open `h` is recorded: the side effect of
    /// a write by `ctx` without `CAP_FSETID` (see `Op::KillSuidgid`). Done as the daemon, as
    /// the local kernel does it for any writer (the writer need not own the file).
    pub fn kill_suidgid(&self, b: &Backend, path: &str, l: &Layout, h: OpenHandle, ctx: &Ctx) -> Res<()> {
        b.check_layout(l)?;
        if !super::layout::is_local_oid(l.oid) && !b.opens.marker_path(l.oid, h).exists() {
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

mod files;
mod holder;
mod inplace;
mod plus;
mod swap;
pub use swap::SwapRefused;
#[cfg(test)]
mod tests;
