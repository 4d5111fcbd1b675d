// rope/attention/plan.hpp — a server step's schedule (Plan), made once per
// step from what the scheduler holds and read by every layer's append and
// attend (append.hpp, attend.hpp).
//
// A batch of B sequences (Batch): sequence b's new tokens are the packed
// rows q_starts[b] .. q_starts[b+1]-1 of the step's Q, K, V and output
// (cu_seqlens / qo_indptr), n_b = q_starts[b+1] - q_starts[b] of them, and
// after the step its cache holds lengths[b] keys, the new tokens' own
// included (the last n_b). Key j of sequence b is in slot
//
//   block_table[b * block_table_stride + j / page_size] * page_size + j % page_size
//
// Positions come from the lengths, so they cannot drift from the cache: key
// j is at position j, new token i of sequence b at lengths[b] - n_b + i,
// written to the slot of that position. A sequence with no new tokens is
// neither read nor written this step (its block table is not read).
//
// plan() checks the batch once (starts, lengths, every page id a sequence
// reads, no page twice in one sequence), derives each new token's position
// and slot, and lays out the work: one item per new token over every head
// and all of its sequence's keys, a decode token's (n_b == 1) keys split
// into parts of shape.kv_split keys aligned at multiples of kv_split
// ([0, S), [S, 2S), ...), each part's partial state merged in part order
// afterwards. attend() cuts each item to the keys its mask lets the token
// see. The split and the merge order depend on the lengths and kv_split
// only, never on the thread count or the executor, so a step's output is the
// same bytes for any thread count, and a sequence's rows the same bytes in
// any batch. The plan copies what it reads: the caller's arrays may change
// once plan() returns.
//
// A Plan keeps its buffers between steps (plan() refills it, allocating
// only when a step is larger than any before), and the scratch of the
// calls that read it: one plan serves one call at a time.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "../detail/fail.hpp"
#include "../executor.hpp"
#include "../products.hpp"
#include "../tensor/shared_checks.hpp"
#include "cache.hpp"
#include "cascade.hpp"
#include "tree.hpp"

namespace rope::attention {

// What every layer of a step has in common: the heads and head dims of the
// attention, the page pool's geometry and the split of a decode token's
// keys. Shape::of(cache, q_heads) reads it off a layer's cache.
struct Shape {
  std::size_t q_heads = 0;
  std::size_t kv_heads = 0;
  std::size_t head_dim = 0;
  std::size_t v_head_dim = 0;  // 0: head_dim
  std::size_t page_size = 0;
  std::size_t pages = 0;       // of each pool: every page id read is below it
  std::size_t kv_split = 512;  // keys per part of a decode token's split
  // Decode tokens of sequences that share leading pages attend them once,
  // together (cascade.hpp): rows then depend on which sequences share pages
  // in the step, so it is asked for.
  bool cascade = false;
  // How the decode loop multiplies q by the keys (rope/products.hpp): exact,
  // or bf16 products for a bf16 cache, int8 products for an int8 one.
  Products products = Products::exact;

  template <class E>
  static Shape of(const PagedCache<E>& cache, std::size_t q_heads) noexcept {
    Shape s;
    s.q_heads = q_heads;
    s.kv_heads = cache.k.heads;
    s.head_dim = cache.k.head_dim;
    s.v_head_dim = cache.v.head_dim;
    s.page_size = cache.k.page_size;
    s.pages = cache.k.pages;
    return s;
  }
  // MLA: one key/value head, keys the latent rows (latent_dim + rope_dim),
  // values their latent part.
  template <class E>
  static Shape of(const LatentCache<E>& cache, std::size_t q_heads) noexcept {
    Shape s;
    s.q_heads = q_heads;
    s.kv_heads = 1;
    s.head_dim = cache.width();
    s.v_head_dim = cache.latent_dim;
    s.page_size = cache.page_size;
    s.pages = cache.pages;
    return s;
  }
  std::size_t dv() const noexcept { return v_head_dim == 0 ? head_dim : v_head_dim; }
};

// Which sequences, which tokens, which pages (see the header comment).
// Pointers plan() reads (and copies) only: q_starts has sequences + 1
// entries (q_starts[0] = 0, non-decreasing), lengths and the block table
// (sequences rows of block_table_stride page ids) one row per sequence.
struct Batch {
  const std::int64_t* q_starts = nullptr;
  const std::int64_t* lengths = nullptr;
  const std::int32_t* block_table = nullptr;
  std::size_t block_table_stride = 0;
  std::size_t sequences = 0;
  // Tree verify (tree.hpp): null, no trees. Else per new token its depth in
  // its sequence's tree, or -1 for each new token of a sequence that is not
  // a tree; tree_masks holds new token t's row of tree_mask_words words at
  // tree_masks + t * tree_mask_words (bit j: it sees its sequence's new
  // token j; the rows of other sequences are not read).
  const std::int32_t* tree_depths = nullptr;
  const std::uint64_t* tree_masks = nullptr;
  std::size_t tree_mask_words = 0;
};

// One work item: new token `token` of `sequence` over its keys
// [first_key, first_key + keys) (before the mask), writing its row or, when
// partial != kDirect, partial state number `partial`. Key j is the
// sequence's j-th cached key (slot block_table[j / page_size] * page_size +
// j % page_size), at position j unless the token is a tree's.
struct WorkItem {
  std::size_t sequence, token, first_key, keys;
  std::size_t partial;
  std::size_t tokens = 1;  // new tokens token .. token + tokens - 1 (MLA's blocks of a chunk)
  // Set: the item's keys are the sequence's keys key_list[first_key ..
  // first_key + keys) (a sorted, checked list: a sparse or a tree token's),
  // not first_key .. themselves.
  const std::int32_t* key_list = nullptr;
  static constexpr std::size_t kDirect = static_cast<std::size_t>(-1);
};

class Plan;

namespace detail {

// A token whose state is the merge of several partial states: those of
// its cascade levels' parts (level_partials[first_level .. first_level +
// levels)), then its items'.
struct TokenMerge {
  std::size_t token, first_item, items;
  std::size_t first_level = 0, levels = 0;
};

// Work items, the merges of tokens split over several of them, and the
// cascade levels (cascade.hpp) whose parts some merges take.
struct WorkLayout {
  std::vector<WorkItem> items;
  std::vector<TokenMerge> merges;
  std::size_t partials = 0;
  CascadeLevels cascade;
  std::vector<std::size_t> level_partials;

  void clear() noexcept {
    items.clear();
    merges.clear();
    partials = 0;
    cascade.clear();
    level_partials.clear();
  }
  // Token t of `sequence` over keys [from, count): one item, or (split)
  // parts cut at multiples of `split`, merged in order after the partial
  // states level_partials[first_level .. first_level + levels) (its
  // cascade levels' parts). With key_list, the keys are that list's
  // entries (WorkItem::key_list).
  void add(std::size_t sequence, std::size_t t, std::size_t count, std::size_t split, bool split_keys,
           const std::int32_t* key_list = nullptr, std::size_t from = 0, std::size_t first_level = 0,
           std::size_t levels = 0) {
    const std::size_t first = items.size();
    if (split_keys) {
      for (std::size_t k = from; k < count;) {
        const std::size_t end = std::min(count, (k / split + 1) * split);
        items.push_back({sequence, t, k, end - k, WorkItem::kDirect, 1, key_list});
        k = end;
      }
    } else {
      items.push_back({sequence, t, from, count - from, WorkItem::kDirect, 1, key_list});
    }
    // A token of no item (no keys) is a merge of none: a zero row.
    const std::size_t made = items.size() - first;
    if (made != 1 || levels > 0) {
      merges.push_back({t, first, made, first_level, levels});
      for (std::size_t k = first; k < items.size(); ++k) items[k].partial = partials++;
    }
  }
};

// What the calls that read a plan write between steps (rope's own).
struct PlanScratch {
  std::vector<float> partials;
  std::vector<float> rows;
  // Sparse attention: each token's positions, sorted, at sparse_at[t] ..
  // sparse_at[t + 1]; and a call's own work (sparse lists, MLA's blocks).
  std::vector<std::int32_t> sparse;
  std::vector<std::size_t> sparse_at;
  WorkLayout call_work;
};

struct PlanAccess;

}  // namespace detail

class Plan {
 public:
  const Shape& shape() const noexcept { return shape_; }
  const Threads& threads() const noexcept { return threads_; }
  std::size_t sequences() const noexcept { return lengths_.size(); }
  // New tokens of the step: the rows of its Q, K, V and output.
  std::size_t tokens() const noexcept { return positions_.size(); }
  // New token t's position and slot.
  std::int64_t position(std::size_t t) const noexcept { return positions_[t]; }
  std::int64_t slot(std::size_t t) const noexcept { return slots_[t]; }
  // Every new token's position, tokens() of them: for a caller that rotates
  // Q itself (rope::apply with rope::Positions(plan.positions())).
  const std::int64_t* positions() const noexcept {
    static const std::int64_t none = 0;  // a step of no tokens: a pointer all the same
    return positions_.empty() ? &none : positions_.data();
  }
  // The work items, in the order of their tokens (see WorkItem).
  const std::vector<WorkItem>& items() const noexcept { return work_.items; }

 private:
  friend struct detail::PlanAccess;

  Shape shape_;
  Threads threads_;
  std::vector<std::int64_t> q_starts_, lengths_;
  std::vector<std::size_t> table_at_;  // per sequence: where its page ids start in pages_
  std::vector<std::int32_t> pages_;    // each sequence's page ids, the pages it reads
  std::vector<std::int64_t> positions_, slots_;
  std::vector<std::size_t> token_sequence_;
  detail::WorkLayout work_;
  detail::WorkLayout cascade_;  // shape.cascade: the layout with levels (cascade.hpp)
  // The first new token written into a page another sequence reads (append
  // refuses the step), or tokens(): none.
  std::size_t shared_write_ = 0;
  std::vector<std::int32_t> owners_;     // per page: who reads it (plan()'s own)
  std::vector<std::int32_t> listed_;     // per page: the last sequence that listed it, + 1
  std::vector<unsigned char> tree_;      // per sequence: its new tokens are a tree
  std::vector<std::int32_t> tree_keys_;  // the tree tokens' key lists (their items point in)
  bool valid_ = false;                   // the last plan() into it succeeded
  mutable detail::PlanScratch scratch_;
};

namespace detail {

using rope::detail::fail;

// An item's fixed cost (its query rows set up, its sums written), in keys.
constexpr std::size_t kItemCost = 16;

struct PlanAccess {
  static const Shape& shape(const Plan& p) noexcept { return p.shape_; }
  static const std::int64_t* lengths(const Plan& p) noexcept { return p.lengths_.data(); }
  static const std::int64_t* q_starts(const Plan& p) noexcept { return p.q_starts_.data(); }
  static const std::int32_t* pages_of(const Plan& p, std::size_t b) noexcept {
    return p.pages_.data() + p.table_at_[b];
  }
  static std::size_t sequence_of(const Plan& p, std::size_t t) noexcept { return p.token_sequence_[t]; }
  static const WorkLayout& work(const Plan& p) noexcept { return p.work_; }
  // The layout with cascade levels, or null: none asked for or found.
  static const WorkLayout* cascade(const Plan& p) noexcept {
    return p.shape_.cascade && !p.cascade_.cascade.levels.empty() ? &p.cascade_ : nullptr;
  }
  static std::size_t shared_write(const Plan& p) noexcept { return p.shared_write_; }
  static PlanScratch& scratch(const Plan& p) noexcept { return p.scratch_; }
  static bool tree(const Plan& p, std::size_t b) noexcept { return !p.tree_.empty() && p.tree_[b] != 0; }
  static bool trees(const Plan& p) noexcept {
    return std::any_of(p.tree_.begin(), p.tree_.end(), [](unsigned char t) { return t != 0; });
  }

  static void begin(Plan& p) noexcept { p.valid_ = false; }
  static void set(Plan& p, const Shape& s, const Threads& threads) noexcept {
    p.shape_ = s;
    p.shape_.v_head_dim = s.dv();
    p.threads_ = threads;
  }
  static void finish(Plan& p) noexcept { p.valid_ = true; }
  static bool valid(const Plan& p) noexcept { return p.valid_; }

  static void check_shape(const char* fn, const Shape& s);
  static void copy_batch(const char* fn, Plan& p, const Batch& batch);
  static void derive_tokens(Plan& p, const Batch& batch);
  static void lay_out(Plan& p, const Batch& batch);
};

inline void PlanAccess::check_shape(const char* fn, const Shape& s) {
  if (s.q_heads == 0) fail(fn, "shape.q_heads", "at least 1", s.q_heads);
  if (s.kv_heads == 0) fail(fn, "shape.kv_heads", "at least 1", s.kv_heads);
  rope::detail::check_grouped_heads(fn, "shape.kv_heads", s.kv_heads, "shape.q_heads", s.q_heads);
  if (s.head_dim == 0) fail(fn, "shape.head_dim", "at least 1", s.head_dim);
  if (s.page_size == 0) fail(fn, "shape.page_size", "at least 1", s.page_size);
  if (s.pages == 0) fail(fn, "shape.pages", "at least 1", s.pages);
  if (s.kv_split == 0) fail(fn, "shape.kv_split", "at least 1", s.kv_split);
}

// The batch checked against the shape and copied: starts, lengths, and the
// page ids each sequence with new tokens reads (inside the pool, none
// twice in one sequence).
inline void PlanAccess::copy_batch(const char* fn, Plan& p, const Batch& batch) {
  if (batch.q_starts == nullptr) fail(fn, "batch.q_starts", "non-null (sequences + 1 entries)", nullptr);
  if (batch.q_starts[0] != 0) fail(fn, "batch.q_starts[0]", "0", batch.q_starts[0]);
  if (batch.sequences > 0 && (batch.lengths == nullptr || batch.block_table == nullptr)) {
    fail(fn, batch.lengths == nullptr ? "batch.lengths" : "batch.block_table", "non-null", nullptr);
  }
  const std::size_t ps = p.shape_.page_size, pages = p.shape_.pages;
  p.q_starts_.assign(batch.q_starts, batch.q_starts + batch.sequences + 1);
  p.lengths_.assign(batch.lengths, batch.lengths + batch.sequences);
  p.table_at_.assign(batch.sequences, 0);
  p.pages_.clear();
  p.owners_.assign(pages, -1);
  p.listed_.assign(pages, 0);
  for (std::size_t b = 0; b < batch.sequences; ++b) {
    const std::int64_t start = batch.q_starts[b], next = batch.q_starts[b + 1], len = batch.lengths[b];
    if (next < start) {
      fail(fn, {"batch.q_starts[", b + 1, "]"}, {">= batch.q_starts[", b, "] = ", start, " (starts never decrease)"},
           next);
    }
    const std::int64_t n = next - start;
    if (len < n) fail(fn, {"batch.lengths[", b, "]"}, {">= its new tokens ", n, " (the cache holds their keys)"}, len);
    p.table_at_[b] = p.pages_.size();
    if (n == 0) continue;  // neither read nor written
    const std::uint64_t capacity = static_cast<std::uint64_t>(batch.block_table_stride) * ps;
    if (static_cast<std::uint64_t>(len) > capacity) {
      fail(fn, {"batch.lengths[", b, "]"},
           {"<= its pages' slots ", capacity, " (batch.block_table_stride * page_size)"}, len);
    }
    const std::size_t used = (static_cast<std::size_t>(len) + ps - 1) / ps;
    const std::int32_t* row = batch.block_table + b * batch.block_table_stride;
    for (std::size_t i = 0; i < used; ++i) {
      if (row[i] < 0 || static_cast<std::size_t>(row[i]) >= pages) {
        fail(fn, {"batch.block_table[", b, "][", i, "]"}, {"a page id below shape.pages = ", pages}, row[i]);
      }
      // A page twice in one sequence would hold two of its keys in one slot
      // (whoever else lists it); a page of several sequences is read by all
      // (-2), written by none.
      std::int32_t& listed = p.listed_[static_cast<std::size_t>(row[i])];
      if (listed == static_cast<std::int32_t>(b) + 1) {
        fail(fn, {"batch.block_table[", b, "][", i, "]"}, "a page this sequence does not already list", row[i]);
      }
      listed = static_cast<std::int32_t>(b) + 1;
      std::int32_t& owner = p.owners_[static_cast<std::size_t>(row[i])];
      owner = owner == -1 ? static_cast<std::int32_t>(b) : -2;
      p.pages_.push_back(row[i]);
    }
  }
  const std::int64_t last = batch.q_starts[batch.sequences];
  if (last < 0) fail(fn, {"batch.q_starts[", batch.sequences, "]"}, ">= 0", last);
  p.tree_.assign(batch.tree_depths != nullptr ? batch.sequences : 0, 0);
  for (std::size_t b = 0; b < p.tree_.size(); ++b) {
    const auto t0 = static_cast<std::size_t>(batch.q_starts[b]);
    const auto n = static_cast<std::size_t>(batch.q_starts[b + 1] - batch.q_starts[b]);
    p.tree_[b] = check_tree(fn, b, t0, n, batch.tree_depths, batch.tree_masks, batch.tree_mask_words) ? 1 : 0;
  }
}

// Each new token's sequence, position and slot, and the first one written
// into a page another sequence reads.
inline void PlanAccess::derive_tokens(Plan& p, const Batch& batch) {
  const std::size_t tokens = static_cast<std::size_t>(p.q_starts_.back()), ps = p.shape_.page_size;
  p.positions_.resize(tokens);
  p.slots_.resize(tokens);
  p.token_sequence_.resize(tokens);
  p.shared_write_ = tokens;
  for (std::size_t b = 0; b < p.lengths_.size(); ++b) {
    const std::int64_t n = p.q_starts_[b + 1] - p.q_starts_[b], len = p.lengths_[b];
    const std::int32_t* row = p.pages_.data() + p.table_at_[b];
    for (std::int64_t i = 0; i < n; ++i) {
      const auto t = static_cast<std::size_t>(p.q_starts_[b] + i);
      const auto pos = static_cast<std::size_t>(len - n + i);  // the key's index, and its slot's
      const std::int32_t page = row[pos / ps];
      p.positions_[t] = tree(p, b) ? len - n + batch.tree_depths[t] : static_cast<std::int64_t>(pos);
      p.slots_[t] = static_cast<std::int64_t>(static_cast<std::size_t>(page) * ps + pos % ps);
      p.token_sequence_[t] = b;
      if (p.owners_[static_cast<std::size_t>(page)] == -2 && t < p.shared_write_) p.shared_write_ = t;
    }
  }
}

// The items and merges of the step (see the header comment), and with
// shape.cascade the layout with levels beside them.
inline void PlanAccess::lay_out(Plan& p, const Batch& batch) {
  p.work_.clear();
  p.cascade_.clear();
  // A tree token's keys, as a list the items point into: built first, so
  // that it holds still.
  std::vector<std::size_t> at;
  p.tree_keys_.clear();
  for (std::size_t b = 0; b < p.tree_.size(); ++b) {
    if (p.tree_[b] == 0) continue;
    const auto n = static_cast<std::size_t>(p.q_starts_[b + 1] - p.q_starts_[b]);
    const auto cached = static_cast<std::size_t>(p.lengths_[b]) - n;
    for (std::size_t i = 0; i < n; ++i) {
      const auto t = static_cast<std::size_t>(p.q_starts_[b]) + i;
      at.push_back(p.tree_keys_.size());
      tree_keys(batch.tree_masks + t * batch.tree_mask_words, cached, n, p.tree_keys_);
    }
  }
  at.push_back(p.tree_keys_.size());
  const bool cascade = p.shape_.cascade;
  if (cascade) {
    CascadeSteps steps;
    steps.q_starts = p.q_starts_.data();
    steps.lengths = p.lengths_.data();
    steps.table_at = p.table_at_.data();
    steps.pages = p.pages_.data();
    steps.tree = p.tree_.empty() ? nullptr : p.tree_.data();
    steps.sequences = p.lengths_.size();
    steps.page_size = p.shape_.page_size;
    steps.split = p.shape_.kv_split;
    find_levels(steps, p.cascade_.cascade, &p.cascade_.partials);
  }
  const std::size_t split = p.shape_.kv_split;
  std::size_t next = 0;
  for (std::size_t b = 0; b < p.lengths_.size(); ++b) {
    const std::int64_t n = p.q_starts_[b + 1] - p.q_starts_[b];
    const auto len = static_cast<std::size_t>(p.lengths_[b]);
    for (std::int64_t i = 0; i < n; ++i) {
      const auto t = static_cast<std::size_t>(p.q_starts_[b] + i);
      if (tree(p, b)) {
        const std::int32_t* keys = p.tree_keys_.data() + at[next];
        p.work_.add(b, t, at[next + 1] - at[next], split, false, keys);
        if (cascade) p.cascade_.add(b, t, at[next + 1] - at[next], split, false, keys);
        ++next;
        continue;
      }
      p.work_.add(b, t, len, split, n == 1);
      if (cascade) {
        std::vector<std::size_t>& parts = p.cascade_.level_partials;
        const std::size_t first = parts.size();
        const std::size_t from = level_parts(p.cascade_.cascade, b, parts);
        p.cascade_.add(b, t, len, split, n == 1, nullptr, from, first, parts.size() - first);
      }
    }
  }
}

// A plan that some call may read, and a cache of its shape.
template <class E>
void check_plan_cache(const char* fn, const Plan& plan, const PagedCache<E>& cache) {
  if (!PlanAccess::valid(plan)) fail(fn, "plan", "made by a rope::attention::plan() that succeeded", "no plan");
  check_cache(fn, cache);
  const Shape& s = plan.shape();
  if (cache.k.heads != s.kv_heads)
    fail(fn, "cache.k.heads", {"the plan's shape.kv_heads = ", s.kv_heads}, cache.k.heads);
  if (cache.k.head_dim != s.head_dim) {
    fail(fn, "cache.k.head_dim", {"the plan's shape.head_dim = ", s.head_dim}, cache.k.head_dim);
  }
  if (cache.v.head_dim != s.v_head_dim) {
    fail(fn, "cache.v.head_dim", {"the plan's shape.v_head_dim = ", s.v_head_dim}, cache.v.head_dim);
  }
  if (cache.k.page_size != s.page_size) {
    fail(fn, "cache.k.page_size", {"the plan's shape.page_size = ", s.page_size}, cache.k.page_size);
  }
  if (cache.k.pages != s.pages) fail(fn, "cache.k.pages", {"the plan's shape.pages = ", s.pages}, cache.k.pages);
}

}  // namespace detail

// Plans a step of a batch (see the header comment) into p: checks the
// shape, the threads and the batch, then fills p. A refused call leaves p
// holding no plan: append and attend refuse it until a plan() succeeds.
inline void plan(Plan& p, const Shape& shape, const Batch& batch, const Threads& threads = {}) {
  const char* fn = "rope::attention::plan";
  detail::PlanAccess::begin(p);
  detail::PlanAccess::check_shape(fn, shape);
  rope::detail::check_threads(fn, "threads", threads);
  detail::PlanAccess::set(p, shape, threads);
  detail::PlanAccess::copy_batch(fn, p, batch);
  detail::PlanAccess::derive_tokens(p, batch);
  detail::PlanAccess::lay_out(p, batch);
  detail::PlanAccess::finish(p);
}

// Plans a step of one sequence over a contiguous cache, a pool of one page
// (PagedCache::contiguous; shape.pages 1, shape.page_size its capacity):
// `cached` keys before the step, `new_tokens` after them.
inline void plan(Plan& p, const Shape& shape, std::size_t cached, std::size_t new_tokens, const Threads& threads = {}) {
  detail::PlanAccess::begin(p);  // refused below: p holds no plan, as any refused plan() leaves it
  if (new_tokens > shape.page_size || cached > shape.page_size - new_tokens) {
    rope::detail::fail("rope::attention::plan", "cached + new_tokens",
                       {"<= the contiguous cache's capacity shape.page_size = ", shape.page_size}, cached + new_tokens);
  }
  const std::int64_t q_starts[2] = {0, static_cast<std::int64_t>(new_tokens)};
  const std::int64_t length = static_cast<std::int64_t>(cached + new_tokens);
  const std::int32_t page = 0;
  plan(p, shape, Batch{q_starts, &length, &page, 1, 1}, threads);
}

}  // namespace rope::attention
