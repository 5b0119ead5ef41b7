//! Wire protocol between `pharos-mount` (compute node) and `pharos-fwd` (forwarding node).
//!
//! A connection carries frames in both directions. A frame (version 7) is
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
//! Fsync, Release, KillSuidgid and in a Setattr through an open file); 6 = replays counted
//! once (issue 25, item 5): [`Request::replay`], set by the mount on a try that replays a
//! request another node may have executed (the request keeps its id on every try); later
//! (appended) `Flush`; 7 = the metadata path at FUSE speed (issue 29): [`Op::Watch`] (a
//! connection names its mount; a watch connection receives [`Body::Changes`] pushed by the
//! daemon: the invalidations of the mount's entry and attribute caches) and
//! [`Op::ReaddirPlus`] ([`Body::EntriesPlus`]).
//!
//! Paths are relative to the namespace root, `/`-separated; a leading `/` is allowed and
//! means the namespace root. [`validate_path`] is what the daemon applies.
//!
//! Where things are (the wire layer split as fuser splits its own, `ll/request.rs`,
//! `ll/reply.rs`, `fuse_abi.rs`); every public item is re-exported here, so callers name
//! them `pharos_fwd_proto::Item`:
//!
//! * `frame.rs`: the frame codec (prefix, version, header length, encoding and decoding a
//!   message with its data segment, [`FrameError`], reusable buffers, socket tuning).
//! * `request.rs`: [`Request`] and its operations [`Op`], [`validate_path`].
//! * `reply.rs`: [`Reply`] and its bodies [`Body`].
//! * `abi.rs`: the data types both carry ([`Ctx`], [`Layout`], [`Cap`], [`Attr`], ...) and
//!   the [`errno`] numbers.
//! * [`auth`]: handshake, capability MACs, admin token; [`region`]: the shared-memory data
//!   region; [`BufPool`]: reusable data buffers; [`daemon`] (feature `daemon`): signals and
//!   the ready file of both daemons.

mod abi;
mod bufpool;
mod frame;
mod reply;
mod request;

pub mod auth;
#[cfg(feature = "daemon")]
pub mod daemon;
pub mod region;

pub use abi::{
    errno, Attr, Cap, Ctx, DirEntry, Kind, Layout, OpenHandle, SetAttr, StatFs, Time, WireError, READDIR_PAGE_BYTES,
};
pub use bufpool::BufPool;
pub use frame::{
    decode, encode, encode_head, read_frame, read_frame_into, read_msg, tune_data_socket, write_all_vectored,
    write_msg, write_msg_data, Frame, FrameError, FrameRead, Payload, RecvInto, MAX_FRAME, MAX_IO, PREALLOC_MAX,
    SOCK_BUF, VERSION,
};
pub use reply::{Body, Change, Reply};
pub use request::{validate_path, Op, Request, MAX_PATH};
