// rope/detail/stream.hpp — copies with non-temporal (streaming) stores.
//
// A plain store to a line that is not in cache first reads the line
// (read-for-ownership), so writing N bytes of a large output moves 2N bytes;
// a streaming store writes the line without reading it, as large memcpy
// calls do. Worth it only for outputs much larger than the cache, and a
// streamed line is not in cache afterwards.
//
// Templated on the xsimd architecture, like the kernels that call it: the
// store is as wide as Arch's vectors (16, 32 or 64 bytes on x86), so the
// copy compiled for one instruction set never stands in for another's.
// Architectures without streaming stores in rope (Arm) use memcpy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "xsimd.hpp"

#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__) || defined(_M_IX86)
#include <immintrin.h>
#define ROPE_STREAMING_STORES 1
#else
#define ROPE_STREAMING_STORES 0
#endif

namespace rope::detail {

// Copies bytes from src to dst (no overlap). The whole 64-byte lines of dst
// are written with streaming stores, the ragged ends (parts of lines that
// dst shares with what lies before and after it) with memcpy. Never both in
// one line: a line written partly streamed and partly stored is read for
// ownership and its streamed part flushed early, which cost a row writer
// twice to three times its time when rows started 16 bytes into a line
// (bench_fused.cpp's buffers before they were aligned).
// Call stream_fence() before another thread may read dst.
template <class Arch>
void stream_copy(void* dst, const void* src, std::size_t bytes) noexcept {
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
#if ROPE_STREAMING_STORES
  constexpr std::size_t kWidth = sizeof(xsimd::batch<float, Arch>);
  constexpr std::size_t kLine = 64;
  static_assert(kLine % kWidth == 0, "a line is a whole number of vectors");
  const std::size_t misalign = reinterpret_cast<std::uintptr_t>(d) % kLine;
  const std::size_t head = misalign == 0 ? 0 : kLine - misalign;
  if (head >= bytes) {
    std::memcpy(d, s, bytes);
    return;
  }
  std::memcpy(d, s, head);
  d += head;
  s += head;
  bytes -= head;
  for (; bytes >= kLine; bytes -= kLine) {
    for (std::size_t i = 0; i < kLine; i += kWidth, d += kWidth, s += kWidth) {
      if constexpr (kWidth == 64) {
        _mm512_stream_si512(reinterpret_cast<__m512i*>(d), _mm512_loadu_si512(s));
      } else if constexpr (kWidth == 32) {
        _mm256_stream_si256(reinterpret_cast<__m256i*>(d), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s)));
      } else {
        _mm_stream_si128(reinterpret_cast<__m128i*>(d), _mm_loadu_si128(reinterpret_cast<const __m128i*>(s)));
      }
    }
  }
#endif
  std::memcpy(d, s, bytes);
}

// Orders this thread's streaming stores before its later stores (and so
// before a join that publishes them).
template <class Arch>
void stream_fence() noexcept {
#if ROPE_STREAMING_STORES
  _mm_sfence();
#endif
}

}  // namespace rope::detail
