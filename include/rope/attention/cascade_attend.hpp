// rope/attention/cascade_attend.hpp — one part of a cascade level
// (cascade.hpp): the query rows of every member against the part's keys,
// read once.
//
// The rows of key/value head g are those of its query heads in every
// member, R = M members x G = q_heads / kv_heads of them. Over the part's
// keys in blocks of kLevelBlock, each block's rows of every head widened to
// float once (token by token, in memory order; in the plane order of
// kernels/kv_planes.hpp, with the query rows and the sums kept in it),
// then per head g:
//
//   S = Q_g K^T                    (kernels/level_gemm.hpp, in the transposed layout S^T)
//   s_rj <- s_rj * scale_j         (scale, times key j's scale for int8)
//   softcap, then the online softmax of each row, a batch of rows at a time:
//     m' = max(m, max_j s_rj),  w_rj = exp(s_rj - m') (scores.hpp's steps),
//     l <- l exp(m - m') + sum_j w_rj,  acc_r <- acc_r exp(m - m')
//   w_rj <- w_rj * vscale_j        (int8)
//   acc_g += W V
//
// The decode loop's steps (kernels/kv_decode.hpp) but for the order in
// which each dot product and each sum of weights adds its terms;
// docs/attention.md bounds what that changes. Every member sees every key,
// so a key's NaN reaches exactly the members whose plain step reads it, and
// a member's NaN query only its own rows.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "../detail/inline.hpp"
#include "../detail/lines.hpp"
#include "../detail/prefetch.hpp"
#include "../detail/xsimd.hpp"
#include "../kernels/kv_decode.hpp"
#include "../kernels/kv_planes.hpp"
#include "../kernels/level_gemm.hpp"
#include "../kernels/scores.hpp"
#include "../view.hpp"
#include "cache.hpp"
#include "cascade.hpp"

namespace rope::attention {

// Keys per block of a level part.
constexpr std::size_t kLevelBlock = 64;

namespace detail {

// One worker's buffers for level parts of up to `members` members, each on
// whole cache lines (rs: a head's rows rounded up to a line of floats).
class LevelScratch {
 public:
  void grow(std::size_t members, std::size_t q_heads, std::size_t kv_heads, std::size_t d, std::size_t dv) {
    using rope::detail::line_floats;
    const std::size_t rows = members * (q_heads / kv_heads), rs = line_floats(rows);
    sizes_[0] = kv_heads * d * rs;                      // qt
    sizes_[1] = kLevelBlock * rs;                       // st
    sizes_[2] = kv_heads * kLevelBlock * d;             // keys
    sizes_[3] = kv_heads * kLevelBlock * dv;            // values
    sizes_[4] = kv_heads * rows * dv;                   // acc
    sizes_[5] = sizes_[6] = sizes_[7] = kv_heads * rs;  // m, l, carried
    sizes_[8] = sizes_[9] = kv_heads * kLevelBlock;     // key and value scales
    std::size_t total = 0;
    for (const std::size_t s : sizes_) total += line_floats(s);
    if (buffer_.size() < total + rope::detail::kLineFloats) buffer_.resize(total + rope::detail::kLineFloats);
    float* p = rope::detail::line_start(buffer_);
    for (std::size_t i = 0; i < kParts; ++i) {
      parts_[i] = p;
      p += line_floats(sizes_[i]);
    }
  }
  float* qt() const noexcept { return parts_[0]; }
  float* st() const noexcept { return parts_[1]; }
  float* keys() const noexcept { return parts_[2]; }
  float* values() const noexcept { return parts_[3]; }
  float* acc() const noexcept { return parts_[4]; }
  float* m() const noexcept { return parts_[5]; }
  float* l() const noexcept { return parts_[6]; }
  float* carried() const noexcept { return parts_[7]; }
  float* key_scales() const noexcept { return parts_[8]; }
  float* value_scales() const noexcept { return parts_[9]; }

  // The tile path's buffers (cascade_tiles.hpp): floats from a cache line
  // on, and 16-bit words, grown on first use.
  float* tile_floats(std::size_t n) {
    if (tile_floats_.size() < n + rope::detail::kLineFloats) tile_floats_.resize(n + rope::detail::kLineFloats);
    return rope::detail::line_start(tile_floats_);
  }
  std::uint16_t* tile_words(std::size_t n) {
    if (tile_words_.size() < n) {
      tile_words_.resize(n);
      tile_level_ = static_cast<std::size_t>(-1);
    }
    return tile_words_.data();
  }
  // One output row's floats (a block of a prompt's tokens on tiles).
  float* tile_row(std::size_t n) {
    if (tile_row_.size() < n) tile_row_.resize(n);
    return tile_row_.data();
  }
  // The level whose query rows the tile words hold (a level's parts share
  // them): the tile path packs them once per level and call.
  std::size_t& tile_level() noexcept { return tile_level_; }

 private:
  static constexpr std::size_t kParts = 10;
  std::vector<float> buffer_, tile_floats_, tile_row_;
  std::vector<std::uint16_t> tile_words_;
  std::size_t tile_level_ = static_cast<std::size_t>(-1);
  std::size_t sizes_[kParts] = {};
  float* parts_[kParts] = {};
};

// The n stored values of x widened into out in plane order
// (kernels/kv_planes.hpp): whole blocks by one vector load each, the rest
// in channel order.
template <class E, class Arch>
void widen_planes(const E* x, std::size_t n, float* out) noexcept {
  using F = xsimd::batch<float, Arch>;
  constexpr std::size_t P = KvElement<E>::kPerLane, W = P * F::size;
  const std::size_t full = n - n % W;
  for (std::size_t base = 0; base < full; base += W) {
    F planes[P];
    rope::detail::KvPlanes<E, Arch>::load(x + base, planes);
    for (std::size_t k = 0; k < P; ++k) planes[k].store_unaligned(out + base + k * F::size);
  }
  for (std::size_t c = full; c < n; ++c) out[c] = rope::detail::widen_value(x[c]);
}

// The keys each row of a block sees, for the rows of several tokens of one
// sequence (a prompt's tokens on tiles, cascade_tiles.hpp): row r sees the
// block's key j iff lo[r] <= j < hi[r] (whole floats, 0 to the block's
// keys). lo null: every row sees every key (a cascade level's members).
struct KeyRange {
  const float* lo = nullptr;
  const float* hi = nullptr;
};

// The online softmax of one block's scores of R rows (st: n keys of rs
// floats, rows side by side), head g's state at m, l, acc (R rows of dv);
// st left holding the weights, times the value scales for int8.
template <class Arch>
void level_softmax(float* st, std::size_t rs, std::size_t R, std::size_t n, std::size_t dv, const float* key_scales,
                   const float* value_scales, float softcap, float* m, float* l, float* carried, float* acc,
                   const KeyRange& seen = {}) noexcept {
  using F = xsimd::batch<float, Arch>;
  constexpr std::size_t L = F::size;
  const F cap(softcap), none(-std::numeric_limits<float>::infinity());
  // Each lane's logits, and their max, in one pass over the block.
  for (std::size_t r = 0; r < rs; r += L) {
    F top(-std::numeric_limits<float>::infinity()), lo = none, hi = none;
    if (seen.lo != nullptr) lo = F::load_aligned(seen.lo + r), hi = F::load_aligned(seen.hi + r);
    for (std::size_t j = 0; j < n; ++j) {
      F x = F::load_aligned(st + j * rs + r) * F(key_scales[j]);
      if (softcap > 0.0f) x = cap * xsimd::tanh(x / cap);
      if (seen.lo != nullptr) {  // after the cap: a key a row does not see is -inf, never -cap
        const F key(static_cast<float>(j));
        x = xsimd::select(key >= lo && key < hi, x, none);
      }
      x.store_aligned(st + j * rs + r);
      top = xsimd::select(x > top, x, top);  // a NaN compares false: skipped
    }
    const F old = F::load_aligned(m + r);
    xsimd::select(top > old, top, old).store_aligned(carried + r);  // m' for now
  }
  for (std::size_t r = 0; r < R; ++r) {
    const float m_new = carried[r];
    carried[r] = rope::detail::carry(m[r], m_new);
    m[r] = m_new;
    if (carried[r] != 1.0f) {
      for (std::size_t c = 0; c < dv; ++c) acc[r * dv + c] *= carried[r];
    }
  }
  for (std::size_t r = 0; r < rs; r += L) {
    F top = F::load_aligned(m + r);
    // A masked row that has seen no key yet: its -inf weights stay 0, not
    // -inf - -inf.
    if (seen.lo != nullptr) top = xsimd::select(top == none, F(0.0f), top);
    F sum(0.0f);
    for (std::size_t j = 0; j < n; ++j) {
      const F w = rope::detail::exp_weights<Arch>(F::load_aligned(st + j * rs + r) - top);
      sum = sum + w;
      (value_scales != nullptr ? w * F(value_scales[j]) : w).store_aligned(st + j * rs + r);
    }
    (F::load_aligned(l + r) * F::load_aligned(carried + r) + sum).store_aligned(l + r);
  }
}

// x rounded as the bf16 product mode rounds (kv_products.hpp): to nearest
// even, a subnormal result flushed to a zero of its sign.
ROPE_ALWAYS_INLINE float bf16_mode_value(float x) noexcept {
  std::uint16_t b = rope::detail::float_to_bfloat16_bits(x);
  if ((b & 0x7f80u) == 0) b &= 0x8000u;
  return rope::detail::bfloat16_bits_to_float(b);
}

// qt of every head g: [d x rs], column r = member r / G's query head g * G
// + r % G, its channels in the plane order the keys are widened in (the
// bf16 product mode: each rounded as that mode rounds q). row: 2 d floats.
template <class Q, class E, class Arch>
void level_queries(const View<const Q>& q, const std::size_t* members, std::size_t R, std::size_t G, std::size_t Hk,
                   std::size_t d, std::size_t rs, bool bf16, float* row, float* qt) noexcept {
  std::fill_n(qt, Hk * d * rs, 0.0f);
  for (std::size_t g = 0; g < Hk; ++g) {
    for (std::size_t r = 0; r < R; ++r) {
      widen_row(q.row(members[r / G], g * G + r % G), d, row + d);
      permute_row<E, Arch>(row + d, d, row);
      for (std::size_t c = 0; c < d; ++c) qt[(g * d + c) * rs + r] = bf16 ? bf16_mode_value(row[c]) : row[c];
    }
  }
}

// Level part `item` over the cache in `base` (its strides, heads and
// scales; pages: the level's sequence's), for members' tokens members[0 ..
// M): q rows from q, each member's state written to its partial (acc, m, l
// of every query head, partials + (item.partial + i) * q_heads * (dv + 2)).
// s has grown for M members.
template <class Q, class E, class Arch>
void attend_level(const LevelItem& item, std::size_t M, const std::size_t* members, const View<const Q>& q,
                  const KvKeys<E>& base, const LevelScratch& s, float* partials) noexcept {
  const std::size_t H = base.q_heads, Hk = base.kv_heads, G = H / Hk, R = M * G, d = base.d, dv = base.dv;
  const std::size_t ps = base.page_size, rs = rope::detail::line_floats(R);
  // The bf16 product mode without tiles (cascade_tiles.hpp): q and the
  // weights rounded as the tiles round them, the products in float.
  const bool bf16 = base.products == Products::bf16;
  level_queries<Q, E, Arch>(q, members, R, G, Hk, d, rs, bf16, s.keys(), s.qt());
  std::fill_n(s.acc(), Hk * R * dv, 0.0f);
  std::fill_n(s.m(), Hk * rs, -std::numeric_limits<float>::infinity());
  std::fill_n(s.l(), Hk * rs, 0.0f);
  const std::size_t end = item.first_key + item.keys;
  const auto rows_of = [&](std::size_t key, const E** k, const E** v, std::size_t* slot) noexcept {
    *slot = static_cast<std::size_t>(base.pages[key / ps]) * ps + key % ps;
    *k = base.k + (*slot / ps) * base.k_page_stride + (*slot % ps) * base.k_token_stride;
    *v = base.v + (*slot / ps) * base.v_page_stride + (*slot % ps) * base.v_token_stride;
  };
  // The first block's rows asked for now, each later block's during the
  // products of the block before it, a head's share at a time.
  const auto ask = [&](std::size_t from, std::size_t count, std::size_t part, std::size_t parts) noexcept {
    for (std::size_t j = from + count * part / parts; j < from + count * (part + 1) / parts; ++j) {
      const E* k = nullptr;
      const E* v = nullptr;
      std::size_t slot = 0;
      rows_of(j, &k, &v, &slot);
      for (std::size_t g = 0; g < Hk; ++g) {
        rope::detail::prefetch_l2(k + g * base.k_head_stride, d * sizeof(E));
        rope::detail::prefetch_l2(v + g * base.v_head_stride, dv * sizeof(E));
      }
    }
  };
  ask(item.first_key, std::min(kLevelBlock, item.keys), 0, 1);
  for (std::size_t c0 = item.first_key; c0 < end; c0 += kLevelBlock) {
    const std::size_t n = std::min(kLevelBlock, end - c0);
    // Head g's key j at keys() + (g * kLevelBlock + j) * d, its value likewise.
    for (std::size_t j = 0; j < n; ++j) {
      const E* k = nullptr;
      const E* v = nullptr;
      std::size_t slot = 0;
      rows_of(c0 + j, &k, &v, &slot);
      for (std::size_t g = 0; g < Hk; ++g) {
        const std::size_t at = g * kLevelBlock + j;
        widen_planes<E, Arch>(k + g * base.k_head_stride, d, s.keys() + at * d);
        widen_planes<E, Arch>(v + g * base.v_head_stride, dv, s.values() + at * dv);
        s.key_scales()[at] = base.k_scales != nullptr ? base.scale * base.k_scales[slot * Hk + g] : base.scale;
        if (base.v_scales != nullptr) s.value_scales()[at] = base.v_scales[slot * Hk + g];
      }
    }
    const std::size_t next = c0 + n, ahead = next < end ? std::min(kLevelBlock, end - next) : 0;
    for (std::size_t g = 0; g < Hk; ++g) {
      if (ahead > 0) ask(next, ahead, g, Hk);
      level_scores<Arch>(s.qt() + g * d * rs, rs, s.keys() + g * kLevelBlock * d, n, d, s.st());
      level_softmax<Arch>(s.st(), rs, R, n, dv, s.key_scales() + g * kLevelBlock,
                          base.v_scales != nullptr ? s.value_scales() + g * kLevelBlock : nullptr, base.softcap,
                          s.m() + g * rs, s.l() + g * rs, s.carried() + g * rs, s.acc() + g * R * dv);
      if (bf16) std::transform(s.st(), s.st() + n * rs, s.st(), [](float x) noexcept { return bf16_mode_value(x); });
      level_values<Arch>(s.st(), rs, R, s.values() + g * kLevelBlock * dv, n, dv, s.acc() + g * R * dv, dv);
    }
  }
  for (std::size_t i = 0; i < M; ++i) {
    float* part = partials + (item.partial + i) * H * (dv + 2);
    for (std::size_t g = 0; g < Hk; ++g) {
      for (std::size_t r = 0; r < G; ++r) {
        const std::size_t x = i * G + r, h = g * G + r;  // the row in head g's block, the query head
        unpermute_row<E, Arch>(s.acc() + (g * R + x) * dv, dv, part + h * dv);
        part[H * dv + h] = s.m()[g * rs + x];
        part[H * dv + H + h] = s.l()[g * rs + x];
      }
    }
  }
}

}  // namespace detail
}  // namespace rope::attention
