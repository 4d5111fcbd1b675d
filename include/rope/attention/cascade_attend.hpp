// rope/attention/cascade_attend.hpp — one part of a cascade level
// (cascade.hpp): the query rows of every member against the part's keys,
// read once.
//
// The rows of key/value head g are those of its query heads in every
// member, M members x G = q_heads / kv_heads rows; over the part's keys in
// blocks of kLevelBlock, each block's rows of head g widened to float:
//
//   S = Q_g K^T                         (Eigen's GEMM)
//   s_rj <- s_rj * scale_j              (scale, times key j's scale for int8)
//   softcap, then the online softmax of each row (scores.hpp)
//   p_rj <- p_rj * vscale_j             (int8)
//   acc_g += P V                        (Eigen's GEMM)
//
// The same steps as the decode loop's (kernels/kv_decode.hpp) but for the
// order in which each dot product and each weighted sum adds its terms;
// docs/attention.md bounds what that changes. Every member sees every key,
// so a key's NaN reaches exactly the members whose plain step would read
// it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include <Eigen/Core>

#include "../detail/prefetch.hpp"
#include "../kernels/kv_decode.hpp"
#include "../kernels/scores.hpp"
#include "cache.hpp"
#include "cascade.hpp"
#include "types.hpp"

namespace rope::attention {

// Keys per block of a level part's GEMMs.
constexpr std::size_t kLevelBlock = 64;

namespace detail {

// One worker's matrices for level parts, grown before the work starts
// (grow) so that no worker allocates.
struct LevelScratch {
  Matrix<float> q, keys, values, scores, acc;
  std::vector<float> m, l, key_scales, value_scales;

  // Room for parts of up to `members` members.
  void grow(std::size_t members, std::size_t q_heads, std::size_t kv_heads, std::size_t d, std::size_t dv) {
    using Index = Eigen::Index;
    const std::size_t rows = members * q_heads, R = rows / kv_heads;
    if (q.rows() < static_cast<Index>(rows)) {
      q.resize(static_cast<Index>(rows), static_cast<Index>(d));
      acc.resize(static_cast<Index>(rows), static_cast<Index>(dv));
      scores.resize(static_cast<Index>(R), static_cast<Index>(kLevelBlock));
      m.resize(rows);
      l.resize(rows);
    }
    keys.resize(static_cast<Index>(kv_heads * kLevelBlock), static_cast<Index>(d));
    values.resize(static_cast<Index>(kv_heads * kLevelBlock), static_cast<Index>(dv));
    key_scales.resize(kv_heads * kLevelBlock);
    value_scales.resize(kv_heads * kLevelBlock);
  }
};

// Level part `item` over the cache in `base` (its strides, heads and
// scales; pages: the level's sequence's), for members' tokens members[0 ..
// M): q rows from q, each member's state written to its partial (acc, m, l
// of every query head, partials + (item.partial + i) * q_heads * (dv + 2)).
// s has grown for M members.
template <class Q, class E, class Arch>
void attend_level(const LevelItem& item, std::size_t M, const std::size_t* members, const View<const Q>& q,
                  const KvKeys<E>& base, LevelScratch& s, float* partials) {
  using Index = Eigen::Index;
  const std::size_t H = base.q_heads, Hk = base.kv_heads, G = H / Hk, R = M * G, d = base.d, dv = base.dv;
  const std::size_t ps = base.page_size;
  const auto rows = static_cast<Index>(Hk * R), ri = static_cast<Index>(R);
  // Row (g * M + i) * G + r: member i's query head g * G + r.
  for (std::size_t g = 0; g < Hk; ++g) {
    for (std::size_t i = 0; i < M; ++i) {
      for (std::size_t r = 0; r < G; ++r) {
        widen_row(q.row(members[i], g * G + r), d, s.q.row(static_cast<Index>((g * M + i) * G + r)).data());
      }
    }
  }
  s.acc.topRows(rows).setZero();
  std::fill_n(s.m.begin(), Hk * R, -std::numeric_limits<float>::infinity());
  std::fill_n(s.l.begin(), Hk * R, 0.0f);
  const std::size_t end = item.first_key + item.keys;
  const auto row_of = [&](std::size_t slot, const E* data, std::size_t page_stride, std::size_t token_stride) {
    return data + (slot / ps) * page_stride + (slot % ps) * token_stride;
  };
  // The first block's rows asked for now, each later block's during the
  // GEMMs of the block before it.
  const auto ask = [&](std::size_t from, std::size_t count, std::size_t part, std::size_t parts) noexcept {
    for (std::size_t j = from + count * part / parts; j < from + count * (part + 1) / parts; ++j) {
      const std::size_t slot = static_cast<std::size_t>(base.pages[j / ps]) * ps + j % ps;
      const E* k = row_of(slot, base.k, base.k_page_stride, base.k_token_stride);
      const E* v = row_of(slot, base.v, base.v_page_stride, base.v_token_stride);
      for (std::size_t g = 0; g < Hk; ++g) {
        rope::detail::prefetch_l2(k + g * base.k_head_stride, d * sizeof(E));
        rope::detail::prefetch_l2(v + g * base.v_head_stride, dv * sizeof(E));
      }
    }
  };
  ask(item.first_key, std::min(kLevelBlock, item.keys), 0, 1);
  for (std::size_t c0 = item.first_key; c0 < end; c0 += kLevelBlock) {
    const std::size_t n = std::min(kLevelBlock, end - c0);
    const auto ni = static_cast<Index>(n);
    // The block's rows of every head widened, token by token in memory
    // order: head g's key j at row g * kLevelBlock + j.
    for (std::size_t j = 0; j < n; ++j) {
      const std::size_t slot = static_cast<std::size_t>(base.pages[(c0 + j) / ps]) * ps + (c0 + j) % ps;
      const E* k = row_of(slot, base.k, base.k_page_stride, base.k_token_stride);
      const E* v = row_of(slot, base.v, base.v_page_stride, base.v_token_stride);
      for (std::size_t g = 0; g < Hk; ++g) {
        const auto at = static_cast<Index>(g * kLevelBlock + j);
        widen_row(k + g * base.k_head_stride, d, s.keys.row(at).data());
        widen_row(v + g * base.v_head_stride, dv, s.values.row(at).data());
        s.key_scales[g * kLevelBlock + j] =
            base.k_scales != nullptr ? base.scale * base.k_scales[slot * Hk + g] : base.scale;
        if (base.v_scales != nullptr) s.value_scales[g * kLevelBlock + j] = base.v_scales[slot * Hk + g];
      }
    }
    const std::size_t next = c0 + n, ahead = next < end ? std::min(kLevelBlock, end - next) : 0;
    for (std::size_t g = 0; g < Hk; ++g) {
      if (ahead > 0) ask(next, ahead, g, Hk);
      const auto keys = s.keys.middleRows(static_cast<Index>(g * kLevelBlock), ni);
      const auto values = s.values.middleRows(static_cast<Index>(g * kLevelBlock), ni);
      const float* key_scales = s.key_scales.data() + g * kLevelBlock;
      const float* value_scales = s.value_scales.data() + g * kLevelBlock;
      auto scores = s.scores.topLeftCorner(ri, ni);
      scores.noalias() = s.q.middleRows(static_cast<Index>(g * R), ri) * keys.transpose();
      for (std::size_t r = 0; r < R; ++r) {
        float* sr = scores.row(static_cast<Index>(r)).data();
        const std::size_t x = g * R + r;  // the row's index in s.q, s.acc, s.m and s.l
        multiply_row<Arch>(sr, key_scales, n);
        if (base.softcap > 0.0f) softcap_row<Arch>(sr, n, base.softcap);
        const float mc = max_row<Arch>(sr, n);
        const float m_new = mc > s.m[x] ? mc : s.m[x];
        const float carried = rope::detail::carry(s.m[x], m_new);
        s.l[x] = s.l[x] * carried + softmax_weights_row<Arch>(sr, sr, n, m_new, false);
        if (carried != 1.0f) s.acc.row(static_cast<Index>(x)) *= carried;
        s.m[x] = m_new;
        if (base.v_scales != nullptr) multiply_row<Arch>(sr, value_scales, n);
      }
      s.acc.middleRows(static_cast<Index>(g * R), ri).noalias() += scores * values;
    }
  }
  for (std::size_t i = 0; i < M; ++i) {
    float* part = partials + (item.partial + i) * H * (dv + 2);
    for (std::size_t g = 0; g < Hk; ++g) {
      for (std::size_t r = 0; r < G; ++r) {
        const std::size_t row = (g * M + i) * G + r, h = g * G + r;
        std::copy_n(s.acc.row(static_cast<Index>(row)).data(), dv, part + h * dv);
        part[H * dv + h] = s.m[row];
        part[H * dv + H + h] = s.l[row];
      }
    }
  }
}

}  // namespace detail
}  // namespace rope::attention
