// rope::dispatch: the token loop for AVX2 with FMA (Intel Haswell, AMD Zen
// and later). Compiled with -mavx2 -mfma.
#include "isa.hpp"

ROPE_DISPATCH_DEFINE_LOOPS(avx2, xsimd::fma3<xsimd::avx2>)
