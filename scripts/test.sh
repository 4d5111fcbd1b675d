#!/usr/bin/env bash
# Builds rope's tests, examples and bench, and runs the whole test suite.
#   scripts/test.sh            (build directory: build/test)
set -euo pipefail
cd "$(dirname "$0")/.."

# The Debian packages of the test preset: scripts/packages, line test.
bash scripts/deps.sh test

cmake --preset test >/dev/null
cmake --build --preset test
ctest --preset test
