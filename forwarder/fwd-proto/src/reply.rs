//! Replies: the daemon's answer to one request ([`Reply`], with the request's `id`), a
//! [`Body`] or a [`WireError`]. A read's data is the frame's raw data segment ([`Payload`]),
//! not part of the header.
use serde::{Deserialize, Serialize};

use crate::abi::{Attr, Cap, DirEntry, StatFs, WireError};
use crate::frame::Payload;

/// What a successful operation answers (which body answers which [`crate::Op`] is the
/// daemon's contract; a client treats any other body as `EIO`).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub enum Body {
    /// Done, nothing to return.
    Ok,
    /// The file's attributes (lookup, getattr, setattr, and the operations that make a name).
    Attr(Attr),
    /// A page of a directory: `eof` = no entry after the last one.
    Entries { entries: Vec<DirEntry>, eof: bool },
    /// An open or create: the file's attributes and the capability of this open.
    Opened { attr: Attr, cap: Cap },
    /// Read data: travels as the frame's raw data segment, not in the bincode header.
    Data {
        #[serde(skip)]
        data: Vec<u8>,
    },
    /// Bytes written by a write.
    Written(u32),
    /// The file system's statistics.
    Statfs(StatFs),
    /// A symbolic link's target (v4).
    Link(String),
    /// v5: the daemon's first frame on a connection (reply id 0): its handshake nonce.
    Challenge { nonce: [u8; 32] },
    /// v5: the answer to [`crate::Op::Auth`]: `HMAC(k_conn, "server" | daemon's nonce | client's nonce)`.
    Authed { proof: [u8; 32] },
    /// The answer to [`crate::Op::ReadShm`]: `len` bytes were read into the request's slot.
    ShmData { len: u32 },
    /// v7: names and attributes changed by another mount, pushed on a watch connection
    /// ([`crate::Op::Watch`]), in the order the daemon served them. A non-zero `ack` asks the
    /// mount for [`crate::Op::WatchAck`] with it once its kernel dropped them: the daemon holds
    /// the reply to a request that changed attributes (setattr, truncate) until every watching
    /// mount acknowledged, at most 100 ms.
    Changes { ack: u64, changes: Vec<Change> },
    /// v7: the answer to a create ([`Body::Opened`]) with the attributes of the file's
    /// directory after it: the kernel drops a directory's attributes after every name change
    /// in it and asks for them before its next permission check there; the mount answers
    /// from these instead of a request.
    Created { attr: Attr, cap: Cap, parent: Attr },
    /// v7: the answer to an unlink or rmdir: the directory's attributes after it.
    Removed { parent: Attr },
    /// v7: the answer to [`crate::Op::ReaddirPlus`]: each entry with its attributes (`None`
    /// for `.`, `..` and an entry gone or unreadable since the listing).
    EntriesPlus { entries: Vec<(DirEntry, Option<Attr>)>, eof: bool },
    /// v8: the answer to a mkdir of a named mount ([`crate::Op::Watch`]): the attributes, and
    /// whether the daemon recorded that mount as the directory's *holder* (in the namespace,
    /// shared by every forwarding node): a name another mount adds there (create, mkdir, mknod,
    /// symlink, link, rename) first recalls the holding mount ([`Change::Recall`], acknowledged,
    /// at most 100 ms) before that request is answered. A holder knows every name of the
    /// directory and may answer lookups of absent names itself until recalled.
    MadeDir { attr: Attr, held: bool },
}

/// One change a mount must drop from its caches (the kernel's FUSE_NOTIFY_INVAL_ENTRY and
/// FUSE_NOTIFY_INVAL_INODE). Inode numbers are the namespace's, but the namespace root is
/// sent as 1 (FUSE's root).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub enum Change {
    /// The name `name` in directory `parent` now names something else, or nothing.
    Entry { parent: u64, name: String },
    /// The attributes of inode `ino` changed (size, times, mode, owner, links).
    Inode { ino: u64 },
    /// v8: this mount no longer holds directory `dir` ([`Body::MadeDir`]): another mount
    /// added a name there; lookups of absent names in it go to the daemon again. Pushed alone
    /// and acknowledged: nothing for the kernel to drop.
    Recall { dir: u64 },
}

/// The daemon's answer to one request.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Reply {
    /// The request's id; 0 answers a frame the daemon could not decode (and the handshake's
    /// [`Body::Challenge`]).
    pub id: u64,
    /// The operation's result.
    pub body: Result<Body, WireError>,
}

impl Reply {
    /// An error reply to request `id`: errno `errno` ([`crate::errno`]) and message `msg`.
    pub fn err(id: u64, errno: i32, msg: impl Into<String>) -> Reply {
        Reply { id, body: Err(WireError { errno, msg: msg.into() }) }
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
