// rope/attention/pre_attention.hpp — the pieces of the step before attention
// that work on one token's rows while they are in L1 (append.hpp runs them):
// RMSNorm of each Q and K head (QK-norm), RoPE at the token's position, the
// rounding of Q into its output.
//
// RMSNorm, in float, as the reference models compute it (in f32), in the
// order of kernels/rms_norm.hpp, so that a plain loop reproduces the bits:
//   r = 1 / sqrt(sum_c x_c^2 / n + eps),  y_c = (x_c * r) * w_c   (or (x_c * r) * (1 + w_c): Gemma)
// over one head's head_dim channels (per-head QK-norm: Qwen3, Gemma 3) or
// over all of a token's Q (or K) channels at once (whole projection:
// OLMo 2), the weight holding that many values. One rounding of y into the
// stored type follows the rotation; models that round x * r to their
// activation type before the weight differ from this by that rounding.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "../detail/prefetch.hpp"
#include "../detail/simd.hpp"
#include "../kernels/kv_store.hpp"
#include "../kernels/rms_norm.hpp"
#include "../kernels/rotate.hpp"
#include "../multi_axis.hpp"
#include "../options.hpp"
#include "../table.hpp"
#include "../view.hpp"
#include "cache.hpp"
#include "rotation.hpp"

namespace rope::attention {

// The tokens per worker up to which append normalizes four heads
// at a time (rms_norm_rows; a decode step), one at a time above (a
// prefill). The same bits either way.
constexpr std::size_t kGroupedNormTokens = 64;
namespace detail {

// The norm of one side: per head, or over every head of the token at once.
struct Norm {
  const float* weight = nullptr;  // null: none
  float eps = 0;
  bool plus_one = false;
  bool whole = false;
  // The weights the rotation scales its inputs by (norm_rotate_store):
  // weight, or 1 + weight for plus_one. Null: not set.
  const float* rotated_weight = nullptr;
  // Per-head norms of a token several rows at a time (rms_norm_rows): the
  // same bits. Set for calls of few tokens per worker (a decode step), whose
  // rows are in cache and which wait on the norm's latency; a long prefill
  // waits on memory, where one row at a time overlapped better when
  // measured (bench_fused.cpp).
  bool grouped = false;
};

// rms_norm_row of x.heads rows (row h at x + h * x_stride) into out (row h
// at out + h * d), grouped or one by one as norm says.
template <class Arch>
void norm_heads(const float* x, std::size_t x_stride, std::size_t heads, std::size_t d, const Norm& norm,
                float* out) noexcept {
  if (norm.grouped) {
    rms_norm_rows<Arch>(x, x_stride, heads, d, norm.weight, norm.eps, norm.plus_one, out, d);
    return;
  }
  for (std::size_t h = 0; h < heads; ++h) {
    rms_norm_row<Arch>(x + h * x_stride, d, norm.weight, norm.eps, norm.plus_one, out + h * d);
  }
}

// Token t's rows of x (x.heads rows of d = x.head_dim values) into out (row
// h at out + h * d) as floats, normalized per head or over all of them
// (norm.weight null: only widened). A float row with a per-head norm is
// normalized straight from x: the widening copy is one pass fewer.
template <class In, class Arch>
void load_normed(const View<const In>& x, std::size_t t, const Norm& norm, float* out) noexcept {
  const std::size_t d = x.head_dim;
  if constexpr (std::is_same<In, float>::value) {
    if (norm.weight != nullptr && !norm.whole) {
      norm_heads<Arch>(x.row(t, 0), x.head_stride, x.heads, d, norm, out);
      return;
    }
  }
  for (std::size_t h = 0; h < x.heads; ++h) widen_row(x.row(t, h), d, out + h * d);
  if (norm.weight == nullptr) return;
  if (norm.whole) {
    rms_norm_row<Arch>(out, x.heads * d, norm.weight, norm.eps, norm.plus_one, out);
  } else {
    norm_heads<Arch>(out, d, x.heads, d, norm, out);
  }
}

// Token t's rows of `out` (out.heads rows of d = out.head_dim) = the rows of
// x (row h at x + h * d) rotated with one row of cos and sin (null: not
// rotated), each value rounded once into Out. A float out is rotated into
// straight from x (x is left as it was); any other type rotates x in place
// and rounds it on the way out.
template <class Arch, class Out>
void rotate_store(float* x, Style style, std::size_t rotary_dim, const float* cos, const float* sin,
                  const View<Out>& out, std::size_t t) noexcept {
  const std::size_t d = out.head_dim, heads = out.heads;
  if constexpr (std::is_same<Out, float>::value) {
    const std::size_t r = cos != nullptr ? rotary_dim : 0;
    if (r > 0) {
      with_style(style, [&](auto s) {
        rotate_heads<decltype(s)::value, float, Arch>(x, static_cast<std::ptrdiff_t>(d), out.row(t, 0),
                                                      static_cast<std::ptrdiff_t>(out.head_stride), heads, cos, sin, r);
      });
    }
    if (r < d) {
      for (std::size_t h = 0; h < heads; ++h) std::memcpy(out.row(t, h) + r, x + h * d + r, (d - r) * sizeof(float));
    }
  } else {
    if (cos != nullptr) rotate_with<float, Arch>(style, rotary_dim, cos, sin, x, static_cast<std::ptrdiff_t>(d), heads);
    for (std::size_t h = 0; h < heads; ++h) store_kv_row<Arch>(x + h * d, d, out.row(t, h), nullptr);
  }
}

// load_normed then rotate_store for float rows, a float out, a per-head
// norm and a rotation, in one pass less: the heads' sums of squares as
// load_normed takes them, then the rotation reads x itself and scales each
// input as it loads it (rotate_heads_scaled), the channels past rotary_dim
// scaled as rms_norm_row scales them. The same bits; out may be x (in
// place). r: room for x.heads floats.
template <class Arch>
void norm_rotate_store(const View<const float>& x, std::size_t t, const Norm& norm, Style style, std::size_t rotary_dim,
                       const float* cos, const float* sin, const View<float>& out, float* r) noexcept {
  const std::size_t d = x.head_dim, heads = x.heads;
  const float* row = x.row(t, 0);
  if (norm.grouped) {
    sum_squares8_rows<Arch>(row, x.head_stride, heads, d, r);
  } else {
    for (std::size_t h = 0; h < heads; ++h) r[h] = sum_squares8<Arch>(row + h * x.head_stride, d);
  }
  for (std::size_t h = 0; h < heads; ++h) r[h] = rms_inverse<Arch>(r[h], d, norm.eps);
  with_style(style, [&](auto s) {
    rotate_heads_scaled<decltype(s)::value, Arch>(row, static_cast<std::ptrdiff_t>(x.head_stride), out.row(t, 0),
                                                  static_cast<std::ptrdiff_t>(out.head_stride), heads, cos, sin,
                                                  rotary_dim, r, norm.rotated_weight);
  });
  if (rotary_dim < d) {
    for (std::size_t h = 0; h < heads; ++h) {
      rope::detail::scale_row<Arch>(x.row(t, h) + rotary_dim, d - rotary_dim, r[h], norm.weight + rotary_dim,
                                    norm.plus_one, out.row(t, h) + rotary_dim);
    }
  }
}

// Where a token's cos and sin come from: the table row of its one position,
// or, with multi-axis positions, each pair's from the row of its own axis'
// position, gathered into a row of rotary_dim floats as rope::apply_mrope
// gathers it (rope::detail::MultiAxis), so both round alike. No table:
// null, nothing is rotated.
struct TokenAngles {
  const Table<float>* table = nullptr;
  Positions positions = 0;  // one per token (not multi)
  bool multi = false;
  rope::detail::MultiAxis<float> axes{};

  // row: rotary_dim floats, written only with multi-axis positions.
  void of(std::size_t t, float* row, const float*& cos, const float*& sin) const noexcept {
    cos = sin = nullptr;
    if (table == nullptr) return;
    if (multi) {
      axes.row(t, row, cos, sin);
    } else {
      const auto m = static_cast<std::size_t>(positions.at(t));
      cos = table->cos(m);
      sin = table->sin(m);
    }
  }
};

// Asks for token t's Q, K and V rows ahead of their use: the token before
// it is worked on meanwhile, so its misses overlap that work.
template <class In>
void prefetch_token(const View<const In>& q, const View<const In>& k, const View<const In>& v, std::size_t t) noexcept {
  rope::detail::prefetch_rows(q.row(t, 0), q.heads, q.head_stride * sizeof(In), q.head_dim * sizeof(In));
  rope::detail::prefetch_rows(k.row(t, 0), k.heads, k.head_stride * sizeof(In), k.head_dim * sizeof(In));
  rope::detail::prefetch_rows(v.row(t, 0), v.heads, v.head_stride * sizeof(In), v.head_dim * sizeof(In));
}
}  // namespace detail
}  // namespace rope::attention
