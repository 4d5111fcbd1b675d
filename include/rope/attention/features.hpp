// rope/attention/features.hpp — feature maps phi: R^d -> R^m with every entry
// > 0, for linear attention (linear.hpp).
//
//   elu+1:   phi(x) = elu(x) + 1                                  (m = d)
//   FAVOR+:  x^ = d^(-1/4) x, u = W x^, h = |x^|^2 / 2,
//            query  phi(q)_r = m^(-1/2) (exp(u_r - h - max_s u_s) + eps)
//            key    phi(k_j)_r = m^(-1/2) (exp(u_jr - h_j - c_K) + eps),  c_K = max_{j,r} u_jr
//            so that E[phi(x) . phi(y)] -> exp(x . y / sqrt(d)) (eps = 0, offsets removed)
//   relu:    phi(x) = relu(m^(-1/2) W x) + 1e-3
//
// The offsets (row max for a query, head-wide max for keys) only keep exp in
// range: with eps = 0 they cancel in the attention output. Causal attention
// must not use the head-wide c_K (it sees future keys); it takes
// scaled_keys() (features and per-key log scales) and keeps a running prefix
// max of the log scales instead (linear.hpp).
//
// W (m x d) is drawn once from a seed and changes only through redraw():
// blocks of d orthogonal rows (QR of a Gaussian d x d matrix with the sign
// fix Q <- Q diag(sign(diag R)), without which every block's first row has a
// non-positive first coordinate and the estimate is biased), each row scaled
// by the norm of an independent N(0, I_d) draw (chi, unbiased) or by sqrt(d)
// (regularised, biased low); or plain iid Gaussian rows. The Gaussian
// generator is Box-Muller over std::mt19937_64, so a seed gives the same W
// with every standard library.
//
// Layout: one token per row (common.hpp); results are row-major L x m.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <type_traits>
#include <utility>

#include <Eigen/Core>

#include "common.hpp"

namespace rope::attention {

// elu(x) + 1, entrywise: x + 1 for x > 0, exp(x) otherwise.
template <class D>
Matrix<typename D::Scalar> elu_plus_one(const Eigen::MatrixBase<D>& x) {
  using T = typename D::Scalar;
  detail::check_scalar<T>();
  Matrix<T> y = x;
  y = y.unaryExpr([](T v) { return v > T(0) ? v + T(1) : std::exp(v); });
  return y;
}

enum class Projection { orthogonal, iid };
// Row norms of an orthogonal projection: chi draws (unbiased) or sqrt(d).
// An iid projection keeps its rows' own (chi) norms unless sqrt_d is asked.
enum class RowNorms { chi, sqrt_d };
enum class FeatureKind { positive, relu };

struct FavorOptions {
  std::size_t features = 256;  // m
  Projection projection = Projection::orthogonal;
  RowNorms row_norms = RowNorms::chi;
  FeatureKind kind = FeatureKind::positive;
  double eps = 1e-6;  // added to every positive feature (queries, non-causal keys)
  std::uint64_t seed = 0;
};

// FAVOR+ exponents of a block of tokens: phi_r = m^(-1/2) exp(exponent_r - offset),
// exponent = u - h; row_max[j] = max_r u_jr, the offset a query uses for itself.
template <class T>
struct LogFeatures {
  Matrix<T> exponent;  // L x m
  Vector<T> row_max;   // L
};

// Key features of causal attention, kept finite for any input: row j is
// features_j * exp(log_scale_j) = m^(-1/2) exp(u_j - h_j) with eps = 0,
// where features_j = m^(-1/2) exp(u_j - max_r u_jr) has largest entry
// m^(-1/2) (never all zero) and log_scale_j = max_r u_jr - h_j. A causal
// consumer offsets by the running prefix max of log_scale, never a later key.
template <class T>
struct ScaledFeatures {
  Matrix<T> features;   // L x m
  Vector<T> log_scale;  // L
};

namespace detail {

// Standard normal draws: Box-Muller over mt19937_64, whose output sequence
// the C++ standard fixes (std::normal_distribution's algorithm it does not).
class Normal {
 public:
  explicit Normal(std::uint64_t seed) : gen_(seed) {}
  double operator()() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double unit = std::ldexp(1.0, -53);
    const double u1 = static_cast<double>((gen_() >> 11) + 1) * unit;  // (0, 1]: log is finite
    const double u2 = static_cast<double>(gen_() >> 11) * unit;
    const double radius = std::sqrt(-2.0 * std::log(u1));
    const double angle = 6.283185307179586476925286766559 * u2;
    spare_ = radius * std::sin(angle);
    has_spare_ = true;
    return radius * std::cos(angle);
  }

 private:
  std::mt19937_64 gen_;
  double spare_ = 0.0;
  bool has_spare_ = false;
};

// The Q of g = Q R (g square) with R's diagonal >= 0: the unique QR with a
// positive diagonal, so that Q is Haar-distributed when g is Gaussian.
// Householder reflections in double, H_k = I - 2 v v^T / (v^T v), each
// taking column k of what is left of g to R_kk e_k with R_kk of the sign
// opposite to its top entry (no cancellation); Q = H_0 H_1 ... with column k
// negated where R_kk < 0. Plain loops: Eigen's QR module would be compiled
// by every unit that includes the attention module. g is overwritten.
inline Eigen::MatrixXd positive_qr_q(Eigen::MatrixXd& g) {
  const Eigen::Index n = g.rows();
  Eigen::MatrixXd q = Eigen::MatrixXd::Identity(n, n);
  Eigen::VectorXd v(n);
  for (Eigen::Index k = 0; k < n; ++k) {
    double norm = 0;
    for (Eigen::Index i = k; i < n; ++i) norm += g(i, k) * g(i, k);
    norm = std::sqrt(norm);
    if (norm == 0) continue;  // a zero column: R_kk = 0, no reflection
    const double r_kk = g(k, k) > 0 ? -norm : norm;
    double vv = 0;
    for (Eigen::Index i = k; i < n; ++i) {
      v(i) = g(i, k) - (i == k ? r_kk : 0.0);
      vv += v(i) * v(i);
    }
    const double f = 2.0 / vv;
    for (Eigen::Index j = k; j < n; ++j) {
      double dot = 0;
      for (Eigen::Index i = k; i < n; ++i) dot += v(i) * g(i, j);
      for (Eigen::Index i = k; i < n; ++i) g(i, j) -= f * dot * v(i);
    }
    // Q H_k changes columns k .. n-1 of Q only, so column k is final here.
    for (Eigen::Index r = 0; r < n; ++r) {
      double dot = 0;
      for (Eigen::Index i = k; i < n; ++i) dot += q(r, i) * v(i);
      for (Eigen::Index i = k; i < n; ++i) q(r, i) -= f * dot * v(i);
    }
    if (r_kk < 0) q.col(k) = -q.col(k);
  }
  return q;
}

}  // namespace detail

class FavorFeatures {
 public:
  explicit FavorFeatures(std::size_t head_dim, const FavorOptions& options = {}) : d_(head_dim), options_(options) {
    const char* fn = "rope::attention::FavorFeatures";
    if (head_dim == 0) detail::fail(fn, "head_dim", "at least 1", head_dim);
    if (options.features == 0) detail::fail(fn, "options.features", "at least 1", options.features);
    if (!(options.eps >= 0.0) || !std::isfinite(options.eps))
      detail::fail(fn, "options.eps", "finite and >= 0", options.eps);
    draw();
  }

  // Draws a new W from seed; the only way W changes.
  void redraw(std::uint64_t seed) {
    options_.seed = seed;
    draw();
  }

  std::size_t features() const noexcept { return options_.features; }
  std::size_t head_dim() const noexcept { return d_; }
  const FavorOptions& options() const noexcept { return options_; }
  // W, m x d: row r is the random direction of feature r.
  const Matrix<double>& projection() const noexcept { return w_; }

  // Query features: each row offset by its own max_s u_s (positive kind).
  template <class D>
  Matrix<typename D::Scalar> queries(const Eigen::MatrixBase<D>& x) const {
    using T = typename D::Scalar;
    const ConstRef<T> xr(x.derived());
    check_input("rope::attention::FavorFeatures::queries", xr);
    if (options_.kind == FeatureKind::relu) return relu(xr);
    LogFeatures<T> lf = exponents(xr);
    const T eps = static_cast<T>(options_.eps);
    const T norm = static_cast<T>(1.0 / std::sqrt(static_cast<double>(features())));
    detail::shift_rows(lf.exponent, lf.row_max, true);
    lf.exponent.array() = (lf.exponent.array() + eps) * norm;
    return std::move(lf.exponent);
  }

  // Key features of a whole head: one offset c_K = max_{j,r} u_jr for all
  // rows (positive kind). Not for causal attention: see scaled_keys.
  template <class D>
  Matrix<typename D::Scalar> keys(const Eigen::MatrixBase<D>& x) const {
    using T = typename D::Scalar;
    const ConstRef<T> xr(x.derived());
    check_input("rope::attention::FavorFeatures::keys", xr);
    if (options_.kind == FeatureKind::relu) return relu(xr);
    LogFeatures<T> lf = exponents(xr);
    const T eps = static_cast<T>(options_.eps);
    const T norm = static_cast<T>(1.0 / std::sqrt(static_cast<double>(features())));
    const T c = lf.row_max.size() == 0 ? T(0) : lf.row_max.maxCoeff();
    return (((lf.exponent.array() - c).exp() + eps) * norm).matrix();
  }

  // Keys for causal attention (positive kind): see ScaledFeatures.
  template <class D>
  ScaledFeatures<typename D::Scalar> scaled_keys(const Eigen::MatrixBase<D>& x) const {
    using T = typename D::Scalar;
    const char* fn = "rope::attention::FavorFeatures::scaled_keys";
    if (options_.kind != FeatureKind::positive) {
      detail::fail(fn, "options.kind", "FeatureKind::positive (relu features have no exponents)", "relu");
    }
    const ConstRef<T> xr(x.derived());
    check_input(fn, xr);
    const T scale = static_cast<T>(std::pow(static_cast<double>(d_), -0.25));
    const Matrix<T> xs = xr * scale;
    ScaledFeatures<T> sf;
    sf.features.noalias() = xs * weights<T>().transpose();
    const Vector<T> row_max = sf.features.rowwise().maxCoeff();
    const T norm = static_cast<T>(1.0 / std::sqrt(static_cast<double>(features())));
    detail::shift_rows(sf.features, row_max, true);
    sf.features *= norm;
    sf.log_scale = row_max - xs.rowwise().squaredNorm() * T(0.5);
    return sf;
  }

  // The exponents u - h and the row maxima of u (positive kind only): what a
  // caller needs to choose its own offsets (causal prefix max, tests).
  template <class D>
  LogFeatures<typename D::Scalar> log_features(const Eigen::MatrixBase<D>& x) const {
    using T = typename D::Scalar;
    const char* fn = "rope::attention::FavorFeatures::log_features";
    if (options_.kind != FeatureKind::positive) {
      detail::fail(fn, "options.kind", "FeatureKind::positive (relu features have no exponents)", "relu");
    }
    const ConstRef<T> xr(x.derived());
    check_input(fn, xr);
    return exponents(xr);
  }

 private:
  template <class T>
  void check_input(const char* fn, const ConstRef<T>& x) const {
    detail::check_scalar<T>();
    if (static_cast<std::size_t>(x.cols()) != d_) detail::fail(fn, "x.cols()", {"head_dim = ", d_}, x.cols());
  }

  template <class T>
  const Matrix<T>& weights() const noexcept {
    if constexpr (std::is_same<T, float>::value) {
      return w_float_;
    } else {
      return w_;
    }
  }

  template <class T>
  LogFeatures<T> exponents(const ConstRef<T>& x) const {
    const T scale = static_cast<T>(std::pow(static_cast<double>(d_), -0.25));
    const Matrix<T> xs = x * scale;
    LogFeatures<T> lf;
    lf.exponent.noalias() = xs * weights<T>().transpose();
    lf.row_max = lf.exponent.rowwise().maxCoeff();
    const Vector<T> h = xs.rowwise().squaredNorm() * T(0.5);
    detail::shift_rows(lf.exponent, h, false);
    return lf;
  }

  template <class T>
  Matrix<T> relu(const ConstRef<T>& x) const {
    const T norm = static_cast<T>(1.0 / std::sqrt(static_cast<double>(features())));
    Matrix<T> phi;
    phi.noalias() = x * weights<T>().transpose();
    return ((phi.array() * norm).max(T(0)) + T(1e-3)).matrix();
  }

  void draw() {
    const std::size_t m = options_.features;
    const auto d = static_cast<Eigen::Index>(d_);
    detail::Normal normal(options_.seed);
    w_.resize(static_cast<Eigen::Index>(m), d);
    if (options_.projection == Projection::iid) {
      for (Eigen::Index r = 0; r < w_.rows(); ++r) {
        for (Eigen::Index c = 0; c < d; ++c) w_(r, c) = normal();
      }
      if (options_.row_norms == RowNorms::sqrt_d) {
        for (Eigen::Index r = 0; r < w_.rows(); ++r) w_.row(r) *= std::sqrt(double(d_)) / w_.row(r).norm();
      }
    } else {
      Eigen::MatrixXd g(d, d);
      for (Eigen::Index row0 = 0; row0 < w_.rows(); row0 += d) {
        for (Eigen::Index c = 0; c < d; ++c) {
          for (Eigen::Index r = 0; r < d; ++r) g(r, c) = normal();
        }
        const Eigen::MatrixXd q = detail::positive_qr_q(g);
        const Eigen::Index rows = std::min(d, w_.rows() - row0);
        w_.middleRows(row0, rows) = q.transpose().topRows(rows);
      }
      for (Eigen::Index r = 0; r < w_.rows(); ++r) {
        double norm = std::sqrt(double(d_));
        if (options_.row_norms == RowNorms::chi) {
          double sum = 0.0;
          for (Eigen::Index c = 0; c < d; ++c) {
            const double z = normal();
            sum += z * z;
          }
          norm = std::sqrt(sum);
        }
        w_.row(r) *= norm;
      }
    }
    w_float_ = w_.cast<float>();
  }

  std::size_t d_;
  FavorOptions options_;
  Matrix<double> w_;
  Matrix<float> w_float_;
};

}  // namespace rope::attention
