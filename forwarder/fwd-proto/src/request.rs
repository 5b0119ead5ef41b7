//! Requests: the operations a client asks of a daemon ([`Op`]) with the caller's context
//! ([`Request`]), and the path rule the daemon applies to their paths ([`validate_path`]).
//! A write's data is the frame's raw data segment ([`Payload`]), not part of the header.
use serde::{Deserialize, Serialize};

use crate::abi::{errno, Cap, Ctx, SetAttr, WireError};
use crate::frame::Payload;

/// One operation. Read and write address the data objects through the capability the client
/// got at open (layout, open handle, rights), so they survive renames and never touch the
/// namespace.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub enum Op {
    /// Nothing: answers `Ok` (liveness).
    Ping,
    /// The attributes of the name `path` ([`crate::Body::Attr`]).
    Lookup { path: String },
    /// The attributes of the file at `path` ([`crate::Body::Attr`]).
    Getattr { path: String },
    /// `fd`: through an open file, with its capability (ftruncate: a write capability for
    /// the file at `path` needs no write permission; otherwise the caller's rights apply).
    Setattr { path: String, set: SetAttr, fd: Option<Cap> },
    /// One page of the directory's entries from `cookie` (0 = the start; else an entry's
    /// `next`). The cookies are the namespace file system's directory offsets, so every
    /// daemon on the same namespace continues a listing the same way.
    Readdir { path: String, cookie: u64 },
    /// A directory at `path` with permission bits `mode` (the caller's umask applied).
    Mkdir { path: String, mode: u32 },
    /// Removes the empty directory at `path`.
    Rmdir { path: String },
    /// Removes the name `path` (an open file's data lives until its last release).
    Unlink { path: String },
    /// Renames `from` to `to`, replacing `to` unless `noreplace` (then `EEXIST`).
    Rename { from: String, to: String, noreplace: bool },
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
    Open { path: String, flags: i32 },
    /// Closes the open of `cap` (returned by create/open).
    Release { path: String, cap: Cap },
    /// Needs [`Cap::READ`].
    Read { path: String, cap: Cap, offset: u64, size: u32 },
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
    /// Flushes the file's data (and with `datasync` false its metadata) to the targets.
    /// Needs the open's capability.
    Fsync { path: String, cap: Cap, datasync: bool },
    /// The file system's statistics ([`crate::Body::Statfs`]).
    Statfs,
    // v4 (at the end: earlier variants keep their indexes on the wire)
    /// A symbolic link at `path` pointing to `target`.
    Symlink { path: String, target: String },
    /// The target of the symbolic link at `path` ([`crate::Body::Link`]).
    Readlink { path: String },
    /// A hard link `to` of the file `from`.
    Link { from: String, to: String },
    /// A special file (FIFO, socket, character or block device): `mode` holds the type bits.
    Mknod { path: String, mode: u32, rdev: u64 },
    /// The side effect of a write by a caller without `CAP_FSETID` (the client's kernel
    /// flags such writes): clear the setuid bit, and the setgid bit when group-execute is
    /// set or the caller is not in the file's group, of the regular file at `path` if it
    /// still holds the capability's object and its open is recorded. Done by the daemon as
    /// the local kernel does it (not a chmod of the caller's); the client sends it once per
    /// open handle, before the first such write, only when the file had either bit. Needs
    /// [`Cap::WRITE`].
    KillSuidgid { path: String, cap: Cap },
    // v5
    /// The client's half of the handshake ([`crate::auth`]): its nonce and
    /// `HMAC(k_conn, "client" | daemon's nonce | nonce)`. Only as a connection's first request.
    Auth { nonce: [u8; 32], proof: [u8; 32] },
    // v5, later (appended): the shared-memory data path (issue 12, item 1)
    /// Attach this connection to the client's shared-memory data region, when client and
    /// daemon share a host: a sealed memfd (`F_SEAL_SHRINK | F_SEAL_GROW`, so the daemon's
    /// mapping can never fault with SIGBUS) of `size` bytes, fd `fd` of process `pid`,
    /// opened by the daemon through `/proc/<pid>/fd/<fd>`; its first 32 bytes hold `nonce`
    /// (proof that the region is the one this client means, and that it is on this host).
    /// Answer `Ok`, or an error (then the client sends its data on the connection).
    ShmAttach { pid: u32, fd: i32, size: u64, nonce: [u8; 32] },
    /// [`Op::Write`] whose `len` data bytes are at `slot` (a byte offset) of the attached
    /// region instead of the frame: the daemon writes them to the objects from there.
    WriteShm { path: String, cap: Cap, offset: u64, slot: u64, len: u32 },
    /// [`Op::Read`] whose data the daemon reads into the attached region at `slot` (a byte
    /// offset, room for `size` bytes); the reply is [`crate::Body::ShmData`].
    ReadShm { path: String, cap: Cap, offset: u64, size: u32, slot: u64 },
    // v6, later (appended): remapping with Gather-Arrange-Scatter (issue 26, item 6)
    /// Write the writes gathered from this request's compute node (`ctx.compute_node`) to the
    /// targets and wait for the flushes under way, before the mount moves a job to another
    /// forwarding node. Answer `Ok`, or a write error of those files (the error is also kept
    /// for their next fsync or close on this daemon). A no-op where GAS is off.
    Flush,
    // v7 (appended): the metadata path at FUSE speed (issue 29)
    /// Names the mount instance this connection belongs to (`mount`, random per mount
    /// process), so the daemon does not push a mount's own changes back to it. With `push`,
    /// the connection also becomes that mount's invalidation channel: the daemon answers `Ok`
    /// under this request's id, then sends, under the same id, a [`crate::Body::Changes`] each
    /// time names or attributes change through it by a request of another mount (the
    /// connection carries nothing else). Handled by the daemon's decoder; no record.
    Watch { mount: u64, push: bool },
    /// [`Op::Readdir`] with each entry's attributes ([`crate::Body::EntriesPlus`]): the
    /// kernel's READDIRPLUS, so that `ls -l` costs one request per page, not one per entry.
    ReaddirPlus { path: String, cookie: u64 },
    /// On a watch connection: the changes pushed with `ack` are dropped from this mount's
    /// kernel caches. Handled by the daemon's decoder; no reply.
    WatchAck { ack: u64 },
    /// [`Op::Create`] and the [`Op::Release`] of the open it returns, in one request: a
    /// create the mount answered itself (node-local write-back, issue 27) whose file was
    /// closed before the create was sent. Answers as `Create` (the capability is of an open
    /// already released); the daemon records an open and a close. Idempotent through `token`
    /// as `Create` is (a replay makes no second file and releases the open it returns).
    CreateReleased { path: String, mode: u32, flags: i32, token: u64 },
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
            Op::Flush => "flush",
            Op::Watch { .. } => "watch",
            Op::ReaddirPlus { .. } => "readdir",
            Op::WatchAck { .. } => "watch_ack",
            Op::CreateReleased { .. } => "create",
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

/// One request: the caller and the operation, under an id its reply carries back.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Request {
    /// Chosen by the client, echoed in the reply. 0 is reserved for replies to frames the
    /// daemon could not decode. A mount gives each request its own id, unique per mount
    /// instance (it starts from a random value), and keeps it on every try of a failover, so
    /// `(ctx.compute_node, id)` names one client request on every daemon that executed it
    /// (the daemons' records carry it as `IoRecord.request_id`).
    pub id: u64,
    /// Who asked.
    pub ctx: Ctx,
    /// What.
    pub op: Op,
    /// v6: this try replays a request an earlier try sent to another forwarding node, which
    /// may have executed it (the node failed before its reply arrived: [`Op::idempotent`]).
    /// The daemon copies it into its record (`IoRecord.replay`) so that the pipeline counts
    /// the request once. False on a first try and on a try after nodes that never got it.
    pub replay: bool,
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
    use crate::{Layout, OpenHandle};

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
            cap: Cap {
                layout: Layout::striped(1, 1, vec![0]),
                handle: OpenHandle::default(),
                rights: Cap::WRITE,
                mac: [0; 32],
            },
            offset: 0,
            data: vec![]
        }
        .idempotent());
        assert!(!Op::Unlink { path: "a".into() }.idempotent());
        assert!(!Op::Rename { from: "a".into(), to: "b".into(), noreplace: false }.idempotent());
    }
}
