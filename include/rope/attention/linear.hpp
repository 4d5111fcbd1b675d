// rope/attention/linear.hpp — linear attention with any feature map, RoPE in
// RoFormer's eq. 19 form or before the feature map, causal by position, over
// one head's matrices or multi-head views, with a recurrent state for decoding.
//
//   out_i = phi(q_i)^T S / g(phi(q_i)^T z),  S = sum_j phi(k_j) v_j^T,  z = sum_j phi(k_j)
//   eq. 19: out_i = (R_pq_i phi(q_i))^T S_rot / g(phi(q_i)^T z),
//           S_rot = sum_j (R_pk_j phi(k_j)) v_j^T,  z not rotated
//   g(r) = r + 2 delta [|r| <= delta]  (delta = 1e-6)
//
// The sums run over the keys visible to query i: all keys, or with
// options.mask.causal those with pk_j <= pq_i (and, with sequence ids, of the same
// sequence), exactly as softmax masks. Tokens are taken in order of
// (sequence, position), so a causal sum is a prefix sum: evaluated in chunks
// that carry (S, z) in a LinearState, O(L m dv) work and O(chunk (m + d) +
// m dv) memory per head. A masked key is left out, never multiplied by zero.
//
// FAVOR+ keys in causal mode use no head-wide offset (it would leak future
// keys into earlier outputs): each key carries its own log scale s_j
// (FavorFeatures::scaled_keys) and the state the running max c of those;
// (S, z) are rescaled by exp(c_old - c_new) when it grows; keys take eps = 0.
// The eq. 19 rotation acts on the m-dimensional features (a Table over
// rotary_dim m: rope::frequencies(m, base)); its attention factor, if not 1,
// is divided out (a rotation has none). Its numerator can be negative and is
// never clamped. The pre-phi mode rotates q, k in d dimensions and then
// applies phi (numerator and denominator both from rotated features).
//
// Layout: one token per row (common.hpp): features L x m, values L x dv; the
// multi-head overloads take rope::View tensors with grouped-query heads, one
// LinearState per key/value head.
#pragma once

#include <cstddef>
#include <vector>

#include <Eigen/Core>

#include "call_options.hpp"
#include "common.hpp"
#include "features.hpp"
#include "linear_head.hpp"
#include "linear_state.hpp"

namespace rope::attention {

// LinearOptions: call_options.hpp. LinearState: linear_state.hpp.

// Linear attention over given features: phi_q (Lq x m), phi_k (Lk x m), v (Lk x dv).
template <class DQ, class DK, class DV>
Matrix<typename DQ::Scalar> linear(const Eigen::MatrixBase<DQ>& phi_q, const Eigen::MatrixBase<DK>& phi_k,
                                   const Eigen::MatrixBase<DV>& v, const LinearOptions& options = {}) {
  using T = typename DQ::Scalar;
  detail::check_scalar<T>();
  detail::check_same_scalar<DQ, DK>();
  detail::check_same_scalar<DQ, DV>();
  const ConstRef<T> qr(phi_q.derived()), kr(phi_k.derived()), vr(v.derived());
  return detail::linear_matrices<T>("rope::attention::linear", qr, kr, vr, nullptr, {}, nullptr, options);
}

// RoFormer eq. 19 over given features: the numerator's features are rotated
// by feature_rotation (a table over rotary_dim m) at the query / key
// positions, the denominator's are not.
template <class DQ, class DK, class DV>
Matrix<typename DQ::Scalar> linear_eq19(const Eigen::MatrixBase<DQ>& phi_q, const Eigen::MatrixBase<DK>& phi_k,
                                        const Eigen::MatrixBase<DV>& v,
                                        const Rotation<typename DQ::Scalar>& feature_rotation,
                                        const LinearOptions& options = {}) {
  using T = typename DQ::Scalar;
  detail::check_scalar<T>();
  detail::check_same_scalar<DQ, DK>();
  detail::check_same_scalar<DQ, DV>();
  const ConstRef<T> qr(phi_q.derived()), kr(phi_k.derived()), vr(v.derived());
  return detail::linear_matrices<T>("rope::attention::linear_eq19", qr, kr, vr, nullptr, {}, &feature_rotation,
                                    options);
}

// FAVOR+ (or relu) linear attention from raw q (Lq x d), k (Lk x d), v. With
// pre_phi.table set, q and k are rotated in d dimensions first (pre-phi mode).
template <class DQ, class DK, class DV>
Matrix<typename DQ::Scalar> linear(const Eigen::MatrixBase<DQ>& q, const Eigen::MatrixBase<DK>& k,
                                   const Eigen::MatrixBase<DV>& v, const FavorFeatures& phi,
                                   const LinearOptions& options = {},
                                   const Rotation<typename DQ::Scalar>& pre_phi = {}) {
  using T = typename DQ::Scalar;
  detail::check_scalar<T>();
  detail::check_same_scalar<DQ, DK>();
  detail::check_same_scalar<DQ, DV>();
  const ConstRef<T> qr(q.derived()), kr(k.derived()), vr(v.derived());
  return detail::linear_matrices<T>("rope::attention::linear", qr, kr, vr, &phi, pre_phi, nullptr, options);
}

// FAVOR+ (or relu) linear attention in eq. 19 form from raw q, k, v: features
// first, then the numerator's features rotated by feature_rotation (rotary_dim m).
template <class DQ, class DK, class DV>
Matrix<typename DQ::Scalar> linear_eq19(const Eigen::MatrixBase<DQ>& q, const Eigen::MatrixBase<DK>& k,
                                        const Eigen::MatrixBase<DV>& v, const FavorFeatures& phi,
                                        const Rotation<typename DQ::Scalar>& feature_rotation,
                                        const LinearOptions& options = {}) {
  using T = typename DQ::Scalar;
  detail::check_scalar<T>();
  detail::check_same_scalar<DQ, DK>();
  detail::check_same_scalar<DQ, DV>();
  const ConstRef<T> qr(q.derived()), kr(k.derived()), vr(v.derived());
  return detail::linear_matrices<T>("rope::attention::linear_eq19", qr, kr, vr, &phi, {}, &feature_rotation, options);
}

// Every head of [tokens, heads, head_dim] views: q [Lq, Hq, d], k [Lk, Hk, d],
// v [Lk, Hk, dv], out [Lq, Hq, dv], Hq a multiple of Hk; FAVOR+ features,
// pre-phi rotation optional. With options.mask.causal, `states` (one LinearState
// per key/value head; an empty vector is filled with fresh ones) holds what
// earlier calls summed and receives this call's keys, so a prefill split
// into chunks, then one token at a time, equals the one-shot call.
template <class T>
void linear(rope::detail::type_identity_t<View<const T>> q, rope::detail::type_identity_t<View<const T>> k,
            rope::detail::type_identity_t<View<const T>> v, View<T> out, const FavorFeatures& phi,
            const LinearOptions& options = {}, const Rotation<T>& pre_phi = {},
            std::vector<LinearState<T>>* states = nullptr) {
  detail::linear_views<T>("rope::attention::linear", q, k, v, out, &phi, pre_phi, nullptr, options, states);
}

// The same in eq. 19 form: the numerator's features rotated by
// feature_rotation (rotary_dim m), the denominator's not.
template <class T>
void linear_eq19(rope::detail::type_identity_t<View<const T>> q, rope::detail::type_identity_t<View<const T>> k,
                 rope::detail::type_identity_t<View<const T>> v, View<T> out, const FavorFeatures& phi,
                 const Rotation<T>& feature_rotation, const LinearOptions& options = {},
                 std::vector<LinearState<T>>* states = nullptr) {
  detail::linear_views<T>("rope::attention::linear_eq19", q, k, v, out, &phi, {}, &feature_rotation, options, states);
}

}  // namespace rope::attention
