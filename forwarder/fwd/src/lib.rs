//! Pharos forwarding daemon (`pharos-fwd`): storage-target backend ([`backend`], [`shm`]),
//! request path ([`server`]), instrumentation ([`records`], [`metrics`]) and the admin HTTP
//! interface ([`admin`]). See forwarder/README.md.
pub mod admin;
pub mod backend;
pub mod metrics;
pub mod records;
pub mod server;
pub mod shm;
