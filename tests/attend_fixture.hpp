// The fixture of the attend suites (test_attention_attend.cpp,
// test_attention_attend_archs.cpp): the float values of a batch of
// sequences (q per new token, K and V per position), a paged cache of any
// element type holding them (each row rounded once by store_kv_row, every
// slot no sequence owns poisoned, unused block-table entries far outside
// the pool), and plan + attend of it. Split from the suite so that the
// per-architecture instantiations build in a unit of their own.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include <rope/attention.hpp>

#include "kv_elements.hpp"
#include "support.hpp"

namespace attend_test {

namespace ra = rope::attention;
using ra::Batch;
using ra::Logits;
using ra::Mask;
using ra::PagedCache;
using ra::PagePool;
using ra::Plan;
using rope::BFloat16;
using rope::Float16;
using rope::View;

constexpr double kEps = std::numeric_limits<float>::epsilon();
constexpr double kU = kEps / 2;  // float's unit roundoff
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

using rope_test::element_name;
using rope_test::for_each_element;
using rope_test::widen;

template <class E>
E poison() {
  if constexpr (std::is_same<E, float>::value) return kNaN;
  if constexpr (std::is_same<E, std::int8_t>::value) return std::int8_t(127);
  if constexpr (!std::is_same<E, float>::value && !std::is_same<E, std::int8_t>::value) return E(kNaN);
}

struct Seq {
  std::int64_t n, length;  // new tokens, keys in the cache (new ones included)
};

struct Dims {
  std::size_t q_heads = 4, kv_heads = 2, d = 24, dv = 20, page_size = 8;
  std::vector<Seq> seqs;
};

// What a call is given besides its tensors.
struct Options {
  Logits logits;
  Mask mask;
  std::size_t kv_split = 512;
  rope::Threads threads;
};

// The float values of a batch: q per token, K and V per sequence and position.
struct Values {
  Dims dims;
  std::vector<std::int64_t> q_starts, lengths;
  std::size_t tokens = 0;
  std::vector<float> q;                  // [tokens, q_heads, d]
  std::vector<std::vector<float>> k, v;  // per sequence: [length, kv_heads, d or dv]

  float* k_row(std::size_t b, std::size_t j, std::size_t g) { return &k[b][(j * dims.kv_heads + g) * dims.d]; }
  float* v_row(std::size_t b, std::size_t j, std::size_t g) { return &v[b][(j * dims.kv_heads + g) * dims.dv]; }
  const float* k_row(std::size_t b, std::size_t j, std::size_t g) const {
    return &k[b][(j * dims.kv_heads + g) * dims.d];
  }
  const float* v_row(std::size_t b, std::size_t j, std::size_t g) const {
    return &v[b][(j * dims.kv_heads + g) * dims.dv];
  }
  const float* q_row(std::size_t t, std::size_t h) const { return &q[(t * dims.q_heads + h) * dims.d]; }
  // The sequence of token t, and its position.
  std::size_t sequence_of(std::size_t t) const {
    std::size_t b = 0;
    while (static_cast<std::int64_t>(t) >= q_starts[b + 1]) ++b;
    return b;
  }
  std::int64_t position_of(std::size_t t) const {
    const std::size_t b = sequence_of(t);
    return lengths[b] - dims.seqs[b].n + (static_cast<std::int64_t>(t) - q_starts[b]);
  }
};

inline Values make_values(const Dims& s, std::uint32_t seed) {
  Values x;
  x.dims = s;
  x.q_starts.push_back(0);
  for (const Seq& q : s.seqs) {
    x.q_starts.push_back(x.q_starts.back() + q.n);
    x.lengths.push_back(q.length);
  }
  x.tokens = static_cast<std::size_t>(x.q_starts.back());
  x.q = rope_test::random_vector<float>(x.tokens * s.q_heads * s.d, seed, 1.5);
  for (std::size_t b = 0; b < s.seqs.size(); ++b) {
    const std::size_t len = static_cast<std::size_t>(s.seqs[b].length);
    x.k.push_back(rope_test::random_vector<float>(len * s.kv_heads * s.d, seed + 10 + 2 * b, 1.5));
    x.v.push_back(rope_test::random_vector<float>(len * s.kv_heads * s.dv, seed + 11 + 2 * b, 2.0));
  }
  return x;
}

enum class Layout { nhd, hnd, contiguous };

// A cache of E holding a batch's K and V (each row rounded once with
// store_kv_row), every other slot poisoned, unused block-table entries far
// outside the pool.
template <class E>
struct Cache {
  using Element = E;
  std::vector<E> kd, vd;
  std::vector<float> ks, vs;
  PagedCache<E> cache;
  std::vector<std::int32_t> table;
  std::size_t stride = 0;
  std::vector<std::int64_t> q_starts, lengths;

  Batch batch() const { return {q_starts.data(), lengths.data(), table.data(), stride, lengths.size()}; }
  ra::Shape shape(std::size_t q_heads, std::size_t kv_split) const {
    ra::Shape s = ra::Shape::of(cache, q_heads);
    s.kv_split = kv_split;
    return s;
  }
  std::size_t slot(std::size_t b, std::size_t j) const {
    const std::size_t ps = cache.k.page_size;
    return static_cast<std::size_t>(table[b * stride + j / ps]) * ps + j % ps;
  }
  // The bytes of everything the cache holds.
  std::vector<unsigned char> bytes() const {
    std::vector<unsigned char> out;
    auto add = [&](const void* p, std::size_t n) {
      const auto* c = static_cast<const unsigned char*>(p);
      out.insert(out.end(), c, c + n);
    };
    add(kd.data(), kd.size() * sizeof(E));
    add(vd.data(), vd.size() * sizeof(E));
    add(ks.data(), ks.size() * sizeof(float));
    add(vs.data(), vs.size() * sizeof(float));
    return out;
  }
  // Row (b, j, g) of K or V read back as floats (int8: s q rounded once).
  std::vector<float> read(bool key, std::size_t b, std::size_t j, std::size_t g) const {
    const PagePool<E>& p = key ? cache.k : cache.v;
    const std::size_t s = slot(b, j);
    const E* r = p.row(s, g);
    std::vector<float> out(p.head_dim);
    const float scale = rope::KvElement<E>::kScaled ? *p.scale(s, g) : 1.0f;
    for (std::size_t c = 0; c < p.head_dim; ++c)
      out[c] = rope::KvElement<E>::kScaled ? scale * widen(r[c]) : widen(r[c]);
    return out;
  }
};

template <class E>
Cache<E> build(const Values& x, Layout layout, std::uint32_t seed = 1) {
  const Dims& s = x.dims;
  Cache<E> c;
  c.q_starts = x.q_starts;
  c.lengths = x.lengths;
  const std::size_t B = s.seqs.size();
  std::size_t pages = 0, page_size = s.page_size;
  std::vector<std::size_t> need(B);
  if (layout == Layout::contiguous) {
    std::size_t capacity = 1;
    for (const Seq& q : s.seqs) capacity = std::max(capacity, static_cast<std::size_t>(q.length));
    page_size = capacity;
    pages = B;
    c.stride = 1;
    for (std::size_t b = 0; b < B; ++b) c.table.push_back(static_cast<std::int32_t>(b));
  } else {
    for (std::size_t b = 0; b < B; ++b) {
      need[b] = (static_cast<std::size_t>(s.seqs[b].length) + page_size - 1) / page_size;
      pages += need[b];
      c.stride = std::max(c.stride, need[b] + 1);
    }
    pages += 3;  // pages no sequence reads
    std::vector<std::int32_t> ids(pages);
    std::iota(ids.begin(), ids.end(), 0);
    std::mt19937 gen(seed);
    std::shuffle(ids.begin(), ids.end(), gen);
    c.table.assign(B * c.stride, std::int32_t(1) << 30);
    std::size_t next = 0;
    for (std::size_t b = 0; b < B; ++b) {
      for (std::size_t i = 0; i < need[b]; ++i) c.table[b * c.stride + i] = ids[next++];
    }
  }
  c.kd.assign(pages * page_size * s.kv_heads * s.d, poison<E>());
  c.vd.assign(pages * page_size * s.kv_heads * s.dv, poison<E>());
  float* kscales = nullptr;
  float* vscales = nullptr;
  if (rope::KvElement<E>::kScaled) {
    c.ks.assign(pages * page_size * s.kv_heads, kNaN);
    c.vs.assign(pages * page_size * s.kv_heads, kNaN);
    kscales = c.ks.data();
    vscales = c.vs.data();
  }
  if (layout == Layout::hnd) {
    c.cache.k = PagePool<E>::hnd(c.kd.data(), pages, page_size, s.kv_heads, s.d, kscales);
    c.cache.v = PagePool<E>::hnd(c.vd.data(), pages, page_size, s.kv_heads, s.dv, vscales);
  } else {
    c.cache.k = PagePool<E>::nhd(c.kd.data(), pages, page_size, s.kv_heads, s.d, kscales);
    c.cache.v = PagePool<E>::nhd(c.vd.data(), pages, page_size, s.kv_heads, s.dv, vscales);
  }
  for (std::size_t b = 0; b < B; ++b) {
    for (std::size_t j = 0; j < static_cast<std::size_t>(s.seqs[b].length); ++j) {
      const std::size_t slot = c.slot(b, j);
      for (std::size_t g = 0; g < s.kv_heads; ++g) {
        rope::store_kv_row(x.k_row(b, j, g), s.d, c.cache.k.row(slot, g),
                           kscales != nullptr ? c.cache.k.scale(slot, g) : nullptr);
        rope::store_kv_row(x.v_row(b, j, g), s.dv, c.cache.v.row(slot, g),
                           vscales != nullptr ? c.cache.v.scale(slot, g) : nullptr);
      }
    }
  }
  return c;
}

// The values a cache of E holds, widened (dequantized) to float.
template <class E>
Values widened(const Values& x, const Cache<E>& c) {
  Values y = x;
  for (std::size_t b = 0; b < x.dims.seqs.size(); ++b) {
    for (std::size_t j = 0; j < static_cast<std::size_t>(x.lengths[b]); ++j) {
      for (std::size_t g = 0; g < x.dims.kv_heads; ++g) {
        const auto k = c.read(true, b, j, g), v = c.read(false, b, j, g);
        std::copy(k.begin(), k.end(), y.k_row(b, j, g));
        std::copy(v.begin(), v.end(), y.v_row(b, j, g));
      }
    }
  }
  return y;
}

inline View<const float> q_view(const Values& x) {
  return View<const float>::token_major(x.q.data(), x.tokens, x.dims.q_heads, x.dims.d);
}

// plan + attend of a cache, out (and lse) filled with a pattern first; the
// plan is `reused` when given (it keeps its buffers between calls).
template <class E>
std::vector<float> run(const Values& x, const Cache<E>& c, const Options& o, std::vector<float>* lse = nullptr,
                       Plan* reused = nullptr) {
  Plan own;
  Plan& p = reused != nullptr ? *reused : own;
  ra::plan(p, c.shape(x.dims.q_heads, o.kv_split), c.batch(), o.threads);
  std::vector<float> out(x.tokens * x.dims.q_heads * x.dims.dv, -777.0f);
  if (lse != nullptr) lse->assign(x.tokens * x.dims.q_heads, -555.0f);
  ra::attend(p, c.cache, q_view(x), View<float>::token_major(out.data(), x.tokens, x.dims.q_heads, x.dims.dv), o.logits,
             o.mask, lse != nullptr ? lse->data() : nullptr);
  return out;
}

inline bool same_bytes(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Decode, prefill, chunked prefill, a one-key sequence, one with no new
// tokens; page size 8 so runs cross pages; GQA 4 / 2; d, dv not multiples of
// any batch width.
inline Dims mixed_dims() {
  Dims s;
  s.seqs = {{1, 37}, {23, 23}, {5, 40}, {1, 1}, {0, 10}, {1, 70}, {3, 3}};
  return s;
}

}  // namespace attend_test
