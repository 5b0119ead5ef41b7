//! Builds the kernel side: dumps vmlinux.h from the running kernel's BTF (bpftool) into
//! OUT_DIR, compiles src/bpf/iotrace.bpf.c with clang and generates the libbpf-rs skeleton
//! (OUT_DIR/iotrace.skel.rs).
use std::{env, path::PathBuf, process::Command};

use libbpf_cargo::SkeletonBuilder;

const SRC: &str = "src/bpf/iotrace.bpf.c";
const BTF: &str = "/sys/kernel/btf/vmlinux";

fn main() {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));
    let vmlinux = out.join("vmlinux.h");
    // PHAROS_VMLINUX_H lets cross builds point at a pre-generated header.
    if let Some(given) = env::var_os("PHAROS_VMLINUX_H") {
        std::fs::copy(&given, &vmlinux).expect("copy PHAROS_VMLINUX_H");
    } else {
        let dump = Command::new("bpftool")
            .args(["btf", "dump", "file", BTF, "format", "c"])
            .output()
            .expect("bpftool not found: install bpftool or set PHAROS_VMLINUX_H");
        assert!(dump.status.success(), "bpftool btf dump failed: {}", String::from_utf8_lossy(&dump.stderr));
        std::fs::write(&vmlinux, dump.stdout).expect("write vmlinux.h");
    }
    let arch = match env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default().as_str() {
        "x86_64" => "x86",
        "aarch64" => "arm64",
        "riscv64" => "riscv",
        "powerpc64" => "powerpc",
        "s390x" => "s390",
        other => panic!("unsupported target arch {other}"),
    };
    SkeletonBuilder::new()
        .source(SRC)
        .clang_args([
            format!("-I{}", out.display()),
            "-Isrc/bpf".to_string(),
            format!("-D__TARGET_ARCH_{arch}"),
            "-mcpu=v3".to_string(),
            "-Wall".to_string(),
            "-Wno-unused-function".to_string(),
        ])
        .build_and_generate(out.join("iotrace.skel.rs"))
        .expect("building the BPF skeleton failed");
    println!("cargo:rerun-if-changed={SRC}");
    // iotrace.bpf.c includes iotrace.h and its parts iotrace_*.bpf.h: the whole directory
    println!("cargo:rerun-if-changed=src/bpf");
    println!("cargo:rerun-if-env-changed=PHAROS_VMLINUX_H");
}
