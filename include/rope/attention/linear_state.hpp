// rope/attention/linear_state.hpp — the running sums of causal linear
// attention for one key/value head (LinearState): what a chunked prefill
// carries from chunk to chunk and a decode loop from token to token.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <Eigen/Core>

#include "matrix_ops.hpp"
#include "types.hpp"

namespace rope::attention {

// The running sums of one key/value head: what causal linear attention has
// seen so far, and the whole of it for decoding.
//   key_value_sum = sum_j exp(s_j - c) kn_j v_j^T   (m x dv, numerator features)
//   key_sum       = sum_j exp(s_j - c) kd_j         (m, denominator features)
//   log_offset    = c = max_j s_j                   (the keys' log scales)
// Plain feature maps have s_j = 0. push adds one key, push_rows a block of
// them; read gives a query's output. A state handed to the multi-head calls
// also remembers the last key position it holds, so that a later causal call
// cannot put a query before a key it already summed.
template <class T>
class LinearState {
 public:
  LinearState(std::size_t features, std::size_t value_dim, double delta = 1e-6) {
    detail::check_scalar<T>();
    const char* fn = "rope::attention::LinearState";
    if (features == 0) detail::fail(fn, "features", "at least 1", features);
    if (value_dim == 0) detail::fail(fn, "value_dim", "at least 1", value_dim);
    if (!(delta >= 0.0) || !std::isfinite(delta)) detail::fail(fn, "delta", "finite and >= 0", delta);
    key_value_sum_ = Matrix<T>::Zero(static_cast<Eigen::Index>(features), static_cast<Eigen::Index>(value_dim));
    key_sum_ = Vector<T>::Zero(static_cast<Eigen::Index>(features));
    delta_ = static_cast<T>(delta);
  }

  // One key: numerator features kn (rotated for eq. 19; otherwise kd),
  // denominator features kd, value v, and the key's log scale (its features
  // are kd * exp(log_scale); 0 for plain maps, FavorFeatures::scaled_keys
  // for FAVOR+ keys).
  template <class DN, class DD, class DV>
  void push(const Eigen::MatrixBase<DN>& kn, const Eigen::MatrixBase<DD>& kd, const Eigen::MatrixBase<DV>& v,
            T log_scale = 0) {
    const char* fn = "rope::attention::LinearState::push";
    check_length(fn, "kn", kn.size(), key_sum_.size());
    check_length(fn, "kd", kd.size(), key_sum_.size());
    check_length(fn, "v", v.size(), key_value_sum_.cols());
    if (!std::isfinite(log_scale)) detail::fail(fn, "log_scale", "finite", log_scale);
    const Matrix<T> kn_row = Vector<T>(kn.reshaped()).transpose();
    const Matrix<T> kd_row = Vector<T>(kd.reshaped()).transpose();
    const Matrix<T> v_row = Vector<T>(v.reshaped()).transpose();
    Vector<T> s(1);
    s[0] = log_scale;
    push_rows(kn_row, kd_row, v_row, &s);
  }
  template <class DK, class DV>
  void push(const Eigen::MatrixBase<DK>& k, const Eigen::MatrixBase<DV>& v) {
    push(k, k, v, T(0));
  }

  // A block of keys at once, one per row: kn, kd (n x m), values (n x dv),
  // log scales (n values, or nullptr for 0). Unchecked shapes: the batch
  // form the multi-head calls use.
  template <class KN, class KD, class V>
  void push_rows(const KN& kn, const KD& kd, const V& values, const Vector<T>* log_scale,
                 std::int64_t last_position = std::numeric_limits<std::int64_t>::min()) {
    const Eigen::Index n = kn.rows();
    if (n == 0) return;
    if (log_scale == nullptr) {
      if (!empty_ && log_offset_ != T(0)) rescale(T(0));
      if (empty_) log_offset_ = 0;
      key_value_sum_.noalias() += kn.transpose() * values;
      key_sum_ += kd.transpose() * Vector<T>::Ones(n);
    } else {
      T c_new = empty_ ? (*log_scale)[0] : log_offset_;
      for (Eigen::Index j = 0; j < n; ++j) c_new = std::max(c_new, (*log_scale)[j]);
      if (!empty_) rescale(c_new);
      log_offset_ = c_new;
      weights_ = ((log_scale->array() - c_new).exp()).matrix();
      weighted_ = weights_.asDiagonal() * kn;
      key_value_sum_.noalias() += weighted_.transpose() * values;
      key_sum_.noalias() += kd.transpose() * weights_;
    }
    empty_ = false;
    last_position_ = std::max(last_position_, last_position);
  }

  // phi_q^T S / g(phi_q^T z) with numerator features qn and denominator features qd.
  template <class DN, class DD>
  Vector<T> read(const Eigen::MatrixBase<DN>& qn, const Eigen::MatrixBase<DD>& qd) const {
    const char* fn = "rope::attention::LinearState::read";
    check_length(fn, "qn", qn.size(), key_sum_.size());
    check_length(fn, "qd", qd.size(), key_sum_.size());
    const Vector<T> qn_col = qn.reshaped();
    const Vector<T> qd_col = qd.reshaped();
    const T den = detail::guard(T(qd_col.dot(key_sum_)), delta_);
    return (key_value_sum_.transpose() * qn_col) / den;
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
    key_value_sum_.setZero();
    key_sum_.setZero();
    log_offset_ = 0;
    empty_ = true;
    last_position_ = std::numeric_limits<std::int64_t>::min();
  }

  const Matrix<T>& key_value_sum() const noexcept { return key_value_sum_; }
  const Vector<T>& key_sum() const noexcept { return key_sum_; }
  T log_offset() const noexcept { return log_offset_; }
  bool empty() const noexcept { return empty_; }
  std::size_t features() const noexcept { return static_cast<std::size_t>(key_sum_.size()); }
  std::size_t value_dim() const noexcept { return static_cast<std::size_t>(key_value_sum_.cols()); }
  T delta() const noexcept { return delta_; }
  // The largest position of a key pushed by a multi-head call (INT64_MIN: none known).
  std::int64_t last_position() const noexcept { return last_position_; }

 private:
  static void check_length(const char* fn, const char* name, Eigen::Index got, Eigen::Index want) {
    if (got != want) detail::fail(fn, {name, ".size()"}, detail::to_text(want), got);
  }
  void rescale(T c_new) {
    const T carried = std::exp(log_offset_ - c_new);
    if (carried != T(1)) {
      key_value_sum_ *= carried;
      key_sum_ *= carried;
    }
  }

  Matrix<T> key_value_sum_;
  Vector<T> key_sum_;
  T log_offset_ = 0;
  bool empty_ = true;
  T delta_ = 0;
  std::int64_t last_position_ = std::numeric_limits<std::int64_t>::min();
  Vector<T> weights_;
  Matrix<T> weighted_;
};

}  // namespace rope::attention
