// rope/attention/common.hpp — what the one-head and multi-head calls
// (softmax.hpp, linear.hpp, features.hpp) share, in one include: the types
// (types.hpp, Rotation from rotation.hpp), their options (call_options.hpp:
// the mask, positions, logits, threads), the checks (call_checks.hpp) and the
// row operations on their matrices (matrix_ops.hpp). Attention rotates Q and
// K, never V:
//   q_i -> R_(pq_i) q_i,  k_j -> R_(pk_j) k_j   (R_p: the library's rotation)
#pragma once

#include "call_checks.hpp"
#include "call_options.hpp"
#include "masks.hpp"
#include "matrix_ops.hpp"
#include "types.hpp"
