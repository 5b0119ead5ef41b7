//! What both daemons, `pharos-fwd` and `pharos-mount`, do the same way around their serving
//! loop: they stop cleanly on SIGTERM or SIGINT ([`term_flag`]), they tell whoever started
//! them that they serve, and where, by writing a ready file ([`write_ready_file`]), and they
//! end with exit status 2 and the error on stderr when they cannot start or serve
//! ([`exit_on_error`]).
use std::fmt::Display;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// A flag that SIGTERM and SIGINT set from now on, instead of ending the process: the serving
/// loop polls it and shuts down in order (flush, unmount). Errors: the handlers could not be
/// registered (`"signal handler: ..."`).
pub fn term_flag() -> Result<Arc<AtomicBool>, String> {
    let term = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, term.clone()).map_err(|e| format!("signal handler: {e}"))?;
    }
    Ok(term)
}

/// The ready file's text (see [`write_ready_file`]).
fn ready_text(fields: &[(&str, &dyn Display)]) -> String {
    let mut s = String::from("{");
    for (k, v) in fields {
        s.push_str(&format!("\"{k}\": \"{v}\", "));
    }
    s.push_str(&format!("\"pid\": {}}}\n", std::process::id()));
    s
}

/// Writes the ready file `path` (the daemon's `--ready-file`) once the daemon serves: one line
/// of JSON, `{"KEY": "VALUE", ..., "pid": PID}\n`, with `fields` in their order and `PID` this
/// process's id; whoever started the daemon waits for the file and reads the bound addresses
/// from it. Values are written as they display, unescaped (addresses and paths without `"`
/// or `\`). Errors: the write failed (`"--ready-file PATH: ..."`).
pub fn write_ready_file(path: &Path, fields: &[(&str, &dyn Display)]) -> Result<(), String> {
    std::fs::write(path, ready_text(fields)).map_err(|e| format!("--ready-file {}: {e}", path.display()))
}

/// Returns when `run` (the daemon's whole life) succeeded; else prints `NAME: error: MESSAGE`
/// on stderr and ends the process with exit status 2.
pub fn exit_on_error(name: &str, run: Result<(), String>) {
    if let Err(e) = run {
        eprintln!("{name}: error: {e}");
        std::process::exit(2);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering::Relaxed;

    #[test]
    fn ready_file_is_one_json_line() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("ready");
        let addr: std::net::SocketAddr = "127.0.0.1:7401".parse().unwrap();
        write_ready_file(&f, &[("listen", &"127.0.0.1:7400"), ("admin", &addr)]).unwrap();
        let want = format!(
            "{{\"listen\": \"127.0.0.1:7400\", \"admin\": \"127.0.0.1:7401\", \"pid\": {}}}\n",
            std::process::id()
        );
        assert_eq!(std::fs::read_to_string(&f).unwrap(), want);
        let e = write_ready_file(&dir.path().join("no/such/dir"), &[]).unwrap_err();
        assert!(e.starts_with("--ready-file "), "{e}");
    }

    #[test]
    fn sigterm_sets_the_flag() {
        let term = term_flag().unwrap();
        assert!(!term.load(Relaxed));
        // SAFETY: raise(3) with a signal whose handler is registered above.
        unsafe { libc::raise(libc::SIGTERM) };
        assert!(term.load(Relaxed));
    }
}
