// rope/attention/append.hpp — the one writer of a paged KV cache, and the
// step before attention in one pass over a token's Q, K and V rows.
//
// For each new token t (its rows widened to float, in registers and L1 while
// they are worked on):
//   Q heads: RMSNorm (optional), RoPE at the token's position (or, with
//            multi-axis positions, each pair at its own axis' position, as
//            rope::apply_mrope), rounded once into q_out (which may be q
//            itself);
//   K heads: RMSNorm (optional), RoPE, rounded once into the cache slot
//            slots[t] (int8: quantized with its vector's scale), and, only
//            when options.write_back_k, also into k itself;
//   V heads: rounded once into the slot.
// slots[t] == -1: Q is still normalized and rotated, nothing is written to
// the cache (a padding token). write_slots is the same writer without the
// norm and without Q; softmax_batch_step writes its tokens through it too.
//
// RMSNorm, in float, as the reference models compute it (in f32), with the
// operations in this order so that a plain loop reproduces the bits:
//   s_k = fma(x_c, x_c, s_k) for c = k, k + 8, k + 16, ... < n in order
//         (eight sums k = 0 .. 7 starting at 0: eight independent chains
//         instead of one, whose latency would bound the whole step)
//   ss = ((s_0 + s_4) + (s_2 + s_6)) + ((s_1 + s_5) + (s_3 + s_7))
//   r  = 1 / sqrt(ss / n + eps)
//   y_c = (x_c * r) * w_c          (or (x_c * r) * (1 + w_c): Gemma's form)
// over one head's head_dim channels (per-head QK-norm: Qwen3, Gemma 3) or
// over all of a token's Q (or K) channels at once (whole projection:
// OLMo 2), the weight holding that many values. One rounding of y into the
// stored type follows the rotation; models that round x * r to their
// activation type before the weight differ from this by that rounding.
//
// Stores: a long prefill writes more cache rows than the caches hold, and
// a plain store of an uncached line first reads it; with streaming stores
// (options.stores, rope::Stores) the rows go to memory without that read
// and without evicting the input. Stores::automatic streams when one call
// writes at least kStreamedCacheBytes of cache rows, never for a decode
// step, whose few rows the attention that follows reads from cache. A
// float cache without streaming takes K rotated straight into its rows.
// Threads take contiguous shares of the tokens; each orders its streamed
// rows (a store fence) before the join. The bits are the same in every
// case: only where the rounded values go changes.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "../detail/lines.hpp"
#include "../detail/parallel.hpp"
#include "../detail/prefetch.hpp"
#include "../detail/stream.hpp"
#include "../kernels/attention_rows.hpp"
#include "../kernels/kv_rows.hpp"
#include "../multi_axis.hpp"
#include "../options.hpp"
#include "../tensor/checks.hpp"
#include "../tensor/view_checks.hpp"
#include "checks.hpp"
#include "paged.hpp"
#include "rows.hpp"
#include "types.hpp"

namespace rope::attention {

// How write_slots rotates K: with rotation.table set, token t's K rows are
// rotated at positions[t] (positions: one per new token, inside the table)
// before they are rounded into the cache. Without a table, K is written as
// given (already rotated, or a model without RoPE on that layer).
struct WriteOptions {
  Rotation<float> rotation;
  const std::int64_t* positions = nullptr;
  rope::Stores stores = rope::Stores::automatic;  // how the cache rows are stored (see AppendOptions::stores)
};

// RMSNorm weights of one side (Q or K): null for no norm on that side;
// else `size` values: head_dim for a per-head norm, heads * head_dim with
// whole_projection.
struct NormWeights {
  const float* data = nullptr;
  std::size_t size = 0;
};

struct AppendOptions {
  Rotation<float> rotation;  // no table: no RoPE (the norm and the writes only)
  NormWeights q_norm, k_norm;
  double eps = 1e-6;              // > 0 and finite, when a norm is set
  bool plus_one = false;          // y = x r (1 + w) (Gemma) instead of x r w
  bool whole_projection = false;  // one norm over all heads' channels (OLMo 2)
  bool write_back_k = false;      // also write the normalized, rotated K into k
  std::size_t threads = 1;        // over tokens
  Executor executor;
  // Multi-axis positions (M-RoPE, as rope::apply_mrope): with pair_axes set
  // (and a table), pair p of token t's Q and K is rotated by
  // axis_positions[pair_axes->axis[p] * tokens + t] * theta_p, and the
  // positions argument must be 0: one source of positions per call, never
  // two to be ordered. axis_positions is [pair_axes->axes, tokens],
  // axis-major, as apply_mrope takes it, so a caller's position ids go to
  // either call unchanged. Both are read only during the call; without a
  // table neither is read (nothing is rotated).
  const PairAxes* pair_axes = nullptr;
  const std::int64_t* axis_positions = nullptr;
  // How the cache rows are stored: streaming stores skip the read a plain
  // store of an uncached line costs and leave the rows out of cache;
  // automatic streams when the call writes at least kStreamedCacheBytes of
  // cache rows (a long prefill), never a decode step's few rows, which the
  // attention that follows reads from cache. The same bits either way.
  rope::Stores stores = rope::Stores::automatic;
};

// The cache bytes one call must write before Stores::automatic streams them.
constexpr std::size_t kStreamedCacheBytes = std::size_t(8) << 20;

// The tokens per worker up to which norm_rope_append normalizes four heads
// at a time (rms_norm_rows; a decode step), one at a time above (a
// prefill). The same bits either way.
constexpr std::size_t kGroupedNormTokens = 64;

namespace detail {

// The norm of one side: per head, or over every head of the token at once.
struct Norm {
  const float* weight = nullptr;  // null: none
  float eps = 0;
  bool plus_one = false;
  bool whole = false;
  // The weights the rotation scales its inputs by (norm_rotate_store):
  // weight, or 1 + weight for plus_one. Null: not set.
  const float* rotated_weight = nullptr;
  // Per-head norms of a token several rows at a time (rms_norm_rows): the
  // same bits. Set for calls of few tokens per worker (a decode step), whose
  // rows are in cache and which wait on the norm's latency; a long prefill
  // waits on memory, where one row at a time overlapped better when
  // measured (bench_fused.cpp).
  bool grouped = false;
};

// rms_norm_row of x.heads rows (row h at x + h * x_stride) into out (row h
// at out + h * d), grouped or one by one as norm says.
template <class Arch>
void norm_heads(const float* x, std::size_t x_stride, std::size_t heads, std::size_t d, const Norm& norm,
                float* out) noexcept {
  if (norm.grouped) {
    rms_norm_rows<Arch>(x, x_stride, heads, d, norm.weight, norm.eps, norm.plus_one, out, d);
    return;
  }
  for (std::size_t h = 0; h < heads; ++h) {
    rms_norm_row<Arch>(x + h * x_stride, d, norm.weight, norm.eps, norm.plus_one, out + h * d);
  }
}

// Token t's rows of x (x.heads rows of d = x.head_dim values) into out (row
// h at out + h * d) as floats, normalized per head or over all of them
// (norm.weight null: only widened). A float row with a per-head norm is
// normalized straight from x: the widening copy is one pass fewer.
template <class In, class Arch>
void load_normed(const View<const In>& x, std::size_t t, const Norm& norm, float* out) noexcept {
  const std::size_t d = x.head_dim;
  if constexpr (std::is_same<In, float>::value) {
    if (norm.weight != nullptr && !norm.whole) {
      norm_heads<Arch>(x.row(t, 0), x.head_stride, x.heads, d, norm, out);
      return;
    }
  }
  for (std::size_t h = 0; h < x.heads; ++h) widen_row(x.row(t, h), d, out + h * d);
  if (norm.weight == nullptr) return;
  if (norm.whole) {
    rms_norm_row<Arch>(out, x.heads * d, norm.weight, norm.eps, norm.plus_one, out);
  } else {
    norm_heads<Arch>(out, d, x.heads, d, norm, out);
  }
}

// Token t's rows of `out` (out.heads rows of d = out.head_dim) = the rows of
// x (row h at x + h * d) rotated with one row of cos and sin (null: not
// rotated), each value rounded once into Out. A float out is rotated into
// straight from x (x is left as it was); any other type rotates x in place
// and rounds it on the way out.
template <class Arch, class Out>
void rotate_store(float* x, Style style, std::size_t rotary_dim, const float* cos, const float* sin,
                  const View<Out>& out, std::size_t t) noexcept {
  const std::size_t d = out.head_dim, heads = out.heads;
  if constexpr (std::is_same<Out, float>::value) {
    const std::size_t r = cos != nullptr ? rotary_dim : 0;
    if (r > 0) {
      with_style(style, [&](auto s) {
        rotate_heads<decltype(s)::value, float, Arch>(x, static_cast<std::ptrdiff_t>(d), out.row(t, 0),
                                                      static_cast<std::ptrdiff_t>(out.head_stride), heads, cos, sin, r);
      });
    }
    if (r < d) {
      for (std::size_t h = 0; h < heads; ++h) std::memcpy(out.row(t, h) + r, x + h * d + r, (d - r) * sizeof(float));
    }
  } else {
    if (cos != nullptr) rotate_with<float, Arch>(style, rotary_dim, cos, sin, x, static_cast<std::ptrdiff_t>(d), heads);
    for (std::size_t h = 0; h < heads; ++h) store_kv_row<Arch>(x + h * d, d, out.row(t, h), nullptr);
  }
}

// load_normed then rotate_store for float rows, a float out, a per-head
// norm and a rotation, in one pass less: the heads' sums of squares as
// load_normed takes them, then the rotation reads x itself and scales each
// input as it loads it (rotate_heads_scaled), the channels past rotary_dim
// scaled as rms_norm_row scales them. The same bits; out may be x (in
// place). r: room for x.heads floats.
template <class Arch>
void norm_rotate_store(const View<const float>& x, std::size_t t, const Norm& norm, Style style, std::size_t rotary_dim,
                       const float* cos, const float* sin, const View<float>& out, float* r) noexcept {
  const std::size_t d = x.head_dim, heads = x.heads;
  const float* row = x.row(t, 0);
  if (norm.grouped) {
    sum_squares8_rows<Arch>(row, x.head_stride, heads, d, r);
  } else {
    for (std::size_t h = 0; h < heads; ++h) r[h] = sum_squares8<Arch>(row + h * x.head_stride, d);
  }
  for (std::size_t h = 0; h < heads; ++h) r[h] = rms_inverse<Arch>(r[h], d, norm.eps);
  with_style(style, [&](auto s) {
    rotate_heads_scaled<decltype(s)::value, Arch>(row, static_cast<std::ptrdiff_t>(x.head_stride), out.row(t, 0),
                                                  static_cast<std::ptrdiff_t>(out.head_stride), heads, cos, sin,
                                                  rotary_dim, r, norm.rotated_weight);
  });
  if (rotary_dim < d) {
    for (std::size_t h = 0; h < heads; ++h) {
      rope::detail::scale_row<Arch>(x.row(t, h) + rotary_dim, d - rotary_dim, r[h], norm.weight + rotary_dim,
                                    norm.plus_one, out.row(t, h) + rotary_dim);
    }
  }
}

// Where a token's cos and sin come from: the table row of its one position,
// or, with multi-axis positions, each pair's from the row of its own axis'
// position, gathered into a row of rotary_dim floats as rope::apply_mrope
// gathers it (rope::detail::MultiAxis), so both round alike. No table:
// null, nothing is rotated.
struct TokenAngles {
  const Table<float>* table = nullptr;
  Positions positions = 0;  // one per token (not multi)
  bool multi = false;
  rope::detail::MultiAxis<float> axes{};

  // row: rotary_dim floats, written only with multi-axis positions.
  void of(std::size_t t, float* row, const float*& cos, const float*& sin) const noexcept {
    cos = sin = nullptr;
    if (table == nullptr) return;
    if (multi) {
      axes.row(t, row, cos, sin);
    } else {
      const auto m = static_cast<std::size_t>(positions.at(t));
      cos = table->cos(m);
      sin = table->sin(m);
    }
  }
};

// Asks for token t's Q, K and V rows ahead of their use: the token before
// it is worked on meanwhile, so its misses overlap that work.
template <class In>
void prefetch_token(const View<const In>& q, const View<const In>& k, const View<const In>& v, std::size_t t) noexcept {
  rope::detail::prefetch_rows(q.row(t, 0), q.heads, q.head_stride * sizeof(In), q.head_dim * sizeof(In));
  rope::detail::prefetch_rows(k.row(t, 0), k.heads, k.head_stride * sizeof(In), k.head_dim * sizeof(In));
  rope::detail::prefetch_rows(v.row(t, 0), v.heads, v.head_stride * sizeof(In), v.head_dim * sizeof(In));
}

// What one token's write needs, checked.
template <class In, class E, class Arch = xsimd::default_arch>
struct TokenWriter {
  View<const In> k, v;
  PagedCache<E> cache;
  Rotation<float> rotation;
  std::size_t rotary_dim = 0;
  Norm k_norm;
  View<In> k_back;      // data null: K not written back
  bool stream = false;  // cache rows written with streaming stores (then stream_fence before a join)

  // Floats of scratch write() needs: a token's K rows (or one V row), and
  // with streaming one row of E staged before it is streamed.
  std::size_t scratch_size() const noexcept { return rows_size() + (stream ? std::max(k.head_dim, v.head_dim) : 0); }

  // Token t's K rows (normalized, rotated at m) and V rows into slot s (s
  // < 0: only the write-back), each value rounded once. scratch: scratch_size() floats.
  void write(std::size_t t, std::int64_t s, std::int64_t m, float* scratch) const noexcept {
    const bool rotated = rotation.table != nullptr;
    const auto row = static_cast<std::size_t>(m);
    write(t, s, rotated ? rotation.table->cos(row) : nullptr, rotated ? rotation.table->sin(row) : nullptr, scratch);
  }

  // The same, K rotated with one row of cos and sin (null: not rotated).
  void write(std::size_t t, std::int64_t s, const float* cos, const float* sin, float* scratch) const noexcept {
    if (s < 0 && k_back.data == nullptr) return;
    const std::size_t d = k.head_dim;
    const auto slot = static_cast<std::size_t>(s);
    load_normed<In, Arch>(k, t, k_norm, scratch);
    if constexpr (std::is_same<E, float>::value) {
      if (s >= 0 && !stream && k_back.data == nullptr) {
        // An f32 cache: K rotated from scratch straight into its rows.
        rotate_store<Arch>(scratch, rotation.style, rotary_dim, cos, sin,
                           View<float>(cache.k.row(slot, 0), 1, k.heads, d, 0, cache.k.head_stride), 0);
        write_v(t, slot, scratch);
        return;
      }
    }
    if (cos != nullptr)
      rotate_with<float, Arch>(rotation.style, rotary_dim, cos, sin, scratch, static_cast<std::ptrdiff_t>(d), k.heads);
    if (k_back.data != nullptr) {
      for (std::size_t h = 0; h < k.heads; ++h) store_kv_row<Arch>(scratch + h * d, d, k_back.row(t, h), nullptr);
    }
    if (s < 0) return;
    float* staging = scratch + rows_size();
    for (std::size_t h = 0; h < k.heads; ++h) {
      put(scratch + h * d, d, cache.k.row(slot, h), KvElement<E>::kScaled ? cache.k.scale(slot, h) : nullptr, staging);
    }
    write_v(t, slot, scratch);
  }

 private:
  // Floats of scratch before the staging row: a token's K rows, or one V row.
  std::size_t rows_size() const noexcept { return std::max(k.heads * k.head_dim, v.head_dim); }

  // Token t's V rows into slot (scratch: a widened row, and the staging).
  void write_v(std::size_t t, std::size_t slot, float* scratch) const noexcept {
    float* staging = scratch + rows_size();
    for (std::size_t h = 0; h < v.heads; ++h) {
      const float* row = scratch;
      if constexpr (std::is_same<In, float>::value) {
        row = v.row(t, h);  // a float row is stored from where it is
      } else {
        widen_row(v.row(t, h), v.head_dim, scratch);
      }
      put(row, v.head_dim, cache.v.row(slot, h), KvElement<E>::kScaled ? cache.v.scale(slot, h) : nullptr, staging);
    }
  }

  // One row of n floats rounded into out: stored, or (stream) rounded into
  // staging and streamed from there, the same values either way.
  void put(const float* x, std::size_t n, E* out, float* scale, float* staging) const noexcept {
    if (!stream) {
      store_kv_row<Arch>(x, n, out, scale);
      return;
    }
    const void* from = x;
    if constexpr (!std::is_same<E, float>::value) {
      store_kv_row<Arch>(x, n, reinterpret_cast<E*>(staging), scale);
      from = staging;
    }
    rope::detail::stream_copy<Arch>(out, from, n * sizeof(E));
  }
};

// Whether a call streams its cache rows: `stores`, or with automatic the
// bytes of the rows it writes (tokens with a slot) against
// kStreamedCacheBytes.
template <class E, class In>
bool streams(rope::Stores stores, const std::int64_t* slots, std::size_t tokens, const View<const In>& k,
             const View<const In>& v) noexcept {
  if (stores != rope::Stores::automatic) return stores == rope::Stores::streaming;
  std::size_t written = 0;
  for (std::size_t t = 0; t < tokens; ++t) written += slots[t] >= 0 ? 1 : 0;
  const std::size_t per_token = (k.heads * k.head_dim + v.heads * v.head_dim) * sizeof(E);
  return written * per_token >= kStreamedCacheBytes;
}

// Checks new K and V rows against the cache and the slots: every slot -1
// or inside the pool, none twice, rows that fit the pools, and memory apart
// from them (or each row already its own slot's row).
template <class In, class E>
void check_writes(const char* fn, const View<const In>& k, const View<const In>& v, const std::int64_t* slots,
                  const PagedCache<E>& cache, const char* k_name, const char* v_name) {
  check_cache(fn, cache);
  if (v.tokens != k.tokens) fail(fn, {v_name, ".tokens"}, {k_name, ".tokens = ", k.tokens}, v.tokens);
  check_slots(fn, "slots", slots, k.tokens, cache.k.slots());
  check_new_rows(fn, k_name, k, "cache.k", cache.k, slots);
  check_new_rows(fn, v_name, v, "cache.v", cache.v, slots);
  check_apart(fn, k_name, k, "cache.v", cache.v);
  check_apart(fn, v_name, v, "cache.k", cache.k);
}

// One side's norm weights: null (no norm) or exactly `expected` values.
inline Norm norm_of(const char* fn, const char* name, const NormWeights& w, std::size_t expected,
                    const AppendOptions& o) {
  Norm n;
  if (w.data == nullptr) {
    if (w.size != 0) fail(fn, {name, ".data"}, {"non-null for ", w.size, " weights"}, nullptr);
    return n;
  }
  if (w.size != expected) {
    fail(fn, {name, ".size"},
         to_text(expected) + (o.whole_projection ? " (heads * head_dim: options.whole_projection)" : " (head_dim)"),
         w.size);
  }
  const auto eps = static_cast<float>(o.eps);
  if (!(o.eps > 0) || !std::isfinite(o.eps) || !(eps > 0)) fail(fn, "options.eps", "finite and > 0", o.eps);
  n.weight = w.data;
  n.eps = eps;
  n.plus_one = o.plus_one;
  n.whole = o.whole_projection;
  return n;
}

// Where norm_rope_append's tokens take their cos and sin from, checked:
// with options.pair_axes, the pair axes against rotary_dim/2 and every
// axis' positions against the table (positions must then be 0); else
// positions against the table. Nothing is checked without a table.
inline TokenAngles angles_of(const char* fn, const Positions& positions, std::size_t tokens, std::size_t rotary_dim,
                             const AppendOptions& o) {
  TokenAngles a;
  const Table<float>* table = o.rotation.table;
  if (table == nullptr) return a;
  a.table = table;
  if (o.pair_axes == nullptr) {
    rope::detail::check_positions(fn, positions, tokens, table->positions());
    a.positions = positions;
    return a;
  }
  if (positions.by_id()) {
    fail(fn, "positions", "0 when options.pair_axes is set (options.axis_positions holds the positions)",
         "an array of ids");
  }
  if (positions.offset() != 0) {
    fail(fn, "positions", "0 when options.pair_axes is set (options.axis_positions holds the positions)",
         positions.offset());
  }
  const PairAxes& pa = *o.pair_axes;
  rope::detail::check_pair_axes(fn, pa, rotary_dim / 2, "options.pair_axes->");
  if (o.axis_positions == nullptr) {
    fail(fn, "options.axis_positions", "non-null when options.pair_axes is set", nullptr);
  }
  for (std::size_t axis = 0; axis < pa.axes; ++axis) {
    const std::string name = indexed("options.axis_positions", axis);
    rope::detail::check_positions(fn, Positions(o.axis_positions + axis * tokens), tokens, table->positions(),
                                  {name.c_str(), name.c_str()});
  }
  a.multi = true;
  a.axes = rope::detail::MultiAxis<float>{table->cos(0), table->rotary_dim() / 2, o.axis_positions,
                                          tokens,        pa.axis.data(),          rotary_dim / 2};
  return a;
}

}  // namespace detail

// Writes new tokens' K and V rows ([tokens, kv_heads, head_dim] views of
// float, BFloat16 or Float16) into the cache's slots: token t into slots[t],
// or nowhere when slots[t] == -1. Each value is rounded once into E (int8:
// quantized with its vector's scale, written beside it). Refused, before
// anything is written: a slot outside the pool, two tokens on one slot, rows
// that do not fit the pools, views that overlap the pools (except rows that
// already are their own slot's row: the projection wrote them into the
// cache; they are left as they are, or rotated in place), positions outside
// the table.
template <class InV, class E, class Arch = xsimd::default_arch>
void write_slots(const View<InV>& k_view, const View<InV>& v_view, const std::int64_t* slots,
                 const PagedCache<E>& cache, const WriteOptions& options = {}) {
  using In = std::remove_const_t<InV>;
  detail::check_kv_element<E>();
  detail::check_row_type<In>();
  const char* fn = "rope::attention::write_slots";
  const View<const In> k_new(k_view), v_new(v_view);
  detail::check_writes(fn, k_new, v_new, slots, cache, "k_new", "v_new");
  const std::size_t n = k_new.tokens;
  const std::size_t rotary_dim = detail::rotary_width(fn, "options.rotation", options.rotation, k_new.head_dim);
  if (options.rotation.table != nullptr) {
    if (n > 0 && options.positions == nullptr) {
      detail::fail(fn, "options.positions", "non-null when options.rotation has a table", nullptr);
    }
    if (n > 0) {
      rope::detail::check_positions(fn, rope::Positions(options.positions), n, options.rotation.table->positions(),
                                    {"options.positions", "options.positions"});
    }
  }
  const bool stream = detail::streams<E>(options.stores, slots, n, k_new, v_new);
  const detail::TokenWriter<In, E, Arch> writer{k_new, v_new, cache, options.rotation, rotary_dim, {}, {}, stream};
  std::vector<float> scratch(writer.scratch_size());
  for (std::size_t t = 0; t < n; ++t) {
    if (slots[t] < 0) continue;
    const std::int64_t m = options.rotation.table != nullptr ? options.positions[t] : 0;
    writer.write(t, slots[t], m, scratch.data());
  }
  if (stream) rope::detail::stream_fence<Arch>();
}

// The step before attention, one pass per token (see the header comment):
// q [tokens, q_heads, head_dim] normalized and rotated into q_out (q_out
// may be q itself: in place), k and v [tokens, kv_heads, head_dim] written
// into the cache's slots (slots[t] == -1: not written), K normalized and
// rotated first, and written back into k too only with
// options.write_back_k. Token t is at positions.at(t) (an offset or one id
// per token), or, with options.pair_axes, pair p of token t at
// options.axis_positions[options.pair_axes->axis[p] * tokens + t]
// (positions then 0). q, k, v: float, BFloat16 or Float16 (one type; e.g. the three
// parts of a fused QKV buffer, rope::split_qkv); q_out: float, BFloat16 or
// Float16. Refused before anything is written: slots outside the pool or
// twice, norm weights of the wrong length, eps <= 0 or not finite,
// positions outside the table, pair axes that do not fit rotary_dim/2,
// positions other than 0 with pair axes, views that overlap each other or the cache
// (q_out may be q; k and v may already be their own slots' rows).
template <class InV, class QO, class E, class Arch = xsimd::default_arch>
void norm_rope_append(const View<InV>& q_view, const View<InV>& k_view, const View<InV>& v_view, Positions positions,
                      const std::int64_t* slots, const PagedCache<E>& cache, View<QO> q_out,
                      const AppendOptions& options = {}) {
  using In = std::remove_const_t<InV>;
  detail::check_kv_element<E>();
  detail::check_row_type<In>();
  detail::check_row_type<QO>();
  const char* fn = "rope::attention::norm_rope_append";
  const View<const In> q(q_view), k(k_view), v(v_view);
  rope::detail::check_view(fn, "q", q);
  rope::detail::check_view(fn, "q_out", q_out);
  detail::check_writes(fn, k, v, slots, cache, "k", "v");
  if (k.tokens != q.tokens) detail::fail(fn, "k.tokens", {"q.tokens = ", q.tokens}, k.tokens);
  if (k.head_dim != q.head_dim) {
    detail::fail(fn, "k.head_dim", {"q.head_dim = ", q.head_dim}, k.head_dim);
  }
  if (q_out.tokens != q.tokens) detail::fail(fn, "q_out.tokens", {"q.tokens = ", q.tokens}, q_out.tokens);
  if (q_out.heads != q.heads) detail::fail(fn, "q_out.heads", {"q.heads = ", q.heads}, q_out.heads);
  if (q_out.head_dim != q.head_dim) {
    detail::fail(fn, "q_out.head_dim", {"q.head_dim = ", q.head_dim}, q_out.head_dim);
  }
  const bool q_in_place = std::is_same<In, QO>::value && static_cast<const void*>(q_out.data) == q.data &&
                          q_out.token_stride == q.token_stride && q_out.head_stride == q.head_stride;
  if (!q_in_place) rope::detail::check_disjoint(fn, "q_out", q_out, "q", q);
  rope::detail::check_disjoint(fn, "q_out", q_out, "k", k);
  rope::detail::check_disjoint(fn, "q_out", q_out, "v", v);
  detail::check_apart(fn, "q_out", q_out, "cache.k", cache.k);
  detail::check_apart(fn, "q_out", q_out, "cache.v", cache.v);
  detail::check_apart(fn, "q", q, "cache.k", cache.k);
  detail::check_apart(fn, "q", q, "cache.v", cache.v);
  if (options.write_back_k) {
    if (std::is_const<InV>::value) detail::fail(fn, "options.write_back_k", "false for a read-only k view", "true");
    rope::detail::check_disjoint(fn, "k", k, "q", q);
    rope::detail::check_disjoint(fn, "k", k, "v", v);
    if (!q_in_place) rope::detail::check_disjoint(fn, "k", k, "q_out", q_out);
  }
  detail::Norm q_norm = detail::norm_of(fn, "options.q_norm", options.q_norm,
                                        options.whole_projection ? q.heads * q.head_dim : q.head_dim, options);
  detail::Norm k_norm = detail::norm_of(fn, "options.k_norm", options.k_norm,
                                        options.whole_projection ? k.heads * k.head_dim : k.head_dim, options);
  const std::size_t rotary_dim = detail::rotary_width(fn, "options.rotation", options.rotation, q.head_dim);
  const detail::TokenAngles angles = detail::angles_of(fn, positions, q.tokens, rotary_dim, options);
  rope::detail::check_threads(fn, "options.threads", options.threads);
  rope::detail::check_executor(fn, "options.executor.workers", options.executor);
  View<In> k_back;
  if (options.write_back_k) {
    k_back = View<In>(const_cast<In*>(k.data), k.tokens, k.heads, k.head_dim, k.token_stride, k.head_stride);
  }
  const std::size_t tokens = q.tokens;
  if (tokens == 0) return;
  const std::size_t workers =
      std::min(tokens, std::max<std::size_t>(1, rope::detail::thread_count(options.threads, options.executor)));
  q_norm.grouped = k_norm.grouped = tokens <= workers * kGroupedNormTokens;
  // A float Q with a per-head norm is normalized as the rotation loads it
  // (detail::norm_rotate_store), by these weights.
  constexpr bool kFloatQ = std::is_same<In, float>::value && std::is_same<QO, float>::value;
  std::vector<float> q_plus_one;
  if (kFloatQ && q_norm.weight != nullptr && !q_norm.whole && rotary_dim > 0) {
    q_norm.rotated_weight = q_norm.weight;
    if (q_norm.plus_one) {
      q_plus_one.resize(rotary_dim);
      for (std::size_t c = 0; c < rotary_dim; ++c) q_plus_one[c] = 1.0f + q_norm.weight[c];
      q_norm.rotated_weight = q_plus_one.data();
    }
  }
  const bool stream = detail::streams<E>(options.stores, slots, tokens, k, v);
  const detail::TokenWriter<In, E, Arch> writer{k, v, cache, options.rotation, rotary_dim, k_norm, k_back, stream};
  // Per worker: a token's rows (the writer's scratch), then its gathered
  // cos/sin (multi-axis), each worker's on 64-byte lines of its own: no
  // vector of a row splits across two lines, no two workers write one line.
  const std::size_t rows = std::max(q.heads * q.head_dim, writer.scratch_size());
  const std::size_t per = rope::detail::line_floats(rows + (angles.multi ? rotary_dim : 0));
  std::vector<float> buffer(workers * per + rope::detail::kLineFloats);
  float* const scratch = rope::detail::line_start(buffer);
  // Worker w takes the contiguous share of tokens parallel_for would give
  // it, and orders its streamed rows before the join.
  rope::detail::parallel_for(workers, workers, options.executor, [&](std::size_t w, std::size_t) {
    float* x = scratch + w * per;
    const std::size_t end = tokens * (w + 1) / workers;
    for (std::size_t t = tokens * w / workers; t < end; ++t) {
      if (t + 1 < tokens) detail::prefetch_token(q, k, v, t + 1);
      const float* cos;
      const float* sin;
      angles.of(t, x + rows, cos, sin);
      // Q first: q_out may be q, and K's write-back never touches q.
      bool q_done = false;
      if constexpr (kFloatQ) {
        if (q_norm.rotated_weight != nullptr && cos != nullptr) {
          detail::norm_rotate_store<Arch>(q, t, q_norm, options.rotation.style, rotary_dim, cos, sin, q_out, x);
          q_done = true;
        }
      }
      if (!q_done) {
        detail::load_normed<In, Arch>(q, t, q_norm, x);
        detail::rotate_store<Arch>(x, options.rotation.style, rotary_dim, cos, sin, q_out, t);
      }
      writer.write(t, slots[t], cos, sin, x);
    }
    if (stream) rope::detail::stream_fence<Arch>();
  });
}

}  // namespace rope::attention
