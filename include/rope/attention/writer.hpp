// rope/attention/writer.hpp — the one writer of a paged KV cache: a new
// token's K rows (normalized and rotated first, pre_attention.hpp) and V
// rows, each value rounded once into the cache's type (int8: quantized with
// its vector's own scale, written beside it; kernels/kv_store.hpp), into the
// slot the plan derived for the token.
//
// Stores: a long prefill writes more cache rows than the caches hold, and
// a plain store of an uncached line first reads it; with streaming stores
// (rope::Stores) the rows go to memory without that read and without
// evicting the input. Stores::automatic streams when one call writes at
// least kStreamedCacheBytes of cache rows, never for a decode step, whose
// few rows the attention that follows reads from cache. A float cache
// without streaming takes K rotated straight into its rows. The bits are
// the same in every case: only where the rounded values go changes.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "../detail/stream.hpp"
#include "../kernels/kv_store.hpp"
#include "../options.hpp"
#include "../view.hpp"
#include "cache.hpp"
#include "pre_attention.hpp"
#include "rotation.hpp"

namespace rope::attention {

// The cache bytes one call must write before Stores::automatic streams them.
constexpr std::size_t kStreamedCacheBytes = std::size_t(8) << 20;

namespace detail {

// What one token's write needs, checked.
template <class In, class E, class Arch = xsimd::default_arch>
struct TokenWriter {
  View<const In> k, v;
  PagedCache<E> cache;
  Rotation<float> rotation;
  std::size_t rotary_dim = 0;
  Norm k_norm;
  View<In> k_back;      // data null: K not written back
  bool stream = false;  // cache rows written with streaming stores (then stream_fence before a join)

  // Floats of scratch write() needs: a token's K rows (or one V row), and
  // with streaming one row of E staged before it is streamed.
  std::size_t scratch_size() const noexcept { return rows_size() + (stream ? std::max(k.head_dim, v.head_dim) : 0); }

  // Token t's K rows (normalized, rotated at m) and V rows into slot s (s
  // < 0: only the write-back), each value rounded once. scratch: scratch_size() floats.
  void write(std::size_t t, std::int64_t s, std::int64_t m, float* scratch) const noexcept {
    const bool rotated = rotation.table != nullptr;
    const auto row = static_cast<std::size_t>(m);
    write(t, s, rotated ? rotation.table->cos(row) : nullptr, rotated ? rotation.table->sin(row) : nullptr, scratch);
  }

  // The same, K rotated with one row of cos and sin (null: not rotated).
  void write(std::size_t t, std::int64_t s, const float* cos, const float* sin, float* scratch) const noexcept {
    if (s < 0 && k_back.data == nullptr) return;
    const std::size_t d = k.head_dim;
    const auto slot = static_cast<std::size_t>(s);
    load_normed<In, Arch>(k, t, k_norm, scratch);
    if constexpr (std::is_same<E, float>::value) {
      if (s >= 0 && !stream && k_back.data == nullptr) {
        // An f32 cache: K rotated from scratch straight into its rows.
        rotate_store<Arch>(scratch, rotation.style, rotary_dim, cos, sin,
                           View<float>(cache.k.row(slot, 0), 1, k.heads, d, 0, cache.k.head_stride), 0);
        write_v(t, slot, scratch);
        return;
      }
    }
    if (cos != nullptr)
      rotate_with<float, Arch>(rotation.style, rotary_dim, cos, sin, scratch, static_cast<std::ptrdiff_t>(d), k.heads);
    if (k_back.data != nullptr) {
      for (std::size_t h = 0; h < k.heads; ++h) store_kv_row<Arch>(scratch + h * d, d, k_back.row(t, h), nullptr);
    }
    if (s < 0) return;
    float* staging = scratch + rows_size();
    for (std::size_t h = 0; h < k.heads; ++h) {
      put(scratch + h * d, d, cache.k.row(slot, h), KvElement<E>::kScaled ? cache.k.scale(slot, h) : nullptr, staging);
    }
    write_v(t, slot, scratch);
  }

 private:
  // Floats of scratch before the staging row: a token's K rows, or one V row.
  std::size_t rows_size() const noexcept { return std::max(k.heads * k.head_dim, v.head_dim); }

  // Token t's V rows into slot (scratch: a widened row, and the staging).
  void write_v(std::size_t t, std::size_t slot, float* scratch) const noexcept {
    float* staging = scratch + rows_size();
    for (std::size_t h = 0; h < v.heads; ++h) {
      const float* row = scratch;
      if constexpr (std::is_same<In, float>::value) {
        row = v.row(t, h);  // a float row is stored from where it is
      } else {
        widen_row(v.row(t, h), v.head_dim, scratch);
      }
      put(row, v.head_dim, cache.v.row(slot, h), KvElement<E>::kScaled ? cache.v.scale(slot, h) : nullptr, staging);
    }
  }

  // One row of n floats rounded into out: stored, or (stream) rounded into
  // staging and streamed from there, the same values either way.
  void put(const float* x, std::size_t n, E* out, float* scale, float* staging) const noexcept {
    if (!stream) {
      store_kv_row<Arch>(x, n, out, scale);
      return;
    }
    const void* from = x;
    if constexpr (!std::is_same<E, float>::value) {
      store_kv_row<Arch>(x, n, reinterpret_cast<E*>(staging), scale);
      from = staging;
    }
    rope::detail::stream_copy<Arch>(out, from, n * sizeof(E));
  }
};

// Whether a call of `tokens` new tokens streams its cache rows: `stores`,
// or with automatic the bytes it writes against kStreamedCacheBytes.
template <class E, class In>
bool streams(rope::Stores stores, std::size_t tokens, const View<const In>& k, const View<const In>& v) noexcept {
  if (stores != rope::Stores::automatic) return stores == rope::Stores::streaming;
  const std::size_t per_token = (k.heads * k.head_dim + v.heads * v.head_dim) * sizeof(E);
  return tokens * per_token >= kStreamedCacheBytes;
}

}  // namespace detail
}  // namespace rope::attention
