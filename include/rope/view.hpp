// rope/view.hpp — strided [tokens, heads, head_dim] tensors, the views of a
// fused QKV projection.
//
// A View<T> is a strided tensor whose head_dim channels of one head vector
// are contiguous; token_stride and head_stride are in elements, so
// [tokens, heads, head_dim], [heads, tokens, head_dim], a KV cache
// [capacity, kv_heads, head_dim] read as its first tokens, and slices of a
// packed QKV buffer are all views. Element (t, h, c) is at
// data[t * token_stride + h * head_stride + c].
//
// The checks every checked call makes on views are in tensor/view_checks.hpp.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>

#include "detail/inline.hpp"

namespace rope {

template <class T>
struct View {
  T* data = nullptr;
  std::size_t tokens = 0;
  std::size_t heads = 0;
  std::size_t head_dim = 0;
  std::size_t token_stride = 0;
  std::size_t head_stride = 0;

  constexpr View() noexcept = default;
  constexpr View(T* data_, std::size_t tokens_, std::size_t heads_, std::size_t head_dim_, std::size_t token_stride_,
                 std::size_t head_stride_) noexcept
      : data(data_),
        tokens(tokens_),
        heads(heads_),
        head_dim(head_dim_),
        token_stride(token_stride_),
        head_stride(head_stride_) {}
  // A read-only view of a writable one.
  template <class U, std::enable_if_t<std::is_same<const U, T>::value && !std::is_same<U, T>::value, int> = 0>
  constexpr View(const View<U>& v) noexcept  // NOLINT: implicit on purpose, like T* -> const T*
      : View(v.data, v.tokens, v.heads, v.head_dim, v.token_stride, v.head_stride) {}

  // Memory laid out as [tokens, heads, head_dim] (what a Q/K projection writes).
  static constexpr View token_major(T* data, std::size_t tokens, std::size_t heads, std::size_t head_dim) noexcept {
    return View(data, tokens, heads, head_dim, heads * head_dim, head_dim);
  }
  // Memory laid out as [heads, tokens, head_dim] (after a transpose to heads first).
  static constexpr View head_major(T* data, std::size_t tokens, std::size_t heads, std::size_t head_dim) noexcept {
    return View(data, tokens, heads, head_dim, head_dim, tokens * head_dim);
  }
  // Heads first_head .. first_head+heads-1 of a [tokens, total_heads, head_dim]
  // buffer, e.g. the K part of a fused QKV projection.
  static constexpr View packed(T* base, std::size_t tokens, std::size_t total_heads, std::size_t first_head,
                               std::size_t heads, std::size_t head_dim) noexcept {
    return View(base + first_head * head_dim, tokens, heads, head_dim, total_heads * head_dim, head_dim);
  }

  // Forced inline, like Positions::at (detail/inline.hpp).
  ROPE_ALWAYS_INLINE T* row(std::size_t t, std::size_t h) const noexcept {
    return data + t * token_stride + h * head_stride;
  }

  // Tokens first .. first+count-1 (unchecked: first + count <= tokens), e.g.
  // the part of a KV cache a decode step writes.
  constexpr View slice_tokens(std::size_t first, std::size_t count) const noexcept {
    return View(data + first * token_stride, count, heads, head_dim, token_stride, head_stride);
  }
  // Heads first .. first+count-1 (unchecked: first + count <= heads).
  constexpr View slice_heads(std::size_t first, std::size_t count) const noexcept {
    return View(data + first * head_stride, tokens, count, head_dim, token_stride, head_stride);
  }
};

// The Q, K and V views of a fused projection output [tokens, q_heads + 2 *
// kv_heads, head_dim] (Q heads, then K heads, then V heads per token).
template <class T>
struct QkvViews {
  View<T> q, k, v;
};
template <class T>
constexpr QkvViews<T> split_qkv(T* qkv, std::size_t tokens, std::size_t q_heads, std::size_t kv_heads,
                                std::size_t head_dim) noexcept {
  const std::size_t total = q_heads + 2 * kv_heads;
  return {View<T>::packed(qkv, tokens, total, 0, q_heads, head_dim),
          View<T>::packed(qkv, tokens, total, q_heads, kv_heads, head_dim),
          View<T>::packed(qkv, tokens, total, q_heads + kv_heads, kv_heads, head_dim)};
}

namespace detail {

template <class T>
struct TypeIdentity {
  using type = T;
};
// Keeps a parameter out of template argument deduction, so that a View<T>
// converts to the View<const T> a read-only parameter asks for.
template <class T>
using type_identity_t = typename TypeIdentity<T>::type;

}  // namespace detail
}  // namespace rope
