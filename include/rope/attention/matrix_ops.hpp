// rope/attention/matrix_ops.hpp — what the one-head and multi-head calls do
// to the rows of their Eigen matrices: RoPE at each row's position (through
// rotation.hpp's rotate_at), the online softmax's shifts, the guard of
// linear attention's denominators, and the one writer of output rows.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include <Eigen/Core>

#include "rotation.hpp"
#include "types.hpp"

namespace rope::attention::detail {

// Rotates every row (token) of x in place, row r at position positions[r]
// (already checked against the table); channels past rotary_dim stay.
template <class T>
void rotate_rows_at(Matrix<T>& x, const Rotation<T>& rotation, std::size_t rotary_dim,
                    const std::int64_t* positions) noexcept {
  if (rotation.table == nullptr || rotary_dim == 0) return;
  for (Eigen::Index r = 0; r < x.rows(); ++r) {
    T* row = x.row(r).data();
    rotate_at(rotation, rotary_dim, static_cast<std::size_t>(positions[r]), row, row, 0, 1,
              static_cast<std::size_t>(x.cols()));
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

// Writes one output row of dv values to dst: numerator / denominator, or
// zeros for a query that sees no key (never 0/0: a row that sees nothing is
// 0, a NaN that it sees stays NaN).
template <class T, class Row>
void write_output_row(T* dst, Eigen::Index dv, const Row& numerator, T denominator, bool sees) {
  Eigen::Map<Eigen::Matrix<T, 1, Eigen::Dynamic>> out(dst, dv);
  if (sees) {
    out = numerator / denominator;
  } else {
    out.setZero();
  }
}

}  // namespace rope::attention::detail
