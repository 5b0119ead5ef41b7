use std::net::TcpStream;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};

use pharos_fwd_proto::auth::SiteKey;
use pharos_fwd_proto::region::Region;
use pharos_fwd_proto::{self as proto, errno, Body, Cap, Layout, Op, OpenHandle, Request};

use super::conn::Conn;
use super::{classify, Class, Config, Server};
use crate::backend::{Backend, IoInfo};
use crate::records::RecordSink;

/// A daemon's `Server` on 2 targets in a tmp dir, one worker, site key `key` (shared memory on).
pub(crate) fn server(key: &[u8]) -> (tempfile::TempDir, Arc<Server>) {
    server_shm(key, true)
}

fn server_shm(key: &[u8], shm_data: bool) -> (tempfile::TempDir, Arc<Server>) {
    let d = tempfile::tempdir().unwrap();
    let ts: Vec<(String, std::path::PathBuf)> =
        (0..2).map(|i| (format!("ost{i}"), d.path().join(format!("ost{i}")))).collect();
    let backend = Backend::new(&d.path().join("mdt"), &ts).unwrap();
    let cfg = Config {
        node_name: "fwd0".into(),
        workers: 1,
        weights: [4, 2, 1],
        queue_depth: [4, 4, 2],
        small_max: 65536,
        max_conns: 4,
        key: SiteKey::new(key),
        threads: Default::default(),
        shm_data,
    };
    (d, Server::new(cfg, Arc::new(backend), Arc::new(RecordSink::new(None))))
}

/// What the decoder checks before a data request is queued: the MAC (any daemon of the
/// site, not another site), then the right the operation needs.
#[test]
fn capabilities_are_checked_before_queueing() {
    let (_d, s) = server(&[7; 32]);
    let (_d1, other_daemon) = server(&[7; 32]);
    let (_d2, other_site) = server(&[8; 32]);
    let l = Layout::striped(0x42, 1 << 20, vec![1]);
    let h = OpenHandle { daemon: 1, id: 2 };
    let ro = s.cfg.key.sign(l.clone(), h, Cap::READ);
    let rw = other_daemon.cfg.key.sign(l.clone(), h, Cap::READ | Cap::WRITE);
    let read = |cap: &Cap| Op::Read { path: "f".into(), cap: cap.clone(), offset: 0, size: 1 };
    let write = |cap: &Cap| Op::Write { path: "f".into(), cap: cap.clone(), offset: 0, data: vec![1] };
    assert!(s.authorize(&read(&ro)).is_ok());
    assert!(s.authorize(&write(&rw)).is_ok(), "a capability of another daemon of the site");
    assert_eq!(s.authorize(&write(&ro)).unwrap_err().errno, errno::EBADF);
    let kill = Op::KillSuidgid { path: "f".into(), cap: ro.clone() };
    assert_eq!(s.authorize(&kill).unwrap_err().errno, errno::EBADF);
    assert!(s.authorize(&Op::Fsync { path: "f".into(), cap: ro.clone(), datasync: false }).is_ok());
    assert!(s.authorize(&Op::Release { path: "f".into(), cap: ro.clone() }).is_ok());
    assert_eq!(other_site.authorize(&read(&ro)).unwrap_err().errno, errno::EACCES);
    // Another object, or more rights, under the same MAC.
    let mut forged = rw.clone();
    forged.layout.oid = 0x43;
    assert_eq!(s.authorize(&read(&forged)).unwrap_err().errno, errno::EACCES);
    let mut forged = ro.clone();
    forged.rights = Cap::READ | Cap::WRITE;
    assert_eq!(s.authorize(&write(&forged)).unwrap_err().errno, errno::EACCES);
    let set = Op::Setattr { path: "f".into(), set: Default::default(), fd: Some(forged) };
    assert_eq!(s.authorize(&set).unwrap_err().errno, errno::EACCES);
    // Requests without a capability pass; a second Auth is a protocol error.
    assert!(s.authorize(&Op::Setattr { path: "f".into(), set: Default::default(), fd: None }).is_ok());
    assert!(s.authorize(&Op::Lookup { path: "f".into() }).is_ok());
    assert_eq!(s.authorize(&Op::Auth { nonce: [0; 32], proof: [0; 32] }).unwrap_err().errno, errno::EPROTO);
}

/// The shared-memory data path (issue 12, item 1): an attach is refused when off, on a
/// region that is not the client's, and twice; WriteShm/ReadShm need an attached region
/// and a slot inside it, and become the Write/Read they stand for, with their capability
/// checked as usual; a write from a slot and a read into one move the bytes.
#[test]
fn shared_memory_requests_are_bounded_and_checked() {
    let (_d, s) = server(&[7; 32]);
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let conn = Conn { w: Mutex::new(c), shm: std::sync::OnceLock::new(), mount: std::sync::OnceLock::new() };
    let flags = libc::O_CREAT | libc::O_EXCL | libc::O_RDWR;
    let (_, lay, h) = s.backend.create("f", 0o644, flags, 1, &Default::default()).unwrap();
    let cap = s.cfg.key.sign(lay, h, Cap::READ | Cap::WRITE);
    let wshm = |slot: u64, len: u32| Op::WriteShm { path: "f".into(), cap: cap.clone(), offset: 0, slot, len };
    let head = pharos_fwd_proto::region::HEADER;
    // No region yet: refused.
    assert_eq!(s.unwrap_shm(&conn, &mut wshm(head, 3)).unwrap_err().errno, errno::EPROTO);
    let region = Region::create(2, 1 << 20, [5; 32]).unwrap();
    let pid = std::process::id();
    let size = region.len() as u64;
    let (fd, nonce) = (region.raw_fd(), region.nonce());
    assert!(s.shm_attach(&conn, pid, fd, size, [6; 32]).is_err(), "wrong nonce");
    let (_d2, off) = server_shm(&[7; 32], false);
    assert_eq!(off.shm_attach(&conn, pid, fd, size, nonce).unwrap_err().errno, errno::ENOSYS);
    assert_eq!(s.shm_attach(&conn, pid, fd, size, nonce).unwrap(), Body::Ok);
    assert!(s.shm_attach(&conn, pid, fd, size, nonce).is_err(), "attached twice");
    assert_eq!(s.counters.shm_attaches.load(Relaxed), 1);
    // Slots outside the region, in its header, or larger than MAX_IO.
    for (slot, len) in [(0, 3), (size - 2, 3), (u64::MAX - 1, 3), (head, proto::MAX_IO as u32 + 1)] {
        assert_eq!(s.unwrap_shm(&conn, &mut wshm(slot, len)).unwrap_err().errno, errno::EPROTO, "{slot} {len}");
    }
    let mut op = wshm(head + (1 << 20), 5);
    assert_eq!(s.unwrap_shm(&conn, &mut op).unwrap(), Some((head + (1 << 20), 5)));
    assert!(matches!(&op, Op::Write { data, offset: 0, .. } if data.is_empty()));
    assert!(s.authorize(&op).is_ok());
    assert_eq!(classify(&op, Some((0, 1 << 20)), 65536), Class::Large);
    // The bytes: written from the slot, read back into the other one.
    unsafe { region.slice_mut(head + (1 << 20), 5).unwrap().copy_from_slice(b"hello") };
    let r = s.conn_region(&conn);
    let mut w = Request { id: 1, ctx: Default::default(), op, replay: false };
    let mut info = IoInfo::default();
    assert_eq!(s.execute(&mut w, &mut info, Some((r, head + (1 << 20), 5))).unwrap(), Body::Written(5));
    let mut op = Op::ReadShm { path: "f".into(), cap: cap.clone(), offset: 1, size: 100, slot: head };
    assert_eq!(s.unwrap_shm(&conn, &mut op).unwrap(), Some((head, 100)));
    let mut rd = Request { id: 2, ctx: Default::default(), op, replay: false };
    assert_eq!(s.execute(&mut rd, &mut info, Some((r, head, 100))).unwrap(), Body::ShmData { len: 4 });
    assert_eq!(unsafe { region.slice(head, 4).unwrap() }, b"ello");
    // A forged capability is still refused after the conversion.
    let mut forged = cap.clone();
    forged.layout.oid ^= 1;
    let mut op = Op::ReadShm { path: "f".into(), cap: forged, offset: 0, size: 1, slot: head };
    s.unwrap_shm(&conn, &mut op).unwrap();
    assert_eq!(s.authorize(&op).unwrap_err().errno, errno::EACCES);
}

/// A create and the release of its open in one request (`Op::CreateReleased`, the mount's
/// write-back create of a file closed before the create was sent): the file is made, its open
/// is released (no open left counted on its targets, as after `Create` + `Release`), the
/// release's time is kept for its own record, and a replay (same token) makes no second file
/// and leaves no open behind.
#[test]
fn a_create_released_in_the_same_request_leaves_no_open() {
    let (_d, s) = server(&[7; 32]);
    let opens = |s: &Server| s.backend.targets.iter().map(|t| t.shm.open_count()).sum::<i64>();
    let run = |op: Op| {
        let mut req = Request { id: 1, ctx: Default::default(), op, replay: false };
        let mut info = IoInfo::default();
        let body = s.execute(&mut req, &mut info, None).unwrap();
        (body, info)
    };
    let ino = |b: &Body| match b {
        Body::Created { attr, .. } | Body::Opened { attr, .. } => attr.ino,
        other => panic!("not a create's answer: {other:?}"),
    };
    let flags = libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY;
    let (body, info) = run(Op::Create { path: "kept".into(), mode: 0o644, flags, token: 1 });
    assert!(info.release.is_none());
    assert_eq!(opens(&s), 1, "a plain create keeps its open");
    let (body2, info2) = run(Op::CreateReleased { path: "closed".into(), mode: 0o644, flags, token: 2 });
    assert!(info2.release.is_some(), "the release's time, for its close record");
    assert!(info2.oid != 0 && info2.target.is_some());
    assert_eq!(opens(&s), 1, "the create's open was released");
    assert_ne!(ino(&body), ino(&body2));
    let (again, _) = run(Op::CreateReleased { path: "closed".into(), mode: 0o644, flags, token: 2 });
    assert_eq!(ino(&again), ino(&body2), "a replay is the same file");
    assert_eq!(opens(&s), 1, "and releases the open it returns");
    let mut other = Request {
        id: 3,
        ctx: Default::default(),
        op: Op::CreateReleased { path: "closed".into(), mode: 0o644, flags, token: 9 },
        replay: false,
    };
    let err = s.execute(&mut other, &mut IoInfo::default(), None).unwrap_err();
    assert_eq!(err.errno, errno::EEXIST, "another create of the name");
    assert_eq!(opens(&s), 1);
}
