// rope/attention/call_options.hpp — what a one-head or multi-head softmax or
// linear attention call (softmax.hpp, linear.hpp) takes besides its tensors:
// MaskOptions (masks.hpp: the mask, positions, sequence ids, threads), the
// softmax's Logits (logits.hpp: scale, softcap, sinks, in that order) and
// each kind's own fields. The serving path says the same things with the
// same types: Logits, Mask, Threads (attend.hpp, plan.hpp).
#pragma once

#include <cstddef>

#include "logits.hpp"
#include "masks.hpp"

namespace rope::attention {

struct SoftmaxOptions : MaskOptions {
  Logits logits;
  // Rows of the score tile on each side: query rows (a group's heads times
  // tokens) and keys per block. 256 x 256 scores of f32: 256 KiB.
  std::size_t block = 256;
  bool keys_rotated = false;  // K already rotated (a KV cache): rotate Q only
};

// Linear attention sums prefixes: a sliding window (mask.window) is refused.
struct LinearOptions : MaskOptions {
  std::size_t chunk = 64;  // tokens per chunk of the prefix sums
  double delta = 1e-6;     // the guard g
};

}  // namespace rope::attention
