//! Directory holders, the daemon's side (issue 29, items 1 and 2; the record is the
//! namespace's, `backend/namespace/holder.rs`; the mount's side is `fs/complete.rs` and the
//! write-back creates of `fs/writeback.rs`). A mkdir of a named mount records it as the
//! directory's holder and answers [`Body::MadeDir`] with `held`. The holder knows every name
//! there: it answers lookups of absent names itself and may answer creates there itself
//! (write-back: the daemon gets them after, in batches). So a request of *another* mount that
//! reads or changes the directory's names (a lookup or listing in it, a create, mkdir, mknod,
//! symlink, link, unlink or rename there, an rmdir or rename of it) first recalls the holder
//! ([`Watchers::recall`]): the holder stops answering for the directory, sends its pending
//! creates there and acknowledges; then the record is cleared and the request is served. As
//! an NFSv4 directory delegation, or a Lustre LDLM lock, is recalled by a conflicting client.
//!
//! Bounds: a recall waits at most [`RECALL_WAIT`] for the acknowledgement (then counted late
//! and served anyway). A holder that does not watch this forwarding node cannot be recalled
//! from here: what it answers is then bounded by its cache TTL (`--attr-ttl-ms`), and its
//! write-back creates reach the daemon within milliseconds (the batches' delay).
use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use pharos_fwd_proto::{Body, Op, WireError};

use super::watch::Watchers;
use crate::backend::Backend;

/// Longest a request waits for a holder's acknowledgement of a recall (which follows its
/// pending write-back creates in the directory: at most `--writeback-creates` of them).
pub(crate) const RECALL_WAIT: Duration = Duration::from_secs(5);

/// The directory holding the name `path` (request path, no leading or trailing `/`).
fn dir_of(path: &str) -> &str {
    let p = path.trim_matches('/');
    p.rsplit_once('/').map_or("", |(d, _)| d)
}

/// The directories whose names `op` reads or changes (node-local paths included: the backend
/// holds nothing there).
fn touches(op: &Op) -> Vec<&str> {
    match op {
        Op::Lookup { path }
        | Op::Create { path, .. }
        | Op::CreateReleased { path, .. }
        | Op::Mkdir { path, .. }
        | Op::Mknod { path, .. }
        | Op::Symlink { path, .. }
        | Op::Unlink { path }
        | Op::Link { to: path, .. } => vec![dir_of(path)],
        Op::Readdir { path, .. } | Op::ReaddirPlus { path, .. } => vec![path.trim_matches('/')],
        Op::Rmdir { path } => vec![dir_of(path), path.trim_matches('/')],
        Op::Rename { from, to, .. } => vec![dir_of(from), dir_of(to), from.trim_matches('/')],
        _ => Vec::new(),
    }
}

/// Before serving `op` of mount `origin` (0: unnamed): every directory it touches that another
/// mount holds is recalled from that mount, and held by nobody after.
pub(super) fn recall_before(b: &Backend, watch: &Watchers, origin: u64, op: &Op) {
    for dir in touches(op) {
        let Some(holder) = b.dir_holder_unless(dir, origin) else { continue };
        let ino = match dir {
            "" => Some(1), // FUSE's root
            d => b.ns_path(d).ok().and_then(|p| std::fs::symlink_metadata(p).ok()).map(|m| m.ino()),
        };
        if let Some(ino) = ino {
            watch.recall(holder, ino, RECALL_WAIT);
        }
        b.clear_dir_holder(dir);
    }
}

/// What a request of mount `origin` answers once served with `body`: a mkdir of a named mount
/// records it as the new directory's holder ([`Body::MadeDir`]).
pub(super) fn settle(b: &Backend, origin: u64, op: &Op, body: Result<Body, WireError>) -> Result<Body, WireError> {
    Ok(match (op, body?) {
        (Op::Mkdir { path, .. }, Body::Attr(attr)) if origin != 0 => {
            let held = b.set_dir_holder(path.trim_matches('/'), origin);
            Body::MadeDir { attr, held }
        }
        (_, body) => body,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_each_op_touches() {
        assert_eq!(dir_of("/a/b/c"), "a/b");
        assert_eq!(dir_of("c"), "");
        assert_eq!(dir_of("/c/"), "");
        let r = Op::Rename { from: "x/y".into(), to: "d/e/f".into(), noreplace: false };
        assert_eq!(touches(&r), vec!["x", "d/e", "x/y"], "both directories, and the moved one");
        assert_eq!(touches(&Op::Link { from: "a".into(), to: "b/c".into() }), vec!["b"]);
        assert_eq!(touches(&Op::Lookup { path: "/d/f".into() }), vec!["d"]);
        assert_eq!(touches(&Op::Readdir { path: "/d/".into(), cookie: 0 }), vec!["d"]);
        assert_eq!(touches(&Op::Rmdir { path: "d/e".into() }), vec!["d", "d/e"]);
        assert!(touches(&Op::Getattr { path: "d/f".into() }).is_empty(), "attributes only");
    }
}
