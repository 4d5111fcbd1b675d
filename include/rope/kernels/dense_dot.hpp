// rope/kernels/dense_dot.hpp — the thin products of the one-head softmax
// (attention/softmax_tile.hpp) for a few query rows, where a GEMM would
// spend its time packing: rows of float or double, no cache types.
//
//   dot_rows:      scores[r * score_stride] = q_r . key          (r < rows)
//   weighted_rows: acc_r += sum_j weight_(r, j) value_j          (r < rows, j < n)
//
// Written once, templated on the element type (float, double) and the xsimd
// architecture Arch, on detail::mul_add, so that every product is rounded
// once where Arch has fused multiply-adds, whatever the xsimd version.
//
// Rounding: weighted_rows adds the values in order j = 0, 1, ..., each with
// one fused multiply-add per channel, exactly as reference::weighted_rows
// does with std::fma: the two agree bit for bit where Arch has fused
// multiply-adds. dot_rows keeps one partial sum per lane and adds the lanes
// at the end (detail::sum_lanes), so its sum is ordered differently from
// reference::dot_rows: they agree within d * eps * sum_c |q_c key_c|.
//
// Preconditions (unchecked; the attention module checks its arguments):
// every row pointer holds the channels it is read or written at (d for q
// and key, dv for value and acc rows); acc rows do not overlap each other,
// the weights or the values.
#pragma once

#include <cmath>
#include <cstddef>
#include <type_traits>

#include "../detail/simd.hpp"
#include "../detail/xsimd.hpp"

namespace rope {

// scores[r * score_stride] = q_r . key for `rows` query rows of d values
// (row r at q + r * d).
template <class T, class Arch = xsimd::default_arch>
void dot_rows(const T* q, std::size_t rows, std::size_t d, const T* key, T* scores, std::size_t score_stride) noexcept {
  using B = xsimd::batch<T, Arch>;
  constexpr std::size_t n = B::size;
  const std::size_t full = d - d % n;
  for (std::size_t r = 0; r < rows; ++r) {
    const T* qr = q + r * d;
    B sum(T(0));
    for (std::size_t c = 0; c < full; c += n) {
      sum = detail::mul_add(B::load_unaligned(qr + c), B::load_unaligned(key + c), sum);
    }
    T total = detail::sum_lanes(sum);
    for (std::size_t c = full; c < d; ++c) total += qr[c] * key[c];
    scores[r * score_stride] = total;
  }
}

namespace detail {

// acc_r += w_r * value for `rows` rows (w_r = weights[r * weight_stride],
// acc row r at acc + r * acc_stride), dv channels.
template <class T, class Arch>
void axpy_rows(const T* weights, std::size_t weight_stride, std::size_t rows, const T* value, std::size_t dv, T* acc,
               std::size_t acc_stride) noexcept {
  using B = xsimd::batch<T, Arch>;
  constexpr std::size_t n = B::size;
  const std::size_t full = dv - dv % n;
  for (std::size_t r = 0; r < rows; ++r) {
    const T w = weights[r * weight_stride];
    T* ar = acc + r * acc_stride;
    const B wb(w);
    for (std::size_t c = 0; c < full; c += n) {
      mul_add(wb, B::load_unaligned(value + c), B::load_unaligned(ar + c)).store_unaligned(ar + c);
    }
    for (std::size_t c = full; c < dv; ++c) ar[c] = std::fma(w, value[c], ar[c]);
  }
}

// weighted_rows for R rows known at compile time: the accumulators of C
// column batches of all R rows held in registers while the values stream
// past, instead of loading and storing each row's accumulator for every
// value.
template <std::size_t R, class T, class Arch>
void weighted_block(const T* weights, std::size_t weight_stride, std::size_t n, const T* values,
                    std::size_t value_stride, std::size_t dv, T* acc, std::size_t acc_stride) noexcept {
  using B = xsimd::batch<T, Arch>;
  constexpr std::size_t lanes = B::size;
  constexpr std::size_t C = R <= 2 ? 4 : R <= 4 ? 2 : 1;  // column batches per pass
  const std::size_t full = dv - dv % lanes;
  std::size_t c = 0;
  for (; c + C * lanes <= full; c += C * lanes) {
    B a[R][C];
    for (std::size_t r = 0; r < R; ++r) {
      for (std::size_t b = 0; b < C; ++b) a[r][b] = B::load_unaligned(acc + r * acc_stride + c + b * lanes);
    }
    for (std::size_t j = 0; j < n; ++j) {
      const T* x = values + j * value_stride + c;
      B xb[C];
      for (std::size_t b = 0; b < C; ++b) xb[b] = B::load_unaligned(x + b * lanes);
      for (std::size_t r = 0; r < R; ++r) {
        const B w(weights[r * weight_stride + j]);
        for (std::size_t b = 0; b < C; ++b) a[r][b] = mul_add(w, xb[b], a[r][b]);
      }
    }
    for (std::size_t r = 0; r < R; ++r) {
      for (std::size_t b = 0; b < C; ++b) a[r][b].store_unaligned(acc + r * acc_stride + c + b * lanes);
    }
  }
  // What is left: batch by batch, then channel by channel.
  for (std::size_t j = 0; j < n; ++j) {
    axpy_rows<T, Arch>(weights + j, weight_stride, R, values + j * value_stride + c, dv - c, acc + c, acc_stride);
  }
}

}  // namespace detail

// acc_r += sum_j weights[r * weight_stride + j] * value_j for `rows` rows
// and n values (value j at values + j * value_stride, dv channels; acc row r
// at acc + r * acc_stride). Rows in groups of 8, 4, 2 and 1 (a decode step's
// query heads per key/value head: 7 = 4 + 2 + 1), each group's accumulators
// in registers while the values stream past. Each row's sum is the same
// whatever its group; four group sizes rather than one per count keep the
// code every user of softmax compiles small.
template <class T, class Arch = xsimd::default_arch>
void weighted_rows(const T* weights, std::size_t weight_stride, std::size_t rows, std::size_t n, const T* values,
                   std::size_t value_stride, std::size_t dv, T* acc, std::size_t acc_stride) noexcept {
  detail::for_row_groups<8>(rows, [&](auto group, std::size_t r) {
    detail::weighted_block<decltype(group)::value, T, Arch>(weights + r * weight_stride, weight_stride, n, values,
                                                            value_stride, dv, acc + r * acc_stride, acc_stride);
  });
}
}  // namespace rope
