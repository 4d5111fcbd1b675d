#!/usr/bin/env bash
# Prints the instruction sets, by xsimd's names, that rope's suite built for
# this machine must run (ROPE_EXPECT_ARCHS of Architectures.* in
# tests/test_kernels_attention_rows.cpp): read from the CPU's flags, so that
# a machine with AVX-512 cannot pass while the AVX-512 kernels went untested.
#   x86-64:  sse2, plus fma3+avx2 and avx512bw where the CPU has them
#   aarch64: arm64+neon
# Anything else prints nothing and fails: there is nothing to expect.
#   scripts/expected_archs.sh            e.g. "sse2,fma3+avx2,avx512bw"
set -euo pipefail
case "$(uname -m)" in
  x86_64)
    expect=sse2
    if grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo; then expect="$expect,fma3+avx2"; fi
    if grep -qw avx512bw /proc/cpuinfo; then expect="$expect,avx512bw"; fi
    echo "$expect"
    ;;
  aarch64) echo "arm64+neon" ;;
  *)
    echo "scripts/expected_archs.sh: no instruction sets known for $(uname -m)" >&2
    exit 1
    ;;
esac
