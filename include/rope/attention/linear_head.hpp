// rope/attention/linear_head.hpp — the machinery of linear attention
// (linear.hpp): the checked feature map and plan of a call, the tokens in
// (sequence, position) order, one key/value head's chunked sums
// (LinearHead), and the split of heads, segments and query blocks across
// threads (or the caller's executor).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include <Eigen/Core>

#include "../detail/parallel.hpp"
#include "call_options.hpp"
#include "common.hpp"
#include "features.hpp"
#include "linear_state.hpp"

namespace rope::attention::detail {

using rope::detail::parallel_for;

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
struct LinearPlan {
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

// One key/value head of a multi-head call: gathers rows in token order,
// computes features chunk by chunk and the outputs of its query heads.
template <class T>
class LinearHead {
 public:
  LinearHead(const View<const T>& q, const View<const T>& k, const View<const T>& v, const View<T>& out,
             const LinearOptions& o, const LinearPlan<T>& plan, const TokenOrder& order, LinearWorkspace<T>& ws)
      : q_(q),
        k_(k),
        v_(v),
        out_(out),
        o_(o),
        plan_(plan),
        order_(order),
        ws_(ws),
        chunk_(std::min(o.chunk, std::max<std::size_t>({q.tokens, k.tokens, 1}))) {}

  // Causal: query tokens of every segment against the prefix of its keys,
  // starting from (and leaving the sums in) state.
  void causal(std::size_t g, LinearState<T>& state) {
    g_ = g;
    const std::size_t segments = order_.q_segment.size() - 1;
    for (std::size_t s = 0; s < segments; ++s) {
      if (s > 0) state.reset();  // no attention across sequences (no caller state with sequence ids)
      causal_segment(state, order_.q_segment[s], order_.q_segment[s + 1], order_.k_segment[s], order_.k_segment[s + 1]);
    }
  }

  // Non-causal, phase 1: the sums of one segment's keys.
  void sum_keys(std::size_t g, std::size_t k_begin, std::size_t k_end, LinearState<T>& state) {
    g_ = g;
    state.reset();
    if (k_begin == k_end) return;
    gather_keys(k_begin, k_end);
    state.push_rows(ws_.k_num, key_den(), ws_.values, nullptr);
  }
  // Non-causal, phase 2: query tokens [a, b) (sorted order) read the sums.
  void read_queries(std::size_t g, std::size_t a, std::size_t b, const LinearState<T>& state, bool any_keys) {
    g_ = g;
    gather_queries(a, b);
    const Matrix<T>& q_den = plan_.map.eq19() ? ws_.q_den : ws_.q_num;
    ws_.num.noalias() = ws_.q_num * state.key_value_sum();
    ws_.den.noalias() = q_den * state.key_sum();
    finish(a, b, nullptr, any_keys);
  }

 private:
  const Matrix<T>& key_den() const { return plan_.map.eq19() ? ws_.k_den : ws_.k_num; }

  // Rows of query tokens [a, b) of the sorted order, every head of the group,
  // token-major; their features in q_num / q_den.
  void gather_queries(std::size_t a, std::size_t b) {
    const std::size_t group = plan_.group, n = b - a;
    const auto d = static_cast<Eigen::Index>(q_.head_dim);
    ws_.x.resize(static_cast<Eigen::Index>(n * group), d);
    ws_.pos.resize(n * group);
    for (std::size_t t = 0; t < n; ++t) {
      for (std::size_t h = 0; h < group; ++h) {
        std::memcpy(ws_.x.row(static_cast<Eigen::Index>(t * group + h)).data(), q_.row(order_.q[a + t], g_ * group + h),
                    static_cast<std::size_t>(d) * sizeof(T));
        ws_.pos[t * group + h] = order_.q_pos[a + t];
      }
    }
    plan_.map.queries(ws_.x, ws_.pos.data(), ws_.q_num, ws_.q_den);
  }

  // Key tokens [a, b): features in k_num / k_den (+ log_scale), values.
  void gather_keys(std::size_t a, std::size_t b) {
    const std::size_t n = b - a;
    const auto d = static_cast<Eigen::Index>(k_.head_dim), dv = static_cast<Eigen::Index>(v_.head_dim);
    ws_.x.resize(static_cast<Eigen::Index>(n), d);
    ws_.values.resize(static_cast<Eigen::Index>(n), dv);
    for (std::size_t j = 0; j < n; ++j) {
      const std::size_t token = order_.k[a + j];
      std::memcpy(ws_.x.row(static_cast<Eigen::Index>(j)).data(), k_.row(token, g_),
                  static_cast<std::size_t>(d) * sizeof(T));
      std::memcpy(ws_.values.row(static_cast<Eigen::Index>(j)).data(), v_.row(token, g_),
                  static_cast<std::size_t>(dv) * sizeof(T));
    }
    plan_.map.keys(ws_.x, order_.k_pos.data() + a, o_.mask.causal, ws_.k_num, ws_.k_den, ws_.log_scale);
  }

  // Keys [a, b) into the state, a chunk at a time.
  void absorb(LinearState<T>& state, std::size_t a, std::size_t b) {
    for (std::size_t j0 = a; j0 < b; j0 += chunk_) {
      const std::size_t j1 = std::min(b, j0 + chunk_);
      gather_keys(j0, j1);
      state.push_rows(ws_.k_num, key_den(), ws_.values, ws_.log_scale.size() ? &ws_.log_scale : nullptr,
                      order_.k_pos[j1 - 1]);
    }
  }

  // First key of [from, to) whose position is past p (keys sorted).
  std::size_t first_after(std::size_t from, std::size_t to, std::int64_t p) const {
    return static_cast<std::size_t>(std::upper_bound(order_.k_pos.begin() + static_cast<std::ptrdiff_t>(from),
                                                     order_.k_pos.begin() + static_cast<std::ptrdiff_t>(to), p) -
                                    order_.k_pos.begin());
  }

  void causal_segment(LinearState<T>& state, std::size_t qa, std::size_t qb, std::size_t ka, std::size_t kb) {
    std::size_t consumed = ka;
    for (std::size_t a = qa; a < qb; a += chunk_) {
      const std::size_t b = std::min(qb, a + chunk_), tokens = b - a;
      // Keys every query of the chunk sees go into the state first; the
      // keys between the chunk's first and last positions are its diagonal.
      const std::size_t lo = std::max(consumed, first_after(consumed, kb, order_.q_pos[a]));
      const std::size_t hi = std::max(lo, first_after(lo, kb, order_.q_pos[b - 1]));
      absorb(state, consumed, lo);
      consumed = lo;
      gather_queries(a, b);
      const Matrix<T>& q_den = plan_.map.eq19() ? ws_.q_den : ws_.q_num;
      ws_.num.noalias() = ws_.q_num * state.key_value_sum();
      ws_.den.noalias() = q_den * state.key_sum();
      const bool any_before = !state.empty();
      ws_.offsets.assign(tokens, state.empty() ? -std::numeric_limits<T>::infinity() : state.log_offset());
      std::vector<unsigned char> seen(tokens, any_before ? 1 : 0);
      for (std::size_t j0 = lo; j0 < hi; j0 += chunk_) {
        const std::size_t j1 = std::min(hi, j0 + chunk_);
        gather_keys(j0, j1);
        diagonal(a, tokens, j0, j1, seen);
        state.push_rows(ws_.k_num, key_den(), ws_.values, ws_.log_scale.size() ? &ws_.log_scale : nullptr,
                        order_.k_pos[j1 - 1]);
      }
      consumed = hi;
      finish(a, b, &seen, false);
    }
  }

  // Query tokens [a, a + tokens) against keys [j0, j1) they partly see: each
  // token sees a prefix of them (positions sorted).
  void diagonal(std::size_t a, std::size_t tokens, std::size_t j0, std::size_t j1, std::vector<unsigned char>& seen) {
    const std::size_t group = plan_.group, n = j1 - j0;
    const auto bn = static_cast<Eigen::Index>(n);
    const bool scaled = ws_.log_scale.size() != 0;
    ws_.visible.resize(tokens);
    bool ragged = false;
    for (std::size_t t = 0; t < tokens; ++t) {
      ws_.visible[t] = first_after(j0, j1, order_.q_pos[a + t]) - j0;
      ragged = ragged || ws_.visible[t] < n;
      if (ws_.visible[t] > 0) seen[t] = 1;
    }
    ws_.scores.noalias() = ws_.q_num * ws_.k_num.transpose();
    if (plan_.map.eq19()) ws_.den_scores.noalias() = ws_.q_den * ws_.k_den.transpose();
    for (std::size_t t = 0; t < tokens; ++t) {
      const auto seen_keys = static_cast<Eigen::Index>(ws_.visible[t]);
      // Weights exp(s_j - c_t) over the keys this token sees, relative to its
      // running offset c_t; what was summed before is rescaled when c_t grows.
      if (scaled && seen_keys > 0) {
        T c = ws_.offsets[t];
        for (Eigen::Index j = 0; j < seen_keys; ++j) c = std::max(c, ws_.log_scale[j]);
        if (ws_.offsets[t] != -std::numeric_limits<T>::infinity() && c != ws_.offsets[t]) {
          const T carried = std::exp(ws_.offsets[t] - c);
          for (std::size_t h = 0; h < group; ++h) {
            const auto r = static_cast<Eigen::Index>(t * group + h);
            ws_.num.row(r) *= carried;
            ws_.den[r] *= carried;
          }
        }
        ws_.offsets[t] = c;
        ws_.weights = (ws_.log_scale.head(seen_keys).array() - c).exp().matrix();
      }
      for (std::size_t h = 0; h < group; ++h) {
        const auto r = static_cast<Eigen::Index>(t * group + h);
        auto row = ws_.scores.row(r);
        if (scaled && seen_keys > 0) row.head(seen_keys).array() *= ws_.weights.transpose().array();
        row.tail(bn - seen_keys).setZero();
        if (plan_.map.eq19()) {
          auto den_row = ws_.den_scores.row(r);
          if (scaled && seen_keys > 0) den_row.head(seen_keys).array() *= ws_.weights.transpose().array();
          ws_.den[r] += den_row.head(seen_keys).sum();
        } else {
          ws_.den[r] += row.head(seen_keys).sum();
        }
      }
    }
    if (!ragged || ws_.values.allFinite()) {
      ws_.num.noalias() += ws_.scores * ws_.values;
      return;
    }
    // A masked key's value is not finite: each row sums its visible keys only.
    for (std::size_t t = 0; t < tokens; ++t) {
      const auto seen_keys = static_cast<Eigen::Index>(ws_.visible[t]);
      if (seen_keys == 0) continue;
      for (std::size_t h = 0; h < group; ++h) {
        const auto r = static_cast<Eigen::Index>(t * group + h);
        ws_.num.row(r).noalias() += ws_.scores.row(r).head(seen_keys) * ws_.values.topRows(seen_keys);
      }
    }
  }

  // Output rows of query tokens [a, b): num / g(den), or 0 for a query that
  // sees no key (seen[t] == 0, or all_see false when seen is null).
  void finish(std::size_t a, std::size_t b, const std::vector<unsigned char>* seen, bool all_see) {
    const std::size_t group = plan_.group;
    const T delta = static_cast<T>(o_.delta);
    const auto dv = static_cast<Eigen::Index>(v_.head_dim);
    for (std::size_t t = 0; t < b - a; ++t) {
      const bool sees = seen != nullptr ? (*seen)[t] != 0 : all_see;
      for (std::size_t h = 0; h < group; ++h) {
        const auto r = static_cast<Eigen::Index>(t * group + h);
        write_output_row(out_.row(order_.q[a + t], g_ * group + h), dv, ws_.num.row(r), guard(ws_.den[r], delta), sees);
      }
    }
  }

  const View<const T>& q_;
  const View<const T>& k_;
  const View<const T>& v_;
  const View<T>& out_;
  const LinearOptions& o_;
  const LinearPlan<T>& plan_;
  const TokenOrder& order_;
  LinearWorkspace<T>& ws_;
  // Tokens per chunk; a chunk option larger than the call is one chunk.
  std::size_t chunk_;
  std::size_t g_ = 0;
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
                  std::size_t dv, const LinearOptions& o, const LinearPlan<T>& plan) {
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
    if (s.features() != plan.features) {
      fail(fn, name + ".features()", {"the feature dimension ", plan.features}, s.features());
    }
    if (s.value_dim() != dv) fail(fn, name + ".value_dim()", {"v.head_dim = ", dv}, s.value_dim());
    for (std::size_t i = 0; i < lq; ++i) {
      if (plan.visibility.q_position(i) < s.last_position()) {
        fail(fn, {"the position of query token ", i},
             {">= the last key position in ", name, " (", s.last_position(), ")"}, plan.visibility.q_position(i));
      }
    }
  }
}

template <class T>
void linear_causal(const View<const T>& q, const View<const T>& k, const View<const T>& v, const View<T>& out,
                   const LinearOptions& o, const LinearPlan<T>& plan, const TokenOrder& order,
                   std::vector<LinearState<T>>* states);
template <class T>
void linear_full(const View<const T>& q, const View<const T>& k, const View<const T>& v, const View<T>& out,
                 const LinearOptions& o, const LinearPlan<T>& plan, const TokenOrder& order);

// The multi-head core, after the views are checked.
template <class T>
void linear_heads(const char* fn, const View<const T>& q, const View<const T>& k, const View<const T>& v,
                  const View<T>& out, const LinearOptions& o, FeatureMap<T> map, std::vector<LinearState<T>>* states) {
  LinearPlan<T> plan;
  plan.visibility = visibility_of(o);
  plan.group = q.heads / k.heads;
  plan.features = map.features(q.head_dim);
  plan.map = map;
  if (states != nullptr) check_states(fn, *states, q.tokens, k.heads, v.head_dim, o, plan);
  const TokenOrder order = order_tokens(plan.visibility, q.tokens, k.tokens);
  if (o.mask.causal) {
    linear_causal(q, k, v, out, o, plan, order, states);
  } else {
    linear_full(q, k, v, out, o, plan, order);
  }
}

// Causal: one prefix sum per key/value head, carried in its LinearState.
template <class T>
void linear_causal(const View<const T>& q, const View<const T>& k, const View<const T>& v, const View<T>& out,
                   const LinearOptions& o, const LinearPlan<T>& plan, const TokenOrder& order,
                   std::vector<LinearState<T>>* states) {
  std::vector<LinearState<T>> local;
  std::vector<LinearState<T>>& sums = states != nullptr ? *states : local;
  if (sums.empty()) sums.assign(k.heads, LinearState<T>(plan.features, v.head_dim, o.delta));
  const std::size_t workers = std::max<std::size_t>(1, std::min(o.threads.shares(), k.heads));
  std::vector<LinearWorkspace<T>> workspaces(workers);
  parallel_for(k.heads, workers, o.threads.executor, [&](std::size_t g, std::size_t w) {
    LinearHead<T>(q, k, v, out, o, plan, order, workspaces[w]).causal(g, sums[g]);
  });
}

// Not causal: the sums of each (head, segment), then the queries in blocks.
template <class T>
void linear_full(const View<const T>& q, const View<const T>& k, const View<const T>& v, const View<T>& out,
                 const LinearOptions& o, const LinearPlan<T>& plan, const TokenOrder& order) {
  const std::size_t m = plan.features, dv = v.head_dim;
  const std::size_t workers_wanted = o.threads.shares();
  const std::size_t segments = order.q_segment.size() - 1;
  std::vector<LinearState<T>> sums(k.heads * segments, LinearState<T>(m, dv, o.delta));
  {
    const std::size_t workers = std::max<std::size_t>(1, std::min(workers_wanted, sums.size()));
    std::vector<LinearWorkspace<T>> workspaces(workers);
    parallel_for(sums.size(), workers, o.threads.executor, [&](std::size_t item, std::size_t w) {
      const std::size_t g = item / segments, s = item % segments;
      LinearHead<T>(q, k, v, out, o, plan, order, workspaces[w])
          .sum_keys(g, order.k_segment[s], order.k_segment[s + 1], sums[item]);
    });
  }
  struct Block {
    std::size_t g, segment, a, b;
  };
  std::vector<Block> blocks;
  const std::size_t chunk = std::min(o.chunk, std::max<std::size_t>(q.tokens, 1));
  for (std::size_t g = 0; g < k.heads; ++g) {
    for (std::size_t s = 0; s < segments; ++s) {
      for (std::size_t a = order.q_segment[s]; a < order.q_segment[s + 1]; a += chunk) {
        blocks.push_back({g, s, a, std::min(order.q_segment[s + 1], a + chunk)});
      }
    }
  }
  const std::size_t workers = std::max<std::size_t>(1, std::min(workers_wanted, blocks.size()));
  std::vector<LinearWorkspace<T>> workspaces(workers);
  parallel_for(blocks.size(), workers, o.threads.executor, [&](std::size_t i, std::size_t w) {
    const Block& blk = blocks[i];
    const bool any_keys = order.k_segment[blk.segment + 1] > order.k_segment[blk.segment];
    LinearHead<T>(q, k, v, out, o, plan, order, workspaces[w])
        .read_queries(blk.g, blk.a, blk.b, sums[blk.g * segments + blk.segment], any_keys);
  });
}

// The one-head matrix overloads: views over the matrices, then the core.
template <class T>
Matrix<T> linear_matrices(const char* fn, const ConstRef<T>& q, const ConstRef<T>& k, const ConstRef<T>& v,
                          const FavorFeatures* phi, const Rotation<T>& pre_phi, const Rotation<T>* feature_rotation,
                          const LinearOptions& o) {
  if (k.cols() != q.cols()) fail(fn, "k.cols()", {"q.cols() = ", q.cols()}, k.cols());
  if (v.rows() != k.rows()) fail(fn, "v.rows()", {"k.rows() = ", k.rows()}, v.rows());
  if (v.cols() == 0) fail(fn, "v.cols()", "at least 1", v.cols());
  const auto lq = static_cast<std::size_t>(q.rows()), lk = static_cast<std::size_t>(k.rows());
  check_linear_options(fn, o, lq, lk);
  const FeatureMap<T> map =
      check_feature_map(fn, phi, static_cast<std::size_t>(q.cols()), pre_phi, feature_rotation, o, lq, lk);
  Matrix<T> out = Matrix<T>::Zero(q.rows(), v.cols());
  if (lq == 0) return out;
  const View<T> out_view = matrix_view<T>(out.data(), out.rows(), out.cols(), out.cols());
  linear_heads<T>(fn, matrix_view(q), matrix_view(k), matrix_view(v), out_view, o, map, nullptr);
  return out;
}

template <class T>
void linear_views(const char* fn, const View<const T>& q, const View<const T>& k, const View<const T>& v,
                  const View<T>& out, const FavorFeatures* phi, const Rotation<T>& pre_phi,
                  const Rotation<T>* feature_rotation, const LinearOptions& o, std::vector<LinearState<T>>* states) {
  check_scalar<T>();
  check_heads(fn, q, k, v, out);
  check_linear_options(fn, o, q.tokens, k.tokens);
  const FeatureMap<T> map = check_feature_map(fn, phi, q.head_dim, pre_phi, feature_rotation, o, q.tokens, k.tokens);
  linear_heads<T>(fn, q, k, v, out, o, map, states);
}

}  // namespace rope::attention::detail
