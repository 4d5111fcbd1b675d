// rope/attention/call_checks.hpp — the checks every attention call makes before
// it writes anything: its MaskOptions, its Rotation against the table and
// the rows it rotates, and multi-head views. Positions, rotary widths and
// grouped-query heads are checked as the tensor API checks them
// (tensor/shared_checks.hpp), so a message reads the same from either.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "../tensor/shared_checks.hpp"
#include "masks.hpp"
#include "types.hpp"

namespace rope::attention::detail {

inline void check_size(const char* fn, const char* name, const std::vector<std::int64_t>& v, std::size_t rows) {
  if (!v.empty() && v.size() != rows) {
    fail(fn, {name, ".size()"}, {"0 or the number of rows ", rows}, v.size());
  }
}

// Sequence ids come for both sides or for neither (a side without rows
// needs none).
inline void check_sequences(const char* fn, const std::vector<std::int64_t>& q_sequence, std::size_t lq,
                            const std::vector<std::int64_t>& k_sequence, std::size_t lk) {
  if (q_sequence.empty() && lq > 0 && !k_sequence.empty()) {
    fail(fn, "options.q_sequence.size()", {"q's rows ", lq, " when options.k_sequence is given"}, 0);
  }
  if (k_sequence.empty() && lk > 0 && !q_sequence.empty()) {
    fail(fn, "options.k_sequence.size()", {"k's rows ", lk, " when options.q_sequence is given"}, 0);
  }
}

// Contiguous positions offset + 0 .. rows-1 must fit in int64.
inline void check_offset(const char* fn, const char* name, bool used, std::int64_t offset, std::size_t rows) {
  if (used && offset > std::numeric_limits<std::int64_t>::max() - static_cast<std::int64_t>(rows)) {
    fail(fn, name, "small enough for every position to fit in int64", offset);
  }
}

// The options every attention call shares, against Lq queries and Lk keys.
inline void check_mask_options(const char* fn, const MaskOptions& o, std::size_t lq, std::size_t lk) {
  rope::detail::check_threads(fn, "options.threads", o.threads);
  if (o.mask.indices != nullptr) {
    fail(fn, "options.mask.indices", "null: sparse attention is the serving path's (attend)", "a list");
  }
  check_size(fn, "options.q_positions", o.q_positions, lq);
  check_size(fn, "options.k_positions", o.k_positions, lk);
  check_size(fn, "options.q_sequence", o.q_sequence, lq);
  check_size(fn, "options.k_sequence", o.k_sequence, lk);
  check_sequences(fn, o.q_sequence, lq, o.k_sequence, lk);
  check_offset(fn, "options.q_offset", o.q_positions.empty(), o.q_offset, lq);
  check_offset(fn, "options.k_offset", o.k_positions.empty(), o.k_offset, lk);
}

// The queries' and keys' positions against a rotation's table (nothing to
// check without one).
template <class T>
void check_rotation_positions(const char* fn, const Table<T>* table, const MaskOptions& o, std::size_t lq,
                              std::size_t lk, bool keys) {
  if (table == nullptr) return;
  rope::detail::check_positions(fn, o.q(), lq, table->positions(), {"options.q_positions", "options.q_offset"});
  if (keys)
    rope::detail::check_positions(fn, o.k(), lk, table->positions(), {"options.k_positions", "options.k_offset"});
}

// Multi-head tensors: every view valid alone, shapes consistent, grouped
// heads (q.heads a multiple of k.heads), and out sharing no element with
// any input (heads are written as they finish). k_name and v_name are the
// caller's names of the keys and values (softmax_step: cache.k, cache.v).
template <class T>
void check_heads(const char* fn, const View<const T>& q, const View<const T>& k, const View<const T>& v,
                 const View<T>& out, const char* k_name = "k", const char* v_name = "v") {
  using rope::detail::check_disjoint;
  using rope::detail::check_view;
  using rope::detail::field;
  check_view(fn, "q", q);
  check_view(fn, k_name, k);
  check_view(fn, v_name, v);
  check_view(fn, "out", out);
  rope::detail::check_grouped_heads(fn, field(k_name, "heads").c_str(), k.heads, "q.heads", q.heads);
  const std::string k_heads = field(k_name, "heads"), k_tokens = field(k_name, "tokens");
  if (v.heads != k.heads) fail(fn, {v_name, ".heads"}, {k_heads, " = ", k.heads}, v.heads);
  if (v.tokens != k.tokens) fail(fn, {v_name, ".tokens"}, {k_tokens, " = ", k.tokens}, v.tokens);
  if (k.head_dim != q.head_dim) fail(fn, {k_name, ".head_dim"}, {"q.head_dim = ", q.head_dim}, k.head_dim);
  if (out.tokens != q.tokens) fail(fn, "out.tokens", {"q.tokens = ", q.tokens}, out.tokens);
  if (out.heads != q.heads) fail(fn, "out.heads", {"q.heads = ", q.heads}, out.heads);
  if (out.head_dim != v.head_dim) {
    fail(fn, "out.head_dim", {v_name, ".head_dim = ", v.head_dim}, out.head_dim);
  }
  check_disjoint(fn, "out", out, "q", q);
  check_disjoint(fn, "out", out, k_name, k);
  check_disjoint(fn, "out", out, v_name, v);
}

}  // namespace rope::attention::detail
