// rope/attention/cascade.hpp — shared-prefix (cascade) decode: the decode
// tokens of sequences whose block tables start with the same pages attend
// those pages once, together, then each its own keys; the parts merged.
//
// Sixteen requests with one system prompt share its pages; a plain decode
// step reads them once per request. With Shape::cascade set, plan() finds
// the shared runs of pages and lays them out as levels:
//
//   level     full pages [a, b) that two or more decode sequences (one new
//             token, not a tree) list at the same places of their block
//             tables, every key of them before each one's new token
//   nesting   sequences that share pages [0, 256), a subset of them also
//             [256, 300): two levels, the second under the first (a
//             system prompt, then a few-shot block; found, never told)
//   parts     a level's keys cut at multiples of shape.kv_split, as a
//             decode token's are; each part one item over the query rows
//             of every member (cascade_attend.hpp: GEMMs, the part's keys
//             read once for all of them)
//   a member  its levels' parts, then its own keys after the deepest
//             level (split as a decode token's), merged in key order
//
// Every member sees every key of its levels under any causal flag (they
// are before its token); attend takes the plain layout instead where the
// mask is windowed or sparse. The sums are cut differently from the plain
// step's, so cascade rows are not the plain rows' bytes: the bound is in
// docs/attention.md. They depend on which sequences share pages with which
// in the step, hence the opt-in; for one batch they are the same bytes for
// any thread count and executor.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace rope::attention::detail {

// A level: the members sorted[first_member .. first_member + members) of a
// cascade (tokens in level_members), sharing keys [first_key, first_key +
// keys) in pages that the block table of `sequence` (any member) lists;
// its parts are level_items[first_item .. first_item + items); parent: the
// level above it, or kNone.
struct Level {
  std::size_t sequence = 0, first_member = 0, members = 0;
  std::size_t first_key = 0, keys = 0;
  std::size_t first_item = 0, items = 0;
  std::size_t parent = 0;
  static constexpr std::size_t kNone = static_cast<std::size_t>(-1);
};

// A part of a level: keys [first_key, first_key + keys) for every member;
// member i's partial state is partial + i.
struct LevelItem {
  std::size_t level = 0, first_key = 0, keys = 0, partial = 0;
};

// What plan() knows of a step that finding levels reads: per sequence its
// new tokens (q_starts), length, page ids (pages + table_at[b]) and
// whether it is a tree.
struct CascadeSteps {
  const std::int64_t* q_starts = nullptr;
  const std::int64_t* lengths = nullptr;
  const std::size_t* table_at = nullptr;
  const std::int32_t* pages = nullptr;
  const unsigned char* tree = nullptr;  // null: no trees
  std::size_t sequences = 0, page_size = 1, split = 1;
};

// The levels of a step (see the header comment): levels, their parts and
// their members (level_members: the candidates' tokens, sorted by page
// ids so that every level's members are a run), numbering the parts'
// partial states from *partials on. deepest[b]: sequence b's deepest
// level (Level::kNone: none); rank[b]: where b is in the sorted order.
struct CascadeLevels {
  std::vector<Level> levels;
  std::vector<LevelItem> items;
  std::vector<std::size_t> members;  // tokens, in the sorted order
  std::vector<std::size_t> deepest, rank;
  std::vector<std::size_t> order;  // the candidates' sequences, sorted

  void clear() noexcept {
    levels.clear();
    items.clear();
    members.clear();
    deepest.clear();
    rank.clear();
    order.clear();
  }
};

inline void find_levels(const CascadeSteps& in, CascadeLevels& out, std::size_t* partials) {
  out.clear();
  const std::size_t ps = in.page_size;
  out.deepest.assign(in.sequences, Level::kNone);
  out.rank.assign(in.sequences, 0);
  // Full pages of b before its new token: the pages a level may hold.
  const auto shareable = [&](std::size_t b) -> std::size_t { return static_cast<std::size_t>(in.lengths[b] - 1) / ps; };
  const auto page = [&](std::size_t b, std::size_t i) { return in.pages[in.table_at[b] + i]; };
  for (std::size_t b = 0; b < in.sequences; ++b) {
    const bool decode = in.q_starts[b + 1] - in.q_starts[b] == 1 && (in.tree == nullptr || in.tree[b] == 0);
    if (decode && shareable(b) > 0) out.order.push_back(b);
  }
  // Sorted by page ids, a sequence before those its pages begin: any
  // group sharing pages [0, a) is then a run.
  std::sort(out.order.begin(), out.order.end(), [&](std::size_t x, std::size_t y) {
    const std::int32_t* px = in.pages + in.table_at[x];
    const std::int32_t* py = in.pages + in.table_at[y];
    if (std::lexicographical_compare(px, px + shareable(x), py, py + shareable(y))) return true;
    if (std::lexicographical_compare(py, py + shareable(y), px, px + shareable(x))) return false;
    return x < y;  // the same pages: in batch order
  });
  for (std::size_t i = 0; i < out.order.size(); ++i) {
    out.rank[out.order[i]] = i;
    out.members.push_back(static_cast<std::size_t>(in.q_starts[out.order[i]]));
  }
  // Runs [lo, hi) of the sorted order that share pages [0, from), under
  // level `parent`: each gives a level over the pages all of them share
  // past `from`, then splits at the first page where they part.
  struct Run {
    std::size_t lo, hi, from, parent;
  };
  std::vector<Run> runs;
  if (out.order.size() >= 2) runs.push_back({0, out.order.size(), 0, Level::kNone});
  while (!runs.empty()) {
    const Run run = runs.back();
    runs.pop_back();
    std::size_t shared = shareable(out.order[run.lo]);
    for (std::size_t i = run.lo + 1; i < run.hi && shared > run.from; ++i) {
      const std::size_t a = out.order[i - 1], b = out.order[i];
      std::size_t k = run.from;
      const std::size_t end = std::min({shared, shareable(a), shareable(b)});
      while (k < end && page(a, k) == page(b, k)) ++k;
      shared = k;
    }
    std::size_t parent = run.parent;
    if (shared > run.from) {
      Level level;
      level.sequence = out.order[run.lo];
      level.first_member = run.lo;
      level.members = run.hi - run.lo;
      level.first_key = run.from * ps;
      level.keys = (shared - run.from) * ps;
      level.first_item = out.items.size();
      level.parent = run.parent;
      parent = out.levels.size();
      for (std::size_t k = level.first_key; k < level.first_key + level.keys;) {
        const std::size_t end = std::min(level.first_key + level.keys, (k / in.split + 1) * in.split);
        out.items.push_back({parent, k, end - k, *partials});
        *partials += level.members;
        k = end;
      }
      level.items = out.items.size() - level.first_item;
      out.levels.push_back(level);
      for (std::size_t i = run.lo; i < run.hi; ++i) out.deepest[out.order[i]] = parent;
    }
    // Those with pages past `shared` grouped by the next one; a group of
    // two or more is a run below this level.
    std::size_t i = run.lo;
    while (i < run.hi && shareable(out.order[i]) <= shared) ++i;
    while (i < run.hi) {
      std::size_t j = i + 1;
      while (j < run.hi && page(out.order[j], shared) == page(out.order[i], shared)) ++j;
      if (j - i >= 2) runs.push_back({i, j, shared, parent});
      i = j;
    }
  }
}

// Where the own keys of sequence b start (after its deepest level), and
// the partial states of its levels' parts in key order, appended to parts.
inline std::size_t level_parts(const CascadeLevels& c, std::size_t b, std::vector<std::size_t>& parts) {
  if (c.deepest.empty() || c.deepest[b] == Level::kNone) return 0;
  std::vector<std::size_t> chain;
  for (std::size_t l = c.deepest[b]; l != Level::kNone; l = c.levels[l].parent) chain.push_back(l);
  for (auto l = chain.rbegin(); l != chain.rend(); ++l) {
    const Level& level = c.levels[*l];
    for (std::size_t i = level.first_item; i < level.first_item + level.items; ++i) {
      parts.push_back(c.items[i].partial + (c.rank[b] - level.first_member));
    }
  }
  const Level& deepest = c.levels[c.deepest[b]];
  return deepest.first_key + deepest.keys;
}

}  // namespace rope::attention::detail
