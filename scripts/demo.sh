#!/usr/bin/env bash
# The main job: builds the runtime and the host plugin (release) and runs `offload demo`,
# which launches an embedded saxpy kernel on the host backend and verifies the result.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
echo "demo: building offload and the host plugin (cargo build --release)"
cargo build --release --quiet -p offload-cli -p offload-plugin-host -p plugin-host-elf
exec target/release/offload demo "$@"
