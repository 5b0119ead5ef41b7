//! Authentication of the forwarding layer (issue 14, item 3): the site key, the connection
//! handshake, the capabilities the daemon issues at open/create, and the admin token.
//!
//! * **Site key**: a secret file (at least [`MIN_SECRET`] bytes after trimming whitespace,
//!   e.g. `openssl rand -hex 32`) that every `pharos-fwd` and `pharos-mount` of a site holds,
//!   readable by root only ([`read_secret_file`] refuses a file group or others may read).
//!   Two keys are derived from it ([`SiteKey::new`]): one for the handshake, one for
//!   capabilities, so a value computed for one purpose is never valid for the other.
//! * **Handshake** (mutual, challenge-response, HMAC-SHA256): the daemon speaks first with a
//!   32-byte random nonce `s` ([`crate::Body::Challenge`]); the client answers with its own
//!   nonce `c` and `HMAC(k_conn, "client" | s | c)` ([`crate::Op::Auth`]); the daemon checks it
//!   (constant time) and answers `HMAC(k_conn, "server" | s | c)` ([`crate::Body::Authed`]),
//!   which the client checks in turn. Fresh nonces on both sides: a recorded handshake is
//!   worth nothing on another connection. Only then does the daemon serve requests.
//! * **Capabilities** ([`Cap`]): at open/create the daemon returns the file's layout, the open
//!   handle and the rights of the open (read, write), with `HMAC(k_cap, fields)`. Read, Write,
//!   Fsync, Release, KillSuidgid and a Setattr through an open file carry it back; the daemon
//!   recomputes the HMAC (one per request) before it touches an object. Every daemon of the site
//!   derives the same `k_cap`, so a capability survives failover to another daemon.
//! * **Admin token** ([`AdminToken`]): a second secret file (the control loop's), sent as
//!   `Authorization: Bearer <token>` to the daemons' and mounts' admin HTTP interfaces.
use std::path::Path;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::{Cap, Layout, OpenHandle};

type HmacSha256 = Hmac<Sha256>;

/// Length of nonces and MACs, bytes.
pub const TAG_LEN: usize = 32;
/// A handshake nonce: random bytes, one per side and connection.
pub type Nonce = [u8; TAG_LEN];
/// An HMAC-SHA256 tag (handshake proofs, capability MACs).
pub type Tag = [u8; TAG_LEN];

/// Shortest secret accepted from a key or token file, bytes (after trimming whitespace).
pub const MIN_SECRET: usize = 32;

/// Reads a secret from `path`: the file's content without surrounding whitespace. Refused
/// (with a one-line reason) when it is not a regular file, when group or others have any
/// permission on it (`chmod 600`, as ssh does for private keys), or when it is shorter than
/// [`MIN_SECRET`] bytes.
pub fn read_secret_file(path: &Path) -> Result<Vec<u8>, String> {
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;
    let what = path.display();
    let f = std::fs::File::open(path).map_err(|e| format!("{what}: {e}"))?;
    let md = f.metadata().map_err(|e| format!("{what}: {e}"))?;
    if !md.is_file() {
        return Err(format!("{what}: not a regular file"));
    }
    if md.mode() & 0o077 != 0 {
        return Err(format!(
            "{what}: mode {:03o}: group and others must have no access (chmod 600)",
            md.mode() & 0o777
        ));
    }
    let mut buf = Vec::new();
    f.take(64 << 10).read_to_end(&mut buf).map_err(|e| format!("{what}: {e}"))?;
    let s = buf.trim_ascii();
    if s.len() < MIN_SECRET {
        return Err(format!("{what}: {} bytes, at least {MIN_SECRET} needed (e.g. openssl rand -hex 32)", s.len()));
    }
    Ok(s.to_vec())
}

/// `n` bytes from the kernel's random source.
pub fn random_bytes<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    let mut got = 0;
    while got < N {
        // SAFETY: writes at most N - got bytes into the array from offset got.
        let n = unsafe { libc::getrandom(b.as_mut_ptr().add(got) as *mut libc::c_void, N - got, 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            assert_eq!(e.kind(), std::io::ErrorKind::Interrupted, "getrandom: {e}");
            continue;
        }
        got += n as usize;
    }
    b
}

/// The keys derived from a site's secret (see the module docs). Holds keyed HMAC states, so a
/// MAC costs no key schedule. Never printed.
#[derive(Clone)]
pub struct SiteKey {
    conn: HmacSha256,
    cap: HmacSha256,
}

fn keyed(key: &[u8]) -> HmacSha256 {
    HmacSha256::new_from_slice(key).expect("HMAC takes keys of any length")
}

impl SiteKey {
    /// Derives the handshake and capability keys from `secret`: `HMAC(secret, label)` for the
    /// labels `pharos-fwd v5 connection` and `pharos-fwd v5 capability`.
    pub fn new(secret: &[u8]) -> SiteKey {
        let sub = |label: &[u8]| {
            let mut m = keyed(secret);
            m.update(label);
            keyed(&m.finalize().into_bytes())
        };
        SiteKey { conn: sub(b"pharos-fwd v5 connection"), cap: sub(b"pharos-fwd v5 capability") }
    }

    /// The site key in `path` (see [`read_secret_file`]).
    pub fn from_file(path: &Path) -> Result<SiteKey, String> {
        read_secret_file(path).map(|s| SiteKey::new(&s))
    }

    fn proof_mac(&self, side: &[u8], server: &Nonce, client: &Nonce) -> HmacSha256 {
        let mut m = self.conn.clone();
        m.update(side);
        m.update(server);
        m.update(client);
        m
    }

    /// What the client sends: `HMAC(k_conn, "client" | server nonce | client nonce)`.
    pub fn client_proof(&self, server: &Nonce, client: &Nonce) -> Tag {
        self.proof_mac(b"client", server, client).finalize().into_bytes().into()
    }

    /// What the daemon answers: `HMAC(k_conn, "server" | server nonce | client nonce)`.
    pub fn server_proof(&self, server: &Nonce, client: &Nonce) -> Tag {
        self.proof_mac(b"server", server, client).finalize().into_bytes().into()
    }

    /// Checks a client's proof (constant time).
    pub fn check_client_proof(&self, server: &Nonce, client: &Nonce, proof: &Tag) -> bool {
        self.proof_mac(b"client", server, client).verify_slice(proof).is_ok()
    }

    /// Checks a daemon's proof (constant time).
    pub fn check_server_proof(&self, server: &Nonce, client: &Nonce, proof: &Tag) -> bool {
        self.proof_mac(b"server", server, client).verify_slice(proof).is_ok()
    }

    /// The HMAC over every field of a capability but the MAC itself, each fixed-width little
    /// endian, lists with their length first, floats as their bits.
    fn cap_mac(&self, layout: &Layout, handle: OpenHandle, rights: u8) -> HmacSha256 {
        let mut m = self.cap.clone();
        m.update(&layout.oid.to_le_bytes());
        m.update(&layout.stripe_size.to_le_bytes());
        m.update(&(layout.targets.len() as u64).to_le_bytes());
        for t in &layout.targets {
            m.update(&t.to_le_bytes());
        }
        m.update(&layout.component_size.to_le_bytes());
        m.update(&(layout.perf.len() as u64).to_le_bytes());
        for p in &layout.perf {
            m.update(&p.to_bits().to_le_bytes());
        }
        m.update(&handle.daemon.to_le_bytes());
        m.update(&handle.id.to_le_bytes());
        m.update(&[rights]);
        m
    }

    /// A capability for open `handle` of the file with `layout`, with `rights`
    /// ([`Cap::READ`] | [`Cap::WRITE`]).
    pub fn sign(&self, layout: Layout, handle: OpenHandle, rights: u8) -> Cap {
        let mac = self.cap_mac(&layout, handle, rights).finalize().into_bytes().into();
        Cap { layout, handle, rights, mac }
    }

    /// True when `cap` was issued with this key exactly as it is (constant-time compare).
    pub fn verify(&self, cap: &Cap) -> bool {
        self.cap_mac(&cap.layout, cap.handle, cap.rights).verify_slice(&cap.mac).is_ok()
    }
}

/// The admin credential of the daemons' and mounts' admin HTTP interfaces.
pub struct AdminToken(Vec<u8>);

impl AdminToken {
    /// The token `token` (its bytes as given: no trimming, no length check).
    pub fn new(token: &[u8]) -> AdminToken {
        AdminToken(token.to_vec())
    }

    /// The token in `path` (see [`read_secret_file`]).
    pub fn from_file(path: &Path) -> Result<AdminToken, String> {
        read_secret_file(path).map(AdminToken)
    }

    /// True when `authorization` (an HTTP `Authorization` header value) is `Bearer <token>`;
    /// the token is compared in constant time.
    pub fn check(&self, authorization: Option<&[u8]>) -> bool {
        let Some(given) = authorization.and_then(|h| h.strip_prefix(b"Bearer ")) else { return false };
        let given = given.trim_ascii();
        if given.len() != self.0.len() {
            return false;
        }
        let diff = given.iter().zip(&self.0).fold(0u8, |acc, (a, b)| acc | (a ^ b));
        std::hint::black_box(diff) == 0
    }
}

/// The rule of the daemons' and mounts' admin HTTP interfaces: `GET /status` (liveness and
/// counters) and `GET /metrics` (the same counters for Prometheus) are open; every other
/// request needs `Authorization: Bearer <admin token>`.
/// `None` = allowed; else the HTTP status and a message: 401 for a missing or wrong token,
/// 403 when the process has no admin token configured (then only those two answer).
pub fn admin_refusal(
    token: Option<&AdminToken>,
    method: &str,
    path: &str,
    authorization: Option<&[u8]>,
) -> Option<(u16, &'static str)> {
    if matches!(method, "GET" | "HEAD") && matches!(path, "/status" | "/metrics") {
        return None;
    }
    match token {
        None => Some((403, "no admin token configured (--admin-token-file): only GET /status and /metrics are served")),
        Some(t) if t.check(authorization) => None,
        Some(_) => Some((401, "admin token required: Authorization: Bearer <token>")),
    }
}

/// [`admin_refusal`] as an axum middleware body: the request goes on, or gets the refusal
/// (JSON `{"error": ...}`, `WWW-Authenticate: Bearer`).
#[cfg(feature = "admin-http")]
pub async fn admin_guard(
    token: Option<&AdminToken>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::http::{header, StatusCode};
    use axum::response::IntoResponse;
    let auth = req.headers().get(header::AUTHORIZATION).map(|v| v.as_bytes());
    match admin_refusal(token, req.method().as_str(), req.uri().path(), auth) {
        None => next.run(req).await,
        Some((code, msg)) => {
            let code = StatusCode::from_u16(code).unwrap_or(StatusCode::FORBIDDEN);
            let headers = [(header::WWW_AUTHENTICATE, "Bearer"), (header::CONTENT_TYPE, "application/json")];
            (code, headers, format!("{{\"error\": \"{msg}\"}}")).into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> Layout {
        Layout { oid: 0x1234, stripe_size: 1 << 20, targets: vec![1, 3], component_size: 0, perf: vec![] }
    }

    #[test]
    fn capabilities_verify_only_unaltered_and_with_the_same_key() {
        let k = SiteKey::new(b"0123456789abcdef0123456789abcdef");
        let h = OpenHandle { daemon: 7, id: 9 };
        let cap = k.sign(layout(), h, Cap::READ);
        assert!(k.verify(&cap));
        // Another daemon of the site (same secret) accepts it: failover keeps working.
        assert!(SiteKey::new(b"0123456789abcdef0123456789abcdef").verify(&cap));
        // Another site's key does not.
        assert!(!SiteKey::new(b"0123456789abcdef0123456789abcdeX").verify(&cap));
        // Every field is covered: change any and the MAC no longer matches.
        let mut alts: Vec<Cap> = Vec::new();
        let mut c = cap.clone();
        c.layout.oid += 1;
        alts.push(c);
        let mut c = cap.clone();
        c.layout.stripe_size = 4096;
        alts.push(c);
        let mut c = cap.clone();
        c.layout.targets = vec![1, 2];
        alts.push(c);
        let mut c = cap.clone();
        c.layout.targets.push(4);
        alts.push(c);
        let mut c = cap.clone();
        c.layout.component_size = 1 << 22;
        alts.push(c);
        let mut c = cap.clone();
        c.layout.perf = vec![0.0, 0.0];
        alts.push(c);
        let mut c = cap.clone();
        c.handle.id += 1;
        alts.push(c);
        let mut c = cap.clone();
        c.handle.daemon ^= 1;
        alts.push(c);
        let mut c = cap.clone();
        c.rights |= Cap::WRITE;
        alts.push(c);
        let mut c = cap.clone();
        c.mac[31] ^= 1;
        alts.push(c);
        for (i, c) in alts.iter().enumerate() {
            assert!(!k.verify(c), "altered capability {i} accepted: {c:?}");
        }
        // A made-up capability (all-zero or random MAC) is refused.
        assert!(!k.verify(&Cap { mac: [0; 32], ..cap.clone() }));
        assert!(!k.verify(&Cap { mac: random_bytes(), ..cap }));
    }

    #[test]
    fn handshake_proofs_are_bound_to_side_nonces_and_key() {
        let k = SiteKey::new(&[5u8; 40]);
        let (s, c) = (random_bytes::<32>(), random_bytes::<32>());
        assert_ne!(s, c);
        let p = k.client_proof(&s, &c);
        assert!(k.check_client_proof(&s, &c, &p));
        // Not the daemon's answer, not for other nonces, not under another key.
        assert!(!k.check_server_proof(&s, &c, &p));
        assert!(!k.check_client_proof(&c, &s, &p));
        assert!(!k.check_client_proof(&s, &random_bytes(), &p));
        assert!(!SiteKey::new(&[6u8; 40]).check_client_proof(&s, &c, &p));
        assert!(k.check_server_proof(&s, &c, &k.server_proof(&s, &c)));
        // Handshake and capability keys differ (derived with different labels).
        let cap = k.sign(layout(), OpenHandle::default(), Cap::READ | Cap::WRITE);
        assert_ne!(cap.mac, k.client_proof(&s, &c));
    }

    #[test]
    fn secret_files_must_be_private_and_long_enough() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile_dir();
        let p = d.join("key");
        std::fs::write(&p, format!("{}\n", "ab".repeat(32))).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read_secret_file(&p).unwrap(), "ab".repeat(32).into_bytes());
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o640)).unwrap();
        assert!(read_secret_file(&p).unwrap_err().contains("chmod 600"));
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o604)).unwrap();
        assert!(read_secret_file(&p).is_err());
        std::fs::write(&p, "short\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(read_secret_file(&p).unwrap_err().contains("at least 32"));
        assert!(read_secret_file(&d.join("missing")).is_err());
        assert!(read_secret_file(&d).is_err());
        std::fs::remove_dir_all(&d).unwrap();
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("pharos-auth-test-{:016x}", u64::from_le_bytes(random_bytes())));
        std::fs::create_dir(&d).unwrap();
        d
    }

    #[test]
    fn admin_token_needs_the_exact_bearer_value() {
        let t = AdminToken::new(b"s3cr3t-token-of-enough-length-000");
        assert!(t.check(Some(b"Bearer s3cr3t-token-of-enough-length-000")));
        assert!(!t.check(None));
        assert!(!t.check(Some(b"s3cr3t-token-of-enough-length-000")));
        assert!(!t.check(Some(b"Bearer s3cr3t-token-of-enough-length-001")));
        assert!(!t.check(Some(b"Bearer s3cr3t")));
        assert!(!t.check(Some(b"Basic s3cr3t-token-of-enough-length-000")));
        let ok = Some(&b"Bearer s3cr3t-token-of-enough-length-000"[..]);
        assert_eq!(admin_refusal(Some(&t), "GET", "/status", None), None);
        assert_eq!(admin_refusal(None, "GET", "/status", None), None);
        assert_eq!(admin_refusal(Some(&t), "PUT", "/placement", None).unwrap().0, 401);
        assert_eq!(admin_refusal(Some(&t), "GET", "/mapping", Some(b"Bearer nope")).unwrap().0, 401);
        assert_eq!(admin_refusal(Some(&t), "PUT", "/status", None).unwrap().0, 401);
        assert_eq!(admin_refusal(Some(&t), "PUT", "/targets/ost0", ok), None);
        assert_eq!(admin_refusal(None, "PUT", "/targets/ost0", ok).unwrap().0, 403);
    }
}
