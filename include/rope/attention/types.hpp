// rope/attention/types.hpp — the matrix types of the attention module's
// one-head and multi-head calls (softmax.hpp, linear.hpp), and how RoPE is
// asked for (Rotation, rotation.hpp).
//
// Layout: one batch x head is a matrix with one token per row (Lq x d for Q,
// Lk x d for K, Lk x dv for V). The public functions take any Eigen
// expression; they bind it to a row-major Ref with an outer stride, so
// row-major matrices and Maps over strided token rows are read in place and
// column-major ones are copied once. Results are row-major Matrix<T>. The
// multi-head functions take rope::View tensors [tokens, heads, head_dim]
// (view.hpp) and write straight into the caller's output view.
#pragma once

#include <algorithm>
#include <cstddef>
#include <type_traits>

#include <Eigen/Core>

#include "../detail/fail.hpp"
#include "../view.hpp"
#include "rotation.hpp"

namespace rope::attention {

template <class T>
using Matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using Vector = Eigen::Matrix<T, Eigen::Dynamic, 1>;
// A read-only row-major view of a matrix whose rows may be strided.
template <class T>
using ConstRef = Eigen::Ref<const Matrix<T>, 0, Eigen::OuterStride<>>;

namespace detail {

using rope::detail::fail;
using rope::detail::indexed;
using rope::detail::to_text;

template <class T>
constexpr void check_scalar() noexcept {
  static_assert(std::is_same<T, float>::value || std::is_same<T, double>::value,
                "rope::attention: the scalar type must be float or double");
}

template <class A, class B>
constexpr void check_same_scalar() noexcept {
  static_assert(std::is_same<typename A::Scalar, typename B::Scalar>::value,
                "rope::attention: every matrix argument must have the same scalar type");
}

// A row-major map over strided rows: `rows` rows of `cols` values, row r at data + r * stride.
template <class T>
using RowsMap = Eigen::Map<Matrix<T>, Eigen::Unaligned, Eigen::OuterStride<>>;
template <class T>
using ConstRowsMap = Eigen::Map<const Matrix<T>, Eigen::Unaligned, Eigen::OuterStride<>>;

// A view over a one-head matrix: row i is token i.
template <class T>
View<T> matrix_view(T* data, Eigen::Index rows, Eigen::Index cols, Eigen::Index stride) noexcept {
  return View<T>(data, static_cast<std::size_t>(rows), 1, static_cast<std::size_t>(cols),
                 static_cast<std::size_t>(rows > 1 ? stride : cols), static_cast<std::size_t>(cols));
}
template <class T>
View<const T> matrix_view(const ConstRef<T>& m) noexcept {
  return matrix_view<const T>(m.data(), m.rows(), m.cols(), m.outerStride());
}

}  // namespace detail
}  // namespace rope::attention
