// rope/kernels/kv_decode.hpp — the decode loop: query rows of one token (all
// of its query heads) against one sequence's keys in a paged KV cache, as an
// online softmax (scores.hpp), over the rows of kv_dot.hpp.
//
//   m_h = max_j s_hj,  l_h = sum_j exp(s_hj - m_h),  acc_h = sum_j exp(s_hj - m_h) v_j
//   s_hj = scale * q_h . k_j   (int8: times k_j's scale; capped by softcap when set)
//
// attend_keys is the one kernel the serving path runs per work item, and
// the one rope::dispatch routes per instruction set (attention/
// dispatch_slots.hpp). Its memory schedule (kAttendAhead) and its shapes
// compiled for the common head counts (attend_shape) are documented where
// they are defined.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "../detail/inline.hpp"
#include "../detail/lines.hpp"
#include "../detail/prefetch.hpp"
#include "../detail/xsimd.hpp"
#include "kv_dot.hpp"
#include "kv_planes.hpp"
#include "kv_products.hpp"
#include "scores.hpp"

namespace rope {

// What attend_keys reads: one sequence's keys first_key .. first_key+keys-1
// (or, with key_list, the keys key_list[first_key .. first_key+keys-1])
// in a paged cache (attention/cache.hpp has the layout), key j in slot
// pages[j / page_size] * page_size + j % page_size; strides in elements;
// int8 scales at slot * kv_heads + h. q_heads = group * kv_heads.
template <class E>
struct KvKeys {
  const E* k = nullptr;
  const E* v = nullptr;
  const float* k_scales = nullptr;
  const float* v_scales = nullptr;
  const std::int32_t* pages = nullptr;
  std::size_t page_size = 1;
  std::size_t k_page_stride = 0, k_token_stride = 0, k_head_stride = 0;
  std::size_t v_page_stride = 0, v_token_stride = 0, v_head_stride = 0;
  std::size_t first_key = 0, keys = 0;
  std::size_t q_heads = 0, kv_heads = 0, d = 0, dv = 0;
  std::size_t chunk = 1;  // keys per chunk of scores: 1 .. kAttendMaxChunk
  float scale = 1;
  float softcap = 0;  // 0: none
  // A list of keys (sparse attention, a tree token's): key j of the item is
  // the sequence's key key_list[j] (a list the caller sorted and checked),
  // not j itself.
  const std::int32_t* key_list = nullptr;
  // How q meets the keys (kv_products.hpp): bf16 for a BFloat16 cache and
  // int8 for an int8 one, else exact.
  Products products = Products::exact;
};

// The most keys per chunk of attend_keys.
constexpr std::size_t kAttendMaxChunk = 64;

// attend_keys' memory schedule: every row it reads is asked for (into L2)
// ahead of its use, in memory order, while other rows are worked on, so
// that misses stay in flight through both passes over a chunk. A token's
// key rows are asked for kAttendAhead tokens before they are scored; the
// value rows of the first kAttendValueTokens tokens during the last of the
// scores, and each later group's during the weighing of the group before.
// Measured on batch_decode (32/8 heads, d 128, page size 16, every cache
// line of the batch flushed), paged T1 against a read of the same bytes,
// one process alternating builds, on a 2-vCPU AVX-512 Xeon:
//   - the schedule this replaced, value rows asked for with the keys and
//     nothing while the values are weighed: 0.70 (bf16) and 0.55 (int8);
//   - the schedule above: 0.74-0.80 and 0.59-0.60;
//   - a head's rows of a group of tokens (2 KB apart) instead of the
//     tokens' rows in memory order: 20% slower; every other line, leaving
//     the rest to the hardware prefetchers: 25% slower; the next chunk's
//     rows a whole chunk ahead: 20% slower;
//   - 2 or 8 tokens ahead for the keys, groups of 4 or 16 value tokens:
//     alike within the noise.
constexpr std::size_t kAttendAhead = 4;
constexpr std::size_t kAttendValueTokens = 8;

// The floats attend_keys works in: the query rows (q_heads * d), the
// chunk's scores (q_heads * chunk) and the sums (q_heads * dv), each part on
// whole cache lines (detail/lines.hpp), so that where work starts on a line
// no vector load of a query row or a sum straddles two lines when d and dv
// are multiples of the lanes. Any alignment gives the same bits; with work
// 48 bytes past a line, a bf16 step over a cache in L2 (32/8 heads, d 128)
// took about 25% longer here.
// The query part holds the rows as a product mode packs them where that
// is more: bf16 rows, the same widened for the fused twin and each
// group's least exponent (kv_products.hpp); int8 rows, scales and sums.
constexpr std::size_t attend_query_floats(std::size_t q_heads, std::size_t d) noexcept {
  const std::size_t bf16 = q_heads * ((d + 31) / 32 * 32) / 2 * 3 + q_heads, int8 = q_heads * ((d + 63) / 64 * 16 + 2);
  const std::size_t most = bf16 > int8 ? bf16 : int8;
  return detail::line_floats(q_heads * d > most ? q_heads * d : most);
}
constexpr std::size_t attend_work(std::size_t q_heads, std::size_t d, std::size_t dv, std::size_t chunk) noexcept {
  return attend_query_floats(q_heads, d) + detail::line_floats(q_heads * chunk) + detail::line_floats(q_heads * dv);
}

namespace detail {

// Where a chunk's tokens are: the slot of each and where its key and value
// rows start (one division per chunk). Arch only names the instruction set
// its code is compiled for (rope::dispatch).
template <class E, class Arch>
struct ChunkRows {
  std::size_t slots[kAttendMaxChunk];
  const E* k[kAttendMaxChunk];
  const E* v[kAttendMaxChunk];

  void find(const KvKeys<E>& a, std::size_t first, std::size_t count) noexcept {
    const std::size_t ps = a.page_size;
    if (a.key_list != nullptr) {
      for (std::size_t i = 0; i < count; ++i) {
        const auto key = static_cast<std::size_t>(a.key_list[first + i]);
        const auto id = static_cast<std::size_t>(a.pages[key / ps]);
        const std::size_t offset = key % ps;
        slots[i] = id * ps + offset;
        k[i] = a.k + id * a.k_page_stride + offset * a.k_token_stride;
        v[i] = a.v + id * a.v_page_stride + offset * a.v_token_stride;
      }
      return;
    }
    std::size_t page = first / ps, offset = first % ps;
    for (std::size_t i = 0; i < count; ++i) {
      const auto id = static_cast<std::size_t>(a.pages[page]);
      slots[i] = id * ps + offset;
      k[i] = a.k + id * a.k_page_stride + offset * a.k_token_stride;
      v[i] = a.v + id * a.v_page_stride + offset * a.v_token_stride;
      if (++offset == ps) {
        offset = 0;
        ++page;
      }
    }
  }
};

// One key token's scores of every query row in the product mode M (q as
// attend_keys_as packs it), row h's at scores[h * S]; the rows of k_ask
// and v_ask (null: none) asked for meanwhile, every head's.
template <class E, class Arch, Products M>
ROPE_ALWAYS_INLINE void score_products(const KvKeys<E>& a, const float* qp, const E* key, std::size_t slot,
                                       float* scores, std::size_t S, const E* k_ask, const E* v_ask) noexcept {
  const std::size_t H = a.q_heads, Hk = a.kv_heads, G = H / Hk, d = a.d;
  for (std::size_t g = 0; g < Hk; ++g) {
    if (k_ask != nullptr) prefetch_l2(k_ask + g * a.k_head_stride, d * sizeof(E));
    if (v_ask != nullptr) prefetch_l2(v_ask + g * a.v_head_stride, a.dv * sizeof(E));
  }
  for (std::size_t g = 0; g < Hk; ++g) {
    const E* k = key + g * a.k_head_stride;
    if constexpr (M == Products::bf16) {
      const std::size_t row = bf16_row(d);
      const auto* q = reinterpret_cast<const std::uint16_t*>(qp);
      const float* wide = qp + H * row / 2;
      const auto* least = reinterpret_cast<const unsigned*>(wide + H * row);
      bf16_scores<Arch>(q + g * G * row, row, G, k, d, scores + g * G * S, S, a.scale,
                        least[g] == 0 ? nullptr : wide + g * G * row, row, least[g]);
    } else {
      const std::size_t row = int8_row(d);
      const auto* q = reinterpret_cast<const std::int8_t*>(qp);
      const auto* q_scales = reinterpret_cast<const float*>(q + H * row);
      const auto* q_sums = reinterpret_cast<const std::int32_t*>(q_scales + H);
      int8_scores<Arch>(q + g * G * row, row, G, q_scales + g * G, q_sums + g * G, k, d, scores + g * G * S, S,
                        a.scale * a.k_scales[slot * Hk + g]);
    }
  }
}

// The second half of a chunk of attend_chunks, the same in every product
// mode (a function of its own, so that the modes share its code): the
// running softmax over the chunk's scores (rows of S at scores, capped
// where a.softcap is set), int8 weights times their values' scales, then
// the weighted values added to ap, V tokens at a time head by head.
template <std::size_t R, std::size_t D, class E, class Arch>
void weigh_chunk(const KvKeys<E>& a, const ChunkRows<E, Arch>& rows, std::size_t count, float* scores, float* ap,
                 float* m, float* l) noexcept {
  const std::size_t H = a.q_heads, Hk = a.kv_heads, G = R > 0 ? R : H / Hk, dv = D > 0 ? D : a.dv, S = a.chunk;
  constexpr std::size_t V = kAttendValueTokens;
  for (std::size_t h = 0; h < H; ++h) {
    float* sr = scores + h * S;
    if (a.softcap > 0.0f) softcap_row<Arch>(sr, count, a.softcap);
    const float mc = max_row<Arch>(sr, count);
    const float m_new = mc > m[h] ? mc : m[h];
    const float carried = carry(m[h], m_new);
    const float sum = softmax_weights_row<Arch>(sr, sr, count, m_new, false);
    l[h] = l[h] * carried + sum;
    if (carried != 1.0f) {
      for (std::size_t c = 0; c < dv; ++c) ap[h * dv + c] *= carried;
    }
    m[h] = m_new;
  }
  if (a.v_scales != nullptr) {
    // int8: each weight times its value's scale, once (weighted_kv
    // would multiply them again for every block of channels), a row of
    // weights at a time.
    float vs[kAttendMaxChunk];
    for (std::size_t g = 0; g < Hk; ++g) {
      for (std::size_t t = 0; t < count; ++t) vs[t] = a.v_scales[rows.slots[t] * Hk + g];
      for (std::size_t r = 0; r < G; ++r) multiply_row<Arch>(scores + (g * G + r) * S, vs, count);
    }
  }
  // The weighted values, V tokens at a time head by head: each sum adds
  // the chunk's values in token order whatever V is, so the same bits.
  // Meanwhile the next V tokens' value rows are asked for, one row per
  // value of the first pass over the channels, in memory order.
  for (std::size_t s0 = 0; s0 < count; s0 += V) {
    const std::size_t n = count - s0 < V ? count - s0 : V;
    const std::size_t ask_end = s0 + 2 * V < count ? s0 + 2 * V : count;
    std::size_t pu = s0 + V, ph = 0;  // the token and head asked for next
    for (std::size_t g = 0; g < Hk; ++g) {
      const float* w = scores + g * G * S + s0;
      const std::size_t offset = g * a.v_head_stride;
      float* ag = ap + g * G * dv;
      const auto ask = [&]() noexcept {
        if (pu < ask_end) {
          prefetch_l2(rows.v[pu] + ph * a.v_head_stride, dv * sizeof(E));
          if (++ph == Hk) {
            ph = 0;
            ++pu;
          }
        }
      };
      if constexpr (R > 0) {
        weighted_kv_group<R, E, Arch, D>(
            w, S, n, [&](std::size_t t) noexcept { return rows.v[s0 + t] + offset; }, nullptr, 0, dv, ag, dv, ask);
      } else {
        weighted_kv_rows<E, Arch>(w, S, G, n, rows.v + s0, offset, dv, ag, dv, ask);
      }
    }
  }
}

// attend_keys' chunks, for R query heads per key/value head and D channels
// of keys and values known at compile time (the dot products inline in the
// token loop, every loop over channels unrolled), or R = D = 0 for any.
// The same arithmetic in the same order either way: the same bits.
template <std::size_t R, std::size_t D, class E, class Arch, Products M = Products::exact>
void attend_chunks(const KvKeys<E>& a, const float* qp, float* scores, float* ap, float* m, float* l) noexcept {
  static_assert((R > 0) == (D > 0), "a compiled shape has both, the loops for any shape neither");
  const std::size_t H = a.q_heads, Hk = a.kv_heads, G = R > 0 ? R : H / Hk, d = D > 0 ? D : a.d, dv = D > 0 ? D : a.dv,
                    S = a.chunk;
  const std::size_t end = a.first_key + a.keys;
  // Keys scored at once: two in the compiled shapes where they fit (one in a product mode).
  constexpr std::size_t KK = R > 0 && M == Products::exact ? kv_keys_at_once<R, E, Arch>() : 1;
  constexpr std::size_t V = kAttendValueTokens;
  // This chunk's rows, and the next one's, asked for during this one's last.
  ChunkRows<E, Arch> chunks[2];
  std::size_t now = 0;
  if (a.first_key < end) chunks[0].find(a, a.first_key, end - a.first_key < S ? end - a.first_key : S);
  for (std::size_t c0 = a.first_key; c0 < end; c0 += S) {
    const std::size_t count = end - c0 < S ? end - c0 : S;
    const ChunkRows<E, Arch>& rows = chunks[now];
    const ChunkRows<E, Arch>& next = chunks[now ^ 1];
    const std::size_t after = c0 + count, ahead = after < end ? (end - after < S ? end - after : S) : 0;
    if (ahead > 0) chunks[now ^ 1].find(a, after, ahead);
    now ^= 1;
    // The scores, N tokens at a time over every key/value head. Asked for
    // meanwhile (kAttendAhead): the key rows (and int8 scales) kAttendAhead
    // tokens on, and during the last V tokens the value rows of the first
    // V, which the weighing starts with; each in memory order, token by
    // token and head by head, N rows per head's step.
    const std::size_t v_from = count > V ? count - V : 0;
    std::size_t i = 0;
    const auto score = [&](auto tokens) noexcept {
      constexpr std::size_t N = decltype(tokens)::value;
      const E* k_ask[N];
      const E* v_ask[N];
      ROPE_UNROLL
      for (std::size_t u = 0; u < N; ++u) {
        const std::size_t t = i + u, j = t + kAttendAhead;
        const bool in = j < count;
        k_ask[u] = in ? rows.k[j] : j - count < ahead ? next.k[j - count] : nullptr;
        v_ask[u] = t >= v_from ? rows.v[t - v_from] : nullptr;
        if (a.k_scales != nullptr && k_ask[u] != nullptr) {
          prefetch_l2(a.k_scales + (in ? rows.slots[j] : next.slots[j - count]) * Hk, Hk * sizeof(float));
        }
        if (a.v_scales != nullptr) prefetch_l2(a.v_scales + rows.slots[t] * Hk, Hk * sizeof(float));
      }
      if constexpr (M != Products::exact) {
        score_products<E, Arch, M>(a, qp, rows.k[i], rows.slots[i], scores + i, S, k_ask[0], v_ask[0]);
        i += N;
        return;
      }
      std::size_t pu = 0, ph = 0;  // the token and head asked for next
      for (std::size_t g = 0; g < Hk; ++g) {
        const E* keys[N];
        float ks[N];
        ROPE_UNROLL
        for (std::size_t u = 0; u < N; ++u) {
          if (k_ask[pu] != nullptr) prefetch_l2(k_ask[pu] + ph * a.k_head_stride, d * sizeof(E));
          if (v_ask[pu] != nullptr) prefetch_l2(v_ask[pu] + ph * a.v_head_stride, dv * sizeof(E));
          if (++ph == Hk) {
            ph = 0;
            ++pu;
          }
          keys[u] = rows.k[i + u] + g * a.k_head_stride;
          ks[u] = a.k_scales != nullptr ? a.scale * a.k_scales[rows.slots[i + u] * Hk + g] : a.scale;
        }
        const float* qg = qp + g * G * d;
        float* sg = scores + g * G * S + i;
        if constexpr (N > 1) {
          dot_kv_keys<R, N, E, Arch, D>(qg, keys, sg, S, ks);
        } else if constexpr (R > 0) {
          dot_kv_group<R, E, Arch, D>(qg, d, d, keys[0], sg, S, ks[0]);
        } else {
          dot_kv<E, Arch>(qg, d, G, d, keys[0], sg, S, ks[0]);
        }
      }
      i += N;
    };
    if constexpr (KK > 1) {
      while (i + KK <= count) score(std::integral_constant<std::size_t, KK>{});
    }
    while (i < count) score(std::integral_constant<std::size_t, 1>{});
    weigh_chunk<R, D, E, Arch>(a, rows, count, scores, ap, m, l);
  }
}

template <class E, class Arch>
using AttendChunks = void (*)(const KvKeys<E>&, const float*, float*, float*, float*, float*) noexcept;

// The attend_chunks compiled for G query heads per key/value head and d, dv
// channels of keys and values, or null: compiled for the shapes of most
// current models, head_dim 128 with 4 or 8 query heads per key/value head
// (Llama 3, Mistral, Qwen 3), where dot_kv takes that many rows in one
// group. They took about a quarter less time per key than the loops for any
// shape (batch_decode, bf16, a cache in L2), and cost about half a second
// more compile time each for every instruction set a program builds
// attention for.
template <class E, class Arch, Products M = Products::exact>
AttendChunks<E, Arch> attend_shape(std::size_t G, std::size_t d, std::size_t dv) noexcept {
  constexpr std::size_t most = kv_max_rows<E, Arch>();
  if (d != 128 || dv != 128) return nullptr;
  if constexpr (most >= 4) {
    if (G == 4) return &attend_chunks<4, 128, E, Arch, M>;
  }
  if constexpr (most >= 8) {
    if (G == 8) return &attend_chunks<8, 128, E, Arch, M>;
  }
  return nullptr;
}

// attend_keys_as in a product mode: q packed as the mode reads it
// (kv_products.hpp), then the chunks, their values weighed exactly.
template <class E, class Arch, Products M>
void attend_keys_products(const KvKeys<E>& a, const float* q, float* work, float* m, float* l, float* acc,
                          bool shaped) noexcept {
  const std::size_t H = a.q_heads, d = a.d, dv = a.dv;
  float* qp = work;
  float* scores = qp + attend_query_floats(H, d);
  float* ap = scores + line_floats(H * a.chunk);
  if constexpr (M == Products::bf16) {
    // The rows as bf16, then (where the fused twin runs) widened, and each
    // group's least exponent field (0: the lanes' steps for every key).
    const std::size_t row = bf16_row(d), G = H / a.kv_heads;
    auto* rows = reinterpret_cast<std::uint16_t*>(qp);
    float* wide = qp + H * row / 2;
    auto* least = reinterpret_cast<unsigned*>(wide + H * row);
    const bool fused = bf16_fused_runs<Arch>();
    for (std::size_t g = 0; g < a.kv_heads; ++g) least[g] = fused ? 0x1ffu : 0u;
    for (std::size_t h = 0; h < H; ++h) {
      bf16_query(q + h * d, d, rows + h * row);
      if (!fused) continue;
      bf16_query_wide(rows + h * row, d, wide + h * row);
      const unsigned e = bf16_least_exponent(rows + h * row, d);
      least[h / G] = e < least[h / G] ? e : least[h / G];
    }
  } else {
    auto* bytes = reinterpret_cast<std::int8_t*>(qp);
    auto* q_scales = reinterpret_cast<float*>(bytes + H * int8_row(d));
    auto* q_sums = reinterpret_cast<std::int32_t*>(q_scales + H);
    for (std::size_t h = 0; h < H; ++h) int8_query(q + h * d, d, bytes + h * int8_row(d), q_scales + h, q_sums + h);
  }
  for (std::size_t h = 0; h < H; ++h) {
    m[h] = -std::numeric_limits<float>::infinity();
    l[h] = 0.0f;
  }
  for (std::size_t c = 0; c < H * dv; ++c) ap[c] = 0.0f;
  AttendChunks<E, Arch> chunks = shaped ? attend_shape<E, Arch, M>(H / a.kv_heads, d, dv) : nullptr;
  if (chunks == nullptr) chunks = &attend_chunks<0, 0, E, Arch, M>;
  chunks(a, qp, scores, ap, m, l);
  for (std::size_t h = 0; h < H; ++h) unpermute_row<E, Arch>(ap + h * dv, dv, acc + h * dv);
}

// attend_keys through the chunks compiled for its shape where there are
// (shaped), else through the loops for any shape.
template <class E, class Arch>
void attend_keys_as(const KvKeys<E>& a, const float* q, float* work, float* m, float* l, float* acc,
                    bool shaped) noexcept {
  if constexpr (std::is_same<E, BFloat16>::value) {
    if (a.products == Products::bf16)
      return attend_keys_products<E, Arch, Products::bf16>(a, q, work, m, l, acc, shaped);
  }
  if constexpr (std::is_same<E, std::int8_t>::value) {
    if (a.products == Products::int8)
      return attend_keys_products<E, Arch, Products::int8>(a, q, work, m, l, acc, shaped);
  }
  const std::size_t H = a.q_heads, d = a.d, dv = a.dv;
  float* qp = work;
  float* scores = qp + attend_query_floats(H, d);
  float* ap = scores + line_floats(H * a.chunk);
  for (std::size_t h = 0; h < H; ++h) {
    permute_row<E, Arch>(q + h * d, d, qp + h * d);
    m[h] = -std::numeric_limits<float>::infinity();
    l[h] = 0.0f;
  }
  for (std::size_t c = 0; c < H * dv; ++c) ap[c] = 0.0f;
  AttendChunks<E, Arch> chunks = shaped ? attend_shape<E, Arch>(H / a.kv_heads, d, dv) : nullptr;
  if (chunks == nullptr) chunks = &attend_chunks<0, 0, E, Arch>;
  chunks(a, qp, scores, ap, m, l);
  for (std::size_t h = 0; h < H; ++h) unpermute_row<E, Arch>(ap + h * dv, dv, acc + h * dv);
}

}  // namespace detail

// The online softmax of q_heads query rows (q: q_heads x d floats, channel
// order, query head h reading key/value head h / group) over a.keys keys:
// for each head h, m[h] = the max of its scores s_j = scale * q_h . k_j
// (int8: times k_j's scale; capped by softcap when set), l[h] = sum_j
// exp(s_j - m[h]), acc[h * dv ..] = sum_j exp(s_j - m[h]) v_j in channel
// order. The keys are taken in chunks of a.chunk (at most
// kAttendMaxChunk): each chunk's scores key token by key token over every
// key/value head (a token's rows in memory order; two tokens at a time
// where the shape's sums fit, dot_kv_keys), its weights exp(s - m)
// relative to the running max, the earlier sums scaled by exp(m_old -
// m_new) when the max grows, then its values weighted kAttendValueTokens
// tokens at a time head by head (weighted_kv_rows, whatever pages they
// span; every sum still adds the chunk's values in token order). Rows are
// asked for ahead as kAttendAhead describes. work holds attend_work(...)
// floats, best from a cache line on (see there). Shapes
// with loops of their own (detail::attend_shape) give the same bits.
template <class E, class Arch = xsimd::default_arch>
void attend_keys(const KvKeys<E>& a, const float* q, float* work, float* m, float* l, float* acc) noexcept {
  detail::attend_keys_as<E, Arch>(a, q, work, m, l, acc, true);
}
}  // namespace rope
