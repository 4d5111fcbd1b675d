// rope/attention/softmax_params.hpp — what a one-head or multi-head softmax
// call (softmax.hpp) computes with, checked once from its options: the
// rotary width, the logits (logits.hpp's one check), the mask and its
// positions, the block size and the threads; and the buffers a thread
// keeps for its tiles (softmax_tile.hpp).
#pragma once

#include <cstddef>
#include <vector>

#include <Eigen/Core>

#include "../executor.hpp"
#include "call_checks.hpp"
#include "call_options.hpp"
#include "logits.hpp"
#include "masks.hpp"
#include "rotation.hpp"
#include "types.hpp"

namespace rope::attention::detail {

// What a checked softmax call computes: everything the tiles read besides
// the views, derived once from the options, so that no caller's options are
// rewritten on the way.
template <class T>
struct SoftmaxParams {
  std::size_t rotary_dim = 0;
  LogitParams<T> logits;  // scale, softcap, sinks: the one check of logits.hpp
  Visibility visibility;
  bool sorted = true;
  bool keys_rotated = false;  // K read as stored (a cache of rotated keys)
  std::size_t block = 256;
  std::size_t threads = 1;  // shares: options.threads' count or its executor's workers
  Executor executor;
};

// Every argument of a softmax call, for Lq queries and Lk keys of head
// dimension d and `heads` query heads; throws before anything is written.
template <class T>
SoftmaxParams<T> check_softmax(const char* fn, std::size_t lq, std::size_t lk, std::size_t d, std::size_t heads,
                               const Rotation<T>& rotation, const SoftmaxOptions& o) {
  check_mask_options(fn, o, lq, lk);
  if (o.block == 0) fail(fn, "options.block", "at least 1", o.block);
  SoftmaxParams<T> params;
  params.rotary_dim = rotary_width(fn, "rotation", rotation, d);
  params.logits = check_logits<T>(fn, "options.logits", o.logits, heads, d);
  params.keys_rotated = o.keys_rotated;
  params.block = o.block;
  params.threads = o.threads.shares();
  params.executor = o.threads.executor;
  check_rotation_positions(fn, rotation.table, o, lq, lk, !o.keys_rotated);
  params.visibility = visibility_of(o);
  params.sorted = params.visibility.keys_sorted(lk);
  return params;
}

// The running state of one key/value head's query rows in a tile.
template <class T>
struct HeadRows {
  Matrix<T> q;    // rows x d: the group's queries, rotated and scaled
  Matrix<T> acc;  // rows x dv
  Vector<T> row_max, row_sum;
};

// Rows [r0, r0 + rows) of a tile against its keys [c0, c0 + cols).
struct TilePiece {
  Eigen::Index r0, rows, c0, cols;
};

// The buffers one thread reuses for every tile it computes (allocated once
// per call, before any thread starts).
template <class T>
struct SoftmaxWorkspace {
  std::vector<HeadRows<T>> heads;  // one per key/value head of the item
  Matrix<T> scores;                // rows x block: scores (row by row), or a GEMM tile's weights
  Vector<T> zeroed;                // a GEMM tile's scores; all zeros between tiles
  std::vector<ConstRowsMap<T>> key_maps;
  Matrix<T> keys;  // Lk x d: the rotated keys of one key/value head
  std::size_t keys_of_head = static_cast<std::size_t>(-1);
  Matrix<T> values;  // Lk x dv: the values of one key/value head, contiguous
  std::size_t values_of_head = static_cast<std::size_t>(-1);
  std::vector<std::size_t> values_bad;  // Lk + 1: rows of `values` before j with a value not finite
  std::vector<std::size_t> lo, hi;      // each token's visible key range (sorted keys)
  std::vector<unsigned char> seen;      // per token: some key was visible
  std::vector<TilePiece> pieces;        // the GEMMs of the current tile
};

}  // namespace rope::attention::detail
