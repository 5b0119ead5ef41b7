//! The write of a gathered run given as consecutive chunks ([`DataPath::write_through_chunks`]):
//! one `pwritev(2)` per object piece, no copy to join the chunks.
use std::io;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use pharos_fwd_proto::{errno, Layout, OpenHandle};

use super::super::layout::pieces;
use super::super::{eno, werr, Backend, Res};
use super::{DataPath, IoInfo};

impl DataPath {
    #[allow(clippy::too_many_arguments)] // the backend and a write's own arguments
    pub(super) fn write_chunk_pieces(
        &self,
        b: &Backend,
        l: &Layout,
        h: OpenHandle,
        off: u64,
        len: u64,
        chunks: &[&[u8]],
        info: &mut IoInfo,
    ) -> Res<()> {
        use std::os::fd::AsRawFd;
        // (chunk index, offset in it) of the run's byte `pos`, advanced piece by piece.
        let (mut ci, mut co) = (0usize, 0usize);
        for pc in pieces(l, off, len) {
            let (ti, f) = self.piece_obj(b, l, h, pc.obj, pc.len, info)?;
            let mut iov: Vec<libc::iovec> = Vec::new();
            let mut need = pc.len as usize;
            while need > 0 {
                let c = &chunks[ci][co..];
                let k = c.len().min(need);
                iov.push(libc::iovec { iov_base: c.as_ptr() as *mut libc::c_void, iov_len: k });
                need -= k;
                co += k;
                if co == chunks[ci].len() {
                    ci += 1;
                    co = 0;
                }
            }
            let t0 = Instant::now();
            self.data_writes.fetch_add(1, Relaxed);
            let (mut done, mut first, mut at) = (0usize, 0usize, pc.obj_off);
            while done < pc.len as usize {
                let cnt = (iov.len() - first).min(libc::UIO_MAXIOV as usize) as i32;
                let n = unsafe { libc::pwritev(f.as_raw_fd(), iov[first..].as_ptr(), cnt, at as libc::off_t) };
                if n < 0 {
                    let e = io::Error::last_os_error();
                    if e.kind() == io::ErrorKind::Interrupted {
                        continue;
                    }
                    return Err(werr(e));
                }
                if n == 0 {
                    return Err(eno(errno::EIO, "pwritev wrote nothing"));
                }
                let mut n = n as usize;
                done += n;
                at += n as u64;
                // Skip the iovecs written, trim a partly written one.
                while n > 0 && first < iov.len() {
                    if n >= iov[first].iov_len {
                        n -= iov[first].iov_len;
                        first += 1;
                    } else {
                        iov[first].iov_base = unsafe { (iov[first].iov_base as *mut u8).add(n) } as *mut libc::c_void;
                        iov[first].iov_len -= n;
                        n = 0;
                    }
                }
            }
            b.targets[ti as usize].stretch(t0.elapsed());
        }
        Ok(())
    }
}
