// rope/attention/cache.hpp — a paged KV cache: pools of fixed-size pages of
// rows, for K and for V, of an element type E (float, BFloat16, Float16,
// std::int8_t, Float8E4M3, Float8E5M2), and the checks every call that
// reads or writes one makes.
//
// Row (page p, offset o, head h) of a PagePool is at
//
//   data + p * page_stride + o * token_stride + h * head_stride
//
// so a pool is [pages, page_size, heads, head_dim] (nhd(): "NHD") or
// [pages, heads, page_size, head_dim] (hnd(): "HND"), or any other strides
// whose rows do not overlap. A slot names a row by page and offset: slot =
// page * page_size + offset. An int8 pool has one float scale per (slot,
// head), at scales[slot * heads + h]: the row holds q with x = s q
// (kernels/kv_store.hpp); so has an fp8 pool. A contiguous cache of one sequence is a pool of
// one page of its capacity (contiguous()).
//
// A sequence's key j is in slot block_table[j / page_size] * page_size +
// j % page_size (plan.hpp). Pages may be shared read-only by several
// sequences (a common prefix).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "../kernels/kv_planes.hpp"
#include "../tensor/shared_checks.hpp"
#include "../tensor/view_checks.hpp"
#include "../view.hpp"

namespace rope::attention {

template <class E>
struct PagePool {
  E* data = nullptr;
  float* scales = nullptr;  // int8 and fp8 only: pages * page_size * heads, at slot * heads + h
  std::size_t pages = 0;
  std::size_t page_size = 0;
  std::size_t heads = 0;
  std::size_t head_dim = 0;
  std::size_t page_stride = 0;  // in elements
  std::size_t token_stride = 0;
  std::size_t head_stride = 0;

  // [pages, page_size, heads, head_dim], dense.
  static PagePool nhd(E* data, std::size_t pages, std::size_t page_size, std::size_t heads, std::size_t head_dim,
                      float* scales = nullptr) noexcept {
    return {data, scales, pages, page_size, heads, head_dim, page_size * heads * head_dim, heads * head_dim, head_dim};
  }
  // One page holding a sequence's whole contiguous cache: rows is
  // [capacity, heads, head_dim] with any strides (a View of the caller's
  // buffer), scales (int8, fp8) capacity * heads floats.
  static PagePool contiguous(const View<E>& rows, float* scales = nullptr) noexcept {
    const std::size_t span =
        rows.tokens == 0 ? 0
                         : (rows.tokens - 1) * rows.token_stride + (rows.heads - 1) * rows.head_stride + rows.head_dim;
    return {rows.data, scales, 1, rows.tokens, rows.heads, rows.head_dim, span, rows.token_stride, rows.head_stride};
  }
  // [pages, heads, page_size, head_dim], dense.
  static PagePool hnd(E* data, std::size_t pages, std::size_t page_size, std::size_t heads, std::size_t head_dim,
                      float* scales = nullptr) noexcept {
    return {
        data, scales, pages, page_size, heads, head_dim, page_size * heads * head_dim, head_dim, page_size * head_dim};
  }

  std::size_t slots() const noexcept { return pages * page_size; }
  // Unchecked: slot < slots(), h < heads.
  E* row(std::size_t slot, std::size_t h) const noexcept {
    return data + (slot / page_size) * page_stride + (slot % page_size) * token_stride + h * head_stride;
  }
  float* scale(std::size_t slot, std::size_t h) const noexcept { return scales + slot * heads + h; }
  // Page p's rows as a View of page_size tokens (unchecked: p < pages).
  View<E> page(std::size_t p) const noexcept {
    return View<E>(data + p * page_stride, page_size, heads, head_dim, token_stride, head_stride);
  }
};

template <class E>
struct PagedCache {
  PagePool<E> k, v;

  // One sequence's contiguous cache, [capacity, kv_heads, head_dim] for K
  // and [capacity, kv_heads, v_head_dim] for V: a pool of one page each
  // (its block table is {0}; plan.hpp has the one-sequence plan).
  static PagedCache contiguous(const View<E>& k, const View<E>& v, float* k_scales = nullptr,
                               float* v_scales = nullptr) noexcept {
    return {PagePool<E>::contiguous(k, k_scales), PagePool<E>::contiguous(v, v_scales)};
  }
};

// MLA's latent cache (DeepSeek V2/V3, Kimi K2, GLM-4.7-Flash, GLM-5): per
// token one row shared by every query head, [c_kv (latent_dim) | k_pe
// (rope_dim, rotated)], in pages of page_size rows: row (page p, offset o)
// at data + p * page_stride + o * token_stride, its width values
// contiguous. The keys are the whole rows, the values their first
// latent_dim values: a view of the same rows, never a copy. int8 rows carry
// two scales, at scales[2 * slot] for the latent part and [2 * slot + 1]
// for the rope part: c_kv leaves an RMSNorm and k_pe a projection, of
// magnitudes that need not be alike, and one scale for both would spend the
// rope part's 8 bits on the latent's range (or the other way round).
template <class E>
struct LatentCache {
  E* data = nullptr;
  float* scales = nullptr;  // int8 and fp8 only: 2 per slot
  std::size_t pages = 0;
  std::size_t page_size = 0;
  std::size_t latent_dim = 0;                     // kv_lora_rank
  std::size_t rope_dim = 0;                       // qk_rope_head_dim
  std::size_t page_stride = 0, token_stride = 0;  // in elements

  // [pages, page_size, latent_dim + rope_dim], dense.
  static LatentCache dense(E* data, std::size_t pages, std::size_t page_size, std::size_t latent_dim,
                           std::size_t rope_dim, float* scales = nullptr) noexcept {
    const std::size_t w = latent_dim + rope_dim;
    return {data, scales, pages, page_size, latent_dim, rope_dim, page_size * w, w};
  }
  // One sequence's contiguous cache of `capacity` rows: one page.
  static LatentCache contiguous(E* data, std::size_t capacity, std::size_t latent_dim, std::size_t rope_dim,
                                float* scales = nullptr) noexcept {
    return dense(data, 1, capacity, latent_dim, rope_dim, scales);
  }

  std::size_t width() const noexcept { return latent_dim + rope_dim; }
  std::size_t slots() const noexcept { return pages * page_size; }
  // Unchecked: slot < slots().
  E* row(std::size_t slot) const noexcept {
    return data + (slot / page_size) * page_stride + (slot % page_size) * token_stride;
  }
  float* scale(std::size_t slot) const noexcept { return scales + 2 * slot; }
};

namespace detail {

// A cache type as an error message names it.
template <class E>
const char* kv_type_name() noexcept {
  if (std::is_same<E, float>::value) return "a float cache";
  if (std::is_same<E, BFloat16>::value) return "a bf16 cache";
  if (std::is_same<E, Float16>::value) return "an f16 cache";
  if (std::is_same<E, Float8E4M3>::value) return "an fp8 (e4m3) cache";
  if (std::is_same<E, Float8E5M2>::value) return "an fp8 (e5m2) cache";
  return "an int8 cache";
}

using rope::detail::fail;
using rope::detail::field;
using rope::detail::indexed;
using rope::detail::to_text;

template <class E>
constexpr void check_kv_element() noexcept {
  static_assert(KvElement<E>::kSupported,
                "rope::attention: a KV cache holds float, rope::BFloat16, rope::Float16, std::int8_t, "
                "rope::Float8E4M3 or rope::Float8E5M2");
}

template <class T>
constexpr void check_row_type() noexcept {
  static_assert(std::is_same<T, float>::value || std::is_same<T, BFloat16>::value || std::is_same<T, Float16>::value,
                "rope::attention: query, new key/value and output rows are float, rope::BFloat16 or rope::Float16");
}

// The elements a pool spans from data (its last row's end).
template <class E>
std::size_t pool_span(const PagePool<E>& p) noexcept {
  if (p.pages == 0 || p.page_size == 0 || p.heads == 0) return 0;
  return (p.pages - 1) * p.page_stride + (p.page_size - 1) * p.token_stride + (p.heads - 1) * p.head_stride +
         p.head_dim;
}

// A pool alone: sizes, rows that do not overlap, pages that do not overlap,
// scales set exactly when E is int8 or fp8.
template <class E>
void check_pool(const char* fn, const char* name, const PagePool<E>& p) {
  if (p.pages == 0) fail(fn, {name, ".pages"}, "at least 1", p.pages);
  if (p.page_size == 0) fail(fn, {name, ".page_size"}, "at least 1", p.page_size);
  if (p.heads == 0) fail(fn, {name, ".heads"}, "at least 1", p.heads);
  rope::detail::check_view(fn, name, p.page(0));
  const std::size_t span = (p.page_size - 1) * p.token_stride + (p.heads - 1) * p.head_stride + p.head_dim;
  if (p.pages > 1) {
    if (p.page_stride < span) {
      fail(fn, {name, ".page_stride"}, {">= ", span, " (pages would overlap)"}, p.page_stride);
    }
    if (rope::detail::product_above(p.page_stride, p.pages, rope::detail::kMaxViewBytes / sizeof(E))) {
      fail(fn, {name, ".page_stride"}, "small enough to stay inside the address range", p.page_stride);
    }
  }
  if (KvElement<E>::kScaled && p.scales == nullptr) {
    fail(fn, {name, ".scales"}, "non-null for an int8 or fp8 pool (one scale per slot and head)", nullptr);
  }
  if (!KvElement<E>::kScaled && p.scales != nullptr) {
    fail(fn, {name, ".scales"}, "null: only an int8 or fp8 pool has scales", "set");
  }
}

template <class E>
void check_cache(const char* fn, const PagedCache<E>& c) {
  check_pool(fn, "cache.k", c.k);
  check_pool(fn, "cache.v", c.v);
  if (c.v.pages != c.k.pages) fail(fn, "cache.v.pages", {"cache.k.pages = ", c.k.pages}, c.v.pages);
  if (c.v.page_size != c.k.page_size) {
    fail(fn, "cache.v.page_size", {"cache.k.page_size = ", c.k.page_size}, c.v.page_size);
  }
  if (c.v.heads != c.k.heads) fail(fn, "cache.v.heads", {"cache.k.heads = ", c.k.heads}, c.v.heads);
}

// A latent cache alone: sizes, rows and pages that do not overlap, scales
// set exactly when E is int8.
template <class E>
void check_latent_cache(const char* fn, const LatentCache<E>& c) {
  if (c.pages == 0) fail(fn, "cache.pages", "at least 1", c.pages);
  if (c.page_size == 0) fail(fn, "cache.page_size", "at least 1", c.page_size);
  if (c.latent_dim == 0) fail(fn, "cache.latent_dim", "at least 1", c.latent_dim);
  if (c.rope_dim == 0 || c.rope_dim % 2 != 0) fail(fn, "cache.rope_dim", "even and at least 2", c.rope_dim);
  if (c.data == nullptr) fail(fn, "cache.data", "non-null", nullptr);
  if (c.page_size > 1 && c.token_stride < c.width()) {
    fail(fn, "cache.token_stride", {">= the row's width ", c.width(), " (rows would overlap)"}, c.token_stride);
  }
  const std::size_t span = (c.page_size - 1) * c.token_stride + c.width();
  if (c.pages > 1 && c.page_stride < span) {
    fail(fn, "cache.page_stride", {">= ", span, " (pages would overlap)"}, c.page_stride);
  }
  if (rope::detail::product_above(std::max(c.page_stride, span), c.pages, rope::detail::kMaxViewBytes / sizeof(E))) {
    fail(fn, "cache.page_stride", "small enough to stay inside the address range", c.page_stride);
  }
  if (KvElement<E>::kScaled && c.scales == nullptr) {
    fail(fn, "cache.scales", "non-null for an int8 or fp8 cache (two scales per slot)", nullptr);
  }
  if (!KvElement<E>::kScaled && c.scales != nullptr)
    fail(fn, "cache.scales", "null: only an int8 or fp8 cache has scales", "set");
}

// The elements a latent cache spans from data.
template <class E>
std::size_t latent_span(const LatentCache<E>& c) noexcept {
  return (c.pages - 1) * c.page_stride + (c.page_size - 1) * c.token_stride + c.width();
}

// Whether [a, a + an) and [b, b + bn) (elements of A and B) share a byte.
template <class A, class B>
bool bytes_overlap(const A* a, std::size_t an, const B* b, std::size_t bn) noexcept {
  const auto a0 = reinterpret_cast<std::uintptr_t>(a), b0 = reinterpret_cast<std::uintptr_t>(b);
  const std::uintptr_t a1 = a0 + an * sizeof(A), b1 = b0 + bn * sizeof(B);
  return an > 0 && bn > 0 && a0 < b1 && b0 < a1;
}

template <class T>
std::size_t view_span(const View<T>& v) noexcept {
  if (v.tokens == 0 || v.heads == 0) return 0;
  return (v.tokens - 1) * v.token_stride + (v.heads - 1) * v.head_stride + v.head_dim;
}

// A view that must not share memory with a pool (nor with its scales).
template <class T, class E>
void check_apart(const char* fn, const char* name, const View<T>& v, const char* pool_name, const PagePool<E>& p) {
  const std::size_t span = view_span(v);
  if (bytes_overlap(v.data, span, p.data, pool_span(p)) ||
      (p.scales != nullptr && bytes_overlap(v.data, span, p.scales, p.slots() * p.heads))) {
    fail(fn, name, {"memory apart from ", pool_name}, "overlapping");
  }
}

// Whether two views are the same rows of one type (a call in place).
template <class T, class O>
bool same_rows(const View<T>& a, const View<O>& b) noexcept {
  return std::is_same<std::remove_const_t<T>, std::remove_const_t<O>>::value &&
         static_cast<const void*>(a.data) == static_cast<const void*>(b.data) && a.token_stride == b.token_stride &&
         a.head_stride == b.head_stride;
}

// The float values of one row of In.
template <class In>
void widen_row(const In* x, std::size_t n, float* out) noexcept {
  for (std::size_t c = 0; c < n; ++c) out[c] = rope::detail::widen_value(x[c]);
}

}  // namespace detail

}  // namespace rope::attention
