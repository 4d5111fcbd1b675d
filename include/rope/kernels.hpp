// rope/kernels.hpp — the SIMD row kernels, unchecked, written once per
// element type and xsimd architecture (Arch):
//   kernels/rotate.hpp     RoPE on the head vectors of one position
//                          (rotate, rotate_heads, the 16-bit rows).
// Attention's kernels live beside it and come with <rope/attention.hpp>:
//   kernels/kv_planes.hpp  a KV cache's element types widened to float lanes;
//   kernels/kv_dot.hpp     query rows against a cached key, weights against
//                          cached values;
//   kernels/scores.hpp     a row of scores: max, softcap, exp weights, and
//                          the online-softmax state's carry and merge;
//   kernels/kv_decode.hpp  the decode loop over a sequence's paged keys;
//   kernels/kv_store.hpp   a row rounded once into the cache's type;
//   kernels/dense_dot.hpp  the thin products of the one-head softmax;
//   kernels/rms_norm.hpp   RMSNorm in a fixed order (the QK-norm).
// Each has a scalar twin in reference.hpp that reads like the math; the
// checked callers are the tensor API (apply.hpp) and the attention module.
#pragma once

#include "kernels/rotate.hpp"
