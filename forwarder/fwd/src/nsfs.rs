//! System calls of the namespace (MDT) side of POSIX, relative to directory fds (`*at`), and
//! the caller's credentials on a worker thread.
//!
//! * Every name is resolved from the namespace root's fd: the MDT's own location adds nothing
//!   to `PATH_MAX` and needs no search permission on its ancestors, and no symlink is followed
//!   on the way (`openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`), so a request never
//!   leaves the namespace.
//! * [`Caller`] switches the thread's file-system uid and gid (`setfsuid`/`setfsgid`, per
//!   thread) and its supplementary groups (the raw `setgroups` system call, which is per
//!   thread; glibc's wrapper would change every thread) to the caller's, so the kernel of
//!   the forwarding node applies POSIX's permission rules (search and write permission on
//!   the directory of a name operation, sticky directories, open access modes,
//!   chown/chmod/utimensat rules, setgid inheritance and clearing) the way a network file
//!   system's server does. The directories on the way are resolved as the daemon, and an
//!   object's own checks are made by its `O_PATH` fd ([`open_obj`]): search permission on
//!   the way is checked by the client's kernel, on the components the process walks. A non-zero fsuid drops the file-system
//!   capabilities (`CAP_CHOWN`, `CAP_DAC_OVERRIDE`, `CAP_FOWNER`, `CAP_FSETID`, `CAP_MKNOD`)
//!   for that thread only; they come back when the guard restores fsuid 0. Only a daemon
//!   running as root switches (otherwise the daemon's own credentials apply).
//! * Threads that create names for callers have a private umask of 0 ([`private_umask`]):
//!   the client already applied the caller's umask to the mode it sends.
use std::cell::Cell;
use std::ffi::{CStr, CString};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::OnceLock;

/// `-1` → the last OS error.
pub fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

pub fn cstr(s: &str) -> io::Result<CString> {
    CString::new(s).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn cpath(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_encoded_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// An `O_PATH` directory fd.
pub fn open_dir(p: &Path) -> io::Result<OwnedFd> {
    let c = cpath(p)?;
    let fd = cvt(unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) })?;
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

const RESOLVE_NO_SYMLINKS: u64 = 0x04;
const RESOLVE_BENEATH: u64 = 0x08;

/// The directory `rel` below `root` (`O_PATH`), following no symlink and never leaving `root`.
pub fn open_beneath(root: RawFd, rel: &CStr) -> io::Result<OwnedFd> {
    // struct open_how of openat2(2): flags, mode, resolve.
    let how: [u64; 3] =
        [(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) as u64, 0, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS];
    let fd = unsafe { libc::syscall(libc::SYS_openat2, root, rel.as_ptr(), how.as_ptr(), size_of_val(&how)) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

pub fn lstat(dir: RawFd, name: &CStr) -> io::Result<libc::stat> {
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    cvt(unsafe { libc::fstatat(dir, name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) })?;
    Ok(st)
}

pub fn fstat(fd: RawFd) -> io::Result<libc::stat> {
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    cvt(unsafe { libc::fstat(fd, &mut st) })?;
    Ok(st)
}

pub fn openat(dir: RawFd, name: &CStr, flags: libc::c_int, mode: u32) -> io::Result<File> {
    let fd = cvt(unsafe { libc::openat(dir, name.as_ptr(), flags | libc::O_CLOEXEC, mode as libc::c_uint) })?;
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// `flock(fd, op)` (`LOCK_SH`, `LOCK_EX`, `LOCK_UN`), retried on `EINTR`.
pub fn flock(fd: RawFd, op: libc::c_int) -> io::Result<()> {
    loop {
        match cvt(unsafe { libc::flock(fd, op) }) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            r => return r.map(drop),
        }
    }
}

/// The object `name` of `dir` itself (`O_PATH | O_NOFOLLOW`: a symlink is not followed), for
/// the calls below that act on it by fd.
pub fn open_obj(dir: RawFd, name: &CStr) -> io::Result<OwnedFd> {
    let fd = cvt(unsafe { libc::openat(dir, name.as_ptr(), libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC) })?;
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `faccessat2(fd, "", .., AT_EACCESS | AT_EMPTY_PATH)`: the access check of the object of
/// fd (an [`open_obj`]) with the thread's file-system credentials; no lookup, so no search
/// permission on its directory is needed.
pub fn access_fd(fd: RawFd, mode: libc::c_int) -> io::Result<()> {
    let r =
        unsafe { libc::syscall(libc::SYS_faccessat2, fd, c"".as_ptr(), mode, libc::AT_EACCESS | libc::AT_EMPTY_PATH) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `/proc/self/fd/<fd>`: the object of an [`open_obj`] fd for the calls that take no
/// `AT_EMPTY_PATH` (the magic link lands on the object itself, a symlink included, and a
/// process may always resolve its own fds).
fn fd_path(fd: RawFd) -> io::Result<CString> {
    cstr(&format!("/proc/self/fd/{fd}"))
}

/// chmod of the object of an [`open_obj`] fd.
pub fn fchmod_obj(fd: RawFd, mode: u32) -> io::Result<()> {
    let p = fd_path(fd)?;
    cvt(unsafe { libc::chmod(p.as_ptr(), mode as libc::mode_t) }).map(drop)
}

/// chown of the object of an [`open_obj`] fd (a symlink itself, as `lchown`).
pub fn fchown_obj(fd: RawFd, uid: Option<u32>, gid: Option<u32>) -> io::Result<()> {
    let (u, g) = (uid.unwrap_or(u32::MAX), gid.unwrap_or(u32::MAX));
    cvt(unsafe { libc::fchownat(fd, c"".as_ptr(), u, g, libc::AT_EMPTY_PATH) }).map(drop)
}

/// utimensat of the object of an [`open_obj`] fd (a symlink itself).
pub fn utimens_obj(fd: RawFd, times: &[libc::timespec; 2]) -> io::Result<()> {
    let p = fd_path(fd)?;
    cvt(unsafe { libc::utimensat(libc::AT_FDCWD, p.as_ptr(), times.as_ptr(), 0) }).map(drop)
}

pub fn mkdirat(dir: RawFd, name: &CStr, mode: u32) -> io::Result<()> {
    cvt(unsafe { libc::mkdirat(dir, name.as_ptr(), mode as libc::mode_t) }).map(drop)
}

pub fn unlinkat(dir: RawFd, name: &CStr, flags: libc::c_int) -> io::Result<()> {
    cvt(unsafe { libc::unlinkat(dir, name.as_ptr(), flags) }).map(drop)
}

pub fn renameat2(a: RawFd, an: &CStr, b: RawFd, bn: &CStr, flags: libc::c_uint) -> io::Result<()> {
    cvt(unsafe { libc::renameat2(a, an.as_ptr(), b, bn.as_ptr(), flags) }).map(drop)
}

pub fn linkat(a: RawFd, an: &CStr, b: RawFd, bn: &CStr, flags: libc::c_int) -> io::Result<()> {
    cvt(unsafe { libc::linkat(a, an.as_ptr(), b, bn.as_ptr(), flags) }).map(drop)
}

/// Gives the unnamed file `f` (`O_TMPFILE`) the name `name` in `dir`: by the file itself
/// (`AT_EMPTY_PATH`: needs `CAP_DAC_READ_SEARCH`, which a root caller's credentials keep, or,
/// since Linux 6.10, the opener's credentials), else, refused with `ENOENT`, by its
/// `/proc/self/fd` link (no capability needed; a path walk through procfs more).
pub fn link_tmpfile(f: &File, dir: RawFd, name: &CStr) -> io::Result<()> {
    match linkat(f.as_raw_fd(), c"", dir, name, libc::AT_EMPTY_PATH) {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
            let proc = cstr(&format!("/proc/self/fd/{}", f.as_raw_fd()))?;
            linkat(libc::AT_FDCWD, &proc, dir, name, libc::AT_SYMLINK_FOLLOW)
        }
        r => r,
    }
}

pub fn symlinkat(target: &CStr, dir: RawFd, name: &CStr) -> io::Result<()> {
    cvt(unsafe { libc::symlinkat(target.as_ptr(), dir, name.as_ptr()) }).map(drop)
}

pub fn readlinkat(dir: RawFd, name: &CStr) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
    let n = unsafe { libc::readlinkat(dir, name.as_ptr(), buf.as_mut_ptr() as *mut libc::c_char, buf.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(buf)
}

pub fn mknodat(dir: RawFd, name: &CStr, mode: u32, rdev: u64) -> io::Result<()> {
    cvt(unsafe { libc::mknodat(dir, name.as_ptr(), mode as libc::mode_t, rdev as libc::dev_t) }).map(drop)
}

pub fn fchmodat(dir: RawFd, name: &CStr, mode: u32) -> io::Result<()> {
    cvt(unsafe { libc::fchmodat(dir, name.as_ptr(), mode as libc::mode_t, 0) }).map(drop)
}

pub fn utimensat(dir: RawFd, name: &CStr, times: &[libc::timespec; 2]) -> io::Result<()> {
    cvt(unsafe { libc::utimensat(dir, name.as_ptr(), times.as_ptr(), libc::AT_SYMLINK_NOFOLLOW) }).map(drop)
}

fn daemon_is_root() -> bool {
    static ROOT: OnceLock<bool> = OnceLock::new();
    *ROOT.get_or_init(|| unsafe { libc::geteuid() } == 0)
}

/// The daemon's own gid (restored after a caller's).
fn daemon_gid() -> u32 {
    static GID: OnceLock<u32> = OnceLock::new();
    *GID.get_or_init(|| unsafe { libc::getegid() })
}

thread_local! {
    static UMASK_PRIVATE: Cell<bool> = const { Cell::new(false) };
    /// The thread's credentials are the daemon's with no supplementary group (a [`Caller`]
    /// restored them): a caller with exactly those needs no switch.
    static DAEMON_CREDS: Cell<bool> = const { Cell::new(false) };
}

/// Gives the calling thread its own umask of 0 (`unshare(CLONE_FS)`; once per thread): modes
/// of names created for callers are the ones the client sent (its caller's umask applied).
pub fn private_umask() {
    UMASK_PRIVATE.with(|done| {
        if !done.get() {
            if unsafe { libc::unshare(libc::CLONE_FS) } == 0 {
                unsafe { libc::umask(0) };
            } else {
                log::warn!("unshare(CLONE_FS): {}; modes keep the daemon's umask", io::Error::last_os_error());
            }
            done.set(true);
        }
    });
}

/// While alive, the thread's file-system credentials are the caller's (see the module docs).
pub struct Caller {
    active: bool,
}

impl Caller {
    /// Switches to `uid`, `gid` and `groups` (nothing to do when the daemon is not root, or
    /// when they are the daemon's own: root, its gid, no group; six system calls saved).
    pub fn assume(uid: u32, gid: u32, groups: &[u32]) -> Caller {
        if !daemon_is_root() {
            return Caller { active: false };
        }
        if uid == 0 && groups.is_empty() && gid == daemon_gid() && DAEMON_CREDS.get() {
            return Caller { active: false };
        }
        daemon_gid();
        // Groups and fsgid first, while fsuid 0 still holds the capabilities.
        let groups = &groups[..groups.len().min(65536)];
        unsafe {
            libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr());
            libc::setfsgid(gid);
            libc::setfsuid(uid);
        }
        Caller { active: true }
    }
}

impl Drop for Caller {
    fn drop(&mut self) {
        if self.active {
            unsafe {
                libc::setfsuid(0);
                libc::setfsgid(daemon_gid());
                libc::syscall(libc::SYS_setgroups, 0usize, std::ptr::null::<libc::gid_t>());
            }
            DAEMON_CREDS.set(true);
        }
    }
}
