//! Wall-clock time stamps: arrival times of requests, creation times of metrics batches,
//! producer ids. Its own module so that the request path ([`crate::server`]) and the
//! metrics ([`crate::metrics`]) both use it without importing each other.
use std::time::{SystemTime, UNIX_EPOCH};

/// Nanoseconds since the Unix epoch (0 if the clock is before it).
pub fn wall_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}
