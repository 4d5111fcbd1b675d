#!/usr/bin/env bash
# The reliability stages of CI, after scripts/test.sh:
#   format every C++ file as .clang-format says (clang-format 14, the
#          Debian bookworm one); fails listing the files that differ, or
#          when it finds no C++ file (git's list of the tree, or outside a
#          git checkout every *.hpp and *.cpp but build/'s).
#          Apply it with: clang-format -i $(git ls-files '*.hpp' '*.cpp')
#   clang  clang++, the suite under AddressSanitizer +
#          UndefinedBehaviorSanitizer, warnings as errors (the thread
#          suites are tsan's)
#   tsan   g++, the concurrency tests under ThreadSanitizer: Concurrency.*,
#          ExecutorContract.*, AttentionThreads.*, DispatchThreads.*; fails
#          when one of those groups is not in the build
#   fuzz   clang++ libFuzzer target, run for ROPE_FUZZ_SECONDS (default 60)
#   aarch64  the suite cross-compiled with g++-aarch64-linux-gnu, run under
#            qemu-aarch64: the NEON kernels
#   xsimd14  the SIMD suites, g++, against the xsimd 14 headers in the
#            folder ROPE_XSIMD14_INCLUDE_DIR names (environment; .ci/run
#            points it at CI's copy); fails when it is unset or the folder
#            holds no xsimd/xsimd.hpp: without those headers, name the other
#            stages instead. Of the consumer projects only install,
#            find_package and install_unbuilt (CMakePresets.json, test preset
#            xsimd14)
#
# The suites of clang, asan and xsimd14, built for this machine, must run
# the instruction sets ROPE_EXPECT_ARCHS names (as given, e.g. by .ci/run,
# else scripts/expected_archs.sh: what the CPU has), and the aarch64 suite
# arm64+neon: Architectures.EveryExpectedArchitectureIsBuiltAndRuns, which
# each of those stages fails without.
#
#   asan   g++, the whole suite under ASan + UBSan (not in the default list:
#          the clang stage runs the same sanitizers, and CI's time goes to the
#          aarch64 and xsimd14 stages instead; run it by name)
#
# Debug information (CMakePresets.json): line tables only (-g1, clang's
# -gline-tables-only), enough for the sanitizers' and a debugger's backtraces
# with file and line; full -g made the heavy test units ~1.7x slower to build
# with g++ 12, the largest share of CI's time; the aarch64 and xsimd14
# stages, which no sanitizer reads, build without. The clang stage builds at -O1,
# the usual level for ASan (-O1 with line tables built the heaviest unit
# ~1.5x faster than -O2 -g, ~1.3x faster than -O2 with line tables).
# The xsimd14 stage stays at -O2 (-O1 built its heaviest unit ~1.5x
# faster): at -O1 g++ 12 leaves rope::detail::float16_bits_to_float out of
# line in rope::dispatch's AVX-512 object, a weak definition another
# instruction set's callers could be linked to, which dispatch.symbols
# refuses.
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

# The xsimd14 stage's subject: a folder of xsimd 14 headers.
require_xsimd14_headers() {
  if [ -z "$xsimd14_include" ]; then
    echo "rope check: xsimd14: ROPE_XSIMD14_INCLUDE_DIR is unset: set it to a folder of xsimd 14 headers," \
      "or name the stages to run without this one (e.g. scripts/check.sh format clang tsan fuzz aarch64)" >&2
    exit 1
  fi
  if [ ! -f "$xsimd14_include/xsimd/xsimd.hpp" ]; then
    echo "rope check: xsimd14: ROPE_XSIMD14_INCLUDE_DIR=$xsimd14_include holds no xsimd/xsimd.hpp" >&2
    exit 1
  fi
}

# require_tests STAGE REGEX WHAT: fails unless the stage's build holds a
# test that REGEX matches (ctest passes where a filter matches nothing).
require_tests() {
  local stage="$1" regex="$2" what="$3" count
  count=$(ctest --test-dir "build/$stage" -N -R "$regex" | sed -n 's/^Total Tests: *//p') || count=0
  if [ "${count:-0}" -eq 0 ]; then
    echo "rope check: $stage: no test matches '$regex' ($what): the stage would pass without it" >&2
    exit 1
  fi
}

# run_suite STAGE ARCHS: the stage's tests (its test preset), with
# Architectures.* asserting that the suite ran each instruction set of ARCHS
# (a comma-separated list of xsimd names).
run_suite() {
  local stage="$1" archs="$2"
  if [ -z "$archs" ]; then
    echo "rope check: $stage: no instruction sets to expect (ROPE_EXPECT_ARCHS)" >&2
    exit 1
  fi
  require_tests "$stage" '^Architectures\.EveryExpectedArchitectureIsBuiltAndRuns$' "the instruction sets $archs"
  echo "=== rope check: $stage must run $archs"
  ROPE_EXPECT_ARCHS="$archs" ctest --preset "$stage"
}

# What the suites built for this machine must run.
host_archs() {
  if [ -n "${ROPE_EXPECT_ARCHS:-}" ]; then
    echo "$ROPE_EXPECT_ARCHS"
  else
    bash scripts/expected_archs.sh
  fi
}

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
      # The C++ files git tracks (or would: untracked, not ignored); outside
      # a git checkout, every one of the tree but the build folders'.
      local files=() differ=()
      if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
        mapfile -t files < <(git ls-files --cached --others --exclude-standard '*.hpp' '*.cpp' | grep -v '^tests/data/')
      else
        mapfile -t files < <(find . \( -path ./build -o -path ./.git -o -path ./tests/data \) -prune -o \
          -type f \( -name '*.hpp' -o -name '*.cpp' \) -print | sed 's|^\./||' | sort)
      fi
      if [ ${#files[@]} -eq 0 ]; then
        echo "rope check: format: found no C++ file to check in $(pwd)" >&2
        exit 1
      fi
      for file in "${files[@]}"; do
        clang-format --dry-run -Werror "$file" >/dev/null 2>&1 || differ+=("$file")
      done
      echo "=== rope check: format: ${#files[@]} C++ files checked"
      if [ ${#differ[@]} -ne 0 ]; then
        echo "rope check: format: these files differ from .clang-format (clang-format -i FILE mends them):" >&2
        printf '  %s\n' "${differ[@]}" >&2
        exit 1
      fi
      ;;
    asan|clang)
      cmake --preset "$stage" >/dev/null
      cmake --build --preset "$stage" -j "$jobs"
      run_suite "$stage" "$(host_archs)"
      ;;
    tsan)
      cmake --preset "$stage" >/dev/null
      cmake --build --preset "$stage" -j "$jobs"
      # Every group the stage is for must be there: the preset's filter
      # passes when it matches nothing.
      local group
      for group in Concurrency ExecutorContract AttentionThreads DispatchThreads; do
        require_tests "$stage" "^$group\\." "the $group tests under ThreadSanitizer"
      done
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
      # The NEON kernels are what this stage is for.
      run_suite "$stage" "arm64+neon"
      ;;
    xsimd14)
      require_xsimd14_headers
      cmake --preset "$stage" >/dev/null
      cmake --build --preset "$stage" -j "$jobs"
      run_suite "$stage" "$(host_archs)"
      ;;
  esac
  echo "=== rope check: $stage passed in $((SECONDS - start)) s"
}

# A missing subject fails before any stage has run, not after the others.
for stage in "${stages[@]}"; do
  if [ "$stage" = xsimd14 ]; then require_xsimd14_headers; fi
done
for stage in "${stages[@]}"; do run_stage "$stage"; done
