// rope/attention/common.hpp — what every attention header shares: the matrix
// types, RoPE inside attention (rotate Q and K, never V), positions, checks.
//
//   q_i -> R_(pq_i) q_i,  k_j -> R_(pk_j) k_j   (R_p: the library's rotation)
//
// Layout: one batch x head is a matrix with one token per row (Lq x d for Q,
// Lk x d for K, Lk x dv for V). The public functions take any Eigen
// expression; they bind it to a row-major Ref with an outer stride, so
// row-major matrices and Maps over strided token rows are read in place and
// column-major ones are copied once. Results are row-major Matrix<T>.
// Positions are std::int64_t, one per row; an empty vector means 0 .. L-1.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <Eigen/Core>

#include "../kernels.hpp"
#include "../view.hpp"
#include "../style.hpp"
#include "../table.hpp"

namespace rope::attention {

template <class T>
using Matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using Vector = Eigen::Matrix<T, Eigen::Dynamic, 1>;
// A read-only row-major view of a matrix whose rows may be strided.
template <class T>
using ConstRef = Eigen::Ref<const Matrix<T>, 0, Eigen::OuterStride<>>;

// RoPE inside attention: which table, which pairing, how many channels.
// table == nullptr: no rotation. rotary_dim 0 means the table's; the
// channels past it pass through.
template <class T>
struct Rotation {
  const Table<T>* table = nullptr;
  Style style = Style::rotate_half;
  std::size_t rotary_dim = 0;
};

namespace detail {

[[noreturn]] inline void fail(const char* fn, const std::string& what) {
  throw std::invalid_argument(std::string(fn) + ": " + what);
}

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

inline std::string shape(std::ptrdiff_t rows, std::ptrdiff_t cols) {
  return std::to_string(rows) + " x " + std::to_string(cols);
}

// Position of row i: positions[i], or i when positions is empty.
inline std::int64_t position_at(const std::vector<std::int64_t>& positions, std::size_t i) noexcept {
  return positions.empty() ? static_cast<std::int64_t>(i) : positions[i];
}

inline void check_positions_size(const char* fn, const char* name, const std::vector<std::int64_t>& positions,
                                 std::size_t rows) {
  if (!positions.empty() && positions.size() != rows) {
    fail(fn, std::string(name) + ".size() is " + std::to_string(positions.size()) + " but there are " +
                 std::to_string(rows) + " rows");
  }
}

// The rotary width a Rotation asks for, checked against the head dimension.
template <class T>
std::size_t rotary_width(const char* fn, const Rotation<T>& rope, std::size_t head_dim) {
  if (rope.table == nullptr) return 0;
  const std::size_t r = rope.rotary_dim == 0 ? rope.table->rotary_dim() : rope.rotary_dim;
  if (r % 2 != 0) fail(fn, "rope.rotary_dim must be even, got " + std::to_string(r));
  if (r > rope.table->rotary_dim()) {
    fail(fn, "rope.rotary_dim " + std::to_string(r) + " exceeds the table's rotary_dim " +
                 std::to_string(rope.table->rotary_dim()));
  }
  if (r > head_dim) {
    fail(fn, "rope.rotary_dim " + std::to_string(r) + " exceeds the head dimension " + std::to_string(head_dim));
  }
  return r;
}

// Positions must index the table's rows (std::out_of_range, like rope::apply).
template <class T>
void check_table_positions(const char* fn, const char* name, const Rotation<T>& rope,
                           const std::vector<std::int64_t>& positions, std::size_t rows) {
  if (rope.table == nullptr) return;
  const auto limit = rope.table->positions();
  for (std::size_t i = 0; i < rows; ++i) {
    const std::int64_t p = position_at(positions, i);
    if (p < 0 || static_cast<std::uint64_t>(p) >= limit) {
      throw std::out_of_range(std::string(fn) + ": " + name + "[" + std::to_string(i) + "] is " +
                              std::to_string(p) + ", outside the table's positions [0, " + std::to_string(limit) +
                              ")");
    }
  }
}

// Rotates every row (token) of x in place by its position (already checked); row i
// of x is token first + i.
template <class T>
void rotate_matrix(Matrix<T>& x, const Rotation<T>& rope, std::size_t rotary_dim,
                 const std::vector<std::int64_t>& positions, Eigen::Index first = 0) {
  if (rope.table == nullptr || rotary_dim == 0) return;
  for (Eigen::Index i = 0; i < x.rows(); ++i) {
    const auto p = static_cast<std::size_t>(position_at(positions, static_cast<std::size_t>(first + i)));
    T* row = x.row(i).data();
    if (rope.style == Style::rotate_half) {
      rope::rotate<Style::rotate_half, T>(row, row, rope.table->cos(p), rope.table->sin(p), rotary_dim);
    } else {
      rope::rotate<Style::block_diagonal, T>(row, row, rope.table->cos(p), rope.table->sin(p), rotary_dim);
    }
  }
}

// x_i <- x_i - c_i for every row i, or exp(x_i - c_i) when exponentiate: a
// row of a row-major matrix is contiguous, where a colwise() broadcast would
// walk the columns with a stride of a whole row.
template <class Derived, class V>
void shift_rows(Eigen::MatrixBase<Derived>& x, const V& c, bool exponentiate) {
  for (Eigen::Index i = 0; i < x.rows(); ++i) {
    if (exponentiate) {
      x.row(i) = (x.row(i).array() - c[i]).exp().matrix();
    } else {
      x.row(i).array() -= c[i];
    }
  }
}

// The guard that keeps a denominator away from 0: g(r) = r + 2 delta [|r| <= delta].
template <class T>
T guard(T r, T delta) noexcept {
  return std::abs(r) <= delta ? r + 2 * delta : r;
}

}  // namespace detail
}  // namespace rope::attention
