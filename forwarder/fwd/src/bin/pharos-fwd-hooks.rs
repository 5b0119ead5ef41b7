//! `pharos-fwd-hooks`: `pharos-fwd` built with the `test-hooks` feature (test-only fault
//! injection, forwarder/README.md "Faults in the request path"). Only the tests run it.
#[path = "../main.rs"]
mod daemon;

fn main() {
    daemon::main()
}
