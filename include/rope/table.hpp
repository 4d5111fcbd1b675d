// rope/table.hpp — the cos/sin cache: one row of rotary_dim/2 pairs per position.
//
//   cos(m)[p] = attention_factor * cos(m * theta_p),
//   sin(m)[p] = attention_factor * sin(m * theta_p)
//
// Each angle m * theta_p is one double multiplication (never a running sum,
// whose error grows with m), its cos/sin is taken in double (xsimd batches of
// double, see detail/sincos.hpp), and the result is rounded once to T; a row
// equals rope::angles at the same position bit for bit. Accuracy, stated
// once in docs/design.md ("Accuracy of tables and angles"): a float entry is
// within 1/2 ulp + 2^-27 ulp of attention_factor * cos/sin of the double
// angle, a double entry within 3 ulps, at any position (angles accumulated in
// float are already off by ~1e-2 at m = 1e5).
//
// Layout: position m owns a block of rotary_dim values: rotary_dim/2 cosines,
// then rotary_dim/2 sines, so one row kernel call touches one cache-friendly
// block.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "detail/fail.hpp"
#include "detail/sincos.hpp"
#include "frequencies.hpp"

namespace rope {

namespace detail {

// Leaves new elements uninitialised: the constructor writes every entry, so
// zero-filling a 64 MB table first would only add a pass over memory.
template <class T>
struct UninitializedAllocator : std::allocator<T> {
  template <class U>
  struct rebind {
    using other = UninitializedAllocator<U>;
  };
  UninitializedAllocator() = default;
  template <class U>
  UninitializedAllocator(const UninitializedAllocator<U>&) noexcept {}
  template <class U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible<U>::value) {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

}  // namespace detail

template <class T = float>
class Table {
  static_assert(std::is_same<T, float>::value || std::is_same<T, double>::value,
                "rope::Table<T>: T must be float or double (16-bit tables lose the angle)");

 public:
  using value_type = T;

  // Builds rows for positions 0 .. positions-1.
  Table(const Frequencies& freqs, std::size_t positions)
      : pairs_(freqs.inv_freq.size()), positions_(positions), attention_factor_(freqs.attention_factor) {
    if (pairs_ == 0) detail::fail("rope::Table", "freqs.inv_freq", "non-empty", "empty");
    if (positions > data_.max_size() / (2 * pairs_)) {
      detail::fail(
          "rope::Table", "positions",
          {"at most ", data_.max_size() / (2 * pairs_), " (rows of ", 2 * pairs_, " values must fit in memory)"},
          positions);
    }
    data_.resize(positions * 2 * pairs_);
    for (std::size_t m = 0; m < positions; ++m) {
      T* c = data_.data() + m * 2 * pairs_;
      detail::sincos_row<T>(freqs.inv_freq.data(), pairs_, static_cast<double>(m), attention_factor_, c, c + pairs_);
    }
  }

  // A table of the caller's own rows, copied as given: position m's cosines
  // are the rotary_dim/2 values at cos + m * row_stride, its sines those at
  // sin + m * row_stride (row_stride 0: rotary_dim/2, rows back to back; an
  // engine's [positions, rotary_dim] rows with both halves alike use
  // rotary_dim). For bit parity with an engine or a checkpoint that carries
  // its own rows (a checkpoint's stored cos/sin tables); those values
  // are the caller's, outside the accuracy rope states for its own tables.
  // attention_factor() is 1 (a factor is part of the caller's values).
  // Refused: null rows, rotary_dim odd or 0, a row_stride below
  // rotary_dim/2, a value that is not finite.
  static Table from_rows(const T* cos, const T* sin, std::size_t positions, std::size_t rotary_dim,
                         std::size_t row_stride = 0) {
    const char* fn = "rope::Table::from_rows";
    if (rotary_dim == 0 || rotary_dim % 2 != 0) detail::fail(fn, "rotary_dim", "even and at least 2", rotary_dim);
    const std::size_t pairs = rotary_dim / 2;
    if (row_stride == 0) row_stride = pairs;
    if (row_stride < pairs) detail::fail(fn, "row_stride", {"0 or at least rotary_dim/2 = ", pairs}, row_stride);
    if (positions > 0 && (cos == nullptr || sin == nullptr)) {
      detail::fail(fn, cos == nullptr ? "cos" : "sin", {"non-null for ", positions, " positions"}, nullptr);
    }
    Table table(pairs, positions);
    for (std::size_t m = 0; m < positions; ++m) {
      T* row = table.data_.data() + m * 2 * pairs;
      for (std::size_t p = 0; p < pairs; ++p) {
        row[p] = cos[m * row_stride + p];
        row[pairs + p] = sin[m * row_stride + p];
        if (!std::isfinite(row[p]) || !std::isfinite(row[pairs + p])) {
          detail::fail(fn, {!std::isfinite(row[p]) ? "cos[" : "sin[", m * row_stride + p, "]"}, "finite",
                       !std::isfinite(row[p]) ? row[p] : row[pairs + p]);
        }
      }
    }
    return table;
  }

  Table(const Table&) = default;
  Table& operator=(const Table&) = default;
  // A table moved from holds no positions: every position is refused.
  Table(Table&& other) noexcept
      : pairs_(other.pairs_),
        positions_(std::exchange(other.positions_, 0)),
        attention_factor_(other.attention_factor_),
        data_(std::move(other.data_)) {}
  Table& operator=(Table&& other) noexcept {
    pairs_ = other.pairs_;
    positions_ = std::exchange(other.positions_, 0);
    attention_factor_ = other.attention_factor_;
    data_ = std::move(other.data_);
    return *this;
  }
  // The mark cleared (a store the compiler keeps) so that a call handed a
  // pointer to a destroyed table can say so instead of reading its size.
  ~Table() { static_cast<volatile std::uint64_t&>(alive_) = 0; }

  // rotary_dim/2 values for position m; m < positions() (unchecked).
  const T* cos(std::size_t m) const noexcept { return data_.data() + m * 2 * pairs_; }
  const T* sin(std::size_t m) const noexcept { return cos(m) + pairs_; }

  std::size_t positions() const noexcept { return positions_; }
  std::size_t rotary_dim() const noexcept { return 2 * pairs_; }
  double attention_factor() const noexcept { return attention_factor_; }

  // False for the memory of a destroyed table (while nothing else has
  // reused it): a best-effort check for dangling pointers, never a promise.
  bool alive() const noexcept { return static_cast<const volatile std::uint64_t&>(alive_) == kAlive; }

 private:
  // Rows to be filled: from_rows.
  Table(std::size_t pairs, std::size_t positions) : pairs_(pairs), positions_(positions), attention_factor_(1.0) {
    if (positions > data_.max_size() / (2 * pairs_)) {
      detail::fail(
          "rope::Table::from_rows", "positions",
          {"at most ", data_.max_size() / (2 * pairs_), " (rows of ", 2 * pairs_, " values must fit in memory)"},
          positions);
    }
    data_.resize(positions * 2 * pairs_);
  }

  static constexpr std::uint64_t kAlive = 0x726f70652d746162ULL;  // "rope-tab"
  std::uint64_t alive_ = kAlive;
  std::size_t pairs_;
  std::size_t positions_;
  double attention_factor_;
  std::vector<T, detail::UninitializedAllocator<T>> data_;
};

}  // namespace rope
