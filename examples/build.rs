//! Compiles the examples' kernels: one container with the host shared object (what the host
//! device runs), and one with host bitcode only (the bitcode example: the JIT compiles it for
//! the exact CPU). Add `.target(Target::Nvptx("sm_90".into()))` or
//! `.target(Target::Amdgcn("gfx90a".into()))` for GPUs: the runtime picks per device.

use offload_build::{Build, Target};

fn main() {
    Build::new()
        .file("kernels/examples.c")
        .target(Target::Host)
        .compile("examples")
        .unwrap_or_else(|e| panic!("{e}"));
    Build::new()
        .file("kernels/examples.c")
        .target(Target::HostBitcode)
        .compile("examples_bitcode")
        .unwrap_or_else(|e| panic!("{e}"));
}
