#!/usr/bin/env bash
# Builds rope_bench with optimisations for this machine, runs it and prints
# the report of the ratios that matter.
#   scripts/bench.sh [extra rope_bench flags, e.g. --benchmark_filter=kernel/]
# JSON results: build/bench/rope_bench.json
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/deps.sh cmake ninja-build g++ libxsimd-dev libeigen3-dev libbenchmark-dev python3

cmake --preset bench >/dev/null
cmake --build --preset bench --target rope_bench
out=build/bench/rope_bench.json
./build/bench/bench/rope_bench --benchmark_out="$out" --benchmark_out_format=json \
  --benchmark_repetitions=3 --benchmark_report_aggregates_only=true "$@"
if [ -f bench/report.py ]; then
  python3 bench/report.py "$out"
fi
