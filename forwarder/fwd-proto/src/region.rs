//! The shared-memory data region of a client and a daemon on the same host (issue 12,
//! item 1, "Data path": "shared memory when mount and daemon share a host").
//!
//! Over TCP a 1 MiB write costs the client a copy into the socket and the daemon a copy out
//! of it (plus the loopback stack); a FUSE passthrough has neither. With a region, the mount
//! copies the FUSE request's data once into a slot of a sealed memfd and sends only the
//! header ([`crate::Op::WriteShm`]); the daemon writes the objects straight from the slot.
//! A read ([`crate::Op::ReadShm`]) is read by the daemon into the slot and handed to the
//! kernel from there. Copies per 1 MiB write: FUSE → slot → page cache (TCP: FUSE → buffer →
//! socket → daemon buffer → page cache); per read: page cache → slot → FUSE.
//!
//! The client creates the region ([`Region::create`]): a memfd of `4096 + slots × slot_size`
//! bytes, sealed against shrinking and growing (so no mapping of it can fault with SIGBUS,
//! whatever the other side does), whose first 32 bytes are a random nonce. The daemon maps
//! it through `/proc/<pid>/fd/<fd>` ([`Region::attach`], root or the same user on the same
//! host) after checking the seals, the size and the nonce; on another host, or as another
//! user, the attach fails and the client keeps sending data on the connection.
//!
//! Concurrency: a slot belongs to one request at a time (the client takes it from its free
//! list before filling it and puts it back after the reply), so the two processes never
//! touch the same slot at once; a misbehaving client can only corrupt its own data.
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// Bytes before the first slot (the nonce lives there).
pub const HEADER: u64 = 4096;
/// Largest region a daemon maps, bytes.
pub const MAX_REGION: u64 = 1 << 30;

/// A mapped region (either side).
#[derive(Debug)]
pub struct Region {
    ptr: *mut u8,
    len: usize,
    /// The memfd (client side) or the opened `/proc` link (daemon side).
    fd: OwnedFd,
    nonce: [u8; 32],
}

// SAFETY: the mapping is plain shared memory; access goes through `slice`/`slice_mut` whose
// callers own the slot they address (see the module docs).
unsafe impl Send for Region {}
unsafe impl Sync for Region {}

fn os_err(what: &str) -> String {
    format!("{what}: {}", std::io::Error::last_os_error())
}

fn map(fd: &OwnedFd, len: usize) -> Result<*mut u8, String> {
    // SAFETY: a fresh shared mapping of `len` bytes of `fd`; unmapped in Drop.
    let p = unsafe {
        libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd.as_raw_fd(), 0)
    };
    if p == libc::MAP_FAILED {
        return Err(os_err("mmap"));
    }
    Ok(p as *mut u8)
}

impl Region {
    /// Client side: a sealed memfd of [`HEADER`] + `slots` × `slot_size` bytes with a fresh
    /// nonce at its start.
    pub fn create(slots: usize, slot_size: usize, nonce: [u8; 32]) -> Result<Region, String> {
        let len = HEADER as usize + slots * slot_size;
        if len as u64 > MAX_REGION {
            return Err(format!("region of {len} bytes > {MAX_REGION}"));
        }
        let name = c"pharos-data-region";
        // SAFETY: plain system calls on a name we own; the fd is owned from here on.
        let raw = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
        if raw < 0 {
            return Err(os_err("memfd_create"));
        }
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        if unsafe { libc::ftruncate(raw, len as libc::off_t) } != 0 {
            return Err(os_err("ftruncate"));
        }
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        if unsafe { libc::fcntl(raw, libc::F_ADD_SEALS, seals) } != 0 {
            return Err(os_err("F_ADD_SEALS"));
        }
        let ptr = map(&fd, len)?;
        let r = Region { ptr, len, fd, nonce };
        // SAFETY: the header belongs to the creator; nobody else has the region yet.
        unsafe { std::ptr::copy_nonoverlapping(nonce.as_ptr(), r.ptr, 32) };
        Ok(r)
    }

    /// Daemon side: maps fd `fd` of process `pid` (`/proc/<pid>/fd/<fd>`) after checking that
    /// it is a memfd sealed against shrinking and growing, of exactly `size` bytes (≤
    /// [`MAX_REGION`]), whose first 32 bytes are `nonce`.
    pub fn attach(pid: u32, fd: i32, size: u64, nonce: [u8; 32]) -> Result<Region, String> {
        if size <= HEADER || size > MAX_REGION {
            return Err(format!("region size {size} outside {}..={MAX_REGION}", HEADER + 1));
        }
        let path = format!("/proc/{pid}/fd/{fd}");
        // Only a memfd is opened at all: another file of that process (a device, a FIFO, a
        // file the client may not write) is refused before any open with its side effects.
        let link = std::fs::read_link(&path).map_err(|e| format!("{path}: {e} (not on this host, or not allowed)"))?;
        if !link.as_os_str().as_encoded_bytes().starts_with(b"/memfd:") {
            return Err(format!("{path} is not a memfd ({})", link.display()));
        }
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOCTTY | libc::O_NONBLOCK)
            .open(&path)
            .map_err(|e| format!("open {path}: {e} (not on this host, or not allowed)"))?;
        let owned = OwnedFd::from(file);
        let seals = unsafe { libc::fcntl(owned.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 || seals & (libc::F_SEAL_SHRINK | libc::F_SEAL_GROW) != (libc::F_SEAL_SHRINK | libc::F_SEAL_GROW) {
            return Err(format!("{path} is not a memfd sealed against shrinking and growing"));
        }
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstat(owned.as_raw_fd(), &mut st) } != 0 {
            return Err(os_err("fstat"));
        }
        if st.st_mode & libc::S_IFMT != libc::S_IFREG || st.st_size as u64 != size {
            return Err(format!("{path}: {} bytes, not the announced {size}", st.st_size));
        }
        let ptr = map(&owned, size as usize)?;
        let r = Region { ptr, len: size as usize, fd: owned, nonce };
        // SAFETY: 32 bytes inside the mapping; the client wrote them before announcing it.
        let have = unsafe { std::slice::from_raw_parts(r.ptr, 32) };
        if have != nonce {
            return Err(format!("{path}: wrong nonce (another region)"));
        }
        Ok(r)
    }

    /// Total size, bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a region of 0 bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The raw fd (client side: the number the daemon opens under `/proc/<pid>/fd/`).
    pub fn raw_fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    /// The nonce in the region's first 32 bytes (proof that it is the region a client means).
    pub fn nonce(&self) -> [u8; 32] {
        self.nonce
    }

    /// Bytes `off..off+len`, or `None` if that is not inside the slot area.
    ///
    /// # Safety
    /// The caller owns that range for the lifetime of the slice (one request per slot), and
    /// the other process does not write it meanwhile (a misbehaving client writing its own
    /// slot changes only its own data).
    pub unsafe fn slice(&self, off: u64, len: usize) -> Option<&[u8]> {
        let end = off.checked_add(len as u64)?;
        if off < HEADER || end > self.len as u64 {
            return None;
        }
        Some(std::slice::from_raw_parts(self.ptr.add(off as usize), len))
    }

    /// Mutable bytes `off..off+len`, or `None` if that is not inside the slot area.
    ///
    /// # Safety
    /// As [`Region::slice`]; no other slice of that range is alive.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice_mut(&self, off: u64, len: usize) -> Option<&mut [u8]> {
        let end = off.checked_add(len as u64)?;
        if off < HEADER || end > self.len as u64 {
            return None;
        }
        Some(std::slice::from_raw_parts_mut(self.ptr.add(off as usize), len))
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: the mapping made in create/attach, of `len` bytes.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attach_sees_the_creators_bytes_and_checks_nonce_size_and_seals() {
        let c = Region::create(2, 8192, [7; 32]).unwrap();
        assert_eq!(c.len(), 4096 + 2 * 8192);
        let pid = std::process::id();
        unsafe { c.slice_mut(HEADER, 5).unwrap().copy_from_slice(b"hello") };
        let d = Region::attach(pid, c.raw_fd(), c.len() as u64, [7; 32]).unwrap();
        assert_eq!(unsafe { d.slice(HEADER, 5).unwrap() }, b"hello");
        unsafe { d.slice_mut(HEADER + 8192, 3).unwrap().copy_from_slice(b"abc") };
        assert_eq!(unsafe { c.slice(HEADER + 8192, 3).unwrap() }, b"abc");
        // bounds: never the header, never past the end
        assert!(unsafe { d.slice(0, 1) }.is_none());
        assert!(unsafe { d.slice(HEADER + 2 * 8192 - 1, 2) }.is_none());
        assert!(unsafe { d.slice(u64::MAX, 2) }.is_none());
        // wrong nonce, wrong size, a file that is not a sealed memfd, a missing fd
        assert!(Region::attach(pid, c.raw_fd(), c.len() as u64, [8; 32]).unwrap_err().contains("nonce"));
        assert!(Region::attach(pid, c.raw_fd(), c.len() as u64 + 4096, [7; 32]).is_err());
        let f = tempfile::tempfile().unwrap();
        f.set_len(3 * 4096).unwrap();
        let e = Region::attach(pid, f.as_raw_fd(), 3 * 4096, [0; 32]).unwrap_err();
        assert!(e.contains("not a memfd"), "{e}");
        // A memfd without the seals
        let raw = unsafe { libc::memfd_create(c"unsealed".as_ptr(), libc::MFD_CLOEXEC) };
        let unsealed = unsafe { std::fs::File::from_raw_fd(raw) };
        unsealed.set_len(3 * 4096).unwrap();
        let e = Region::attach(pid, raw, 3 * 4096, [0; 32]).unwrap_err();
        assert!(e.contains("sealed"), "{e}");
        assert!(Region::attach(pid, 99999, 3 * 4096, [0; 32]).is_err());
        assert!(Region::attach(pid, c.raw_fd(), MAX_REGION + 1, [7; 32]).is_err());
    }
}
