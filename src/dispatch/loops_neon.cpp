// rope::dispatch: the token loop for NEON on aarch64 (every aarch64 CPU).
// Compiled without extra flags; the one table of an aarch64 build.
#include "isa.hpp"

ROPE_DISPATCH_DEFINE_LOOPS(neon, xsimd::neon64)
