#!/usr/bin/env bash
# The whole test suite: installs what is missing, checks formatting and lints, builds every
# crate, runs each plugin's tests on their own, and prints a per-plugin summary.
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh || exit 1
# The ptxas the setup installed, as a CUDA installation would put it on PATH.
export PATH="$PWD/.tools/cuda/nvidia/cuda_nvcc/bin:$PATH"

step() { printf '\n== %s\n' "$*"; }
fail=0

step "cargo fmt --check"
cargo fmt --all --check || { echo "formatting differs: run cargo fmt --all"; fail=1; }

step "cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --quiet --workspace --all-targets -- -D warnings || fail=1

step "cargo build --workspace (plugins and the offload binary the integration tests load)"
cargo build --quiet --workspace --all-targets || exit 1

declare -a rows=()
total_passed=0; total_failed=0; total_skipped=0

# run_group NAME WHY-SKIPPED-OR-EMPTY -- nextest arguments...
run_group() {
  local name=$1; shift
  step "tests: $name"
  local log; log=$(mktemp)
  cargo nextest run --no-fail-fast --failure-output final --status-level fail "$@" 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  local summary; summary=$(grep -E '^ +Summary \[' "$log" | tail -n 1)
  local run passed failed skipped
  run=$(sed -nE 's/.* ([0-9]+) tests? run.*/\1/p' <<<"$summary"); run=${run:-0}
  passed=$(sed -nE 's/.* ([0-9]+) passed.*/\1/p' <<<"$summary"); passed=${passed:-0}
  failed=$(sed -nE 's/.* ([0-9]+) failed.*/\1/p' <<<"$summary"); failed=${failed:-0}
  skipped=$(sed -nE 's/.* ([0-9]+) skipped.*/\1/p' <<<"$summary"); skipped=${skipped:-0}
  if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then failed=1; fi
  [ "$run" -eq 0 ] && { echo "group $name ran no test"; failed=$((failed + 1)); }
  rows+=("$(printf '%-12s %6s %6s %6s   %s' "$name" "$passed" "$failed" "$skipped" "$*")")
  total_passed=$((total_passed + passed)); total_failed=$((total_failed + failed)); total_skipped=$((total_skipped + skipped))
  rm -f "$log"
}

run_group core    -p offload-core -p offload-abi -p offload -p offload-cli
run_group jit     -p offload-jit -p offload-jit-client -p offload-tests -E 'package(offload-jit) | package(offload-jit-client) | binary(jit_isolation) | binary(jit_disk_cache) | binary(jit_remote)'
run_group layer   -p plugin-common
run_group host    -p plugin-host-elf -p offload-examples -p offload-tests -E 'package(plugin-host-elf) | package(offload-examples) | binary(device_layer) | binary(containers) | binary(host_kernels) | binary(runtime_api) | binary(launch_builder) | binary(examples) | binary(compile_fail) | binary(queue_model) | binary(malformed_images) | binary(command_line) | binary(kernel_header) | binary(offload_tests) | binary(jit_host) | binary(jit_concurrency) | binary(jit_memory) | binary(hostile) | binary(host_work_groups) | binary(host_barrier_regions) | binary(host_item_bounds) | binary(host_wait) | binary(jit_split) | binary(diagnostics)'
run_group testdev -p offload-tests -E 'binary(plugin_abi)'
# The drop-in libomptarget.so.19.1: its unit tests (the mapping algorithm against a model) and
# OpenMP programs built by clang-19 run on it (LLVM's own suite: scripts/omp-conformance.sh).
run_group openmp  -p omptarget -p offload-tests -E 'package(omptarget) | binary(omptarget)'
# OpenMP programs clang-19 builds for nvptx64 and amdgcn on the drop-in library, against the
# fake CUDA driver and fake HSA runtime: LLVM 19's GPU kernel protocol at the driver boundary
# (the fakes do not compute; results, device malloc and printf are scripts/gpu-check.sh's).
run_group omp-gpu -p offload-tests -E 'binary(omptarget_gpu)'
# The CUDA GPU tests are #[ignore]d; they run where `offload info` lists a CUDA device.
cuda_state=$(target/debug/offload info --json 2>/dev/null | python3 -c '
import json, sys
p = next((p for p in json.load(sys.stdin)["plugins"] if p["name"] == "cuda"), None)
if p is None: print("skip the cuda plugin was not found")
elif p["status"] == "ok": print("gpu " + ", ".join(d.get("name", "?") + " (" + d.get("compute_unit", "?") + ")" for d in p["devices"]))
else: print("skip " + (p.get("reason") or p["status"]))
' 2>/dev/null || echo "skip offload info failed")
cuda_gpu=()
cuda_filter='package(plugin-cuda) | binary(cuda) | binary(cuda_fake_driver) | binary(cuda_mutations)'
# Tests that cannot run on some machines are left out there by name (counted as skipped, named
# in the summary), never passed without running.
named_skips=()
if [ "${cuda_state%% *}" = gpu ]; then
  cuda_gpu=(--run-ignored all)
  cuda_filter="($cuda_filter) - test(=without_a_driver_there_are_no_devices_and_runs_say_why)"
  named_skips+=("cuda: without_a_driver_there_are_no_devices_and_runs_say_why (a CUDA device is present: no no-driver path)")
fi
run_group cuda    "${cuda_gpu[@]}" -p plugin-cuda -p offload-tests -E "$cuda_filter"
amd_state=$(target/debug/offload info --json 2>/dev/null | python3 -c '
import json, sys
p = next((p for p in json.load(sys.stdin)["plugins"] if p["name"] == "amdgpu"), None)
if p is None: print("skip the amdgpu plugin was not found")
elif p["status"] == "ok": print("gpu " + ", ".join(d.get("name", "?") + " (" + d.get("compute_unit", "?") + ")" for d in p["devices"]))
else: print("skip " + (p.get("reason") or p["status"]))
' 2>/dev/null || echo "skip offload info failed")
amd_gpu=()
if [ "${amd_state%% *}" = gpu ]; then amd_gpu=(--run-ignored all); fi
amd_filter='package(plugin-amdgpu) | binary(amdgpu) | binary(amdgpu_fake_runtime)'
if [ -e /dev/kfd ]; then
  amd_filter="($amd_filter) - test(=the_real_rocm_runtime_loads_and_says_why_there_is_no_gpu)"
  named_skips+=("amdgpu: the_real_rocm_runtime_loads_and_says_why_there_is_no_gpu (/dev/kfd is present: no no-GPU path)")
fi
run_group amdgpu  "${amd_gpu[@]}" -p plugin-amdgpu -p offload-tests -E "$amd_filter"
# Level Zero: no test needs an Intel GPU (the GPU check is scripts/gpu-check.sh level-zero).
ze_state=$(target/debug/offload info --json 2>/dev/null | python3 -c '
import json, sys
p = next((p for p in json.load(sys.stdin)["plugins"] if p["name"] == "level-zero"), None)
if p is None: print("the level-zero plugin was not found")
elif p["status"] == "ok": print("GPUs: " + ", ".join(d.get("name", "?") + " (" + d.get("compute_unit", "?") + ")" for d in p["devices"]))
else: print(p.get("reason") or p["status"])
' 2>/dev/null || echo "offload info failed")
run_group level-zero -p plugin-level-zero -p offload-tests -E 'package(plugin-level-zero) | binary(level_zero) | binary(level_zero_fake_driver)'
# MPI: the message format, and jobs under Open MPI's mpirun (one machine, several ranks): the
# proxy, and the mpi plugin in Rust, CLI and OpenMP programs.
run_group mpi     -p offload-mpi -p plugin-mpi -p offload-tests -E 'package(offload-mpi) | package(plugin-mpi) | binary(mpi)'

# Every test of the workspace must belong to some group: a test no group runs is a test CI
# never runs.
listed=$(cargo nextest list --workspace --run-ignored all --message-format oneline 2>/dev/null | grep -c .)
ran=$((total_passed + total_failed + total_skipped))
if [ "$listed" -ne "$ran" ]; then
  echo "the groups ran $ran tests but the workspace has $listed: a test belongs to no group"
  fail=1
fi

# Doctests (nextest does not run them): the offload crate's runs saxpy on the host backend.
step "doctests (cargo test --doc --workspace)"
doc_log=$(mktemp)
cargo test --quiet --doc --workspace 2>&1 | tee "$doc_log"
doc_rc=${PIPESTATUS[0]}
doc_passed=$(sed -nE 's/^test result: [a-zA-Z]+\. ([0-9]+) passed.*/\1/p' "$doc_log" | awk '{s+=$1} END {print s+0}')
doc_failed=$(sed -nE 's/^test result: [a-zA-Z]+\. [0-9]+ passed; ([0-9]+) failed.*/\1/p' "$doc_log" | awk '{s+=$1} END {print s+0}')
doc_ignored=$(sed -nE 's/^test result: .* ([0-9]+) ignored.*/\1/p' "$doc_log" | awk '{s+=$1} END {print s+0}')
doc_passed=${doc_passed:-0}; doc_failed=${doc_failed:-0}; doc_ignored=${doc_ignored:-0}
if [ "$doc_rc" -ne 0 ] && [ "$doc_failed" -eq 0 ]; then doc_failed=1; fi
[ "$doc_failed" -ne 0 ] && fail=1
rows+=("$(printf '%-12s %6s %6s %6s   %s' doc "$doc_passed" "$doc_failed" "$doc_ignored" "cargo test --doc --workspace (ignored: examples that need a feature)")")
rm -f "$doc_log"

# LLVM 19's own OpenMP offload suite against our libomptarget (docs/openmp.md), built as it is
# (AOT) and with -fopenmp-target-jit: a score below the floor fails the run (Debian's library
# passes 133 of 137 AOT and no JIT-mode test with a target region; ours 132 and 132 at the last
# measurement); a suite that cannot be fetched or run fails the run too.
# The same suite with every program as rank 0 of an MPI job whose one proxy serves this
# machine's host device, with a floor of its own: 121 of 137 pass, each of the 16 differences a
# test of memory the program and the device share or one that fails locally too (docs/mpi.md).
omp_floor_local=${OMP_CONFORMANCE_FLOOR:-130}
omp_floor_remote=${OMP_CONFORMANCE_REMOTE_FLOOR:-121}
omp_states=()
for omp_mode in aot jit aot-remote jit-remote; do
  step "LLVM 19 offload/test (x86_64, $omp_mode) against target/debug/libomptarget.so.19.1"
  omp_log=$(mktemp)
  omp_args=(--lib target/debug)
  omp_floor=$omp_floor_local
  case $omp_mode in jit*) omp_args+=(--jit) ;; esac
  case $omp_mode in *-remote) omp_args+=(--remote); omp_floor=$omp_floor_remote ;; esac
  scripts/omp-conformance.sh "${omp_args[@]}" >"$omp_log" 2>&1
  omp_rc=$?
  tail -n 3 "$omp_log"
  omp_line=$(grep '^omp-conformance: [0-9]' "$omp_log" | tail -n 1)
  omp_passed=$(sed -nE 's/^omp-conformance: ([0-9]+) passed.*/\1/p' <<<"$omp_line")
  if [ -z "$omp_passed" ]; then
    # A suite that did not run is a failure, not a silent pass.
    omp_states+=("$omp_mode: NOT RUN (scripts/omp-conformance.sh exit $omp_rc; see its output above)")
    fail=1
  elif [ "$omp_passed" -lt "$omp_floor" ]; then
    omp_states+=("${omp_line#omp-conformance: }: below the floor of $omp_floor")
    fail=1
  else
    omp_states+=("${omp_line#omp-conformance: }")
  fi
  rm -f "$omp_log"
done

step "per-plugin summary"
printf '%-12s %6s %6s %6s   %s\n' plugin passed failed skipped "what ran"
for r in "${rows[@]}"; do echo "$r"; done
echo "cuda: ran up to the driver everywhere: real ptxas cubins and the plugin's SM checks, fatbin selection,"
echo "      the no-driver and stub-driver paths, the device path against a fake driver (tests/fake-cuda: asynchronous"
echo "      streams, contexts per device, injected faults and kernel limits), mutants, the GPU check's dry run"
if [ "${cuda_state%% *}" = gpu ]; then
  echo "      GPU tests ran on: ${cuda_state#gpu }"
else
  echo "      GPU tests skipped (counted above): ${cuda_state#skip }"
  echo "      on a machine with an NVIDIA GPU they run here, and in scripts/gpu-check.sh cuda"
fi
echo "amdgpu: ran up to the runtime: code objects from the JIT and clang (targets, target-id features, kernarg"
echo "      layouts from the metadata), refusals, mutants, the real ROCm runtime (libhsa-runtime64) loaded, and the"
echo "      device path against a fake HSA runtime (tests/fake-hsa: asynchronous queues and DMA, memory faults, queue"
echo "      errors), the GPU check's dry run"
if [ "${amd_state%% *}" = gpu ]; then
  echo "      GPU tests ran on: ${amd_state#gpu }"
else
  echo "      GPU tests skipped (counted above): ${amd_state#skip }"
  echo "      on a machine with an AMD GPU they run here, and in scripts/gpu-check.sh amdgpu"
fi
echo "level-zero: ran up to the driver: SPIR-V (spirv-as, spirv-val) and zebin checks, mutants, the real Level"
echo "      Zero loader (Debian's libze1) with no driver, and the device path through that loader against a fake"
echo "      driver (tests/fake-level-zero: asynchronous immediate lists, events, local memory, faults), the GPU"
echo "      check's dry run; this machine: $ze_state"
echo "mpi: the message format (round trips, named errors, a seeded mutation test of the decoder) and jobs"
echo "      under Open MPI's mpirun, one machine, proxies serving its host device: offload-mpi-check (copies of"
echo "      0 B to 64 MiB byte for byte, refused requests, queued errors, corrupted messages); the mpi plugin:"
echo "      offload info in and outside a job, the Rust example mpi_saxpy (native and JIT, sync and queued),"
echo "      copies of 0 B to 64 MiB through the plugin, a queued read completed by an event, four threads each"
echo "      with a queue, a kernel longer than the timeout, OpenMP programs AOT and JIT on a remote device only"
echo "      (maps, nowait, depend; what regions print, in order between the program's lines), an image the"
echo "      node cannot run, a proxy of another version, proxies killed"
echo "      mid-launch and mid-copy (with and without recovery)"
echo "(jit: the engine, its client and the worker process, incl. PTX/AMDGPU/x86-64 oracle tests against"
echo " opt-19|llc-19 through the worker, and the isolation tests: LLVM aborts, memory bombs, runaway compiles,"
echo " killed workers, bitcode mutants; the disk cache across processes: warm starts without LLVM, bad entries,"
echo " one compile per key among 4 processes x 4 threads, the size cap, untrusted directories; the remote"
echo " cache on a redis-server each test starts: nodes sharing compiles, 4 nodes x 4 threads compiling each"
echo " key once, a holder SIGKILLed mid-compile, refused values (corrupted, misplaced, unsigned, wrong MAC),"
echo " a Redis down, SIGSTOPped, full or answering garbage, TLS, a password file; nvptx64 and"
echo " amdgcn builds of include/offload_kernel.h are checked in"
echo " the host group: kernel_header)"
echo "openmp: the drop-in libomptarget.so.19.1 on the host plugin: OpenMP programs built by clang-19, mutated"
echo "      descriptors and images, JIT mode from the disk cache; LLVM 19's offload/test (remote: on a host"
echo "      device behind offload-mpi-proxy):"
for st in "${omp_states[@]}"; do echo "        $st"; done
echo "omp-gpu: the drop-in library's GPU path without a GPU: clang-19's nvptx64 (JIT) and amdgcn (JIT, AOT)"
echo "      programs against the fake CUDA driver and fake HSA runtime (LLVM 19's kernel protocol: grid and"
echo "      block per execution mode, launch and device environments, reduction buffers, shared memory,"
echo "      one compile for two GPUs, wrong-gfx refusal, code-object mutants); kernel results, device malloc"
echo "      and printf only on a GPU (scripts/gpu-check.sh cuda|amdgpu)"
for sk in "${named_skips[@]}"; do echo "left out by name: $sk"; done
[ "$fail" -ne 0 ] && echo "fmt, clippy, the group coverage check or the OpenMP suite (not run, or below its floor) failed (see above)"
echo
echo "offload tests: $total_passed passed, $total_failed failed, $total_skipped skipped"
[ "$fail" -eq 0 ] && [ "$total_failed" -eq 0 ]
