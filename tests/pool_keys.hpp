// attend_keys' arguments (rope::KvKeys) over a token-major pool of pages,
// K and V alike ([pages, page, kv_heads, d]), for the tests that call it
// directly (tests/kv_decode_checks.hpp, test_dispatch).
#pragma once

#include <cstddef>
#include <cstdint>

#include <rope/kernels/kv_rows.hpp>

namespace rope_test {

// Keys first .. first + count - 1 of the sequence whose pages are `table`;
// the scales are null for an unscaled type.
template <class E>
rope::KvKeys<E> pool_keys(const E* k, const E* v, const float* k_scales, const float* v_scales,
                          const std::int32_t* table, std::size_t page, std::size_t q_heads, std::size_t kv_heads,
                          std::size_t d, std::size_t first, std::size_t count, std::size_t chunk, float scale) {
  rope::KvKeys<E> a;
  a.k = k;
  a.v = v;
  a.k_scales = k_scales;
  a.v_scales = v_scales;
  a.pages = table;
  a.page_size = page;
  a.k_page_stride = a.v_page_stride = page * kv_heads * d;
  a.k_token_stride = a.v_token_stride = kv_heads * d;
  a.k_head_stride = a.v_head_stride = d;
  a.first_key = first;
  a.keys = count;
  a.q_heads = q_heads;
  a.kv_heads = kv_heads;
  a.d = a.dv = d;
  a.chunk = chunk;
  a.scale = scale;
  return a;
}

}  // namespace rope_test
