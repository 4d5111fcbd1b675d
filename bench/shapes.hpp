// Tensor shapes of real models, shared by rope_bench's cases.
//
// A shape is a [tokens, heads, head_dim] tensor of contiguous head vectors
// whose first rotary_dim channels are rotated; the rest pass through. Token t
// sits at position t unless a case says otherwise (the decode step).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <vector>

#include <rope/fp8.hpp>
#include <rope/half.hpp>

namespace rope_bench {

struct Shape {
  const char* name;
  std::size_t tokens;
  std::size_t heads;
  std::size_t head_dim;
  std::size_t rotary_dim;

  std::size_t elements() const { return tokens * heads * head_dim; }
  std::size_t rows() const { return tokens * heads; }
};

// Small enough that input and output (2 x 256 KiB of f32) stay in L2: the
// kernel's own speed, not the memory's.
constexpr Shape kL2Small{"l2_small", 64, 8, 128, 128};
// A small encoder: 512 tokens, 8 heads of 64 (1 MiB of f32).
constexpr Shape kEncoderSmall{"encoder_small", 512, 8, 64, 64};
// Llama-3-8B prefill of 4096 tokens: the 32 query heads and the 8 key heads
// of 128, rotated as one [4096, 40, 128] tensor (80 MiB of f32), far past L2.
constexpr Shape kLlama3Prefill{"llama3_8b_prefill", 4096, 40, 128, 128};
constexpr std::size_t kLlama3QueryHeads = 32;
constexpr std::size_t kLlama3KeyHeads = 8;
// GPT-NeoX-20B: 64 heads of 96, rotary_dim 24 (25% partial rotary), 2048
// tokens (its context length), 48 MiB of f32.
constexpr Shape kNeox20bPartial{"neox20b_partial", 2048, 64, 96, 24};
// One Llama-3-8B decode step: the 40 query and key heads of one token at
// position kDecodePosition, looked up in a table of kDecodeTablePositions.
constexpr Shape kLlama3Decode{"llama3_8b_decode", 1, 40, 128, 128};
constexpr std::size_t kDecodePosition = 4000;
constexpr std::size_t kDecodeTablePositions = 8192;

// The name of a KV cache's element type in case names.
template <class E>
struct KvName;
template <>
struct KvName<float> {
  static constexpr const char* value = "f32";
};
template <>
struct KvName<rope::BFloat16> {
  static constexpr const char* value = "bf16";
};
template <>
struct KvName<rope::Float16> {
  static constexpr const char* value = "f16";
};
template <>
struct KvName<std::int8_t> {
  static constexpr const char* value = "i8";
};
// fp8 E4M3 under the name the cases were asked for by, E5M2 beside it.
template <>
struct KvName<rope::Float8E4M3> {
  static constexpr const char* value = "fp8";
};
template <>
struct KvName<rope::Float8E5M2> {
  static constexpr const char* value = "fp8e5m2";
};

// An allocator of 64-byte aligned blocks, for buffers that stand for an
// engine's tensors and caches, which are allocated on cache lines (or
// pages); a plain std::vector of a large size starts 16 bytes into a line
// here, a placement no engine gives its tensors.
template <class T>
struct LineAllocator {
  using value_type = T;
  static constexpr std::size_t kLine = 64;
  LineAllocator() = default;
  template <class U>
  LineAllocator(const LineAllocator<U>&) noexcept {}
  T* allocate(std::size_t n) {
    const std::size_t bytes = (n * sizeof(T) + kLine - 1) / kLine * kLine;
    void* p = std::aligned_alloc(kLine, bytes > 0 ? bytes : kLine);
    if (p == nullptr) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, std::size_t) noexcept { std::free(p); }
  template <class U>
  bool operator==(const LineAllocator<U>&) const noexcept {
    return true;
  }
  template <class U>
  bool operator!=(const LineAllocator<U>&) const noexcept {
    return false;
  }
};
template <class T>
using LineVector = std::vector<T, LineAllocator<T>>;

}  // namespace rope_bench
