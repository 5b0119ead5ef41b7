//! Generates the Rust types of `proto/pharos/v1/io.proto` (prost) and their canonical
//! protobuf-JSON serde impls (pbjson, original field names) into OUT_DIR.
//! Needs `protoc` on PATH (or PROTOC set).
use std::{env, path::PathBuf};

fn main() {
    let root = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap()).join("..");
    let proto = root.join("pharos/v1/io.proto");
    let include = root.clone();
    println!("cargo:rerun-if-changed={}", proto.display());
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    let descriptor = out.join("pharos_descriptor.bin");
    prost_build::Config::new()
        .file_descriptor_set_path(&descriptor)
        .compile_well_known_types()
        .compile_protos(&[&proto], &[&include])
        .expect("protoc/prost-build failed on proto/pharos/v1/io.proto");
    let set = std::fs::read(&descriptor).unwrap();
    pbjson_build::Builder::new()
        .register_descriptors(&set)
        .unwrap()
        .preserve_proto_field_names()
        .build(&[".pharos.v1"])
        .expect("pbjson-build failed");
}
