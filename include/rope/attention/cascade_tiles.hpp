// rope/attention/cascade_tiles.hpp — one part of a cascade level in the
// bf16 product mode over a bf16 cache, on AMX tiles
// (kernels/level_tiles.hpp): attend_level's steps (cascade_attend.hpp) with
// q rounded as the mode rounds it, the scores S^T = K Q^T by tdpbf16ps,
// the online softmax as there (level_softmax), the weights rounded to bf16
// to nearest even, and acc += W V by tdpbf16ps. Keys and values are read
// as stored; per block of kLevelBlock keys and per key/value head they are
// copied into the tiles' order (keys as rows, values in pairs of keys).
// Rows are padded to a multiple of 32 with zero queries, channels with
// zeros, keys past the part with zero rows and zero weights.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include "../detail/prefetch.hpp"
#include "../half.hpp"
#include "../kernels/kv_decode.hpp"
#include "../kernels/kv_products.hpp"
#include "../kernels/level_tiles.hpp"
#include "../view.hpp"
#include "cascade.hpp"
#include "cascade_attend.hpp"

namespace rope::attention::detail {

// Whether attend runs the bf16 mode's cascade levels on tiles for Arch's
// code on this CPU (tests turn the mode's hardware off, as for the decode
// loop's vdpbf16ps: products_hardware_allowed).
template <class Arch>
bool level_tiles_run() noexcept {
  if constexpr (rope::detail::kTilesArch<Arch>) {
    return rope::detail::products_hardware_allowed() && rope::detail::amx_bf16_runs<Arch>();
  } else {
    return false;
  }
}

#if defined(__x86_64__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__GNUC__)

// q of every member's rows, head by head, in the pairs tile_scores reads:
// qv + g * dk * rows, rows padded with zeros. row: dk words.
template <class Q, class Arch>
void tile_queries(const View<const Q>& q, const std::size_t* members, std::size_t R, std::size_t G, std::size_t Hk,
                  std::size_t d, std::size_t rows, float* wide, std::uint16_t* row, std::uint16_t* qv) noexcept {
  const std::size_t dk = rope::detail::tile_span(d);
  std::fill_n(qv, Hk * dk * rows, std::uint16_t{0});
  for (std::size_t g = 0; g < Hk; ++g) {
    std::uint16_t* head = qv + g * dk * rows;
    for (std::size_t r = 0; r < R; ++r) {
      widen_row(q.row(members[r / G], g * G + r % G), d, wide);
      rope::detail::bf16_query(wide, d, row);
      for (std::size_t c = 0; c < d; ++c) head[(c / 2) * rows * 2 + r * 2 + c % 2] = row[c];
    }
  }
}

// Level part `item` in the bf16 mode (see attend_level for the arguments).
template <class Q, class Arch>
void attend_level_tiles(const LevelItem& item, std::size_t M, const std::size_t* members, const View<const Q>& q,
                        const KvKeys<BFloat16>& base, LevelScratch& s, float* partials) noexcept {
  const std::size_t H = base.q_heads, Hk = base.kv_heads, G = H / Hk, R = M * G, d = base.d, dv = base.dv;
  const std::size_t ps = base.page_size, rows = rope::detail::tile_span(R), dk = rope::detail::tile_span(d),
                    da = rope::detail::tile_span(dv);
  constexpr std::size_t kw = kLevelBlock;
  float* st = s.tile_floats(kw * rows + Hk * rows * (da + 3) + kw + dk);
  float *acc = st + kw * rows, *m = acc + Hk * rows * da, *l = m + Hk * rows, *carried = l + Hk * rows;
  float *scales = carried + Hk * rows, *wide = scales + kw;
  std::uint16_t* qv = s.tile_words(Hk * dk * rows + kw * dk + kw * da + rows * kw + dk + da);
  std::uint16_t *keys = qv + Hk * dk * rows, *vv = keys + kw * dk, *wt = vv + kw * da, *row = wt + rows * kw;
  std::uint16_t* zeros = row + dk;
  if (s.tile_level() != item.level) tile_queries<Q, Arch>(q, members, R, G, Hk, d, rows, wide, row, qv);
  s.tile_level() = item.level;
  std::fill_n(zeros, da, std::uint16_t{0});
  std::fill_n(acc, Hk * rows * da, 0.0f);
  std::fill_n(m, Hk * rows, -std::numeric_limits<float>::infinity());
  std::fill_n(l, Hk * rows, 0.0f);
  std::fill_n(scales, kw, base.scale);
  const auto* k_words = reinterpret_cast<const std::uint16_t*>(base.k);
  const auto* v_words = reinterpret_cast<const std::uint16_t*>(base.v);
  const std::uint16_t* k_rows[kw];
  const std::uint16_t* v_rows[kw];
  const std::size_t end = item.first_key + item.keys;
  // The rows of keys [from, from + count), each key's of every head asked
  // for a share at a time (share `part` of `parts`), as attend_level does.
  const auto ask = [&](std::size_t from, std::size_t count, std::size_t part, std::size_t parts) noexcept {
    for (std::size_t j = from + count * part / parts; j < from + count * (part + 1) / parts; ++j) {
      const std::size_t page = static_cast<std::size_t>(base.pages[j / ps]), at = j % ps;
      for (std::size_t g = 0; g < Hk; ++g) {
        rope::detail::prefetch_l2(
            k_words + page * base.k_page_stride + at * base.k_token_stride + g * base.k_head_stride, d * 2);
        rope::detail::prefetch_l2(
            v_words + page * base.v_page_stride + at * base.v_token_stride + g * base.v_head_stride, dv * 2);
      }
    }
  };
  ask(item.first_key, std::min(kw, item.keys), 0, 1);
  rope::detail::TileConfig<Arch> tiles;
  for (std::size_t c0 = item.first_key; c0 < end; c0 += kw) {
    const std::size_t n = std::min(kw, end - c0), n32 = rope::detail::tile_span(n);
    const std::size_t next = c0 + n, ahead = next < end ? std::min(kw, end - next) : 0;
    for (std::size_t j = 0; j < n; ++j) {
      const std::size_t key = c0 + j, page = static_cast<std::size_t>(base.pages[key / ps]), at = key % ps;
      k_rows[j] = k_words + page * base.k_page_stride + at * base.k_token_stride;
      v_rows[j] = v_words + page * base.v_page_stride + at * base.v_token_stride;
    }
    for (std::size_t g = 0; g < Hk; ++g) {
      if (ahead > 0) ask(next, ahead, g, Hk);
      std::fill_n(keys, n32 * dk, std::uint16_t{0});
      for (std::size_t j = 0; j < n; ++j) std::memcpy(keys + j * dk, k_rows[j] + g * base.k_head_stride, d * 2);
      for (std::size_t j = 0; j < n32; j += 2) {
        const std::uint16_t* a = j < n ? v_rows[j] + g * base.v_head_stride : zeros;
        const std::uint16_t* b = j + 1 < n ? v_rows[j + 1] + g * base.v_head_stride : nullptr;
        rope::detail::pair_rows<Arch>(a, b, dv, da, vv + j * da);
      }
      float* ag = acc + g * rows * da;
      rope::detail::tile_scores<Arch>(keys, dk, n32, qv + g * dk * rows, rows, st, rows);
      level_softmax<Arch>(st, rows, R, n, da, scales, nullptr, base.softcap, m + g * rows, l + g * rows,
                          carried + g * rows, ag);
      rope::detail::pack_weights<Arch>(st, rows, n, rows, wt, kw);
      rope::detail::tile_values<Arch>(wt, kw, n32, vv, da, rows, ag);
    }
  }
  for (std::size_t i = 0; i < M; ++i) {
    float* part = partials + (item.partial + i) * H * (dv + 2);
    for (std::size_t g = 0; g < Hk; ++g) {
      for (std::size_t r = 0; r < G; ++r) {
        const std::size_t x = i * G + r, h = g * G + r;  // the row in head g's block, the query head
        std::copy(acc + (g * rows + x) * da, acc + (g * rows + x) * da + dv, part + h * dv);
        part[H * dv + h] = m[g * rows + x];
        part[H * dv + H + h] = l[g * rows + x];
      }
    }
  }
}

#else

// Declared for attend's call, which no code without the tiles compiles
// (kTilesArch).
template <class Q, class Arch>
void attend_level_tiles(const LevelItem& item, std::size_t M, const std::size_t* members, const View<const Q>& q,
                        const KvKeys<BFloat16>& base, LevelScratch& s, float* partials) noexcept;

#endif

}  // namespace rope::attention::detail
