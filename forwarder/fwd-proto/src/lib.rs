//! Wire protocol between `pharos-mount` (compute node) and `pharos-fwd` (forwarding node).
//!
//! A connection carries frames in both directions. A frame is
//! `[u32 little-endian length L][u8 version][L-1 bytes of bincode payload]`, where `L`
//! counts the version byte and the payload and must be in `1..=MAX_FRAME`. The client
//! sends [`Request`] payloads, the daemon answers each with one [`Reply`] carrying the same
//! `id`. A frame with another version, an undecodable payload, or `L > MAX_FRAME` gets a
//! [`Reply`] with `id = 0` and an error (`EPROTO`, `EMSGSIZE`); after an oversized or
//! truncated frame the daemon closes the connection because it cannot find the next
//! frame boundary. Decoding never allocates more than the frame length (bincode limit).
//!
//! Paths are relative to the namespace root, `/`-separated; a leading `/` is allowed and
//! means the namespace root. [`validate_path`] is what the daemon applies.
use std::io::{self, Read, Write};

use bincode::Options;
use serde::{Deserialize, Serialize};

/// Protocol version carried in every frame.
pub const VERSION: u8 = 1;
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
    pub uid: u32,
    pub gid: u32,
    /// Name of the compute node that sent the request.
    pub compute_node: String,
}

/// Where a file's data lives: object `oid` striped round-robin over `targets` (target
/// indexes of the backend) in units of `stripe_size` bytes. One target = no striping.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub oid: u64,
    pub stripe_size: u64,
    pub targets: Vec<u32>,
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
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
    pub atime: Time,
    pub mtime: Time,
    pub ctime: Time,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct DirEntry {
    pub name: String,
    pub ino: u64,
    pub kind: Kind,
}

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

/// One operation. Read and write address the data objects through the layout the client
/// got at open, so they survive renames and never touch the namespace.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub enum Op {
    Ping,
    Lookup { path: String },
    Getattr { path: String },
    Setattr { path: String, set: SetAttr },
    Readdir { path: String },
    Mkdir { path: String, mode: u32 },
    Rmdir { path: String },
    Unlink { path: String },
    Rename { from: String, to: String, noreplace: bool },
    /// Create a regular file; `excl` = fail with EEXIST when it exists. `token` makes a
    /// replay of the same create idempotent.
    Create { path: String, mode: u32, excl: bool, token: u64 },
    Open { path: String, write: bool, truncate: bool },
    Release { path: String, layout: Layout },
    Read { path: String, layout: Layout, offset: u64, size: u32 },
    Write {
        path: String,
        layout: Layout,
        offset: u64,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    Fsync { path: String, layout: Layout, datasync: bool },
    Statfs,
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
        }
    }

    /// True when executing the request twice has the effect of executing it once, so a
    /// client may replay it on another forwarding node after a failure.
    /// Create is idempotent through its token.
    pub fn idempotent(&self) -> bool {
        !matches!(self, Op::Mkdir { .. } | Op::Rmdir { .. } | Op::Unlink { .. } | Op::Rename { .. })
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

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub enum Body {
    Ok,
    Attr(Attr),
    Entries(Vec<DirEntry>),
    Opened { attr: Attr, layout: Layout },
    Data(#[serde(with = "serde_bytes")] Vec<u8>),
    Written(u32),
    Statfs(StatFs),
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
    Truncated { got: usize, want: usize },
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

/// Encodes `msg` as one frame (length prefix included).
pub fn encode<T: Serialize>(msg: &T) -> Vec<u8> {
    let n = opts().serialized_size(msg).expect("serializable") as usize;
    let mut out = Vec::with_capacity(5 + n);
    out.extend_from_slice(&((n + 1) as u32).to_le_bytes());
    out.push(VERSION);
    opts().serialize_into(&mut out, msg).expect("serializable");
    out
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

/// Frames up to this size are read into one allocation of their announced length; larger
/// ones grow with the data actually received, so a peer announcing [`MAX_FRAME`] and
/// sending nothing costs at most this much memory.
const PREALLOC_MAX: usize = (1 << 20) + (64 << 10);

/// Reads one frame and returns its payload (version checked and stripped, not decoded).
pub fn read_frame(r: &mut impl Read) -> Result<Vec<u8>, FrameError> {
    let mut hdr = [0u8; 5];
    let got = read_full(r, &mut hdr).map_err(FrameError::Io)?;
    if got == 0 {
        return Err(FrameError::Eof);
    }
    if got >= 4 {
        let n = u32::from_le_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]) as usize;
        if n == 0 || n > MAX_FRAME {
            return Err(FrameError::BadLength(n as u64));
        }
    }
    if got < 5 {
        let want = if got >= 4 { u32::from_le_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]) as usize + 4 } else { 5 };
        return Err(FrameError::Truncated { got, want });
    }
    let n = u32::from_le_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]) as usize - 1;
    let (mut buf, got) = if n <= PREALLOC_MAX {
        // One exact allocation, filled by reads straight into it.
        let mut buf = vec![0u8; n];
        let got = read_full(r, &mut buf).map_err(FrameError::Io)?;
        (buf, got)
    } else {
        let mut buf = Vec::with_capacity(PREALLOC_MAX);
        let got = r.take(n as u64).read_to_end(&mut buf).map_err(FrameError::Io)?;
        (buf, got)
    };
    buf.truncate(got);
    if got < n {
        return Err(FrameError::Truncated { got: got + 5, want: n + 5 });
    }
    if hdr[4] != VERSION {
        return Err(FrameError::Version(hdr[4]));
    }
    Ok(buf)
}

/// Decodes a payload returned by [`read_frame`].
pub fn decode<T: for<'de> Deserialize<'de>>(payload: &[u8]) -> Result<T, FrameError> {
    opts().deserialize(payload).map_err(|e| FrameError::Decode(e.to_string()))
}

/// Reads and decodes one frame.
pub fn read_msg<T: for<'de> Deserialize<'de>>(r: &mut impl Read) -> Result<T, FrameError> {
    decode(&read_frame(r)?)
}

/// Encodes and writes one frame straight into `w` (no intermediate buffer: give a
/// `BufWriter`, large byte fields then bypass its buffer).
pub fn write_msg<T: Serialize>(w: &mut impl Write, msg: &T) -> io::Result<()> {
    let n = opts().serialized_size(msg).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))? as usize;
    if n + 1 > MAX_FRAME {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "message larger than MAX_FRAME"));
    }
    w.write_all(&((n + 1) as u32).to_le_bytes())?;
    w.write_all(&[VERSION])?;
    opts().serialize_into(w, msg).map_err(|e| io::Error::other(e.to_string()))
}

/// Checks a request path and returns its components. Rejects `..`, `.`, empty components
/// (other than one leading `/`), NUL bytes, components longer than 255 bytes and paths
/// longer than 4096 bytes. The empty path and `/` are the namespace root (no components).
pub fn validate_path(path: &str) -> Result<Vec<&str>, WireError> {
    let bad = |m: &str| WireError { errno: errno::EINVAL, msg: format!("invalid path {path:?}: {m}") };
    if path.len() > 4096 {
        return Err(WireError { errno: errno::ENAMETOOLONG, msg: "path longer than 4096 bytes".into() });
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
        Request { id: 7, ctx: Ctx { job_id: "42".into(), rank: 3, pid: 1, uid: 0, gid: 0, compute_node: "cn0".into() }, op }
    }

    #[test]
    fn roundtrip_every_op_kind() {
        let l = Layout { oid: 9, stripe_size: 1 << 20, targets: vec![1, 2] };
        let ops = vec![
            Op::Ping,
            Op::Lookup { path: "a/b".into() },
            Op::Setattr { path: "a".into(), set: SetAttr { size: Some(5), mtime: Some(None), ..Default::default() } },
            Op::Rename { from: "a".into(), to: "b".into(), noreplace: true },
            Op::Create { path: "f".into(), mode: 0o644, excl: true, token: 77 },
            Op::Write { path: "f".into(), layout: l.clone(), offset: 4096, data: vec![1, 2, 3] },
            Op::Read { path: "f".into(), layout: l, offset: 0, size: 3 },
            Op::Statfs,
        ];
        for op in ops {
            let r = req(op);
            let frame = encode(&r);
            let back: Request = read_msg(&mut Cursor::new(frame)).unwrap();
            assert_eq!(back, r);
        }
        let rep = Reply { id: 7, body: Ok(Body::Data(vec![9; 100])) };
        let back: Reply = read_msg(&mut Cursor::new(encode(&rep))).unwrap();
        assert_eq!(back, rep);
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
        let mut body = vec![VERSION];
        body.extend_from_slice(&7u64.to_le_bytes());
        body.extend_from_slice(&[0xff; 40]);
        let mut frame = (body.len() as u32).to_le_bytes().to_vec();
        frame.extend_from_slice(&body);
        let e = read_msg::<Request>(&mut Cursor::new(frame)).unwrap_err();
        assert!(matches!(e, FrameError::Decode(_)) && e.recoverable(), "{e}");
        // Trailing bytes after a valid message are rejected too.
        let mut frame = encode(&req(Op::Statfs));
        frame.push(0);
        let n = (frame.len() - 4) as u32;
        frame[..4].copy_from_slice(&n.to_le_bytes());
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
    }

    #[test]
    fn idempotence_classes() {
        assert!(Op::Write { path: "a".into(), layout: Layout { oid: 1, stripe_size: 1, targets: vec![0] }, offset: 0, data: vec![] }.idempotent());
        assert!(!Op::Unlink { path: "a".into() }.idempotent());
        assert!(!Op::Rename { from: "a".into(), to: "b".into(), noreplace: false }.idempotent());
    }
}
