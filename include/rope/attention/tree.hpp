// rope/attention/tree.hpp — tree verify (speculative decoding with a tree of
// drafts: EAGLE, Medusa, lookahead): a sequence's new tokens form a tree,
// and each sees the cache and its own ancestors, nothing else.
//
//   new token i of sequence b (n new tokens after c = lengths[b] - n cached):
//     position  c + depth_i              (tokens at the same depth share it)
//     slot      the slot of key c + i    (each token its own row)
//     sees      keys 0 .. c - 1, and key c + j for every bit j of its row
//
// Checked (plan.hpp calls these once per step): the depths of a tree
// sequence in [0, n); a token sees itself (its own bit); no bit past the
// sequence's new tokens; no token sees one deeper than itself (a position
// after its own); a sequence that is not a tree gives -1 for each of its
// tokens. A tree token's keys are laid out as a sorted list (WorkItem::
// key_list), the cached ones first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "../detail/fail.hpp"

namespace rope::attention::detail {

using rope::detail::fail;

inline bool tree_bit(const std::uint64_t* row, std::size_t j) noexcept { return ((row[j / 64] >> (j % 64)) & 1u) != 0; }

// Whether sequence b (new tokens t0 .. t0 + n - 1) is a tree, its depths and
// mask rows checked.
inline bool check_tree(const char* fn, std::size_t b, std::size_t t0, std::size_t n, const std::int32_t* depths,
                       const std::uint64_t* masks, std::size_t words) {
  if (n == 0 || depths[t0] == -1) {
    for (std::size_t i = 0; i < n; ++i) {
      if (depths[t0 + i] != -1) {
        fail(fn, {"batch.tree_depths[", t0 + i, "]"}, {"-1, as for every new token of sequence ", b, " (not a tree)"},
             depths[t0 + i]);
      }
    }
    return false;
  }
  if (masks == nullptr) fail(fn, "batch.tree_masks", "non-null when a sequence is a tree", nullptr);
  if (words * 64 < n)
    fail(fn, "batch.tree_mask_words", {">= ", (n + 63) / 64, " (sequence ", b, "'s new tokens)"}, words);
  for (std::size_t i = 0; i < n; ++i) {
    const std::int32_t d = depths[t0 + i];
    if (d < 0 || static_cast<std::size_t>(d) >= n) {
      fail(fn, {"batch.tree_depths[", t0 + i, "]"}, {"a depth in [0, ", n, ") (sequence ", b, " is a tree)"}, d);
    }
  }
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t* row = masks + (t0 + i) * words;
    if (!tree_bit(row, i)) fail(fn, {"batch.tree_masks[", t0 + i, "] bit ", i}, "set: a token sees itself", 0);
    for (std::size_t j = n; j < words * 64; ++j) {
      if (tree_bit(row, j))
        fail(fn, {"batch.tree_masks[", t0 + i, "] bit ", j}, {"clear: past the ", n, " new tokens"}, 1);
    }
    for (std::size_t j = 0; j < n; ++j) {
      if (tree_bit(row, j) && depths[t0 + j] > depths[t0 + i]) {
        fail(fn, {"batch.tree_masks[", t0 + i, "] bit ", j},
             {"clear: new token ", t0 + j, " is at depth ", depths[t0 + j], ", after token ", t0 + i, "'s ",
              depths[t0 + i]},
             1);
      }
    }
  }
  return true;
}

// The keys new token i of a tree sees, appended to list: 0 .. cached - 1,
// then cached + j for each bit j of its row, in order (sorted).
inline void tree_keys(const std::uint64_t* row, std::size_t cached, std::size_t n, std::vector<std::int32_t>& list) {
  for (std::size_t j = 0; j < cached; ++j) list.push_back(static_cast<std::int32_t>(j));
  for (std::size_t j = 0; j < n; ++j) {
    if (tree_bit(row, j)) list.push_back(static_cast<std::int32_t>(cached + j));
  }
}

}  // namespace rope::attention::detail
