//! READDIRPLUS (issue 29, item 3): a page of a directory with each entry's attributes, the
//! directory resolved once and every entry stat'ed relative to it (a getattr per entry would
//! resolve the directory from the namespace root each time).
use std::os::fd::AsRawFd;

use pharos_fwd_proto::{validate_path, Ctx};

use super::super::{werr, Backend, EntriesPlus, Res};
use super::Namespace;
use crate::nsfs;

impl Namespace {
    /// [`Namespace::readdir`] of `path` from `cookie`, each entry with its attributes as
    /// [`Namespace::getattr`] gives them (`None` for `.`, `..` and an entry gone or unreadable
    /// since the listing). Errors: readdir's (read permission on the directory).
    pub fn readdir_plus(&self, b: &Backend, path: &str, cookie: u64, ctx: &Ctx) -> Res<(EntriesPlus, bool)> {
        let (entries, eof) = self.readdir(path, cookie, ctx)?;
        let dir = if validate_path(path)?.is_empty() {
            self.root_fd.try_clone().map_err(werr)?
        } else {
            let (d, name) = self.parent(path)?;
            nsfs::open_beneath(d.as_raw_fd(), &name).map_err(werr)?
        };
        let out = entries
            .into_iter()
            .map(|e| {
                let a = match e.name.as_str() {
                    "." | ".." => None,
                    n => nsfs::cstr(n).ok().and_then(|c| {
                        let st = nsfs::lstat(dir.as_raw_fd(), &c).ok()?;
                        self.attr_at(b, &dir, &c, &st).ok()
                    }),
                };
                (e, a)
            })
            .collect();
        Ok((out, eof))
    }
}
