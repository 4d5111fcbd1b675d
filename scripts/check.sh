#!/usr/bin/env bash
# The reliability stages of CI, after scripts/test.sh:
#   format every C++ file as .clang-format says (clang-format 14, the
#          Debian bookworm one); fails listing the files that differ.
#          Apply it with: clang-format -i $(git ls-files '*.hpp' '*.cpp')
#   clang  clang++, the whole suite under AddressSanitizer +
#          UndefinedBehaviorSanitizer, warnings as errors
#   tsan   g++, the concurrency tests under ThreadSanitizer
#   fuzz   clang++ libFuzzer target, run for ROPE_FUZZ_SECONDS (default 60)
#   aarch64  the suite cross-compiled with g++-aarch64-linux-gnu, run under
#            qemu-aarch64: the NEON kernels
#   xsimd14  the suite and examples, g++, against the xsimd 14 headers in the
#            folder ROPE_XSIMD14_INCLUDE_DIR names (environment; .ci/run sets
#            it where CI has them; skipped, saying so, where it is unset);
#            of the consumer projects only install, find_package and
#            install_unbuilt (CMakePresets.json, test preset xsimd14)
#
#   asan   g++, the whole suite under ASan + UBSan (not in the default list:
#          the clang stage runs the same sanitizers, and CI's time goes to the
#          aarch64 and xsimd14 stages instead; run it by name)
#
# Debug information (CMakePresets.json): line tables only (-g1, clang's
# -gline-tables-only), enough for the sanitizers' and a debugger's backtraces
# with file and line; full -g made the heavy test units ~1.7x slower to build
# with g++ 12, the largest share of CI's time. The clang stage builds at -O1,
# the usual level for ASan (-O1 with line tables built the heaviest unit
# ~1.5x faster than -O2 -g, ~1.3x faster than -O2 with line tables).
# Pass -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g" to a preset to debug locally.
#
#   scripts/check.sh               format clang tsan fuzz aarch64 xsimd14, in that order
#   scripts/check.sh asan tsan     only those
# Build directories: build/<stage>. Each stage prints its wall time.
set -euo pipefail
cd "$(dirname "$0")/.."

stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(format clang tsan fuzz aarch64 xsimd14)

jobs="${ROPE_JOBS:-2}"
fuzz_seconds="${ROPE_FUZZ_SECONDS:-60}"
# xsimd 14 is not a Debian bookworm package: whoever runs the stage names
# the folder of its headers (the xsimd14 preset reads the same variable).
xsimd14_include="${ROPE_XSIMD14_INCLUDE_DIR:-}"

run_stage() {
  local stage="$1" start=$SECONDS
  echo "=== rope check: $stage"
  case "$stage" in
    format|asan|clang|tsan|fuzz|aarch64|xsimd14) ;;
    *)
      echo "unknown stage '$stage' (format, asan, clang, tsan, fuzz, aarch64, xsimd14)" >&2
      exit 2
      ;;
  esac
  # Each stage's Debian packages: the line of its preset in scripts/packages.
  bash scripts/deps.sh "$stage"
  case "$stage" in
    format)
      # The C++ files git tracks (or would: untracked, not ignored).
      local differ=()
      while IFS= read -r file; do
        clang-format --dry-run -Werror "$file" >/dev/null 2>&1 || differ+=("$file")
      done < <(git ls-files --cached --others --exclude-standard '*.hpp' '*.cpp' | grep -v '^tests/data/')
      if [ ${#differ[@]} -ne 0 ]; then
        echo "rope check: format: these files differ from .clang-format (clang-format -i FILE mends them):" >&2
        printf '  %s\n' "${differ[@]}" >&2
        exit 1
      fi
      ;;
    asan|clang|tsan)
      cmake --preset "$stage" >/dev/null
      cmake --build --preset "$stage" -j "$jobs"
      ctest --preset "$stage"
      ;;
    fuzz)
      cmake --preset "$stage" >/dev/null
      cmake --build --preset "$stage" -j "$jobs"
      # Work on a copy: the fuzzer adds every input that finds new coverage
      # to its first corpus directory, and the checked-in corpus stays short.
      local work=build/fuzz/corpus
      rm -rf "$work" && mkdir -p "$work"
      cp tests/fuzz/corpus/* "$work"/
      ./build/fuzz/tests/fuzz/rope_fuzz "$work" -max_total_time="$fuzz_seconds" -timeout=10 \
        -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix=build/fuzz/
      ;;
    aarch64)
      cmake --preset "$stage" >/dev/null
      cmake --build --preset "$stage" -j "$jobs"
      ctest --preset "$stage"
      ;;
    xsimd14)
      if [ -z "$xsimd14_include" ]; then
        echo "=== rope check: xsimd14 skipped: ROPE_XSIMD14_INCLUDE_DIR names no folder of xsimd 14 headers"
        return 0
      fi
      if [ ! -f "$xsimd14_include/xsimd/xsimd.hpp" ]; then
        echo "rope check: xsimd14: ROPE_XSIMD14_INCLUDE_DIR=$xsimd14_include holds no xsimd/xsimd.hpp" >&2
        exit 1
      fi
      cmake --preset "$stage" >/dev/null
      cmake --build --preset "$stage" -j "$jobs"
      ctest --preset "$stage"
      ;;
  esac
  echo "=== rope check: $stage passed in $((SECONDS - start)) s"
}

for stage in "${stages[@]}"; do run_stage "$stage"; done
