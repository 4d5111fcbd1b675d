// rope/tensor/shared_checks.hpp — the checks the tensor API and the attention
// module share, each written once: element types, the rotary width a call
// asks for, positions against a table, grouped-query heads, thread counts.
//
// Every check throws rope::invalid_argument (rope::out_of_range for
// positions) naming the public function and the argument as the caller
// spelled it, before the call writes anything (detail/fail.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "../detail/fail.hpp"
#include "../half.hpp"
#include "../options.hpp"
#include "view_checks.hpp"

namespace rope::detail {

template <class T, class U>
constexpr void check_types() noexcept {
  static_assert(!std::is_const<T>::value, "rope::apply: the output view must be writable");
  static_assert(Storage<T>::kSupported,
                "rope::apply: T must be float, double, rope::BFloat16, rope::Float16 or a 2-byte type "
                "with explicit float conversions");
  static_assert(std::is_same<typename Storage<T>::compute_type, U>::value,
                "rope::apply: use a Table<float> for float and 16-bit tensors, a Table<double> for double");
}

// The rotary width a call asks for: `asked`, or the table's when 0; even
// and within the table. `argument` names where the caller asked for it
// (options.rotary_dim, rotation.rotary_dim).
inline std::size_t rotary_width(const char* fn, const Piece& argument, std::size_t asked,
                                std::size_t table_rotary_dim) {
  const std::size_t r = asked == 0 ? table_rotary_dim : asked;
  if (r % 2 != 0) fail(fn, argument, "even", r);
  if (r > table_rotary_dim) fail(fn, argument, {"<= the table's rotary_dim ", table_rotary_dim}, r);
  return r;
}

inline void check_threads(const char* fn, const char* argument, std::size_t threads) {
  if (threads == 0) fail(fn, argument, "at least 1", threads);
}

// An executor that is set must say how many shares to split the work into.
inline void check_executor(const char* fn, const char* argument, const Executor& executor) {
  if (executor.set() && executor.workers == 0) {
    fail(fn, argument, "at least 1 when options.executor.parallel_for is set", executor.workers);
  }
}

// A Threads value: a count of at least 1, or a set executor with workers.
inline void check_threads(const char* fn, const char* argument, const Threads& threads) {
  if (threads.executor.set()) {
    if (threads.executor.workers == 0) {
      fail(fn, {argument, ".executor.workers"}, "at least 1 when its parallel_for is set", threads.executor.workers);
    }
  } else if (threads.count == 0) {
    fail(fn, {argument, ".count"}, "at least 1", threads.count);
  }
}

// The rotary part must fit in every head.
template <class T>
void check_rotary_fits(const char* fn, const char* const* names, const Pass<T>* passes, std::size_t count,
                       std::size_t rotary_dim) {
  for (std::size_t i = 0; i < count; ++i) {
    if (rotary_dim > passes[i].in.head_dim) {
      fail(fn, {names[i], ".head_dim"}, {">= rotary_dim ", rotary_dim}, passes[i].in.head_dim);
    }
  }
}

// How the caller spelled a call's positions: the array of ids and the
// offset of contiguous positions (positions / offset for the tensor API,
// options.q_positions / options.q_offset for attention). Pointers, so that
// a call that passes its checks builds no string.
struct PositionNames {
  const char* ids = "positions";
  const char* offset = "offset";
};

// Position `value` (argument `argument`) is outside the table's rows.
[[noreturn]] inline void position_outside(const char* fn, Pieces argument, std::uint64_t rows, std::int64_t value) {
  fail<rope::out_of_range>(fn, argument, {"in the table's positions [0, ", rows, ")"}, value);
}

// Every position of `count` tokens must index a row of a table of
// `table_positions` rows: [0, table_positions). Ids are checked one by one;
// an offset by its first and last token, without overflow.
inline void check_positions(const char* fn, const Positions& p, std::size_t count, std::size_t table_positions,
                            const PositionNames& names = {}) {
  if (p.by_id() && p.ids() == nullptr) fail(fn, names.ids, "non-null", nullptr);
  if (count == 0) return;
  if (!p.by_id()) {
    if (p.offset() < 0) fail<rope::out_of_range>(fn, {names.offset, " (the position of token 0)"}, ">= 0", p.offset());
    const auto last = static_cast<std::uint64_t>(p.offset()) + (count - 1);
    if (last >= table_positions) {
      fail<rope::out_of_range>(fn, {names.offset, " + ", count - 1, " (the position of token ", count - 1, ")"},
                               {"in the table's positions [0, ", table_positions, ")"}, last);
    }
    return;
  }
  for (std::size_t t = 0; t < count; ++t) {
    const std::int64_t m = p.ids()[t];
    if (m < 0 || static_cast<std::uint64_t>(m) >= table_positions) {
      position_outside(fn, {names.ids, "[", t, "]"}, table_positions, m);
    }
  }
}

// Grouped-query heads: the K side's heads divide the Q side's.
inline void check_grouped_heads(const char* fn, const char* k_name, std::size_t k_heads, const char* q_name,
                                std::size_t q_heads) {
  if (k_heads == 0 || q_heads % k_heads != 0) {
    fail(fn, k_name, {"a divisor of ", q_name, " = ", q_heads}, k_heads);
  }
}

}  // namespace rope::detail
