// rope/attention/linear.hpp — linear attention with any feature map, RoPE in
// RoFormer's eq. 19 form or before the feature map, causal in chunks, and a
// recurrent step for decoding.
//
//   out_i = phi(q_i)^T S / g(phi(q_i)^T z),  S = sum_j phi(k_j) v_j^T,  z = sum_j phi(k_j)
//   eq. 19: out_i = (R_pq_i phi(q_i))^T S_rot / g(phi(q_i)^T z),
//           S_rot = sum_j (R_pk_j phi(k_j)) v_j^T,  z not rotated
//   g(r) = r + 2 delta [|r| <= delta]  (delta = 1e-6)
//
// Causal: sums over j <= i (Lq = Lk), evaluated in chunks that carry (S, z):
// O(L m dv) work, O(m dv + chunk (m + d + chunk)) memory per head beyond
// inputs and outputs when the FAVOR+ overloads compute features chunk by
// chunk (the overloads given features take them as L x m inputs). FAVOR+ keys in causal mode use no head-wide offset (it would
// leak future keys into earlier outputs): each key carries its own log scale
// s_j (FavorFeatures::scaled_keys), the state the running prefix max c of
// those, and (S, z) are rescaled by exp(c_old - c_new) when it grows; keys
// take eps = 0 there. The eq. 19 rotation acts on
// the m-dimensional features: a Table over rotary_dim m, theta_t = base^(-2t/m)
// (build it with rope::frequencies(m, base)); its numerator can be negative
// and is never clamped. The pre-phi mode rotates q, k in d dimensions and
// then applies phi (numerator and denominator both from rotated features).
//
// Layout: one token per row (common.hpp): features L x m, values L x dv.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <Eigen/Core>

#include "common.hpp"
#include "features.hpp"

namespace rope::attention {

struct LinearOptions {
  bool causal = false;
  std::size_t chunk = 64;  // causal: tokens per chunk
  double delta = 1e-6;     // the guard g
  std::vector<std::int64_t> q_positions, k_positions;  // empty: 0 .. L-1 (eq. 19, pre-phi)
};

namespace detail {

// The inputs of the core: numerator and denominator features of queries and
// keys (the same matrices unless eq. 19 rotates the numerator), and, for
// causal FAVOR+ keys, per-key log scales s_j: the key's feature is
// k_j * exp(s_j) (empty: plain features).
template <class T>
struct LinearInputs {
  const Matrix<T>* qn;
  const Matrix<T>* qd;
  const Matrix<T>* kn;
  const Matrix<T>* kd;
  const Vector<T>* log_scale;  // nullptr or Lk values
};

inline void check_linear_options(const char* fn, const LinearOptions& o) {
  if (o.chunk == 0) fail(fn, "options.chunk must be at least 1, got 0");
  if (!(o.delta >= 0.0) || !std::isfinite(o.delta)) {
    fail(fn, "options.delta must be finite and >= 0, got " + std::to_string(o.delta));
  }
}

inline void check_linear_shapes(const char* fn, std::ptrdiff_t lq, std::ptrdiff_t mq, std::ptrdiff_t lk,
                                std::ptrdiff_t mk, std::ptrdiff_t lv, const LinearOptions& o) {
  check_linear_options(fn, o);
  if (mq != mk) fail(fn, "query features have " + std::to_string(mq) + " columns but key features " + std::to_string(mk));
  if (mq == 0) fail(fn, "the feature dimension is 0");
  if (lv != lk) fail(fn, "v has " + std::to_string(lv) + " rows but k has " + std::to_string(lk));
  if (o.causal && lq != lk) {
    fail(fn, "causal linear attention needs as many queries as keys, got " + std::to_string(lq) + " and " +
                 std::to_string(lk));
  }
  check_positions_size(fn, "options.q_positions", o.q_positions, static_cast<std::size_t>(lq));
  check_positions_size(fn, "options.k_positions", o.k_positions, static_cast<std::size_t>(lk));
}

// Sum of the rows, one contiguous row at a time (a colwise() reduction of a
// row-major matrix walks the columns with a stride).
template <class Derived>
Vector<typename Derived::Scalar> column_sums(const Eigen::MatrixBase<Derived>& x) {
  Vector<typename Derived::Scalar> z = Vector<typename Derived::Scalar>::Zero(x.cols());
  for (Eigen::Index i = 0; i < x.rows(); ++i) z += x.row(i).transpose();
  return z;
}

template <class T>
void finish_rows(const Matrix<T>& num, const Vector<T>& den, T delta, Eigen::Index first, Matrix<T>& out) {
  for (Eigen::Index i = 0; i < num.rows(); ++i) out.row(first + i) = num.row(i) / guard(den[i], delta);
}

// The causal sums of one head, carried from chunk to chunk: S (m x dv), z,
// and c, the prefix max of the keys' log scales.
template <class T>
class CausalSums {
 public:
  CausalSums(Eigen::Index m, Eigen::Index dv, T delta)
      : s_(Matrix<T>::Zero(m, dv)), z_(Vector<T>::Zero(m)), delta_(delta) {}

  // Tokens first .. first+n-1: query and key features of the chunk (qd / kd
  // used only when the numerator's differ: eq. 19), log scales of its keys
  // (nullptr: plain features), values; writes their output rows.
  template <class QN, class QD, class KN, class KD, class V>
  void add(const QN& qn, const QD& qd, const KN& kn, const KD& kd, bool rotated, const T* log_scale, const V& v,
           Eigen::Index first, Matrix<T>& out) {
    const Eigen::Index n = qn.rows();
    // Earlier chunks, through the carried state.
    num_.noalias() = qn * s_;
    den_.noalias() = qd * z_;
    // This chunk, quadratically: tril(Q K^T), weighted by exp(s_j - c_i).
    an_.noalias() = qn * kn.transpose();
    if (rotated) ad_.noalias() = qd * kd.transpose();
    weights_.setZero(n, n);
    if (log_scale != nullptr) {
      const Eigen::Map<const Vector<T>> ls(log_scale, n);
      ci_.resize(n);
      T running = c_;
      for (Eigen::Index i = 0; i < n; ++i) {
        running = std::max(running, ls[i]);
        ci_[i] = running;
      }
      for (Eigen::Index i = 0; i < n; ++i) {
        const T carried = c_ == kNegInf ? T(0) : std::exp(c_ - ci_[i]);
        num_.row(i) *= carried;
        den_[i] *= carried;
        weights_.row(i).head(i + 1) = (ls.head(i + 1).array() - ci_[i]).exp().matrix().transpose();
      }
    } else {
      weights_.template triangularView<Eigen::Lower>().setOnes();
    }
    an_ = an_.cwiseProduct(weights_);
    num_.noalias() += an_ * v;
    if (rotated) {
      den_ += ad_.cwiseProduct(weights_).rowwise().sum();
    } else {
      den_ += an_.rowwise().sum();
    }
    finish_rows(num_, den_, delta_, first, out);
    // Carry the chunk into (S, z), relative to the new prefix max.
    if (log_scale != nullptr) {
      const Eigen::Map<const Vector<T>> ls(log_scale, n);
      const T c_end = ci_[n - 1];
      const T carried = c_ == kNegInf ? T(0) : std::exp(c_ - c_end);
      wj_ = (ls.array() - c_end).exp().matrix();
      s_ *= carried;
      z_ *= carried;
      kw_ = wj_.asDiagonal() * kn;
      s_.noalias() += kw_.transpose() * v;
      if (rotated) {
        z_.noalias() += kd.transpose() * wj_;
      } else {
        z_ += column_sums(kw_);
      }
      c_ = c_end;
    } else {
      s_.noalias() += kn.transpose() * v;
      z_ += column_sums(kd);
    }
  }

 private:
  static constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  Matrix<T> s_;
  Vector<T> z_;
  T c_ = kNegInf;
  T delta_;
  Matrix<T> an_, ad_, num_, weights_, kw_;
  Vector<T> den_, ci_, wj_;
};

template <class T>
Matrix<T> linear_core(const LinearInputs<T>& in, const ConstRef<T>& v, const LinearOptions& o) {
  const Matrix<T>& qn = *in.qn;
  const Matrix<T>& qd = *in.qd;
  const Matrix<T>& kn = *in.kn;
  const Matrix<T>& kd = *in.kd;
  const bool rotated = in.qn != in.qd || in.kn != in.kd;
  const Eigen::Index lq = qn.rows(), m = qn.cols(), dv = v.cols();
  const T delta = static_cast<T>(o.delta);
  Matrix<T> out(lq, dv);
  if (!o.causal) {
    Matrix<T> s;
    s.noalias() = kn.transpose() * v;
    const Vector<T> z = column_sums(kd);
    Matrix<T> num;
    num.noalias() = qn * s;
    Vector<T> den;
    den.noalias() = qd * z;
    finish_rows(num, den, delta, 0, out);
    return out;
  }
  CausalSums<T> sums(m, dv, delta);
  const auto chunk = static_cast<Eigen::Index>(o.chunk);
  for (Eigen::Index a = 0; a < lq; a += chunk) {
    const Eigen::Index n = std::min(chunk, lq - a);
    sums.add(qn.middleRows(a, n), qd.middleRows(a, n), kn.middleRows(a, n), kd.middleRows(a, n), rotated,
             in.log_scale != nullptr ? in.log_scale->data() + a : nullptr, v.middleRows(a, n), a, out);
  }
  return out;
}

// The rotary width of the eq. 19 feature rotation: the whole of m.
template <class T>
void check_feature_rope(const char* fn, const Rotation<T>& rope, std::size_t m, const LinearOptions& o,
                        std::size_t lq, std::size_t lk) {
  if (m % 2 != 0) fail(fn, "the feature dimension m must be even for eq. 19 (pairs of features), got " + std::to_string(m));
  if (rope.table == nullptr) fail(fn, "feature_rope.table is null");
  const std::size_t r = rope.rotary_dim == 0 ? rope.table->rotary_dim() : rope.rotary_dim;
  if (r != m) {
    fail(fn, "feature_rope rotates " + std::to_string(r) + " channels but the feature dimension m is " +
                 std::to_string(m) + " (build its table with rope::frequencies(m, base))");
  }
  check_table_positions(fn, "options.q_positions", rope, o.q_positions, lq);
  check_table_positions(fn, "options.k_positions", rope, o.k_positions, lk);
}

}  // namespace detail

// Linear attention over given features: phi_q (Lq x m), phi_k (Lk x m), v (Lk x dv).
template <class DQ, class DK, class DV>
Matrix<typename DQ::Scalar> linear(const Eigen::MatrixBase<DQ>& phi_q, const Eigen::MatrixBase<DK>& phi_k,
                                   const Eigen::MatrixBase<DV>& v, const LinearOptions& options = {}) {
  using T = typename DQ::Scalar;
  detail::check_scalar<T>();
  detail::check_same_scalar<DQ, DK>();
  detail::check_same_scalar<DQ, DV>();
  const ConstRef<T> vr(v.derived());
  const Matrix<T> q = phi_q, k = phi_k;
  detail::check_linear_shapes("rope::attention::linear", q.rows(), q.cols(), k.rows(), k.cols(), vr.rows(), options);
  return detail::linear_core<T>({&q, &q, &k, &k, nullptr}, vr, options);
}

// RoFormer eq. 19 over given features: the numerator's features are rotated
// by feature_rope (a table over rotary_dim m) at the query / key positions,
// the denominator's are not.
template <class DQ, class DK, class DV>
Matrix<typename DQ::Scalar> linear_eq19(const Eigen::MatrixBase<DQ>& phi_q, const Eigen::MatrixBase<DK>& phi_k,
                                        const Eigen::MatrixBase<DV>& v, const Rotation<typename DQ::Scalar>& feature_rope,
                                        const LinearOptions& options = {}) {
  using T = typename DQ::Scalar;
  const char* fn = "rope::attention::linear_eq19";
  detail::check_scalar<T>();
  detail::check_same_scalar<DQ, DK>();
  detail::check_same_scalar<DQ, DV>();
  const ConstRef<T> vr(v.derived());
  const Matrix<T> qd = phi_q, kd = phi_k;
  detail::check_linear_shapes(fn, qd.rows(), qd.cols(), kd.rows(), kd.cols(), vr.rows(), options);
  detail::check_feature_rope(fn, feature_rope, static_cast<std::size_t>(qd.cols()), options,
                             static_cast<std::size_t>(qd.rows()), static_cast<std::size_t>(kd.rows()));
  Matrix<T> qn = qd, kn = kd;
  const std::size_t m = static_cast<std::size_t>(qd.cols());
  detail::rotate_matrix(qn, feature_rope, m, options.q_positions);
  detail::rotate_matrix(kn, feature_rope, m, options.k_positions);
  return detail::linear_core<T>({&qn, &qd, &kn, &kd, nullptr}, vr, options);
}

namespace detail {

// FAVOR+ keys for causal attention: eps = 0, each row carried with its own
// log scale (FavorFeatures::scaled_keys).
template <class T>
void causal_keys(const FavorFeatures& phi, const ConstRef<T>& k, Matrix<T>& kd, Vector<T>& log_scale) {
  ScaledFeatures<T> sf = phi.scaled_keys(k);
  kd = std::move(sf.features);
  log_scale = std::move(sf.log_scale);
}

template <class T>
void check_favor(const char* fn, const FavorFeatures& phi, std::ptrdiff_t dq, std::ptrdiff_t dk) {
  if (static_cast<std::size_t>(dq) != phi.head_dim() || static_cast<std::size_t>(dk) != phi.head_dim()) {
    fail(fn, "q and k have " + std::to_string(dq) + " and " + std::to_string(dk) +
                 " columns but the feature map's head_dim is " + std::to_string(phi.head_dim()));
  }
}

}  // namespace detail

// FAVOR+ (or relu) linear attention from raw q (Lq x d), k (Lk x d), v. With
// pre_phi.table set, q and k are rotated in d dimensions first (pre-phi mode).
template <class DQ, class DK, class DV>
Matrix<typename DQ::Scalar> linear(const Eigen::MatrixBase<DQ>& q, const Eigen::MatrixBase<DK>& k,
                                   const Eigen::MatrixBase<DV>& v, const FavorFeatures& phi,
                                   const LinearOptions& options = {}, const Rotation<typename DQ::Scalar>& pre_phi = {}) {
  using T = typename DQ::Scalar;
  const char* fn = "rope::attention::linear";
  detail::check_scalar<T>();
  detail::check_same_scalar<DQ, DK>();
  detail::check_same_scalar<DQ, DV>();
  const ConstRef<T> qr(q.derived()), kr(k.derived()), vr(v.derived());
  detail::check_favor<T>(fn, phi, qr.cols(), kr.cols());
  const auto m = static_cast<std::ptrdiff_t>(phi.features());
  detail::check_linear_shapes(fn, qr.rows(), m, kr.rows(), m, vr.rows(), options);
  const std::size_t r = detail::rotary_width(fn, pre_phi, phi.head_dim());
  detail::check_table_positions(fn, "options.q_positions", pre_phi, options.q_positions, static_cast<std::size_t>(qr.rows()));
  detail::check_table_positions(fn, "options.k_positions", pre_phi, options.k_positions, static_cast<std::size_t>(kr.rows()));
  if (options.causal && phi.options().kind == FeatureKind::positive) {
    // Features a chunk at a time: nothing of size L x m is held.
    const Eigen::Index l = qr.rows(), chunk = static_cast<Eigen::Index>(options.chunk);
    Matrix<T> out(l, vr.cols());
    detail::CausalSums<T> sums(m, vr.cols(), static_cast<T>(options.delta));
    Matrix<T> qx, kx, fk;
    Vector<T> log_scale;
    for (Eigen::Index a = 0; a < l; a += chunk) {
      const Eigen::Index n = std::min(chunk, l - a);
      qx = qr.middleRows(a, n);
      kx = kr.middleRows(a, n);
      detail::rotate_matrix(qx, pre_phi, r, options.q_positions, a);
      detail::rotate_matrix(kx, pre_phi, r, options.k_positions, a);
      const Matrix<T> fq = phi.queries(qx);
      detail::causal_keys<T>(phi, ConstRef<T>(kx), fk, log_scale);
      sums.add(fq, fq, fk, fk, false, log_scale.data(), vr.middleRows(a, n), a, out);
    }
    return out;
  }
  Matrix<T> qx = qr, kx = kr;
  detail::rotate_matrix(qx, pre_phi, r, options.q_positions);
  detail::rotate_matrix(kx, pre_phi, r, options.k_positions);
  const Matrix<T> fq = phi.queries(qx);
  const Matrix<T> fk = phi.keys(kx);
  return detail::linear_core<T>({&fq, &fq, &fk, &fk, nullptr}, vr, options);
}

// FAVOR+ (or relu) linear attention in eq. 19 form from raw q, k, v: features
// first, then the numerator's features rotated by feature_rope (rotary_dim m).
template <class DQ, class DK, class DV>
Matrix<typename DQ::Scalar> linear_eq19(const Eigen::MatrixBase<DQ>& q, const Eigen::MatrixBase<DK>& k,
                                        const Eigen::MatrixBase<DV>& v, const FavorFeatures& phi,
                                        const Rotation<typename DQ::Scalar>& feature_rope,
                                        const LinearOptions& options = {}) {
  using T = typename DQ::Scalar;
  const char* fn = "rope::attention::linear_eq19";
  detail::check_scalar<T>();
  detail::check_same_scalar<DQ, DK>();
  detail::check_same_scalar<DQ, DV>();
  const ConstRef<T> qr(q.derived()), kr(k.derived()), vr(v.derived());
  detail::check_favor<T>(fn, phi, qr.cols(), kr.cols());
  const auto m = static_cast<std::ptrdiff_t>(phi.features());
  detail::check_linear_shapes(fn, qr.rows(), m, kr.rows(), m, vr.rows(), options);
  detail::check_feature_rope(fn, feature_rope, phi.features(), options, static_cast<std::size_t>(qr.rows()),
                             static_cast<std::size_t>(kr.rows()));
  if (options.causal && phi.options().kind == FeatureKind::positive) {
    // Features a chunk at a time: nothing of size L x m is held.
    const Eigen::Index l = qr.rows(), chunk = static_cast<Eigen::Index>(options.chunk);
    Matrix<T> out(l, vr.cols());
    detail::CausalSums<T> sums(m, vr.cols(), static_cast<T>(options.delta));
    Matrix<T> qd, qn, kd, kn;
    Vector<T> log_scale;
    for (Eigen::Index a = 0; a < l; a += chunk) {
      const Eigen::Index n = std::min(chunk, l - a);
      qd = phi.queries(qr.middleRows(a, n));
      detail::causal_keys<T>(phi, ConstRef<T>(kr.middleRows(a, n)), kd, log_scale);
      qn = qd;
      kn = kd;
      detail::rotate_matrix(qn, feature_rope, phi.features(), options.q_positions, a);
      detail::rotate_matrix(kn, feature_rope, phi.features(), options.k_positions, a);
      sums.add(qn, qd, kn, kd, true, log_scale.data(), vr.middleRows(a, n), a, out);
    }
    return out;
  }
  const Matrix<T> qd = phi.queries(qr);
  const Matrix<T> kd = phi.keys(kr);
  Matrix<T> qn = qd, kn = kd;
  detail::rotate_matrix(qn, feature_rope, phi.features(), options.q_positions);
  detail::rotate_matrix(kn, feature_rope, phi.features(), options.k_positions);
  return detail::linear_core<T>({&qn, &qd, &kn, &kd, nullptr}, vr, options);
}

// Decode-time linear attention: the state (S, z, c) of one head, one token
// in, one output out. push adds a key: numerator features kn (rotated for
// eq. 19; otherwise kd), denominator features kd, value v, and the key's log
// scale (its features are kd * exp(log_scale); 0 for plain maps,
// FavorFeatures::scaled_keys for FAVOR+ keys). c is the running max of the log scales: when it grows,
// (S, z) are rescaled by exp(c_old - c_new). read gives the output of a query.
template <class T>
class LinearState {
 public:
  LinearState(std::size_t features, std::size_t value_dim, double delta = 1e-6)
      : s_(Matrix<T>::Zero(static_cast<Eigen::Index>(features), static_cast<Eigen::Index>(value_dim))),
        z_(Vector<T>::Zero(static_cast<Eigen::Index>(features))),
        delta_(static_cast<T>(delta)) {
    detail::check_scalar<T>();
    const char* fn = "rope::attention::LinearState";
    if (features == 0) detail::fail(fn, "features must be at least 1, got 0");
    if (value_dim == 0) detail::fail(fn, "value_dim must be at least 1, got 0");
    if (!(delta >= 0.0) || !std::isfinite(delta)) detail::fail(fn, "delta must be finite and >= 0, got " + std::to_string(delta));
  }

  template <class DN, class DD, class DV>
  void push(const Eigen::MatrixBase<DN>& kn, const Eigen::MatrixBase<DD>& kd, const Eigen::MatrixBase<DV>& v,
            T log_scale = 0) {
    const char* fn = "rope::attention::LinearState::push";
    check_size(fn, "kn", kn.size(), z_.size());
    check_size(fn, "kd", kd.size(), z_.size());
    check_size(fn, "v", v.size(), s_.cols());
    if (!std::isfinite(log_scale)) detail::fail(fn, "log_scale must be finite, got " + std::to_string(log_scale));
    const Vector<T> kn_col = kn.reshaped();
    const Vector<T> kd_col = kd.reshaped();
    const Vector<T> v_col = v.reshaped();
    const T c_new = has_key_ ? std::max(c_, log_scale) : log_scale;
    if (has_key_ && c_new != c_) {
      const T carried = std::exp(c_ - c_new);
      s_ *= carried;
      z_ *= carried;
    }
    const T w = std::exp(log_scale - c_new);
    s_.noalias() += (w * kn_col) * v_col.transpose();
    z_ += w * kd_col;
    c_ = c_new;
    has_key_ = true;
  }
  template <class DK, class DV>
  void push(const Eigen::MatrixBase<DK>& k, const Eigen::MatrixBase<DV>& v) {
    push(k, k, v, T(0));
  }

  // phi_q^T S / g(phi_q^T z) with numerator features qn and denominator features qd.
  template <class DN, class DD>
  Vector<T> read(const Eigen::MatrixBase<DN>& qn, const Eigen::MatrixBase<DD>& qd) const {
    const char* fn = "rope::attention::LinearState::read";
    check_size(fn, "qn", qn.size(), z_.size());
    check_size(fn, "qd", qd.size(), z_.size());
    const Vector<T> qn_col = qn.reshaped();
    const Vector<T> qd_col = qd.reshaped();
    const T den = detail::guard(T(qd_col.dot(z_)), delta_);
    return (s_.transpose() * qn_col) / den;
  }
  template <class DQ>
  Vector<T> read(const Eigen::MatrixBase<DQ>& q) const {
    return read(q, q);
  }

  // One token: push its key and value, then read its query.
  template <class DQ, class DK, class DV>
  Vector<T> step(const Eigen::MatrixBase<DQ>& q, const Eigen::MatrixBase<DK>& k, const Eigen::MatrixBase<DV>& v) {
    push(k, v);
    return read(q);
  }

  void reset() {
    s_.setZero();
    z_.setZero();
    c_ = 0;
    has_key_ = false;
  }

  const Matrix<T>& S() const noexcept { return s_; }
  const Vector<T>& z() const noexcept { return z_; }
  T c() const noexcept { return c_; }

 private:
  static void check_size(const char* fn, const char* name, Eigen::Index got, Eigen::Index want) {
    if (got != want) {
      detail::fail(fn, std::string(name) + " has " + std::to_string(got) + " values, expected " + std::to_string(want));
    }
  }

  Matrix<T> s_;
  Vector<T> z_;
  T c_ = 0;
  bool has_key_ = false;
  T delta_;
};

}  // namespace rope::attention
