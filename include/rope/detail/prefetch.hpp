// rope/detail/prefetch.hpp — asking for memory before it is read.
//
// Rows read with a stride of a page or more (a token's heads in a
// token-major tensor, one head of a KV cache) defeat the hardware
// prefetchers, which stay within a page: a loop over such rows keeps too few
// misses in flight to reach memory bandwidth unless it asks ahead.
#pragma once

#include <cstddef>

#include "inline.hpp"

namespace rope::detail {

// Prefetches `bytes` from p into the caches (for reading). Forced inline:
// called from code compiled once per instruction set (inline.hpp).
ROPE_ALWAYS_INLINE void prefetch(const void* p, std::size_t bytes) noexcept {
#if defined(__GNUC__)
  const auto* c = static_cast<const char*>(p);
  for (std::size_t i = 0; i < bytes; i += 64) __builtin_prefetch(c + i, 0, 3);
#else
  (void)p;
  (void)bytes;
#endif
}

// Prefetches `rows` rows of `bytes` each, row r at p + r * stride bytes.
ROPE_ALWAYS_INLINE void prefetch_rows(const void* p, std::size_t rows, std::size_t stride, std::size_t bytes) noexcept {
  const auto* c = static_cast<const char*>(p);
  for (std::size_t r = 0; r < rows; ++r) prefetch(c + r * stride, bytes);
}

// Prefetches `bytes` from p into the outer caches only (L2 and beyond where
// the processor tells the levels apart).
ROPE_ALWAYS_INLINE void prefetch_l2(const void* p, std::size_t bytes) noexcept {
#if defined(__GNUC__)
  const auto* c = static_cast<const char*>(p);
  for (std::size_t i = 0; i < bytes; i += 64) __builtin_prefetch(c + i, 0, 2);
#else
  (void)p;
  (void)bytes;
#endif
}

}  // namespace rope::detail
