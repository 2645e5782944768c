#!/usr/bin/env bash
# LLVM 19.1.7's own OpenMP offload test suite (offload/test, target x86_64-pc-linux-gnu) run by
# Debian's lit against a libomptarget.so.19.1, and the counts it gives.
#
#   scripts/omp-conformance.sh [--lib DIR] [--jit] [--jobs N] [--out DIR] [TEST...]
#
#   --lib DIR   the directory holding the libomptarget.so.19.1 (and libomptarget.so) to test;
#               default: Debian's, /usr/lib/llvm-19/lib. Programs are linked against it and
#               find it at run time through their rpath.
#   --jit       build every test with -fopenmp-target-jit (device code embedded as bitcode, to
#               be compiled by the runtime's JIT at the first target region)
#   --remote    run every test program as rank 0 of an MPI job with one offload-mpi-proxy,
#               seeing only the job's remote devices (scripts/mpi-remote): the suite against a
#               remote host device
#   --jobs N    parallel tests (default: the number of cores)
#   -v          lit's verbose output (each failure's commands and output)
#   --out DIR   where lit writes the test programs and results (default .tools/omp-conformance/
#               <lib>-<mode>); results.json there holds every test's outcome
#   TEST...     paths under offload/test to run (e.g. mapping api/omp_target_memcpy.c);
#               default: the whole suite
#
# For a GPU target, built here and run on a machine without a compiler (scripts/gpu-check.sh):
#   --target T      the suite's target (default x86_64-pc-linux-gnu; nvptx64-nvidia-cuda,
#                   amdgcn-amd-amdhsa)
#   --flags "F"     more compiler flags for every test (e.g. -fopenmp-target-jit -nocudalib
#                   --offload-arch=sm_90)
#   --gpu-arch A    the GPU the suite is for (sm_90 -> lit's cuda_test_arch 90; gfx90a), which
#                   decides lit's unified_shared_memory feature
#   --record STORE  compile every test through scripts/lit-cc, keeping the outputs in STORE;
#                   only the compiles of the RUN lines run (scripts/lit_record.py)
#   --replay STORE  run with the outputs kept in STORE instead of compiling (no compiler, apt
#                   or network needed); --tools DIR holds FileCheck, not and lit/ (default
#                   Debian's), --suite DIR the suite (a copy of .tools/llvm-19-offload-test)
#
# It installs what is missing (libomp-19-dev; a deb-src line for Debian's main archive, in
# /etc/apt/sources.list.d/offload-deb-src.sources), fetches the suite from Debian's source
# package llvm-toolchain-19 once (into .tools/llvm-19-offload-test), and prints one line:
# "omp-conformance: N passed, N failed, N unsupported (...)". Exit status: 0 when lit ran,
# whatever the counts (compare them against the baseline in docs/openmp.md); 2 when it could not
# run.
#
# Measured 2026-12-01 with Debian's library: see docs/openmp.md.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD

lib=/usr/lib/llvm-19/lib
mode=aot
remote=""
target=x86_64-pc-linux-gnu
more_flags=""
gpu_arch=""
record=""
replay=""
tools=""
suite=$root/.tools/llvm-19-offload-test
jobs=$(nproc)
out=""
verbose=-q
tests=()
while [ $# -gt 0 ]; do
  case $1 in
    --lib) lib=$(cd "$2" 2>/dev/null && pwd) || { echo "omp-conformance: --lib '$2' is not a directory" >&2; exit 2; }; shift 2 ;;
    --jit) mode=jit; shift ;;
    --remote) remote=1; shift ;;
    --jobs) jobs=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --target) target=$2; shift 2 ;;
    --flags) more_flags=$2; shift 2 ;;
    --gpu-arch) gpu_arch=$2; shift 2 ;;
    --record) mkdir -p "$2" && record=$(cd "$2" && pwd); shift 2 ;;
    --replay) replay=$(cd "$2" 2>/dev/null && pwd) || { echo "omp-conformance: --replay '$2' is not a directory" >&2; exit 2; }; shift 2 ;;
    --tools) tools=$(cd "$2" 2>/dev/null && pwd) || { echo "omp-conformance: --tools '$2' is not a directory" >&2; exit 2; }; shift 2 ;;
    --suite) suite=$(cd "$2" 2>/dev/null && pwd) || { echo "omp-conformance: --suite '$2' is not a directory" >&2; exit 2; }; shift 2 ;;
    -v) verbose=-v; shift ;;
    -h|--help) sed -n '2,40p' "$0"; exit 0 ;;
    -*) echo "omp-conformance: unknown option '$1' (see --help)" >&2; exit 2 ;;
    *) tests+=("$1"); shift ;;
  esac
done
# Cargo builds libomptarget.so (SONAME libomptarget.so.19.1); the versioned name the test
# programs' loader looks for is a symlink beside it, made here if it is missing.
if [ ! -e "$lib/libomptarget.so.19.1" ] && [ -e "$lib/libomptarget.so" ]; then
  ln -sf libomptarget.so "$lib/libomptarget.so.19.1"
fi
if [ ! -e "$lib/libomptarget.so.19.1" ]; then
  echo "omp-conformance: '$lib' holds no libomptarget.so.19.1 (nor a libomptarget.so to link it to)" >&2
  exit 2
fi

sudo_() { if [ "$(id -u)" -ne 0 ]; then sudo "$@"; else "$@"; fi; }

if [ -z "$replay" ]; then
# libomp and Debian's libomptarget (the baseline, and the headers and device runtime archive the
# test programs link with).
# llvm-19-tools: lit, FileCheck and not.
# One install and fetch at a time: runs that start together on a fresh machine (two test
# processes) wait for the first (apt's own lock would fail the second), then find it all there.
mkdir -p "$root/.tools"
exec 9>"$root/.tools/omp-conformance.lock"
flock 9
need=()
for pkg in libomp-19-dev llvm-19-tools clang-19; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "omp-conformance: installing ${need[*]} (apt)"
  sudo_ apt-get update -qq
  DEBIAN_FRONTEND=noninteractive sudo_ apt-get install -y -qq "${need[@]}" >/dev/null || exit 2
fi

if [ ! -f "$suite/offload/test/lit.cfg" ]; then
  if ! apt-get source --print-uris llvm-toolchain-19 >/dev/null 2>&1; then
    echo "omp-conformance: adding a deb-src line for Debian bookworm main (apt source packages)"
    sudo_ tee /etc/apt/sources.list.d/offload-deb-src.sources >/dev/null <<'EOF'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    sudo_ apt-get update -qq || exit 2
  fi
  echo "omp-conformance: fetching LLVM 19's offload/test from Debian's source package llvm-toolchain-19"
  dl=$(mktemp -d)
  (cd "$dl" && apt-get source --download-only -qq llvm-toolchain-19 >/dev/null) || { rm -rf "$dl"; exit 2; }
  tarball=$(ls "$dl"/llvm-toolchain-19_*.orig.tar.xz | head -n 1)
  rm -rf "$suite.tmp" && mkdir -p "$suite.tmp"
  tar -xJf "$tarball" -C "$suite.tmp" --strip-components=1 --wildcards '*/offload/test/*' || { rm -rf "$dl" "$suite.tmp"; exit 2; }
  echo "${tarball##*/}" > "$suite.tmp/SOURCE"
  rm -rf "$dl" "$suite" && mv "$suite.tmp" "$suite"
fi
flock -u 9
exec 9>&-
fi
src=$suite/offload/test

if [ -z "$out" ]; then
  out=$root/.tools/omp-conformance/$(echo "$lib" | tr '/' '_')-$mode${remote:+-remote}
  [ "$target" = x86_64-pc-linux-gnu ] || out=$out-$target
fi
mkdir -p "$out"
out=$(cd "$out" && pwd)
flags=""
[ "$mode" = jit ] && flags="-fopenmp-target-jit"
flags="$flags $more_flags"
llvm=/usr/lib/llvm-19
filecheck=$llvm/bin/FileCheck not=$llvm/bin/not
litdir=$llvm/build/utils/lit
# Recording or replaying, the compiler lit calls is scripts/lit-cc, which keys each output by
# its arguments less the paths that differ between the two machines (--roots).
lit_cc=""
[ -n "$record" ] && lit_cc="$root/scripts/lit-cc --record $record --roots $src:$out:$lib "
[ -n "$replay" ] && lit_cc="$root/scripts/lit-cc --replay $replay --roots $src:$out:$lib "
cc=${lit_cc}/usr/bin/clang-19 cxx=${lit_cc}/usr/bin/clang++-19
if [ -n "$replay" ] && [ -n "$tools" ]; then
  filecheck=$tools/FileCheck not=$tools/not litdir=$tools/lit
  export LD_LIBRARY_PATH=$tools${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
cuda_arch="" amd_arch=""
case $target in
  nvptx*) cuda_arch=${gpu_arch#sm_} ;;
  amdgcn*) amd_arch=$gpu_arch ;;
esac
cat > "$out/lit.site.cfg" <<EOF
# Written by scripts/omp-conformance.sh: the values CMake would fill in for an x86_64 host build
# of LLVM 19.1.7's offload/test, pointing at the library under test.
config.bin_llvm_tools_dir = "$llvm/bin"
config.test_c_compiler = "$cc"
config.test_cxx_compiler = "$cxx"
config.test_fortran_compiler = ""
config.test_compiler_features = ["clang", "clang-19", "clang-19.1", "clang-19.1.7"]
config.test_openmp_flags = "-fopenmp -pthread"
config.test_extra_flags = "$flags"
config.cuda_path = ""
config.cuda_libdir = ""
config.cuda_test_arch = "$cuda_arch"
config.amdgpu_test_arch = "$amd_arch"
config.libomptarget_obj_root = "$out/$target"
config.library_dir = "$lib"
config.llvm_library_dir = "$llvm/lib"
config.llvm_library_intdir = "$llvm/lib"
config.omp_header_directory = "$llvm/lib/clang/19/include"
config.omp_host_rtl_directory = "$llvm/lib"
config.llvm_lib_directory = "$llvm/lib"
config.operating_system = "Linux"
# Every target LLVM 19 knows (offload/CMakeLists.txt): RUN lines for the others must expand to
# "echo ignored-command", not stay unexpanded.
config.libomptarget_all_targets = """aarch64-unknown-linux-gnu aarch64-unknown-linux-gnu-LTO
    amdgcn-amd-amdhsa powerpc64le-ibm-linux-gnu powerpc64le-ibm-linux-gnu-LTO
    powerpc64-ibm-linux-gnu powerpc64-ibm-linux-gnu-LTO x86_64-pc-linux-gnu
    x86_64-pc-linux-gnu-LTO nvptx64-nvidia-cuda nvptx64-nvidia-cuda-LTO
    nvptx64-nvidia-cuda-JIT-LTO s390x-ibm-linux-gnu s390x-ibm-linux-gnu-LTO""".split()
config.libomptarget_current_target = "$target"
config.libomptarget_filecheck = "$filecheck"
config.libomptarget_not = "$not"
config.libomptarget_debug = False
config.has_libomptarget_ompt = True
config.libomptarget_has_libc = False
lit_config.load_config(config, "$src/lit.cfg")
EOF
if [ -n "$remote" ]; then
  # Each test program runs as rank 0 of an MPI job whose one other rank is a proxy.
  cat >> "$out/lit.site.cfg" <<EOF
run = "%libomptarget-run-$target"
config.substitutions = [
    (k, v.replace("%t", "$root/scripts/mpi-remote %t", 1)) if k in (run, run.replace("-run-", "-run-fail-")) else (k, v)
    for (k, v) in config.substitutions
]
EOF
fi
if [ -n "$record" ]; then
  # Only the compiles run (scripts/lit_record.py).
  cat >> "$out/lit.site.cfg" <<EOF
import sys
sys.path.insert(0, "$root/scripts")
import lit_record
config.test_format = lit_record.RecordFormat()
EOF
fi

paths=()
if [ ${#tests[@]} -eq 0 ]; then
  paths=("$src")
else
  for t in "${tests[@]}"; do paths+=("$src/$t"); done
fi
echo "omp-conformance: lit on ${#paths[@]} path(s) of $src, library $lib, target $target, mode $mode${record:+, recording}${replay:+, replaying}, -j$jobs"
start=$(date +%s)
PATH=$llvm/bin:$PATH LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
  python3 - "$litdir" "$src/lit.cfg" "$out/lit.site.cfg" "$out/results.json" "$jobs" "$verbose" "${paths[@]}" <<'PY'
import os, sys
sys.path.insert(0, sys.argv.pop(1))
import lit.main
cfg, site, results, jobs, verbose, *paths = sys.argv[1:]
sys.argv = ["lit", verbose, "-j", jobs, "-o", results] + paths
try:
    lit.main.main({"config_map": {os.path.realpath(cfg): site}})
except SystemExit:
    pass
PY
REMOTE=$remote python3 - "$out/results.json" "$mode${record:+ recording: counts mean nothing}" "$lib" "$(( $(date +%s) - start ))" "$target" <<'PY'
import json, os, sys, collections
path, mode, lib, secs, target = sys.argv[1:]
if target != "x86_64-pc-linux-gnu":
    mode = f"{target}, {mode}"
try:
    tests = json.load(open(path))["tests"]
except (OSError, ValueError, KeyError) as e:
    print(f"omp-conformance: lit wrote no results ({e})")
    sys.exit(2)
codes = collections.Counter(t["code"] for t in tests)
passed = codes["PASS"] + codes["XFAIL"]
failed = codes["FAIL"] + codes["XPASS"] + codes["UNRESOLVED"] + codes["TIMEOUT"]
with open(path.replace("results.json", "failed.txt"), "w") as f:
    for t in sorted(tests, key=lambda t: t["name"]):
        if t["code"] in ("FAIL", "XPASS", "UNRESOLVED", "TIMEOUT"):
            f.write(f'{t["code"]} {t["name"].split(" :: ")[-1]}\n')
if os.environ.get("REMOTE"):
    mode += ", remote device over MPI"
print(f"omp-conformance: {passed} passed, {failed} failed, {codes['UNSUPPORTED']} unsupported "
      f"({mode}, {lib}, {secs} s; failures listed in {path.replace('results.json', 'failed.txt')})")
PY
