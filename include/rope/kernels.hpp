// rope/kernels.hpp — the SIMD row kernels, unchecked, written once per
// element type and xsimd architecture (Arch):
//   kernels/rotate.hpp          RoPE on the head vectors of one position
//                               (rotate, rotate_heads, the 16-bit rows);
//   kernels/attention_rows.hpp  attention's rows: dot products of query rows
//                               with a key, weighted sums of value rows;
//   kernels/kv_rows.hpp         the same over a KV cache of float, bfloat16,
//                               float16 or int8, and a row's softmax.
// Each has a scalar twin in reference.hpp that reads like the math; the
// checked callers are the tensor API (apply.hpp) and the attention module.
#pragma once

#include "kernels/attention_rows.hpp"
#include "kernels/kv_rows.hpp"
#include "kernels/rotate.hpp"
