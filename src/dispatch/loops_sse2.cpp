// rope::dispatch: the token loop for SSE2, the x86-64 baseline every
// x86-64 CPU runs. Compiled without extra flags.
#include "isa.hpp"

ROPE_DISPATCH_DEFINE_LOOPS(sse2, xsimd::sse2)
