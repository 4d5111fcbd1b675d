// rope/attention/softmax.hpp — softmax attention with RoPE on Q and K.
//
//   S_ij = (R_pq_i q_i) . (R_pk_j k_j) * scale,  out_i = sum_j softmax_j(S_i) v_j
//
// scale defaults to 1/sqrt(d); YaRN / DeepSeek checkpoints set their own.
// Causal: key j is visible to query i only when pk_j <= pq_i (default
// positions and Lq = Lk: the inclusive mask j <= i). A query that sees no key
// gets a zero row. Evaluated blockwise with a running max and running sum
// (online softmax): block x block scores at a time, each block product one
// Eigen GEMM; memory O(block^2 + L d), never an Lq x Lk matrix.
//
// Layout: see common.hpp (one token per row). The multi-head overload takes
// rope::View tensors [tokens, heads, head_dim]; grouped-query heads: query
// head h reads key/value head h / (Hq / Hk).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <Eigen/Core>

#include "../view.hpp"
#include "common.hpp"

namespace rope::attention {

struct SoftmaxOptions {
  bool causal = false;
  std::optional<double> scale;  // empty: 1/sqrt(d)
  std::size_t block = 256;      // rows of Q and of K per block (block^2 scores: 256 KiB of f32)
  std::vector<std::int64_t> q_positions, k_positions;  // empty: 0 .. L-1
};

namespace detail {

template <class T>
struct SoftmaxPlan {
  std::size_t rotary_dim;
  T scale;
};

template <class T>
SoftmaxPlan<T> check_softmax(const char* fn, std::ptrdiff_t lq, std::ptrdiff_t dq, std::ptrdiff_t lk,
                             std::ptrdiff_t dk, std::ptrdiff_t lv, const Rotation<T>& rope, const SoftmaxOptions& o) {
  if (dq != dk) fail(fn, "q has head dimension " + std::to_string(dq) + " but k has " + std::to_string(dk));
  if (dq == 0) fail(fn, "head dimension is 0");
  if (lv != lk) fail(fn, "v has " + std::to_string(lv) + " rows but k has " + std::to_string(lk));
  if (o.block == 0) fail(fn, "options.block must be at least 1, got 0");
  double scale = 1.0 / std::sqrt(static_cast<double>(dq));
  if (o.scale) {
    if (!std::isfinite(*o.scale)) fail(fn, "options.scale must be finite, got " + std::to_string(*o.scale));
    scale = *o.scale;
  }
  check_positions_size(fn, "options.q_positions", o.q_positions, static_cast<std::size_t>(lq));
  check_positions_size(fn, "options.k_positions", o.k_positions, static_cast<std::size_t>(lk));
  const std::size_t r = rotary_width(fn, rope, static_cast<std::size_t>(dq));
  check_table_positions(fn, "options.q_positions", rope, o.q_positions, static_cast<std::size_t>(lq));
  check_table_positions(fn, "options.k_positions", rope, o.k_positions, static_cast<std::size_t>(lk));
  return {r, static_cast<T>(scale)};
}

// One head, arguments already checked; writes out (Lq x dv).
template <class T, class Out>
void softmax_head(const ConstRef<T>& q, const ConstRef<T>& k, const ConstRef<T>& v, const Rotation<T>& rope,
                  const SoftmaxOptions& o, const SoftmaxPlan<T>& plan, Out&& out) {
  const Eigen::Index lq = q.rows(), lk = k.rows(), dv = v.cols();
  Matrix<T> qr = q;
  Matrix<T> kr = k;
  rotate_matrix(qr, rope, plan.rotary_dim, o.q_positions);
  rotate_matrix(kr, rope, plan.rotary_dim, o.k_positions);
  qr *= plan.scale;  // one pass over Q instead of one over every score block

  const auto b = static_cast<Eigen::Index>(o.block);
  const T neg_inf = -std::numeric_limits<T>::infinity();
  Matrix<T> scores(std::min(b, lq), std::min(b, lk));
  Matrix<T> acc;
  Vector<T> row_max, row_sum, correction, shift;
  std::vector<Eigen::Index> visible(static_cast<std::size_t>(std::min(b, lq)));
  for (Eigen::Index i0 = 0; i0 < lq; i0 += b) {
    const Eigen::Index bq = std::min(b, lq - i0);
    acc.setZero(bq, dv);
    row_max.setConstant(bq, neg_inf);
    row_sum.setZero(bq);
    std::int64_t q_lo = 0, q_hi = 0;
    if (o.causal) {
      q_lo = std::numeric_limits<std::int64_t>::max();
      q_hi = std::numeric_limits<std::int64_t>::min();
      for (Eigen::Index i = i0; i < i0 + bq; ++i) {
        const std::int64_t p = position_at(o.q_positions, static_cast<std::size_t>(i));
        q_lo = std::min(q_lo, p);
        q_hi = std::max(q_hi, p);
      }
    }
    for (Eigen::Index j0 = 0; j0 < lk; j0 += b) {
      const Eigen::Index bk = std::min(b, lk - j0);
      bool partial = false;  // some pair of the block is masked
      bool sorted = true;    // key positions nondecreasing: each row sees a prefix
      if (o.causal) {
        std::int64_t k_lo = std::numeric_limits<std::int64_t>::max();
        std::int64_t k_hi = std::numeric_limits<std::int64_t>::min();
        for (Eigen::Index j = j0; j < j0 + bk; ++j) {
          const std::int64_t p = position_at(o.k_positions, static_cast<std::size_t>(j));
          sorted = sorted && p >= k_hi;
          k_lo = std::min(k_lo, p);
          k_hi = std::max(k_hi, p);
        }
        if (k_lo > q_hi) continue;  // every key of the block is in every query's future
        partial = k_hi > q_lo;
      }
      auto s = scores.topLeftCorner(bq, bk);
      s.noalias() = qr.middleRows(i0, bq) * kr.middleRows(j0, bk).transpose();
      if (partial) {
        for (Eigen::Index i = 0; i < bq; ++i) {
          const std::int64_t pq = position_at(o.q_positions, static_cast<std::size_t>(i0 + i));
          if (sorted) {
            Eigen::Index seen = 0;
            while (seen < bk && position_at(o.k_positions, static_cast<std::size_t>(j0 + seen)) <= pq) ++seen;
            visible[static_cast<std::size_t>(i)] = seen;
            s.row(i).tail(bk - seen).setConstant(neg_inf);
            continue;
          }
          for (Eigen::Index j = 0; j < bk; ++j) {
            if (position_at(o.k_positions, static_cast<std::size_t>(j0 + j)) > pq) s(i, j) = neg_inf;
          }
        }
      }
      // New running max; a row with nothing visible yet keeps shift 0 so that
      // exp(-inf - shift) is 0 rather than NaN.
      shift = row_max.cwiseMax(s.rowwise().maxCoeff());
      correction.resize(bq);
      for (Eigen::Index i = 0; i < bq; ++i) {
        if (shift[i] == neg_inf) {
          shift[i] = 0;
          correction[i] = 1;
        } else {
          correction[i] = row_max[i] == neg_inf ? T(0) : std::exp(row_max[i] - shift[i]);
          row_max[i] = shift[i];
        }
      }
      shift_rows(s, shift, true);
      if (partial) {
        // A vectorised exp need not return exactly 0 for -inf (Eigen's
        // double exp clamps to ~5e-309): masked weights are set to 0 here.
        for (Eigen::Index i = 0; i < bq; ++i) {
          if (sorted) {
            s.row(i).tail(bk - visible[static_cast<std::size_t>(i)]).setZero();
            continue;
          }
          const std::int64_t pq = position_at(o.q_positions, static_cast<std::size_t>(i0 + i));
          for (Eigen::Index j = 0; j < bk; ++j) {
            if (position_at(o.k_positions, static_cast<std::size_t>(j0 + j)) > pq) s(i, j) = 0;
          }
        }
      }
      row_sum = row_sum.cwiseProduct(correction) + s.rowwise().sum();
      acc = correction.asDiagonal() * acc;
      acc.noalias() += s * v.middleRows(j0, bk);
    }
    for (Eigen::Index i = 0; i < bq; ++i) {
      if (row_sum[i] > 0) {
        out.row(i0 + i) = acc.row(i) / row_sum[i];
      } else {
        out.row(i0 + i).setZero();
      }
    }
  }
}

}  // namespace detail

// One batch x head: q (Lq x d), k (Lk x d), v (Lk x dv) -> Lq x dv.
template <class DQ, class DK, class DV>
Matrix<typename DQ::Scalar> softmax(const Eigen::MatrixBase<DQ>& q, const Eigen::MatrixBase<DK>& k,
                                    const Eigen::MatrixBase<DV>& v, const Rotation<typename DQ::Scalar>& rope = {},
                                    const SoftmaxOptions& options = {}) {
  using T = typename DQ::Scalar;
  detail::check_scalar<T>();
  detail::check_same_scalar<DQ, DK>();
  detail::check_same_scalar<DQ, DV>();
  const ConstRef<T> qr(q.derived()), kr(k.derived()), vr(v.derived());
  const auto plan = detail::check_softmax<T>("rope::attention::softmax", qr.rows(), qr.cols(), kr.rows(),
                                             kr.cols(), vr.rows(), rope, options);
  Matrix<T> out(qr.rows(), vr.cols());
  detail::softmax_head<T>(qr, kr, vr, rope, options, plan, out);
  return out;
}

// Every head of [tokens, heads, head_dim] tensors: q [Lq, Hq, d], k [Lk, Hk, d],
// v [Lk, Hk, dv], out [Lq, Hq, dv]; Hq a multiple of Hk. Everything is checked
// before out is written; out must not overlap q, k or v (heads are written
// one after another).
template <class T>
void softmax(rope::detail::type_identity_t<View<const T>> q, rope::detail::type_identity_t<View<const T>> k,
             rope::detail::type_identity_t<View<const T>> v, View<T> out, const Rotation<T>& rope = {},
             const SoftmaxOptions& options = {}) {
  detail::check_scalar<T>();
  const char* fn = "rope::attention::softmax";
  const View<const T>* views[] = {&q, &k, &v};
  const char* names[] = {"q", "k", "v"};
  for (int i = 0; i < 3; ++i) {
    if (views[i]->data == nullptr) detail::fail(fn, std::string(names[i]) + ".data is null");
  }
  if (out.data == nullptr) detail::fail(fn, "out.data is null");
  if (k.heads == 0 || q.heads % k.heads != 0) {
    detail::fail(fn, "q.heads " + std::to_string(q.heads) + " is not a multiple of k.heads " +
                         std::to_string(k.heads));
  }
  if (v.heads != k.heads) {
    detail::fail(fn, "v.heads " + std::to_string(v.heads) + " differs from k.heads " + std::to_string(k.heads));
  }
  if (v.tokens != k.tokens) {
    detail::fail(fn, "v.tokens " + std::to_string(v.tokens) + " differs from k.tokens " + std::to_string(k.tokens));
  }
  if (out.tokens != q.tokens || out.heads != q.heads || out.head_dim != v.head_dim) {
    detail::fail(fn, "out is [" + std::to_string(out.tokens) + ", " + std::to_string(out.heads) + ", " +
                         std::to_string(out.head_dim) + "], expected [" + std::to_string(q.tokens) + ", " +
                         std::to_string(q.heads) + ", " + std::to_string(v.head_dim) + "]");
  }
  for (int i = 0; i < 3; ++i) {
    if (views[i]->tokens > 1 && views[i]->token_stride < views[i]->head_dim) {
      detail::fail(fn, std::string(names[i]) + ".token_stride " + std::to_string(views[i]->token_stride) +
                           " is below its head_dim " + std::to_string(views[i]->head_dim));
    }
  }
  if (out.tokens > 1 && out.token_stride < out.head_dim) {
    detail::fail(fn, "out.token_stride " + std::to_string(out.token_stride) + " is below its head_dim " +
                         std::to_string(out.head_dim));
  }
  using Map = Eigen::Map<const Matrix<T>, 0, Eigen::OuterStride<>>;
  using MutMap = Eigen::Map<Matrix<T>, 0, Eigen::OuterStride<>>;
  const auto rows = [](std::size_t n) { return static_cast<Eigen::Index>(n); };
  const auto stride = [](std::size_t s, std::size_t d) { return Eigen::OuterStride<>(static_cast<Eigen::Index>(s == 0 ? d : s)); };
  const auto plan = detail::check_softmax<T>(fn, rows(q.tokens), rows(q.head_dim), rows(k.tokens),
                                             rows(k.head_dim), rows(v.tokens), rope, options);
  const std::size_t group = q.heads / k.heads;
  Matrix<T> head_out(rows(q.tokens), rows(v.head_dim));
  for (std::size_t h = 0; h < q.heads; ++h) {
    const std::size_t kv = h / group;
    const ConstRef<T> qh(Map(q.data + h * q.head_stride, rows(q.tokens), rows(q.head_dim),
                             stride(q.token_stride, q.head_dim)));
    const ConstRef<T> kh(Map(k.data + kv * k.head_stride, rows(k.tokens), rows(k.head_dim),
                             stride(k.token_stride, k.head_dim)));
    const ConstRef<T> vh(Map(v.data + kv * v.head_stride, rows(v.tokens), rows(v.head_dim),
                             stride(v.token_stride, v.head_dim)));
    detail::softmax_head<T>(qh, kh, vh, rope, options, plan, head_out);
    MutMap(out.data + h * out.head_stride, rows(out.tokens), rows(out.head_dim), stride(out.token_stride, out.head_dim)) =
        head_out;
  }
}

}  // namespace rope::attention
