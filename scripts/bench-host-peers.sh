#!/usr/bin/env bash
# The host backend against PoCL and native OpenMP (tests/benches/host_peers.rs): installs what
# the peers need (PoCL's OpenCL driver, the OpenCL loader and headers, LLVM 19's OpenMP
# runtime) if missing, builds in release and runs the benchmark.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
need=()
for pkg in pocl-opencl-icd ocl-icd-opencl-dev opencl-headers libomp-19-dev; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "bench: installing ${need[*]} (apt)"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
cargo build --release --workspace --quiet
cargo bench -p offload-tests --bench host_peers
