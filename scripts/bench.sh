#!/usr/bin/env bash
# Builds rope_bench with optimisations for this machine, runs it and prints
# the report of the ratios that matter (and, with matplotlib, the attention
# plot).
#   scripts/bench.sh [extra rope_bench flags, e.g. --benchmark_filter=kernel/]
# Results: build/bench/rope_bench.json (raw), build/bench/report.md (the
# table), build/bench/attention.png (when attention cases ran and matplotlib
# is installed). Later flags override the defaults below.
set -euo pipefail
cd "$(dirname "$0")/.."

# The Debian packages of the bench preset: scripts/packages, line bench.
bash scripts/deps.sh bench

cmake --preset bench >/dev/null
cmake --build --preset bench --target rope_bench

# The CPU's name goes into the JSON so the report says where it ran.
cpu_model=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -n 1 | tr -d ',=')
out=build/bench/rope_bench.json
# Three repetitions of 0.2 s each: the report reads their median. The
# repetitions of all cases run interleaved in random order, so that a burst of
# load from elsewhere on a shared machine hits several cases a little rather
# than one case entirely, and the ratios of one run stay comparable.
./build/bench/bench/rope_bench --benchmark_out="$out" --benchmark_out_format=json \
  --benchmark_repetitions=3 --benchmark_report_aggregates_only=true --benchmark_min_time=0.2 \
  --benchmark_enable_random_interleaving=true \
  ${cpu_model:+"--benchmark_context=cpu_model=$cpu_model"} "$@"

if [ -f bench/report.py ]; then
  # Any Python 3 will do; prefer one with matplotlib so the plot is drawn too.
  python=python3
  for candidate in python3 /usr/bin/python3; do
    if command -v "$candidate" >/dev/null && "$candidate" -c 'import matplotlib' 2>/dev/null; then
      python=$candidate
      break
    fi
  done
  "$python" bench/report.py "$out" | tee build/bench/report.md
fi
