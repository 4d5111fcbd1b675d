// rope/attention/softmax_tile.hpp — the online-softmax tile of softmax.hpp:
// a block of query rows (a key/value head's group of query heads, stacked)
// against blocks of keys, each product one Eigen GEMM with a running max
// and sum per row, or for a few rows per head (a decode step) the thin
// products of kernels/dense_dot.hpp. Sorted keys cut tiles at each query's
// visible range, so masked work stays below one tile width per row.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include <Eigen/Core>

#include "../detail/parallel.hpp"
#include "../detail/prefetch.hpp"
#include "../kernels/dense_dot.hpp"
#include "../kernels/scores.hpp"
#include "call_checks.hpp"
#include "call_options.hpp"
#include "logits.hpp"
#include "masks.hpp"
#include "matrix_ops.hpp"
#include "softmax_params.hpp"
#include "types.hpp"

namespace rope::attention {

namespace detail {

using rope::detail::parallel_for;

// One work item: query tokens [t0, t1) of key/value heads [g0, g1). The
// `group` query heads of a key/value head are stacked token-major (row =
// token * group + head). Every head of the item meets each key tile in turn,
// so a KV cache [tokens, heads, d] is read in memory order, a token's heads
// together, whatever the item's number of heads: results per head do not
// depend on it.
template <class T>
class SoftmaxTile {
 public:
  SoftmaxTile(const View<const T>& q, const View<const T>& k, const View<const T>& v, const View<T>& out,
              const Rotation<T>& rotation, const SoftmaxParams<T>& params, SoftmaxWorkspace<T>& ws)
      : q_(q), k_(k), v_(v), out_(out), rotation_(rotation), params_(params), ws_(ws) {}

  void run(std::size_t g0, std::size_t g1, std::size_t t0, std::size_t t1) {
    group_ = q_.heads / k_.heads;
    g0_ = g0;
    t0_ = t0;
    tokens_ = t1 - t0;
    const auto rows = static_cast<Eigen::Index>(tokens_ * group_);
    const auto dv = static_cast<Eigen::Index>(v_.head_dim);
    ws_.heads.resize(g1 - g0);
    for (std::size_t i = 0; i < g1 - g0; ++i) {
      HeadRows<T>& head = ws_.heads[i];
      load_queries(g0 + i, head);
      head.acc.setZero(rows, dv);
      start_rows(g0 + i, head);
    }
    ws_.seen.assign(tokens_, 0);
    const std::size_t lk = k_.tokens;
    thin_ = static_cast<std::size_t>(rows) <= kThinRows;
    const std::size_t bk =
        std::min(thin_ ? std::min(params_.block, kThinBlock) : params_.block, std::max<std::size_t>(lk, 1));
    if (!params_.visibility.masks()) {
      sweep(0, lk, bk, false);
      std::fill(ws_.seen.begin(), ws_.seen.end(), lk > 0 ? 1 : 0);
    } else if (params_.sorted) {
      sweep_sorted(lk, bk);
    } else {
      for (std::size_t t = 0; t < tokens_; ++t) {
        for (std::size_t j = 0; j < lk && !ws_.seen[t]; ++j) ws_.seen[t] = params_.visibility.visible(t0_ + t, j);
      }
      sweep(0, lk, bk, true);
    }
    for (std::size_t i = 0; i < g1 - g0; ++i) write_out(g0 + i, ws_.heads[i]);
  }

  // Whether K is read in place (not rotated into the workspace first).
  static bool keys_in_place(const Rotation<T>& rotation, const SoftmaxParams<T>& params) {
    return rotation.table == nullptr || params.rotary_dim == 0 || params.keys_rotated;
  }
  // Query rows per head up to which a tile is computed row by row rather
  // than by GEMM, and how many tokens ahead that pass prefetches.
  static constexpr std::size_t kThinRows = 8;
  static constexpr std::size_t kGranule = 64;
  static constexpr std::size_t kAhead = 2;
  static constexpr std::size_t kThinBlock = 64;
  // Rows per GEMM of a masked tile cut into pieces (cut_pieces).
  static constexpr std::size_t kPieceRows = 128;
  // Score rows of the thin path start at multiples of this many values (64 bytes).
  static constexpr std::size_t kRowAlign = 64 / sizeof(T);

 private:
  // Sorted keys: each token sees one range. Keys every token of the tile
  // sees are swept unmasked, the ragged ends masked.
  void sweep_sorted(std::size_t lk, std::size_t bk) {
    ws_.lo.resize(tokens_);
    ws_.hi.resize(tokens_);
    std::size_t min_lo = lk, max_lo = 0, min_hi = lk, max_hi = 0;
    for (std::size_t t = 0; t < tokens_; ++t) {
      params_.visibility.range(t0_ + t, lk, ws_.lo[t], ws_.hi[t]);
      if (ws_.lo[t] >= ws_.hi[t]) continue;
      ws_.seen[t] = 1;
      min_lo = std::min(min_lo, ws_.lo[t]);
      max_lo = std::max(max_lo, ws_.lo[t]);
      min_hi = std::min(min_hi, ws_.hi[t]);
      max_hi = std::max(max_hi, ws_.hi[t]);
    }
    if (min_lo < max_hi) {
      const bool uniform =
          max_lo < min_hi && std::count(ws_.seen.begin(), ws_.seen.end(), 1) == static_cast<std::ptrdiff_t>(tokens_);
      if (uniform) {
        // The full range cut at multiples of kGranule keys: GEMMs of odd
        // widths are slow, and a few masked keys more cost less.
        // The full range's last tile, when narrower than bk, joins the
        // masked end if both fit in one tile (a causal block's diagonal):
        // one wide GEMM instead of two narrow ones.
        const std::size_t full_lo = std::min(min_hi, (max_lo + kGranule - 1) / kGranule * kGranule);
        std::size_t full_hi = std::max(full_lo, min_hi / kGranule * kGranule);
        const std::size_t narrow = (full_hi - full_lo) % bk;
        if (narrow != 0 && narrow + (max_hi - full_hi) <= bk) full_hi -= narrow;
        sweep(min_lo, full_lo, bk, true);
        sweep(full_lo, full_hi, bk, false);
        sweep(full_hi, max_hi, bk, true);
      } else {
        sweep(min_lo, max_hi, bk, true);
      }
    }
  }

  // The running max and sum of head g's rows before any key: -inf and 0, or
  // with a sink the sink and 1 (= exp(sink - sink)), so that the sink joins
  // the max and the denominator once per row, whatever the block size.
  void start_rows(std::size_t g, HeadRows<T>& head) {
    const T neg_inf = -std::numeric_limits<T>::infinity();
    const auto rows = static_cast<Eigen::Index>(tokens_ * group_);
    head.row_max.setConstant(rows, neg_inf);
    head.row_sum.setZero(rows);
    if (params_.logits.sinks == nullptr) return;
    for (Eigen::Index r = 0; r < rows; ++r) {
      const T sink = params_.logits.sink(g * group_ + static_cast<std::size_t>(r) % group_);
      if (sink == neg_inf) continue;
      head.row_max[r] = sink;
      head.row_sum[r] = T(1);
    }
  }

  // The group's queries of head g, rotated at their positions and scaled once.
  void load_queries(std::size_t g, HeadRows<T>& head) {
    const auto d = static_cast<Eigen::Index>(q_.head_dim);
    head.q.resize(static_cast<Eigen::Index>(tokens_ * group_), d);
    for (std::size_t t = 0; t < tokens_; ++t) {
      for (std::size_t h = 0; h < group_; ++h) {
        std::memcpy(head.q.row(static_cast<Eigen::Index>(t * group_ + h)).data(), q_.row(t0_ + t, g * group_ + h),
                    static_cast<std::size_t>(d) * sizeof(T));
      }
      T* first = head.q.row(static_cast<Eigen::Index>(t * group_)).data();
      rotate_at(rotation_, params_.rotary_dim, static_cast<std::size_t>(params_.visibility.q_position(t0_ + t)), first,
                first, d, group_, static_cast<std::size_t>(d));
    }
    head.q *= params_.logits.scale;  // one pass over Q instead of one over every score tile
  }

  // K of head g: rotated once into the workspace (an item of one head), or
  // read in place.
  ConstRowsMap<T> keys_of(std::size_t g, std::size_t j0, std::size_t n) {
    const std::size_t lk = k_.tokens;
    const auto d = static_cast<Eigen::Index>(k_.head_dim);
    if (keys_in_place(rotation_, params_)) {
      const Eigen::Index stride = lk > 1 ? static_cast<Eigen::Index>(k_.token_stride) : d;
      return ConstRowsMap<T>(k_.row(j0, g), static_cast<Eigen::Index>(n), d, Eigen::OuterStride<>(stride));
    }
    if (ws_.keys_of_head != g) {
      ws_.keys.resize(static_cast<Eigen::Index>(lk), d);
      for (std::size_t j = 0; j < lk; ++j) {
        rotate_at(rotation_, params_.rotary_dim, static_cast<std::size_t>(params_.visibility.k_position(j)),
                  k_.row(j, g), ws_.keys.row(static_cast<Eigen::Index>(j)).data(), 0, 1, static_cast<std::size_t>(d));
      }
      ws_.keys_of_head = g;
    }
    return ConstRowsMap<T>(ws_.keys.row(static_cast<Eigen::Index>(j0)).data(), static_cast<Eigen::Index>(n), d,
                           Eigen::OuterStride<>(d));
  }

  // V of head g: in place for a decode step (read once), else copied once
  // per head into contiguous rows (every query block of the head reads it,
  // and packing strided rows for the GEMM costs more than one copy). The
  // copy counts the rows that hold a value not finite as it goes, while each
  // row is in L1, so that a masked tile asks whether its values are finite
  // in O(1) (values_finite) instead of reading them again.
  ConstRowsMap<T> values_of(std::size_t g, std::size_t j0, std::size_t n) {
    const auto dv = static_cast<Eigen::Index>(v_.head_dim);
    if (thin_) {
      const std::size_t stride = k_.tokens > 1 ? v_.token_stride : v_.head_dim;
      return ConstRowsMap<T>(v_.row(j0, g), static_cast<Eigen::Index>(n), dv,
                             Eigen::OuterStride<>(static_cast<Eigen::Index>(stride)));
    }
    if (ws_.values_of_head != g) {
      ws_.values.resize(static_cast<Eigen::Index>(v_.tokens), dv);
      ws_.values_bad.assign(v_.tokens + 1, 0);
      for (std::size_t j = 0; j < v_.tokens; ++j) {
        auto row = ws_.values.row(static_cast<Eigen::Index>(j));
        std::memcpy(row.data(), v_.row(j, g), v_.head_dim * sizeof(T));
        // 0 * x is NaN exactly when x is not finite, and the sum keeps a NaN.
        const bool bad = std::isnan((row.array() * T(0)).sum());
        ws_.values_bad[j + 1] = ws_.values_bad[j] + (bad ? 1 : 0);
      }
      ws_.values_of_head = g;
    }
    return ConstRowsMap<T>(ws_.values.row(static_cast<Eigen::Index>(j0)).data(), static_cast<Eigen::Index>(n), dv,
                           Eigen::OuterStride<>(dv));
  }

  void sweep(std::size_t begin, std::size_t end, std::size_t bk, bool partial) {
    for (std::size_t j0 = begin; j0 < end; j0 += bk) {
      const std::size_t n = std::min(bk, end - j0);
      if (partial && !any_visible(j0, n)) continue;
      if (thin_) {
        thin_tile(j0, n, partial);
      } else {
        for (std::size_t i = 0; i < ws_.heads.size(); ++i) tile(g0_ + i, ws_.heads[i], j0, n, partial);
      }
    }
  }

  // Whether the values of keys [j0, j0 + n) are all finite (after values_of
  // copied the head's values).
  bool values_finite(std::size_t j0, std::size_t n) const noexcept {
    return ws_.values_bad[j0 + n] == ws_.values_bad[j0];
  }

  bool visible(std::size_t t, std::size_t j) const noexcept {
    if (params_.sorted) return j >= ws_.lo[t] && j < ws_.hi[t];
    return params_.visibility.visible(t0_ + t, j);
  }
  bool any_visible(std::size_t j0, std::size_t n) const noexcept {
    for (std::size_t t = 0; t < tokens_; ++t) {
      for (std::size_t j = j0; j < j0 + n; ++j) {
        if (visible(t, j)) return true;
      }
    }
    return false;
  }

  // Keys [j0, j0 + n) of head g by GEMM: scores, running max and sum, and
  // the weighted values. A masked tile of sorted keys is cut into pieces of
  // whole tokens, each multiplied over the keys its tokens see (a causal
  // block's diagonal: the first tokens see fewer keys); scores outside every
  // piece are masked before they are read.
  void tile(std::size_t g, HeadRows<T>& head, std::size_t j0, std::size_t n, bool partial) {
    const ConstRowsMap<T> keys = keys_of(g, j0, n);
    const ConstRowsMap<T> values = values_of(g, j0, n);
    cut_pieces(j0, n, partial);
    // The scores accumulate into a buffer kept all zeros between tiles
    // (update clears what it read), so that no pass zeroes it before each
    // GEMM; the weights go to their own rows.
    const Eigen::Index rows = head.q.rows(), bn = static_cast<Eigen::Index>(n);
    if (ws_.zeroed.size() < rows * bn) ws_.zeroed.setZero(rows * bn);
    RowsMap<T> scores(ws_.zeroed.data(), rows, bn, Eigen::OuterStride<>(bn));
    for (const TilePiece& p : ws_.pieces) {
      scores.block(p.r0, p.c0, p.rows, p.cols).noalias() +=
          head.q.middleRows(p.r0, p.rows) * keys.middleRows(p.c0, p.cols).transpose();
    }
    ws_.scores.resize(rows, bn);
    update(head, scores, ws_.scores, j0, n, partial);
    if (!partial || values_finite(j0, n)) {
      for (const TilePiece& p : ws_.pieces) {
        head.acc.middleRows(p.r0, p.rows).noalias() +=
            ws_.scores.block(p.r0, p.c0, p.rows, p.cols) * values.middleRows(p.c0, p.cols);
      }
    } else {
      accumulate_visible(head, ws_.scores, values, j0, n);
    }
  }

  // The pieces of a tile of keys [j0, j0 + n): the whole tile, or for a
  // masked tile of sorted keys, runs of about kPieceRows rows (whole tokens),
  // each over the span of keys its tokens see; runs that see nothing are
  // left out.
  void cut_pieces(std::size_t j0, std::size_t n, bool partial) {
    ws_.pieces.clear();
    const auto bn = static_cast<Eigen::Index>(n);
    if (!partial || !params_.sorted) {
      ws_.pieces.push_back({0, static_cast<Eigen::Index>(tokens_ * group_), 0, bn});
      return;
    }
    const std::size_t run = std::max<std::size_t>(1, kPieceRows / group_);
    for (std::size_t t0 = 0; t0 < tokens_; t0 += run) {
      const std::size_t t1 = std::min(tokens_, t0 + run);
      std::size_t c0 = n, c1 = 0;
      for (std::size_t t = t0; t < t1; ++t) {
        std::size_t lo, hi;
        visible_span(t, j0, n, lo, hi);
        if (lo == hi) continue;
        c0 = std::min(c0, lo);
        c1 = std::max(c1, hi);
      }
      if (c0 >= c1) continue;
      ws_.pieces.push_back({static_cast<Eigen::Index>(t0 * group_), static_cast<Eigen::Index>((t1 - t0) * group_),
                            static_cast<Eigen::Index>(c0), static_cast<Eigen::Index>(c1 - c0)});
    }
  }

  // A few query rows per head (a decode step): keys [j0, j0 + n) of every
  // head of the item, one token at a time, a token's heads together, as a
  // token-major cache holds them; dot products and weighted sums row by row
  // instead of GEMMs whose packing would cost more than their arithmetic.
  void thin_tile(std::size_t j0, std::size_t n, bool partial) {
    const std::size_t heads = ws_.heads.size();
    const auto rows = ws_.heads[0].q.rows(), d = ws_.heads[0].q.cols();
    const auto bn = static_cast<Eigen::Index>(n);
    ws_.key_maps.clear();
    for (std::size_t i = 0; i < heads; ++i) ws_.key_maps.push_back(keys_of(g0_ + i, j0, n));
    // Every score row starts a whole cache line after the one before it:
    // Eigen's vectorised exp and sum peel a row's unaligned first values
    // with scalar code, so rows at different alignments would round
    // differently, and a head's bits would depend on its place in the item,
    // which changes with the thread count.
    const std::size_t stride = (n + kRowAlign - 1) / kRowAlign * kRowAlign;
    const auto bs = static_cast<Eigen::Index>(stride);
    ws_.scores.resize(static_cast<Eigen::Index>(heads) * rows, bs);
    for (Eigen::Index j = 0; j < bn; ++j) {
      prefetch_token(j0 + static_cast<std::size_t>(j) + kAhead, true);
      prefetch_token(j0 + static_cast<std::size_t>(j), false);
      for (std::size_t i = 0; i < heads; ++i) {
        rope::dot_rows(ws_.heads[i].q.data(), static_cast<std::size_t>(rows), static_cast<std::size_t>(d),
                       ws_.key_maps[i].row(j).data(), &ws_.scores(static_cast<Eigen::Index>(i) * rows, j), stride);
      }
    }
    for (std::size_t i = 0; i < heads; ++i) {
      Eigen::Ref<Matrix<T>> s(ws_.scores.block(static_cast<Eigen::Index>(i) * rows, 0, rows, bn));
      update(ws_.heads[i], s, s, j0, n, partial);
      if (partial) accumulate_visible(ws_.heads[i], s, values_of(g0_ + i, j0, n), j0, n);
    }
    if (partial) return;
    // The weighted values head by head, each head's block of values in one
    // pass with the accumulators in registers; the values were asked for
    // while the scores were computed. Meanwhile the next block's keys are
    // asked for, a share per head.
    const std::size_t value_stride = k_.tokens > 1 ? v_.token_stride : v_.head_dim;
    for (std::size_t i = 0; i < heads; ++i) {
      for (std::size_t j = n * i / heads; j < n * (i + 1) / heads; ++j) prefetch_token(j0 + n + j, true);
      HeadRows<T>& head = ws_.heads[i];
      rope::weighted_rows(&ws_.scores(static_cast<Eigen::Index>(i) * rows, 0), stride, static_cast<std::size_t>(rows),
                          n, v_.row(j0, g0_ + i), value_stride, v_.head_dim, head.acc.data(),
                          static_cast<std::size_t>(head.acc.cols()));
    }
  }

  // Caps the scores s of one head's rows (softcap), masks them, then the
  // online softmax step: new running max, the weights exp(s - max) into p
  // (which may be s itself; when it is not, s is left all zeros), the
  // correction of what was accumulated so far, the running sums. A row with
  // nothing visible yet keeps the shift 0, so that exp(-inf - 0) is 0 rather
  // than NaN. The cap comes before the mask: a masked score is -inf, never
  // cap * tanh(-inf / cap) = -cap.
  void update(HeadRows<T>& head, Eigen::Ref<Matrix<T>> s, Eigen::Ref<Matrix<T>> p, std::size_t j0, std::size_t n,
              bool partial) {
    const T neg_inf = -std::numeric_limits<T>::infinity();
    const bool clear = p.data() != s.data();
    if (params_.logits.softcap > T(0)) {
      const T cap = params_.logits.softcap;
      s = ((s.array() / cap).tanh() * cap).matrix();
    }
    if (partial) mask(s, j0, n, neg_inf);
    for (Eigen::Index r = 0; r < s.rows(); ++r) {
      auto row = s.row(r);  // one row at a time, while it is in L1
      auto weights = p.row(r);
      const T old_max = head.row_max[r];
      const T new_max = std::max(old_max, row.maxCoeff());
      const T shift = new_max == neg_inf ? T(0) : new_max;
      T sum;
      if constexpr (std::is_same<T, float>::value) {
        // The kernel layer's weights: a masked (-inf) score gives exactly 0.
        sum = rope::softmax_weights_row(row.data(), weights.data(), n, shift, clear);
      } else {
        weights = (row.array() - shift).exp().matrix();
        if (clear) row.setZero();
        // A vectorised exp need not return exactly 0 for -inf (Eigen's double
        // exp clamps to ~5e-309): masked weights are set to 0 here.
        if (partial) mask_row(weights, static_cast<std::size_t>(r) / group_, j0, n);
        sum = weights.sum();
      }
      const T correction = rope::detail::carry(old_max, new_max);
      if (new_max != neg_inf) head.row_max[r] = new_max;
      head.row_sum[r] = head.row_sum[r] * correction + sum;
      if (correction != T(1)) head.acc.row(r) *= correction;
    }
  }

  // The weighted values of the visible keys only: a masked entry is left out,
  // never multiplied by zero, so that a masked key's value that is not finite
  // cannot leak into rows that must not see it.
  void accumulate_visible(HeadRows<T>& head, const Eigen::Ref<Matrix<T>>& s, const ConstRowsMap<T>& values,
                          std::size_t j0, std::size_t n) {
    for (std::size_t t = 0; t < tokens_; ++t) {
      for (std::size_t j = 0; j < n; ++j) {
        if (!visible(t, j0 + j)) continue;
        const auto jj = static_cast<Eigen::Index>(j);
        for (std::size_t h = 0; h < group_; ++h) {
          const auto r = static_cast<Eigen::Index>(t * group_ + h);
          head.acc.row(r) += s(r, jj) * values.row(jj);
        }
      }
    }
  }

  // Sorted keys: the keys [j0 + lo, j0 + hi) of [j0, j0 + n) are the ones
  // token t sees (lo == hi when none).
  void visible_span(std::size_t t, std::size_t j0, std::size_t n, std::size_t& lo, std::size_t& hi) const noexcept {
    lo = std::clamp(ws_.lo[t], j0, j0 + n) - j0;
    hi = std::max(lo, std::clamp(ws_.hi[t], j0, j0 + n) - j0);
  }

  // Zeroes the weights of the keys token t does not see.
  template <class Row>
  void mask_row(Row& row, std::size_t t, std::size_t j0, std::size_t n) const {
    if (params_.sorted) {
      // The token's visible range within [j0, j0 + n): zero what is outside.
      std::size_t lo, hi;
      visible_span(t, j0, n, lo, hi);
      row.head(static_cast<Eigen::Index>(lo)).setZero();
      row.tail(static_cast<Eigen::Index>(n - hi)).setZero();
      return;
    }
    for (std::size_t j = 0; j < n; ++j) {
      if (!visible(t, j0 + j)) row[static_cast<Eigen::Index>(j)] = T(0);
    }
  }

  // Sets the entries of masked keys to `value`.
  void mask(Eigen::Ref<Matrix<T>> s, std::size_t j0, std::size_t n, T value) const {
    if (params_.sorted) {
      // Each token's rows outside its visible range within [j0, j0 + n).
      for (std::size_t t = 0; t < tokens_; ++t) {
        std::size_t lo, hi;
        visible_span(t, j0, n, lo, hi);
        auto rows = s.middleRows(static_cast<Eigen::Index>(t * group_), static_cast<Eigen::Index>(group_));
        rows.leftCols(static_cast<Eigen::Index>(lo)).setConstant(value);
        rows.rightCols(static_cast<Eigen::Index>(n - hi)).setConstant(value);
      }
      return;
    }
    for (std::size_t t = 0; t < tokens_; ++t) {
      for (std::size_t j = 0; j < n; ++j) {
        if (!visible(t, j0 + j)) {
          s.block(static_cast<Eigen::Index>(t * group_), static_cast<Eigen::Index>(j),
                  static_cast<Eigen::Index>(group_), 1)
              .setConstant(value);
        }
      }
    }
  }

  // The K (when read in place) or V rows of token j for every head of the
  // item, a few tokens ahead of the one being read: a token-major cache
  // keeps a token's heads together and its tokens a page or more apart,
  // where the hardware prefetchers stop.
  void prefetch_token(std::size_t j, bool keys) const noexcept {
    if (j >= k_.tokens) return;
    const View<const T>& x = keys ? k_ : v_;
    if (keys && !keys_in_place(rotation_, params_)) return;
    const std::size_t heads = ws_.heads.size();
    if (x.head_stride == x.head_dim) {
      rope::detail::prefetch(x.row(j, g0_), heads * x.head_dim * sizeof(T));
    } else {
      for (std::size_t i = 0; i < heads; ++i) rope::detail::prefetch(x.row(j, g0_ + i), x.head_dim * sizeof(T));
    }
  }

  void write_out(std::size_t g, const HeadRows<T>& head) {
    const auto dv = static_cast<Eigen::Index>(v_.head_dim);
    for (Eigen::Index r = 0; r < head.acc.rows(); ++r) {
      const auto t = static_cast<std::size_t>(r) / group_, h = static_cast<std::size_t>(r) % group_;
      write_output_row(out_.row(t0_ + t, g * group_ + h), dv, head.acc.row(r), head.row_sum[r], ws_.seen[t] != 0);
    }
  }

  const View<const T>& q_;
  const View<const T>& k_;
  const View<const T>& v_;
  const View<T>& out_;
  const Rotation<T>& rotation_;
  const SoftmaxParams<T>& params_;
  SoftmaxWorkspace<T>& ws_;
  std::size_t group_ = 1, g0_ = 0, t0_ = 0, tokens_ = 0;
  bool thin_ = false;
};

}  // namespace detail
}  // namespace rope::attention
