// rope/attention/state.hpp — partial softmax states merged: the public merge
// of (out, lse) pairs, what engines build split-KV, chunked prefill across
// calls and shared prefixes from.
//
// attend() over some keys K_a gives, per token and query head, a row
// out_a = sum_{j in K_a} p_j v_j with p_j = exp(s_j - lse_a) and the
// log-sum-exp lse_a = log sum_{j in K_a} exp(s_j). Over keys K_b apart from
// K_a likewise. The attention over K_a and K_b together is
//
//   lse = log(exp(lse_a) + exp(lse_b)),   out = exp(lse_a - lse) out_a + exp(lse_b - lse) out_b
//
// computed as the online softmax of the kernels computes it (kernels/
// scores.hpp, merge_state): each pair is a state (max lse, sum 1, sum out),
// the two states merged, the result divided once. A sink is a key of value
// zero: give it to exactly one of the parts. A part that saw no key (lse =
// -inf) is left out, whatever its row holds; two such give a zero row and
// -inf. A NaN lse (on either side) gives a NaN row and a NaN lse.
#pragma once

#include <cmath>
#include <cstddef>
#include <limits>
#include <type_traits>
#include <vector>

#include "../detail/fail.hpp"
#include "../half.hpp"
#include "../kernels/scores.hpp"
#include "../tensor/view_checks.hpp"
#include "../view.hpp"
#include "cache.hpp"

namespace rope::attention {

namespace detail {

// One row of the merge (n values): a and b may be out itself.
template <class A, class B, class O>
void merge_row(const A* a, float lse_a, const B* b, float lse_b, std::size_t n, O* out, float* lse,
               float* acc) noexcept {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  if (std::isnan(lse_a) || std::isnan(lse_b)) {  // a state that is not one: nothing of it is kept
    for (std::size_t c = 0; c < n; ++c) out[c] = O(std::numeric_limits<float>::quiet_NaN());
    if (lse != nullptr) *lse = std::numeric_limits<float>::quiet_NaN();
    return;
  }
  if (lse_b == neg_inf || lse_a == neg_inf) {
    const bool take_a = lse_b == neg_inf;
    for (std::size_t c = 0; c < n; ++c) {
      acc[c] = take_a ? rope::detail::widen_value(a[c]) : rope::detail::widen_value(b[c]);
    }
    if (take_a && lse_a == neg_inf) {
      for (std::size_t c = 0; c < n; ++c) acc[c] = 0.0f;
    }
    for (std::size_t c = 0; c < n; ++c) out[c] = O(acc[c]);
    if (lse != nullptr) *lse = take_a ? lse_a : lse_b;
    return;
  }
  float m = lse_a, l = 1.0f;
  for (std::size_t c = 0; c < n; ++c) acc[c] = rope::detail::widen_value(a[c]);
  float* bv = acc + n;
  for (std::size_t c = 0; c < n; ++c) bv[c] = rope::detail::widen_value(b[c]);
  rope::detail::merge_state(m, l, acc, lse_b, 1.0f, bv, n);
  for (std::size_t c = 0; c < n; ++c) out[c] = O(acc[c] / l);
  if (lse != nullptr) *lse = m + std::log(l);
}

}  // namespace detail

// Merges two partial states of the same tokens and heads (see the header
// comment): out_a, out_b and out are [tokens, heads, head_dim] views of
// float, BFloat16 or Float16 (each rounded once into out), lse_a, lse_b and
// lse [tokens * heads] floats at t * heads + h (lse may be null: not
// written; it may be lse_a or lse_b). out may be out_a or out_b itself (the
// same rows), and overlap neither otherwise, nor lse_a, lse_b or lse; lse
// overlaps no rows. Refused before anything is written: shapes that differ,
// null lse inputs, overlaps.
template <class AV, class BV, class O>
void merge(const View<AV>& out_a, const float* lse_a, const View<BV>& out_b, const float* lse_b, const View<O>& out,
           float* lse = nullptr) {
  using A = std::remove_const_t<AV>;
  using B = std::remove_const_t<BV>;
  detail::check_row_type<A>();
  detail::check_row_type<B>();
  detail::check_row_type<O>();
  const char* fn = "rope::attention::merge";
  using rope::detail::fail;
  rope::detail::check_view(fn, "out_a", out_a);
  rope::detail::check_view(fn, "out_b", out_b);
  rope::detail::check_view(fn, "out", out);
  const char* dims[3] = {"tokens", "heads", "head_dim"};
  const std::size_t a_dims[3] = {out_a.tokens, out_a.heads, out_a.head_dim};
  const std::size_t b_dims[3] = {out_b.tokens, out_b.heads, out_b.head_dim};
  const std::size_t o_dims[3] = {out.tokens, out.heads, out.head_dim};
  for (std::size_t i = 0; i < 3; ++i) {
    if (b_dims[i] != a_dims[i]) fail(fn, {"out_b.", dims[i]}, {"out_a.", dims[i], " = ", a_dims[i]}, b_dims[i]);
    if (o_dims[i] != a_dims[i]) fail(fn, {"out.", dims[i]}, {"out_a.", dims[i], " = ", a_dims[i]}, o_dims[i]);
  }
  const std::size_t rows = out.tokens * out.heads;
  if (rows > 0 && (lse_a == nullptr || lse_b == nullptr)) {
    fail(fn, lse_a == nullptr ? "lse_a" : "lse_b", {"non-null (", rows, " floats)"}, nullptr);
  }
  const bool in_a = detail::same_rows(out_a, out), in_b = detail::same_rows(out_b, out);
  if (!in_a) rope::detail::check_disjoint(fn, "out", out, "out_a", View<const A>(out_a));
  if (!in_b) rope::detail::check_disjoint(fn, "out", out, "out_b", View<const B>(out_b));
  // out is written row by row while lse_a and lse_b are still read, and lse
  // while out_a and out_b are: apart, or the rows of a call in place.
  const std::size_t out_span = detail::view_span(out);
  if (rows > 0 && detail::bytes_overlap(out.data, out_span, lse_a, rows)) {
    fail(fn, "out", "memory apart from lse_a", "overlapping");
  }
  if (rows > 0 && detail::bytes_overlap(out.data, out_span, lse_b, rows)) {
    fail(fn, "out", "memory apart from lse_b", "overlapping");
  }
  if (lse != nullptr) {
    const std::size_t span = out_span;
    if (detail::bytes_overlap(lse, rows, out.data, span)) fail(fn, "lse", "memory apart from out", "overlapping");
    if (detail::bytes_overlap(lse, rows, out_a.data, detail::view_span(out_a))) {
      fail(fn, "lse", "memory apart from out_a", "overlapping");
    }
    if (detail::bytes_overlap(lse, rows, out_b.data, detail::view_span(out_b))) {
      fail(fn, "lse", "memory apart from out_b", "overlapping");
    }
    if (lse != lse_a && detail::bytes_overlap(lse, rows, lse_a, rows))
      fail(fn, "lse", "lse_a itself or apart", "overlapping");
    if (lse != lse_b && detail::bytes_overlap(lse, rows, lse_b, rows))
      fail(fn, "lse", "lse_b itself or apart", "overlapping");
  }
  std::vector<float> acc(2 * out.head_dim);
  for (std::size_t t = 0; t < out.tokens; ++t) {
    for (std::size_t h = 0; h < out.heads; ++h) {
      const std::size_t r = t * out.heads + h;
      detail::merge_row(out_a.row(t, h), lse_a[r], out_b.row(t, h), lse_b[r], out.head_dim, out.row(t, h),
                        lse != nullptr ? lse + r : nullptr, acc.data());
    }
  }
}

}  // namespace rope::attention
