//! Pharos wire contract v1: the Rust types generated from `proto/pharos/v1/io.proto`
//! (prost, with canonical protobuf-JSON serde impls from pbjson) and [`sink`], the bounded
//! batching Kafka producer shared by the eBPF agent and the forwarding daemon.

/// Generated from `proto/pharos/v1/io.proto` (package `pharos.v1`).
pub mod v1 {
    include!(concat!(env!("OUT_DIR"), "/pharos.v1.rs"));
    include!(concat!(env!("OUT_DIR"), "/pharos.v1.serde.rs"));
}

pub mod sink;

pub use v1::{DropCounters, FileType, IoBatch, IoRecord, JobEvent, Layer, Op};

/// Value of `schema_version` in every message this crate produces.
pub const SCHEMA_VERSION: u32 = 1;
