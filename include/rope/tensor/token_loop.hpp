// rope/tensor/token_loop.hpp — the tensor API's loop over tokens, after every
// argument has been checked (apply.hpp, multi_axis.hpp).
//
// For each token t: fetch its cos/sin row (a Source: one table row, or rows
// gathered per axis), then rotate every head of every pass (Q, K, ...) with
// one rotate_heads call per pass, so the row's cos/sin is prepared once for
// all heads. rope's 16-bit types are widened, rotated and rounded in
// registers (kernels.hpp); other 16-bit types are widened to float into a
// buffer, rotated, narrowed once. Threads split the tokens into contiguous
// chunks; each row is computed the same way whichever thread takes it.
//
// Two layers, so that a runtime-dispatched build (rope::dispatch) can compile
// the inner one once per instruction set:
//   rotate_tokens<S, Arch, ...>  the tokens of one chunk: all the SIMD work,
//                                templated on the pairing and the xsimd
//                                architecture, calling nothing that is not
//                                (or is not forced inline);
//   run(...)                     workspaces, the streaming decision and
//                                threads, compiled with the caller's own
//                                flags; it calls rotate_tokens through a
//                                TokenLoop, a function pointer (one call
//                                per chunk): rope::dispatch's, or the one
//                                compiled in the caller's unit.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "../detail/inline.hpp"
#include "../detail/parallel.hpp"
#include "../detail/prefetch.hpp"
#include "../detail/stream.hpp"
#include "../half.hpp"
#include "../kernels/rotate.hpp"
#include "../options.hpp"
#include "../style.hpp"
#include "../table.hpp"
#include "../view.hpp"
#include "view_checks.hpp"

namespace rope::detail {

// cos/sin of one token straight from a table: rows of 2 * pairs values, cos
// then sin, row m at rows + m * 2 * pairs.
template <class C>
struct SingleAxis {
  const C* rows;
  std::size_t pairs;
  Positions positions;

  SingleAxis(const Table<C>& table, const Positions& p) noexcept
      : rows(table.cos(0)), pairs(table.rotary_dim() / 2), positions(p) {}
  ROPE_ALWAYS_INLINE void row(std::size_t t, C*, const C*& cos, const C*& sin) const noexcept {
    const auto m = static_cast<std::size_t>(positions.at(t));
    cos = rows + m * 2 * pairs;
    sin = cos + pairs;
  }
};

// cos/sin of one token gathered pair by pair from the rows of its per-axis
// positions (M-RoPE, axial): pair p at angle positions[axis(p)] * theta_p.
template <class C>
struct MultiAxis {
  const C* rows;  // as SingleAxis
  std::size_t table_pairs;
  const std::int64_t* positions;  // [axes, tokens]
  std::size_t tokens;
  const std::uint8_t* axis_of_pair;  // `pairs` values
  std::size_t pairs;
  ROPE_ALWAYS_INLINE void row(std::size_t t, C* scratch, const C*& cos, const C*& sin) const noexcept {
    C* c = scratch;
    C* s = scratch + pairs;
    for (std::size_t p = 0; p < pairs; ++p) {
      const auto m = static_cast<std::size_t>(positions[axis_of_pair[p] * tokens + t]);
      c[p] = rows[m * 2 * table_pairs + p];
      s[p] = rows[m * 2 * table_pairs + table_pairs + p];
    }
    cos = c;
    sin = s;
  }
};

// rope's own 16-bit types are rotated in registers (kernels.hpp); other
// 16-bit types through a float buffer with their own conversions.
template <class T>
constexpr bool kInRegisters16 = std::is_same<T, BFloat16>::value || std::is_same<T, Float16>::value;

// The next token's rows are prefetched while this token is rotated, so that
// their loads are already in flight: the row kernel alone keeps too few
// misses outstanding to reach memory bandwidth.

// Rotates `heads` head vectors of one token (out == in: in place), head h at
// in + h * in_stride and out + h * out_stride, head_dim channels of which the
// first rotary_dim rotate. Out of place with pass-through channels, whole
// heads are copied first (one memcpy when the heads are contiguous) and then
// rotated where they landed, still in cache: one pass over the input instead
// of a rotation and a short copy per head. work: rotary_dim + 2 values for
// rope's 16-bit types, heads * rotary_dim for other 16-bit types.
template <Style S, class Arch, class T, class C>
inline void rotate_token_heads(const T* in, std::ptrdiff_t in_stride, T* out, std::ptrdiff_t out_stride,
                               std::size_t heads, std::size_t head_dim, const C* cos, const C* sin,
                               std::size_t rotary_dim, Direction dir, C* work) noexcept {
  if (out != in && head_dim != rotary_dim) {
    const auto d = static_cast<std::ptrdiff_t>(head_dim);
    if (in_stride == d && out_stride == d) {
      std::memcpy(out, in, heads * head_dim * sizeof(T));
    } else {
      for (std::size_t h = 0; h < heads; ++h) {
        const auto i = static_cast<std::ptrdiff_t>(h);
        std::memcpy(out + i * out_stride, in + i * in_stride, head_dim * sizeof(T));
      }
    }
    in = out;
    in_stride = out_stride;
  }
  if constexpr (std::is_same<T, C>::value) {
    (void)work;
    rotate_heads<S, T, Arch>(in, in_stride, out, out_stride, heads, cos, sin, rotary_dim, dir);
  } else if constexpr (kInRegisters16<T>) {
    rotate_heads_16<S, T, Arch>(in, in_stride, out, out_stride, heads, cos, sin, rotary_dim, dir, work);
  } else {
    const auto r = static_cast<std::ptrdiff_t>(rotary_dim);
    for (std::size_t h = 0; h < heads; ++h) {
      Storage<T>::widen(in + static_cast<std::ptrdiff_t>(h) * in_stride, work + static_cast<std::ptrdiff_t>(h) * r,
                        rotary_dim);
    }
    rotate_heads<S, C, Arch>(work, r, work, r, heads, cos, sin, rotary_dim, dir);
    for (std::size_t h = 0; h < heads; ++h) {
      Storage<T>::narrow(work + static_cast<std::ptrdiff_t>(h) * r, out + static_cast<std::ptrdiff_t>(h) * out_stride,
                         rotary_dim);
    }
  }
}

// What a call rotates, shared by all its chunks.
template <class T, class Source>
struct Work {
  const Pass<T>* passes;
  std::size_t count;
  Source source;
  std::size_t rotary_dim;
  Direction direction;
  bool stream;  // out-of-place passes go through staging and streaming stores
};

// Tokens begin .. end-1 of every pass. scratch: the gathered cos/sin of
// MultiAxis (rotary_dim values), then the work of rotate_token_heads. With
// stream set, an out-of-place pass is rotated into staging (a token's heads,
// contiguous) and streamed to its output: a token's heads at once when they
// are contiguous there too, so that the streaming stores cover whole cache
// lines and only the ragged ends of a token's block go through the cache.
template <Style S, class Arch, class T, class C, class Source>
void rotate_tokens(const Work<T, Source>& shared, std::size_t begin, std::size_t end, C* scratch, T* staging) noexcept {
  // Local copies: the kernels' stores may alias anything (SIMD stores do),
  // so fields read through references would be reloaded after every head.
  const Work<T, Source> w = shared;
  C* work = scratch + w.rotary_dim;
  for (std::size_t t = begin; t < end; ++t) {
    const C* cos;
    const C* sin;
    w.source.row(t, scratch, cos, sin);
    for (std::size_t i = 0; i < w.count; ++i) {
      const Pass<T> p = w.passes[i];
      const std::size_t d = p.in.head_dim;
      if (t + 1 < end) {
        // In place, only the rotary part is read (partial rotary: a quarter
        // of a GPT-NeoX head); out of place, whole heads.
        const std::size_t read = (p.out.data == p.in.data ? w.rotary_dim : d) * sizeof(T);
        for (std::size_t h = 0; h < p.in.heads; ++h) prefetch(p.in.row(t + 1, h), read);
      }
      // Streamed, a token's heads are rotated into staging (contiguous) and
      // then streamed out: in one copy when the output's heads are
      // contiguous too, so that whole cache lines are streamed.
      const bool staged = w.stream && p.out.data != p.in.data;
      T* const out = staged ? staging : p.out.row(t, 0);
      const auto out_stride = static_cast<std::ptrdiff_t>(staged ? d : p.out.head_stride);
      rotate_token_heads<S, Arch>(p.in.row(t, 0), static_cast<std::ptrdiff_t>(p.in.head_stride), out, out_stride,
                                  p.in.heads, d, cos, sin, w.rotary_dim, w.direction, work);
      if (staged) {
        if (p.out.head_stride == d) {
          stream_copy<Arch>(p.out.row(t, 0), staging, p.in.heads * d * sizeof(T));
        } else {
          for (std::size_t h = 0; h < p.in.heads; ++h)
            stream_copy<Arch>(p.out.row(t, h), staging + h * d, d * sizeof(T));
        }
      }
    }
  }
  if (w.stream) stream_fence<Arch>();
}

// rotate_tokens of one pairing and architecture, through a pointer: the
// one rope::dispatch installed or the one compiled in the caller's unit.
template <class T, class C, class Source>
using TokenLoop = void (*)(const Work<T, Source>&, std::size_t, std::size_t, C*, T*) noexcept;

// Streaming pays off once the output is far beyond what the caches keep;
// below that the output is better left in cache for the attention that
// reads it next.
constexpr std::size_t kStreamingBytes = std::size_t(64) << 20;

// Splits tokens into `threads` (or executor.workers) contiguous chunks,
// chunk i on worker i; the caller runs chunk 0 (or the executor runs them
// all), so threads = 1 starts no thread. Each row is computed
// the same way whichever worker takes it, so results do not depend on the
// thread count. Everything that can fail is done before the first write: the
// workspaces are allocated here, and a thread that cannot be started has its
// chunk run by the caller instead.
template <class T, class C, class Source>
void run(const Pass<T>* passes, std::size_t count, const Source& source, std::size_t rotary_dim, const Options& options,
         TokenLoop<T, C, Source> loop) {
  const std::size_t tokens = passes[0].in.tokens;
  std::size_t token_block = 0;  // the most elements a pass has per token
  std::size_t written = 0;
  bool out_of_place = false;
  for (std::size_t i = 0; i < count; ++i) {
    token_block = std::max(token_block, passes[i].in.heads * passes[i].in.head_dim);
    written += passes[i].in.tokens * passes[i].in.heads * passes[i].in.head_dim * sizeof(T);
    out_of_place = out_of_place || passes[i].out.data != passes[i].in.data;
  }
  if (tokens == 0) return;
  bool stream = false;
  if (out_of_place) {
    stream = options.stores == Stores::streaming || (options.stores == Stores::automatic && written >= kStreamingBytes);
  }
  const Work<T, Source> work{passes, count, source, rotary_dim, options.direction, stream};
  const std::size_t workers = std::min(thread_count(options.threads, options.executor), tokens);
  // Gathered cos/sin rows (multi-axis), then the 16-bit work.
  const std::size_t extra = std::is_same<T, C>::value ? 0 : kInRegisters16<T> ? rotary_dim + 2 : token_block;
  const std::size_t scratch_size = rotary_dim + extra;
  // A decode step's workspace fits on the stack; a heap allocation would be
  // a good part of its time.
  constexpr std::size_t kStackScratch = 4608;
  C stack_scratch[kStackScratch];
  std::vector<C> heap_scratch(workers * scratch_size > kStackScratch ? workers * scratch_size : 0);
  C* const scratch = heap_scratch.empty() ? stack_scratch : heap_scratch.data();
  std::vector<T> staging(stream ? workers * token_block : 0);
  auto chunk = [&](std::size_t w) noexcept {
    loop(work, tokens * w / workers, tokens * (w + 1) / workers, scratch + w * scratch_size,
         stream ? staging.data() + w * token_block : nullptr);
  };
  parallel_for(workers, workers, options.executor, [&](std::size_t w, std::size_t) noexcept { chunk(w); });
}

}  // namespace rope::detail
