//! The protocol's data types, what requests ([`crate::Op`]) and replies ([`crate::Body`]) are
//! made of: the caller's context, layouts and the capabilities that grant them, open handles,
//! file attributes and directory entries, errors and their errno numbers. They travel in a
//! frame's bincode header ([`crate::encode`]): fixed-width little-endian integers, fields in
//! declaration order, enum variants by index (new variants are appended, never inserted).
use serde::{Deserialize, Serialize};

/// Linux errno values used by the protocol (same numbers as `libc`).
pub mod errno {
    /// Operation not permitted (not the owner, or a privileged change).
    pub const EPERM: i32 = 1;
    /// No such file or directory.
    pub const ENOENT: i32 = 2;
    /// I/O error (a storage target failed, or an unexpected reply).
    pub const EIO: i32 = 5;
    /// Resource busy (the namespace root; a daemon at its connection limit).
    pub const EBUSY: i32 = 16;
    /// Bad file handle (not open, or opened without the access asked).
    pub const EBADF: i32 = 9;
    /// Permission denied (permission bits, a refused capability or handshake).
    pub const EACCES: i32 = 13;
    /// File exists.
    pub const EEXIST: i32 = 17;
    /// Cross-device link.
    pub const EXDEV: i32 = 18;
    /// A path component is not a directory.
    pub const ENOTDIR: i32 = 20;
    /// Is a directory.
    pub const EISDIR: i32 = 21;
    /// Invalid argument (e.g. a malformed path, see [`crate::validate_path`]).
    pub const EINVAL: i32 = 22;
    /// File too large.
    pub const EFBIG: i32 = 27;
    /// No space left on a storage target.
    pub const ENOSPC: i32 = 28;
    /// A name longer than 255 bytes or a path longer than [`crate::MAX_PATH`].
    pub const ENAMETOOLONG: i32 = 36;
    /// Operation not supported (e.g. the shared-memory data path switched off).
    pub const ENOSYS: i32 = 38;
    /// Too many symbolic links.
    pub const ELOOP: i32 = 40;
    /// Read-only file system.
    pub const EROFS: i32 = 30;
    /// Directory not empty.
    pub const ENOTEMPTY: i32 = 39;
    /// Protocol error (an undecodable or malformed frame).
    pub const EPROTO: i32 = 71;
    /// Frame longer than [`crate::MAX_FRAME`].
    pub const EMSGSIZE: i32 = 90;
    /// Timed out.
    pub const ETIMEDOUT: i32 = 110;
}

/// Who asked: travels with every request and ends in the forwarder's IoRecord.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
pub struct Ctx {
    /// Job id ("" when none is known).
    pub job_id: String,
    /// MPI rank, -1 when unknown.
    pub rank: i32,
    /// Process id of the caller (on its compute node).
    pub pid: u32,
    /// File-system uid and gid of the caller (FUSE's request credentials).
    pub uid: u32,
    /// File-system gid of the caller.
    pub gid: u32,
    /// Name of the compute node that sent the request.
    pub compute_node: String,
    /// Supplementary groups of the caller (for the daemon's permission checks).
    pub groups: Vec<u32>,
}

/// Where a file's data lives.
///
/// * Classic (`component_size == 0`): object `oid` striped round-robin over `targets`
///   (target indexes of the backend) in units of `stripe_size` bytes. One target = no
///   striping.
/// * Progressive (`component_size > 0`, Lustre-PFL-like): byte range
///   `[k*component_size, (k+1)*component_size)` is component `k`, one object on one target
///   chosen among the candidates `targets` when the file is first written there
///   (performance-aware, Sunway lessons §5); the daemon records the choice in its namespace.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct Layout {
    /// Object id: the file's data objects are named by it on the targets.
    pub oid: u64,
    /// Stripe unit, bytes (classic layouts).
    pub stripe_size: u64,
    /// Classic: the targets striped over. Progressive: the candidate targets of components.
    pub targets: Vec<u32>,
    /// Component size, bytes; 0 = classic layout.
    pub component_size: u64,
    /// Progressive: planned performance of each candidate in `targets`, MB/s (10^6 B/s);
    /// 0, or an empty list, = the target's token-bucket limit when the component is placed.
    pub perf: Vec<f64>,
}

impl Layout {
    /// A classic layout: `oid` striped over `targets` in units of `stripe_size` bytes.
    pub fn striped(oid: u64, stripe_size: u64, targets: Vec<u32>) -> Layout {
        Layout { oid, stripe_size, targets, ..Default::default() }
    }

    /// True for a progressive layout (components placed at first write).
    pub fn is_progressive(&self) -> bool {
        self.component_size > 0
    }
}

/// A capability: what the daemon granted at open/create, signed with the site's capability
/// key ([`crate::auth::SiteKey::sign`]). The client keeps it per open file and sends it with every
/// data operation; the daemon acts only on a capability whose MAC verifies, and only within
/// its rights. Any daemon of the site verifies it (failover).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Cap {
    /// The file's data objects.
    pub layout: Layout,
    /// The open this capability belongs to (released with it).
    pub handle: OpenHandle,
    /// [`Cap::READ`] | [`Cap::WRITE`]: the open's access mode.
    pub rights: u8,
    /// HMAC-SHA256 of the fields above with the capability key.
    pub mac: [u8; 32],
}

impl Cap {
    /// Right to read the file's data.
    pub const READ: u8 = 1;
    /// Right to write the file's data (and truncate it through the open).
    pub const WRITE: u8 = 2;

    /// The rights of an open with open(2) `flags` (its access mode).
    pub fn rights_of(flags: i32) -> u8 {
        match flags & libc::O_ACCMODE {
            libc::O_WRONLY => Cap::WRITE,
            libc::O_RDWR => Cap::READ | Cap::WRITE,
            _ => Cap::READ,
        }
    }

    /// True when the capability holds all of `rights` ([`Cap::READ`], [`Cap::WRITE`]).
    pub fn may(&self, rights: u8) -> bool {
        self.rights & rights == rights
    }
}

/// A point in time: seconds and nanoseconds since the Unix epoch (UTC).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Time {
    /// Seconds since the epoch (negative before it).
    pub sec: i64,
    /// Nanoseconds within the second, `0..1_000_000_000`.
    pub nsec: u32,
}

/// File kind of an [`Attr`] or [`DirEntry`].
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    Fifo,
    Socket,
    CharDev,
    BlockDev,
    Other,
}

/// Attributes of a file, as stat(2) gives them.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Attr {
    /// Inode number in the namespace (the same on every daemon of the namespace).
    pub ino: u64,
    /// File kind.
    pub kind: Kind,
    /// Permission bits (07777).
    pub perm: u32,
    /// Hard links.
    pub nlink: u32,
    /// Owner uid.
    pub uid: u32,
    /// Owner gid.
    pub gid: u32,
    /// Size, bytes.
    pub size: u64,
    /// 512-byte blocks allocated.
    pub blocks: u64,
    /// Device number of a character or block device (0 otherwise).
    pub rdev: u64,
    /// Last access.
    pub atime: Time,
    /// Last data change.
    pub mtime: Time,
    /// Last status change.
    pub ctime: Time,
}

/// One entry of a directory listing ([`crate::Op::Readdir`]).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct DirEntry {
    /// The entry's name (one component; `.` and `..` included).
    pub name: String,
    /// Its inode number.
    pub ino: u64,
    /// Its kind.
    pub kind: Kind,
    /// Cookie of the position after this entry (a Readdir from it continues there).
    pub next: u64,
}

/// Bytes of entry names per Readdir reply (a page); a directory of any size is listed in
/// pages far below [`crate::MAX_FRAME`].
pub const READDIR_PAGE_BYTES: usize = 256 << 10;

/// File-system statistics, as statfs(2) gives them.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct StatFs {
    /// Size, in `frsize` units.
    pub blocks: u64,
    /// Free blocks.
    pub bfree: u64,
    /// Free blocks available to unprivileged users.
    pub bavail: u64,
    /// Inodes.
    pub files: u64,
    /// Free inodes.
    pub ffree: u64,
    /// Preferred I/O size, bytes.
    pub bsize: u32,
    /// Longest name, bytes.
    pub namelen: u32,
    /// Fragment size (the unit of `blocks`), bytes.
    pub frsize: u32,
}

/// Changes of a setattr; `None` = leave as is.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct SetAttr {
    /// New permission bits (chmod).
    pub mode: Option<u32>,
    /// New owner uid (chown).
    pub uid: Option<u32>,
    /// New owner gid (chown).
    pub gid: Option<u32>,
    /// New size, bytes (truncate).
    pub size: Option<u64>,
    /// New access time; `Some(None)` = now.
    pub atime: Option<Option<Time>>,
    /// New modification time; `Some(None)` = now.
    pub mtime: Option<Option<Time>>,
}

/// A failed operation: an errno ([`errno`]) for the caller and a message for logs.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct WireError {
    /// Linux errno number, returned to the application by the mount.
    pub errno: i32,
    /// What failed, for logs (not shown to the application).
    pub msg: String,
}

/// One open of a file, as the daemon that served the open recorded it: `daemon` is that
/// daemon instance's id, `id` the open's. The release names it so that any daemon can drop
/// the open (an unlinked file's data lives until its last open is released).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct OpenHandle {
    /// Instance id of the daemon that served the open.
    pub daemon: u64,
    /// The open's id within that daemon instance.
    pub id: u64,
}
