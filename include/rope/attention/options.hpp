// rope/attention/options.hpp — what a softmax or linear attention call takes
// besides its tensors: MaskOptions' positions, causality, sequence ids,
// threads and executor (masks.hpp), and each kind's own fields.
//
// Softmax scores, in this order (softmax.hpp):
//   s_ij = scale * q_i . k_j
//   s_ij <- cap * tanh(s_ij / cap)                 (softcap set: Gemma 2, Grok)
//   j visible to i only (the mask, after the softcap)
//   out_i = sum_j exp(s_ij - M) v_j / (exp(sink_h - M) + sum_j exp(s_ij - M))
// with sink_h the sink of query head h (sinks set: gpt-oss; a logit in the
// denominator only, never a value) and M the row's max, sink included.
#pragma once

#include <cstddef>
#include <optional>
#include <vector>

#include "masks.hpp"

namespace rope::attention {

// Positions, causality, sequence ids and threads (over key/value heads,
// then over query blocks) are MaskOptions' (masks.hpp).
struct SoftmaxOptions : MaskOptions {
  std::optional<double> scale;  // empty: 1/sqrt(d)
  // Rows of the score tile on each side: query rows (a group's heads times
  // tokens) and keys per block. 256 x 256 scores of f32: 256 KiB.
  std::size_t block = 256;
  std::size_t window = 0;     // > 0: key j visible to query i only if pk_j > pq_i - window
  bool keys_rotated = false;  // K already rotated (a KV cache): rotate Q only
  // Logit softcap: scores become cap * tanh(s / cap) before the mask; set:
  // finite and > 0.
  std::optional<double> softcap;
  // Attention sinks: one logit per query head, in the denominator only.
  // Empty: none; else one per query head (1 for the one-head matrix
  // overload, q.heads for views). -inf is "no sink" for that head; NaN and
  // +inf are refused (either would poison every row of the head).
  std::vector<double> sinks;
};

// Positions, causality, sequence ids and threads (over key/value heads, and
// query blocks when not causal) are MaskOptions' (masks.hpp).
struct LinearOptions : MaskOptions {
  std::size_t chunk = 64;  // tokens per chunk of the prefix sums
  double delta = 1e-6;     // the guard g
};

}  // namespace rope::attention
