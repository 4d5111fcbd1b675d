// rope/attention/common.hpp — what every attention header shares: the matrix
// types, RoPE inside attention (rotate Q and K, never V), which keys a query
// sees (causal, sliding window, sequence ids, all by position) and the
// checks.
//
//   q_i -> R_(pq_i) q_i,  k_j -> R_(pk_j) k_j   (R_p: the library's rotation)
//   key j is visible to query i iff  (not causal or pk_j <= pq_i)
//                                and (window == 0 or pk_j > pq_i - window)
//                                and (no sequence ids or sq_i == sk_j)
//
// Layout: one batch x head is a matrix with one token per row (Lq x d for Q,
// Lk x d for K, Lk x dv for V). The public functions take any Eigen
// expression; they bind it to a row-major Ref with an outer stride, so
// row-major matrices and Maps over strided token rows are read in place and
// column-major ones are copied once. Results are row-major Matrix<T>. The
// multi-head functions take rope::View tensors [tokens, heads, head_dim]
// (view.hpp) and write straight into the caller's output view.
// Positions and sequence ids are std::int64_t, one per row; empty position
// vectors mean offset + 0 .. L-1.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <Eigen/Core>

#include "../detail/error.hpp"
#include "../detail/parallel.hpp"
#include "../kernels.hpp"
#include "../style.hpp"
#include "../table.hpp"
#include "../view.hpp"

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

using rope::detail::fail;
using rope::detail::indexed;
using rope::detail::parallel_for;
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

// Rows and block sizes leave size_t for Eigen::Index (signed): a count no
// matrix can have is clamped to the rows there are, never wrapped negative.
inline Eigen::Index index_of(std::size_t n, std::size_t limit) noexcept {
  return static_cast<Eigen::Index>(std::min(n, std::max<std::size_t>(limit, 1)));
}

// A row-major map over strided rows: `rows` rows of `cols` values, row r at data + r * stride.
template <class T>
using RowsMap = Eigen::Map<Matrix<T>, Eigen::Unaligned, Eigen::OuterStride<>>;
template <class T>
using ConstRowsMap = Eigen::Map<const Matrix<T>, Eigen::Unaligned, Eigen::OuterStride<>>;

// Which keys each query sees, by position and sequence (see the header
// comment). Positions are ids[i] when given, else offset + i.
struct Visibility {
  bool causal = false;
  std::size_t window = 0;  // 0: no window
  const std::int64_t* q_ids = nullptr;
  const std::int64_t* k_ids = nullptr;
  std::int64_t q_offset = 0, k_offset = 0;
  const std::int64_t* q_sequence = nullptr;  // null: one sequence
  const std::int64_t* k_sequence = nullptr;

  std::int64_t q_position(std::size_t i) const noexcept {
    return q_ids ? q_ids[i] : q_offset + static_cast<std::int64_t>(i);
  }
  std::int64_t k_position(std::size_t j) const noexcept {
    return k_ids ? k_ids[j] : k_offset + static_cast<std::int64_t>(j);
  }
  std::int64_t q_seq(std::size_t i) const noexcept { return q_sequence ? q_sequence[i] : 0; }
  std::int64_t k_seq(std::size_t j) const noexcept { return k_sequence ? k_sequence[j] : 0; }
  bool masks() const noexcept { return causal || window != 0 || q_sequence != nullptr; }

  // pq - pk < window without overflow: the difference of two int64 can
  // leave the range, its unsigned form (pq >= pk here) cannot.
  bool in_window(std::int64_t pq, std::int64_t pk) const noexcept {
    if (window == 0 || pk > pq) return true;
    return static_cast<std::uint64_t>(pq) - static_cast<std::uint64_t>(pk) < window;
  }
  bool visible(std::size_t i, std::size_t j) const noexcept {
    const std::int64_t pq = q_position(i), pk = k_position(j);
    if (causal && pk > pq) return false;
    if (!in_window(pq, pk)) return false;
    return q_seq(i) == k_seq(j);
  }

  // Whether the keys are ordered by (sequence, position): then every
  // query sees one contiguous range of keys, found by binary search.
  bool keys_sorted(std::size_t lk) const noexcept {
    for (std::size_t j = 1; j < lk; ++j) {
      const std::int64_t s0 = k_seq(j - 1), s1 = k_seq(j);
      if (s1 < s0 || (s1 == s0 && k_position(j) < k_position(j - 1))) return false;
    }
    return true;
  }
  // Keys [lo, hi) visible to query i when keys_sorted().
  void range(std::size_t i, std::size_t lk, std::size_t& lo, std::size_t& hi) const noexcept {
    const std::int64_t s = q_seq(i), pq = q_position(i);
    // First key of (sequence s, position > pq - window), then first key past
    // (s, pq) when causal or past sequence s otherwise.
    std::size_t a = 0, b = lk;
    while (a < b) {
      const std::size_t mid = a + (b - a) / 2;
      const std::int64_t sm = k_seq(mid);
      const bool before = sm < s || (sm == s && !in_window(pq, k_position(mid)) && k_position(mid) <= pq);
      if (before) a = mid + 1; else b = mid;
    }
    lo = a;
    b = lk;
    while (a < b) {
      const std::size_t mid = a + (b - a) / 2;
      const std::int64_t sm = k_seq(mid);
      const bool inside = sm < s || (sm == s && (!causal || k_position(mid) <= pq));
      if (inside) a = mid + 1; else b = mid;
    }
    hi = a;
  }
};

// The positions, sequence ids and causality of a softmax or linear call's
// options (anything with those fields); the window is softmax's own.
template <class Options>
Visibility visibility_of(const Options& o) noexcept {
  Visibility vis;
  vis.causal = o.causal;
  vis.q_ids = o.q_positions.empty() ? nullptr : o.q_positions.data();
  vis.k_ids = o.k_positions.empty() ? nullptr : o.k_positions.data();
  vis.q_offset = o.q_offset;
  vis.k_offset = o.k_offset;
  vis.q_sequence = o.q_sequence.empty() ? nullptr : o.q_sequence.data();
  vis.k_sequence = o.k_sequence.empty() ? nullptr : o.k_sequence.data();
  return vis;
}

// Positions must index the table's rows (rope::out_of_range, like rope::apply).
template <class T>
void check_table_positions(const char* fn, const char* name, const Table<T>* table, const std::int64_t* ids,
                           std::int64_t offset, std::size_t rows) {
  if (table == nullptr || rows == 0) return;
  const auto limit = table->positions();
  const std::string range = "in the table's positions [0, " + to_text(limit) + ")";
  if (ids == nullptr) {
    const auto last = static_cast<std::uint64_t>(offset) + (rows - 1);
    if (offset < 0) fail<rope::out_of_range>(fn, name, range, offset);
    if (last >= limit) fail<rope::out_of_range>(fn, std::string(name) + " + " + to_text(rows - 1), range, last);
    return;
  }
  for (std::size_t i = 0; i < rows; ++i) {
    if (ids[i] < 0 || static_cast<std::uint64_t>(ids[i]) >= limit) {
      fail<rope::out_of_range>(fn, indexed(name, i), range, ids[i]);
    }
  }
}

inline void check_size(const char* fn, const char* name, const std::vector<std::int64_t>& v, std::size_t rows) {
  if (!v.empty() && v.size() != rows) {
    fail(fn, std::string(name) + ".size()", "0 or the number of rows " + to_text(rows), v.size());
  }
}

// Sequence ids come for both sides or for neither (a side without rows
// needs none).
inline void check_sequences(const char* fn, const std::vector<std::int64_t>& q_sequence, std::size_t lq,
                            const std::vector<std::int64_t>& k_sequence, std::size_t lk) {
  if (q_sequence.empty() && lq > 0 && !k_sequence.empty()) {
    fail(fn, "options.q_sequence.size()", "q's rows " + to_text(lq) + " when options.k_sequence is given", 0);
  }
  if (k_sequence.empty() && lk > 0 && !q_sequence.empty()) {
    fail(fn, "options.k_sequence.size()", "k's rows " + to_text(lk) + " when options.q_sequence is given", 0);
  }
}

// The rotary width a Rotation asks for, checked against the table and the
// rows it rotates.
template <class T>
std::size_t rotary_width(const char* fn, const char* name, const Rotation<T>& rotation, std::size_t head_dim) {
  if (rotation.table == nullptr) return 0;
  const std::size_t table_dim = rotation.table->rotary_dim();
  const std::size_t r = rotation.rotary_dim == 0 ? table_dim : rotation.rotary_dim;
  const std::string field = std::string(name) + ".rotary_dim";
  if (r % 2 != 0) fail(fn, field, "even", r);
  if (r > table_dim) fail(fn, field, "<= its table's rotary_dim " + to_text(table_dim), r);
  if (r > head_dim) fail(fn, field, "<= the head dimension " + to_text(head_dim), r);
  return r;
}

// Rotates every row (token) of x in place, row r at position positions[r]
// (already checked against the table); channels past rotary_dim stay.
template <class T>
void rotate_rows_at(Matrix<T>& x, const Rotation<T>& rotation, std::size_t rotary_dim,
                    const std::int64_t* positions) noexcept {
  if (rotation.table == nullptr || rotary_dim == 0) return;
  with_style(rotation.style, [&](auto s) {
    for (Eigen::Index r = 0; r < x.rows(); ++r) {
      const auto m = static_cast<std::size_t>(positions[r]);
      T* row = x.row(r).data();
      rotate_heads<decltype(s)::value, T>(row, 0, row, 0, 1, rotation.table->cos(m), rotation.table->sin(m),
                                          rotary_dim);
    }
  });
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

// Multi-head tensors: every view valid alone, shapes consistent, grouped
// heads (q.heads a multiple of k.heads), and out sharing no element with
// any input (heads are written as they finish).
template <class T>
void check_heads(const char* fn, const View<const T>& q, const View<const T>& k, const View<const T>& v,
                 const View<T>& out) {
  using rope::detail::check_disjoint;
  using rope::detail::check_view;
  check_view(fn, "q", q);
  check_view(fn, "k", k);
  check_view(fn, "v", v);
  check_view(fn, "out", out);
  if (k.heads == 0 || q.heads % k.heads != 0) fail(fn, "k.heads", "a divisor of q.heads = " + to_text(q.heads), k.heads);
  if (v.heads != k.heads) fail(fn, "v.heads", "k.heads = " + to_text(k.heads), v.heads);
  if (v.tokens != k.tokens) fail(fn, "v.tokens", "k.tokens = " + to_text(k.tokens), v.tokens);
  if (k.head_dim != q.head_dim) fail(fn, "k.head_dim", "q.head_dim = " + to_text(q.head_dim), k.head_dim);
  if (out.tokens != q.tokens) fail(fn, "out.tokens", "q.tokens = " + to_text(q.tokens), out.tokens);
  if (out.heads != q.heads) fail(fn, "out.heads", "q.heads = " + to_text(q.heads), out.heads);
  if (out.head_dim != v.head_dim) fail(fn, "out.head_dim", "v.head_dim = " + to_text(v.head_dim), out.head_dim);
  check_disjoint(fn, "out", out, "q", q);
  check_disjoint(fn, "out", out, "k", k);
  check_disjoint(fn, "out", out, "v", v);
}

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
