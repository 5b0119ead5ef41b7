//! The per-object index of the gather buffers.
use std::collections::HashMap;

use pharos_fwd_proto::OpenHandle;

/// Which buffers hold writes of an object: `(compute node, open)` keys of [`super::NodeBuf::files`]
/// by object id, so that a write's overlap check and a flush of one file look at that file's
/// buffers only instead of every file of every node.
#[derive(Default)]
pub(super) struct OidIndex(pub(super) HashMap<u64, Vec<(String, OpenHandle)>>);

impl OidIndex {
    /// Notes that `node` buffers writes of `oid` through open `h` (once per pair).
    pub(super) fn add(&mut self, oid: u64, node: &str, h: OpenHandle) {
        let v = self.0.entry(oid).or_default();
        if !v.iter().any(|(n, x)| n == node && *x == h) {
            v.push((node.to_string(), h));
        }
    }
    /// Forgets one pair (its buffer was taken).
    pub(super) fn remove(&mut self, oid: u64, node: &str, h: OpenHandle) {
        if let Some(v) = self.0.get_mut(&oid) {
            v.retain(|(n, x)| !(n == node && *x == h));
            if v.is_empty() {
                self.0.remove(&oid);
            }
        }
    }
    /// The buffers of `oid`.
    pub(super) fn get(&self, oid: u64) -> &[(String, OpenHandle)] {
        self.0.get(&oid).map_or(&[], |v| v.as_slice())
    }
    /// Takes every buffer of `oid` out of the index.
    pub(super) fn take(&mut self, oid: u64) -> Vec<(String, OpenHandle)> {
        self.0.remove(&oid).unwrap_or_default()
    }
}
