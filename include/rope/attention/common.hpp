// rope/attention/common.hpp — what every attention header shares, in one
// include: the types (types.hpp), which keys a query sees (masks.hpp), the
// checks (checks.hpp) and the row operations, RoPE at a position among them
// (rows.hpp). Attention rotates Q and K, never V:
//   q_i -> R_(pq_i) q_i,  k_j -> R_(pk_j) k_j   (R_p: the library's rotation)
#pragma once

#include "checks.hpp"
#include "masks.hpp"
#include "rows.hpp"
#include "types.hpp"
