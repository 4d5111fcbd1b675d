// rope/attention/masks.hpp — which keys a query sees: the mask (Mask:
// causal, sliding window), said the same way by every attention call, and,
// for the one-head and multi-head softmax and linear calls, the positions
// and sequence ids it is read against (MaskOptions).
//
//   key j is visible to query i iff  (not causal or pk_j <= pq_i)
//                                and (window == 0 or pk_j > pq_i - window)
//                                and (no sequence ids or sq_i == sk_j)
//
// Positions and sequence ids are std::int64_t, one per row; empty position
// vectors mean offset + 0 .. L-1. The serving path (plan.hpp) derives every
// position from the cache lengths instead.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "../executor.hpp"
#include "../options.hpp"

namespace rope::attention {

// Which keys a query sees, by position (see the header comment). Causal by
// default in every call: a decoder's queries see the keys up to their own
// position; set causal = false for an encoder's, or for linear attention's
// non-causal sums.
struct Mask {
  bool causal = true;
  std::size_t window = 0;  // > 0: key j visible to query i only if pk_j > pq_i - window
  // Sparse attention (DeepSeek V3.2's and GLM-5's top-k; the serving path's
  // attend only): new token t sees only the keys at the positions
  // indices[t * index_stride + i], i < topk, -1 for none; every listed
  // position must be one the rest of the mask lets it see (never silently
  // dropped), none listed twice. Null: no list.
  const std::int32_t* indices = nullptr;
  std::size_t topk = 0;
  std::size_t index_stride = 0;  // 0: topk
};

// What the one-head and multi-head softmax and linear calls share: the
// mask, the positions of queries and keys (for RoPE and the mask), sequence
// ids of packed batches, and the threads of the call (a count, or the
// caller's executor: the same bytes either way).
struct MaskOptions {
  Mask mask;
  std::vector<std::int64_t> q_positions, k_positions;  // empty: q_offset + i, k_offset + j
  std::int64_t q_offset = 0, k_offset = 0;
  std::vector<std::int64_t> q_sequence, k_sequence;  // packed batches: visible only within a sequence
  Threads threads;

  // The positions as the tensor API spells them: ids when given, else the offset.
  Positions q() const noexcept { return q_positions.empty() ? Positions(q_offset) : Positions(q_positions.data()); }
  Positions k() const noexcept { return k_positions.empty() ? Positions(k_offset) : Positions(k_positions.data()); }
};

namespace detail {

// Which keys each query sees, by position and sequence (see the header
// comment). Positions are ids[i] when given, else offset + i.
struct Visibility {
  bool causal = false;
  std::size_t window = 0;  // 0: no window
  const std::int64_t* q_ids = nullptr;
  const std::int64_t* k_ids = nullptr;
  std::int64_t q_offset = 0, k_offset = 0;
  const std::int64_t* q_sequence = nullptr;  // null: one sequence
  const std::int64_t* k_sequence = nullptr;

  std::int64_t q_position(std::size_t i) const noexcept {
    return q_ids ? q_ids[i] : q_offset + static_cast<std::int64_t>(i);
  }
  std::int64_t k_position(std::size_t j) const noexcept {
    return k_ids ? k_ids[j] : k_offset + static_cast<std::int64_t>(j);
  }
  std::int64_t q_seq(std::size_t i) const noexcept { return q_sequence ? q_sequence[i] : 0; }
  std::int64_t k_seq(std::size_t j) const noexcept { return k_sequence ? k_sequence[j] : 0; }
  bool masks() const noexcept { return causal || window != 0 || q_sequence != nullptr; }

  // pq - pk < window without overflow: the difference of two int64 can
  // leave the range, its unsigned form (pq >= pk here) cannot.
  bool in_window(std::int64_t pq, std::int64_t pk) const noexcept {
    if (window == 0 || pk > pq) return true;
    return static_cast<std::uint64_t>(pq) - static_cast<std::uint64_t>(pk) < window;
  }
  bool visible(std::size_t i, std::size_t j) const noexcept {
    const std::int64_t pq = q_position(i), pk = k_position(j);
    if (causal && pk > pq) return false;
    if (!in_window(pq, pk)) return false;
    return q_seq(i) == k_seq(j);
  }

  // Whether the keys are ordered by (sequence, position): then every
  // query sees one contiguous range of keys, found by binary search.
  bool keys_sorted(std::size_t lk) const noexcept {
    if (k_ids == nullptr && k_sequence == nullptr) return true;  // offset + j: sorted, nothing to scan
    for (std::size_t j = 1; j < lk; ++j) {
      const std::int64_t s0 = k_seq(j - 1), s1 = k_seq(j);
      if (s1 < s0 || (s1 == s0 && k_position(j) < k_position(j - 1))) return false;
    }
    return true;
  }
  // Keys [lo, hi) visible to query i when keys_sorted().
  void range(std::size_t i, std::size_t lk, std::size_t& lo, std::size_t& hi) const noexcept {
    const std::int64_t s = q_seq(i), pq = q_position(i);
    // First key of (sequence s, position > pq - window), then first key past
    // (s, pq) when causal or past sequence s otherwise.
    std::size_t a = 0, b = lk;
    while (a < b) {
      const std::size_t mid = a + (b - a) / 2;
      const std::int64_t sm = k_seq(mid);
      const bool before = sm < s || (sm == s && !in_window(pq, k_position(mid)) && k_position(mid) <= pq);
      if (before)
        a = mid + 1;
      else
        b = mid;
    }
    lo = a;
    b = lk;
    while (a < b) {
      const std::size_t mid = a + (b - a) / 2;
      const std::int64_t sm = k_seq(mid);
      const bool inside = sm < s || (sm == s && (!causal || k_position(mid) <= pq));
      if (inside)
        a = mid + 1;
      else
        b = mid;
    }
    hi = a;
  }
};

// The mask, positions and sequence ids of a call's options.
inline Visibility visibility_of(const MaskOptions& o) noexcept {
  Visibility vis;
  vis.causal = o.mask.causal;
  vis.window = o.mask.window;
  vis.q_ids = o.q_positions.empty() ? nullptr : o.q_positions.data();
  vis.k_ids = o.k_positions.empty() ? nullptr : o.k_positions.data();
  vis.q_offset = o.q_offset;
  vis.k_offset = o.k_offset;
  vis.q_sequence = o.q_sequence.empty() ? nullptr : o.q_sequence.data();
  vis.k_sequence = o.k_sequence.empty() ? nullptr : o.k_sequence.data();
  return vis;
}

// The keys a query at position p of a sequence of `length` keys sees: [lo, hi).
inline void visible_keys(std::int64_t p, std::int64_t length, const Mask& mask, std::size_t* lo,
                         std::size_t* hi) noexcept {
  const std::int64_t h = mask.causal ? std::min(length, p + 1) : length;
  std::int64_t l = 0;
  const auto w = static_cast<std::int64_t>(mask.window);
  if (mask.window > 0 && p - w + 1 > 0) l = p - w + 1;
  *lo = static_cast<std::size_t>(l);
  *hi = static_cast<std::size_t>(std::max(l, h));
}

}  // namespace detail
}  // namespace rope::attention
