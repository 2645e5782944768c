#!/usr/bin/env bash
# The CUDA backend's GPU check: every test kernel (saxpy, 2-D stencil, the 16-argument kernel,
# atomics, 3-D ids) from cubin, PTX, fatbin and bitcode images on the first CUDA device, each
# result compared bit for bit with the host plugin's; then the launch overhead against a raw
# cudarc launch and the JIT times. Well under 5 minutes on an H200 once prepared.
#
#   scripts/gpu-check-cuda.sh prepare   on a machine like CI's (Debian 12, the build tools):
#                                       builds in release and packs everything into .gpu-check/
#   scripts/gpu-check-cuda.sh run       on the GPU machine: needs only the NVIDIA driver and
#                                       .gpu-check/ (no Rust, no LLVM install, no network)
#   scripts/gpu-check-cuda.sh           both, on a machine that has the GPU and the build tools
#
# .gpu-check/ (about 50 MB, under the device tool's 64 MiB carry limit) holds the offload
# binary, its plugins, the JIT worker and the check binary (stripped), the prepared images, and
# the shared libraries the JIT worker needs that a CUDA machine may lack (libLLVM 19 and what it
# links), compressed. ptxas is the GPU machine's own (PATH or /usr/local/cuda); without one,
# bitcode goes to the driver's JIT and `offload info` says so. With the device tool:
#   run(command="scripts/gpu-check-cuda.sh run 2>&1 | tee $OUT/gpu-check.log", carry=[".gpu-check"])
# Its output is recorded in docs/gpu-checks.md.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
pack=$root/.gpu-check

prepare() {
  scripts/setup.sh
  export PATH="$root/.tools/cuda/nvidia/cuda_nvcc/bin:$PATH"
  echo "== building (release)"
  cargo build --release --workspace --quiet
  rm -rf "$pack"
  mkdir -p "$pack/bin" "$pack/images"
  for f in offload offload-jit-worker cuda-gpu-check liboffload_plugin_cuda.so liboffload_plugin_host.so; do
    strip -o "$pack/bin/$f" "target/release/$f"
  done
  echo "== preparing images"
  target/release/cuda-gpu-check prepare "$pack/images"
  echo "== packing the JIT worker's libraries"
  # Every library the worker links that is not part of the C runtime every Linux has.
  ldd target/release/offload-jit-worker | awk '/=> \//{print $3}' \
    | grep -vE '/(libc|libm|libgcc_s|libstdc\+\+|libpthread|libdl|librt|ld-linux[^/]*)\.so' \
    | sed 's|^/||' | XZ_OPT=-9 tar -cJf "$pack/libs.tar.xz" -C / --dereference --transform 's|.*/||' -T -
  du -sh "$pack"
  echo "prepared $pack: copy it to the GPU machine (or carry it) and run: scripts/gpu-check-cuda.sh run"
}

run() {
  [ -x "$pack/bin/cuda-gpu-check" ] || { echo "no $pack: run scripts/gpu-check-cuda.sh prepare first" >&2; exit 2; }
  libs=$(mktemp -d)
  trap 'rm -rf "$libs"' EXIT
  tar -xJf "$pack/libs.tar.xz" -C "$libs"
  export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export PATH="$pack/bin:$PATH:/usr/local/cuda/bin"
  unset OFFLOAD_PLUGIN_PATH OFFLOAD_PLUGINS
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  echo "== offload info"
  "$pack/bin/offload" info
  echo "== kernels against the host, launch overhead, JIT times"
  time "$pack/bin/cuda-gpu-check" run "$pack/images"
}

case "${1:-all}" in
  prepare) prepare ;;
  run) run ;;
  all) prepare; run ;;
  *) echo "usage: scripts/gpu-check-cuda.sh [prepare|run]" >&2; exit 2 ;;
esac
