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
    return rope::detail::products_hardware_allowed() && rope::detail::tiles_allowed() &&
           rope::detail::amx_bf16_runs<Arch>();
  } else {
    return false;
  }
}

// Query rows (tokens x the query heads of a key/value head) of a block of
// a prompt's tokens on tiles: each key read once for them all.
constexpr std::size_t kTileBlockRows = 128;
// Keys per block of such rows: the sums' tiles are loaded and stored once
// per block.
constexpr std::size_t kTileBlockKeys = 128;

#if defined(__x86_64__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__GNUC__)

// One query row of d floats into column r of a head's words (rows
// columns), in the pairs tile_scores reads: channel pair i at dword
// i * rows + r, rounded as the bf16 mode rounds q (bf16_query). row: dk
// words of room.
template <class Arch>
void pack_query_row(const float* wide, std::size_t d, std::size_t r, std::size_t rows, std::uint16_t* head,
                    std::uint16_t* row) noexcept {
  const __m256i apart =
      _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(static_cast<int>(rows)));
  std::size_t c = 0;
  for (; c + 16 <= d; c += 16) {  // bf16_query's steps, 16 channels at a time
    const __m512i u = _mm512_castps_si512(_mm512_loadu_ps(wide + c));
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i b = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd)), 16);
    const __mmask16 nan =
        _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
    b = _mm512_mask_or_epi32(b, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    const __mmask16 tiny = _mm512_testn_epi32_mask(b, _mm512_set1_epi32(0x7f80));
    b = _mm512_mask_and_epi32(b, tiny, b, _mm512_set1_epi32(0x8000));
    const __m256i words = _mm512_cvtepi32_epi16(b);  // 16 words: 8 channel pairs
    _mm256_i32scatter_epi32(reinterpret_cast<int*>(head) + (c / 2) * rows + r, apart, words, 4);
  }
  if (c < d) {
    rope::detail::bf16_query(wide + c, d - c, row);
    for (std::size_t x = 0; x < d - c; ++x) head[((c + x) / 2) * rows * 2 + r * 2 + (c + x) % 2] = row[x];
  }
}

// q of every member's rows (a level's members, or a block's tokens), head
// by head, in the pairs tile_scores reads: qv + g * dk * rows, over words
// the caller has zeroed (the padding rows and channels stay so). row: dk
// words.
template <class Q, class Arch>
void tile_queries(const View<const Q>& q, const std::size_t* members, std::size_t R, std::size_t G, std::size_t Hk,
                  std::size_t d, std::size_t rows, float* wide, std::uint16_t* row, std::uint16_t* qv) noexcept {
  const std::size_t dk = rope::detail::tile_span(d);
  for (std::size_t g = 0; g < Hk; ++g) {
    for (std::size_t r = 0; r < R; ++r) {
      widen_row(q.row(members[r / G], g * G + r % G), d, wide);
      pack_query_row<Arch>(wide, d, r, rows, qv + g * dk * rows, row);
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
  if (s.tile_level() != item.level) {
    std::fill_n(qv, Hk * dk * rows, std::uint16_t{0});
    tile_queries<Q, Arch>(q, members, R, G, Hk, d, rows, wide, row, qv);
  }
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

// Whether a stored bf16 row of n values holds no infinity and no NaN
// (exponent all ones).
template <class Arch>
bool finite_bf16_row(const std::uint16_t* v, std::size_t n) noexcept {
  const __m512i exponent = _mm512_set1_epi16(0x7f80);
  for (std::size_t c = 0; c < n; c += 32) {
    const std::size_t left = n - c;
    const __mmask32 in = left >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((std::uint64_t{1} << left) - 1);
    const __m512i x = _mm512_and_si512(_mm512_maskz_loadu_epi16(in, v + c), exponent);
    if (_mm512_mask_cmpeq_epi16_mask(in, x, exponent) != 0) return false;
  }
  return true;
}

// Head g's keys [c0, c0 + n) of a block of a prompt's rows in the tiles'
// order: keys as rows of dk words (zero past d, zero rows up to a pair of
// tiles), values in pairs of keys (vv). A value row outside [all_lo,
// all_hi) (not seen by every row) that is not finite goes in as zeros and
// its index into apart; returns how many did.
template <class Arch>
std::size_t block_operands(const KvKeys<BFloat16>& base, std::size_t g, std::size_t c0, std::size_t n,
                           std::size_t all_lo, std::size_t all_hi, std::uint16_t* keys, std::uint16_t* vv,
                           const std::uint16_t* zeros, std::size_t* apart) noexcept {
  const std::size_t d = base.d, dv = base.dv, ps = base.page_size, n32 = rope::detail::tile_span(n);
  const std::size_t dk = rope::detail::tile_span(d), da = rope::detail::tile_span(dv);
  const auto* k_words = reinterpret_cast<const std::uint16_t*>(base.k);
  const auto* v_words = reinterpret_cast<const std::uint16_t*>(base.v);
  if (d < dk) std::fill_n(keys, n * dk, std::uint16_t{0});      // the channels past d
  std::fill(keys + n * dk, keys + n32 * dk, std::uint16_t{0});  // the keys past n
  const std::uint16_t* v_rows[kTileBlockKeys];
  std::size_t left_out = 0;
  for (std::size_t j = 0; j < n; ++j) {
    const std::size_t key = c0 + j, page = static_cast<std::size_t>(base.pages[key / ps]), at = key % ps;
    std::memcpy(keys + j * dk, k_words + page * base.k_page_stride + at * base.k_token_stride + g * base.k_head_stride,
                d * 2);
    v_rows[j] = v_words + page * base.v_page_stride + at * base.v_token_stride + g * base.v_head_stride;
    if ((key < all_lo || key >= all_hi) && !finite_bf16_row<Arch>(v_rows[j], dv)) {
      apart[left_out++] = j;
      v_rows[j] = zeros;
    }
  }
  for (std::size_t j = 0; j < n32; j += 2) {
    const std::uint16_t* a = j < n ? v_rows[j] : zeros;
    const std::uint16_t* b = j + 1 < n ? v_rows[j + 1] : nullptr;
    rope::detail::pair_rows<Arch>(a, b, dv, da, vv + j * da);
  }
  return left_out;
}

// The rows of T tokens of one sequence on tiles (a prompt's, or MLA's
// with one key/value head), over its keys [first, first + count), token i
// seeing keys [lo[i], hi[i]) of them (the mask); pack(qv, rows, wide, row)
// writes their query rows in the pairs tile_scores reads, row i * G + r of
// head g for token i's query head g * G + r, into words already zero
// (tile_queries; wide: d floats, row: dk words of room). Head by head, in blocks of kTileBlockKeys keys: the level's
// steps, each row's keys past its range -inf (after the cap) and weight 0. A value row some row of the block does not
// see and that is not finite is left out of the tile and added, as the tile would add it, to the rows that see it only:
// a NaN never reaches a token that does not see it. After each key/value head g: done(g, acc, m, l), its rows' sums
// (row i * G + r for token i's query head g * G + r; acc rows da floats apart).
template <class Arch, class Pack, class Done>
void attend_block_tiles(std::size_t T, const std::size_t* lo, const std::size_t* hi, std::size_t first,
                        std::size_t count, Pack&& pack, const KvKeys<BFloat16>& base, LevelScratch& s, Done&& done) {
  const std::size_t Hk = base.kv_heads, G = base.q_heads / Hk, R = T * G, d = base.d, dv = base.dv;
  const std::size_t ps = base.page_size, rows = rope::detail::tile_span(R), dk = rope::detail::tile_span(d),
                    da = rope::detail::tile_span(dv);
  constexpr std::size_t kw = kTileBlockKeys;
  float* st = s.tile_floats(kw * rows + rows * (da + 3) + kw + dk + 2 * rows);
  float *acc = st + kw * rows, *m = acc + rows * da, *l = m + rows, *carried = l + rows;
  float *scales = carried + rows, *rlo = scales + kw, *rhi = rlo + rows, *wide = rhi + rows;
  std::uint16_t* qv = s.tile_words(Hk * dk * rows + kw * dk + kw * da + rows * kw + dk + da);
  std::uint16_t *keys = qv + Hk * dk * rows, *vv = keys + kw * dk, *wt = vv + kw * da, *row = wt + rows * kw;
  std::uint16_t* zeros = row + dk;
  std::fill_n(qv, Hk * dk * rows, std::uint16_t{0});
  pack(qv, rows, wide, row);
  s.tile_level() = static_cast<std::size_t>(-1);  // the words hold this block's rows, no level's
  std::fill_n(zeros, da, std::uint16_t{0});
  std::fill_n(scales, kw, base.scale);
  const auto* v_words = reinterpret_cast<const std::uint16_t*>(base.v);
  const std::size_t end = first + count;
  std::size_t all_lo = first, all_hi = end;  // keys every row sees: [all_lo, all_hi)
  for (std::size_t i = 0; i < T; ++i) {
    all_lo = std::max(all_lo, lo[i]);
    all_hi = std::min(all_hi, hi[i]);
  }
  std::size_t apart[kw];  // the block's keys left out of the tile (not finite, not seen by every row)
  rope::detail::TileConfig<Arch> tiles;
  for (std::size_t g = 0; g < Hk; ++g) {
    std::fill_n(acc, rows * da, 0.0f);
    std::fill_n(m, rows, -std::numeric_limits<float>::infinity());
    std::fill_n(l, rows, 0.0f);
    for (std::size_t c0 = first; c0 < end; c0 += kw) {
      const std::size_t n = std::min(kw, end - c0), n32 = rope::detail::tile_span(n);
      const std::size_t left_out = block_operands<Arch>(base, g, c0, n, all_lo, all_hi, keys, vv, zeros, apart);
      for (std::size_t r = 0; r < rows; ++r) {  // each row's keys of this block; padding rows none
        const std::size_t a = r < R ? std::clamp(lo[r / G], c0, c0 + n) - c0 : 0;
        const std::size_t b = r < R ? std::clamp(hi[r / G], c0, c0 + n) - c0 : 0;
        rlo[r] = static_cast<float>(a);
        rhi[r] = static_cast<float>(std::max(a, b));
      }
      rope::detail::tile_scores<Arch>(keys, dk, n32, qv + g * dk * rows, rows, st, rows);
      level_softmax<Arch>(st, rows, R, n, da, scales, nullptr, base.softcap, m, l, carried, acc, KeyRange{rlo, rhi});
      rope::detail::pack_weights<Arch>(st, rows, n, rows, wt, kw);
      rope::detail::tile_values<Arch>(wt, kw, n32, vv, da, rows, acc);
      for (std::size_t k = 0; k < left_out; ++k) {
        const std::size_t j = apart[k];
        const std::size_t key = c0 + j, page = static_cast<std::size_t>(base.pages[key / ps]), at = key % ps;
        const std::uint16_t* v =
            v_words + page * base.v_page_stride + at * base.v_token_stride + g * base.v_head_stride;
        for (std::size_t r = 0; r < R; ++r) {
          if (key < lo[r / G] || key >= hi[r / G]) continue;
          const float w = rope::detail::bfloat16_bits_to_float(wt[r * kw + j]);
          for (std::size_t c = 0; c < dv; ++c) acc[r * da + c] += w * rope::detail::bfloat16_bits_to_float(v[c]);
        }
      }
    }
    done(g, static_cast<const float*>(acc), static_cast<const float*>(m), static_cast<const float*>(l));
  }
}

#else

// Declared for attend's call, which no code without the tiles compiles
// (kTilesArch).
template <class Q, class Arch>
void attend_level_tiles(const LevelItem& item, std::size_t M, const std::size_t* members, const View<const Q>& q,
                        const KvKeys<BFloat16>& base, LevelScratch& s, float* partials) noexcept;
template <class Arch, class Pack, class Done>
void attend_block_tiles(std::size_t T, const std::size_t* lo, const std::size_t* hi, std::size_t first,
                        std::size_t count, Pack&& pack, const KvKeys<BFloat16>& base, LevelScratch& s, Done&& done);
template <class Arch>
void pack_query_row(const float* wide, std::size_t d, std::size_t r, std::size_t rows, std::uint16_t* head,
                    std::uint16_t* row) noexcept;
template <class Q, class Arch>
void tile_queries(const View<const Q>& q, const std::size_t* members, std::size_t R, std::size_t G, std::size_t Hk,
                  std::size_t d, std::size_t rows, float* wide, std::uint16_t* row, std::uint16_t* qv) noexcept;

#endif

}  // namespace rope::attention::detail
