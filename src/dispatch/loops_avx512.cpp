// rope::dispatch: the token loop for AVX-512 F/CD/DQ/BW (Intel Skylake-SP,
// AMD Zen 4 and later). xsimd's avx512bw, not avx512f: it is the architecture
// xsimd picks for -march=native on every one of those CPUs, so this table is
// the same code as a native build; the float kernels use only AVX-512F
// instructions either way, and the only CPUs with AVX-512F but not BW (Xeon
// Phi) fall back to AVX2. Compiled with -mavx512f -mavx512cd -mavx512dq
// -mavx512bw -mavx2 -mfma.
#include "isa.hpp"

ROPE_DISPATCH_DEFINE_LOOPS(avx512, xsimd::avx512bw)
