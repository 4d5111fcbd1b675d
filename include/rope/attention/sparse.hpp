// rope/attention/sparse.hpp — sparse attention's lists (DeepSeek V3.2, GLM-5):
// each new token attends only to the keys at the positions the caller lists
// for it (Mask::indices, top-k), checked and laid out as work.
//
//   token t sees { j : j = indices[t * stride + i], i < topk, j != -1 }
//
// Every listed position must be one the rest of the mask lets the token see
// (causal: at most its own position; a window; always inside its
// sequence's cache): a position past the token or the cache is refused by
// name, never silently attended or dropped; a position listed twice is
// refused (it would count twice). Each token's list is sorted, so its keys
// are read in position order and the sums run as over the same keys of the
// dense cache, and laid out as the plan lays out a token's keys: a decode
// token's list in parts of kv_split entries (aligned at multiples of
// kv_split in the list), merged in order; the same bytes for any thread
// count.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "../detail/fail.hpp"
#include "masks.hpp"
#include "plan.hpp"

namespace rope::attention::detail {

// A mask that a plan with tree sequences can take: their trees are their
// masks (no window, no sparse list besides).
inline void check_tree_mask(const char* fn, const Plan& plan, const Mask& mask) {
  if (!PlanAccess::trees(plan)) return;
  if (mask.window != 0) fail(fn, "mask.window", "0 for a batch with tree sequences", mask.window);
  if (mask.indices != nullptr) fail(fn, "mask.indices", "null for a batch with tree sequences", "a list");
}

// The lists of mask (indices set) for the plan's tokens, into ws: sorted
// positions, their starts per token, and the work over them. Throws, naming
// the entry, before anything outside ws is written.
inline void sparse_lists(const char* fn, const Plan& plan, const Mask& mask, PlanScratch& ws) {
  const std::size_t tokens = plan.tokens(), topk = mask.topk;
  const std::size_t stride = mask.index_stride == 0 ? topk : mask.index_stride;
  if (stride < topk) fail(fn, "mask.index_stride", {"0 or at least mask.topk = ", topk}, stride);
  ws.sparse.clear();
  ws.sparse_at.assign(tokens + 1, 0);
  ws.call_work.clear();
  const std::int64_t* q_starts = PlanAccess::q_starts(plan);
  for (std::size_t t = 0; t < tokens; ++t) {
    const std::size_t b = PlanAccess::sequence_of(plan, t);
    const std::int64_t length = PlanAccess::lengths(plan)[b];
    std::size_t lo = 0, hi = 0;
    visible_keys(plan.position(t), length, mask, &lo, &hi);
    const std::int32_t* row = mask.indices + t * stride;
    const std::size_t start = ws.sparse.size();
    for (std::size_t i = 0; i < topk; ++i) {
      const std::int32_t j = row[i];
      if (j == -1) continue;
      if (j < 0 || static_cast<std::size_t>(j) < lo || static_cast<std::size_t>(j) >= hi) {
        fail(fn, {"mask.indices[", t, "][", i, "]"},
             {"-1 or a position new token ", t, " sees (in [", lo, ", ", hi, "): its sequence's cache holds ", length,
              " keys, the token is at ", plan.position(t), ")"},
             j);
      }
      ws.sparse.push_back(j);
    }
    std::sort(ws.sparse.begin() + static_cast<std::ptrdiff_t>(start), ws.sparse.end());
    const auto twice = std::adjacent_find(ws.sparse.begin() + static_cast<std::ptrdiff_t>(start), ws.sparse.end());
    if (twice != ws.sparse.end()) {
      std::size_t i = topk;
      while (i > 0 && row[i - 1] != *twice) --i;  // the later of the two
      fail(fn, {"mask.indices[", t, "][", i - 1, "]"}, "a position not listed before for this token", *twice);
    }
    ws.sparse_at[t + 1] = ws.sparse.size();
  }
  // The items point into the lists: laid out once the lists hold still.
  for (std::size_t t = 0; t < tokens; ++t) {
    const std::size_t b = PlanAccess::sequence_of(plan, t);
    const std::int64_t n = q_starts[b + 1] - q_starts[b];
    ws.call_work.add(b, t, ws.sparse_at[t + 1] - ws.sparse_at[t], plan.shape().kv_split, n == 1,
                     ws.sparse.data() + ws.sparse_at[t]);
  }
}

}  // namespace rope::attention::detail
