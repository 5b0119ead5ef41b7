//! Directory holders, the daemon's side (issue 29, item 1; the record is the namespace's,
//! `backend/namespace/holder.rs`; the mount's side is `fs/complete.rs`). A mkdir of a named
//! mount records it as the directory's holder and answers [`Body::MadeDir`] with `held`; a
//! request of another mount that adds a name in a held directory recalls the holder
//! ([`super::watch::Watchers::recall`], acknowledged) before it is answered, so once a create
//! (mkdir, mknod, symlink, link, rename) returns, no mount answers "no such name" for it
//! from what it held. A holder that does not watch this forwarding node cannot be recalled from
//! here: what it answers is then bounded by its cache TTL (`--attr-ttl-ms`), as every cached
//! entry of a mount that misses a push.
use std::os::unix::fs::MetadataExt;

use pharos_fwd_proto::{Body, Op, WireError};

use super::watch::Watchers;
use crate::backend::Backend;

/// The directory holding the name `path` (request path, no leading or trailing `/`).
fn dir_of(path: &str) -> &str {
    let p = path.trim_matches('/');
    p.rsplit_once('/').map_or("", |(d, _)| d)
}

/// The directories in which `op` adds a name when it succeeds (node-local paths included:
/// the backend holds nothing there).
fn adds_names_in(op: &Op) -> Vec<&str> {
    match op {
        Op::Create { path, .. }
        | Op::CreateReleased { path, .. }
        | Op::Mkdir { path, .. }
        | Op::Mknod { path, .. }
        | Op::Symlink { path, .. }
        | Op::Link { to: path, .. }
        | Op::Rename { to: path, .. } => vec![dir_of(path)],
        _ => Vec::new(),
    }
}

/// What a request of mount `origin` (0: unnamed) answers once served with `body`: a mkdir of
/// a named mount records it as the new directory's holder ([`Body::MadeDir`]); a name added in
/// a directory another mount holds first recalls that mount. Called before the reply.
pub(super) fn settle(
    b: &Backend,
    watch: &Watchers,
    origin: u64,
    op: &Op,
    body: Result<Body, WireError>,
) -> Result<Body, WireError> {
    let body = body?;
    for dir in adds_names_in(op) {
        if let Some(holder) = b.take_dir_holder_unless(dir, origin) {
            let ino = match dir {
                "" => Some(1), // FUSE's root
                d => b.ns_path(d).ok().and_then(|p| std::fs::symlink_metadata(p).ok()).map(|m| m.ino()),
            };
            if let Some(ino) = ino {
                watch.recall(holder, ino);
            }
        }
    }
    Ok(match (op, body) {
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
    fn names_are_added_in_their_directories() {
        assert_eq!(dir_of("/a/b/c"), "a/b");
        assert_eq!(dir_of("c"), "");
        assert_eq!(dir_of("/c/"), "");
        let r = Op::Rename { from: "x/y".into(), to: "d/e/f".into(), noreplace: false };
        assert_eq!(adds_names_in(&r), vec!["d/e"]);
        assert_eq!(adds_names_in(&Op::Link { from: "a".into(), to: "b/c".into() }), vec!["b"]);
        assert!(adds_names_in(&Op::Unlink { path: "d/f".into() }).is_empty(), "a removal adds nothing");
        assert!(adds_names_in(&Op::Lookup { path: "d/f".into() }).is_empty());
    }
}
