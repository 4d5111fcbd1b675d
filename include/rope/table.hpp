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

#include <cstddef>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "detail/error.hpp"
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

  // rotary_dim/2 values for position m; m < positions() (unchecked).
  const T* cos(std::size_t m) const noexcept { return data_.data() + m * 2 * pairs_; }
  const T* sin(std::size_t m) const noexcept { return cos(m) + pairs_; }

  std::size_t positions() const noexcept { return positions_; }
  std::size_t rotary_dim() const noexcept { return 2 * pairs_; }
  double attention_factor() const noexcept { return attention_factor_; }

 private:
  std::size_t pairs_;
  std::size_t positions_;
  double attention_factor_;
  std::vector<T, detail::UninitializedAllocator<T>> data_;
};

}  // namespace rope
