//! Directory listings (READDIR and READDIRPLUS): the daemon lists a page at a time from a
//! cookie (the namespace's directory offset), which is also the offset handed to the kernel:
//! the kernel continues from any entry, served from the handle's last page while it covers
//! it. Offset 0 (opendir, rewinddir) always fetches anew. A READDIRPLUS page carries each
//! entry's attributes: the kernel makes the entries (one lookup each, learned here) without a
//! request per entry.
use std::sync::Arc;

use fuser::{FileType, ReplyDirectory, ReplyDirectoryPlus, Request};
use pharos_fwd_proto::{errno, Body, Op};

use super::attr::{fattr, ftype, join, no_attrs};
use super::{DirPage, PharosFs, ROOT};

/// The reply a listing fills: READDIR's or READDIRPLUS's.
pub(super) enum Listing {
    Plain(ReplyDirectory),
    Plus(ReplyDirectoryPlus),
}

impl PharosFs {
    /// Answers a READDIR or READDIRPLUS of directory `ino` (open handle `fh`) from `offset`.
    pub(super) fn list(&self, req: &Request<'_>, ino: u64, fh: u64, offset: i64, mut reply: Listing) {
        let ctx = self.sh.ctx(req);
        let fail = |reply: Listing, e: i32| match reply {
            Listing::Plain(r) => r.error(e),
            Listing::Plus(r) => r.error(e),
        };
        let path = match self.sh.path(ino) {
            Ok(p) => p,
            Err(e) => return fail(reply, e),
        };
        let plus = matches!(reply, Listing::Plus(_));
        let cached = match self.sh.dirs.lock().unwrap().get(&fh) {
            None => return fail(reply, errno::EBADF),
            // A page of the other kind is not used (attributes missing, or not needed).
            Some(c) => c.clone().filter(|p| p.attrs.is_empty() != plus),
        };
        self.spawn(move |sh, c| {
            sh.wait_name(&path); // the daemon lists the names this mount made: their creates first
            let mut pos = offset.max(0) as u64;
            let mut page = cached.filter(|_| pos != 0);
            loop {
                let from = page.as_ref().and_then(|p| {
                    if p.start == pos {
                        Some(0)
                    } else {
                        p.entries.iter().position(|e| e.next == pos).map(|i| i + 1)
                    }
                });
                let (p, from) = match (page.take(), from) {
                    (Some(p), Some(i)) => (p, i),
                    _ => {
                        let op = if plus {
                            Op::ReaddirPlus { path: path.clone(), cookie: pos }
                        } else {
                            Op::Readdir { path: path.clone(), cookie: pos }
                        };
                        let p = match sh.rpc.call(c, &ctx, op) {
                            Ok(Body::Entries { entries, eof }) => {
                                DirPage { start: pos, entries, attrs: Vec::new(), eof }
                            }
                            Ok(Body::EntriesPlus { entries, eof }) => {
                                let (entries, attrs) = entries.into_iter().unzip();
                                DirPage { start: pos, entries, attrs, eof }
                            }
                            Ok(_) => return fail(reply, errno::EIO),
                            Err(e) => return fail(reply, e),
                        };
                        let p = Arc::new(p);
                        if let Some(slot) = sh.dirs.lock().unwrap().get_mut(&fh) {
                            *slot = Some(p.clone());
                        }
                        (p, 0)
                    }
                };
                for (i, e) in p.entries.iter().enumerate().skip(from) {
                    let (eino, k) = match e.name.as_str() {
                        "." => (ino, FileType::Directory),
                        ".." => (ROOT, FileType::Directory),
                        _ => (sh.wb.kernel_ino(e.ino), ftype(e.kind)),
                    };
                    let full = match &mut reply {
                        Listing::Plain(r) => r.add(eino, e.next as i64, k, &e.name),
                        Listing::Plus(r) => {
                            let dot = matches!(e.name.as_str(), "." | "..");
                            let attrs = p.attrs.get(i).cloned().flatten().filter(|_| !dot);
                            // fuser sends the attributes' inode as the entry's: never 0 (readdir(3)
                            // skips an entry whose d_ino is 0).
                            let (fa, ttl) = match &attrs {
                                Some(a) => (fattr(a, eino), sh.ttl),
                                // `.`, `..` (not looked up by the kernel) and an entry without
                                // attributes (unreadable, gone since): valid for no time, so
                                // the kernel asks before it uses them.
                                None => (no_attrs(eino, k), std::time::Duration::ZERO),
                            };
                            let full = r.add(eino, e.next as i64, &e.name, &ttl, &fa, 0);
                            if !full && !dot {
                                if let Ok(child) = join(&path, std::ffi::OsStr::new(&e.name)) {
                                    sh.learn(eino, &child); // the kernel counts a lookup
                                }
                            }
                            full
                        }
                    };
                    if full {
                        return match reply {
                            Listing::Plain(r) => r.ok(),
                            Listing::Plus(r) => r.ok(),
                        };
                    }
                    pos = e.next;
                }
                if p.eof || p.entries.is_empty() {
                    return match reply {
                        Listing::Plain(r) => r.ok(),
                        Listing::Plus(r) => r.ok(),
                    };
                }
                // This page is used up: the next one starts after its last entry.
            }
        });
    }
}
