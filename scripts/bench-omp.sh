#!/usr/bin/env bash
# The drop-in libomptarget against Debian's (tests/benches/omp_vs_debian.rs): installs what is
# missing (scripts/setup.sh: clang-19, libomp-19-dev), builds in release and runs the benchmark.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo build --release --workspace --quiet
cargo bench -p offload-tests --bench omp_vs_debian
