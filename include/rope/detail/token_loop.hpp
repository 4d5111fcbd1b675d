// rope/detail/token_loop.hpp — the tensor API's loop over tokens, after every
// argument has been checked (apply.hpp, multi_axis.hpp).
//
// For each token t: fetch its cos/sin row (a Source: one table row, or rows
// gathered per axis), then rotate every head of every pass (Q, K, ...) with
// one rotate_heads call per pass, so the row's cos/sin is prepared once for
// all heads. 16-bit storage is widened to float, rotated, narrowed once.
// Threads split the tokens into contiguous chunks; each row is computed the
// same way whichever thread takes it.
//
// Everything is templated on the pairing S and the xsimd architecture Arch,
// so that a runtime-dispatched build can compile this loop once per
// instruction set; the header-only path uses xsimd::default_arch.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "../half.hpp"
#include "../kernels.hpp"
#include "../options.hpp"
#include "../style.hpp"
#include "../table.hpp"
#include "../view.hpp"
#include "prefetch.hpp"
#include "stream.hpp"

namespace rope::detail {

// cos/sin of one token straight from the table.
template <class C>
struct SingleAxis {
  const Table<C>* table;
  Positions positions;
  void row(std::size_t t, C*, const C*& cos, const C*& sin) const noexcept {
    const auto m = static_cast<std::size_t>(positions.at(t));
    cos = table->cos(m);
    sin = table->sin(m);
  }
};

// Rotates `heads` head vectors of one token (out == in: in place), head h at
// in + h * in_stride and out + h * out_stride. One rotate_heads call
// prepares the row's cos/sin once for all heads. A 16-bit tensor goes
// through compute (heads * rotary_dim values of C, private to the calling
// thread): widened exactly, rotated in C, rounded once on the way out.
template <Style S, class Arch, class T, class C>
inline void rotate_token_heads(const T* in, std::ptrdiff_t in_stride, T* out, std::ptrdiff_t out_stride,
                               std::size_t heads, std::size_t head_dim, const C* cos, const C* sin,
                               std::size_t rotary_dim, Direction dir, C* compute) noexcept {
  if constexpr (!Storage<T>::kWidened) {
    (void)compute;
    rotate_heads<S, T, Arch>(in, in_stride, out, out_stride, heads, cos, sin, rotary_dim, dir);
  } else {
    const auto r = static_cast<std::ptrdiff_t>(rotary_dim);
    for (std::size_t h = 0; h < heads; ++h) {
      Storage<T>::widen(in + static_cast<std::ptrdiff_t>(h) * in_stride, compute + static_cast<std::ptrdiff_t>(h) * r,
                        rotary_dim);
    }
    rotate_heads<S, C, Arch>(compute, r, compute, r, heads, cos, sin, rotary_dim, dir);
    for (std::size_t h = 0; h < heads; ++h) {
      Storage<T>::narrow(compute + static_cast<std::ptrdiff_t>(h) * r,
                         out + static_cast<std::ptrdiff_t>(h) * out_stride, rotary_dim);
    }
  }
  if (out != in && head_dim != rotary_dim) {
    for (std::size_t h = 0; h < heads; ++h) {
      std::memcpy(out + static_cast<std::ptrdiff_t>(h) * out_stride + rotary_dim,
                  in + static_cast<std::ptrdiff_t>(h) * in_stride + rotary_dim, (head_dim - rotary_dim) * sizeof(T));
    }
  }
}

// The next token's rows are prefetched while this token is rotated, so that
// their loads are already in flight: the row kernel alone keeps too few
// misses outstanding to reach memory bandwidth.

// Tokens begin .. end-1 of every pass. With stream set, an out-of-place
// pass is rotated into the staging buffer and streamed to its output: a
// token's heads at once when they are contiguous, so that the streaming
// stores cover whole cache lines and only the ragged ends of a token's
// block go through the cache.
template <Style S, class Arch, class T, class C, class Source>
void rotate_tokens(const Pass<T>* passes, std::size_t count, const Source& source, std::size_t rotary_dim,
                   Direction dir, bool stream, std::size_t begin, std::size_t end, C* scratch,
                   T* staging) noexcept {
  C* compute = scratch + rotary_dim;  // after the gathered cos/sin of MultiAxis
  for (std::size_t t = begin; t < end; ++t) {
    const C* cos;
    const C* sin;
    source.row(t, scratch, cos, sin);
    for (std::size_t i = 0; i < count; ++i) {
      const Pass<T>& p = passes[i];
      const std::size_t d = p.in.head_dim;
      if (t + 1 < end) {
        for (std::size_t h = 0; h < p.in.heads; ++h) prefetch(p.in.row(t + 1, h), d * sizeof(T));
      }
      const auto in_stride = static_cast<std::ptrdiff_t>(p.in.head_stride);
      if (!stream || p.out.data == p.in.data) {
        rotate_token_heads<S, Arch>(p.in.row(t, 0), in_stride, p.out.row(t, 0),
                              static_cast<std::ptrdiff_t>(p.out.head_stride), p.in.heads, d, cos, sin, rotary_dim,
                              dir, compute);
      } else if (p.out.head_stride == d) {
        rotate_token_heads<S, Arch>(p.in.row(t, 0), in_stride, staging, static_cast<std::ptrdiff_t>(d), p.in.heads, d, cos,
                              sin, rotary_dim, dir, compute);
        stream_copy(p.out.row(t, 0), staging, p.in.heads * d * sizeof(T));
      } else {
        for (std::size_t h = 0; h < p.in.heads; ++h) {
          rotate_token_heads<S, Arch>(p.in.row(t, h), 0, staging, 0, 1, d, cos, sin, rotary_dim, dir, compute);
          stream_copy(p.out.row(t, h), staging, d * sizeof(T));
        }
      }
    }
  }
  if (stream) stream_fence();
}

// Streaming pays off once the output is far beyond what the caches keep;
// below that the output is better left in cache for the attention that
// reads it next.
constexpr std::size_t kStreamingBytes = std::size_t(64) << 20;

// Splits tokens into `threads` contiguous chunks, chunk i on worker i; the
// caller runs chunk 0, so threads = 1 starts no thread. Each row is computed
// the same way whichever worker takes it, so results do not depend on the
// thread count. Everything that can fail is done before the first write: the
// workspaces are allocated here, and a thread that cannot be started has its
// chunk run by the caller instead.
template <Style S, class Arch, class T, class C, class Source>
void run(const Pass<T>* passes, std::size_t count, const Source& source, std::size_t rotary_dim,
         const Options& options) {
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
    stream = options.stores == Stores::streaming ||
             (options.stores == Stores::automatic && written >= kStreamingBytes);
  }
  const std::size_t workers = std::min(options.threads, tokens);
  // Gathered cos/sin rows (multi-axis), then the widened heads of a token.
  const std::size_t scratch_size = rotary_dim + (Storage<T>::kWidened ? token_block : 0);
  // A decode step's workspace fits on the stack; a heap allocation would be
  // a good part of its time.
  constexpr std::size_t kStackScratch = 4608;
  C stack_scratch[kStackScratch];
  std::vector<C> heap_scratch(workers * scratch_size > kStackScratch ? workers * scratch_size : 0);
  C* const scratch = heap_scratch.empty() ? stack_scratch : heap_scratch.data();
  std::vector<T> staging(stream ? workers * token_block : 0);
  auto chunk = [&](std::size_t w) noexcept {
    rotate_tokens<S, Arch, T, C>(passes, count, source, rotary_dim, options.direction, stream, tokens * w / workers,
                           tokens * (w + 1) / workers, scratch + w * scratch_size,
                           stream ? staging.data() + w * token_block : nullptr);
  };
  if (workers == 1) {
    chunk(0);
    return;
  }
  std::vector<std::thread> pool;
  pool.reserve(workers - 1);
  std::size_t started = 1;
  for (; started < workers; ++started) {
    try {
      pool.emplace_back(chunk, started);
    } catch (...) {
      break;
    }
  }
  for (std::size_t w = started; w < workers; ++w) chunk(w);
  chunk(0);
  for (auto& th : pool) th.join();
}

}  // namespace rope::detail
