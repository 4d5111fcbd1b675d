// rope/attention/softmax.hpp — softmax attention with RoPE on Q and K, for
// prefill and for decoding against a KV cache.
//
//   S_ij = (R_pq_i q_i) . (R_pk_j k_j) * scale,  out_i = sum_j softmax_j(S_i) v_j
//
// over the keys j visible to query i (common.hpp: causal, sliding window,
// sequence ids, by position). scale defaults to 1/sqrt(d); YaRN / DeepSeek
// checkpoints set their own. A query that sees no key gets a zero row; a
// query whose visible scores or values hold a NaN gets NaN. A masked key is
// left out of the sums, never multiplied by zero: a NaN or Inf in a key or
// value row reaches only the outputs of the queries that see it.
//
// Evaluated blockwise with a running max and running sum (online softmax):
// a tile of `block` query rows by `block` keys at a time, each product one
// Eigen GEMM; memory O(block^2 + L d) per thread, never an Lq x Lk matrix.
// With grouped-query heads the query heads that share a key/value head are
// stacked into one tile, so each K and V row is read once per group, and K
// is rotated once per key/value head. When the keys are sorted by (sequence,
// position) each query sees one contiguous range of keys: tiles are cut at
// the ranges' ends, so masked work stays below one tile width per row.
//
// Layout: see common.hpp. The multi-head overload takes rope::View tensors
// [tokens, heads, head_dim]; query head h reads key/value head h / (Hq / Hk).
// With options.keys_rotated, K is a cache of keys rotated when they were
// appended (what an inference engine stores): only Q is rotated. softmax_step
// appends new keys and values to such a cache and attends in one call.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <Eigen/Core>
#include <xsimd/xsimd.hpp>

#include "../detail/prefetch.hpp"
#include "../detail/simd.hpp"
#include "../view.hpp"
#include "common.hpp"

namespace rope::attention {

struct SoftmaxOptions {
  bool causal = false;
  std::optional<double> scale;  // empty: 1/sqrt(d)
  // Rows of the score tile on each side: query rows (a group's heads times
  // tokens) and keys per block. 256 x 256 scores of f32: 256 KiB.
  std::size_t block = 256;
  std::vector<std::int64_t> q_positions, k_positions;  // empty: q_offset + i, k_offset + j
  std::int64_t q_offset = 0, k_offset = 0;
  std::size_t window = 0;  // > 0: key j visible to query i only if pk_j > pq_i - window
  std::vector<std::int64_t> q_sequence, k_sequence;  // packed batches: visible only within a sequence
  bool keys_rotated = false;  // K already rotated (a KV cache): rotate Q only
  std::size_t threads = 1;    // over key/value heads, then over query blocks
};

namespace detail {

// The row-by-row tile of a few query rows (a decode step), with xsimd:
// scores[r] = q_r . key for `rows` query rows of d values (q contiguous,
// row r at q + r * d), and acc_r += weight_r * value for each row.
template <class T, class Arch = xsimd::default_arch>
void dot_rows(const T* q, std::size_t rows, std::size_t d, const T* key, T* scores, std::size_t score_stride) noexcept {
  using B = xsimd::batch<T, Arch>;
  constexpr std::size_t n = B::size;
  const std::size_t full = d - d % n;
  for (std::size_t r = 0; r < rows; ++r) {
    const T* qr = q + r * d;
    B sum(T(0));
    for (std::size_t c = 0; c < full; c += n) sum = xsimd::fma(B::load_unaligned(qr + c), B::load_unaligned(key + c), sum);
    T total = rope::detail::sum_lanes(sum);
    for (std::size_t c = full; c < d; ++c) total += qr[c] * key[c];
    scores[r * score_stride] = total;
  }
}

template <class T, class Arch = xsimd::default_arch>
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
      xsimd::fma(wb, B::load_unaligned(value + c), B::load_unaligned(ar + c)).store_unaligned(ar + c);
    }
    for (std::size_t c = full; c < dv; ++c) ar[c] += w * value[c];
  }
}

// acc_r += sum_j weights[r * weight_stride + j] * value_j for R rows and n
// values (value j at values + j * value_stride, dv channels; acc row r at
// acc + r * acc_stride): a block of weighted values in one pass, the
// accumulators of C column batches of all R rows held in registers while
// the values stream past, instead of loading and storing each row's
// accumulator for every value.
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
        for (std::size_t b = 0; b < C; ++b) a[r][b] = xsimd::fma(w, xb[b], a[r][b]);
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

// weighted_block for a number of rows known at run time (1 .. 8).
template <class T, class Arch = xsimd::default_arch>
void weighted_rows(const T* weights, std::size_t weight_stride, std::size_t rows, std::size_t n, const T* values,
                   std::size_t value_stride, std::size_t dv, T* acc, std::size_t acc_stride) noexcept {
  switch (rows) {
#define ROPE_WEIGHTED_ROWS(R) \
  case R:                      \
    return weighted_block<R, T, Arch>(weights, weight_stride, n, values, value_stride, dv, acc, acc_stride);
    ROPE_WEIGHTED_ROWS(1)
    ROPE_WEIGHTED_ROWS(2)
    ROPE_WEIGHTED_ROWS(3)
    ROPE_WEIGHTED_ROWS(4)
    ROPE_WEIGHTED_ROWS(5)
    ROPE_WEIGHTED_ROWS(6)
    ROPE_WEIGHTED_ROWS(7)
    ROPE_WEIGHTED_ROWS(8)
#undef ROPE_WEIGHTED_ROWS
    default:
      for (std::size_t j = 0; j < n; ++j) {
        axpy_rows<T, Arch>(weights + j, weight_stride, rows, values + j * value_stride, dv, acc, acc_stride);
      }
  }
}

template <class T>
struct SoftmaxPlan {
  std::size_t rotary_dim = 0;
  T scale = 1;
  Visibility visibility;
  bool sorted = true;
};

// Every argument of a softmax call; throws before anything is written.
template <class T>
SoftmaxPlan<T> check_softmax(const char* fn, std::size_t lq, std::size_t lk, std::size_t d,
                             const Rotation<T>& rotation, const SoftmaxOptions& o) {
  if (o.block == 0) fail(fn, "options.block", "at least 1", o.block);
  if (o.threads == 0) fail(fn, "options.threads", "at least 1", o.threads);
  double scale = 1.0 / std::sqrt(static_cast<double>(d));
  if (o.scale) {
    if (!std::isfinite(*o.scale)) fail(fn, "options.scale", "finite", *o.scale);
    scale = *o.scale;
  }
  check_size(fn, "options.q_positions", o.q_positions, lq);
  check_size(fn, "options.k_positions", o.k_positions, lk);
  check_size(fn, "options.q_sequence", o.q_sequence, lq);
  check_size(fn, "options.k_sequence", o.k_sequence, lk);
  check_sequences(fn, o.q_sequence, lq, o.k_sequence, lk);
  SoftmaxPlan<T> plan;
  plan.rotary_dim = rotary_width(fn, "rotation", rotation, d);
  plan.scale = static_cast<T>(scale);
  plan.visibility = visibility_of(o);
  plan.visibility.window = o.window;
  const Visibility& vis = plan.visibility;
  if (vis.q_ids == nullptr && o.q_offset > std::numeric_limits<std::int64_t>::max() - static_cast<std::int64_t>(lq)) {
    fail(fn, "options.q_offset", "small enough for every position to fit in int64", o.q_offset);
  }
  if (vis.k_ids == nullptr && o.k_offset > std::numeric_limits<std::int64_t>::max() - static_cast<std::int64_t>(lk)) {
    fail(fn, "options.k_offset", "small enough for every position to fit in int64", o.k_offset);
  }
  check_table_positions(fn, "options.q_positions", rotation.table, vis.q_ids, o.q_offset, lq);
  if (!o.keys_rotated) check_table_positions(fn, "options.k_positions", rotation.table, vis.k_ids, o.k_offset, lk);
  plan.sorted = vis.keys_sorted(lk);
  return plan;
}

// The running state of one key/value head's query rows in a tile.
template <class T>
struct HeadRows {
  Matrix<T> q;    // rows x d: the group's queries, rotated and scaled
  Matrix<T> acc;  // rows x dv
  Vector<T> row_max, row_sum;
};

// The buffers one thread reuses for every tile it computes (allocated once
// per call, before any thread starts).
template <class T>
struct SoftmaxWorkspace {
  std::vector<HeadRows<T>> heads;  // one per key/value head of the item
  Matrix<T> scores;                // rows x block (all heads' rows, row by row)
  std::vector<ConstRowsMap<T>> key_maps;
  Matrix<T> keys;                  // Lk x d: the rotated keys of one key/value head
  std::size_t keys_of_head = static_cast<std::size_t>(-1);
  Matrix<T> values;                // Lk x dv: the values of one key/value head, contiguous
  std::size_t values_of_head = static_cast<std::size_t>(-1);
  std::vector<std::size_t> lo, hi;  // each token's visible key range (sorted keys)
  std::vector<unsigned char> seen;  // per token: some key was visible
};

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
              const Rotation<T>& rotation, const SoftmaxOptions& o, const SoftmaxPlan<T>& plan,
              SoftmaxWorkspace<T>& ws)
      : q_(q), k_(k), v_(v), out_(out), rotation_(rotation), o_(o), plan_(plan), ws_(ws) {}

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
      head.row_max.setConstant(rows, -std::numeric_limits<T>::infinity());
      head.row_sum.setZero(rows);
    }
    ws_.seen.assign(tokens_, 0);
    const std::size_t lk = k_.tokens;
    thin_ = static_cast<std::size_t>(rows) <= kThinRows;
    const std::size_t bk = std::min(thin_ ? std::min(o_.block, kThinBlock) : o_.block, std::max<std::size_t>(lk, 1));
    if (!plan_.visibility.masks()) {
      sweep(0, lk, bk, false);
      std::fill(ws_.seen.begin(), ws_.seen.end(), lk > 0 ? 1 : 0);
    } else if (plan_.sorted) {
      // Keys every token of the tile sees (full) and the ragged ends.
      ws_.lo.resize(tokens_);
      ws_.hi.resize(tokens_);
      std::size_t min_lo = lk, max_lo = 0, min_hi = lk, max_hi = 0;
      for (std::size_t t = 0; t < tokens_; ++t) {
        plan_.visibility.range(t0_ + t, lk, ws_.lo[t], ws_.hi[t]);
        if (ws_.lo[t] >= ws_.hi[t]) continue;
        ws_.seen[t] = 1;
        min_lo = std::min(min_lo, ws_.lo[t]);
        max_lo = std::max(max_lo, ws_.lo[t]);
        min_hi = std::min(min_hi, ws_.hi[t]);
        max_hi = std::max(max_hi, ws_.hi[t]);
      }
      if (min_lo < max_hi) {
        const bool uniform = max_lo < min_hi && std::count(ws_.seen.begin(), ws_.seen.end(), 1) ==
                                                    static_cast<std::ptrdiff_t>(tokens_);
        if (uniform) {
          // The full range cut at multiples of kGranule keys: GEMMs of odd
          // widths are slow, and a few masked keys more cost less.
          const std::size_t full_lo = std::min(min_hi, (max_lo + kGranule - 1) / kGranule * kGranule);
          const std::size_t full_hi = std::max(full_lo, min_hi / kGranule * kGranule);
          sweep(min_lo, full_lo, bk, true);
          sweep(full_lo, full_hi, bk, false);
          sweep(full_hi, max_hi, bk, true);
        } else {
          sweep(min_lo, max_hi, bk, true);
        }
      }
    } else {
      for (std::size_t t = 0; t < tokens_; ++t) {
        for (std::size_t j = 0; j < lk && !ws_.seen[t]; ++j) ws_.seen[t] = plan_.visibility.visible(t0_ + t, j);
      }
      sweep(0, lk, bk, true);
    }
    for (std::size_t i = 0; i < g1 - g0; ++i) write_out(g0 + i, ws_.heads[i]);
  }

  // Whether K is read in place (not rotated into the workspace first).
  static bool keys_in_place(const Rotation<T>& rotation, const SoftmaxOptions& o, const SoftmaxPlan<T>& plan) {
    return rotation.table == nullptr || plan.rotary_dim == 0 || o.keys_rotated;
  }
  // Query rows per head up to which a tile is computed row by row rather
  // than by GEMM, and how many tokens ahead that pass prefetches.
  static constexpr std::size_t kThinRows = 8;
  static constexpr std::size_t kGranule = 64;
  static constexpr std::size_t kAhead = 2;
  static constexpr std::size_t kThinBlock = 64;

 private:
  // The group's queries of head g, rotated at their positions and scaled once.
  void load_queries(std::size_t g, HeadRows<T>& head) {
    const auto d = static_cast<Eigen::Index>(q_.head_dim);
    head.q.resize(static_cast<Eigen::Index>(tokens_ * group_), d);
    for (std::size_t t = 0; t < tokens_; ++t) {
      for (std::size_t h = 0; h < group_; ++h) {
        std::memcpy(head.q.row(static_cast<Eigen::Index>(t * group_ + h)).data(), q_.row(t0_ + t, g * group_ + h),
                    static_cast<std::size_t>(d) * sizeof(T));
      }
      if (rotation_.table != nullptr && plan_.rotary_dim > 0) {
        const auto m = static_cast<std::size_t>(plan_.visibility.q_position(t0_ + t));
        T* first = head.q.row(static_cast<Eigen::Index>(t * group_)).data();
        with_style(rotation_.style, [&](auto s) {
          rotate_heads<decltype(s)::value, T>(first, d, first, d, group_, rotation_.table->cos(m),
                                              rotation_.table->sin(m), plan_.rotary_dim);
        });
      }
    }
    head.q *= plan_.scale;  // one pass over Q instead of one over every score tile
  }

  // K of head g: rotated once into the workspace (an item of one head), or
  // read in place.
  ConstRowsMap<T> keys_of(std::size_t g, std::size_t j0, std::size_t n) {
    const std::size_t lk = k_.tokens;
    const auto d = static_cast<Eigen::Index>(k_.head_dim);
    if (keys_in_place(rotation_, o_, plan_)) {
      const Eigen::Index stride = lk > 1 ? static_cast<Eigen::Index>(k_.token_stride) : d;
      return ConstRowsMap<T>(k_.row(j0, g), static_cast<Eigen::Index>(n), d, Eigen::OuterStride<>(stride));
    }
    if (ws_.keys_of_head != g) {
      ws_.keys.resize(static_cast<Eigen::Index>(lk), d);
      with_style(rotation_.style, [&](auto s) {
        for (std::size_t j = 0; j < lk; ++j) {
          T* row = ws_.keys.row(static_cast<Eigen::Index>(j)).data();
          const T* src = k_.row(j, g);
          const auto m = static_cast<std::size_t>(plan_.visibility.k_position(j));
          rotate_heads<decltype(s)::value, T>(src, 0, row, 0, 1, rotation_.table->cos(m), rotation_.table->sin(m),
                                              plan_.rotary_dim);
          if (plan_.rotary_dim < static_cast<std::size_t>(d)) {
            std::memcpy(row + plan_.rotary_dim, src + plan_.rotary_dim,
                        (static_cast<std::size_t>(d) - plan_.rotary_dim) * sizeof(T));
          }
        }
      });
      ws_.keys_of_head = g;
    }
    return ConstRowsMap<T>(ws_.keys.row(static_cast<Eigen::Index>(j0)).data(), static_cast<Eigen::Index>(n), d,
                           Eigen::OuterStride<>(d));
  }

  // V of head g: in place for a decode step (read once), else copied once
  // per head into contiguous rows (every query block of the head reads it,
  // and packing strided rows for the GEMM costs more than one copy).
  ConstRowsMap<T> values_of(std::size_t g, std::size_t j0, std::size_t n) {
    const auto dv = static_cast<Eigen::Index>(v_.head_dim);
    if (thin_) {
      const std::size_t stride = k_.tokens > 1 ? v_.token_stride : v_.head_dim;
      return ConstRowsMap<T>(v_.row(j0, g), static_cast<Eigen::Index>(n), dv,
                             Eigen::OuterStride<>(static_cast<Eigen::Index>(stride)));
    }
    if (ws_.values_of_head != g) {
      ws_.values.resize(static_cast<Eigen::Index>(v_.tokens), dv);
      for (std::size_t j = 0; j < v_.tokens; ++j) {
        std::memcpy(ws_.values.row(static_cast<Eigen::Index>(j)).data(), v_.row(j, g), v_.head_dim * sizeof(T));
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

  bool visible(std::size_t t, std::size_t j) const noexcept {
    if (plan_.sorted) return j >= ws_.lo[t] && j < ws_.hi[t];
    return plan_.visibility.visible(t0_ + t, j);
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
  // the weighted values.
  void tile(std::size_t g, HeadRows<T>& head, std::size_t j0, std::size_t n, bool partial) {
    const ConstRowsMap<T> keys = keys_of(g, j0, n);
    const ConstRowsMap<T> values = values_of(g, j0, n);
    ws_.scores.noalias() = head.q * keys.transpose();
    Eigen::Ref<Matrix<T>> s(ws_.scores);
    update(head, s, j0, n, partial);
    if (!partial || values.allFinite()) {
      head.acc.noalias() += ws_.scores * values;
    } else {
      accumulate_visible(head, s, values, j0, n);
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
    ws_.scores.resize(static_cast<Eigen::Index>(heads) * rows, bn);
    for (Eigen::Index j = 0; j < bn; ++j) {
      prefetch_token(j0 + static_cast<std::size_t>(j) + kAhead, true);
      prefetch_token(j0 + static_cast<std::size_t>(j), false);
      for (std::size_t i = 0; i < heads; ++i) {
        dot_rows(ws_.heads[i].q.data(), static_cast<std::size_t>(rows), static_cast<std::size_t>(d),
                 ws_.key_maps[i].row(j).data(), &ws_.scores(static_cast<Eigen::Index>(i) * rows, j),
                 static_cast<std::size_t>(bn));
      }
    }
    for (std::size_t i = 0; i < heads; ++i) {
      Eigen::Ref<Matrix<T>> s(ws_.scores.middleRows(static_cast<Eigen::Index>(i) * rows, rows));
      update(ws_.heads[i], s, j0, n, partial);
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
      weighted_rows(&ws_.scores(static_cast<Eigen::Index>(i) * rows, 0), static_cast<std::size_t>(bn),
                    static_cast<std::size_t>(rows), n, v_.row(j0, g0_ + i), value_stride, v_.head_dim,
                    head.acc.data(), static_cast<std::size_t>(head.acc.cols()));
    }
  }

  // Masks the scores s of one head's rows, then the online softmax step:
  // new running max, exp(s - max) in place, the correction of what was
  // accumulated so far, the running sums. A row with nothing visible yet
  // keeps the shift 0, so that exp(-inf - 0) is 0 rather than NaN.
  void update(HeadRows<T>& head, Eigen::Ref<Matrix<T>> s, std::size_t j0, std::size_t n, bool partial) {
    const T neg_inf = -std::numeric_limits<T>::infinity();
    if (partial) mask(s, j0, n, neg_inf);
    for (Eigen::Index r = 0; r < s.rows(); ++r) {
      auto row = s.row(r);  // one row at a time, while it is in L1
      const T old_max = head.row_max[r];
      const T new_max = std::max(old_max, row.maxCoeff());
      const T shift = new_max == neg_inf ? T(0) : new_max;
      row = (row.array() - shift).exp().matrix();
      // A vectorised exp need not return exactly 0 for -inf (Eigen's double
      // exp clamps to ~5e-309): masked weights are set to 0 here.
      if (partial) mask_row(row, static_cast<std::size_t>(r) / group_, j0, n);
      const T correction = (old_max == neg_inf || new_max == neg_inf) ? T(old_max == neg_inf ? 0 : 1)
                                                                      : std::exp(old_max - new_max);
      if (new_max != neg_inf) head.row_max[r] = new_max;
      head.row_sum[r] = head.row_sum[r] * correction + row.sum();
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

  // Zeroes the weights of the keys token t does not see.
  template <class Row>
  void mask_row(Row& row, std::size_t t, std::size_t j0, std::size_t n) const {
    if (plan_.sorted) {
      // The token's visible range within [j0, j0 + n): zero what is outside.
      const std::size_t lo = std::clamp(ws_.lo[t], j0, j0 + n) - j0, hi = std::clamp(ws_.hi[t], j0, j0 + n) - j0;
      row.head(static_cast<Eigen::Index>(lo)).setZero();
      row.segment(static_cast<Eigen::Index>(std::max(lo, hi)), static_cast<Eigen::Index>(n - std::max(lo, hi))).setZero();
      return;
    }
    for (std::size_t j = 0; j < n; ++j) {
      if (!visible(t, j0 + j)) row[static_cast<Eigen::Index>(j)] = T(0);
    }
  }

  // Sets the entries of masked keys to `value`.
  void mask(Eigen::Ref<Matrix<T>> s, std::size_t j0, std::size_t n, T value) const {
    for (std::size_t t = 0; t < tokens_; ++t) {
      for (std::size_t j = 0; j < n; ++j) {
        if (!visible(t, j0 + j)) {
          s.block(static_cast<Eigen::Index>(t * group_), static_cast<Eigen::Index>(j),
                  static_cast<Eigen::Index>(group_), 1).setConstant(value);
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
    if (keys && !keys_in_place(rotation_, o_, plan_)) return;
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
  const SoftmaxOptions& o_;
  const SoftmaxPlan<T>& plan_;
  SoftmaxWorkspace<T>& ws_;
  std::size_t group_ = 1, g0_ = 0, t0_ = 0, tokens_ = 0;
  bool thin_ = false;
};

// Every head and query block of checked views. Work items are (range of
// key/value heads, block of query tokens), split across threads. An item
// holds one key/value head, except when K is read in place and a head's
// tile has few rows (decoding): then the heads are split into one range per
// thread, so that each thread reads its part of every cached token at once.
template <class T>
void softmax_heads(const View<const T>& q, const View<const T>& k, const View<const T>& v, const View<T>& out,
                   const Rotation<T>& rotation, const SoftmaxOptions& o, const SoftmaxPlan<T>& plan) {
  if (q.tokens == 0 || q.heads == 0) return;
  const std::size_t group = q.heads / k.heads;
  const std::size_t tokens_per_block = std::max<std::size_t>(1, std::min(o.block, q.tokens * group) / group);
  const std::size_t blocks = (q.tokens + tokens_per_block - 1) / tokens_per_block;
  const bool together = SoftmaxTile<T>::keys_in_place(rotation, o, plan) &&
                        std::min(tokens_per_block, q.tokens) * group <= SoftmaxTile<T>::kThinRows;
  const std::size_t ranges = together ? std::min(k.heads, o.threads) : k.heads;
  const std::size_t items = ranges * blocks;
  const std::size_t workers = std::max<std::size_t>(1, std::min(o.threads, items));
  std::vector<SoftmaxWorkspace<T>> workspaces(workers);
  parallel_for(items, workers, [&](std::size_t item, std::size_t w) {
    const std::size_t range = item / blocks, b = item % blocks;
    const std::size_t g0 = k.heads * range / ranges, g1 = k.heads * (range + 1) / ranges;
    const std::size_t t0 = b * tokens_per_block;
    SoftmaxTile<T>(q, k, v, out, rotation, o, plan, workspaces[w]).run(g0, g1, t0, std::min(q.tokens, t0 + tokens_per_block));
  });
}

}  // namespace detail

// One batch x head: q (Lq x d), k (Lk x d), v (Lk x dv) -> Lq x dv.
template <class DQ, class DK, class DV>
Matrix<typename DQ::Scalar> softmax(const Eigen::MatrixBase<DQ>& q, const Eigen::MatrixBase<DK>& k,
                                    const Eigen::MatrixBase<DV>& v, const Rotation<typename DQ::Scalar>& rotation = {},
                                    const SoftmaxOptions& options = {}) {
  using T = typename DQ::Scalar;
  detail::check_scalar<T>();
  detail::check_same_scalar<DQ, DK>();
  detail::check_same_scalar<DQ, DV>();
  const char* fn = "rope::attention::softmax";
  const ConstRef<T> qr(q.derived()), kr(k.derived()), vr(v.derived());
  if (kr.cols() != qr.cols()) detail::fail(fn, "k.cols() (the head dimension)", "q.cols() = " + detail::to_text(qr.cols()), kr.cols());
  if (qr.cols() == 0) detail::fail(fn, "q.cols() (the head dimension)", "at least 1", qr.cols());
  if (vr.rows() != kr.rows()) detail::fail(fn, "v.rows()", "k.rows() = " + detail::to_text(kr.rows()), vr.rows());
  const auto plan = detail::check_softmax<T>(fn, static_cast<std::size_t>(qr.rows()), static_cast<std::size_t>(kr.rows()),
                                             static_cast<std::size_t>(qr.cols()), rotation, options);
  Matrix<T> out(qr.rows(), vr.cols());
  if (out.size() == 0) return out;
  const View<T> out_view = detail::matrix_view<T>(out.data(), out.rows(), out.cols(), out.cols());
  if (kr.rows() == 0 || vr.cols() == 0) {
    out.setZero();
    return out;
  }
  detail::softmax_heads<T>(detail::matrix_view(qr), detail::matrix_view(kr), detail::matrix_view(vr), out_view,
                           rotation, options, plan);
  return out;
}

// Every head of [tokens, heads, head_dim] tensors: q [Lq, Hq, d], k [Lk, Hk, d],
// v [Lk, Hk, dv], out [Lq, Hq, dv]; Hq a multiple of Hk. Everything is checked
// before out is written; out must share no element with q, k or v.
template <class T>
void softmax(rope::detail::type_identity_t<View<const T>> q, rope::detail::type_identity_t<View<const T>> k,
             rope::detail::type_identity_t<View<const T>> v, View<T> out, const Rotation<T>& rotation = {},
             const SoftmaxOptions& options = {}) {
  detail::check_scalar<T>();
  const char* fn = "rope::attention::softmax";
  detail::check_heads(fn, q, k, v, out);
  const auto plan = detail::check_softmax<T>(fn, q.tokens, k.tokens, q.head_dim, rotation, options);
  if (k.tokens == 0) {
    for (std::size_t t = 0; t < out.tokens; ++t) {
      for (std::size_t h = 0; h < out.heads; ++h) std::fill_n(out.row(t, h), out.head_dim, T(0));
    }
    return;
  }
  detail::softmax_heads<T>(q, k, v, out, rotation, options, plan);
}

// A KV cache of rotated keys and their values, [capacity, kv_heads, head_dim]
// each, of which the first `length` tokens are filled (positions
// 0 .. length-1 unless the options say otherwise).
template <class T>
struct KvCache {
  View<T> k, v;
  std::size_t length = 0;
};

// One step of prefill or decode: rotates q and k_new by their tokens'
// positions, writes the rotated k_new and v_new into the cache at tokens
// [length, length + n), then attends q over the cache's length + n keys and
// advances cache.length. K is rotated once, where the cache keeps it; no key
// is ever re-rotated (options.keys_rotated is implied). Set options.causal
// for a decoder (a one-token step sees the whole cache either way).
// Positions: cache token j sits at options.k_offset + j, so the new tokens
// are at k_offset + length + t, unless options.q_positions gives the new
// tokens' positions (their keys take the same ones) or options.k_positions
// gives all length + n keys' positions; options.q_offset is not used.
template <class T>
void softmax_step(rope::detail::type_identity_t<View<const T>> q, rope::detail::type_identity_t<View<const T>> k_new,
                  rope::detail::type_identity_t<View<const T>> v_new, KvCache<T>& cache, View<T> out,
                  const Rotation<T>& rotation, SoftmaxOptions options) {
  detail::check_scalar<T>();
  const char* fn = "rope::attention::softmax_step";
  using rope::detail::check_disjoint;
  using rope::detail::check_view;
  using detail::fail;
  using detail::to_text;
  check_view(fn, "cache.k", cache.k);
  check_view(fn, "cache.v", cache.v);
  check_view(fn, "k_new", k_new);
  check_view(fn, "v_new", v_new);
  const std::size_t n = k_new.tokens;
  if (cache.length > cache.k.tokens) fail(fn, "cache.length", "<= cache.k.tokens = " + to_text(cache.k.tokens), cache.length);
  if (cache.v.tokens != cache.k.tokens) fail(fn, "cache.v.tokens", "cache.k.tokens = " + to_text(cache.k.tokens), cache.v.tokens);
  if (n > cache.k.tokens - cache.length) {
    fail(fn, "k_new.tokens", "<= the cache's free tokens " + to_text(cache.k.tokens - cache.length), n);
  }
  if (q.tokens != n) fail(fn, "q.tokens", "k_new.tokens = " + to_text(n), q.tokens);
  if (v_new.tokens != n) fail(fn, "v_new.tokens", "k_new.tokens = " + to_text(n), v_new.tokens);
  if (k_new.heads != cache.k.heads) fail(fn, "k_new.heads", "cache.k.heads = " + to_text(cache.k.heads), k_new.heads);
  if (v_new.heads != cache.v.heads) fail(fn, "v_new.heads", "cache.v.heads = " + to_text(cache.v.heads), v_new.heads);
  if (k_new.head_dim != cache.k.head_dim) {
    fail(fn, "k_new.head_dim", "cache.k.head_dim = " + to_text(cache.k.head_dim), k_new.head_dim);
  }
  if (v_new.head_dim != cache.v.head_dim) {
    fail(fn, "v_new.head_dim", "cache.v.head_dim = " + to_text(cache.v.head_dim), v_new.head_dim);
  }
  const std::size_t total = cache.length + n;
  const View<const T> keys = cache.k.slice_tokens(0, total), values = cache.v.slice_tokens(0, total);
  const View<T> k_slot = cache.k.slice_tokens(cache.length, n), v_slot = cache.v.slice_tokens(cache.length, n);
  detail::check_heads(fn, q, keys, values, out);
  check_disjoint(fn, "cache.k", cache.k, "cache.v", cache.v);
  check_disjoint(fn, "cache.k", cache.k, "k_new", k_new);
  check_disjoint(fn, "cache.k", cache.k, "v_new", v_new);
  check_disjoint(fn, "cache.k", cache.k, "q", q);
  check_disjoint(fn, "cache.v", cache.v, "k_new", k_new);
  check_disjoint(fn, "cache.v", cache.v, "v_new", v_new);
  check_disjoint(fn, "cache.v", cache.v, "q", q);
  check_disjoint(fn, "out", out, "k_new", k_new);
  check_disjoint(fn, "out", out, "v_new", v_new);
  // Contiguous positions (nothing given) need no vector: the common decode step.
  const bool contiguous = options.q_positions.empty() && options.k_positions.empty();
  if (options.q_positions.empty()) {
    if (options.k_offset > std::numeric_limits<std::int64_t>::max() - static_cast<std::int64_t>(total)) {
      fail(fn, "options.k_offset + cache.length + k_new.tokens", "small enough for positions to fit in int64",
           options.k_offset);
    }
    options.q_offset = options.k_offset + static_cast<std::int64_t>(cache.length);
  }
  options.keys_rotated = true;
  const auto plan = detail::check_softmax<T>(fn, n, total, q.head_dim, rotation, options);
  // The new keys' positions: their queries' own unless k_positions says.
  std::vector<std::int64_t> new_positions(n);
  for (std::size_t t = 0; t < n; ++t) {
    new_positions[t] = options.k_positions.empty() ? plan.visibility.q_position(t) : options.k_positions[cache.length + t];
  }
  detail::check_table_positions(fn, "the new keys' positions", rotation.table, new_positions.data(), 0, n);
  detail::SoftmaxPlan<T> attend = plan;
  if (!contiguous && options.k_positions.empty()) {
    // Cached keys at k_offset + j, the new ones where their queries are.
    options.k_positions.resize(total);
    for (std::size_t j = 0; j < cache.length; ++j) {
      options.k_positions[j] = options.k_offset + static_cast<std::int64_t>(j);
    }
    std::copy(new_positions.begin(), new_positions.end(), options.k_positions.begin() + cache.length);
    attend.visibility.k_ids = options.k_positions.data();
    attend.sorted = attend.visibility.keys_sorted(total);
  }
  // Write the new keys, rotated, and values into their slots: the only
  // writes before the attention itself, after every check.
  for (std::size_t t = 0; t < n; ++t) {
    for (std::size_t h = 0; h < k_new.heads; ++h) {
      std::memcpy(k_slot.row(t, h), k_new.row(t, h), k_new.head_dim * sizeof(T));
      std::memcpy(v_slot.row(t, h), v_new.row(t, h), v_new.head_dim * sizeof(T));
    }
    if (rotation.table != nullptr && plan.rotary_dim > 0) {
      const auto m = static_cast<std::size_t>(new_positions[t]);
      with_style(rotation.style, [&](auto s) {
        rotate_heads<decltype(s)::value, T>(k_slot.row(t, 0), static_cast<std::ptrdiff_t>(k_slot.head_stride),
                                            k_slot.row(t, 0), static_cast<std::ptrdiff_t>(k_slot.head_stride),
                                            k_slot.heads, rotation.table->cos(m), rotation.table->sin(m),
                                            plan.rotary_dim);
      });
    }
  }
  detail::softmax_heads<T>(q, keys, values, out, rotation, options, attend);
  cache.length = total;
}

}  // namespace rope::attention
