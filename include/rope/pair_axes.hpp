// rope/pair_axes.hpp — which position axis each pair of the rotary part
// follows: the data of M-RoPE (time, height, width) and its builders, with
// no kernels, so that code describing a model (rope::hf) need not compile
// them.
//
//   pair p of token t is rotated by positions[axis[p]][t] * theta_p
//
// A PairAxes is built from Qwen-style sections (chunked or interleaved),
// from ERNIE-4.5-VL's alternating layout, or listed pair by pair; multi_axis.hpp
// applies it (rope::apply_mrope).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "detail/fail.hpp"

namespace rope {

// M-RoPE: which pairs of the rotary part follow which axis of (t, h, w).
//   chunked:     pairs [0, s0) follow t, [s0, s0+s1) h, the rest w (Qwen2-VL);
//   interleaved: pair p follows h if p % 3 == 1 and p / 3 < s1, w if
//                p % 3 == 2 and p / 3 < s2, t otherwise (Qwen3-VL).
// s0 + s1 + s2 must equal rotary_dim / 2.
enum class SectionOrder { chunked, interleaved };
struct MropeSections {
  std::array<std::size_t, 3> pairs{};
  SectionOrder order = SectionOrder::chunked;
};

// The axis each pair of the rotary part follows: axis[p] < axes for
// p = 0 .. rotary_dim/2 - 1, and positions hold `axes` rows of one position
// per token. Any layout is a PairAxes; the builders below give the ones
// published models use:
//   sections(s, pairs)    Qwen2-VL / Qwen2.5-VL / GLM-4V (chunked) and
//                         Qwen3-VL (interleaved) sections over (t, h, w);
//   hw_alternating(hw, pairs)
//                         ERNIE-4.5-VL: pairs [0, hw) alternate h (even p) and
//                         w (odd p), the remaining pairs follow t.
// The pairing (which channels form pair p) is the Style, as everywhere.
struct PairAxes {
  std::vector<std::uint8_t> axis;
  std::size_t axes = 3;

  static PairAxes sections(const MropeSections& s, std::size_t pairs);
  static PairAxes hw_alternating(std::size_t hw_pairs, std::size_t pairs);
};

namespace detail {

// Which axis each pair follows, checked against the sections.
inline std::vector<std::uint8_t> mrope_axes(const char* fn, const MropeSections& sections, std::size_t pairs) {
  const auto& s = sections.pairs;
  const std::string listed = "(" + to_text(s[0]) + ", " + to_text(s[1]) + ", " + to_text(s[2]) + ")";
  if (s[0] + s[1] + s[2] != pairs) {
    fail(fn, "the sum of sections.pairs " + listed, {"rotary_dim/2 = ", pairs}, s[0] + s[1] + s[2]);
  }
  std::vector<std::uint8_t> axis(pairs, 0);
  std::array<std::size_t, 3> counted{};
  for (std::size_t p = 0; p < pairs; ++p) {
    if (sections.order == SectionOrder::chunked) {
      axis[p] = p < s[0] ? 0 : (p < s[0] + s[1] ? 1 : 2);
    } else if (p % 3 == 1 && p / 3 < s[1]) {
      axis[p] = 1;
    } else if (p % 3 == 2 && p / 3 < s[2]) {
      axis[p] = 2;
    }
    ++counted[axis[p]];
  }
  if (counted != s) {
    fail(fn, "sections.pairs", {"interleavable over ", pairs, " pairs (p % 3 == axis, p / 3 < section)"}, listed);
  }
  return axis;
}

}  // namespace detail

inline PairAxes PairAxes::sections(const MropeSections& s, std::size_t pairs) {
  return PairAxes{detail::mrope_axes("rope::PairAxes::sections", s, pairs), 3};
}

inline PairAxes PairAxes::hw_alternating(std::size_t hw_pairs, std::size_t pairs) {
  const char* fn = "rope::PairAxes::hw_alternating";
  if (hw_pairs % 2 != 0 || hw_pairs > pairs) {
    detail::fail(fn, "hw_pairs", {"even and <= pairs = ", pairs}, hw_pairs);
  }
  PairAxes out{std::vector<std::uint8_t>(pairs, 0), 3};
  for (std::size_t p = 0; p < hw_pairs; ++p) out.axis[p] = p % 2 == 0 ? 1 : 2;
  return out;
}

}  // namespace rope
