// rope/detail/lines.hpp — scratch rows on whole cache lines.
//
// A vector load that straddles two 64-byte lines costs two loads, and two
// threads writing one line take it from each other. Scratch rows read with
// vector loads start on a line, and each worker's scratch on lines of its
// own: sizes are rounded up to whole lines and a buffer's first line
// boundary is where its rows begin.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace rope::detail {

// Floats per 64-byte line, and n floats rounded up to whole lines.
constexpr std::size_t kLineFloats = 64 / sizeof(float);
constexpr std::size_t line_floats(std::size_t n) noexcept { return (n + kLineFloats - 1) / kLineFloats * kLineFloats; }

// The first line boundary in buffer, which must hold kLineFloats - 1 floats
// more than the rows it is used for.
inline float* line_start(std::vector<float>& buffer) noexcept {
  const std::size_t skew = reinterpret_cast<std::uintptr_t>(buffer.data()) % 64 / sizeof(float);
  return buffer.data() + (kLineFloats - skew) % kLineFloats;
}

}  // namespace rope::detail
