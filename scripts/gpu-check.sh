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
#
# For cuda and amdgpu the check ends with its OpenMP part (omp_prepare / omp_run below):
# tests/omp/gpu_regions.c, tests/omp/gpu_nowait.c (`nowait` regions and a `depend` chain) and
# the OpenMP benchmark (tests/benches/peers/omp_bench.c, with a blocking / nowait pair) built by
# clang-19 for the GPU target, in JIT mode (as clang builds it with -nogpulib: only our library
# can run it, since upstream's JIT has no device runtime to link), in JIT mode with LLVM's device
# runtime linked by clang (both libraries can run it), and for amdgpu AOT; each run on our
# libomptarget.so.19.1 and on Debian's (packed beside it), with OMP_TARGET_OFFLOAD=MANDATORY,
# results checked by the programs, the benchmark's cases as ours / Debian's. Its lines start
# with "omp:"; docs/openmp.md has the figures. Then LLVM 19's offload/test suite for the GPU
# target (nvptx64 JIT mode; amdgcn JIT and AOT): compiled here by lit through scripts/lit-cc,
# which records each compile's output, and run there by lit with the recorded outputs in place
# of the compiler, on ours and on Debian's; OFFLOAD_GPU_CHECK_SUITE=0 leaves it out.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
backend=${1:-}
case "$backend" in
  cuda|amdgpu|level-zero) ;;
  *) echo "usage: scripts/gpu-check.sh cuda|amdgpu|level-zero [prepare|run|dry-run]" >&2; exit 2 ;;
esac
pack=$root/.gpu-check/$backend
# The AMD processors images are prepared for (OFFLOAD_GPU_CHECK_PROCESSORS), and clang's flags
# for them.
amd_processors() { echo "${OFFLOAD_GPU_CHECK_PROCESSORS:-gfx908,gfx90a,gfx942,gfx1030,gfx1100}"; }
amd_arch_flags() {
  local a
  for a in $(tr ',' ' ' <<<"$(amd_processors)"); do printf -- ' --offload-arch=%s' "$a"; done
}
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
    amdgpu) target/release/amdgpu-gpu-check prepare "$pack/images" "$(amd_processors)" ;;
    *) target/release/$backend-gpu-check prepare "$pack/images" ;;
  esac
  case "$backend" in cuda|amdgpu) omp_prepare ;; esac
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
  local rc=0
  time "$pack/bin/$backend-gpu-check" run "$pack/images" || rc=$?
  case "$backend" in cuda|amdgpu) omp_run "$pack/omp" || rc=1 ;; esac
  return $rc
}

# The clang-19 flags of the OpenMP programs for the backend's target (JIT mode compiles for the
# GPU found, so the architecture named here only has to exist).
omp_flags() {
  case "$backend" in
    cuda) echo "-fopenmp-targets=nvptx64-nvidia-cuda --offload-arch=sm_90 -nocudalib" ;;
    amdgpu) echo "-fopenmp-targets=amdgcn-amd-amdhsa --offload-arch=gfx90a -nogpulib" ;;
  esac
}

# omp_prepare [DIR]: the OpenMP programs, both libraries, libomp and the device runtimes.
omp_prepare() {
  local dir=${1:-$pack/omp} profile=${2:-release}
  local rtl=/usr/lib/llvm-19/lib/libomptarget.devicertl.a
  echo "== OpenMP programs for the GPU target (clang-19)"
  rm -rf "$dir"
  mkdir -p "$dir/ours" "$dir/debian" "$dir/rtl"
  local p name
  for p in tests/omp/gpu_regions.c tests/omp/gpu_nowait.c tests/benches/peers/omp_bench.c; do
    name=$(basename "$p" .c)
    # shellcheck disable=SC2046
    clang-19 -O2 -fopenmp $(omp_flags) -fopenmp-target-jit "$p" -o "$dir/$name-jit"
    # shellcheck disable=SC2046
    clang-19 -O2 -fopenmp $(omp_flags) -fopenmp-target-jit "$p" "$rtl" -o "$dir/$name-jit-rtl"
    if [ "$backend" = amdgpu ]; then
      # shellcheck disable=SC2046
      clang-19 -O2 -fopenmp -fopenmp-targets=amdgcn-amd-amdhsa -nogpulib $(amd_arch_flags) "$p" "$rtl" -o "$dir/$name-aot"
    fi
  done
  # Ours beside its plugins and JIT worker (it looks for them next to itself).
  # Stripped (15 MB to 1.7 MB in a release build): the pack travels to the GPU machine.
  strip -o "$dir/ours/libomptarget.so.19.1" "target/$profile/libomptarget.so"
  for f in "$plugin_file" liboffload_plugin_host.so offload-jit-worker offload-dlopen-probe; do
    strip -o "$dir/ours/$f" "target/$profile/$f"
  done
  cp -L /usr/lib/llvm-19/lib/libomptarget.so.19.1 "$dir/debian/"
  cp -L /usr/lib/llvm-19/lib/libomp.so.5 "$dir/"
  case "$backend" in
    cuda) cp /usr/lib/llvm-19/lib/libomptarget-nvptx-sm_*.bc "$dir/rtl/" ;;
    amdgpu) cp /usr/lib/llvm-19/lib/libomptarget-amdgpu-gfx*.bc "$dir/rtl/" ;;
  esac
  [ "${OFFLOAD_GPU_CHECK_SUITE:-1}" = 0 ] || suite_prepare "$dir"
  du -sh "$dir"
}

# omp_run DIR [dry]: each program on ours and on Debian's; the benchmark on both, alternating.
omp_run() {
  local dir=$1 dry=${2:-}
  local fails=0
  export OFFLOAD_OMP_DEVICE_RTL_DIR=$dir/rtl
  omp_one() { # LIBRARY PROGRAM -> prints the program's last line, returns its status
    LD_LIBRARY_PATH="$dir/$1:$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" OMP_TARGET_OFFLOAD=MANDATORY \
      LIBOMPTARGET_INFO=${omp_info:-16} timeout 300 "$dir/$2" "${@:3}"
  }
  echo "== OpenMP programs on ours and on Debian's"
  local lib prog out status kinds=(jit jit-rtl)
  [ "$backend" = amdgpu ] && kinds+=(aot)
  for lib in ours debian; do
    [ -n "$dry" ] && [ "$lib" = debian ] && continue
    for prog in "${kinds[@]/#/gpu_regions-}" "${kinds[@]/#/gpu_nowait-}"; do
      k=${prog##*-}
      [ "${prog%-rtl}" != "$prog" ] && k=jit-rtl
      [ -x "$dir/$prog" ] || continue
      status=0
      out=$(omp_one "$lib" "$prog" 2>"$dir/$lib-$prog.stderr") || status=$?
      grep -h 'Launching kernel' "$dir/$lib-$prog.stderr" | sed "s/^/omp: $lib $prog: /" || true
      if [ -n "$dry" ]; then
        # The fakes do not compute: the program must run and find the device.
        if [ "$status" -eq 0 ] && grep -q 'devices 1 ' <<<"$out"; then
          echo "omp: $lib $prog: ran (dry run: results not judged): $out"
        else
          echo "omp: $lib $prog: FAILED (status $status): $out"; tail -n 5 "$dir/$lib-$prog.stderr"; fails=$((fails + 1))
        fi
      elif [ "$status" -eq 0 ] && grep -q 'PASSED' <<<"$out"; then
        echo "omp: $lib $prog: passed: $out"
      elif [ "$lib" = debian ] && [ "$k" = jit ]; then
        echo "omp: $lib $prog: failed as expected (upstream's JIT cannot link the device runtime; status $status)"
      else
        echo "omp: $lib $prog: FAILED (status $status): $out"; tail -n 5 "$dir/$lib-$prog.stderr"; fails=$((fails + 1))
      fi
    done
  done
  if [ -z "$dry" ]; then
    echo "== OpenMP benchmark, ours / Debian's (omp_bench-jit-rtl, 3 rounds, alternating)"
    local r first second
    : >"$dir/bench.txt"
    for r in 1 2 3; do
      if [ $((r % 2)) -eq 1 ]; then first=ours; second=debian; else first=debian; second=ours; fi
      for lib in $first $second; do
        if ! omp_info=0 omp_one "$lib" omp_bench-jit-rtl 1 >"$dir/bench-$r-$lib.txt" 2>"$dir/bench-$r-$lib.stderr"; then
          echo "omp: bench round $r $lib FAILED"; tail -n 3 "$dir/bench-$r-$lib.stderr"; fails=$((fails + 1))
        fi
        sed "s/^/omp: bench round $r $lib /" "$dir/bench-$r-$lib.txt" >>"$dir/bench.txt"
      done
    done
    cat "$dir/bench.txt"
    python3 - "$dir/bench.txt" <<'PY' || true
import collections, statistics, sys
t = collections.defaultdict(lambda: collections.defaultdict(list))
for line in open(sys.argv[1]):
    w = line.split()
    if len(w) == 8 and w[5] == "case":
        t[w[6]][w[4]].append(float(w[7]))
for case, libs in t.items():
    if "ours" in libs and "debian" in libs:
        ratios = [o / d for o, d in zip(libs["ours"], libs["debian"])]
        print(f"omp: bench {case}: ours {statistics.median(libs['ours'])*1e6:.2f} us, Debian's "
              f"{statistics.median(libs['debian'])*1e6:.2f} us, ratio {statistics.median(ratios):.2f}x "
              f"(range {min(ratios):.2f}-{max(ratios):.2f})")
PY
  fi
  if [ "${OFFLOAD_GPU_CHECK_SUITE:-1}" != 0 ]; then
    echo "== LLVM 19's offload suite, ours and Debian's"
    suite_run "$dir" "$dry" || fails=$((fails + 1))
  fi
  echo "omp: $fails failure(s)"
  [ "$fails" -eq 0 ]
}

# The suite's builds: one (target, mode, flags) per line, for the backend.
suite_builds() {
  local first
  case "$backend" in
    cuda) echo "nvptx64-nvidia-cuda jit sm_90 -nocudalib --offload-arch=sm_90" ;;
    amdgpu)
      first=$(amd_processors)
      echo "amdgcn-amd-amdhsa jit ${first%%,*}$(amd_arch_flags)"
      echo "amdgcn-amd-amdhsa aot ${first%%,*}$(amd_arch_flags)"
      ;;
  esac
}

# suite_prepare DIR: LLVM 19's offload suite for the backend's target, compiled here (the GPU
# machine has no clang) by lit through scripts/lit-cc --record, with what running it there
# needs: the suite's sources, FileCheck and `not` (with a stand-in for the libz3 they link and
# never call), lit. OFFLOAD_GPU_CHECK_SUITE_TESTS (paths under offload/test) limits it.
suite_prepare() {
  local dir=$1 t=$1/suite target mode arch flags
  echo "== LLVM 19's offload suite for the GPU target (compiled here, run there)"
  rm -rf "$t" && mkdir -p "$t/tools"
  # shellcheck disable=SC2086
  while read -r target mode arch flags; do
    local m=()
    [ "$mode" = jit ] && m=(--jit)
    scripts/omp-conformance.sh --lib "$dir/debian" --target "$target" "${m[@]}" --flags "$flags" \
      --gpu-arch "$arch" --record "$t/store-$target-$mode" --out "$t/record-$target-$mode" \
      ${OFFLOAD_GPU_CHECK_SUITE_TESTS:-} | tail -n 1
    rm -rf "$t/record-$target-$mode"
    tar -cJf "$t/store-$target-$mode.tar.xz" -C "$t" "store-$target-$mode" && rm -rf "$t/store-$target-$mode"
  done < <(suite_builds)
  mkdir -p "$t/suite/offload"
  cp -r .tools/llvm-19-offload-test/offload/test "$t/suite/offload/"
  cp /usr/lib/llvm-19/bin/FileCheck /usr/lib/llvm-19/bin/not "$t/tools/"
  echo 'void offload_no_z3(void) {}' | clang-19 -x c -shared -fPIC -Wl,-soname,libz3.so.4 -o "$t/tools/libz3.so.4" -
  cp -r /usr/lib/llvm-19/build/utils/lit "$t/tools/lit"
  du -sh "$t"
}

# suite_run DIR [dry]: the recorded suite on ours and on Debian's, each build; then the tests
# Debian's passes and ours does not. Lines start with "omp: suite".
suite_run() {
  local dir=$1 dry=${2:-} t=$1/suite target mode arch flags lib fails=0
  [ -d "$t/tools" ] || { echo "omp: suite: not prepared"; return 0; }
  # lit passes the programs only the variables it knows, and those named here.
  local env="OFFLOAD_OMP_DEVICE_RTL_DIR=$dir/rtl" v
  for v in OFFLOAD_LLD OFFLOAD_PTXAS OFFLOAD_CUDA_DRIVER OFFLOAD_HSA_RUNTIME; do
    [ -n "${!v:-}" ] && env+=" $v=${!v}"
  done
  while read -r target mode arch flags; do
    local store=$t/store-$target-$mode
    [ -d "$store" ] || tar -xJf "$store.tar.xz" -C "$t"
    local m=()
    [ "$mode" = jit ] && m=(--jit)
    for lib in ours debian; do
      [ -n "$dry" ] && [ "$lib" = debian ] && continue
      # shellcheck disable=SC2086
      LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" CHECK_OPENMP_ENV="$env" \
        timeout 900 scripts/omp-conformance.sh --lib "$dir/$lib" --target "$target" "${m[@]}" \
        --flags "$flags" --gpu-arch "$arch" --replay "$store" --tools "$t/tools" --suite "$t/suite" \
        --out "$t/run-$lib-$target-$mode" ${OFFLOAD_GPU_CHECK_SUITE_TESTS:-} | tail -n 1 | sed "s/^omp-conformance:/omp: suite $lib:/" \
        || fails=$((fails + 1))
    done
    [ -n "$dry" ] && continue
    python3 - "$t/run-ours-$target-$mode/results.json" "$t/run-debian-$target-$mode/results.json" "$target $mode" <<'PY' || true
import json, sys
def load(p):
    try:
        return {t["name"].split(" :: ")[-1]: t["code"] for t in json.load(open(p))["tests"]}
    except (OSError, ValueError, KeyError):
        return {}
ours, debian, what = load(sys.argv[1]), load(sys.argv[2]), sys.argv[3]
ok = ("PASS", "XFAIL")
worse = sorted(n for n, c in debian.items() if c in ok and ours.get(n) not in ok)
better = sorted(n for n, c in ours.items() if c in ok and debian.get(n) not in ok)
print(f"omp: suite {what}: Debian's passes and ours does not: {len(worse)} {' '.join(worse)}")
print(f"omp: suite {what}: ours passes and Debian's does not: {len(better)} {' '.join(better)}")
PY
  done < <(suite_builds)
  [ "$fails" -eq 0 ]
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
    # The suite's mechanics (record here, replay against the fake) on a few tests.
    export OFFLOAD_GPU_CHECK_SUITE_TESTS=${OFFLOAD_GPU_CHECK_SUITE_TESTS:-"offloading/d2d_memcpy.c offloading/bug49021.cpp"}
    omp_prepare "$out/omp" debug
    omp_run "$out/omp" dry
  else
    "$check" prepare "$out/images" gfx90a
    clang-19 -shared -fPIC -O1 -Wall -Werror -pthread -I/usr/include/hsa tests/fake-hsa/fake_hsa.c -o "$out/libhsa_fake.so"
    export OFFLOAD_HSA_RUNTIME=$out/libhsa_fake.so FAKE_HSA_LOG=$out/runtime.log FAKE_HSA_FAULT=fault:memory
    echo "== the check against the fake runtime"
    "$check" run "$out/images"
    export OFFLOAD_GPU_CHECK_SUITE_TESTS=${OFFLOAD_GPU_CHECK_SUITE_TESTS:-"offloading/d2d_memcpy.c offloading/bug49021.cpp"}
    export OFFLOAD_GPU_CHECK_PROCESSORS=gfx90a
    omp_prepare "$out/omp" debug
    omp_run "$out/omp" dry
  fi
}

case "${2:-all}" in
  prepare) prepare ;;
  run) run ;;
  all) prepare; run ;;
  dry-run) dry_run ;;
  *) echo "usage: scripts/gpu-check.sh cuda|amdgpu|level-zero [prepare|run|dry-run]" >&2; exit 2 ;;
esac
