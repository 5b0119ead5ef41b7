//! Layout arithmetic and the sidecar format: how the bytes of a file map to its objects
//! (RAID-0 stripes of a classic layout, fixed-size components of a progressive one) and how
//! a layout is written in, and read from, its namespace sidecar. Pure functions, no I/O.
use pharos_fwd_proto::{Layout, OpenHandle};

/// The top 16 bits of a node-local file's object id ("NL"; `backend/nodelocal.rs`): its opens
/// have no marker on the MDT, its removal needs no orphan check. Shared files never get it
/// ([`shared_oid`]).
pub const LOCAL_TAG: u64 = 0x4e4c << 48;
const TAG_MASK: u64 = 0xffff << 48;
/// The open handle of every open of a node-local file (no marker: daemon id 0 is no daemon's).
pub const LOCAL_HANDLE: OpenHandle = OpenHandle { daemon: 0, id: LOCAL_TAG };

/// Whether `oid` is a node-local file's object id.
#[inline]
pub fn is_local_oid(oid: u64) -> bool {
    oid & TAG_MASK == LOCAL_TAG
}

/// A shared file's object id from random bits: never one with the node-local tag.
pub fn shared_oid(r: u64) -> u64 {
    if is_local_oid(r) {
        r ^ (1 << 63)
    } else {
        r
    }
}

/// The layout of a new node-local file on target `ti` (one stripe, 1 MiB units), object id
/// from random bits `r` with the node-local tag.
pub fn local_layout(r: u64, ti: u32) -> Layout {
    Layout::striped((r & !TAG_MASK) | LOCAL_TAG, 1 << 20, vec![ti])
}

fn join<T: ToString>(xs: &[T]) -> String {
    xs.iter().map(T::to_string).collect::<Vec<_>>().join(",")
}

/// Encodes a layout sidecar: `v1` for classic layouts (unchanged format), `v2` for
/// progressive ones (`component_size=<bytes> perf=<MB/s,..>` added), which older daemons
/// refuse instead of reading them as classic.
pub fn layout_text(l: &Layout, token: u64) -> String {
    let head = format!("oid={:016x} stripe_size={} targets={} token={}", l.oid, l.stripe_size, join(&l.targets), token);
    if l.is_progressive() {
        format!("pharos-layout v2 {head} component_size={} perf={}\n", l.component_size, join(&l.perf))
    } else {
        format!("pharos-layout v1 {head}\n")
    }
}

/// Decodes a layout sidecar (v1 or v2); returns the layout and the create token.
pub fn parse_layout(s: &str) -> Option<(Layout, u64)> {
    let mut it = s.split_whitespace();
    if it.next()? != "pharos-layout" || !matches!(it.next()?, "v1" | "v2") {
        return None;
    }
    fn list<T: std::str::FromStr>(v: &str) -> Option<Vec<T>> {
        v.split(',').filter(|x| !x.is_empty()).map(|x| x.parse().ok()).collect()
    }
    let (mut oid, mut ss, mut targets, mut token, mut cs, mut perf) = (None, None, None, 0, 0, Vec::new());
    for kv in it {
        let (k, v) = kv.split_once('=')?;
        match k {
            "oid" => oid = u64::from_str_radix(v, 16).ok(),
            "stripe_size" => ss = v.parse().ok(),
            "targets" => targets = list(v),
            "token" => token = v.parse().ok()?,
            "component_size" => cs = v.parse().ok()?,
            "perf" => perf = list(v)?,
            _ => {}
        }
    }
    let l = Layout { oid: oid?, stripe_size: ss?, targets: targets?, component_size: cs, perf };
    if l.stripe_size == 0 || l.targets.is_empty() || !(l.perf.is_empty() || l.perf.len() == l.targets.len()) {
        return None;
    }
    Some((l, token))
}

/// One contiguous piece of a logical byte range inside one object.
#[derive(Debug, PartialEq)]
pub struct Piece {
    /// Object index: the stripe (classic layout) or the component (progressive layout).
    pub obj: u64,
    pub obj_off: u64,
    pub len: u64,
    /// Offset of the piece within the request buffer.
    pub buf_off: u64,
}

/// Splits `[off, off+len)` of a file with layout `l` into per-object pieces: RAID-0 over
/// the targets (classic), or one piece per component (progressive).
pub fn pieces(l: &Layout, off: u64, len: u64) -> Vec<Piece> {
    let (k, ss) = (l.targets.len() as u64, if l.is_progressive() { l.component_size } else { l.stripe_size });
    let mut out = Vec::new();
    let mut pos = off;
    let end = off + len;
    while pos < end {
        let unit = pos / ss;
        let within = pos % ss;
        let n = (ss - within).min(end - pos);
        let (obj, obj_off) = if l.is_progressive() { (unit, within) } else { (unit % k, (unit / k) * ss + within) };
        out.push(Piece { obj, obj_off, len: n, buf_off: pos - off });
        pos += n;
    }
    out
}

/// Logical file size implied by component `k` (of `component_size` bytes) holding `s`
/// bytes: 0 when empty.
pub fn logical_from_component(component_size: u64, k: u64, s: u64) -> u64 {
    if s == 0 {
        0
    } else {
        k * component_size + s
    }
}

/// Size of stripe object `i` when the file is `size` bytes long.
pub fn obj_size(l: &Layout, size: u64, i: u32) -> u64 {
    let k = l.targets.len() as u64;
    let ss = l.stripe_size;
    let full = size / ss;
    let rem = size % ss;
    let rows = full / k;
    let col = full % k;
    let i = i as u64;
    rows * ss
        + if i < col {
            ss
        } else if i == col {
            rem
        } else {
            0
        }
}

/// Logical file size implied by stripe object `i` having `s` bytes.
pub fn logical_from_obj(l: &Layout, i: u32, s: u64) -> u64 {
    if s == 0 {
        return 0;
    }
    let k = l.targets.len() as u64;
    let ss = l.stripe_size;
    let j = (s - 1) / ss;
    (j * k + i as u64) * ss + (s - 1) % ss + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lay(k: u32, ss: u64) -> Layout {
        Layout::striped(1, ss, (0..k).collect())
    }

    #[test]
    fn striping_math_is_consistent() {
        let l = lay(3, 4);
        let ps = pieces(&l, 2, 12);
        assert_eq!(ps[0], Piece { obj: 0, obj_off: 2, len: 2, buf_off: 0 });
        assert_eq!(ps[1], Piece { obj: 1, obj_off: 0, len: 4, buf_off: 2 });
        assert_eq!(ps[3], Piece { obj: 0, obj_off: 4, len: 2, buf_off: 10 });
        for size in 0..60u64 {
            let m = (0..3).map(|i| logical_from_obj(&l, i, obj_size(&l, size, i))).max().unwrap();
            assert_eq!(m, size, "size {size}");
        }
    }

    #[test]
    fn component_mapping_and_sidecar_format() {
        let l = Layout {
            oid: 0xab,
            stripe_size: 1 << 20,
            targets: vec![0, 1, 2],
            component_size: 8192,
            perf: vec![50.0, 0.0, 12.5],
        };
        let ps = pieces(&l, 8000, 10_000);
        assert_eq!(ps[0], Piece { obj: 0, obj_off: 8000, len: 192, buf_off: 0 });
        assert_eq!(ps[1], Piece { obj: 1, obj_off: 0, len: 8192, buf_off: 192 });
        assert_eq!(ps[2], Piece { obj: 2, obj_off: 0, len: 1616, buf_off: 8384 });
        assert_eq!(logical_from_component(8192, 2, 0), 0);
        assert_eq!(logical_from_component(8192, 2, 5), 16389);
        let text = layout_text(&l, 9);
        assert!(text.starts_with("pharos-layout v2 oid=00000000000000ab "), "{text}");
        assert_eq!(parse_layout(&text), Some((l, 9)));
        // Classic sidecars keep the v1 format, and old ones parse as classic.
        let c = Layout::striped(7, 4096, vec![3, 1]);
        assert_eq!(layout_text(&c, 5), "pharos-layout v1 oid=0000000000000007 stripe_size=4096 targets=3,1 token=5\n");
        assert_eq!(parse_layout("pharos-layout v1 oid=7 stripe_size=4096 targets=3,1 token=5"), Some((c, 5)));
        assert_eq!(
            parse_layout("pharos-layout v2 oid=7 stripe_size=4096 targets=3,1 component_size=4096 perf=1"),
            None
        );
        assert_eq!(parse_layout("pharos-layout v3 oid=7 stripe_size=4096 targets=3,1"), None);
    }
}
