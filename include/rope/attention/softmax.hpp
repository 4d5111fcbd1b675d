// rope/attention/softmax.hpp — softmax attention with RoPE on Q and K over
// whole tensors, with positions, masks and sequence ids as the caller gives
// them: one head's matrices, or multi-head views. (A server's step over a
// paged KV cache is plan.hpp, append.hpp and attend.hpp.)
//
//   S_ij = (R_pq_i q_i) . (R_pk_j k_j) * scale,  out_i = sum_j softmax_j(S_i) v_j
//
// over the keys j visible to query i (masks.hpp: options.mask, causal by
// default, and its sliding window; sequence ids; by position). The logits
// in the order of logits.hpp: options.logits.scale (default 1/sqrt(d);
// YaRN / DeepSeek checkpoints set their own), the softcap before the mask,
// query head h's sink in the denominator only. A query that sees no key
// gets a zero row (with a sink too: its numerator is empty); a query whose
// visible scores or values hold a NaN gets NaN. A masked key is left out of
// the sums, never multiplied by zero: a NaN or Inf in a key or value row
// reaches only the outputs of the queries that see it.
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
// With options.keys_rotated, K holds keys rotated when they were stored
// (what an inference engine caches): only Q is rotated.
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

#include "../view.hpp"
#include "common.hpp"
#include "softmax_tile.hpp"

namespace rope::attention {

namespace detail {

// Every head and query block of checked views. Work items are (range of
// key/value heads, block of query tokens), split across threads. An item
// holds one key/value head, except when K is read in place and a head's
// tile has few rows (decoding): then the heads are split into one range per
// thread, so that each thread reads its part of every cached token at once.
template <class T>
void softmax_heads(const View<const T>& q, const View<const T>& k, const View<const T>& v, const View<T>& out,
                   const Rotation<T>& rotation, const SoftmaxParams<T>& params) {
  if (q.tokens == 0 || q.heads == 0) return;
  const std::size_t group = q.heads / k.heads;
  const std::size_t tokens_per_block = std::max<std::size_t>(1, std::min(params.block, q.tokens * group) / group);
  const std::size_t blocks = (q.tokens + tokens_per_block - 1) / tokens_per_block;
  const bool together = SoftmaxTile<T>::keys_in_place(rotation, params) &&
                        std::min(tokens_per_block, q.tokens) * group <= SoftmaxTile<T>::kThinRows;
  const std::size_t ranges = together ? std::min(k.heads, params.threads) : k.heads;
  const std::size_t items = ranges * blocks;
  const std::size_t workers = std::max<std::size_t>(1, std::min(params.threads, items));
  std::vector<SoftmaxWorkspace<T>> workspaces(workers);
  parallel_for(items, workers, params.executor, [&](std::size_t item, std::size_t w) {
    const std::size_t range = item / blocks, b = item % blocks;
    const std::size_t g0 = k.heads * range / ranges, g1 = k.heads * (range + 1) / ranges;
    const std::size_t t0 = b * tokens_per_block;
    SoftmaxTile<T>(q, k, v, out, rotation, params, workspaces[w])
        .run(g0, g1, t0, std::min(q.tokens, t0 + tokens_per_block));
  });
}

}  // namespace detail

// SoftmaxOptions: call_options.hpp.

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
  if (kr.cols() != qr.cols()) detail::fail(fn, "k.cols() (the head dimension)", {"q.cols() = ", qr.cols()}, kr.cols());
  if (qr.cols() == 0) detail::fail(fn, "q.cols() (the head dimension)", "at least 1", qr.cols());
  if (vr.rows() != kr.rows()) detail::fail(fn, "v.rows()", {"k.rows() = ", kr.rows()}, vr.rows());
  const auto params =
      detail::check_softmax<T>(fn, static_cast<std::size_t>(qr.rows()), static_cast<std::size_t>(kr.rows()),
                               static_cast<std::size_t>(qr.cols()), 1, rotation, options);
  Matrix<T> out(qr.rows(), vr.cols());
  if (out.size() == 0) return out;
  const View<T> out_view = detail::matrix_view<T>(out.data(), out.rows(), out.cols(), out.cols());
  if (kr.rows() == 0 || vr.cols() == 0) {
    out.setZero();
    return out;
  }
  detail::softmax_heads<T>(detail::matrix_view(qr), detail::matrix_view(kr), detail::matrix_view(vr), out_view,
                           rotation, params);
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
  const auto params = detail::check_softmax<T>(fn, q.tokens, k.tokens, q.head_dim, q.heads, rotation, options);
  if (k.tokens == 0) {
    for (std::size_t t = 0; t < out.tokens; ++t) {
      for (std::size_t h = 0; h < out.heads; ++h) std::fill_n(out.row(t, h), out.head_dim, T(0));
    }
    return;
  }
  detail::softmax_heads<T>(q, k, v, out, rotation, params);
}

}  // namespace rope::attention
