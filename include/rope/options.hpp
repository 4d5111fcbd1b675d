// rope/options.hpp — what a tensor-level call takes besides its tensors and
// table: where each token sits (Positions) and how the call runs (Options:
// rotary width, direction, threads or the caller's Executor, stores).
//
// Token t of a call is rotated by the angle m(t) * theta_p, where m(t) is
// either ids[t] (one std::int64_t per token: packed variable-length batches,
// speculative decoding, any order) or offset + t (contiguous positions: a
// prefill after `offset` cached tokens, or one decode step at `offset`).
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "detail/inline.hpp"
#include "executor.hpp"
#include "style.hpp"

namespace rope {

// The positions of a call's tokens. Built implicitly from either spelling, so
// one signature serves both:
//   rope::apply(x, table, style, ids.data());      // m(t) = ids[t]
//   rope::apply(x, table, style, cache_length);    // m(t) = cache_length + t
class Positions {
 public:
  // One position per token; null is refused by the checked calls.
  Positions(const std::int64_t* ids) noexcept : ids_(ids), by_id_(true) {}  // NOLINT: implicit by design
  // Contiguous positions from offset (any integer type; negative or past
  // the table is refused by the checked calls, with the value as given).
  template <class I, std::enable_if_t<std::is_integral<I>::value && !std::is_same<I, bool>::value, int> = 0>
  Positions(I offset) noexcept  // NOLINT: implicit by design
      : offset_(static_cast<std::int64_t>(offset)),
        beyond_int64_(std::is_unsigned<I>::value &&
                      static_cast<std::uint64_t>(offset) >
                          static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())),
        by_id_(false) {}

  bool by_id() const noexcept { return by_id_; }
  const std::int64_t* ids() const noexcept { return ids_; }
  // The offset (meaningful when !by_id()); an unsigned offset above
  // INT64_MAX reads as INT64_MAX, past every table.
  std::int64_t offset() const noexcept { return beyond_int64_ ? std::numeric_limits<std::int64_t>::max() : offset_; }
  // Position of token t (unchecked). Forced inline: the token loop calls it
  // from code compiled once per instruction set (detail/inline.hpp).
  ROPE_ALWAYS_INLINE std::int64_t at(std::size_t t) const noexcept {
    return by_id_ ? ids_[t] : offset_ + static_cast<std::int64_t>(t);
  }

 private:
  const std::int64_t* ids_ = nullptr;
  std::int64_t offset_ = 0;
  bool beyond_int64_ = false;
  bool by_id_;
};

// How an out-of-place call writes its output. Streaming stores skip the read
// a plain store of an uncached line costs, and leave the output out of cache.
enum class Stores { automatic, cached, streaming };

struct Options {
  std::size_t rotary_dim = 0;  // 0: the table's; otherwise its first rotary_dim/2 pairs
  Direction direction = Direction::forward;
  std::size_t threads = 1;  // tokens split across this many threads; 1 starts none
  Stores stores = Stores::automatic;
  // Set: the token chunks run on the caller's pool (executor.hpp), split
  // into executor.workers chunks instead of `threads`; the same bytes.
  Executor executor;
};

}  // namespace rope
