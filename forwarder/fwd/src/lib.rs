//! Pharos forwarding daemon (`pharos-fwd`): storage-target backend ([`backend`], [`shm`]),
//! namespace system calls and caller credentials ([`nsfs`]), request path ([`server`]; its masters, queues and scheduler: [`masters`], [`queues`], [`raas`]), instrumentation ([`records`], [`metrics`], [`clock`], [`rx`]) and the admin HTTP
//! interface ([`admin`]). See forwarder/README.md.
pub mod admin;
pub mod backend;
pub mod clock;
pub mod masters;
pub mod metrics;
pub mod nsfs;
pub mod queues;
pub mod raas;
pub mod records;
pub mod rx;
pub mod server;
pub mod shm;
