// rope/attention/linear_head.hpp — the machinery of linear attention
// (linear.hpp): one key/value head's chunked sums (LinearHead), and the
// split of heads, segments and query blocks across threads (or the
// caller's executor). What a call computes with, checked: linear_params.hpp.
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
#include "linear_params.hpp"
#include "linear_state.hpp"

namespace rope::attention::detail {

using rope::detail::parallel_for;

// One key/value head of a multi-head call: gathers rows in token order,
// computes features chunk by chunk and the outputs of its query heads.
template <class T>
class LinearHead {
 public:
  LinearHead(const View<const T>& q, const View<const T>& k, const View<const T>& v, const View<T>& out,
             const LinearOptions& o, const LinearParams<T>& params, const TokenOrder& order, LinearWorkspace<T>& ws)
      : q_(q),
        k_(k),
        v_(v),
        out_(out),
        o_(o),
        params_(params),
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
    const Matrix<T>& q_den = params_.map.eq19() ? ws_.q_den : ws_.q_num;
    ws_.num.noalias() = ws_.q_num * state.key_value_sum();
    ws_.den.noalias() = q_den * state.key_sum();
    finish(a, b, nullptr, any_keys);
  }

 private:
  const Matrix<T>& key_den() const { return params_.map.eq19() ? ws_.k_den : ws_.k_num; }

  // Rows of query tokens [a, b) of the sorted order, every head of the group,
  // token-major; their features in q_num / q_den.
  void gather_queries(std::size_t a, std::size_t b) {
    const std::size_t group = params_.group, n = b - a;
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
    params_.map.queries(ws_.x, ws_.pos.data(), ws_.q_num, ws_.q_den);
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
    params_.map.keys(ws_.x, order_.k_pos.data() + a, o_.mask.causal, ws_.k_num, ws_.k_den, ws_.log_scale);
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
      const Matrix<T>& q_den = params_.map.eq19() ? ws_.q_den : ws_.q_num;
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
    const std::size_t group = params_.group, n = j1 - j0;
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
    if (params_.map.eq19()) ws_.den_scores.noalias() = ws_.q_den * ws_.k_den.transpose();
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
        if (params_.map.eq19()) {
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
    const std::size_t group = params_.group;
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
  const LinearParams<T>& params_;
  const TokenOrder& order_;
  LinearWorkspace<T>& ws_;
  // Tokens per chunk; a chunk option larger than the call is one chunk.
  std::size_t chunk_;
  std::size_t g_ = 0;
};

template <class T>
void linear_causal(const View<const T>& q, const View<const T>& k, const View<const T>& v, const View<T>& out,
                   const LinearOptions& o, const LinearParams<T>& params, const TokenOrder& order,
                   std::vector<LinearState<T>>* states);
template <class T>
void linear_full(const View<const T>& q, const View<const T>& k, const View<const T>& v, const View<T>& out,
                 const LinearOptions& o, const LinearParams<T>& params, const TokenOrder& order);

// The multi-head core, after the views are checked.
template <class T>
void linear_heads(const char* fn, const View<const T>& q, const View<const T>& k, const View<const T>& v,
                  const View<T>& out, const LinearOptions& o, FeatureMap<T> map, std::vector<LinearState<T>>* states) {
  LinearParams<T> params;
  params.visibility = visibility_of(o);
  params.group = q.heads / k.heads;
  params.features = map.features(q.head_dim);
  params.map = map;
  if (states != nullptr) check_states(fn, *states, q.tokens, k.heads, v.head_dim, o, params);
  const TokenOrder order = order_tokens(params.visibility, q.tokens, k.tokens);
  if (o.mask.causal) {
    linear_causal(q, k, v, out, o, params, order, states);
  } else {
    linear_full(q, k, v, out, o, params, order);
  }
}

// Causal: one prefix sum per key/value head, carried in its LinearState.
template <class T>
void linear_causal(const View<const T>& q, const View<const T>& k, const View<const T>& v, const View<T>& out,
                   const LinearOptions& o, const LinearParams<T>& params, const TokenOrder& order,
                   std::vector<LinearState<T>>* states) {
  std::vector<LinearState<T>> local;
  std::vector<LinearState<T>>& sums = states != nullptr ? *states : local;
  if (sums.empty()) sums.assign(k.heads, LinearState<T>(params.features, v.head_dim, o.delta));
  const std::size_t workers = std::max<std::size_t>(1, std::min(o.threads.shares(), k.heads));
  std::vector<LinearWorkspace<T>> workspaces(workers);
  parallel_for(k.heads, workers, o.threads.executor, [&](std::size_t g, std::size_t w) {
    LinearHead<T>(q, k, v, out, o, params, order, workspaces[w]).causal(g, sums[g]);
  });
}

// Not causal: the sums of each (head, segment), then the queries in blocks.
template <class T>
void linear_full(const View<const T>& q, const View<const T>& k, const View<const T>& v, const View<T>& out,
                 const LinearOptions& o, const LinearParams<T>& params, const TokenOrder& order) {
  const std::size_t m = params.features, dv = v.head_dim;
  const std::size_t workers_wanted = o.threads.shares();
  const std::size_t segments = order.q_segment.size() - 1;
  std::vector<LinearState<T>> sums(k.heads * segments, LinearState<T>(m, dv, o.delta));
  {
    const std::size_t workers = std::max<std::size_t>(1, std::min(workers_wanted, sums.size()));
    std::vector<LinearWorkspace<T>> workspaces(workers);
    parallel_for(sums.size(), workers, o.threads.executor, [&](std::size_t item, std::size_t w) {
      const std::size_t g = item / segments, s = item % segments;
      LinearHead<T>(q, k, v, out, o, params, order, workspaces[w])
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
    LinearHead<T>(q, k, v, out, o, params, order, workspaces[w])
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
