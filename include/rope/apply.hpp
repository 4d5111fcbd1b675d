// rope/apply.hpp — the tensor API: rotate whole Q/K tensors, checked.
//
// Every head vector of token t is rotated by its position m(t):
//   y_a = x_a cos(m theta_p) - x_b sin(m theta_p),  y_b = x_b cos + x_a sin
// for the pairs (a, b) of the pairing, over the first rotary_dim channels;
// the rest pass through (copied when the output is another tensor).
//
// Layout: tensors are View<T> (view.hpp): strided [tokens, heads, head_dim],
// the head_dim channels of a head vector contiguous, strides in elements.
// Positions (options.hpp) are one std::int64_t per token or an offset for
// contiguous positions. Multi-axis RoPE (M-RoPE, 2-D axial) is in
// multi_axis.hpp, the checkpoint permutations between pairings in permute.hpp.
//
// Element types: float and double compute as themselves (Table<float> and
// Table<double>); 16-bit storage (rope::BFloat16, rope::Float16, or another
// 2-byte type with explicit float conversions such as Eigen::bfloat16) is
// widened to float, rotated with a Table<float> and rounded once on store.
//
// Every argument is checked before anything is written: a call that throws
// leaves every output byte as it was. rope::invalid_argument for bad shapes,
// strides or options, rope::out_of_range for positions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

#include "half.hpp"
#include "options.hpp"
#include "style.hpp"
#include "table.hpp"
#include "tensor/dispatch_table.hpp"
#include "tensor/shared_checks.hpp"
#include "tensor/token_loop.hpp"
#include "view.hpp"

namespace rope {
namespace detail {

// The rotary width of a tensor call (options.rotary_dim, 0: the table's)
// and its thread count or executor.
inline std::size_t checked_rotary_dim(const char* fn, const Options& o, std::size_t table_rotary_dim) {
  const std::size_t r = rotary_width(fn, "options.rotary_dim", o.rotary_dim, table_rotary_dim);
  check_threads(fn, "options.threads", o.threads);
  check_executor(fn, "options.executor.workers", o.executor);
  return r;
}

template <class Arch, class T, class U>
void apply_positions(const char* fn, const Pass<T>* passes, std::size_t count, const char* const* in_names,
                     const char* const* out_names, const Table<U>& table, Style style, const Positions& positions,
                     const Options& options) {
  check_types<T, U>();
  const std::size_t rotary_dim = checked_rotary_dim(fn, options, table.rotary_dim());
  check_passes(fn, passes, count, in_names, out_names);
  check_rotary_fits(fn, in_names, passes, count, rotary_dim);
  check_positions(fn, positions, passes[0].in.tokens, table.positions());
  run_loop<Arch>(style, passes, count, SingleAxis<U>(table, positions), rotary_dim, options);
}

template <class Arch, class T, class U>
void apply_qk_positions(const View<const T>& q_in, const View<const T>& k_in, const View<T>& q_out,
                        const View<T>& k_out, const Table<U>& table, Style style, const Positions& positions,
                        const Options& options, bool in_place) {
  const char* fn = "rope::apply_qk";
  if (k_in.tokens != q_in.tokens) fail(fn, "k.tokens", {"q.tokens = ", q_in.tokens}, k_in.tokens);
  check_grouped_heads(fn, "k.heads", k_in.heads, "q.heads", q_in.heads);
  const Pass<T> passes[2] = {{q_in, q_out}, {k_in, k_out}};
  static const char* const kIn[2] = {"q", "k"};
  static const char* const kOut[2] = {"q_out", "k_out"};
  apply_positions<Arch>(fn, passes, 2, kIn, in_place ? kIn : kOut, table, style, positions, options);
}

}  // namespace detail

// Rotates x in place. positions: one id per token (const std::int64_t*) or
// the position of token 0 (any integer; token t is at offset + t, e.g. a KV
// cache that already holds offset tokens).
template <class T, class U, class Arch = xsimd::default_arch>
void apply(View<T> x, const Table<U>& table, Style style, Positions positions, Options options = {}) {
  const detail::Pass<T> pass{x, x};
  static const char* const kName[1] = {"x"};
  detail::apply_positions<Arch>("rope::apply", &pass, 1, kName, kName, table, style, positions, options);
}

// Out of place: out = rotated x, channels past rotary_dim copied. out may be
// x itself (in place) but must not otherwise overlap it.
template <class T, class U, class Arch = xsimd::default_arch>
void apply(detail::type_identity_t<View<const T>> x, View<T> out, const Table<U>& table, Style style,
           Positions positions, Options options = {}) {
  const detail::Pass<T> pass{x, out};
  static const char* const kIn[1] = {"x"};
  static const char* const kOut[1] = {"out"};
  detail::apply_positions<Arch>("rope::apply", &pass, 1, kIn, kOut, table, style, positions, options);
}

// Rotates Q and K in place in one pass over tokens: each token's cos/sin row
// is read once for all its Q and K heads. k may have fewer heads than q
// (grouped-query attention); q.heads must be a multiple of k.heads.
template <class T, class U, class Arch = xsimd::default_arch>
void apply_qk(View<T> q, View<T> k, const Table<U>& table, Style style, Positions positions, Options options = {}) {
  detail::apply_qk_positions<Arch, T, U>(q, k, q, k, table, style, positions, options, true);
}

// Out of place: q_out, k_out = rotated q, k.
template <class T, class U, class Arch = xsimd::default_arch>
void apply_qk(detail::type_identity_t<View<const T>> q, detail::type_identity_t<View<const T>> k, View<T> q_out,
              View<T> k_out, const Table<U>& table, Style style, Positions positions, Options options = {}) {
  detail::apply_qk_positions<Arch, T, U>(q, k, q_out, k_out, table, style, positions, options, false);
}

}  // namespace rope
