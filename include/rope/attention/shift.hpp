// rope/attention/shift.hpp — re-rotating cached keys: a context shift
// (StreamingLLM's eviction, a K-shift). When tokens are dropped and the rest
// move to lower positions, their keys, rotated at their old positions, are
// rotated again by the move:
//
//   k <- R_delta k   (R_delta R_m = R_(m + delta): pair p turned by delta * theta_p)
//
// in place, over a sequence's keys [first, first + count) (its block-table
// row says where they are), the values untouched. Each key row is widened,
// rotated in float and rounded once back into the cache's type: bf16 and
// f16 in registers (the tensor API's 16-bit rows), int8 dequantized by its
// scale and quantized again with a new one (the channels past rotary_dim
// too: they keep their values within half the new scale).
//
// Exact on paper, a shift costs per element the float rotation (the
// table's cos and sin, the products and the sum: about 3u of |x_a c| +
// |x_b s|, u = 2^-24) and one rounding into the type (bf16 2^-8, f16 2^-11
// of the result, int8 half the row's new scale). k shifts add up in each
// pair's 2-norm (a later rotation mixes a pair's two errors), at most k
// such bounds; tests/test_attention_shift.cpp holds the bound of one shift
// at its worst case and docs/attention.md measures k shifts per type
// against rotating at read (keeping positions and rotating every key when
// it is read, which rounds nothing more but costs a rotation of every key
// in every step).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "../detail/lines.hpp"
#include "../detail/parallel.hpp"
#include "../detail/xsimd.hpp"
#include "../executor.hpp"
#include "../kernels/kv_store.hpp"
#include "../kernels/rotate.hpp"
#include "../tensor/shared_checks.hpp"
#include "cache.hpp"
#include "rotation.hpp"

namespace rope::attention {

namespace detail {

// Key j's rows of every head, rotated by (cos, sin) in direction dir and
// rounded once back. x: rotary_dim + head_dim + 2 floats of scratch.
template <class E, class Arch>
void shift_row(const PagePool<E>& pool, std::size_t slot, Style style, std::size_t rotary_dim, const float* cos,
               const float* sin, Direction dir, float* x) noexcept {
  const auto stride = static_cast<std::ptrdiff_t>(pool.head_stride);
  E* row = pool.row(slot, 0);
  with_style(style, [&](auto s) {
    constexpr Style S = decltype(s)::value;
    if constexpr (std::is_same<E, float>::value) {
      rotate_heads<S, float, Arch>(row, stride, row, stride, pool.heads, cos, sin, rotary_dim, dir);
    } else if constexpr (KvElement<E>::kScaled) {
      for (std::size_t h = 0; h < pool.heads; ++h) {
        E* q = pool.row(slot, h);
        float* scale = pool.scale(slot, h);
        for (std::size_t c = 0; c < pool.head_dim; ++c) x[c] = rope::detail::widen_value(q[c]) * *scale;
        rotate_heads<S, float, Arch>(x, 0, x, 0, 1, cos, sin, rotary_dim, dir);
        store_kv_row<Arch>(x, pool.head_dim, q, scale);
      }
    } else {
      rope::detail::rotate_heads_16<S, E, Arch>(row, stride, row, stride, pool.heads, cos, sin, rotary_dim, dir, x);
    }
  });
}

}  // namespace detail

// Rotates sequence keys [first, first + count) of cache.k by delta positions
// (negative: to lower positions), in place, each value rounded once back;
// pages is the sequence's block-table row of page_count ids (key j in slot
// pages[j / page_size] * page_size + j % page_size). The rotation's table
// must hold row |delta|; its pairing and rotary_dim are the model's (the
// channels past rotary_dim keep their values; int8 re-quantizes them).
// Threads over keys; the same bytes for any count. Refused before anything
// is written: a pool that is not sound, a key range past the pool's slots
// or past the page_count pages of the row, a page id outside the pool or
// named twice in the range, a rotation without its pairing or wider than
// the heads, |delta| outside the table.
template <class E, class Arch = xsimd::default_arch>
void shift(const PagedCache<E>& cache, const std::int32_t* pages, std::size_t page_count, std::size_t first,
           std::size_t count, std::int64_t delta, const Rotation<float>& rotation, const Threads& threads = {}) {
  detail::check_kv_element<E>();
  const char* fn = "rope::attention::shift";
  detail::check_cache(fn, cache);
  rope::detail::check_threads(fn, "threads", threads);
  const PagePool<E>& pool = cache.k;
  const std::size_t ps = pool.page_size;
  if (count > 0 && pages == nullptr) detail::fail(fn, "pages", {"non-null for ", count, " keys"}, nullptr);
  if (first > pool.slots() || count > pool.slots() - first) {
    detail::fail(fn, "first + count", {"<= the pool's slots ", pool.slots()}, first + count);
  }
  if (count > 0 && (first + count - 1) / ps >= page_count) {
    detail::fail(fn, "first + count", {"<= the row's pages' keys page_count * page_size = ", page_count * ps},
                 first + count);
  }
  std::vector<unsigned char> seen(count > 0 ? pool.pages : 0, 0);
  for (std::size_t i = first / ps; count > 0 && i <= (first + count - 1) / ps; ++i) {
    if (pages[i] < 0 || static_cast<std::size_t>(pages[i]) >= pool.pages) {
      detail::fail(fn, {"pages[", i, "]"}, {"a page id below cache.k.pages = ", pool.pages}, pages[i]);
    }
    if (seen[static_cast<std::size_t>(pages[i])]++ != 0) {
      detail::fail(fn, {"pages[", i, "]"}, "a page the range does not already name (it would turn twice)", pages[i]);
    }
  }
  const std::size_t rotary_dim = detail::rotary_width(fn, "rotation", rotation, pool.head_dim);
  const std::uint64_t magnitude =
      delta < 0 ? static_cast<std::uint64_t>(-(delta + 1)) + 1 : static_cast<std::uint64_t>(delta);
  if (rotation.table != nullptr && magnitude >= rotation.table->positions()) {
    detail::fail<rope::out_of_range>(fn, "delta",
                                     {"within the table's positions: |delta| < ", rotation.table->positions()}, delta);
  }
  if (count == 0 || rotation.table == nullptr || rotary_dim == 0 || delta == 0) return;
  const float* cos = rotation.table->cos(static_cast<std::size_t>(magnitude));
  const float* sin = rotation.table->sin(static_cast<std::size_t>(magnitude));
  const Direction dir = delta < 0 ? Direction::inverse : Direction::forward;
  const std::size_t workers = std::min(count, std::max<std::size_t>(1, threads.shares()));
  const std::size_t per = rope::detail::line_floats(rotary_dim + pool.head_dim + 2);
  std::vector<float> scratch(workers * per);
  rope::detail::parallel_for(workers, workers, threads.executor, [&](std::size_t w, std::size_t) {
    for (std::size_t j = first + count * w / workers; j < first + count * (w + 1) / workers; ++j) {
      const std::size_t slot = static_cast<std::size_t>(pages[j / ps]) * ps + j % ps;
      detail::shift_row<E, Arch>(pool, slot, rotation.style, rotary_dim, cos, sin, dir, scratch.data() + w * per);
    }
  });
}

}  // namespace rope::attention
