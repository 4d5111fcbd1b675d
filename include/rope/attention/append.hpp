// rope/attention/append.hpp — a layer's new tokens into its cache, at the
// slots the step's plan derived (plan.hpp), with the step before attention
// in the same pass over each token's rows.
//
// For each new token t of the plan, at position p_t (its rows widened to
// float, in registers and L1 while they are worked on):
//   Q heads: RMSNorm (optional), RoPE at p_t (or, with multi-axis
//            positions, each pair at its own axis' position, as
//            rope::apply_mrope), rounded once into q_out (which may be q);
//   K heads: RMSNorm (optional), RoPE at p_t, rounded once into the slot of
//            p_t (int8: quantized with its vector's scale), and, only with
//            options.write_back_k, also into k itself;
//   V heads: rounded once into the slot.
// The K/V form is the same writer without Q (a caller that rotates Q
// itself, at plan.positions(), or a layer without RoPE). Norms and the
// rotation are in pre_attention.hpp, the stores in writer.hpp.
//
// Threads: the plan's, over tokens, each worker a contiguous share (its
// streamed rows fenced before the join); the same bytes for any count.
// Everything is checked before anything is written: a refused call leaves
// the pools, scales, q_out and k as they were.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "../detail/lines.hpp"
#include "../detail/parallel.hpp"
#include "../detail/stream.hpp"
#include "../options.hpp"
#include "../pair_axes.hpp"
#include "../tensor/shared_checks.hpp"
#include "../tensor/view_checks.hpp"
#include "cache.hpp"
#include "forwarders.hpp"
#include "plan.hpp"
#include "pre_attention.hpp"
#include "rotation.hpp"
#include "writer.hpp"

namespace rope::attention {

namespace detail {

// Where the step writes: no new token into a page another sequence reads.
inline void check_writable(const char* fn, const Plan& plan) {
  const std::size_t t = PlanAccess::shared_write(plan);
  if (t >= plan.tokens()) return;
  const std::size_t b = PlanAccess::sequence_of(plan, t),
                    i = static_cast<std::size_t>(plan.position(t)) / plan.shape().page_size;
  fail(fn, {"batch.block_table[", b, "][", i, "]"},
       {"a page no other sequence of the batch reads (new token ", t, " is written there)"},
       PlanAccess::pages_of(plan, b)[i]);
}

// A view of new rows for every token of the plan: each row its own slot's
// row (the projection wrote into the cache), or apart from the pool.
template <class In, class E>
void check_new_rows(const char* fn, const char* name, const View<const In>& x, const char* pool_name,
                    const PagePool<E>& pool, const Plan& plan) {
  rope::detail::check_view(fn, name, x);
  if (x.tokens != plan.tokens()) fail(fn, {name, ".tokens"}, {"the plan's new tokens ", plan.tokens()}, x.tokens);
  if (x.heads != pool.heads) fail(fn, {name, ".heads"}, {pool_name, ".heads = ", pool.heads}, x.heads);
  if (x.head_dim != pool.head_dim)
    fail(fn, {name, ".head_dim"}, {pool_name, ".head_dim = ", pool.head_dim}, x.head_dim);
  const std::size_t span = view_span(x);
  if (pool.scales != nullptr && bytes_overlap(x.data, span, pool.scales, pool.slots() * pool.heads)) {
    fail(fn, name, {pool_name, ".scales apart"}, "overlapping");
  }
  if (!bytes_overlap(x.data, span, pool.data, pool_span(pool))) return;
  bool in_place = std::is_same<In, E>::value;
  for (std::size_t t = 0; t < x.tokens && in_place; ++t) {
    const auto slot = static_cast<std::size_t>(plan.slot(t));
    for (std::size_t h = 0; h < x.heads && in_place; ++h) {
      in_place = static_cast<const void*>(x.row(t, h)) == static_cast<const void*>(pool.row(slot, h));
    }
  }
  if (!in_place) {
    fail(fn, name, {"apart from ", pool_name, ", or each row the row of its own slot (already in the cache)"},
         "overlapping");
  }
}

// K and V against the plan and the cache.
template <class In, class E>
void check_kv(const char* fn, const Plan& plan, const PagedCache<E>& cache, const View<const In>& k,
              const View<const In>& v) {
  check_plan_cache(fn, plan, cache);
  check_writable(fn, plan);
  check_new_rows(fn, "k", k, "cache.k", cache.k, plan);
  check_new_rows(fn, "v", v, "cache.v", cache.v, plan);
  check_apart(fn, "k", k, "cache.v", cache.v);
  check_apart(fn, "v", v, "cache.k", cache.k);
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
  // eps is added in float: one that overflows float (1e300) or rounds to 0
  // would turn every row into zeros or NaN.
  const auto eps = static_cast<float>(o.eps);
  if (!(o.eps > 0) || !std::isfinite(o.eps) || !std::isfinite(eps) || !(eps > 0)) {
    fail(fn, "options.eps", "finite and > 0, also in float", o.eps);
  }
  n.weight = w.data;
  n.eps = eps;
  n.plus_one = o.plus_one;
  n.whole = o.whole_projection;
  return n;
}

// Where the tokens take their cos and sin from, checked: the plan's
// positions against the table (each sequence's last), or with
// options.pair_axes the pair axes against rotary_dim/2 and every axis'
// positions against the table. Nothing is checked without a table.
inline TokenAngles angles_of(const char* fn, const Plan& plan, std::size_t rotary_dim, const AppendOptions& o) {
  TokenAngles a;
  const Table<float>* table = o.rotation.table;
  if (table == nullptr) return a;
  a.table = table;
  const std::size_t tokens = plan.tokens();
  if (o.pair_axes == nullptr) {
    for (std::size_t t = 0; t < tokens; ++t) {
      if (static_cast<std::uint64_t>(plan.position(t)) >= table->positions()) {
        const std::size_t b = PlanAccess::sequence_of(plan, t);
        if (PlanAccess::tree(plan, b)) {  // a tree token sits at cached + depth, not at its index
          const std::int64_t cached =
              PlanAccess::lengths(plan)[b] - (PlanAccess::q_starts(plan)[b + 1] - PlanAccess::q_starts(plan)[b]);
          fail(fn, {"batch.tree_depths[", t, "]"},
               {"< options.rotation.table->positions() - ", cached, " = ",
                static_cast<std::int64_t>(table->positions()) - cached, " (its position is ", cached, " + depth)"},
               plan.position(t) - cached);
        }
        fail(fn, {"batch.lengths[", b, "]"},
             {"<= options.rotation.table->positions() = ", table->positions(), " (its last token's position + 1)"},
             PlanAccess::lengths(plan)[b]);
      }
    }
    a.positions = Positions(plan.positions());
    return a;
  }
  const PairAxes& pa = *o.pair_axes;
  rope::detail::check_pair_axes(fn, pa, rotary_dim / 2, "options.pair_axes->");
  if (o.axis_positions == nullptr && tokens > 0) {
    fail(fn, "options.axis_positions", "non-null when options.pair_axes is set", nullptr);
  }
  for (std::size_t axis = 0; axis < pa.axes && tokens > 0; ++axis) {
    const std::string name = indexed("options.axis_positions", axis);
    rope::detail::check_positions(fn, Positions(o.axis_positions + axis * tokens), tokens, table->positions(),
                                  {name.c_str(), name.c_str()});
  }
  a.multi = true;
  a.axes = rope::detail::MultiAxis<float>{table->cos(0), table->rotary_dim() / 2, o.axis_positions,
                                          tokens,        pa.axis.data(),          rotary_dim / 2};
  return a;
}

// What a checked append runs with.
struct AppendParams {
  Norm q_norm, k_norm;
  std::size_t rotary_dim = 0;
  TokenAngles angles;
  std::size_t workers = 1;
};

// Runs the checked append: token t's Q (when q_out has rows) into q_out,
// its K and V into the cache; each worker a contiguous share of the tokens.
template <class In, class QO, class E, class Arch>
void run_append(const Plan& plan, const PagedCache<E>& cache, const View<const In>& q, const View<const In>& k,
                const View<const In>& v, const View<QO>& q_out, View<In> k_back, const AppendOptions& o,
                AppendParams p) {
  const std::size_t tokens = plan.tokens();
  if (tokens == 0) return;
  p.q_norm.grouped = p.k_norm.grouped = tokens <= p.workers * kGroupedNormTokens;
  // A float Q with a per-head norm is normalized as the rotation loads it
  // (norm_rotate_store), by these weights.
  constexpr bool kFloatQ = std::is_same<In, float>::value && std::is_same<QO, float>::value;
  std::vector<float> q_plus_one;
  if (kFloatQ && p.q_norm.weight != nullptr && !p.q_norm.whole && p.rotary_dim > 0) {
    p.q_norm.rotated_weight = p.q_norm.weight;
    if (p.q_norm.plus_one) {
      q_plus_one.resize(p.rotary_dim);
      for (std::size_t c = 0; c < p.rotary_dim; ++c) q_plus_one[c] = 1.0f + p.q_norm.weight[c];
      p.q_norm.rotated_weight = q_plus_one.data();
    }
  }
  const bool stream = streams<E>(o.stores, tokens, k, v);
  const TokenWriter<In, E, Arch> writer{k, v, cache, o.rotation, p.rotary_dim, p.k_norm, k_back, stream};
  // Per worker: a token's rows (the writer's scratch), then its gathered
  // cos/sin (multi-axis), each on 64-byte lines of its own.
  const std::size_t rows = std::max(q.heads * q.head_dim, writer.scratch_size());
  const std::size_t per = rope::detail::line_floats(rows + (p.angles.multi ? p.rotary_dim : 0));
  std::vector<float> buffer(p.workers * per + rope::detail::kLineFloats);
  float* const scratch = rope::detail::line_start(buffer);
  const bool with_q = q_out.tokens > 0;
  rope::detail::parallel_for(p.workers, p.workers, plan.threads().executor, [&](std::size_t w, std::size_t) {
    float* x = scratch + w * per;
    const std::size_t end = tokens * (w + 1) / p.workers;
    for (std::size_t t = tokens * w / p.workers; t < end; ++t) {
      if (t + 1 < tokens) prefetch_token(q, k, v, t + 1);
      const float* cos;
      const float* sin;
      p.angles.of(t, x + rows, cos, sin);
      // Q first: q_out may be q, and K's write-back never touches q.
      bool q_done = !with_q;
      if constexpr (kFloatQ) {
        if (!q_done && p.q_norm.rotated_weight != nullptr && cos != nullptr) {
          norm_rotate_store<Arch>(q, t, p.q_norm, o.rotation.style, p.rotary_dim, cos, sin, q_out, x);
          q_done = true;
        }
      }
      if (!q_done) {
        load_normed<In, Arch>(q, t, p.q_norm, x);
        rotate_store<Arch>(x, o.rotation.style, p.rotary_dim, cos, sin, q_out, t);
      }
      writer.write(t, plan.slot(t), cos, sin, x);
    }
    if (stream) rope::detail::stream_fence<Arch>();
  });
}

// append (forwarders.hpp), checked and run: the step before attention
// for one layer, one pass per token (see the header comment): q [tokens, q_heads, head_dim] normalized and rotated into
// q_out (q_out may be q itself: in place), k and v [tokens, kv_heads,
// head_dim] (v: v_head_dim) written into the slots of the plan's tokens,
// K normalized and rotated first, written back into k too only with
// options.write_back_k. q, k, v: float, BFloat16 or Float16, one type (the
// parts of a fused QKV buffer, rope::split_qkv), read-only or not; q_out:
// float, BFloat16 or Float16. Refused before anything is written: a plan
// that failed, a cache or views that do not fit the plan, a new token's
// page read by another sequence of the batch (copy a shared page before a
// sequence writes into it), norm weights of the wrong length, eps not
// finite and > 0 in float, a rotation without its pairing or wider than
// the heads, positions outside the table, pair axes that do not fit
// rotary_dim/2, views that overlap each other or the cache (q_out may be
// q; k and v may already be their own slots' rows).
template <class In, class QO, class E, class Arch>
void append_call(const Plan& plan, const PagedCache<E>& cache, const View<const In>& q, const View<const In>& k,
                 const View<const In>& v, const View<QO>& q_out, bool k_writable, const AppendOptions& options) {
  using A = arch_of<Arch>;
  const char* fn = "rope::attention::append";
  detail::check_kv(fn, plan, cache, k, v);
  const Shape& s = plan.shape();
  rope::detail::check_view(fn, "q", q);
  rope::detail::check_view(fn, "q_out", q_out);
  const std::size_t q_dims[3] = {plan.tokens(), s.q_heads, s.head_dim};
  const char* dims[3] = {"tokens", "heads", "head_dim"};
  const std::size_t qv[3] = {q.tokens, q.heads, q.head_dim}, ov[3] = {q_out.tokens, q_out.heads, q_out.head_dim};
  for (std::size_t i = 0; i < 3; ++i) {
    if (qv[i] != q_dims[i]) detail::fail(fn, {"q.", dims[i]}, {"the plan's ", q_dims[i]}, qv[i]);
    if (ov[i] != q_dims[i]) detail::fail(fn, {"q_out.", dims[i]}, {"q.", dims[i], " = ", q_dims[i]}, ov[i]);
  }
  const bool q_in_place = detail::same_rows(q, q_out);
  if (!q_in_place) rope::detail::check_disjoint(fn, "q_out", q_out, "q", q);
  rope::detail::check_disjoint(fn, "q_out", q_out, "k", k);
  rope::detail::check_disjoint(fn, "q_out", q_out, "v", v);
  for (const auto* pool : {&cache.k, &cache.v}) {
    const char* name = pool == &cache.k ? "cache.k" : "cache.v";
    detail::check_apart(fn, "q_out", q_out, name, *pool);
    detail::check_apart(fn, "q", q, name, *pool);
  }
  View<In> k_back;
  if (options.write_back_k) {
    if (!k_writable) detail::fail(fn, "options.write_back_k", "false for a read-only k view", "true");
    rope::detail::check_disjoint(fn, "k", k, "q", q);
    rope::detail::check_disjoint(fn, "k", k, "v", v);
    if (!q_in_place) rope::detail::check_disjoint(fn, "k", k, "q_out", q_out);
    k_back = View<In>(const_cast<In*>(k.data), k.tokens, k.heads, k.head_dim, k.token_stride, k.head_stride);
  }
  detail::AppendParams p;
  p.q_norm = detail::norm_of(fn, "options.q_norm", options.q_norm,
                             options.whole_projection ? q.heads * q.head_dim : q.head_dim, options);
  p.k_norm = detail::norm_of(fn, "options.k_norm", options.k_norm,
                             options.whole_projection ? k.heads * k.head_dim : k.head_dim, options);
  p.rotary_dim = detail::rotary_width(fn, "options.rotation", options.rotation, q.head_dim);
  p.angles = detail::angles_of(fn, plan, p.rotary_dim, options);
  p.workers = std::min(plan.tokens(), std::max<std::size_t>(1, plan.threads().shares()));
  detail::run_append<In, QO, E, A>(plan, cache, q, k, v, q_out, k_back, options, p);
}

// append's K/V form (forwarders.hpp), checked and run: new keys and values into the plan's slots, K normalized
// (options.k_norm) and rotated first; no Q (options.q_norm refused). The
// caller rotates Q itself at plan.positions(), or its layer has no RoPE.
template <class In, class E, class Arch>
void append_kv_call(const Plan& plan, const PagedCache<E>& cache, const View<const In>& k, const View<const In>& v,
                    bool k_writable, const AppendOptions& options) {
  using A = arch_of<Arch>;
  const char* fn = "rope::attention::append";
  detail::check_kv(fn, plan, cache, k, v);
  if (options.q_norm.data != nullptr) detail::fail(fn, "options.q_norm.data", "null: this form writes no Q", "set");
  View<In> k_back;
  if (options.write_back_k) {
    if (!k_writable) detail::fail(fn, "options.write_back_k", "false for a read-only k view", "true");
    rope::detail::check_disjoint(fn, "k", k, "v", v);
    k_back = View<In>(const_cast<In*>(k.data), k.tokens, k.heads, k.head_dim, k.token_stride, k.head_stride);
  }
  detail::AppendParams p;
  p.k_norm = detail::norm_of(fn, "options.k_norm", options.k_norm,
                             options.whole_projection ? k.heads * k.head_dim : k.head_dim, options);
  p.rotary_dim = detail::rotary_width(fn, "options.rotation", options.rotation, k.head_dim);
  p.angles = detail::angles_of(fn, plan, p.rotary_dim, options);
  p.workers = std::min(plan.tokens(), std::max<std::size_t>(1, plan.threads().shares()));
  const View<const In> no_q(k.data, 0, 1, k.head_dim, 0, 0);
  detail::run_append<In, In, E, A>(plan, cache, no_q, k, v, View<In>(), k_back, options, p);
}

}  // namespace detail
}  // namespace rope::attention
