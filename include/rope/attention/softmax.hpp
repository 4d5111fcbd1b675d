// rope/attention/softmax.hpp — softmax attention with RoPE on Q and K, for
// prefill and for decoding against a KV cache.
//
//   S_ij = (R_pq_i q_i) . (R_pk_j k_j) * scale,  out_i = sum_j softmax_j(S_i) v_j
//
// over the keys j visible to query i (common.hpp: causal, sliding window,
// sequence ids, by position). scale defaults to 1/sqrt(d); YaRN / DeepSeek
// checkpoints set their own. With options.softcap, S_ij <- cap * tanh(S_ij /
// cap) before the mask; with options.sinks, query head h's sink joins the
// denominator only: out_i = sum_j exp(S_ij - M) v_j / (exp(sink_h - M) +
// sum_j exp(S_ij - M)), M the max of the sink and the visible scores (the
// order: options.hpp). A query that sees no key gets a zero row (with a sink
// too: its numerator is empty); a
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

#include "../view.hpp"
#include "append.hpp"
#include "common.hpp"
#include "options.hpp"
#include "softmax_tile.hpp"

namespace rope::attention {

// SoftmaxOptions: options.hpp.

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
  const auto plan =
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
                           rotation, plan);
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
  const auto plan = detail::check_softmax<T>(fn, q.tokens, k.tokens, q.head_dim, q.heads, rotation, options);
  if (k.tokens == 0) {
    for (std::size_t t = 0; t < out.tokens; ++t) {
      for (std::size_t h = 0; h < out.heads; ++h) std::fill_n(out.row(t, h), out.head_dim, T(0));
    }
    return;
  }
  detail::softmax_heads<T>(q, k, v, out, rotation, plan);
}

// A KV cache of rotated keys and their values, [capacity, kv_heads, head_dim]
// each, of which the first `length` tokens are filled (positions
// 0 .. length-1 unless the options say otherwise).
template <class T>
struct KvCache {
  View<T> k, v;
  std::size_t length = 0;
};

namespace detail {

// softmax_step's views: each valid, shapes that fit the cache, room for the
// new tokens, and no view that overlaps one the step writes.
template <class T>
void check_step_views(const char* fn, const View<const T>& q, const View<const T>& k_new, const View<const T>& v_new,
                      const KvCache<T>& cache, const View<T>& out) {
  using rope::detail::check_disjoint;
  using rope::detail::check_view;
  check_view(fn, "cache.k", cache.k);
  check_view(fn, "cache.v", cache.v);
  check_view(fn, "k_new", k_new);
  check_view(fn, "v_new", v_new);
  const std::size_t n = k_new.tokens;
  if (cache.length > cache.k.tokens) fail(fn, "cache.length", {"<= cache.k.tokens = ", cache.k.tokens}, cache.length);
  if (cache.v.tokens != cache.k.tokens)
    fail(fn, "cache.v.tokens", {"cache.k.tokens = ", cache.k.tokens}, cache.v.tokens);
  if (n > cache.k.tokens - cache.length) {
    fail(fn, "k_new.tokens", {"<= the cache's free tokens ", cache.k.tokens - cache.length}, n);
  }
  if (q.tokens != n) fail(fn, "q.tokens", {"k_new.tokens = ", n}, q.tokens);
  if (v_new.tokens != n) fail(fn, "v_new.tokens", {"k_new.tokens = ", n}, v_new.tokens);
  if (k_new.heads != cache.k.heads) fail(fn, "k_new.heads", {"cache.k.heads = ", cache.k.heads}, k_new.heads);
  if (v_new.heads != cache.v.heads) fail(fn, "v_new.heads", {"cache.v.heads = ", cache.v.heads}, v_new.heads);
  if (k_new.head_dim != cache.k.head_dim) {
    fail(fn, "k_new.head_dim", {"cache.k.head_dim = ", cache.k.head_dim}, k_new.head_dim);
  }
  if (v_new.head_dim != cache.v.head_dim) {
    fail(fn, "v_new.head_dim", {"cache.v.head_dim = ", cache.v.head_dim}, v_new.head_dim);
  }
  const std::size_t total = cache.length + n;
  check_heads(fn, q, View<const T>(cache.k.slice_tokens(0, total)), View<const T>(cache.v.slice_tokens(0, total)), out,
              "cache.k", "cache.v");
  check_disjoint(fn, "cache.k", cache.k, "cache.v", cache.v);
  const char* const names[3] = {"q", "k_new", "v_new"};
  const View<const T>* inputs[3] = {&q, &k_new, &v_new};
  for (std::size_t i = 0; i < 3; ++i) {
    check_disjoint(fn, "cache.k", cache.k, names[i], *inputs[i]);
    check_disjoint(fn, "cache.v", cache.v, names[i], *inputs[i]);
  }
  check_disjoint(fn, "out", out, "k_new", k_new);
  check_disjoint(fn, "out", out, "v_new", v_new);
}

// What a step attends with, derived from its options and the cache: the
// plan (its visibility points into key_positions when those are derived),
// and the new keys' positions.
template <class T>
struct StepPlan {
  SoftmaxPlan<T> plan;
  std::vector<std::int64_t> new_positions;  // the new keys'
  std::vector<std::int64_t> key_positions;  // all keys', when neither given nor contiguous
};

// A step's positions: the new tokens' queries at options.q_positions, or at
// options.k_offset + cache.length + t; their keys at the same positions
// unless options.k_positions gives all keys'; cached keys at k_offset + j.
template <class T>
StepPlan<T> plan_step(const char* fn, std::size_t n, std::size_t length, std::size_t d, std::size_t heads,
                      const Rotation<T>& rotation, const SoftmaxOptions& o) {
  const std::size_t total = length + n;
  check_mask_options(fn, o, n, total);
  StepPlan<T> step;
  step.plan = softmax_fields(fn, d, heads, rotation, o);
  step.plan.keys_rotated = true;
  const std::int64_t first_new = o.k_offset + static_cast<std::int64_t>(length);
  const Positions queries = o.q_positions.empty() ? Positions(first_new) : Positions(o.q_positions.data());
  step.new_positions.resize(n);
  for (std::size_t t = 0; t < n; ++t) {
    step.new_positions[t] = o.k_positions.empty() ? queries.at(t) : o.k_positions[length + t];
  }
  if (rotation.table != nullptr) {
    const std::size_t rows = rotation.table->positions();
    rope::detail::check_positions(fn, queries, n, rows, {"options.q_positions", "options.k_offset + cache.length"});
    for (std::size_t t = 0; t < n && !o.k_positions.empty(); ++t) {
      const std::int64_t m = step.new_positions[t];
      if (m < 0 || static_cast<std::uint64_t>(m) >= rows) {
        rope::detail::position_outside(fn, {"options.k_positions[", length + t, "]"}, rows, m);
      }
    }
  }
  Visibility& vis = step.plan.visibility;
  vis = visibility_of(o);
  vis.window = o.window;
  vis.q_offset = first_new;
  if (o.k_positions.empty() && !o.q_positions.empty()) {
    step.key_positions.resize(total);
    for (std::size_t j = 0; j < length; ++j) step.key_positions[j] = o.k_offset + static_cast<std::int64_t>(j);
    std::copy(step.new_positions.begin(), step.new_positions.end(), step.key_positions.begin() + length);
    vis.k_ids = step.key_positions.data();
  }
  step.plan.sorted = vis.keys_sorted(total);
  return step;
}

// Writes the new keys, rotated at their positions, and values into the
// cache's tokens [length, length + n).
// A float cache is written by the one writer of caches (append.hpp), as a
// pool of one page; a double cache as below, with the same rotation.
template <class T>
void append_step(const View<const T>& k_new, const View<const T>& v_new, const KvCache<T>& cache,
                 const Rotation<T>& rotation, const StepPlan<T>& step) {
  if constexpr (std::is_same<T, float>::value) {
    const auto pool = [](const View<float>& c) {
      const std::size_t span = c.tokens * c.token_stride + c.heads * c.head_stride;
      return PagePool<float>{c.data, nullptr, 1, c.tokens, c.heads, c.head_dim, span, c.token_stride, c.head_stride};
    };
    const TokenWriter<float, float> writer{k_new, v_new, {pool(cache.k), pool(cache.v)}, rotation, step.plan.rotary_dim,
                                           {},    {}};
    std::vector<float> scratch(std::max(k_new.heads * k_new.head_dim, v_new.head_dim));
    for (std::size_t t = 0; t < k_new.tokens; ++t) {
      writer.write(t, static_cast<std::int64_t>(cache.length + t), step.new_positions[t], scratch.data());
    }
    return;
  }
  const View<T> k_slot = cache.k.slice_tokens(cache.length, k_new.tokens);
  const View<T> v_slot = cache.v.slice_tokens(cache.length, k_new.tokens);
  for (std::size_t t = 0; t < k_new.tokens; ++t) {
    for (std::size_t h = 0; h < k_new.heads; ++h) {
      std::memcpy(k_slot.row(t, h), k_new.row(t, h), k_new.head_dim * sizeof(T));
      std::memcpy(v_slot.row(t, h), v_new.row(t, h), v_new.head_dim * sizeof(T));
    }
    T* row = k_slot.row(t, 0);
    rotate_at(rotation, step.plan.rotary_dim, static_cast<std::size_t>(step.new_positions[t]), row, row,
              static_cast<std::ptrdiff_t>(k_slot.head_stride), k_slot.heads, k_slot.head_dim);
  }
}

}  // namespace detail

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
                  const Rotation<T>& rotation, const SoftmaxOptions& options) {
  detail::check_scalar<T>();
  const char* fn = "rope::attention::softmax_step";
  detail::check_step_views(fn, q, k_new, v_new, cache, out);
  const std::size_t total = cache.length + k_new.tokens;
  const detail::StepPlan<T> step =
      detail::plan_step(fn, k_new.tokens, cache.length, q.head_dim, q.heads, rotation, options);
  // The only writes before the attention itself, after every check.
  detail::append_step(k_new, v_new, cache, rotation, step);
  detail::softmax_heads<T>(q, cache.k.slice_tokens(0, total), cache.v.slice_tokens(0, total), out, rotation, step.plan);
  cache.length = total;
}

}  // namespace rope::attention
