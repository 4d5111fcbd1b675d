// rope/multi_axis.hpp — RoPE whose pairs follow different position axes:
// M-RoPE for vision-language models (time, height, width) and 2-D axial RoPE
// for image patches.
//
//   pair p of token t is rotated by positions[axis(p)][t] * theta_p
//
// With every axis holding the same positions this is plain RoPE. Positions
// are axis-major: positions[axis * tokens + t]. Which axis each pair follows
// is a PairAxes (pair_axes.hpp, which this header includes): built from
// Qwen-style sections (chunked or interleaved), from ERNIE-4.5-VL's
// alternating layout, or listed pair by pair. Tensors and options as in
// apply.hpp; every argument is checked before anything is written.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "apply.hpp"
#include "frequencies.hpp"
#include "pair_axes.hpp"

namespace rope {

namespace detail {

// The name of axis a in messages: t, h, w for three axes, row, col for two,
// "axis a" otherwise.
inline std::string axis_name(std::size_t a, std::size_t axes) {
  static const char* const kThree[3] = {"t", "h", "w"};
  static const char* const kTwo[2] = {"row", "col"};
  if (axes == 3) return kThree[a];
  if (axes == 2) return kTwo[a];
  return "axis " + to_text(a);
}

// A PairAxes fits rotary_dim/2 pairs and names only axes that exist. name:
// how the caller spells its fields ("pair_axes." for apply_mrope's
// argument, "options.pair_axes->" for a pointer in an options struct).
inline void check_pair_axes(const char* fn, const PairAxes& pa, std::size_t pairs, const char* name = "pair_axes.") {
  const auto member = [name](const char* m) { return std::string(name) + m; };
  if (pa.axes == 0 || pa.axes > 256) fail(fn, member("axes"), "in [1, 256]", pa.axes);
  if (pa.axis.size() != pairs) fail(fn, member("axis.size()"), {"rotary_dim/2 = ", pairs}, pa.axis.size());
  for (std::size_t p = 0; p < pairs; ++p) {
    if (pa.axis[p] >= pa.axes) fail(fn, {member("axis"), "[", p, "]"}, {"< axes = ", pa.axes}, pa.axis[p]);
  }
}

template <class Arch, class T, class U>
void apply_axes(const char* fn, const View<T>& x, const Table<U>& table, Style style, const std::int64_t* positions,
                std::size_t axes, const std::vector<std::uint8_t>& axis_of_pair, std::size_t rotary_dim,
                const Options& options) {
  const Pass<T> pass{x, x};
  static const char* const kName[1] = {"x"};
  check_passes(fn, &pass, 1, kName, kName);
  check_rotary_fits(fn, kName, &pass, 1, rotary_dim);
  if (positions == nullptr) fail(fn, "positions", "non-null", nullptr);
  for (std::size_t a = 0; a < axes; ++a) {
    const std::string name = axis_name(a, axes) + " positions";
    check_positions(fn, positions + a * x.tokens, x.tokens, table.positions(), PositionNames{name.c_str(), "offset"});
  }
  const MultiAxis<U> source{table.cos(0), table.rotary_dim() / 2, positions,
                            x.tokens,     axis_of_pair.data(),    rotary_dim / 2};
  run_loop<Arch>(style, &pass, 1, source, rotary_dim, options);
}

}  // namespace detail

// Multi-axis RoPE in place with any pair -> axis layout: positions is
// [pair_axes.axes, tokens]; pair p is rotated by
// positions[pair_axes.axis[p]] * theta_p. pair_axes lists rotary_dim/2 axes.
template <class T, class U, class Arch = xsimd::default_arch>
void apply_mrope(View<T> x, const Table<U>& table, Style style, const std::int64_t* positions,
                 const PairAxes& pair_axes, Options options = {}) {
  detail::check_types<T, U>();
  const char* fn = "rope::apply_mrope";
  const std::size_t rotary_dim = detail::checked_rotary_dim(fn, options, table.rotary_dim());
  detail::check_pair_axes(fn, pair_axes, rotary_dim / 2);
  detail::apply_axes<Arch>(fn, x, table, style, positions, pair_axes.axes, pair_axes.axis, rotary_dim, options);
}

// M-RoPE in place: positions is [3, tokens] (all t, then all h, then all w);
// pair p is rotated by positions[axis(p)] * theta_p, axis(p) given by the
// sections. With all three axes equal this is plain RoPE.
template <class T, class U, class Arch = xsimd::default_arch>
void apply_mrope(View<T> x, const Table<U>& table, Style style, const std::int64_t* positions,
                 const MropeSections& sections, Options options = {}) {
  const char* fn = "rope::apply_mrope";
  const std::size_t rotary_dim = detail::checked_rotary_dim(fn, options, table.rotary_dim());
  apply_mrope<T, U, Arch>(x, table, style, positions, PairAxes{detail::mrope_axes(fn, sections, rotary_dim / 2), 3},
                          options);
}

// 2-D axial RoPE in place for image patches: positions is [2, tokens] (all
// rows, then all columns); the first rotary_dim/4 pairs follow the row, the
// rest the column. Build the table from axial_frequencies for the usual
// schedule, one rotary_dim/2-channel RoPE per axis.
template <class T, class U, class Arch = xsimd::default_arch>
void apply_axial(View<T> x, const Table<U>& table, Style style, const std::int64_t* positions, Options options = {}) {
  detail::check_types<T, U>();
  const char* fn = "rope::apply_axial";
  const std::size_t rotary_dim = detail::checked_rotary_dim(fn, options, table.rotary_dim());
  if (rotary_dim % 4 != 0) {
    detail::fail(fn, "rotary_dim", "a multiple of 4 (two axes of pairs)", rotary_dim);
  }
  std::vector<std::uint8_t> axes(rotary_dim / 2, 0);
  std::fill(axes.begin() + static_cast<std::ptrdiff_t>(rotary_dim / 4), axes.end(), std::uint8_t{1});
  detail::apply_axes<Arch>(fn, x, table, style, positions, 2, axes, rotary_dim, options);
}

}  // namespace rope
