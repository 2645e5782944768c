#!/usr/bin/env bash
# Installs what building and testing offload needs on a fresh Debian 12 machine, and nothing
# that is already there. Safe to run again; each step says what it does.
set -euo pipefail

need_apt=()
# libhsa-runtime64-1 / libhsa-runtime-dev: ROCm's HSA runtime, which the amdgpu plugin's tests
# load for real (it reports no GPU here) and whose headers the fake runtime is built against.
# libomp-19-dev: LLVM 19's OpenMP runtime (omp.h, libomp.so.5 and Debian's libomptarget), which
# the OpenMP programs of the drop-in libomptarget's tests are built and run with.
# libze1 / libze-dev: the oneAPI Level Zero loader, which the level-zero plugin's tests load for
# real (no driver here: it reports no device) and whose headers the fake driver is built
# against; spirv-tools: spirv-as and spirv-val, which make and check the tests' SPIR-V.
# libopenmpi-dev / openmpi-bin: Open MPI, which crates/offload-mpi builds against (the mpi
# crate) and whose mpirun starts the remote-device tests' jobs.
# redis-server: the Redis that the JIT's remote-cache tests and bench start themselves (never
# the system's service); openssl makes the TLS test's self-signed certificate.
for pkg in clang-19 lld-19 llvm-19-dev libffi-dev pkg-config libhsa-runtime64-1 libhsa-runtime-dev libomp-19-dev libze1 libze-dev spirv-tools libopenmpi-dev openmpi-bin redis-server openssl; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    need_apt+=("$pkg")
  fi
done
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing ${need_apt[*]} (apt)"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

# ptxas for the CUDA backend's tests (no GPU needed): the nvidia-cuda-nvcc-cu12 wheel from PyPI
# carries bin/ptxas. Only that file is kept, in .tools/cuda (ignored by git).
PTXAS_WHEEL_VERSION=12.9.86
root="$(cd "$(dirname "$0")/.." && pwd)"
ptxas="$root/.tools/cuda/nvidia/cuda_nvcc/bin/ptxas"
if [ ! -x "$ptxas" ]; then
  if ! python3 -m pip --version >/dev/null 2>&1; then
    echo "setup: installing python3-pip (apt), to download the ptxas wheel"
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-pip >/dev/null
  fi
  echo "setup: installing ptxas from the nvidia-cuda-nvcc-cu12==$PTXAS_WHEEL_VERSION wheel (PyPI) into .tools/cuda"
  wheel_dir=$(mktemp -d)
  python3 -m pip download --quiet --no-deps --dest "$wheel_dir" "nvidia-cuda-nvcc-cu12==$PTXAS_WHEEL_VERSION"
  python3 - "$wheel_dir" "$root/.tools/cuda" <<'PY'
import glob, os, sys, zipfile
wheel = glob.glob(os.path.join(sys.argv[1], "*.whl"))[0]
with zipfile.ZipFile(wheel) as z:
    path = z.extract("nvidia/cuda_nvcc/bin/ptxas", sys.argv[2])
os.chmod(path, 0o755)
PY
  rm -rf "$wheel_dir"
  "$ptxas" --version | tail -n 2
fi

if ! cargo nextest --version >/dev/null 2>&1; then
  echo "setup: installing cargo-nextest (crates.io)"
  cargo install cargo-nextest --locked --quiet
fi
echo "setup: ok (clang-19, ld.lld-19, llvm-19, libomp-19, libffi, the HSA runtime, the Level Zero loader, spirv-tools, ptxas in .tools/cuda, cargo-nextest present)"
