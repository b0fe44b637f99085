#!/usr/bin/env bash
# Installs everything nibbler needs on a fresh Debian 12 machine, then builds.
# Usage: scripts/setup.sh [build-dir]   (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends \
  build-essential cmake pkg-config git ca-certificates \
  libzmq3-dev libprotobuf-c-dev protobuf-c-compiler libjemalloc-dev \
  libxxhash-dev libcjson-dev \
  clang libclang-rt-14-dev \
  python3 python3-zmq python3-protobuf protobuf-compiler >/dev/null
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$build" -j"$(nproc)"
