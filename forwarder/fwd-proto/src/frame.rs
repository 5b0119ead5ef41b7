//! The frame codec: a message ([`Payload`]: a serde header and an optional raw data segment)
//! to and from one length-prefixed frame (layout in the crate docs). Writes send a frame with
//! one vectored write, data from the message's own buffer; reads fill reusable buffers
//! without zeroing them and never allocate more than the bytes that arrived (beyond
//! [`PREALLOC_MAX`]). Knows nothing of the operations: requests and replies (`request.rs`, `reply.rs`) say
//! where their data segment is.
use std::io::{self, IoSlice, Read, Write};

use bincode::Options;
use serde::{Deserialize, Serialize};

use crate::abi::errno;

#[cfg(test)]
mod tests;

/// Protocol version carried in every frame.
pub const VERSION: u8 = 8;
/// Largest frame (version byte + payload), bytes: 8 MiB + 64 KiB of header room.
pub const MAX_FRAME: usize = (8 << 20) + (64 << 10);
/// Largest data payload of one read or write request, bytes.
pub const MAX_IO: usize = 8 << 20;

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

/// Writes all of `bufs` (vectored: one `writev` for the whole frame in the common case),
/// retrying on `EINTR`. Errors: `w`'s, or `WriteZero` when it accepts no more bytes.
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

/// A socket whose bytes can be received straight into memory not yet initialised (a
/// buffer's spare capacity): [`std::net::TcpStream`] with `recv`; the daemon's connections
/// with `recvmsg`, keeping the kernel's receive time (`pharos_fwd::rx`).
pub trait RecvInto: Read {
    /// Receives up to `buf.len()` bytes into `buf` (only written, never read); how many (0 =
    /// EOF). `EINTR` is retried; other errors as `read`'s.
    fn recv_into(&mut self, buf: &mut [std::mem::MaybeUninit<u8>]) -> io::Result<usize>;
}

impl RecvInto for std::net::TcpStream {
    fn recv_into(&mut self, buf: &mut [std::mem::MaybeUninit<u8>]) -> io::Result<usize> {
        use std::os::fd::AsRawFd;
        loop {
            // SAFETY: writes at most `buf.len()` bytes into `buf` through a raw pointer.
            let n = unsafe { libc::recv(self.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            return Ok(n as usize);
        }
    }
}

impl<S: RecvInto> FrameRead for io::BufReader<S> {
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
        let n = self.get_mut().recv_into(&mut buf.spare_capacity_mut()[..max])?;
        // SAFETY: recv_into initialised the first `n` bytes of the spare capacity.
        unsafe { buf.set_len(buf.len() + n) };
        Ok(n)
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
