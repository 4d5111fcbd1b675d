// rope/permute.hpp — converting a checkpoint between the two pairings.
//
// block_diagonal rotates channels (2p, 2p+1) together, rotate_half (p, p+r/2).
// Reordering the output rows of the Q and K projections by the permutation
// 2p -> p, 2p+1 -> p + r/2 turns a model trained with one pairing into the
// same model with the other: every attention score is unchanged, because
// RoPE of the permuted vector is the permuted RoPE of the vector.
//
// Layout: a projection weight is row-major [heads * head_dim, in_features]
// (a bias is the case in_features = 1); channels past rotary_dim stay put.
#pragma once

#include <cstddef>
#include <cstring>
#include <type_traits>
#include <vector>

#include "detail/fail.hpp"

namespace rope {

namespace detail {

// new_row[to(i)] = old_row[i] within the rotary part of every head.
template <class T, class To>
void permute_rows(const char* fn, T* weight, std::size_t heads, std::size_t head_dim, std::size_t in_features,
                  std::size_t rotary_dim, To to) {
  static_assert(std::is_trivially_copyable<T>::value, "permute: T must be trivially copyable");
  if (weight == nullptr) fail(fn, "weight", "non-null", nullptr);
  if (head_dim == 0) fail(fn, "head_dim", "at least 1", head_dim);
  if (in_features == 0) fail(fn, "in_features", "at least 1", in_features);
  const std::size_t r = rotary_dim == 0 ? head_dim : rotary_dim;
  if (r % 2 != 0) fail(fn, "rotary_dim", "even", r);
  if (r > head_dim) fail(fn, "rotary_dim", {"<= head_dim ", head_dim}, r);
  std::vector<T> old(r * in_features);
  for (std::size_t h = 0; h < heads; ++h) {
    T* head = weight + h * head_dim * in_features;
    std::memcpy(old.data(), head, old.size() * sizeof(T));
    for (std::size_t i = 0; i < r; ++i) {
      std::memcpy(head + to(i, r) * in_features, old.data() + i * in_features, in_features * sizeof(T));
    }
  }
}

}  // namespace detail

// Reorders the rows of a Q or K projection weight (row-major
// [heads * head_dim, in_features]; a bias is the case in_features = 1) from
// the block_diagonal pairing (2p, 2p+1) to rotate_half (p, p + r/2): after it,
// rotating the projection's output with rotate_half gives the same vectors,
// permuted, as block_diagonal on the original — and the same attention scores.
// Channels past rotary_dim (0: head_dim) stay where they are.
template <class T>
void permute_to_rotate_half(T* weight, std::size_t heads, std::size_t head_dim, std::size_t in_features,
                            std::size_t rotary_dim = 0) {
  detail::permute_rows("rope::permute_to_rotate_half", weight, heads, head_dim, in_features, rotary_dim,
                       [](std::size_t i, std::size_t r) { return i % 2 == 0 ? i / 2 : r / 2 + i / 2; });
}

// The inverse: rows from rotate_half (p, p + r/2) to block_diagonal (2p, 2p+1).
template <class T>
void permute_to_block_diagonal(T* weight, std::size_t heads, std::size_t head_dim, std::size_t in_features,
                               std::size_t rotary_dim = 0) {
  detail::permute_rows("rope::permute_to_block_diagonal", weight, heads, head_dim, in_features, rotary_dim,
                       [](std::size_t i, std::size_t r) { return i < r / 2 ? 2 * i : 2 * (i - r / 2) + 1; });
}

}  // namespace rope
