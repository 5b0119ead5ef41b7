//! A connection's read half that keeps the kernel's receive time of what it reads.
//!
//! A request's queue wait counts from its arrival. Stamped when the decoder reads the frame,
//! it leaves out the time the request lay in the socket's receive buffer before that: nothing
//! when the decoder keeps up, but all of it when the daemon itself is not running (its CPU
//! quota spent, paused, swapping). Then the daemon's records showed short waits and service
//! times while its clients waited up to a second a request (the diagnosis suite's CPU-starved
//! forwarding node, docs/diagnosis.md). With `SO_TIMESTAMPNS` the kernel stamps each received
//! segment (`CLOCK_REALTIME`, at its receipt by the network stack) and `recvmsg` hands the
//! stamp of the last segment it copied; [`RxStream::rx_ns`] keeps it, and the decoder takes it
//! as the arrival of the frames it reads from that data (the first segments after the first
//! socket asks may carry no stamp, the kernel turning stamps on a moment later: those frames
//! are stamped at their decode, as before). A frame that arrived in several
//! reads (a large write's data is received straight into its buffer,
//! [`pharos_fwd_proto::RecvInto`]) is stamped with the last, so the wait is never overstated. Source: Linux
//! `Documentation/networking/timestamping.rst` (`SO_TIMESTAMPNS`, `SCM_TIMESTAMPNS`).
use std::io::{self, Read};
use std::mem::MaybeUninit;
use std::net::TcpStream;
use std::ops::Deref;
use std::os::fd::AsRawFd;

/// Longest a stamp may lie in the past to be taken (ns); an older one (a clock step) is not.
pub const MAX_AGE_NS: u64 = 60_000_000_000;

/// A [`TcpStream`] read with `recvmsg`, keeping the kernel's receive time of the data read.
/// Derefs to the stream (timeouts, addresses, its fd).
#[derive(Debug)]
pub struct RxStream {
    stream: TcpStream,
    rx_ns: u64,
}

impl RxStream {
    /// Turns on `SO_TIMESTAMPNS` on `stream`; where the kernel refuses it the stream reads as
    /// before and [`RxStream::rx_ns`] stays 0.
    pub fn new(stream: TcpStream) -> Self {
        set_int_option(&stream, libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, 1);
        RxStream { stream, rx_ns: 0 }
    }

    /// The receive time (ns since the Unix epoch) of the last segment read; 0 before any stamp.
    pub fn rx_ns(&self) -> u64 {
        self.rx_ns
    }

    /// The arrival of what was read last, as (ns since the epoch, the same moment on the
    /// monotonic clock), given the time now on both clocks: the kernel's stamp when there is
    /// one no later than now and at most [`MAX_AGE_NS`] old, else now.
    pub fn arrival(&self, now_ns: u64, now: std::time::Instant) -> (u64, std::time::Instant) {
        let rx = self.rx_ns;
        if rx == 0 || rx > now_ns || now_ns - rx > MAX_AGE_NS {
            return (now_ns, now);
        }
        match now.checked_sub(std::time::Duration::from_nanos(now_ns - rx)) {
            Some(t) => (rx, t),
            None => (now_ns, now),
        }
    }
}

/// Sets an int socket option (`setsockopt(2)`) on `s`; whether the kernel took it (callers
/// work without it: a socket without stamps or cork behaves as before).
pub(crate) fn set_int_option(s: &TcpStream, level: libc::c_int, name: libc::c_int, v: libc::c_int) -> bool {
    // SAFETY: an int option on an open socket; the pointer and length describe `v`.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            level,
            name,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        ) == 0
    }
}

impl Deref for RxStream {
    type Target = TcpStream;
    fn deref(&self) -> &TcpStream {
        &self.stream
    }
}

impl pharos_fwd_proto::RecvInto for RxStream {
    fn recv_into(&mut self, buf: &mut [MaybeUninit<u8>]) -> io::Result<usize> {
        let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
        // room for a few control messages; u64 for the alignment cmsghdr needs
        let mut control = [0u64; 16];
        loop {
            // SAFETY: msghdr is plain data; zeroed is a valid empty header.
            let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = std::mem::size_of_val(&control) as _;
            // SAFETY: the iovec covers `buf` (only written), the control buffer is ours; both
            // outlive the call.
            let n = unsafe { libc::recvmsg(self.stream.as_raw_fd(), &mut msg, 0) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            // SAFETY: the kernel filled msg_control/msg_controllen; the CMSG_* walk stays inside them.
            unsafe {
                let mut c = libc::CMSG_FIRSTHDR(&msg);
                while !c.is_null() {
                    if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_TIMESTAMPNS {
                        let ts: libc::timespec = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast());
                        let ns = (ts.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(ts.tv_nsec as u64);
                        if ns > 0 {
                            self.rx_ns = ns;
                        }
                    }
                    c = libc::CMSG_NXTHDR(&msg, c);
                }
            }
            return Ok(n as usize);
        }
    }
}

impl Read for RxStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: a byte slice is a valid slice of MaybeUninit bytes of the same length.
        let buf = unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<MaybeUninit<u8>>(), buf.len()) };
        pharos_fwd_proto::RecvInto::recv_into(self, buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::TcpListener;
    use std::time::{Duration, Instant};

    fn pair() -> (TcpStream, RxStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        (c, RxStream::new(s))
    }

    #[test]
    fn the_stamp_is_the_receipt_not_the_read() {
        let (mut c, mut r) = pair();
        let mut buf = [0u8; 16];
        // The kernel turns receive stamps on for the whole stack a moment after the first
        // socket asks (a deferred static key): the first segments may carry none.
        for _ in 0..100 {
            c.write_all(b"x").unwrap();
            r.read_exact(&mut buf[..1]).unwrap();
            if r.rx_ns() > 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(r.rx_ns() > 0, "no receive stamp after 1 s: SO_TIMESTAMPNS refused?");
        let sent = crate::clock::wall_ns();
        c.write_all(b"hello").unwrap();
        std::thread::sleep(Duration::from_millis(300)); // lies in the receive buffer
        let n = r.read(&mut buf).unwrap();
        let read_at = crate::clock::wall_ns();
        assert_eq!(&buf[..n], b"hello");
        let rx = r.rx_ns();
        assert!(rx >= sent.saturating_sub(5_000_000), "stamp {rx} before the send {sent}");
        assert!(read_at - rx >= 250_000_000, "stamp {rx} not ~300 ms before the read {read_at}");
        let (a_ns, a) = r.arrival(read_at, Instant::now());
        assert_eq!(a_ns, rx);
        assert!(a.elapsed() >= Duration::from_millis(250));
    }

    #[test]
    fn no_stamp_or_a_future_or_stale_one_is_now() {
        let (_c, mut r) = pair();
        let now = Instant::now();
        assert_eq!(r.arrival(5_000_000_000, now), (5_000_000_000, now));
        r.rx_ns = 6_000_000_000; // after now: a clock step back
        assert_eq!(r.arrival(5_000_000_000, now), (5_000_000_000, now));
        r.rx_ns = 1;
        assert_eq!(r.arrival(MAX_AGE_NS + 2, now), (MAX_AGE_NS + 2, now));
    }

    #[test]
    fn reads_end_and_time_out_as_a_stream_does() {
        let (c, mut r) = pair();
        r.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        let mut buf = [0u8; 4];
        let e = r.read(&mut buf).unwrap_err();
        assert!(matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut), "{e:?}");
        drop(c);
        assert_eq!(r.read(&mut buf).unwrap(), 0);
    }
}
