#!/usr/bin/env bash
# Build the native sender (serving_bench/load/native/sender.cc -> serving-bench-sender, git-ignored) with g++ against
# Debian's gRPC C++ (apt-get install g++ pkg-config libgrpc++-dev). Idempotent; --force rebuilds. The build also
# happens on first use; when it cannot, the Python sender is used, and why is remembered in the cache folder
# (native-sender-build.json) so later runs do not try again until this script is run (--force).
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-.venv/bin/python}" -m serving_bench.load.native "$@"
