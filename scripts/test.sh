#!/usr/bin/env bash
# Builds rope's tests, examples and bench, and runs the whole test suite.
#   scripts/test.sh            (build directory: build/test)
set -euo pipefail
cd "$(dirname "$0")/.."

# The Debian packages of the test preset: scripts/packages, line test.
bash scripts/deps.sh test

# ROPE_EXTRA_HF_CONFIGS_DIR (environment): a folder of published configs
# that tests/data/hf/configs must hold unchanged; unset: not compared.
cmake --preset test -DROPE_EXTRA_HF_CONFIGS_DIR="${ROPE_EXTRA_HF_CONFIGS_DIR:-}" >/dev/null
cmake --build --preset test
ctest --preset test
