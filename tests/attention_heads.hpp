// Multi-head tensors for the attention tests: [tokens, heads, dim] buffers
// with their views, and one head of them as an oracle matrix.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include <rope/attention.hpp>

#include "attention_oracle.hpp"

namespace attention_test {

template <class T>
struct Heads {
  std::size_t tokens, heads, dim;
  std::vector<T> data;

  Heads(std::size_t tokens_, std::size_t heads_, std::size_t dim_, std::uint32_t seed, double scale = 1.0)
      : tokens(tokens_), heads(heads_), dim(dim_), data(tokens_ * heads_ * dim_) {
    std::mt19937 gen(seed);
    std::normal_distribution<double> dist(0.0, scale);
    for (auto& x : data) x = static_cast<T>(dist(gen));
  }
  static Heads filled(std::size_t tokens, std::size_t heads, std::size_t dim, T value) {
    Heads h(tokens, heads, dim, 0);
    std::fill(h.data.begin(), h.data.end(), value);
    return h;
  }

  rope::View<T> view() { return rope::View<T>::token_major(data.data(), tokens, heads, dim); }
  rope::View<const T> view() const { return rope::View<const T>::token_major(data.data(), tokens, heads, dim); }
  T& at(std::size_t t, std::size_t h, std::size_t c) { return data[(t * heads + h) * dim + c]; }
  T at(std::size_t t, std::size_t h, std::size_t c) const { return data[(t * heads + h) * dim + c]; }

  // Head h as a one-head matrix (a row per token).
  rope::attention::Matrix<T> head(std::size_t h) const {
    rope::attention::Matrix<T> m(static_cast<Eigen::Index>(tokens), static_cast<Eigen::Index>(dim));
    for (std::size_t t = 0; t < tokens; ++t) {
      for (std::size_t c = 0; c < dim; ++c) m(Eigen::Index(t), Eigen::Index(c)) = at(t, h, c);
    }
    return m;
  }
  Mat head_ld(std::size_t h) const { return to_ld(head(h)); }
};

// Bytes of two buffers equal.
template <class T>
bool same_bytes(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// A grouped-query layer for the linear cases: tensors, FAVOR+ features and
// the tables of both rotations (d channels pre-phi, m features for eq. 19).
template <class T>
struct LinearCase {
  static constexpr std::size_t l = 23, hq = 4, hk = 2, d = 8, dv = 4, m = 16;
  const rope::Table<T> table{rope::frequencies(d, 10000.0), 64};
  const rope::Table<T> feature_table{rope::frequencies(m, 10000.0), 64};
  const Heads<T> q, k, v;
  const rope::attention::FavorFeatures phi{d, features(m)};

  explicit LinearCase(std::uint32_t seed) : q(l, hq, d, seed), k(l, hk, d, seed + 1), v(l, hk, dv, seed + 2) {}
  static rope::attention::FavorOptions features(std::size_t count) {
    rope::attention::FavorOptions fo;
    fo.features = count;
    return fo;
  }
};

}  // namespace attention_test
