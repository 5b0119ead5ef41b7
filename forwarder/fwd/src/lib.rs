//! Pharos forwarding daemon (`pharos-fwd`): storage-target backend ([`backend`], [`shm`]),
//! namespace system calls and caller credentials ([`nsfs`]), request path ([`server`]), instrumentation ([`records`], [`metrics`], [`clock`]) and the admin HTTP
//! interface ([`admin`]). See forwarder/README.md.
pub mod admin;
pub mod backend;
pub mod clock;
pub mod metrics;
pub mod nsfs;
pub mod records;
pub mod server;
pub mod shm;
