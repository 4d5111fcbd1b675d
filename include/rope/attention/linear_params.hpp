// rope/attention/linear_params.hpp — what a linear attention call
// (linear.hpp) computes with, checked once: the feature map from input
// rows to features (the map, the pre-phi rotation, eq. 19's rotation of
// the numerator), the tokens in (sequence, position) order, the buffers of
// one thread, and the checks of LinearOptions, the rotations and the states
// carried between calls.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include <Eigen/Core>

#include "call_options.hpp"
#include "common.hpp"
#include "features.hpp"
#include "linear_state.hpp"

namespace rope::attention::detail {

// From input rows to features: the feature map (or none: the inputs are
// features already), the pre-phi rotation in d dimensions, and the eq. 19
// rotation of the numerator in m dimensions.
template <class T>
struct FeatureMap {
  const FavorFeatures* phi = nullptr;  // null: rows are features
  Rotation<T> pre_phi;
  std::size_t pre_phi_dim = 0;
  Rotation<T> feature_rotation;  // eq. 19 when feature_rotation.table is set
  T eq19_rescale = 1;            // 1 / attention_factor^2 of the feature table

  bool eq19() const noexcept { return feature_rotation.table != nullptr; }
  // Keys carry log scales: causal FAVOR+ positive features.
  bool scaled_keys(bool causal) const noexcept {
    return phi != nullptr && causal && phi->options().kind == FeatureKind::positive;
  }
  std::size_t features(std::size_t input_dim) const noexcept { return phi ? phi->features() : input_dim; }

  // Query rows x (gathered, modified) at positions pos: numerator and
  // denominator features (den untouched unless eq. 19).
  void queries(Matrix<T>& x, const std::int64_t* pos, Matrix<T>& num, Matrix<T>& den) const {
    rotate_rows_at(x, pre_phi, pre_phi_dim, pos);
    if (phi) {
      num = phi->queries(x);
    } else {
      num.swap(x);
    }
    rotate_numerator(num, den, pos, eq19_rescale);
  }
  // Key rows: numerator and denominator features and, for causal FAVOR+,
  // the log scales (else log_scale is left empty).
  void keys(Matrix<T>& x, const std::int64_t* pos, bool causal, Matrix<T>& num, Matrix<T>& den,
            Vector<T>& log_scale) const {
    rotate_rows_at(x, pre_phi, pre_phi_dim, pos);
    log_scale.resize(0);
    if (scaled_keys(causal)) {
      ScaledFeatures<T> sf = phi->scaled_keys(x);
      num = std::move(sf.features);
      log_scale = std::move(sf.log_scale);
    } else if (phi) {
      num = phi->keys(x);
    } else {
      num.swap(x);
    }
    rotate_numerator(num, den, pos, T(1));
  }

 private:
  // Eq. 19: the denominator keeps the features, the numerator's are rotated
  // over all m (the queries' also rescaled by 1/attention_factor^2).
  void rotate_numerator(Matrix<T>& num, Matrix<T>& den, const std::int64_t* pos, T rescale) const {
    if (!eq19()) return;
    den = num;
    rotate_rows_at(num, feature_rotation, static_cast<std::size_t>(num.cols()), pos);
    if (rescale != T(1)) num *= rescale;
  }
};

// Checked inputs of one multi-head linear call.
template <class T>
struct LinearParams {
  Visibility visibility;
  std::size_t group = 1, features = 0;
  FeatureMap<T> map;
};

// Token order within a head: by (sequence, position), stable; the runs of
// one sequence are segments.
struct TokenOrder {
  std::vector<std::size_t> q, k;                  // sorted token indices
  std::vector<std::int64_t> q_pos, k_pos;         // their positions, in that order
  std::vector<std::size_t> q_segment, k_segment;  // segment starts, + end
};

inline TokenOrder order_tokens(const Visibility& vis, std::size_t lq, std::size_t lk) {
  TokenOrder order;
  order.q.resize(lq);
  order.k.resize(lk);
  std::iota(order.q.begin(), order.q.end(), std::size_t{0});
  std::iota(order.k.begin(), order.k.end(), std::size_t{0});
  const auto sort_by = [](std::vector<std::size_t>& idx, auto seq, auto pos) {
    std::stable_sort(idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) {
      return seq(a) != seq(b) ? seq(a) < seq(b) : pos(a) < pos(b);
    });
  };
  sort_by(
      order.q, [&](std::size_t i) { return vis.q_seq(i); }, [&](std::size_t i) { return vis.q_position(i); });
  sort_by(
      order.k, [&](std::size_t j) { return vis.k_seq(j); }, [&](std::size_t j) { return vis.k_position(j); });
  for (std::size_t i : order.q) order.q_pos.push_back(vis.q_position(i));
  for (std::size_t j : order.k) order.k_pos.push_back(vis.k_position(j));
  // Segments: the distinct sequence ids, each with its query and key run.
  std::size_t a = 0, b = 0;
  while (a < lq || b < lk) {
    const bool q_left = a < lq, k_left = b < lk;
    std::int64_t s = q_left ? vis.q_seq(order.q[a]) : vis.k_seq(order.k[b]);
    if (q_left && k_left) s = std::min(vis.q_seq(order.q[a]), vis.k_seq(order.k[b]));
    order.q_segment.push_back(a);
    order.k_segment.push_back(b);
    while (a < lq && vis.q_seq(order.q[a]) == s) ++a;
    while (b < lk && vis.k_seq(order.k[b]) == s) ++b;
  }
  order.q_segment.push_back(lq);
  order.k_segment.push_back(lk);
  return order;
}

// The buffers of one thread, reused by every head and chunk it computes.
template <class T>
struct LinearWorkspace {
  Matrix<T> x, q_num, q_den, k_num, k_den, values, scores, den_scores, num;
  Vector<T> log_scale, den, weights;
  std::vector<std::int64_t> pos;
  std::vector<T> offsets;            // per query token of a chunk: its running log offset
  std::vector<std::size_t> visible;  // per query token: visible keys of the key sub-chunk
};

inline void check_linear_options(const char* fn, const LinearOptions& o, std::size_t lq, std::size_t lk) {
  if (o.chunk == 0) fail(fn, "options.chunk", "at least 1", o.chunk);
  if (o.mask.window != 0) {
    fail(fn, "options.mask.window", "0: linear attention sums prefixes, which cannot drop old keys", o.mask.window);
  }
  if (!(o.delta >= 0.0) || !std::isfinite(o.delta)) fail(fn, "options.delta", "finite and >= 0", o.delta);
  check_mask_options(fn, o, lq, lk);
}

// The rotations: pre-phi over d, eq. 19 over exactly m features.
template <class T>
FeatureMap<T> check_feature_map(const char* fn, const FavorFeatures* phi, std::size_t input_dim,
                                const Rotation<T>& pre_phi, const Rotation<T>* feature_rotation, const LinearOptions& o,
                                std::size_t lq, std::size_t lk) {
  FeatureMap<T> map;
  map.phi = phi;
  if (phi != nullptr && input_dim != phi->head_dim()) {
    fail(fn, "the head dimension of q and k", {"the feature map's head_dim ", phi->head_dim()}, input_dim);
  }
  const std::size_t m = map.features(input_dim);
  if (m == 0) fail(fn, "the feature dimension m", "at least 1", m);
  map.pre_phi = pre_phi;
  map.pre_phi_dim = rotary_width(fn, "pre_phi", pre_phi, input_dim);
  check_rotation_positions(fn, pre_phi.table, o, lq, lk, true);
  if (feature_rotation != nullptr) {
    if (m % 2 != 0) fail(fn, "the feature dimension m", "even for eq. 19 (pairs of features)", m);
    if (feature_rotation->table == nullptr) fail(fn, "feature_rotation.table", "non-null", nullptr);
    const std::size_t r = rotary_width(fn, "feature_rotation", *feature_rotation, m);
    if (r != m) {
      fail(fn, "feature_rotation.rotary_dim",
           {"the feature dimension m = ", m, " (build its table with rope::frequencies(m, base))"}, r);
    }
    check_rotation_positions(fn, feature_rotation->table, o, lq, lk, true);
    map.feature_rotation = *feature_rotation;
    map.feature_rotation.rotary_dim = m;
    const double af = feature_rotation->table->attention_factor();
    map.eq19_rescale = static_cast<T>(1.0 / (af * af));
  }
  return map;
}

// The states a causal call carries on: one per key/value head (or none yet),
// of the call's dimensions, and no query before a key already summed.
template <class T>
void check_states(const char* fn, const std::vector<LinearState<T>>& states, std::size_t lq, std::size_t kv_heads,
                  std::size_t dv, const LinearOptions& o, const LinearParams<T>& params) {
  if (!o.mask.causal)
    fail(fn, "states", "null unless options.mask.causal (only prefix sums carry over)", "a state vector");
  if (!o.q_sequence.empty()) {
    fail(fn, "states", "null with sequence ids (one state per key/value head, not per sequence)", "a state vector");
  }
  if (!states.empty() && states.size() != kv_heads) {
    fail(fn, "states->size()", {"0 or k.heads = ", kv_heads}, states.size());
  }
  for (std::size_t g = 0; g < states.size(); ++g) {
    const LinearState<T>& s = states[g];
    const std::string name = indexed("states", g);
    if (s.features() != params.features) {
      fail(fn, name + ".features()", {"the feature dimension ", params.features}, s.features());
    }
    if (s.value_dim() != dv) fail(fn, name + ".value_dim()", {"v.head_dim = ", dv}, s.value_dim());
    for (std::size_t i = 0; i < lq; ++i) {
      if (params.visibility.q_position(i) < s.last_position()) {
        fail(fn, {"the position of query token ", i},
             {">= the last key position in ", name, " (", s.last_position(), ")"}, params.visibility.q_position(i));
      }
    }
  }
}

}  // namespace rope::attention::detail
