// Tensor shapes of real models, shared by rope_bench's cases.
#pragma once

#include <cstddef>

namespace rope_bench {

struct Shape {
  const char* name;
  std::size_t tokens;
  std::size_t heads;
  std::size_t head_dim;
  std::size_t rotary_dim;

  std::size_t elements() const { return tokens * heads * head_dim; }
};

// Small enough to stay in L2 (256 KiB of f32): the kernel's own speed.
constexpr Shape kL2Small{"l2_small", 64, 8, 128, 128};
// A small encoder: 512 tokens, 8 heads of 64.
constexpr Shape kEncoderSmall{"encoder_small", 512, 8, 64, 64};
// Llama-3-8B prefill of 4096 tokens, the 32 query heads of 128 (64 MiB f32).
constexpr Shape kLlama3Prefill{"llama3_8b_prefill", 4096, 32, 128, 128};

}  // namespace rope_bench
