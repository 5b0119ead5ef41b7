//! The frame codec on every message kind: round trips, the raw data segment, buffer reuse,
//! reads from a socket, and malformed, truncated, oversized and foreign-version frames.
use std::io::Cursor;

use super::*;
use crate::{Attr, Body, Cap, Ctx, Kind, Layout, Op, OpenHandle, Reply, Request, SetAttr, Time};

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
        replay: false,
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
        // v6: the replay flag is the header's last byte, and survives the trip.
        let r = Request { replay: true, ..r };
        let frame = encode(&r);
        let hl = u32::from_le_bytes(frame[5..9].try_into().unwrap()) as usize;
        assert_eq!(frame[9 + hl - 1], 1);
        assert_eq!(read_msg::<Request>(&mut Cursor::new(frame)).unwrap(), r);
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
        req(Op::Write { path: "f".into(), cap: cap(lay, OpenHandle::default()), offset: 0, data: data[..10].to_vec() }),
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
