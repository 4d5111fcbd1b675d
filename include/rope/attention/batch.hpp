// rope/attention/batch.hpp — softmax attention for a batch of sequences over
// a paged KV cache (paged.hpp): prefill, chunked prefill and decode in one
// call, the way a server steps its running requests.
//
// A batch of B sequences: sequence b's new tokens are the packed query rows
// q_starts[b] .. q_starts[b+1]-1 (cu_seqlens / qo_indptr), and its cache
// holds lengths[b] keys, the new tokens' own keys included (the last n_b =
// q_starts[b+1] - q_starts[b] of them). Its key j sits in slot
// block_table[b][j / page_size] * page_size + j % page_size. Positions come
// from the lengths, so they cannot drift from the cache: key j is at
// position j, new token i of sequence b at lengths[b] - n_b + i. A query
// sees the keys of its own sequence only: all of them, or (causal) those at
// positions <= its own, and with a window only those at positions >
// its own - window (so it always sees its own key). A page may appear in
// several sequences' rows (shared, read-only), never twice in one.
//
//   s_ij = scale * q_i . k_j  (int8: k_j = s_j q_j, its vector's scale)
//   s_ij <- cap * tanh(s_ij / cap)                       (softcap)
//   out_i = sum_j exp(s_ij - M) v_j / (exp(sink_h - M) + sum_j exp(s_ij - M))
//
// over the visible j, in that order (options.hpp): scale, softcap, the mask,
// the sink in the denominator only. A query that sees no key gets zeros,
// with a sink too. A NaN or Inf in a key or value reaches only the queries
// that see it: masked keys are left out of the sums, and sequences never
// read each other's pages (unless they share them).
//
// Arithmetic in float over the stored values widened exactly; Q and out may
// be float, BFloat16 or Float16. Q is rotated by options.rotation at its
// positions (the cache holds rotated keys); without a table Q is used as
// given.
//
// Work and rounding: one item per (sequence, new token) over every head, the
// keys in chunks of min(64, options.kv_split) with a running max and sum per query
// head; a key token's rows of all key/value heads are read together, in
// memory order, each once for the query heads of its group.
// A decode token (n_b == 1) is split: one item per part of kv_split keys
// (aligned at multiples of kv_split), each part's (max, sum, weighted sum)
// merged in order afterwards (log-sum-exp). The split and the merge order
// depend on the cache lengths and options.kv_split only, never on the
// thread count or the executor, so the output is the same bytes for any
// thread count, and a sequence's rows are the same bytes in any batch.
//
// Memory: a BatchWorkspace the caller may keep between steps holds what a
// call needs (items, per-part partial sums, per-thread rows); a call that is
// given none allocates its own.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "../detail/lines.hpp"
#include "../detail/parallel.hpp"
#include "../kernels/kv_rows.hpp"
#include "../tensor/dispatch_table.hpp"
#include "append.hpp"
#include "checks.hpp"
#include "paged.hpp"
#include "rows.hpp"
#include "types.hpp"

namespace rope::attention {

// Which sequences, which tokens, which pages (see above). Pointers the call
// reads only: q_starts has sequences + 1 entries (q_starts[0] = 0, non-
// decreasing, q_starts[sequences] = q.tokens), lengths and the block table
// (sequences rows of block_table_stride page ids) one row per sequence.
struct Batch {
  const std::int64_t* q_starts = nullptr;
  const std::int64_t* lengths = nullptr;
  const std::int32_t* block_table = nullptr;
  std::size_t block_table_stride = 0;
  std::size_t sequences = 0;
};

struct BatchOptions {
  std::optional<double> scale;    // empty: 1/sqrt(head_dim)
  std::optional<double> softcap;  // set: finite and > 0
  // One logit per query head (q.heads), in the denominator only; -inf: none
  // for that head. Empty: no sinks.
  std::vector<double> sinks;
  bool causal = true;          // a decoder's new tokens see the keys up to their own position
  std::size_t window = 0;      // > 0: key j visible to query i only if j > p_i - window
  Rotation<float> rotation;    // Q rotated at its positions (softmax_batch_step: new K too)
  std::size_t kv_split = 512;  // keys per part of a decode token's split
  std::size_t threads = 1;
  Executor executor;  // set: shares run on the caller's pool, executor.workers of them
};

namespace detail {

struct BatchItem {
  std::size_t sequence, token, first_key, keys;
  std::size_t partial;  // index of its partial sums, or kDirect
};
struct BatchMerge {
  std::size_t token, first_item, items;
};
constexpr std::size_t kDirect = static_cast<std::size_t>(-1);
// An item's fixed cost (its query rows set up, its sums written), in keys.
constexpr std::size_t kItemCost = 16;

}  // namespace detail

// What a batched call keeps between steps (its contents are rope's): reuse
// one per thread that calls, to allocate nothing once it has grown.
struct BatchWorkspace {
  std::vector<detail::BatchItem> items;
  std::vector<detail::BatchMerge> merges;
  std::vector<float> partials;
  std::vector<float> scratch;
  std::vector<std::int32_t> owners;  // per page: who reads it
  std::vector<std::int64_t> slots, positions;
};

namespace detail {

// The checked plan of a batched call.
struct BatchPlan {
  std::size_t q_heads = 0, kv_heads = 0, group = 0, d = 0, dv = 0;
  std::size_t rotary_dim = 0;
  float scale = 1;
  float softcap = 0;              // 0: none
  const double* sinks = nullptr;  // options.sinks, checked; null: none
  std::size_t split = 512;
  std::size_t chunk = 64;  // min(split, kBatchChunk): keys per chunk of scores
  std::size_t threads = 1;
};

// Keys per chunk of an item's scores: a chunk's values (64 tokens x every
// head) stay in L2 between the scores and the weighted sum.
constexpr std::size_t kBatchChunk = kAttendMaxChunk;

inline std::int64_t new_tokens(const Batch& batch, std::size_t b) noexcept {
  return batch.q_starts[b + 1] - batch.q_starts[b];
}

// The batch against q's tokens and the cache's pages: starts, lengths, and
// every page id a sequence reads inside the pool.
template <class E>
void check_batch(const char* fn, const Batch& batch, std::size_t q_tokens, const PagedCache<E>& cache,
                 std::vector<std::int32_t>& marks) {
  if (batch.q_starts == nullptr) fail(fn, "batch.q_starts", "non-null (sequences + 1 entries)", nullptr);
  if (batch.q_starts[0] != 0) fail(fn, "batch.q_starts[0]", "0", batch.q_starts[0]);
  if (batch.sequences > 0 && (batch.lengths == nullptr || batch.block_table == nullptr)) {
    fail(fn, batch.lengths == nullptr ? "batch.lengths" : "batch.block_table", "non-null", nullptr);
  }
  const std::size_t ps = cache.k.page_size;
  marks.assign(cache.k.pages, -1);
  for (std::size_t b = 0; b < batch.sequences; ++b) {
    if (batch.q_starts[b + 1] < batch.q_starts[b]) {
      fail(fn, {"batch.q_starts[", b + 1, "]"},
           {">= batch.q_starts[", b, "] = ", batch.q_starts[b], " (starts never decrease)"}, batch.q_starts[b + 1]);
    }
    const std::int64_t n = new_tokens(batch, b), len = batch.lengths[b];
    if (len < n) {
      fail(fn, {"batch.lengths[", b, "]"}, {">= its new tokens ", n, " (the cache holds the new tokens' keys)"}, len);
    }
    const std::uint64_t capacity = static_cast<std::uint64_t>(batch.block_table_stride) * ps;
    if (static_cast<std::uint64_t>(len) > capacity) {
      fail(fn, {"batch.lengths[", b, "]"},
           {"<= its pages' slots ", capacity, " (batch.block_table_stride * page_size)"}, len);
    }
    const std::size_t pages = (static_cast<std::size_t>(len) + ps - 1) / ps;
    const std::int32_t* row = batch.block_table + b * batch.block_table_stride;
    for (std::size_t i = 0; i < pages; ++i) {
      if (row[i] < 0 || static_cast<std::size_t>(row[i]) >= cache.k.pages) {
        fail(fn, {"batch.block_table[", b, "][", i, "]"}, {"a page id below cache.k.pages = ", cache.k.pages}, row[i]);
      }
      // A page twice in one sequence would hold two of its keys in one slot.
      std::int32_t& mark = marks[static_cast<std::size_t>(row[i])];
      if (mark == static_cast<std::int32_t>(b)) {
        fail(fn, {"batch.block_table[", b, "][", i, "]"}, "a page this sequence does not already list", row[i]);
      }
      mark = static_cast<std::int32_t>(b);
    }
  }
  const std::int64_t last = batch.q_starts[batch.sequences];
  if (last < 0 || static_cast<std::uint64_t>(last) != q_tokens) {
    fail(fn, {"batch.q_starts[", batch.sequences, "]"}, {"q.tokens = ", q_tokens}, last);
  }
}

template <class Q, class O, class E>
BatchPlan check_batch_call(const char* fn, const View<const Q>& q, const PagedCache<E>& cache, const Batch& batch,
                           const View<O>& out, const BatchOptions& o, BatchWorkspace& ws) {
  check_cache(fn, cache);
  rope::detail::check_view(fn, "q", q);
  rope::detail::check_view(fn, "out", out);
  rope::detail::check_grouped_heads(fn, "cache.k.heads", cache.k.heads, "q.heads", q.heads);
  if (q.head_dim != cache.k.head_dim) {
    fail(fn, "q.head_dim", {"cache.k.head_dim = ", cache.k.head_dim}, q.head_dim);
  }
  if (out.tokens != q.tokens) fail(fn, "out.tokens", {"q.tokens = ", q.tokens}, out.tokens);
  if (out.heads != q.heads) fail(fn, "out.heads", {"q.heads = ", q.heads}, out.heads);
  if (out.head_dim != cache.v.head_dim) {
    fail(fn, "out.head_dim", {"cache.v.head_dim = ", cache.v.head_dim}, out.head_dim);
  }
  rope::detail::check_disjoint(fn, "out", out, "q", q);
  check_apart(fn, "out", out, "cache.k", cache.k);
  check_apart(fn, "out", out, "cache.v", cache.v);
  check_batch(fn, batch, q.tokens, cache, ws.owners);
  rope::detail::check_threads(fn, "options.threads", o.threads);
  rope::detail::check_executor(fn, "options.executor.workers", o.executor);
  if (o.kv_split == 0) fail(fn, "options.kv_split", "at least 1", o.kv_split);
  BatchPlan plan;
  plan.q_heads = q.heads;
  plan.kv_heads = cache.k.heads;
  plan.group = q.heads / cache.k.heads;
  plan.d = q.head_dim;
  plan.dv = cache.v.head_dim;
  plan.split = o.kv_split;
  plan.chunk = std::min<std::size_t>(o.kv_split, kBatchChunk);
  plan.threads = rope::detail::thread_count(o.threads, o.executor);
  double scale = 1.0 / std::sqrt(static_cast<double>(q.head_dim));
  if (o.scale) {
    if (!std::isfinite(*o.scale) || !std::isfinite(static_cast<float>(*o.scale))) {
      fail(fn, "options.scale", "finite", *o.scale);
    }
    scale = *o.scale;
  }
  plan.scale = static_cast<float>(scale);
  if (o.softcap) {
    const double cap = *o.softcap;
    if (!(cap > 0) || !std::isfinite(cap) || !std::isfinite(static_cast<float>(cap)) || static_cast<float>(cap) == 0) {
      fail(fn, "options.softcap", "finite and > 0", cap);
    }
    plan.softcap = static_cast<float>(cap);
  }
  if (!o.sinks.empty()) {
    if (o.sinks.size() != q.heads) {
      fail(fn, "options.sinks.size()", {"0 or the query heads ", q.heads}, o.sinks.size());
    }
    const float neg_inf = -std::numeric_limits<float>::infinity();
    for (std::size_t h = 0; h < q.heads; ++h) {
      const float sink = static_cast<float>(o.sinks[h]);
      if (!std::isfinite(sink) && sink != neg_inf) fail(fn, {"options.sinks[", h, "]"}, "finite or -inf", o.sinks[h]);
    }
    plan.sinks = o.sinks.data();
  }
  plan.rotary_dim = rotary_width(fn, "options.rotation", o.rotation, q.head_dim);
  if (o.rotation.table != nullptr) {
    const std::size_t rows = o.rotation.table->positions();
    for (std::size_t b = 0; b < batch.sequences; ++b) {
      const std::int64_t last = batch.lengths[b] - 1;
      if (new_tokens(batch, b) > 0 && static_cast<std::uint64_t>(last) >= rows) {
        fail(fn, {"batch.lengths[", b, "]"},
             {"<= options.rotation.table->positions() = ", rows, " (its last token's position + 1)"}, batch.lengths[b]);
      }
    }
  }
  return plan;
}

// The keys query position p of a sequence of `length` keys sees: [lo, hi).
inline void visible_keys(std::int64_t p, std::int64_t length, const BatchOptions& o, std::size_t* lo,
                         std::size_t* hi) noexcept {
  const std::int64_t h = o.causal ? std::min(length, p + 1) : length;
  std::int64_t l = 0;
  if (o.window > 0 && p - static_cast<std::int64_t>(o.window) + 1 > 0) l = p - static_cast<std::int64_t>(o.window) + 1;
  *lo = static_cast<std::size_t>(l);
  *hi = static_cast<std::size_t>(std::max(l, h));
}

// The items of a call (see the header comment) and the token-heads whose
// items are merged afterwards; returns the number of partials.
inline std::size_t plan_items(const Batch& batch, const BatchPlan& plan, const BatchOptions& o, BatchWorkspace& ws) {
  ws.items.clear();
  ws.merges.clear();
  std::size_t partials = 0;
  for (std::size_t b = 0; b < batch.sequences; ++b) {
    const std::int64_t n = new_tokens(batch, b), len = batch.lengths[b];
    for (std::int64_t i = 0; i < n; ++i) {
      const std::size_t t = static_cast<std::size_t>(batch.q_starts[b] + i);
      std::size_t lo = 0, hi = 0;
      visible_keys(len - n + i, len, o, &lo, &hi);
      const std::size_t first = ws.items.size();
      if (n == 1) {
        for (std::size_t k = lo; k < hi;) {
          const std::size_t end = std::min(hi, (k / plan.split + 1) * plan.split);
          ws.items.push_back({b, t, k, end - k, kDirect});
          k = end;
        }
      } else if (hi > lo) {
        ws.items.push_back({b, t, lo, hi - lo, kDirect});
      }
      const std::size_t count = ws.items.size() - first;
      if (count != 1) {
        ws.merges.push_back({t, first, count});
        for (std::size_t k = first; k < ws.items.size(); ++k) ws.items[k].partial = partials++;
      }
    }
  }
  return partials;
}

// The per-thread rows of a batched call.
struct BatchScratch {
  float* q;     // q_heads x d: the query rows, widened and rotated
  float* work;  // attend_work(q_heads, d, dv, chunk)
  float* acc;   // q_heads x dv
  float* m;     // q_heads
  float* l;     // q_heads
  float* row;   // max(d, dv): one widened row, or one output row
};

// Each part starts on a cache line (line_floats), and so does each
// worker's scratch: the rows are read with whole vector loads, and two
// workers never write to one line.
inline std::size_t scratch_floats(const BatchPlan& p) noexcept {
  return rope::detail::line_floats(p.q_heads * p.d) + attend_work(p.q_heads, p.d, p.dv, p.chunk) +
         rope::detail::line_floats(p.q_heads * p.dv) + 2 * rope::detail::line_floats(p.q_heads) +
         rope::detail::line_floats(std::max(p.d, p.dv));
}

inline BatchScratch scratch_at(float* base, const BatchPlan& p) noexcept {
  BatchScratch s;
  s.q = base;
  s.work = s.q + rope::detail::line_floats(p.q_heads * p.d);
  s.acc = s.work + attend_work(p.q_heads, p.d, p.dv, p.chunk);
  s.m = s.acc + rope::detail::line_floats(p.q_heads * p.dv);
  s.l = s.m + rope::detail::line_floats(p.q_heads);
  s.row = s.l + rope::detail::line_floats(p.q_heads);
  return s;
}

// The final row of query head h from its (max, sum, weighted sum): with the
// sink in the denominator, rounded once into O; zeros for a query that sees
// no key.
template <class O>
void finish_row(const BatchPlan& plan, std::size_t h, bool sees, float m, float l, const float* acc, O* dst,
                float* row) noexcept {
  if (!sees) {
    for (std::size_t c = 0; c < plan.dv; ++c) row[c] = 0.0f;
    store_kv_row(row, plan.dv, dst, nullptr);
    return;
  }
  float num_scale = 1.0f, den = l;
  if (plan.sinks != nullptr && static_cast<float>(plan.sinks[h]) != -std::numeric_limits<float>::infinity()) {
    const auto sink = static_cast<float>(plan.sinks[h]);
    const float top = sink > m ? sink : m;
    num_scale = std::exp(m - top);
    den = l * num_scale + std::exp(sink - top);
  }
  for (std::size_t c = 0; c < plan.dv; ++c) row[c] = acc[c] * num_scale / den;
  store_kv_row(row, plan.dv, dst, nullptr);
}

// attend_keys for E: the one rope::dispatch installed, else the one
// compiled here for Arch.
template <class E, class Arch>
void attend(const KvKeys<E>& keys, const float* q, float* work, float* m, float* l, float* acc) noexcept {
  if (const auto installed = rope::detail::installed_attend<E>()) {
    installed(keys, q, work, m, l, acc);
  } else {
    attend_keys<E, Arch>(keys, q, work, m, l, acc);
  }
}

template <class Q, class E, class O, class Arch>
class BatchRun {
 public:
  BatchRun(const View<const Q>& q, const PagedCache<E>& cache, const Batch& batch, const View<O>& out,
           const BatchOptions& o, const BatchPlan& plan, BatchWorkspace& ws) noexcept
      : q_(q), batch_(batch), out_(out), o_(o), plan_(plan), ws_(ws) {
    keys_.k = cache.k.data;
    keys_.v = cache.v.data;
    keys_.k_scales = cache.k.scales;
    keys_.v_scales = cache.v.scales;
    keys_.page_size = cache.k.page_size;
    keys_.k_page_stride = cache.k.page_stride;
    keys_.k_token_stride = cache.k.token_stride;
    keys_.k_head_stride = cache.k.head_stride;
    keys_.v_page_stride = cache.v.page_stride;
    keys_.v_token_stride = cache.v.token_stride;
    keys_.v_head_stride = cache.v.head_stride;
    keys_.q_heads = plan.q_heads;
    keys_.kv_heads = plan.kv_heads;
    keys_.d = plan.d;
    keys_.dv = plan.dv;
    keys_.chunk = plan.chunk;
    keys_.scale = plan.scale;
    keys_.softcap = plan.softcap;
  }

  // One item: its query rows, its keys, then its rows written or its
  // partial kept.
  void item(std::size_t index, BatchScratch s) const noexcept {
    const BatchItem& it = ws_.items[index];
    const std::size_t H = plan_.q_heads, d = plan_.d, dv = plan_.dv;
    const std::int64_t n = new_tokens(batch_, it.sequence), len = batch_.lengths[it.sequence];
    const std::int64_t pos = len - n + (static_cast<std::int64_t>(it.token) - batch_.q_starts[it.sequence]);
    for (std::size_t h = 0; h < H; ++h) {
      float* row = s.q + h * d;
      widen_row(q_.row(it.token, h), d, row);
      rotate_at(o_.rotation, plan_.rotary_dim, static_cast<std::size_t>(pos), row, row, 0, 1, d);
    }
    KvKeys<E> keys = keys_;
    keys.pages = batch_.block_table + it.sequence * batch_.block_table_stride;
    keys.first_key = it.first_key;
    keys.keys = it.keys;
    attend<E, Arch>(keys, s.q, s.work, s.m, s.l, s.acc);
    if (it.partial == kDirect) {
      for (std::size_t h = 0; h < H; ++h) {
        finish_row(plan_, h, true, s.m[h], s.l[h], s.acc + h * dv, out_.row(it.token, h), s.row);
      }
      return;
    }
    float* p = partial(it.partial);
    std::copy(s.acc, s.acc + H * dv, p);
    std::copy(s.m, s.m + H, p + H * dv);
    std::copy(s.l, s.l + H, p + H * dv + H);
  }

  // One token of several items (or none): their partials merged in order.
  void merge(std::size_t index, BatchScratch s) const noexcept {
    const BatchMerge& mg = ws_.merges[index];
    const std::size_t H = plan_.q_heads, dv = plan_.dv;
    if (mg.items == 0) {
      for (std::size_t h = 0; h < H; ++h) {
        finish_row(plan_, h, false, 0.0f, 0.0f, s.acc, out_.row(mg.token, h), s.row);
      }
      return;
    }
    for (std::size_t h = 0; h < H; ++h) {
      float m = -std::numeric_limits<float>::infinity(), l = 0.0f;
      float* acc = s.acc + h * dv;
      std::fill_n(acc, dv, 0.0f);
      for (std::size_t k = 0; k < mg.items; ++k) {
        const float* p = partial(ws_.items[mg.first_item + k].partial);
        const float pm = p[H * dv + h], pl = p[H * dv + H + h];
        const float m_new = pm > m ? pm : m;
        const float carried = m == m_new ? 1.0f : std::exp(m - m_new);
        const float weight = pm == m_new ? 1.0f : std::exp(pm - m_new);
        l = l * carried + pl * weight;
        const float* pa = p + h * dv;
        for (std::size_t c = 0; c < dv; ++c) acc[c] = acc[c] * carried + pa[c] * weight;
        m = m_new;
      }
      finish_row(plan_, h, true, m, l, acc, out_.row(mg.token, h), s.row);
    }
  }

 private:
  float* partial(std::size_t i) const noexcept { return ws_.partials.data() + i * plan_.q_heads * (plan_.dv + 2); }

  View<const Q> q_;
  KvKeys<E> keys_;
  Batch batch_;
  View<O> out_;
  const BatchOptions& o_;
  const BatchPlan& plan_;
  BatchWorkspace& ws_;
};

// The attention of a checked call.
template <class Q, class E, class O, class Arch = xsimd::default_arch>
void run_batch(const View<const Q>& q, const PagedCache<E>& cache, const Batch& batch, const View<O>& out,
               const BatchOptions& o, const BatchPlan& plan, BatchWorkspace& ws) {
  const std::size_t partials = plan_items(batch, plan, o, ws);
  ws.partials.resize(partials * plan.q_heads * (plan.dv + 2));
  const std::size_t workers = std::max<std::size_t>(1, plan.threads);
  const std::size_t per = scratch_floats(plan);
  ws.scratch.resize(workers * per + rope::detail::kLineFloats);
  const BatchRun<Q, E, O, Arch> run(q, cache, batch, out, o, plan, ws);
  float* base = rope::detail::line_start(ws.scratch);
  // Shares of about equal numbers of keys (and a few keys' worth per item,
  // its rows' setup): the parts of a long cache and a short one's keys are
  // not worth the same.
  rope::detail::parallel_for_costs(
      ws.items.size(), plan.threads, o.executor, [&](std::size_t i) { return ws.items[i].keys + kItemCost; },
      [&](std::size_t i, std::size_t w) { run.item(i, scratch_at(base + w * per, plan)); });
  parallel_for(ws.merges.size(), plan.threads, o.executor,
               [&](std::size_t i, std::size_t w) { run.merge(i, scratch_at(base + w * per, plan)); });
}

}  // namespace detail

// Attention for a batch of sequences over a paged cache that already holds
// their new tokens' keys and values (write_slots, or the caller's own
// projection). q and out: [tokens, q_heads, head_dim] views, the tokens of
// sequence b at batch.q_starts[b] ..; out's head_dim is the cache's V
// head_dim. Everything is checked before out is written; nothing else is
// written. Arch: the instruction set of the work outside the cache reads
// (rotating q, merging, the output), which rope::dispatch does not route;
// the default, the caller's flags, keeps translation units built with
// different flags apart, as rope::apply's does.
template <class QV, class E, class O, class Arch = xsimd::default_arch>
void softmax_batch(const View<QV>& q_view, const PagedCache<E>& cache, const Batch& batch, View<O> out,
                   const BatchOptions& options = {}, BatchWorkspace* workspace = nullptr) {
  using Q = std::remove_const_t<QV>;
  const View<const Q> q(q_view);
  detail::check_kv_element<E>();
  detail::check_row_type<Q>();
  detail::check_row_type<O>();
  const char* fn = "rope::attention::softmax_batch";
  BatchWorkspace local;
  BatchWorkspace& ws = workspace != nullptr ? *workspace : local;
  const detail::BatchPlan plan = detail::check_batch_call(fn, q, cache, batch, out, options, ws);
  detail::run_batch<Q, E, O, Arch>(q, cache, batch, out, options, plan, ws);
}

// One step of a batch: writes each sequence's new K and V rows (k_new, v_new:
// [tokens, kv_heads, head_dim], packed like q) into the slots of their
// positions (new token i of sequence b at position lengths[b] - n_b + i, in
// the page block_table[b][position / page_size]), K rotated there by
// options.rotation, then attends as softmax_batch. Refused before anything
// is written, besides softmax_batch's refusals: a new token's slot inside a
// page that another sequence of the batch reads (a shared prefix page must
// be copied before a sequence writes into it), and K/V views that overlap
// the cache other than at their own slots. Arch: as softmax_batch's.
template <class QV, class E, class O, class Arch = xsimd::default_arch>
void softmax_batch_step(const View<QV>& q_view, const View<QV>& k_view, const View<QV>& v_view,
                        const PagedCache<E>& cache, const Batch& batch, View<O> out, const BatchOptions& options = {},
                        BatchWorkspace* workspace = nullptr) {
  using Q = std::remove_const_t<QV>;
  const View<const Q> q(q_view), k_new(k_view), v_new(v_view);
  detail::check_kv_element<E>();
  detail::check_row_type<Q>();
  detail::check_row_type<O>();
  const char* fn = "rope::attention::softmax_batch_step";
  BatchWorkspace local;
  BatchWorkspace& ws = workspace != nullptr ? *workspace : local;
  const detail::BatchPlan plan = detail::check_batch_call(fn, q, cache, batch, out, options, ws);
  if (k_new.tokens != q.tokens) detail::fail(fn, "k_new.tokens", {"q.tokens = ", q.tokens}, k_new.tokens);
  if (v_new.tokens != q.tokens) detail::fail(fn, "v_new.tokens", {"q.tokens = ", q.tokens}, v_new.tokens);
  // Who reads each page: a sequence id, or -2 for two or more.
  const std::size_t ps = cache.k.page_size;
  ws.owners.assign(cache.k.pages, -1);
  for (std::size_t b = 0; b < batch.sequences; ++b) {
    const std::size_t pages = (static_cast<std::size_t>(batch.lengths[b]) + ps - 1) / ps;
    const std::int32_t* row = batch.block_table + b * batch.block_table_stride;
    for (std::size_t i = 0; i < pages; ++i) {
      std::int32_t& owner = ws.owners[static_cast<std::size_t>(row[i])];
      owner = owner == -1 || owner == static_cast<std::int32_t>(b) ? static_cast<std::int32_t>(b) : -2;
    }
  }
  std::vector<std::int64_t>& slots = ws.slots;
  std::vector<std::int64_t>& positions = ws.positions;
  slots.resize(q.tokens);
  positions.resize(q.tokens);
  for (std::size_t b = 0; b < batch.sequences; ++b) {
    const std::int64_t n = detail::new_tokens(batch, b), len = batch.lengths[b];
    const std::int32_t* row = batch.block_table + b * batch.block_table_stride;
    for (std::int64_t i = 0; i < n; ++i) {
      const std::size_t t = static_cast<std::size_t>(batch.q_starts[b] + i);
      const std::size_t p = static_cast<std::size_t>(len - n + i);
      const std::int32_t page = row[p / ps];
      if (ws.owners[static_cast<std::size_t>(page)] != static_cast<std::int32_t>(b)) {
        detail::fail(fn, {"batch.block_table[", b, "][", p / ps, "]"},
                     {"a page no other sequence of the batch reads (new token ", t, " is written there)"}, page);
      }
      slots[t] = static_cast<std::int64_t>(static_cast<std::size_t>(page) * ps + p % ps);
      positions[t] = static_cast<std::int64_t>(p);
    }
  }
  detail::check_writes(fn, k_new, v_new, slots.data(), cache, "k_new", "v_new");
  rope::detail::check_disjoint(fn, "out", out, "k_new", k_new);
  rope::detail::check_disjoint(fn, "out", out, "v_new", v_new);
  // The only writes before the attention, after every check.
  const detail::TokenWriter<Q, E, Arch> writer{k_new, v_new, cache, options.rotation, plan.rotary_dim, {}, {}};
  ws.scratch.resize(std::max(ws.scratch.size(), std::max(k_new.heads * plan.d, plan.dv)));
  for (std::size_t t = 0; t < q.tokens; ++t) writer.write(t, slots[t], positions[t], ws.scratch.data());
  detail::run_batch<Q, E, O, Arch>(q, cache, batch, out, options, plan, ws);
}

}  // namespace rope::attention
