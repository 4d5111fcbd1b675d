#!/usr/bin/env bash
# Builds rope's tests, examples and bench, and runs the whole test suite.
#   scripts/test.sh            (build directory: build/test)
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/deps.sh cmake ninja-build g++ pkg-config libxsimd-dev libeigen3-dev libgtest-dev libbenchmark-dev nlohmann-json3-dev

cmake --preset test >/dev/null
cmake --build --preset test
ctest --preset test
