// rope/detail/stream.hpp — copies with non-temporal (streaming) stores.
//
// A plain store to a line that is not in cache first reads the line
// (read-for-ownership), so writing N bytes of a large output moves 2N bytes;
// a streaming store writes the line without reading it, as large memcpy
// calls do. Worth it only for outputs much larger than the cache, and a
// streamed line is not in cache afterwards. Uses the widest store the
// compiler flags enable; with none of them this is memcpy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__AVX512F__) || defined(__AVX__) || defined(__SSE2__)
#include <immintrin.h>
#endif

namespace rope::detail {

#if defined(__AVX512F__)
constexpr std::size_t kStreamWidth = 64;
#elif defined(__AVX__)
constexpr std::size_t kStreamWidth = 32;
#elif defined(__SSE2__)
constexpr std::size_t kStreamWidth = 16;
#else
constexpr std::size_t kStreamWidth = 0;
#endif

// Copies bytes from src to dst (no overlap). The part of dst aligned to
// kStreamWidth is written with streaming stores, the ragged ends with memcpy.
// Call stream_fence() before another thread may read dst.
inline void stream_copy(void* dst, const void* src, std::size_t bytes) noexcept {
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
#if defined(__AVX512F__) || defined(__AVX__) || defined(__SSE2__)
  const std::size_t misalign = reinterpret_cast<std::uintptr_t>(d) % kStreamWidth;
  const std::size_t head = misalign == 0 ? 0 : kStreamWidth - misalign;
  if (head >= bytes) {
    std::memcpy(d, s, bytes);
    return;
  }
  std::memcpy(d, s, head);
  d += head;
  s += head;
  bytes -= head;
  for (; bytes >= kStreamWidth; bytes -= kStreamWidth, d += kStreamWidth, s += kStreamWidth) {
#if defined(__AVX512F__)
    _mm512_stream_si512(reinterpret_cast<__m512i*>(d), _mm512_loadu_si512(s));
#elif defined(__AVX__)
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d),
                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s)));
#else
    _mm_stream_si128(reinterpret_cast<__m128i*>(d), _mm_loadu_si128(reinterpret_cast<const __m128i*>(s)));
#endif
  }
#endif
  std::memcpy(d, s, bytes);
}

// Orders this thread's streaming stores before its later stores (and so
// before a join that publishes them).
inline void stream_fence() noexcept {
#if defined(__AVX512F__) || defined(__AVX__) || defined(__SSE2__)
  _mm_sfence();
#endif
}

}  // namespace rope::detail
