#!/usr/bin/env bash
# Installs what building and testing offload needs on a fresh Debian 12 machine, and nothing
# that is already there. Safe to run again; each step says what it does.
set -euo pipefail

need_apt=()
for pkg in clang-19 lld-19 llvm-19-dev libffi-dev pkg-config; do
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

if ! cargo nextest --version >/dev/null 2>&1; then
  echo "setup: installing cargo-nextest (crates.io)"
  cargo install cargo-nextest --locked --quiet
fi
echo "setup: ok (clang-19, ld.lld-19, llvm-19, libffi, cargo-nextest present)"
