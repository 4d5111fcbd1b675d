// rope/attention/attend.hpp — softmax attention of a layer's new tokens over
// a paged KV cache, as the step's plan laid it out (plan.hpp): prefill,
// chunked prefill and decode of many sequences in one call.
//
// For new token t of sequence b at position p_t, query head h (key/value
// head h / (q_heads / kv_heads)), over the keys j of b's cache it sees:
//   s_j = scale * q_th . k_j                      (int8: k_j = s_j q_j, its vector's scale)
//   s_j <- cap * tanh(s_j / cap)                  (logits.softcap)
//   j seen iff j <= p_t (mask.causal) and j > p_t - window (mask.window > 0)
//   out_th = sum_j exp(s_j - M) v_j / (exp(sink_h - M) + sum_j exp(s_j - M))
// in the order of logits.hpp; lse_th (when asked for) its log-sum-exp.
// Q is read as given: the cache holds rotated keys, and append (or the
// caller) rotated Q at p_t. A NaN or Inf in a key or value reaches only the
// queries that see it: masked keys are left out of the sums, and sequences
// never read each other's pages (unless their block tables share them).
//
// Arithmetic in float over the stored values widened exactly; q and out
// are float, BFloat16 or Float16 (out rounded once). Work: the plan's items,
// each a token over every head, its keys in chunks of 64 with a running max
// and sum per query head (kernels/kv_decode.hpp: a key token's rows of all
// key/value heads read together, in memory order, each once for the query
// heads of its group); a decode token's parts merged in part order. Items
// go to contiguous shares of about equal keys, on the plan's threads: the
// same bytes for any thread count, executor and batch.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "../detail/lines.hpp"
#include "../detail/parallel.hpp"
#include "../kernels/kv_decode.hpp"
#include "../kernels/kv_store.hpp"
#include "../kernels/scores.hpp"
#include "../tensor/view_checks.hpp"
#include "cache.hpp"
#include "cascade_attend.hpp"
#include "cascade_tiles.hpp"
#include "dispatch_slots.hpp"
#include "forwarders.hpp"
#include "logits.hpp"
#include "masks.hpp"
#include "plan.hpp"
#include "sparse.hpp"

namespace rope::attention {

namespace detail {

// What a checked attend runs with.
struct AttendParams {
  std::size_t q_heads = 0, kv_heads = 0, d = 0, dv = 0;
  LogitParams<float> logits;
  Mask mask;
  std::size_t chunk = kAttendMaxChunk;  // min(kv_split, kAttendMaxChunk): keys per chunk of scores
  Products products = Products::exact;
};

// The per-worker rows of an attend call.
struct AttendScratch {
  float* q;     // q_heads x d: the query rows, widened
  float* work;  // attend_work(q_heads, d, dv, chunk)
  float* acc;   // q_heads x dv
  float* m;     // q_heads
  float* l;     // q_heads
  float* row;   // max(d, dv): one widened row, or one output row
};

// Each part on whole cache lines: rows read with whole vector loads, and two
// workers never write to one line.
inline std::size_t scratch_floats(const AttendParams& p) noexcept {
  using rope::detail::line_floats;
  return line_floats(p.q_heads * p.d) + attend_work(p.q_heads, p.d, p.dv, p.chunk) + line_floats(p.q_heads * p.dv) +
         2 * line_floats(p.q_heads) + line_floats(std::max(p.d, p.dv));
}

inline AttendScratch scratch_at(float* base, const AttendParams& p) noexcept {
  using rope::detail::line_floats;
  AttendScratch s;
  s.q = base;
  s.work = s.q + line_floats(p.q_heads * p.d);
  s.acc = s.work + attend_work(p.q_heads, p.d, p.dv, p.chunk);
  s.m = s.acc + line_floats(p.q_heads * p.dv);
  s.l = s.m + line_floats(p.q_heads);
  s.row = s.l + line_floats(p.q_heads);
  return s;
}

// attend_keys for E: the one rope::dispatch installed, else the one compiled
// here for Arch.
template <class E, class Arch>
void attend_keys_of(const KvKeys<E>& keys, const float* q, float* work, float* m, float* l, float* acc) noexcept {
  if (const auto installed = rope::detail::installed_attend<E>()) {
    installed(keys, q, work, m, l, acc);
  } else {
    attend_keys<E, Arch>(keys, q, work, m, l, acc);
  }
}

template <class Q, class E, class O, class Arch>
class AttendRun {
 public:
  AttendRun(const Plan& plan, const PagedCache<E>& cache, const View<const Q>& q, const View<O>& out, float* lse,
            const AttendParams& p, const WorkLayout& work, float* partials) noexcept
      : plan_(plan), q_(q), out_(out), lse_(lse), p_(p), work_(work), partials_(partials) {
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
    keys_.q_heads = p.q_heads;
    keys_.kv_heads = p.kv_heads;
    keys_.d = p.d;
    keys_.dv = p.dv;
    keys_.chunk = p.chunk;
    keys_.scale = p.logits.scale;
    keys_.softcap = p.logits.softcap;
    keys_.products = p.products;
  }

  // Item i's keys cut to what its token sees: [first, first + count) (a
  // sparse item's list was checked against the mask: all of it).
  void cut(std::size_t i, std::size_t* first, std::size_t* count) const noexcept {
    const WorkItem& it = work_.items[i];
    if (it.key_list != nullptr) {
      *first = it.first_key;
      *count = it.keys;
      return;
    }
    std::size_t lo = 0, hi = 0;
    visible_keys(plan_.position(it.token), PlanAccess::lengths(plan_)[it.sequence], p_.mask, &lo, &hi);
    const std::size_t a = std::max(lo, it.first_key), b = std::min(hi, it.first_key + it.keys);
    *first = a;
    *count = b > a ? b - a : 0;
  }

  // One item: its query rows, its keys, then its rows written or its
  // partial state kept.
  void item(std::size_t index, AttendScratch s) const noexcept {
    const WorkItem& it = work_.items[index];
    if (tiled(it)) return;  // its token's rows come from its block (block_item)
    const std::size_t H = p_.q_heads, dv = p_.dv;
    std::size_t first = 0, count = 0;
    cut(index, &first, &count);
    if (count == 0) {
      if (it.partial == WorkItem::kDirect) finish(it.token, false, s);
      return;  // a part the mask leaves empty: the merge skips it
    }
    for (std::size_t h = 0; h < H; ++h) widen_row(q_.row(it.token, h), p_.d, s.q + h * p_.d);
    KvKeys<E> keys = keys_;
    keys.pages = PlanAccess::pages_of(plan_, it.sequence);
    keys.first_key = first;
    keys.keys = count;
    keys.key_list = it.key_list;
    attend_keys_of<E, Arch>(keys, s.q, s.work, s.m, s.l, s.acc);
    if (it.partial == WorkItem::kDirect) {
      finish(it.token, true, s);
      return;
    }
    float* part = partial(it.partial);
    std::copy(s.acc, s.acc + H * dv, part);
    std::copy(s.m, s.m + H, part + H * dv);
    std::copy(s.l, s.l + H, part + H * dv + H);
  }

  // One part of a cascade level: its members' partial states.
  void level_item(std::size_t index, LevelScratch& s) const {
    const LevelItem& it = work_.cascade.items[index];
    const Level& level = work_.cascade.levels[it.level];
    KvKeys<E> keys = keys_;
    keys.pages = PlanAccess::pages_of(plan_, level.sequence);
    if constexpr (std::is_same<E, BFloat16>::value && rope::detail::kTilesArch<Arch>) {
      if (keys.products == Products::bf16 && level_tiles_run<Arch>()) {
        attend_level_tiles<Q, Arch>(it, level.members, work_.cascade.members.data() + level.first_member, q_, keys, s,
                                    partials_);
        return;
      }
    }
    attend_level<Q, E, Arch>(it, level.members, work_.cascade.members.data() + level.first_member, q_, keys, s,
                             partials_);
  }

  // A prompt's tokens on tiles (tile_blocks): item i of `blocks` in place
  // of its tokens' own items, which item() then skips.
  void take_blocks(const std::vector<WorkItem>* blocks, const unsigned char* tiled) noexcept {
    blocks_ = blocks;
    tiled_ = tiled;
  }
  bool tiled(const WorkItem& it) const noexcept { return tiled_ != nullptr && tiled_[it.sequence] != 0; }

  // Block i's tokens and the keys each sees: [lo, hi) of its sequence's.
  std::size_t block_keys(std::size_t i, std::size_t* tokens, std::size_t* lo, std::size_t* hi) const noexcept {
    const WorkItem& it = (*blocks_)[i];
    std::size_t seen = 0;
    for (std::size_t k = 0; k < it.tokens; ++k) {
      tokens[k] = it.token + k;
      visible_keys(plan_.position(tokens[k]), PlanAccess::lengths(plan_)[it.sequence], p_.mask, lo + k, hi + k);
      seen += hi[k] - lo[k];
    }
    return seen;
  }

  // Block i of a prompt's tokens on AMX tiles (cascade_tiles.hpp): their
  // rows, each over the keys its token sees.
  void block_item(std::size_t index, LevelScratch& s) const {
    if constexpr (std::is_same<E, BFloat16>::value && rope::detail::kTilesArch<Arch>) {
      const WorkItem& it = (*blocks_)[index];
      std::size_t tokens[kTileBlockRows] = {}, lo[kTileBlockRows] = {}, hi[kTileBlockRows] = {};
      block_keys(index, tokens, lo, hi);
      std::size_t first = std::numeric_limits<std::size_t>::max(), end = 0;
      for (std::size_t k = 0; k < it.tokens; ++k) {
        first = std::min(first, lo[k]);
        end = std::max(end, hi[k]);
      }
      const std::size_t H = p_.q_heads, G = H / p_.kv_heads, dv = p_.dv, da = rope::detail::tile_span(dv);
      KvKeys<E> keys = keys_;
      keys.pages = PlanAccess::pages_of(plan_, it.sequence);
      float* row = s.tile_row(dv);
      // Token k's rows of query heads g * G .. g * G + G - 1 (none seen: zeros).
      const auto done = [&](std::size_t g, const float* acc, const float* m, const float* l) noexcept {
        for (std::size_t k = 0; k < it.tokens; ++k) {
          const bool sees = hi[k] > lo[k];
          for (std::size_t r = 0; r < G; ++r) {
            const std::size_t x = k * G + r, h = g * G + r;
            finish_float_row<Arch>(m[x], l[x], acc + x * da, dv, p_.logits.sink(h), sees, row,
                                   lse_ != nullptr ? lse_ + tokens[k] * H + h : nullptr);
            store_kv_row<Arch>(row, dv, out_.row(tokens[k], h), nullptr);
          }
        }
      };
      if (end > first) {
        const std::size_t Hk = p_.kv_heads, d = p_.d, R = it.tokens * G;
        const auto pack = [&](std::uint16_t* qv, std::size_t rows, float* wide, std::uint16_t* words) noexcept {
          tile_queries<Q, Arch>(q_, tokens, R, G, Hk, d, rows, wide, words, qv);
        };
        attend_block_tiles<Arch>(it.tokens, lo, hi, first, end - first, pack, keys, s, done);
      } else {
        const float none = -std::numeric_limits<float>::infinity(), zero = 0.0f;
        for (std::size_t k = 0; k < it.tokens; ++k) {
          for (std::size_t h = 0; h < H; ++h) {
            finish_float_row<Arch>(none, zero, row, dv, p_.logits.sink(h), false, row,
                                   lse_ != nullptr ? lse_ + tokens[k] * H + h : nullptr);
            store_kv_row<Arch>(row, dv, out_.row(tokens[k], h), nullptr);
          }
        }
      }
    } else {
      (void)index;
      (void)s;
    }
  }

  // One token of several partial states: its cascade levels' parts, then
  // its items', merged in that order (items the mask left empty skipped).
  void merge(std::size_t index, AttendScratch s) const noexcept {
    const TokenMerge& mg = work_.merges[index];
    const std::size_t H = p_.q_heads, dv = p_.dv;
    bool sees = mg.levels > 0;
    for (std::size_t h = 0; h < H; ++h) {
      s.m[h] = -std::numeric_limits<float>::infinity();
      s.l[h] = 0.0f;
    }
    std::fill_n(s.acc, H * dv, 0.0f);
    const auto take = [&](const float* part) noexcept {
      for (std::size_t h = 0; h < H; ++h) {
        rope::detail::merge_state(s.m[h], s.l[h], s.acc + h * dv, part[H * dv + h], part[H * dv + H + h], part + h * dv,
                                  dv);
      }
    };
    for (std::size_t k = 0; k < mg.levels; ++k) take(partial(work_.level_partials[mg.first_level + k]));
    for (std::size_t k = 0; k < mg.items; ++k) {
      std::size_t first = 0, count = 0;
      cut(mg.first_item + k, &first, &count);
      if (count == 0) continue;
      sees = true;
      take(partial(work_.items[mg.first_item + k].partial));
    }
    finish(mg.token, sees, s);
  }

 private:
  // Token t's rows (and lse) from the state in s, or zeros when it saw no
  // key.
  void finish(std::size_t t, bool sees, AttendScratch s) const noexcept {
    for (std::size_t h = 0; h < p_.q_heads; ++h) {
      finish_float_row<Arch>(s.m[h], s.l[h], s.acc + h * p_.dv, p_.dv, p_.logits.sink(h), sees, s.row,
                             lse_ != nullptr ? lse_ + t * p_.q_heads + h : nullptr);
      store_kv_row<Arch>(s.row, p_.dv, out_.row(t, h), nullptr);
    }
  }

  float* partial(std::size_t i) const noexcept { return partials_ + i * p_.q_heads * (p_.dv + 2); }

  const Plan& plan_;
  View<const Q> q_;
  View<O> out_;
  float* lse_;
  const AttendParams& p_;
  const WorkLayout& work_;
  float* partials_;
  KvKeys<E> keys_;
  const std::vector<WorkItem>* blocks_ = nullptr;
  const unsigned char* tiled_ = nullptr;
};

// The blocks of a prompt's tokens that run on tiles (the bf16 mode over a
// bf16 cache, where AMX runs; dense masks): every sequence of two or more
// new tokens that is not a tree, its tokens in blocks of kTileBlockRows
// query rows; tiled[b] set for each such sequence.
inline void tile_blocks(const Plan& plan, std::vector<WorkItem>& blocks, std::vector<unsigned char>& tiled) {
  const std::int64_t* q_starts = PlanAccess::q_starts(plan);
  const Shape& shape = plan.shape();
  const std::size_t per = std::max<std::size_t>(1, kTileBlockRows / (shape.q_heads / shape.kv_heads));
  tiled.assign(plan.sequences(), 0);
  for (std::size_t b = 0; b < plan.sequences(); ++b) {
    const auto n = static_cast<std::size_t>(q_starts[b + 1] - q_starts[b]), t0 = static_cast<std::size_t>(q_starts[b]);
    if (n < 2 || PlanAccess::tree(plan, b)) continue;
    tiled[b] = 1;
    for (std::size_t t = t0; t < t0 + n; t += per) {
      blocks.push_back({b, t, 0, static_cast<std::size_t>(PlanAccess::lengths(plan)[b]), WorkItem::kDirect,
                        std::min(per, t0 + n - t)});
    }
  }
}

// A product mode the cache's type has (rope/products.hpp).
template <class E>
Products check_products(const char* fn, Products mode) {
  if (mode == Products::bf16 && !std::is_same<E, BFloat16>::value) {
    fail(fn, "shape.products", "Products::bf16 with a bf16 cache (its keys are the products' bf16 factors)",
         kv_type_name<E>());
  }
  if (mode == Products::int8 && !std::is_same<E, std::int8_t>::value) {
    fail(fn, "shape.products", "Products::int8 with an int8 cache (its keys are the products' integer factors)",
         kv_type_name<E>());
  }
  return mode;
}

// The attention of a checked call.
template <class Q, class E, class O, class Arch>
void run_attend(const Plan& plan, const PagedCache<E>& cache, const View<const Q>& q, const View<O>& out, float* lse,
                const AttendParams& p, const WorkLayout& work) {
  PlanScratch& ws = PlanAccess::scratch(plan);
  ws.partials.resize(work.partials * p.q_heads * (p.dv + 2));
  const std::size_t items = work.items.size();
  const std::size_t threads = std::max<std::size_t>(1, plan.threads().shares());
  // Scratch rows for each share of the items (and levels) and of the merges.
  const std::size_t workers =
      std::max<std::size_t>(1, std::min(threads, std::max(items + work.cascade.items.size(), work.merges.size())));
  const std::size_t per = scratch_floats(p);
  ws.rows.resize(workers * per + rope::detail::kLineFloats);
  float* base = rope::detail::line_start(ws.rows);
  AttendRun<Q, E, O, Arch> run(plan, cache, q, out, lse, p, work, ws.partials.data());
  std::vector<WorkItem> blocks;
  std::vector<unsigned char> tiled;
  if constexpr (std::is_same<E, BFloat16>::value && rope::detail::kTilesArch<Arch>) {
    if (p.products == Products::bf16 && p.mask.indices == nullptr && level_tiles_run<Arch>()) {
      tile_blocks(plan, blocks, tiled);
      if (!blocks.empty()) run.take_blocks(&blocks, tiled.data());
    }
  }
  const Executor& executor = plan.threads().executor;
  // Shares of about equal numbers of keys (and a few keys' worth per item,
  // its rows' setup): the parts of a long cache and a short one's keys are
  // not worth the same.
  // Cascade level parts after the items: each worth its keys for each
  // member.
  const std::vector<LevelItem>& levels = work.cascade.items;
  std::vector<LevelScratch> level_scratch(levels.empty() && blocks.empty() ? 0 : workers);
  std::size_t most = 0;
  for (const Level& level : work.cascade.levels) most = std::max(most, level.members);
  for (LevelScratch& s : level_scratch) s.grow(most, p.q_heads, p.kv_heads, p.d, p.dv);
  // Blocks of a prompt's tokens on tiles last, each worth its tokens' keys.
  const std::size_t levels_end = items + levels.size();
  rope::detail::parallel_for_costs(
      levels_end + blocks.size(), threads, executor,
      [&](std::size_t i) {
        if (i >= levels_end) {
          std::size_t tokens[kTileBlockRows] = {}, lo[kTileBlockRows] = {}, hi[kTileBlockRows] = {};
          return run.block_keys(i - levels_end, tokens, lo, hi) + kItemCost;
        }
        if (i >= items) {
          const LevelItem& it = levels[i - items];
          return it.keys * work.cascade.levels[it.level].members + kItemCost;
        }
        if (run.tiled(work.items[i])) return std::size_t{0};
        std::size_t first = 0, count = 0;
        run.cut(i, &first, &count);
        return count + kItemCost;
      },
      [&](std::size_t i, std::size_t w) {
        if (i >= levels_end) {
          run.block_item(i - levels_end, level_scratch[w]);
        } else if (i >= items) {
          run.level_item(i - items, level_scratch[w]);
        } else {
          run.item(i, scratch_at(base + w * per, p));
        }
      });
  rope::detail::parallel_for(work.merges.size(), threads, executor,
                             [&](std::size_t i, std::size_t w) { run.merge(i, scratch_at(base + w * per, p)); });
}

// attend (forwarders.hpp), checked and run: attention of the plan's new
// tokens over a cache that holds their keys and values (append, or the
// caller's own writes) — see the header comment. q:
// [tokens, q_heads, head_dim], read-only or not; out: [tokens, q_heads,
// v_head_dim]; lse (null: not written): tokens * q_heads floats, at
// t * q_heads + h, the natural log-sum-exp of each row's scores after
// scale and softcap, sink included (state.hpp merges such pairs).
// Everything is checked before out is written; nothing else is written.
// Arch: the instruction set of the work outside the cache reads (widening
// q, merging parts, the output rows), which rope::dispatch does not route;
// the default, the caller's flags, keeps units built with different flags
// apart (dispatch.md).
template <class Q, class E, class O, class Arch>
void attend_call(const Plan& plan, const PagedCache<E>& cache, const View<const Q>& q, const View<O>& out,
                 const Logits& logits, const Mask& mask, float* lse) {
  const char* fn = "rope::attention::attend";
  detail::check_plan_cache(fn, plan, cache);
  const Shape& s = plan.shape();
  rope::detail::check_view(fn, "q", q);
  rope::detail::check_view(fn, "out", out);
  const char* dims[3] = {"tokens", "heads", "head_dim"};
  const std::size_t want_q[3] = {plan.tokens(), s.q_heads, s.head_dim};
  const std::size_t want_out[3] = {plan.tokens(), s.q_heads, s.v_head_dim};
  const std::size_t got_q[3] = {q.tokens, q.heads, q.head_dim}, got_out[3] = {out.tokens, out.heads, out.head_dim};
  for (std::size_t i = 0; i < 3; ++i) {
    if (got_q[i] != want_q[i]) detail::fail(fn, {"q.", dims[i]}, {"the plan's ", want_q[i]}, got_q[i]);
    if (got_out[i] != want_out[i]) detail::fail(fn, {"out.", dims[i]}, {"the plan's ", want_out[i]}, got_out[i]);
  }
  rope::detail::check_disjoint(fn, "out", out, "q", q);
  detail::check_apart(fn, "out", out, "cache.k", cache.k);
  detail::check_apart(fn, "out", out, "cache.v", cache.v);
  if (lse != nullptr) {
    const std::size_t n = plan.tokens() * s.q_heads;
    if (detail::bytes_overlap(lse, n, out.data, detail::view_span(out)) ||
        detail::bytes_overlap(lse, n, q.data, detail::view_span(q))) {
      detail::fail(fn, "lse", "memory apart from q and out", "overlapping");
    }
    const View<float> lse_rows(lse, n, 1, 1, 1, 1);
    detail::check_apart(fn, "lse", lse_rows, "cache.k", cache.k);
    detail::check_apart(fn, "lse", lse_rows, "cache.v", cache.v);
  }
  detail::AttendParams p;
  p.q_heads = s.q_heads;
  p.kv_heads = s.kv_heads;
  p.d = s.head_dim;
  p.dv = s.v_head_dim;
  p.logits = detail::check_logits<float>(fn, "logits", logits, s.q_heads, s.head_dim);
  p.mask = mask;
  p.chunk = std::min<std::size_t>(s.kv_split, kAttendMaxChunk);
  p.products = detail::check_products<E>(fn, s.products);
  check_tree_mask(fn, plan, mask);
  const WorkLayout* work = &PlanAccess::work(plan);
  if (mask.indices != nullptr) {
    PlanScratch& ws = PlanAccess::scratch(plan);
    sparse_lists(fn, plan, mask, ws);
    work = &ws.call_work;
  } else if (mask.window == 0 && PlanAccess::cascade(plan) != nullptr) {
    work = PlanAccess::cascade(plan);  // shape.cascade, levels found: every member sees all of them
  }
  detail::run_attend<Q, E, O, arch_of<Arch>>(plan, cache, q, out, lse, p, *work);
}

}  // namespace detail
}  // namespace rope::attention
