// rope/attention/options.hpp — what a softmax or linear attention call takes
// besides its tensors: MaskOptions' positions, causality, sequence ids and
// threads (masks.hpp), and each kind's own fields.
#pragma once

#include <cstddef>
#include <optional>

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
};

// Positions, causality, sequence ids and threads (over key/value heads, and
// query blocks when not causal) are MaskOptions' (masks.hpp).
struct LinearOptions : MaskOptions {
  std::size_t chunk = 64;  // tokens per chunk of the prefix sums
  double delta = 1e-6;     // the guard g
};

}  // namespace rope::attention
