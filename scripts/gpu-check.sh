#!/usr/bin/env bash
# The GPU checks: every test kernel (saxpy, 2-D stencil, the 16-argument kernel, atomics, 3-D
# ids, a block reduction with barriers, a block scan in dynamic shared memory, a tiled matrix
# product with static tiles and with static + dynamic over 48 KiB, a reversal through 64 KiB of
# dynamic shared memory, 96 KiB asked for) from each image kind the backend loads, on its first
# GPU, each result compared bit for bit with the host plugin's; then overlapping device copies,
# queued work from three threads on two queues each (every read checked), events and their
# timing, a global, host and shared memory as kernel arguments, a kernel that faults (in its own
# process), and (cuda) the launch overhead against a raw cudarc launch, and the JIT times. Well
# under 5 minutes on a data-centre GPU once prepared. Exits non-zero on any mismatch or failure
# and writes one JSON summary (OFFLOAD_GPU_CHECK_JSON, default .gpu-check/BACKEND/summary.json).
#
#   scripts/gpu-check.sh BACKEND prepare   on a machine like CI's (Debian 12, the build tools):
#                                          builds in release and packs .gpu-check/BACKEND/
#   scripts/gpu-check.sh BACKEND run       on the GPU machine: needs only the GPU's driver
#                                          (NVIDIA driver / ROCm kernel driver + libhsa-runtime64)
#                                          and .gpu-check/BACKEND/: no Rust, no LLVM, no network
#   scripts/gpu-check.sh BACKEND           both, where the GPU and the build tools are together
#   scripts/gpu-check.sh BACKEND dry-run   here, without a GPU: the debug build against the fake
#                                          driver (tests/fake-cuda) or runtime (tests/fake-hsa);
#                                          every step runs, results of kernels the fake does not
#                                          compute are not compared (the test suite runs this)
#
# BACKEND is cuda, amdgpu or level-zero (Intel GPUs: SPIR-V from tests/spirv, run through the
# machine's Level Zero loader and GPU driver; its dry run uses tests/fake-level-zero through the
# real loader, Debian's libze1). The pack (about 50 MB, under the device tool's 64 MiB carry limit)
# holds the offload binary, its plugins, the JIT worker and the check binary (stripped), the
# prepared images, and the shared libraries the JIT worker needs that a GPU machine may lack
# (libLLVM 19 and what it links), compressed; for amdgpu also ld.lld. cuda uses the GPU
# machine's own ptxas (PATH or /usr/local/cuda): without one, bitcode goes to the driver's JIT
# and `offload info` says so. amdgpu images are prepared for the processors in
# OFFLOAD_GPU_CHECK_PROCESSORS (comma-separated; default gfx908,gfx90a,gfx942,gfx1030,gfx1100).
# With this workplace's device tool:
#   run(command="set -o pipefail; OFFLOAD_GPU_CHECK_JSON=$OUT/summary.json scripts/gpu-check.sh cuda run 2>&1 | tee $OUT/gpu-check.log", carry=[".gpu-check/cuda"])
#   (one backend per call: each pack is about 50 MB; pipefail keeps the check's status through tee)
# Results are recorded in docs/cuda.md and docs/amdgpu.md.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
backend=${1:-}
case "$backend" in
  cuda|amdgpu|level-zero) ;;
  *) echo "usage: scripts/gpu-check.sh cuda|amdgpu|level-zero [prepare|run|dry-run]" >&2; exit 2 ;;
esac
pack=$root/.gpu-check/$backend
# The plugin library's file name (cargo writes underscores).
plugin_file=liboffload_plugin_${backend//-/_}.so

prepare() {
  scripts/setup.sh
  export PATH="$root/.tools/cuda/nvidia/cuda_nvcc/bin:$PATH"
  echo "== building (release)"
  cargo build --release --workspace --quiet
  rm -rf "$pack"
  mkdir -p "$pack/bin" "$pack/images"
  for f in offload offload-jit-worker offload-dlopen-probe "$backend-gpu-check" "$plugin_file" liboffload_plugin_host.so; do
    strip -o "$pack/bin/$f" "target/release/$f"
  done
  local bins=(target/release/offload-jit-worker)
  if [ "$backend" = amdgpu ]; then
    # lld chooses its flavour by the name it is called by.
    cp /usr/lib/llvm-19/bin/lld "$pack/bin/ld.lld"
    bins+=(/usr/lib/llvm-19/bin/lld)
  fi
  echo "== preparing images"
  case "$backend" in
    amdgpu) target/release/amdgpu-gpu-check prepare "$pack/images" "${OFFLOAD_GPU_CHECK_PROCESSORS:-gfx908,gfx90a,gfx942,gfx1030,gfx1100}" ;;
    *) target/release/$backend-gpu-check prepare "$pack/images" ;;
  esac
  echo "== packing the libraries the JIT worker needs"
  # Every library they link that is not part of the C runtime every Linux has.
  ldd "${bins[@]}" | awk '/=> \//{print $3}' | awk -F/ '!seen[$NF]++' \
    | grep -vE '/(libc|libm|libgcc_s|libstdc\+\+|libpthread|libdl|librt|ld-linux[^/]*)\.so' \
    | sed 's|^/||' | XZ_OPT=-9 tar -cJf "$pack/libs.tar.xz" -C / --dereference --transform 's|.*/||' -T -
  du -sh "$pack"
  echo "prepared $pack: copy .gpu-check/ to the GPU machine (or carry it) and run: scripts/gpu-check.sh $backend run"
}

run() {
  [ -x "$pack/bin/$backend-gpu-check" ] || { echo "no $pack: run scripts/gpu-check.sh $backend prepare first" >&2; exit 2; }
  libs=$(mktemp -d)
  trap 'rm -rf "$libs"' EXIT
  tar -xJf "$pack/libs.tar.xz" -C "$libs"
  export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export PATH="$pack/bin:$PATH:/usr/local/cuda/bin"
  [ -x "$pack/bin/ld.lld" ] && export OFFLOAD_LLD="$pack/bin/ld.lld"
  unset OFFLOAD_PLUGIN_PATH OFFLOAD_PLUGINS
  case "$backend" in
    cuda) command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true ;;
    amdgpu) command -v rocminfo >/dev/null && rocminfo | grep -E '^\s+(Marketing Name|Name):\s+gfx' | head -4 || true ;;
    level-zero) command -v clinfo >/dev/null && clinfo -l || true ;;
  esac
  echo "== offload info"
  "$pack/bin/offload" info
  echo "== kernels against the host, launch overhead (cuda), JIT times (cuda, amdgpu)"
  time "$pack/bin/$backend-gpu-check" run "$pack/images"
}

dry_run() {
  local out=${OFFLOAD_GPU_CHECK_DRY_DIR:-$root/target/gpu-check-dry/$backend}
  local check=$root/target/debug/$backend-gpu-check
  [ -x "$check" ] || cargo build --workspace --quiet
  rm -rf "$out"
  mkdir -p "$out/images"
  export PATH="$root/.tools/cuda/nvidia/cuda_nvcc/bin:$PATH"
  echo "== preparing images (debug build)"
  export OFFLOAD_GPU_CHECK_DRY_RUN=1 OFFLOAD_GPU_CHECK_JSON=$out/summary.json
  if [ "$backend" = level-zero ]; then
    "$check" prepare "$out/images"
    clang-19 -shared -fPIC -O1 -Wall -Werror -pthread -fvisibility=hidden tests/fake-level-zero/fake_ze.c -o "$out/libze_fake.so"
    export ZE_ENABLE_ALT_DRIVERS=$out/libze_fake.so FAKE_ZE_LOG=$out/driver.log
    echo "== the check against the fake driver, through the real Level Zero loader"
    "$check" run "$out/images"
  elif [ "$backend" = cuda ]; then
    "$check" prepare "$out/images"
    clang-19 -shared -fPIC -O1 -Wall -Werror -pthread tests/fake-cuda/fake_cuda.c -o "$out/libcuda_fake.so"
    # heavy: the thread limit its registers give it with ptxas 12.9 on sm_90 (130 registers).
    export OFFLOAD_CUDA_DRIVER=$out/libcuda_fake.so FAKE_CUDA_LOG=$out/driver.log FAKE_CUDA_FAULT=fault:700 \
      FAKE_CUDA_KERNEL_LIMITS=heavy:448:0
    echo "== the check against the fake driver"
    "$check" run "$out/images" 200
  else
    "$check" prepare "$out/images" gfx90a
    clang-19 -shared -fPIC -O1 -Wall -Werror -pthread -I/usr/include/hsa tests/fake-hsa/fake_hsa.c -o "$out/libhsa_fake.so"
    export OFFLOAD_HSA_RUNTIME=$out/libhsa_fake.so FAKE_HSA_LOG=$out/runtime.log FAKE_HSA_FAULT=fault:memory
    echo "== the check against the fake runtime"
    "$check" run "$out/images"
  fi
}

case "${2:-all}" in
  prepare) prepare ;;
  run) run ;;
  all) prepare; run ;;
  dry-run) dry_run ;;
  *) echo "usage: scripts/gpu-check.sh cuda|amdgpu|level-zero [prepare|run|dry-run]" >&2; exit 2 ;;
esac
