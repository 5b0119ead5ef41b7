//! Wire protocol between `pharos-mount` (compute node) and `pharos-fwd` (forwarding node).
//!
//! A connection carries frames in both directions. A frame (version 5) is
//!
//! ```text
//! [u32 LE length L][u8 version][u32 LE header length H][H bytes of bincode header][L-5-H bytes of raw data]
//! ```
//!
//! where `L` counts everything after the length prefix and must be in `5..=MAX_FRAME`
//! (1..=MAX_FRAME is accepted by the length check; shorter frames are decode errors). The
//! header is a bincode [`Request`] or [`Reply`]; the raw data segment carries the bytes of
//! a write request ([`Op::Write`]'s `data`) or of a read reply ([`Body::Data`]) and is
//! empty for every other message. Data never goes through serde: it is read straight into
//! the destination buffer and written from the source buffer with one vectored write.
//!
//! A connection starts with the handshake of [`auth`]: the daemon sends a [`Body::Challenge`]
//! (reply id 0), the client answers [`Op::Auth`], the daemon [`Body::Authed`]. Any other first
//! request, a wrong proof or a bad frame before it gets an `EACCES` (or `EPROTO`) error reply
//! and the connection is closed. Then the client sends requests, the daemon answers each with
//! one [`Reply`] carrying the same `id`. Data operations carry the [`Cap`] the daemon issued
//! at open/create, never a layout of the client's making. A frame with another version, an undecodable header, a header length beyond the
//! frame, or a data segment on a message that takes none gets a [`Reply`] with `id = 0` and
//! `EPROTO`; `L > MAX_FRAME` gets `EMSGSIZE`. After an oversized or truncated frame the
//! daemon closes the connection because it cannot find the next frame boundary; the other
//! errors leave the stream at a frame boundary. Decoding never allocates more than the
//! frame length (bincode limit), and a frame announcing a large data segment costs memory
//! only as its bytes arrive (beyond [`PREALLOC_MAX`]).
//!
//! Version history: 1 = whole message bincode (data as a byte field); 2 = header + raw
//! data segment, open handles in `Opened`/`Release` (unlink of open files, see the daemon);
//! 3 = progressive layouts ([`Layout::component_size`], [`Layout::perf`]) and the open
//! handle in `Write` (the daemon counts the component each open is writing); 4 = POSIX
//! namespace: the caller's supplementary groups in [`Ctx`] (the daemon checks permissions
//! with the caller's credentials), symlinks, hard links, special files ([`Kind`], `rdev`),
//! open flags, `Setattr` through an open file, and Readdir paginated by cookie; later
//! (appended, earlier messages unchanged) `KillSuidgid`, the setuid/setgid clearing of a
//! write by a caller without `CAP_FSETID`; 5 = authentication (issue 14, item 3): the
//! handshake ([`Op::Auth`], [`Body::Challenge`], [`Body::Authed`]) and capabilities
//! ([`Cap`] in [`Body::Opened`], and instead of the layout and open handle in Read, Write,
//! Fsync, Release, KillSuidgid and in a Setattr through an open file).
//!
//! Paths are relative to the namespace root, `/`-separated; a leading `/` is allowed and
//! means the namespace root. [`validate_path`] is what the daemon applies.
use std::io::{self, IoSlice, Read, Write};

use bincode::Options;
use serde::{Deserialize, Serialize};

pub mod auth;
pub mod region;

/// Protocol version carried in every frame.
pub const VERSION: u8 = 5;
/// Largest frame (version byte + payload), bytes: 8 MiB + 64 KiB of header room.
pub const MAX_FRAME: usize = (8 << 20) + (64 << 10);
/// Largest data payload of one read or write request, bytes.
pub const MAX_IO: usize = 8 << 20;

/// Linux errno values used by the protocol (same numbers as `libc`).
pub mod errno {
    pub const EPERM: i32 = 1;
    pub const ENOENT: i32 = 2;
    pub const EIO: i32 = 5;
    pub const EBUSY: i32 = 16;
    pub const EBADF: i32 = 9;
    pub const EACCES: i32 = 13;
    pub const EEXIST: i32 = 17;
    pub const EXDEV: i32 = 18;
    pub const ENOTDIR: i32 = 20;
    pub const EISDIR: i32 = 21;
    pub const EINVAL: i32 = 22;
    pub const EFBIG: i32 = 27;
    pub const ENOSPC: i32 = 28;
    pub const ENAMETOOLONG: i32 = 36;
    pub const ENOSYS: i32 = 38;
    pub const ELOOP: i32 = 40;
    pub const EROFS: i32 = 30;
    pub const ENOTEMPTY: i32 = 39;
    pub const EPROTO: i32 = 71;
    pub const EMSGSIZE: i32 = 90;
    pub const ETIMEDOUT: i32 = 110;
}

/// Who asked: travels with every request and ends in the forwarder's IoRecord.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
pub struct Ctx {
    /// Job id ("" when none is known).
    pub job_id: String,
    /// MPI rank, -1 when unknown.
    pub rank: i32,
    pub pid: u32,
    /// File-system uid and gid of the caller (FUSE's request credentials).
    pub uid: u32,
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
/// key ([`auth::SiteKey::sign`]). The client keeps it per open file and sends it with every
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
    pub const READ: u8 = 1;
    pub const WRITE: u8 = 2;

    /// The rights of an open with open(2) `flags` (its access mode).
    pub fn rights_of(flags: i32) -> u8 {
        match flags & libc::O_ACCMODE {
            libc::O_WRONLY => Cap::WRITE,
            libc::O_RDWR => Cap::READ | Cap::WRITE,
            _ => Cap::READ,
        }
    }

    pub fn may(&self, rights: u8) -> bool {
        self.rights & rights == rights
    }
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Time {
    pub sec: i64,
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

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Attr {
    pub ino: u64,
    pub kind: Kind,
    /// Permission bits (07777).
    pub perm: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    /// 512-byte blocks allocated.
    pub blocks: u64,
    /// Device number of a character or block device (0 otherwise).
    pub rdev: u64,
    pub atime: Time,
    pub mtime: Time,
    pub ctime: Time,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct DirEntry {
    pub name: String,
    pub ino: u64,
    pub kind: Kind,
    /// Cookie of the position after this entry (a Readdir from it continues there).
    pub next: u64,
}

/// Bytes of entry names per Readdir reply (a page); a directory of any size is listed in
/// pages far below [`MAX_FRAME`].
pub const READDIR_PAGE_BYTES: usize = 256 << 10;

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct StatFs {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
    pub frsize: u32,
}

/// Changes of a setattr; `None` = leave as is.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    /// `Some(None)` = now.
    pub atime: Option<Option<Time>>,
    pub mtime: Option<Option<Time>>,
}

/// One operation. Read and write address the data objects through the capability the client
/// got at open (layout, open handle, rights), so they survive renames and never touch the
/// namespace.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub enum Op {
    Ping,
    Lookup {
        path: String,
    },
    Getattr {
        path: String,
    },
    /// `fd`: through an open file, with its capability (ftruncate: a write capability for
    /// the file at `path` needs no write permission; otherwise the caller's rights apply).
    Setattr {
        path: String,
        set: SetAttr,
        fd: Option<Cap>,
    },
    /// One page of the directory's entries from `cookie` (0 = the start; else an entry's
    /// `next`). The cookies are the namespace file system's directory offsets, so every
    /// daemon on the same namespace continues a listing the same way.
    Readdir {
        path: String,
        cookie: u64,
    },
    Mkdir {
        path: String,
        mode: u32,
    },
    Rmdir {
        path: String,
    },
    Unlink {
        path: String,
    },
    Rename {
        from: String,
        to: String,
        noreplace: bool,
    },
    /// Create a regular file. `token` makes a replay of the same create idempotent.
    Create {
        path: String,
        mode: u32,
        /// open(2) flags (`O_EXCL`: fail with EEXIST when it exists; the access mode checks
        /// an existing file's permissions when not exclusive).
        flags: i32,
        token: u64,
    },
    /// Opens an existing file; `flags` are open(2)'s (access mode, `O_TRUNC`, ...).
    Open {
        path: String,
        flags: i32,
    },
    /// Closes the open of `cap` (returned by create/open).
    Release {
        path: String,
        cap: Cap,
    },
    /// Needs [`Cap::READ`].
    Read {
        path: String,
        cap: Cap,
        offset: u64,
        size: u32,
    },
    /// Needs [`Cap::WRITE`]. The capability's open handle is the open the write comes
    /// through: the daemon counts, per open, the component it is writing (progressive layouts).
    Write {
        path: String,
        cap: Cap,
        offset: u64,
        /// Travels as the frame's raw data segment, not in the bincode header.
        #[serde(skip)]
        data: Vec<u8>,
    },
    Fsync {
        path: String,
        cap: Cap,
        datasync: bool,
    },
    Statfs,
    // v4 (at the end: earlier variants keep their indexes on the wire)
    /// A symbolic link at `path` pointing to `target`.
    Symlink {
        path: String,
        target: String,
    },
    Readlink {
        path: String,
    },
    /// A hard link `to` of the file `from`.
    Link {
        from: String,
        to: String,
    },
    /// A special file (FIFO, socket, character or block device): `mode` holds the type bits.
    Mknod {
        path: String,
        mode: u32,
        rdev: u64,
    },
    /// The side effect of a write by a caller without `CAP_FSETID` (the client's kernel
    /// flags such writes): clear the setuid bit, and the setgid bit when group-execute is
    /// set or the caller is not in the file's group, of the regular file at `path` if it
    /// still holds the capability's object and its open is recorded. Done by the daemon as
    /// the local kernel does it (not a chmod of the caller's); the client sends it once per
    /// open handle, before the first such write, only when the file had either bit. Needs
    /// [`Cap::WRITE`].
    KillSuidgid {
        path: String,
        cap: Cap,
    },
    // v5
    /// The client's half of the handshake ([`auth`]): its nonce and
    /// `HMAC(k_conn, "client" | daemon's nonce | nonce)`. Only as a connection's first request.
    Auth {
        nonce: [u8; 32],
        proof: [u8; 32],
    },
    // v5, later (appended): the shared-memory data path (issue 12, item 1)
    /// Attach this connection to the client's shared-memory data region, when client and
    /// daemon share a host: a sealed memfd (`F_SEAL_SHRINK | F_SEAL_GROW`, so the daemon's
    /// mapping can never fault with SIGBUS) of `size` bytes, fd `fd` of process `pid`,
    /// opened by the daemon through `/proc/<pid>/fd/<fd>`; its first 32 bytes hold `nonce`
    /// (proof that the region is the one this client means, and that it is on this host).
    /// Answer `Ok`, or an error (then the client sends its data on the connection).
    ShmAttach {
        pid: u32,
        fd: i32,
        size: u64,
        nonce: [u8; 32],
    },
    /// [`Op::Write`] whose `len` data bytes are at `slot` (a byte offset) of the attached
    /// region instead of the frame: the daemon writes them to the objects from there.
    WriteShm {
        path: String,
        cap: Cap,
        offset: u64,
        slot: u64,
        len: u32,
    },
    /// [`Op::Read`] whose data the daemon reads into the attached region at `slot` (a byte
    /// offset, room for `size` bytes); the reply is [`Body::ShmData`].
    ReadShm {
        path: String,
        cap: Cap,
        offset: u64,
        size: u32,
        slot: u64,
    },
}

impl Op {
    /// A short name for logs and records.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Ping => "ping",
            Op::Lookup { .. } => "lookup",
            Op::Getattr { .. } => "getattr",
            Op::Setattr { .. } => "setattr",
            Op::Readdir { .. } => "readdir",
            Op::Mkdir { .. } => "mkdir",
            Op::Rmdir { .. } => "rmdir",
            Op::Unlink { .. } => "unlink",
            Op::Rename { .. } => "rename",
            Op::Create { .. } => "create",
            Op::Open { .. } => "open",
            Op::Release { .. } => "release",
            Op::Read { .. } => "read",
            Op::Write { .. } => "write",
            Op::Fsync { .. } => "fsync",
            Op::Statfs => "statfs",
            Op::Symlink { .. } => "symlink",
            Op::Readlink { .. } => "readlink",
            Op::Link { .. } => "link",
            Op::Mknod { .. } => "mknod",
            Op::KillSuidgid { .. } => "kill_suidgid",
            Op::Auth { .. } => "auth",
            Op::ShmAttach { .. } => "shm_attach",
            Op::WriteShm { .. } => "write",
            Op::ReadShm { .. } => "read",
        }
    }

    /// True when executing the request twice has the effect of executing it once, so a
    /// client may replay it on another forwarding node after a failure.
    /// Create is idempotent through its token.
    pub fn idempotent(&self) -> bool {
        !matches!(
            self,
            Op::Mkdir { .. }
                | Op::Rmdir { .. }
                | Op::Unlink { .. }
                | Op::Rename { .. }
                | Op::Symlink { .. }
                | Op::Link { .. }
                | Op::Mknod { .. }
        )
    }
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Request {
    /// Chosen by the client, echoed in the reply. 0 is reserved for replies to frames the
    /// daemon could not decode.
    pub id: u64,
    pub ctx: Ctx,
    pub op: Op,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct WireError {
    pub errno: i32,
    pub msg: String,
}

/// One open of a file, as the daemon that served the open recorded it: `daemon` is that
/// daemon instance's id, `id` the open's. The release names it so that any daemon can drop
/// the open (an unlinked file's data lives until its last open is released).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct OpenHandle {
    pub daemon: u64,
    pub id: u64,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub enum Body {
    Ok,
    Attr(Attr),
    /// A page of a directory: `eof` = no entry after the last one.
    Entries {
        entries: Vec<DirEntry>,
        eof: bool,
    },
    /// An open or create: the file's attributes and the capability of this open.
    Opened {
        attr: Attr,
        cap: Cap,
    },
    /// Read data: travels as the frame's raw data segment, not in the bincode header.
    Data {
        #[serde(skip)]
        data: Vec<u8>,
    },
    Written(u32),
    Statfs(StatFs),
    /// A symbolic link's target (v4).
    Link(String),
    /// v5: the daemon's first frame on a connection (reply id 0): its handshake nonce.
    Challenge {
        nonce: [u8; 32],
    },
    /// v5: the answer to [`Op::Auth`]: `HMAC(k_conn, "server" | daemon's nonce | client's nonce)`.
    Authed {
        proof: [u8; 32],
    },
    /// The answer to [`Op::ReadShm`]: `len` bytes were read into the request's slot.
    ShmData {
        len: u32,
    },
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Reply {
    pub id: u64,
    pub body: Result<Body, WireError>,
}

impl Reply {
    pub fn err(id: u64, errno: i32, msg: impl Into<String>) -> Reply {
        Reply { id, body: Err(WireError { errno, msg: msg.into() }) }
    }
}

/// Error of reading a frame.
#[derive(Debug)]
pub enum FrameError {
    /// The connection ended cleanly before a frame started.
    Eof,
    /// The connection ended inside a frame (`got` of `want` bytes).
    Truncated {
        got: usize,
        want: usize,
    },
    /// The length prefix exceeds [`MAX_FRAME`] or is 0.
    BadLength(u64),
    /// Another protocol version.
    Version(u8),
    /// The payload does not decode.
    Decode(String),
    Io(io::Error),
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::Eof => f.write_str("connection closed"),
            FrameError::Truncated { got, want } => write!(f, "truncated frame: {got} of {want} bytes"),
            FrameError::BadLength(n) => write!(f, "frame length {n} outside 1..={MAX_FRAME}"),
            FrameError::Version(v) => write!(f, "protocol version {v}, expected {VERSION}"),
            FrameError::Decode(e) => write!(f, "undecodable payload: {e}"),
            FrameError::Io(e) => write!(f, "i/o: {e}"),
        }
    }
}
impl std::error::Error for FrameError {}

impl FrameError {
    /// The errno of the error reply the daemon sends for this error.
    pub fn errno(&self) -> i32 {
        match self {
            FrameError::BadLength(_) => errno::EMSGSIZE,
            _ => errno::EPROTO,
        }
    }
    /// True when the stream position is still at a frame boundary (the connection can go on).
    pub fn recoverable(&self) -> bool {
        matches!(self, FrameError::Version(_) | FrameError::Decode(_))
    }
}

fn opts() -> impl Options {
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .with_little_endian()
        .with_limit(MAX_FRAME as u64)
        .reject_trailing_bytes()
}

/// A message with an optional raw data segment (see the module docs).
pub trait Payload {
    /// The bytes sent as the frame's data segment (empty for most messages).
    fn data(&self) -> &[u8];
    /// Where a received data segment goes; `None` = this message takes no data segment.
    fn data_slot(&mut self) -> Option<&mut Vec<u8>>;
}

impl Payload for Request {
    fn data(&self) -> &[u8] {
        match &self.op {
            Op::Write { data, .. } => data,
            _ => &[],
        }
    }
    fn data_slot(&mut self) -> Option<&mut Vec<u8>> {
        match &mut self.op {
            Op::Write { data, .. } => Some(data),
            _ => None,
        }
    }
}

impl Payload for Reply {
    fn data(&self) -> &[u8] {
        match &self.body {
            Ok(Body::Data { data }) => data,
            _ => &[],
        }
    }
    fn data_slot(&mut self) -> Option<&mut Vec<u8>> {
        match &mut self.body {
            Ok(Body::Data { data }) => Some(data),
            _ => None,
        }
    }
}

/// Bytes before the header: length, version, header length.
const PREFIX: usize = 9;

fn prefix(hdr_len: usize, data_len: usize) -> [u8; PREFIX] {
    let l = (1 + 4 + hdr_len + data_len) as u32;
    let mut p = [0u8; PREFIX];
    p[..4].copy_from_slice(&l.to_le_bytes());
    p[4] = VERSION;
    p[5..].copy_from_slice(&(hdr_len as u32).to_le_bytes());
    p
}

fn header<T: Serialize>(msg: &T) -> io::Result<Vec<u8>> {
    opts().serialize(msg).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))
}

/// Encodes `msg` as one frame (length prefix included).
pub fn encode<T: Serialize + Payload>(msg: &T) -> Vec<u8> {
    let hdr = header(msg).expect("serializable");
    let data = msg.data();
    let mut out = Vec::with_capacity(PREFIX + hdr.len() + data.len());
    out.extend_from_slice(&prefix(hdr.len(), data.len()));
    out.extend_from_slice(&hdr);
    out.extend_from_slice(data);
    out
}

/// Writes all of `bufs` (vectored: one `writev` for the whole frame in the common case).
/// Socket buffer size of data connections (both directions), bytes.
pub const SOCK_BUF: usize = 4 << 20;

/// Tunes a data connection, on both ends (daemon and client): `TCP_NODELAY` (a frame is
/// written whole, Nagle would only delay replies) and [`SOCK_BUF`] send/receive buffers so
/// a 1 MiB request and its reply fit without a round trip. Best effort: errors are ignored.
pub fn tune_data_socket(s: &std::net::TcpStream) {
    let _ = s.set_nodelay(true);
    let sock = socket2::SockRef::from(s);
    let _ = sock.set_send_buffer_size(SOCK_BUF);
    let _ = sock.set_recv_buffer_size(SOCK_BUF);
}

pub fn write_all_vectored(w: &mut impl Write, mut bufs: &mut [IoSlice<'_>]) -> io::Result<()> {
    IoSlice::advance_slices(&mut bufs, 0);
    while !bufs.is_empty() {
        match w.write_vectored(bufs) {
            Ok(0) => return Err(io::Error::new(io::ErrorKind::WriteZero, "failed to write whole frame")),
            Ok(n) => IoSlice::advance_slices(&mut bufs, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Encodes and writes one frame to `w`: the header is serialized into a small buffer, the
/// data segment is written from the message's own buffer (no copy). Give an unbuffered
/// stream (or flush a buffered one).
pub fn write_msg<T: Serialize + Payload>(w: &mut impl Write, msg: &T) -> io::Result<()> {
    let hdr = header(msg)?;
    let data = msg.data();
    if 1 + 4 + hdr.len() + data.len() > MAX_FRAME {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "message larger than MAX_FRAME"));
    }
    let p = prefix(hdr.len(), data.len());
    write_all_vectored(w, &mut [IoSlice::new(&p), IoSlice::new(&hdr), IoSlice::new(data)])
}

/// Writes one frame of `msg` (whose own data segment is empty) with `data` as its data
/// segment, from the caller's buffer (e.g. a shared-memory slot: no copy into a `Vec`).
pub fn write_msg_data<T: Serialize + Payload>(w: &mut impl Write, msg: &T, data: &[u8]) -> io::Result<()> {
    let hdr = header(msg)?;
    if !msg.data().is_empty() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "message has its own data segment"));
    }
    if 1 + 4 + hdr.len() + data.len() > MAX_FRAME {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "message larger than MAX_FRAME"));
    }
    let p = prefix(hdr.len(), data.len());
    write_all_vectored(w, &mut [IoSlice::new(&p), IoSlice::new(&hdr), IoSlice::new(data)])
}

/// Prefix and header of a frame for `msg` whose data segment (`data_len` bytes, instead of
/// `msg.data()`) the caller sends itself right after, e.g. with `sendfile(2)`.
pub fn encode_head<T: Serialize>(msg: &T, data_len: usize) -> io::Result<Vec<u8>> {
    let hdr = header(msg)?;
    if 1 + 4 + hdr.len() + data_len > MAX_FRAME {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "message larger than MAX_FRAME"));
    }
    let mut out = Vec::with_capacity(PREFIX + hdr.len());
    out.extend_from_slice(&prefix(hdr.len(), data_len));
    out.extend_from_slice(&hdr);
    Ok(out)
}

/// Reads exactly `buf.len()` bytes; returns how many were read before EOF.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Data segments up to this size get their buffer reserved at once; beyond, the buffer
/// grows with the bytes actually received, so a peer announcing [`MAX_FRAME`] and sending
/// nothing costs at most this much memory.
pub const PREALLOC_MAX: usize = (1 << 20) + (64 << 10);

/// A byte stream a frame can be read from. `read_append` fills a buffer's spare capacity
/// without zeroing it first (receive buffers are reused, never memset).
pub trait FrameRead: Read {
    /// Appends up to `max` bytes to `buf` within its spare capacity (the caller reserves);
    /// returns how many (0 = EOF).
    fn read_append(&mut self, buf: &mut Vec<u8>, max: usize) -> io::Result<usize>;
}

impl FrameRead for io::BufReader<std::net::TcpStream> {
    fn read_append(&mut self, buf: &mut Vec<u8>, max: usize) -> io::Result<usize> {
        use io::BufRead;
        let max = max.min(buf.capacity() - buf.len());
        if max == 0 {
            return Ok(0);
        }
        // Bytes already buffered first, then straight from the socket into `buf`.
        let have = self.buffer();
        if !have.is_empty() {
            let k = have.len().min(max);
            buf.extend_from_slice(&have[..k]);
            self.consume(k);
            return Ok(k);
        }
        use std::os::fd::AsRawFd;
        let fd = self.get_ref().as_raw_fd();
        loop {
            // SAFETY: writes at most `max` bytes into the reserved, unused capacity of
            // `buf` through a raw pointer; the length grows only by what recv reported.
            let n = unsafe { libc::recv(fd, buf.as_mut_ptr().add(buf.len()) as *mut libc::c_void, max, 0) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            unsafe { buf.set_len(buf.len() + n as usize) };
            return Ok(n as usize);
        }
    }
}

impl<T: AsRef<[u8]>> FrameRead for io::Cursor<T> {
    fn read_append(&mut self, buf: &mut Vec<u8>, max: usize) -> io::Result<usize> {
        let pos = (self.position() as usize).min(self.get_ref().as_ref().len());
        let src = &self.get_ref().as_ref()[pos..];
        let k = src.len().min(max).min(buf.capacity() - buf.len());
        buf.extend_from_slice(&src[..k]);
        self.set_position((pos + k) as u64);
        Ok(k)
    }
}

impl FrameRead for &[u8] {
    fn read_append(&mut self, buf: &mut Vec<u8>, max: usize) -> io::Result<usize> {
        let k = self.len().min(max).min(buf.capacity() - buf.len());
        buf.extend_from_slice(&self[..k]);
        *self = &self[k..];
        Ok(k)
    }
}

/// Reads `n` bytes into `buf` (cleared first; its capacity is reused, nothing is zeroed).
/// Returns the bytes read (< n only at EOF).
fn read_into(r: &mut impl FrameRead, buf: &mut Vec<u8>, n: usize) -> io::Result<usize> {
    buf.clear();
    buf.reserve(n.min(PREALLOC_MAX));
    while buf.len() < n {
        if buf.capacity() == buf.len() {
            buf.reserve((n - buf.len()).min(PREALLOC_MAX));
        }
        match r.read_append(buf, n - buf.len()) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(buf.len())
}

/// Skips `n` bytes; returns how many were there.
fn skip(r: &mut impl Read, n: usize) -> io::Result<usize> {
    Ok(io::copy(&mut r.take(n as u64), &mut io::sink())? as usize)
}

/// One received frame: the bincode header and the raw data segment. Reuse one `Frame`
/// (and give its `data` a pooled buffer) to read without allocating.
#[derive(Debug, Default)]
pub struct Frame {
    pub hdr: Vec<u8>,
    pub data: Vec<u8>,
}

/// Reads one frame into `f` (version checked; header and data split, not decoded).
pub fn read_frame_into(r: &mut impl FrameRead, f: &mut Frame) -> Result<(), FrameError> {
    f.hdr.clear();
    f.data.clear();
    let mut pre = [0u8; 5];
    let got = read_full(r, &mut pre).map_err(FrameError::Io)?;
    if got == 0 {
        return Err(FrameError::Eof);
    }
    if got >= 4 {
        let n = u32::from_le_bytes([pre[0], pre[1], pre[2], pre[3]]) as usize;
        if n == 0 || n > MAX_FRAME {
            return Err(FrameError::BadLength(n as u64));
        }
    }
    if got < 5 {
        let want = if got >= 4 { u32::from_le_bytes([pre[0], pre[1], pre[2], pre[3]]) as usize + 4 } else { 5 };
        return Err(FrameError::Truncated { got, want });
    }
    let total = u32::from_le_bytes([pre[0], pre[1], pre[2], pre[3]]) as usize + 4;
    let rest = total - 5; // bytes after the version byte
    let mut pos = 5;
    let truncated = |pos: usize| FrameError::Truncated { got: pos, want: total };
    if pre[4] != VERSION || rest < 4 {
        let k = skip(r, rest).map_err(FrameError::Io)?;
        if k < rest {
            return Err(truncated(pos + k));
        }
        if pre[4] != VERSION {
            return Err(FrameError::Version(pre[4]));
        }
        return Err(FrameError::Decode(format!("frame of {rest} bytes after the version: no header length")));
    }
    let mut hl = [0u8; 4];
    let k = read_full(r, &mut hl).map_err(FrameError::Io)?;
    pos += k;
    if k < 4 {
        return Err(truncated(pos));
    }
    let hdr_len = u32::from_le_bytes(hl) as usize;
    let rest = rest - 4;
    if hdr_len > rest {
        let k = skip(r, rest).map_err(FrameError::Io)?;
        if k < rest {
            return Err(truncated(pos + k));
        }
        return Err(FrameError::Decode(format!("header length {hdr_len} beyond the frame ({rest} bytes)")));
    }
    let k = read_into(r, &mut f.hdr, hdr_len).map_err(FrameError::Io)?;
    pos += k;
    if k < hdr_len {
        return Err(truncated(pos));
    }
    let dlen = rest - hdr_len;
    let k = read_into(r, &mut f.data, dlen).map_err(FrameError::Io)?;
    pos += k;
    if k < dlen {
        return Err(truncated(pos));
    }
    Ok(())
}

/// Reads one frame.
pub fn read_frame(r: &mut impl FrameRead) -> Result<Frame, FrameError> {
    let mut f = Frame::default();
    read_frame_into(r, &mut f)?;
    Ok(f)
}

/// Decodes a frame returned by [`read_frame`]; the data segment moves into the message
/// (no copy), leaving `f.data` empty.
pub fn decode<T: for<'de> Deserialize<'de> + Payload>(f: &mut Frame) -> Result<T, FrameError> {
    let mut msg: T = opts().deserialize(&f.hdr).map_err(|e| FrameError::Decode(e.to_string()))?;
    match msg.data_slot() {
        Some(slot) => *slot = std::mem::take(&mut f.data),
        None if !f.data.is_empty() => {
            return Err(FrameError::Decode(format!("{}-byte data segment on a message that takes none", f.data.len())))
        }
        None => {}
    }
    Ok(msg)
}

/// Reads and decodes one frame.
pub fn read_msg<T: for<'de> Deserialize<'de> + Payload>(r: &mut impl FrameRead) -> Result<T, FrameError> {
    decode(&mut read_frame(r)?)
}

/// Longest request path, bytes. Longer than `PATH_MAX` (4096): `PATH_MAX` bounds what one
/// system call names (relative to its caller's working directory), not a file's depth below
/// the namespace root, so a path near `PATH_MAX` inside a directory of the mount is longer.
pub const MAX_PATH: usize = 32 << 10;

/// Checks a request path and returns its components. Rejects `..`, `.`, empty components
/// (other than one leading `/`), NUL bytes, components longer than 255 bytes and paths
/// longer than [`MAX_PATH`]. The empty path and `/` are the namespace root (no components).
pub fn validate_path(path: &str) -> Result<Vec<&str>, WireError> {
    let bad = |m: &str| WireError { errno: errno::EINVAL, msg: format!("invalid path {path:?}: {m}") };
    if path.len() > MAX_PATH {
        return Err(WireError { errno: errno::ENAMETOOLONG, msg: format!("path longer than {MAX_PATH} bytes") });
    }
    if path.contains('\0') {
        return Err(bad("NUL byte"));
    }
    let rel = path.strip_prefix('/').unwrap_or(path);
    if rel.is_empty() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for c in rel.split('/') {
        match c {
            "" => return Err(bad("empty component")),
            "." | ".." => return Err(bad("`.` or `..` component")),
            c if c.len() > 255 => {
                return Err(WireError { errno: errno::ENAMETOOLONG, msg: "component longer than 255 bytes".into() })
            }
            c => out.push(c),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    fn req(op: Op) -> Request {
        Request {
            id: 7,
            ctx: Ctx {
                job_id: "42".into(),
                rank: 3,
                pid: 1,
                uid: 0,
                gid: 0,
                compute_node: "cn0".into(),
                groups: vec![5, 6],
            },
            op,
        }
    }

    /// A capability as the daemon returns it (the MAC is not checked here).
    fn cap(layout: Layout, handle: OpenHandle) -> Cap {
        Cap { layout, handle, rights: Cap::READ | Cap::WRITE, mac: [0xab; 32] }
    }

    #[test]
    fn roundtrip_every_op_kind() {
        let l = cap(Layout::striped(9, 1 << 20, vec![1, 2]), OpenHandle { daemon: 1, id: 2 });
        let ops = vec![
            Op::Ping,
            Op::Lookup { path: "a/b".into() },
            Op::Setattr {
                path: "a".into(),
                set: SetAttr { size: Some(5), mtime: Some(None), ..Default::default() },
                fd: Some(l.clone()),
            },
            Op::Setattr { path: "a".into(), set: SetAttr { mode: Some(0o600), ..Default::default() }, fd: None },
            Op::Readdir { path: "d".into(), cookie: 77 },
            Op::Open { path: "f".into(), flags: 0o1002 },
            Op::Symlink { path: "l".into(), target: "../x".into() },
            Op::Readlink { path: "l".into() },
            Op::Link { from: "f".into(), to: "g".into() },
            Op::Mknod { path: "p".into(), mode: 0o10644, rdev: 0 },
            Op::KillSuidgid { path: "f".into(), cap: l.clone() },
            Op::Auth { nonce: [1; 32], proof: [2; 32] },
            Op::Rename { from: "a".into(), to: "b".into(), noreplace: true },
            Op::Create { path: "f".into(), mode: 0o644, flags: 0o302, token: 77 },
            Op::Write { path: "f".into(), cap: l.clone(), offset: 4096, data: vec![1, 2, 3] },
            Op::Write { path: "f".into(), cap: l.clone(), offset: 0, data: vec![] },
            Op::Write {
                path: "f".into(),
                cap: cap(
                    Layout {
                        oid: 3,
                        stripe_size: 1 << 20,
                        targets: vec![0, 2],
                        component_size: 4 << 20,
                        perf: vec![50.0, 0.0],
                    },
                    OpenHandle { daemon: 1, id: 2 },
                ),
                offset: 1,
                data: vec![4; 9],
            },
            Op::Read { path: "f".into(), cap: l.clone(), offset: 0, size: 3 },
            Op::Fsync { path: "f".into(), cap: l.clone(), datasync: true },
            Op::Release { path: "f".into(), cap: l.clone() },
            Op::Statfs,
        ];
        for op in ops {
            let r = req(op);
            let frame = encode(&r);
            let back: Request = read_msg(&mut Cursor::new(frame)).unwrap();
            assert_eq!(back, r);
        }
        let attr = Attr {
            ino: 5,
            kind: Kind::File,
            perm: 0o600,
            nlink: 1,
            uid: 1000,
            gid: 1000,
            size: 3,
            blocks: 8,
            rdev: 0,
            atime: Time { sec: 1, nsec: 2 },
            mtime: Time { sec: 3, nsec: 4 },
            ctime: Time { sec: 5, nsec: 6 },
        };
        for body in
            [Body::Opened { attr, cap: l.clone() }, Body::Challenge { nonce: [3; 32] }, Body::Authed { proof: [4; 32] }]
        {
            let rep = Reply { id: 0, body: Ok(body) };
            assert_eq!(read_msg::<Reply>(&mut Cursor::new(encode(&rep))).unwrap(), rep);
        }
        let rep = Reply { id: 7, body: Ok(Body::Data { data: vec![9; 100] }) };
        let back: Reply = read_msg(&mut Cursor::new(encode(&rep))).unwrap();
        assert_eq!(back, rep);
        // write_msg (vectored) produces the same bytes as encode, and so does a head sent
        // before its data segment.
        let mut out = Vec::new();
        write_msg(&mut out, &rep).unwrap();
        assert_eq!(out, encode(&rep));
        let mut head = encode_head(&Reply { id: 7, body: Ok(Body::Data { data: vec![] }) }, 100).unwrap();
        head.extend_from_slice(&[9; 100]);
        assert_eq!(head, encode(&rep));
    }

    #[test]
    fn data_travels_as_raw_segment_after_the_header() {
        let data: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
        let l = Layout::striped(1, 4096, vec![0]);
        let r = req(Op::Write { path: "f".into(), cap: cap(l, OpenHandle::default()), offset: 0, data: data.clone() });
        let frame = encode(&r);
        let total = u32::from_le_bytes(frame[..4].try_into().unwrap()) as usize;
        assert_eq!(total + 4, frame.len());
        assert_eq!(frame[4], VERSION);
        let hl = u32::from_le_bytes(frame[5..9].try_into().unwrap()) as usize;
        // The frame ends with the data bytes verbatim, after the header.
        assert_eq!(&frame[9 + hl..], &data[..]);
        assert!(hl < 256, "header {hl} bytes: data must not be serialized into it");
        // Reading into a reused frame reuses its buffers.
        let mut f = Frame { hdr: Vec::new(), data: Vec::with_capacity(1 << 16) };
        let cap = f.data.capacity();
        let ptr = f.data.as_ptr();
        read_frame_into(&mut Cursor::new(&frame), &mut f).unwrap();
        assert_eq!((f.data.as_ptr(), f.data.capacity()), (ptr, cap));
        assert_eq!(f.data, data);
        let back: Request = decode(&mut f).unwrap();
        assert_eq!(back, r);
        assert!(f.data.is_empty());
        // A frame without data keeps the buffer's capacity for the next one.
        f.data = Vec::with_capacity(1 << 16);
        read_frame_into(&mut Cursor::new(encode(&req(Op::Ping))), &mut f).unwrap();
        assert_eq!((f.data.len(), f.data.capacity()), (0, 1 << 16));
        assert_eq!(decode::<Request>(&mut f).unwrap(), req(Op::Ping));
        read_frame_into(&mut Cursor::new(&frame), &mut f).unwrap();
        assert_eq!(decode::<Request>(&mut f).unwrap(), r);
    }

    /// A write whose data comes from the caller's buffer (a shared-memory slot sent on a
    /// connection without the region) is the same frame as one carrying its own data; the
    /// shared-memory requests round-trip.
    #[test]
    fn data_from_a_foreign_buffer_and_shm_requests() {
        let l = cap(Layout::striped(1, 1 << 20, vec![0]), OpenHandle::default());
        let own = req(Op::Write { path: "f".into(), cap: l.clone(), offset: 8, data: b"slot bytes".to_vec() });
        let empty = req(Op::Write { path: "f".into(), cap: l.clone(), offset: 8, data: Vec::new() });
        let mut a = Vec::new();
        write_msg_data(&mut a, &empty, b"slot bytes").unwrap();
        assert_eq!(a, encode(&own));
        assert!(write_msg_data(&mut Vec::new(), &own, b"x").is_err(), "a message with its own data");
        for op in [
            Op::ShmAttach { pid: 1, fd: 3, size: 1 << 20, nonce: [9; 32] },
            Op::WriteShm { path: "f".into(), cap: l.clone(), offset: 1, slot: 4096, len: 7 },
            Op::ReadShm { path: "f".into(), cap: l.clone(), offset: 1, size: 7, slot: 4096 },
        ] {
            let r = req(op);
            assert_eq!(read_msg::<Request>(&mut Cursor::new(encode(&r))).unwrap(), r);
            assert!(r.op.idempotent());
        }
        let rep = Reply { id: 3, body: Ok(Body::ShmData { len: 7 }) };
        assert_eq!(read_msg::<Reply>(&mut Cursor::new(encode(&rep))).unwrap(), rep);
    }

    #[test]
    fn frames_read_from_a_socket_without_zeroing_buffers() {
        use std::net::{TcpListener, TcpStream};
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 253) as u8).collect();
        let lay = Layout::striped(1, 1 << 20, vec![0]);
        let msgs = vec![
            req(Op::Write {
                path: "f".into(),
                cap: cap(lay.clone(), OpenHandle::default()),
                offset: 0,
                data: data.clone(),
            }),
            req(Op::Ping),
            req(Op::Write {
                path: "f".into(),
                cap: cap(lay, OpenHandle::default()),
                offset: 0,
                data: data[..10].to_vec(),
            }),
        ];
        let to_send = msgs.clone();
        let t = std::thread::spawn(move || {
            let mut s = TcpStream::connect(addr).unwrap();
            for m in &to_send {
                write_msg(&mut s, m).unwrap();
            }
        });
        let (s, _) = l.accept().unwrap();
        let mut r = io::BufReader::with_capacity(16 << 10, s);
        let mut f = Frame::default();
        for m in &msgs {
            read_frame_into(&mut r, &mut f).unwrap();
            let got: Request = decode(&mut f).unwrap();
            assert_eq!(&got, m);
        }
        t.join().unwrap();
        assert!(matches!(read_frame(&mut r), Err(FrameError::Eof)));
    }

    fn raw_frame(version: u8, hdr: &[u8], data: &[u8], hdr_len: u32) -> Vec<u8> {
        let mut f = ((1 + 4 + hdr.len() + data.len()) as u32).to_le_bytes().to_vec();
        f.push(version);
        f.extend_from_slice(&hdr_len.to_le_bytes());
        f.extend_from_slice(hdr);
        f.extend_from_slice(data);
        f
    }

    #[test]
    fn malformed_v2_frames_are_recoverable_decode_errors() {
        let hdr = opts().serialize(&req(Op::Statfs)).unwrap();
        // A data segment on a request that takes none.
        let f = raw_frame(VERSION, &hdr, b"xyz", hdr.len() as u32);
        let mut c = Cursor::new(f);
        let e = read_msg::<Request>(&mut c).unwrap_err();
        assert!(matches!(e, FrameError::Decode(_)) && e.recoverable(), "{e}");
        // A header length beyond the frame: the frame is skipped whole, next one reads.
        let mut f = raw_frame(VERSION, &hdr, b"", 1_000_000);
        let next = encode(&req(Op::Ping));
        f.extend_from_slice(&next);
        let mut c = Cursor::new(f);
        let e = read_msg::<Request>(&mut c).unwrap_err();
        assert!(matches!(e, FrameError::Decode(_)) && e.recoverable(), "{e}");
        assert_eq!(read_msg::<Request>(&mut c).unwrap(), req(Op::Ping));
        // Too short to hold a header length.
        let mut f = 3u32.to_le_bytes().to_vec();
        f.extend_from_slice(&[VERSION, 0, 0]);
        f.extend_from_slice(&next);
        let mut c = Cursor::new(f);
        assert!(matches!(read_msg::<Request>(&mut c).unwrap_err(), FrameError::Decode(_)));
        assert_eq!(read_msg::<Request>(&mut c).unwrap(), req(Op::Ping));
        // A version-1 frame (whole bincode message) is refused as a version error.
        let mut f = raw_frame(1, &hdr, b"", hdr.len() as u32);
        f.extend_from_slice(&next);
        let mut c = Cursor::new(f);
        assert!(matches!(read_msg::<Request>(&mut c).unwrap_err(), FrameError::Version(1)));
        assert_eq!(read_msg::<Request>(&mut c).unwrap(), req(Op::Ping));
        // Truncated inside the data segment.
        let w = encode(&req(Op::Write {
            path: "f".into(),
            cap: cap(Layout::striped(1, 1, vec![0]), OpenHandle::default()),
            offset: 0,
            data: vec![7; 100],
        }));
        let e = read_frame(&mut Cursor::new(&w[..w.len() - 10])).unwrap_err();
        assert!(matches!(e, FrameError::Truncated { .. }) && !e.recoverable(), "{e}");
    }

    #[test]
    fn large_announced_data_grows_with_received_bytes() {
        // Announces MAX_FRAME but sends 10 bytes: the buffer stays within PREALLOC_MAX.
        let mut f = (MAX_FRAME as u32).to_le_bytes().to_vec();
        f.push(VERSION);
        f.extend_from_slice(&0u32.to_le_bytes());
        f.extend_from_slice(&[1; 10]);
        let mut fr = Frame::default();
        let e = read_frame_into(&mut Cursor::new(f), &mut fr).unwrap_err();
        assert!(matches!(e, FrameError::Truncated { .. }));
        assert!(fr.data.capacity() <= 2 * PREALLOC_MAX, "{}", fr.data.capacity());
    }

    #[test]
    fn truncated_frames_are_errors() {
        let frame = encode(&req(Op::Lookup { path: "x".into() }));
        for cut in 1..frame.len() {
            let e = read_frame(&mut Cursor::new(&frame[..cut])).unwrap_err();
            assert!(matches!(e, FrameError::Truncated { .. }), "cut {cut}: {e}");
            assert!(!e.recoverable());
        }
        assert!(matches!(read_frame(&mut Cursor::new(&[][..])), Err(FrameError::Eof)));
    }

    #[test]
    fn oversized_and_zero_lengths_rejected_without_allocating() {
        let mut f = ((MAX_FRAME + 1) as u32).to_le_bytes().to_vec();
        f.extend_from_slice(&[VERSION, 0, 0]);
        let e = read_frame(&mut Cursor::new(f)).unwrap_err();
        assert!(matches!(e, FrameError::BadLength(_)));
        assert_eq!(e.errno(), errno::EMSGSIZE);
        let e = read_frame(&mut Cursor::new(0u32.to_le_bytes().to_vec())).unwrap_err();
        assert!(matches!(e, FrameError::BadLength(0)));
    }

    #[test]
    fn wrong_version_and_garbage_are_recoverable_errors() {
        let mut frame = encode(&req(Op::Statfs));
        frame[4] = 99;
        let e = read_frame(&mut Cursor::new(frame)).unwrap_err();
        assert!(matches!(e, FrameError::Version(99)) && e.recoverable());
        // A vec length prefix claiming 2^60 elements must fail, not allocate.
        let mut hdr = 7u64.to_le_bytes().to_vec();
        hdr.extend_from_slice(&[0xff; 40]);
        let frame = raw_frame(VERSION, &hdr, b"", hdr.len() as u32);
        let e = read_msg::<Request>(&mut Cursor::new(frame)).unwrap_err();
        assert!(matches!(e, FrameError::Decode(_)) && e.recoverable(), "{e}");
        // Trailing bytes after a valid header are rejected too.
        let mut hdr = opts().serialize(&req(Op::Statfs)).unwrap();
        hdr.push(0);
        let frame = raw_frame(VERSION, &hdr, b"", hdr.len() as u32);
        assert!(read_msg::<Request>(&mut Cursor::new(frame)).is_err());
    }

    #[test]
    fn paths() {
        assert_eq!(validate_path("").unwrap(), Vec::<&str>::new());
        assert_eq!(validate_path("/").unwrap(), Vec::<&str>::new());
        assert_eq!(validate_path("/a/b").unwrap(), vec!["a", "b"]);
        assert_eq!(validate_path("a/b").unwrap(), vec!["a", "b"]);
        for bad in ["..", "a/../../etc", "/../x", "a//b", "a/./b", "a/", "x\0y", "//etc"] {
            assert_eq!(validate_path(bad).unwrap_err().errno, errno::EINVAL, "{bad:?}");
        }
        assert_eq!(validate_path(&"x".repeat(256)).unwrap_err().errno, errno::ENAMETOOLONG);
        let deep = vec!["d".repeat(250); 20].join("/"); // beyond PATH_MAX, within MAX_PATH
        assert_eq!(validate_path(&deep).unwrap().len(), 20);
        assert_eq!(validate_path(&vec!["d".repeat(250); 200].join("/")).unwrap_err().errno, errno::ENAMETOOLONG);
    }

    #[test]
    fn idempotence_classes() {
        assert!(Op::Write {
            path: "a".into(),
            cap: cap(Layout::striped(1, 1, vec![0]), OpenHandle::default()),
            offset: 0,
            data: vec![]
        }
        .idempotent());
        assert!(!Op::Unlink { path: "a".into() }.idempotent());
        assert!(!Op::Rename { from: "a".into(), to: "b".into(), noreplace: false }.idempotent());
    }
}
