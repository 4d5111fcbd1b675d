// Tree verify (attention/tree.hpp; Batch::tree_depths, tree_masks,
// tree_mask_words): a sequence's n new tokens after c cached ones form a
// tree; new token i is at position c + depth_i, is written to the slot of
// key c + i, and sees keys 0 .. c - 1 and key c + j for every bit j of its
// mask row. This file holds:
//   - attend over a tree step within the bound derived below of a
//     long-double oracle that applies the literal mask bits (q and k rotated
//     at their positions from the exact angles), for f32, bf16, f16 and int8
//     caches; trees of several shapes in one batch (a chain, a star with an
//     extra bit to a sibling, a complete binary tree, the same tree with its
//     tokens in reverse order, and a tree of 70 tokens: tree_mask_words 2),
//     beside a decode sequence and a prefill chunk, whose rows are the bytes
//     of the same step planned without the tree sequences;
//   - each tree token whose mask row is its chain of ancestors: its row is,
//     bit for bit, the last row of that chain appended as a plain causal
//     chunk after the same cached pages;
//   - plan(): each token's position (c + depth) and slot (key c + i's), and
//     each tree token's key list (the cached keys, then its bits in order);
//   - refusals, each naming the argument and its value: depths outside
//     [0, n), a token that does not see itself, a bit past the sequence's
//     new tokens, a token that sees a deeper one, a depth other than -1 in a
//     sequence that is not a tree, null masks, too few mask words; a refused
//     plan leaves no plan (append and attend refuse it and write nothing);
//     attend with a window or a sparse list on a plan with trees writes
//     nothing; append checks a tree token's position (c + depth) against the
//     table, not its sequence's length, and names the depth of one past it.
//
// The bound. Over exact values, the score of key j is
// s_j = scale * sum_c q_c k_jc, with q = R_(p_t) q_raw and, for an f32
// cache, k_j = R_(p_j) k_raw (p_j = j for a cached key, c + depth for a tree
// key); for the other caches k_j is the stored key widened (int8: the code
// times its scale), which carries append's rotation and rounding already,
// and which is checked first to be within that rotation's bound (below)
// and one rounding into the type (bf16 2^-8, f16 2^-11 of the value, int8
// half its row's scale) of the exact rotation at p_j, in the slot of its
// own key.
// The rotation is float arithmetic on table entries: pair (a, b) as
// y_a = fl(fl(x_a c~) - x_b s~) (fused or not, the same bound), with c~, s~
// the table's float cos and sin of the double angle m * theta (each within
// 1/2 ulp + 2^-27 ulp of it; the double angle within 2^-53 m theta of the
// exact one). So each rotated value is within
//   rho_a = 3u (1 + 2^-20) (|x_a c| + |x_b s|) + 2^-51 m theta (|x_a| + |x_b|)
// of the exact rotation (u = 2^-24: the table's relative u, the product's u
// and the result's u, each of at most |x_a c| + |x_b s| to first order).
// With rho (q) and rho' (k, zero for stored keys), the scores the kernel
// starts from are within sum_c |scale| (rho_c (|k_c| + rho'_c) + |q_c| rho'_c)
// of the exact ones; the float dot product, the scale and its rounding add
// gamma_(d+3) |scale| sum_c (|q_c| + rho_c)(|k_c| + rho'_c) (Higham, lemma
// 3.1). With eps = the largest such error over the keys a row sees, the
// weights move by factors within exp(+-2 eps), and the rest of the
// arithmetic rounds (each weight within 2 ulps of its exp, int8's weight
// times its value scale once, the sums of n keys in one part, the final
// division):
//   |out' - out| <= (exp(2 eps) - 1) V + gamma_(2n + 20) V,
//   |lse' - lse| <= eps + gamma_(2n + 20),
// V = max |v_j| over the keys the row sees.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <rope/attention.hpp>
#include <rope/frequencies.hpp>
#include <rope/table.hpp>

#include "attention_oracle.hpp"
#include "kv_elements.hpp"
#include "support.hpp"

namespace {

namespace at = attention_test;
namespace ra = rope::attention;
using at::LD;
using rope::BFloat16;
using rope::Float16;
using rope::View;

constexpr double kU = std::numeric_limits<float>::epsilon() / 2;
constexpr std::size_t kPageSize = 4, kPages = 64, kStride = 20, kTablePositions = 128;

// The heads of a step: 4/2 heads of d 16 (the decode loop for any shape),
// and 8/2 heads of d 128 (its compiled shape, 4 query heads per key head).
struct Dims {
  std::size_t hq, hk, d;
  rope::Style style;
};
constexpr Dims kSmall{4, 2, 16, rope::Style::rotate_half};
constexpr Dims kShaped{8, 2, 128, rope::Style::block_diagonal};

// One sequence of a step: c cached keys, then n new tokens, a tree when
// parent is set (parent[i]: the token i follows, -1 for a root); extra
// holds bits (token, sees) besides each token's ancestors and itself.
struct Seq {
  std::size_t cached = 0, fresh = 0;
  std::vector<int> parent;
  std::vector<std::pair<std::size_t, std::size_t>> extra;
  std::vector<std::int32_t> pages;  // its block-table row

  bool tree() const { return !parent.empty(); }
  std::size_t length() const { return cached + fresh; }
  std::int32_t depth(std::size_t i) const {
    std::int32_t d = 0;
    for (int a = parent[i]; a >= 0; a = parent[static_cast<std::size_t>(a)]) ++d;
    return d;
  }
  // Token i's mask bits: its ancestors, itself and its extra bits.
  std::vector<bool> row(std::size_t i) const {
    std::vector<bool> bits(fresh, false);
    for (int a = static_cast<int>(i); a >= 0; a = parent[static_cast<std::size_t>(a)])
      bits[static_cast<std::size_t>(a)] = true;
    for (const auto& e : extra) {
      if (e.first == i) bits[e.second] = true;
    }
    return bits;
  }
  std::size_t slot(std::size_t key) const {
    return static_cast<std::size_t>(pages[key / kPageSize]) * kPageSize + key % kPageSize;
  }
};

Seq plain_seq(std::size_t cached, std::size_t fresh) {
  Seq s;
  s.cached = cached;
  s.fresh = fresh;
  return s;
}
Seq tree_seq(std::size_t cached, std::vector<int> parent) {
  Seq s;
  s.cached = cached;
  s.fresh = parent.size();
  s.parent = std::move(parent);
  return s;
}

// A complete binary tree of n tokens in breadth-first order, or reversed
// (token i is the breadth-first n - 1 - i: children before their parents).
std::vector<int> binary_tree(std::size_t n, bool reversed) {
  std::vector<int> parent(n, -1);
  for (std::size_t k = 1; k < n; ++k) {
    const std::size_t p = (k - 1) / 2;
    if (reversed) {
      parent[n - 1 - k] = static_cast<int>(n - 1 - p);
    } else {
      parent[k] = static_cast<int>(p);
    }
  }
  return parent;
}

// n tokens, each after an earlier one: the one just before it about a
// third of the time (long paths), else any.
std::vector<int> random_tree(std::size_t n, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<int> parent(n, -1);
  for (std::size_t i = 1; i < n; ++i) {
    std::uniform_int_distribution<int> any(0, static_cast<int>(i) - 1);
    parent[i] = gen() % 3 == 0 ? static_cast<int>(i) - 1 : any(gen);
  }
  return parent;
}

// A step's batch arrays, built from its sequences.
struct Step {
  std::vector<Seq> seqs;
  std::vector<std::int64_t> starts{0}, lengths;
  std::vector<std::int32_t> table;
  std::vector<std::int32_t> depths;  // empty: no tree in the batch
  std::vector<std::uint64_t> masks;
  std::size_t words = 0;

  std::size_t tokens() const { return static_cast<std::size_t>(starts.back()); }
  // The sequence of new token t and its index there.
  std::size_t sequence_of(std::size_t t) const {
    std::size_t b = 0;
    while (static_cast<std::size_t>(starts[b + 1]) <= t) ++b;
    return b;
  }
  std::size_t index_of(std::size_t t) const { return t - static_cast<std::size_t>(starts[sequence_of(t)]); }

  // Gives every sequence pages of its own, shuffled.
  void assign_pages(std::uint32_t seed) {
    std::vector<std::int32_t> ids(kPages);
    std::iota(ids.begin(), ids.end(), 0);
    std::mt19937 gen(seed);
    std::shuffle(ids.begin(), ids.end(), gen);
    std::size_t next = 0;
    for (Seq& s : seqs) {
      s.pages.assign(kStride, 0);
      const std::size_t used = (s.length() + kPageSize - 1) / kPageSize;
      for (std::size_t i = 0; i < used; ++i) s.pages[i] = ids.at(next++);
    }
    finish();
  }
  void finish() {
    starts = {0};
    lengths.clear();
    table.clear();
    words = 0;
    bool trees = false;
    for (const Seq& s : seqs) {
      starts.push_back(starts.back() + static_cast<std::int64_t>(s.fresh));
      lengths.push_back(static_cast<std::int64_t>(s.length()));
      table.insert(table.end(), s.pages.begin(), s.pages.end());
      if (s.tree()) {
        trees = true;
        words = std::max(words, (s.fresh + 63) / 64);
      }
    }
    depths.clear();
    masks.clear();
    if (!trees) return;
    depths.assign(tokens(), -1);
    masks.assign(tokens() * words, 0);
    for (std::size_t b = 0; b < seqs.size(); ++b) {
      const Seq& s = seqs[b];
      if (!s.tree()) continue;
      for (std::size_t i = 0; i < s.fresh; ++i) {
        const std::size_t t = static_cast<std::size_t>(starts[b]) + i;
        depths[t] = s.depth(i);
        const std::vector<bool> bits = s.row(i);
        for (std::size_t j = 0; j < s.fresh; ++j) {
          if (bits[j]) masks[t * words + j / 64] |= std::uint64_t{1} << (j % 64);
        }
      }
    }
  }
  ra::Batch batch() const {
    ra::Batch b{starts.data(), lengths.data(), table.data(), kStride, seqs.size()};
    if (!depths.empty()) {
      b.tree_depths = depths.data();
      b.tree_masks = masks.data();
      b.tree_mask_words = words;
    }
    return b;
  }
  // The same step without its tree sequences (the others keep their pages).
  Step without_trees() const {
    Step s;
    for (const Seq& q : seqs) {
      if (!q.tree()) s.seqs.push_back(q);
    }
    s.finish();
    return s;
  }
  // Whether new token t sees key `key` of its sequence (the literal bits;
  // for a plain token, the causal mask).
  bool sees(std::size_t t, std::size_t key) const {
    const std::size_t b = sequence_of(t), i = index_of(t);
    const Seq& s = seqs[b];
    if (key < s.cached) return true;
    if (!s.tree()) return key <= s.cached + i;
    const std::size_t j = key - s.cached;
    return ((masks[t * words + j / 64] >> (j % 64)) & 1u) != 0;
  }
  // Key `key` of sequence b's position.
  std::int64_t key_position(std::size_t b, std::size_t key) const {
    const Seq& s = seqs[b];
    if (key < s.cached || !s.tree()) return static_cast<std::int64_t>(key);
    return static_cast<std::int64_t>(s.cached) + s.depth(key - s.cached);
  }
};

// The step of the oracle tests: a chain after 13 keys, a decode token after
// 28, a star of 8 from position 0 (its token 5 also sees its sibling 4), a
// prefill chunk of 9 after 10, a binary tree of 15 after 21, the same tree
// reversed after 6 (its token 0, at depth 3, also sees token 13, at depth
// 1, which is no ancestor of it), and with `big` a tree of 70 after 5
// (tree_mask_words 2).
Step make_step(bool big) {
  Step s;
  s.seqs.push_back(tree_seq(13, {-1, 0, 1, 2, 3, 4}));
  s.seqs.push_back(plain_seq(28, 1));
  s.seqs.push_back(tree_seq(0, {-1, 0, 0, 0, 0, 0, 0, 0}));
  s.seqs.back().extra = {{5, 4}};
  s.seqs.push_back(plain_seq(10, 9));
  s.seqs.push_back(tree_seq(21, binary_tree(15, false)));
  s.seqs.push_back(tree_seq(6, binary_tree(15, true)));
  s.seqs.back().extra = {{0, 13}};
  if (big) s.seqs.push_back(tree_seq(5, random_tree(70, 7)));
  s.assign_pages(big ? 3 : 4);
  return s;
}

// A pool of zeros that append fills (int8: scales too).
template <class E>
struct Pool {
  Dims dims;
  std::vector<E> k, v;
  std::vector<float> k_scales, v_scales;
  ra::PagedCache<E> cache;

  explicit Pool(const Dims& x) : dims(x), k(kPages * kPageSize * x.hk * x.d), v(k.size()) {
    const bool scaled = rope::KvElement<E>::kScaled;
    if (scaled) {
      k_scales.assign(kPages * kPageSize * x.hk, 0.0f);
      v_scales.assign(k_scales.size(), 0.0f);
    }
    cache.k = ra::PagePool<E>::nhd(k.data(), kPages, kPageSize, x.hk, x.d, scaled ? k_scales.data() : nullptr);
    cache.v = ra::PagePool<E>::nhd(v.data(), kPages, kPageSize, x.hk, x.d, scaled ? v_scales.data() : nullptr);
  }
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  // Stored value c of (slot, head) of K or V, exactly.
  LD value(bool key, std::size_t slot, std::size_t h, std::size_t c) const {
    const ra::PagePool<E>& pool = key ? cache.k : cache.v;
    const LD x = static_cast<LD>(rope_test::widen(pool.row(slot, h)[c]));
    return pool.scales != nullptr ? x * static_cast<LD>(*pool.scale(slot, h)) : x;
  }
  // Every byte of the pools and scales, to compare and to put back.
  struct Bytes {
    std::vector<E> k, v;
    std::vector<float> ks, vs;
    bool operator==(const Bytes& o) const {
      return std::memcmp(k.data(), o.k.data(), k.size() * sizeof(E)) == 0 &&
             std::memcmp(v.data(), o.v.data(), v.size() * sizeof(E)) == 0 && ks == o.ks && vs == o.vs;
    }
  };
  Bytes save() const { return {k, v, k_scales, v_scales}; }
  void restore(const Bytes& b) {
    std::copy(b.k.begin(), b.k.end(), k.begin());
    std::copy(b.v.begin(), b.v.end(), v.begin());
    std::copy(b.ks.begin(), b.ks.end(), k_scales.begin());
    std::copy(b.vs.begin(), b.vs.end(), v_scales.begin());
  }
};

// The raw rows of a step (before any rotation): per sequence, every key's
// and value's rows (length x hk x d) and its new tokens' queries (fresh x hq
// x d).
struct Data {
  std::vector<std::vector<float>> k, v, q;
};

Data random_data(const Step& step, const Dims& dims, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal;
  Data data;
  for (const Seq& s : step.seqs) {
    for (auto* rows : {&data.k, &data.v}) {
      rows->emplace_back(s.length() * dims.hk * dims.d);
      for (float& x : rows->back()) x = normal(gen);
    }
    data.q.emplace_back(s.fresh * dims.hq * dims.d);
    for (float& x : data.q.back()) x = normal(gen);
  }
  return data;
}

struct Rows {
  std::vector<float> out, lse;
};

template <class T>
View<T> rows_of(std::vector<T>& x, std::size_t tokens, std::size_t heads, std::size_t d) {
  return View<T>::token_major(x.data(), tokens, heads, d);
}

// Writes every sequence's cached keys and values (positions 0 .. c - 1).
template <class E>
void fill_cache(Pool<E>& pool, const Step& step, const Data& data, const ra::AppendOptions& options) {
  const Dims& x = pool.dims;
  Step before;
  before.seqs = step.seqs;
  for (Seq& s : before.seqs) {
    s.fresh = s.cached;
    s.cached = 0;
    s.parent.clear();
  }
  before.finish();
  std::vector<float> k, v;
  for (std::size_t b = 0; b < step.seqs.size(); ++b) {
    const std::size_t n = step.seqs[b].cached * x.hk * x.d;
    k.insert(k.end(), data.k[b].begin(), data.k[b].begin() + static_cast<std::ptrdiff_t>(n));
    v.insert(v.end(), data.v[b].begin(), data.v[b].begin() + static_cast<std::ptrdiff_t>(n));
  }
  ra::Plan plan;
  ra::plan(plan, ra::Shape::of(pool.cache, x.hq), before.batch());
  const std::size_t T = before.tokens();
  ra::append(plan, pool.cache, rows_of(k, T, x.hk, x.d), rows_of(v, T, x.hk, x.d), options);
}

// The step's new tokens: q rotated in place by append into q, k and v
// written, then attend's rows and lse.
template <class E>
Rows run_step(Pool<E>& pool, const Step& step, const Data& data, const ra::AppendOptions& options,
              std::size_t kv_split = 0) {
  const Dims& x = pool.dims;
  std::vector<float> q, k, v;
  for (std::size_t b = 0; b < step.seqs.size(); ++b) {
    const Seq& s = step.seqs[b];
    const auto from = static_cast<std::ptrdiff_t>(s.cached * x.hk * x.d);
    q.insert(q.end(), data.q[b].begin(), data.q[b].end());
    k.insert(k.end(), data.k[b].begin() + from, data.k[b].end());
    v.insert(v.end(), data.v[b].begin() + from, data.v[b].end());
  }
  ra::Shape shape = ra::Shape::of(pool.cache, x.hq);
  if (kv_split > 0) shape.kv_split = kv_split;
  ra::Plan plan;
  ra::plan(plan, shape, step.batch());
  const std::size_t T = step.tokens();
  ra::append(plan, pool.cache, rows_of(q, T, x.hq, x.d), rows_of(k, T, x.hk, x.d), rows_of(v, T, x.hk, x.d),
             rows_of(q, T, x.hq, x.d), options);
  Rows r{std::vector<float>(T * x.hq * x.d), std::vector<float>(T * x.hq)};
  ra::attend(plan, pool.cache, rows_of(q, T, x.hq, x.d), rows_of(r.out, T, x.hq, x.d), {}, {}, r.lse.data());
  return r;
}

// The bound rho of the header comment on each channel of x rotated at
// position m in float from the table (0 past the rotated channels).
std::vector<LD> rotation_bound(const std::vector<LD>& x, const std::vector<double>& inv_freq, rope::Style style, LD m) {
  std::vector<LD> rho(x.size(), 0);
  const std::size_t r = 2 * inv_freq.size();
  for (std::size_t p = 0; p < inv_freq.size(); ++p) {
    const std::size_t a = style == rope::Style::rotate_half ? p : 2 * p;
    const std::size_t b = style == rope::Style::rotate_half ? p + r / 2 : 2 * p + 1;
    const LD angle = std::fabs(m) * static_cast<LD>(inv_freq[p]);
    const LD c = std::fabs(std::cos(angle)), s = std::fabs(std::sin(angle));
    const LD table = std::ldexp(LD(1), -51) * angle * (std::fabs(x[a]) + std::fabs(x[b]));
    const LD rel = 3 * kU * (1 + std::ldexp(1.0, -20));
    rho[a] = rel * (std::fabs(x[a]) * c + std::fabs(x[b]) * s) + table;
    rho[b] = rel * (std::fabs(x[b]) * c + std::fabs(x[a]) * s) + table;
  }
  return rho;
}

// The rounding of a float value (within `value` in magnitude) into the
// cache's type: bf16 2^-8 and f16 2^-11 of it (and half the f16 subnormals'
// spacing), int8 half its row's scale and the division's u (the code is
// nearbyint(fl(y / scale)), never clamped: |y / scale| <= 127 (1 + u)^2),
// fp8 as rope_test::fp8_rounding says.
template <class E>
LD stored_rounding(LD value, LD scale) {
  if (std::is_same<E, BFloat16>::value) return std::ldexp(value, -8);
  if (std::is_same<E, Float16>::value) return std::ldexp(value, -11) + std::ldexp(LD(1), -25);
  if (std::is_same<E, std::int8_t>::value) return scale / 2 + kU * value;
  if (rope_test::kFp8<E>) return rope_test::fp8_rounding<E>(value, scale);
  return 0;
}

std::vector<LD> head_row(const std::vector<float>& rows, std::size_t row, std::size_t h, std::size_t heads,
                         std::size_t d) {
  std::vector<LD> x(d);
  for (std::size_t c = 0; c < d; ++c) x[c] = static_cast<LD>(rows[(row * heads + h) * d + c]);
  return x;
}

// Checks every row of the step against the oracle of the header comment:
// keys rotated from the raw rows (f32) or read back from the pool.
template <class E>
void expect_oracle(const Pool<E>& pool, const Step& step, const Data& data, const Rows& got,
                   const std::vector<double>& inv_freq, const std::string& what) {
  const Dims& x = pool.dims;
  const bool from_raw = std::is_same<E, float>::value;
  const LD scale = 1 / std::sqrt(static_cast<LD>(x.d));
  const LD neg_inf = -std::numeric_limits<LD>::infinity();
  // Every key's exact row and its rotation bound, per sequence and head.
  std::vector<std::vector<std::vector<LD>>> keys(step.seqs.size()), key_rho(step.seqs.size()), vals(step.seqs.size());
  for (std::size_t b = 0; b < step.seqs.size(); ++b) {
    const Seq& s = step.seqs[b];
    for (std::size_t j = 0; j < s.length(); ++j) {
      for (std::size_t g = 0; g < x.hk; ++g) {
        const LD pos = static_cast<LD>(step.key_position(b, j));
        std::vector<LD> k(x.d), v(x.d), rho(x.d, 0);
        if (from_raw) {
          const std::vector<LD> raw = head_row(data.k[b], j, g, x.hk, x.d);
          k = at::rotate(raw, inv_freq, x.style, pos);
          rho = rotation_bound(raw, inv_freq, x.style, pos);
        } else {
          // The stored key, which must be append's rounding of the exact
          // rotation at the key's position (in the key's own slot).
          const std::vector<LD> raw = head_row(data.k[b], j, g, x.hk, x.d);
          const std::vector<LD> exact = at::rotate(raw, inv_freq, x.style, pos);
          const std::vector<LD> r = rotation_bound(raw, inv_freq, x.style, pos);
          const LD s_k = pool.cache.k.scales != nullptr ? static_cast<LD>(*pool.cache.k.scale(s.slot(j), g)) : LD(0);
          for (std::size_t c = 0; c < x.d; ++c) {
            k[c] = pool.value(true, s.slot(j), g, c);
            ASSERT_LE(std::fabs(k[c] - exact[c]), r[c] + stored_rounding<E>(std::fabs(exact[c]) + r[c], s_k))
                << what << ": sequence " << b << " key " << j << " head " << g << " channel " << c;
          }
        }
        for (std::size_t c = 0; c < x.d; ++c) v[c] = pool.value(false, s.slot(j), g, c);
        keys[b].push_back(k);
        key_rho[b].push_back(rho);
        vals[b].push_back(v);
      }
    }
  }
  double worst = 0;
  for (std::size_t t = 0; t < step.tokens(); ++t) {
    const std::size_t b = step.sequence_of(t), i = step.index_of(t);
    const Seq& s = step.seqs[b];
    const LD pos = static_cast<LD>(s.tree() ? static_cast<std::int64_t>(s.cached) + s.depth(i)
                                            : static_cast<std::int64_t>(s.cached + i));
    for (std::size_t h = 0; h < x.hq; ++h) {
      const std::size_t g = h / (x.hq / x.hk);
      const std::vector<LD> raw = head_row(data.q[b], i, h, x.hq, x.d);
      const std::vector<LD> q = at::rotate(raw, inv_freq, x.style, pos);
      const std::vector<LD> rho = rotation_bound(raw, inv_freq, x.style, pos);
      std::vector<LD> scores;
      at::Mat v;
      LD eps = 0, V = 0;
      for (std::size_t j = 0; j < s.length(); ++j) {
        if (!step.sees(t, j)) continue;
        const std::vector<LD>& k = keys[b][j * x.hk + g];
        const std::vector<LD>& rk = key_rho[b][j * x.hk + g];
        LD dot = 0, moved = 0, mag = 0;
        for (std::size_t c = 0; c < x.d; ++c) {
          dot += q[c] * k[c];
          moved += rho[c] * (std::fabs(k[c]) + rk[c]) + std::fabs(q[c]) * rk[c];
          mag += (std::fabs(q[c]) + rho[c]) * (std::fabs(k[c]) + rk[c]);
        }
        scores.push_back(scale * dot);
        eps =
            std::max(eps, scale * moved + static_cast<LD>(at::gamma_float(static_cast<double>(x.d + 3))) * scale * mag);
        v.push_back(vals[b][j * x.hk + g]);
        for (const LD y : v.back()) V = std::max(V, std::fabs(y));
      }
      const at::SoftmaxRow want = at::softmax_row(scores, v, x.d, neg_inf);
      const LD rounding = static_cast<LD>(at::gamma_float(2.0 * static_cast<double>(scores.size()) + 20));
      const LD tol = std::expm1(2 * eps) * V + rounding * V, tol_lse = eps + rounding;
      const std::size_t r = t * x.hq + h;
      for (std::size_t c = 0; c < x.d; ++c) {
        const LD err = std::fabs(static_cast<LD>(got.out[r * x.d + c]) - want.out[c]);
        ASSERT_LE(err, tol) << what << ": token " << t << " (sequence " << b << ", new token " << i << ") head " << h
                            << " channel " << c;
        worst = std::max(worst, static_cast<double>(err / tol));
      }
      ASSERT_LE(std::fabs(static_cast<LD>(got.lse[r]) - want.lse), tol_lse) << what << ": token " << t << " head " << h;
    }
  }
  ::testing::Test::RecordProperty("worst_over_bound_" + what, std::to_string(worst));
}

template <class E>
class TreeAttend : public ::testing::Test {};
struct CacheNames {
  template <class E>
  static std::string GetName(int) {
    return rope_test::element_name<E>();
  }
};
using CacheTypes = ::testing::Types<float, BFloat16, Float16, std::int8_t, rope::Float8E4M3, rope::Float8E5M2>;
TYPED_TEST_SUITE(TreeAttend, CacheTypes, CacheNames);

// Test 1: the literal mask bits, in one batch with a decode sequence and a
// prefill chunk whose rows are the plain step's bytes.
TYPED_TEST(TreeAttend, RowsWithinTheBoundOfTheLiteralMaskOracle) {
  using E = TypeParam;
  for (const Dims& dims : {kSmall, kShaped}) {
    for (const bool big : {false, true}) {
      const std::string what = std::string(rope_test::element_name<E>()) + (dims.d == 128 ? "_d128" : "_d16") +
                               (big ? "_two_words" : "_one_word");
      const Step step = make_step(big);
      ASSERT_EQ(step.words, big ? 2u : 1u);
      const Data data = random_data(step, dims, 11);
      const rope::Frequencies freqs = rope::frequencies(dims.d, 10000.0);
      const rope::Table<float> table(freqs, kTablePositions);
      ra::AppendOptions options;
      options.rotation = {&table, dims.style};
      Pool<E> pool(dims);
      fill_cache(pool, step, data, options);
      const Rows got = run_step(pool, step, data, options);
      expect_oracle(pool, step, data, got, freqs.inv_freq, what);
      // The plain sequences' rows: the bytes of the step without the trees.
      const Step plain = step.without_trees();
      Data plain_data;
      for (std::size_t b = 0; b < step.seqs.size(); ++b) {
        if (step.seqs[b].tree()) continue;
        plain_data.k.push_back(data.k[b]);
        plain_data.v.push_back(data.v[b]);
        plain_data.q.push_back(data.q[b]);
      }
      const Rows alone = run_step(pool, plain, plain_data, options);
      const std::size_t row = dims.hq * dims.d;
      std::size_t p = 0;  // plain's token
      for (std::size_t t = 0; t < step.tokens(); ++t) {
        if (step.seqs[step.sequence_of(t)].tree()) continue;
        EXPECT_EQ(std::memcmp(&got.out[t * row], &alone.out[p * row], row * sizeof(float)), 0)
            << what << " token " << t;
        EXPECT_EQ(std::memcmp(&got.lse[t * dims.hq], &alone.lse[p * dims.hq], dims.hq * sizeof(float)), 0) << what;
        ++p;
      }
      ASSERT_EQ(p, plain.tokens());
    }
  }
}

// Test 2: a tree token whose mask row is its chain of ancestors (token a at
// depth k for k = 0 .. depth, in index order) is, bit for bit, the last row
// of that chain appended as a plain causal chunk after the same cached
// pages (the cache put back before each chain: the chain's keys go where
// the tree's were); with kv_split above every cache, and with kv_split 8,
// where a chain of one token after more than 8 keys is a decode token split
// at kv_split, which a tree token never is (those two roots are left out).
TYPED_TEST(TreeAttend, EachTokenIsTheLastRowOfItsAncestorsChain) {
  using E = TypeParam;
  const std::pair<std::size_t, Dims> runs[] = {{0, kSmall}, {0, kShaped}, {8, kSmall}, {8, kShaped}};
  for (const auto& [split, dims] : runs) {
    const Step step = make_step(true);
    const Data data = random_data(step, dims, 21);
    const rope::Table<float> table(rope::frequencies(dims.d, 10000.0), kTablePositions);
    ra::AppendOptions options;
    options.rotation = {&table, dims.style};
    Pool<E> pool(dims);
    fill_cache(pool, step, data, options);
    const typename Pool<E>::Bytes cached = pool.save();
    const Rows got = run_step(pool, step, data, options, split);
    const std::size_t row = dims.hq * dims.d, kv_row = dims.hk * dims.d;
    std::size_t chains = 0, tree_tokens = 0, split_roots = 0;
    for (std::size_t t = 0; t < step.tokens(); ++t) {
      const std::size_t b = step.sequence_of(t), i = step.index_of(t);
      const Seq& s = step.seqs[b];
      if (!s.tree()) continue;
      ++tree_tokens;
      std::vector<std::size_t> chain;
      const std::vector<bool> bits = s.row(i);
      bool chain_shaped = true;
      for (std::size_t j = 0; j < s.fresh; ++j) {
        if (!bits[j]) continue;
        chain_shaped = chain_shaped && s.depth(j) == static_cast<std::int32_t>(chain.size());
        chain.push_back(j);
      }
      if (!chain_shaped || chain.back() != i) continue;
      ++chains;
      // A chain of one token is a decode token, whose keys are split at
      // kv_split and the parts merged; a tree token's keys never are.
      if (chain.size() == 1 && split > 0 && s.cached + 1 > split) {
        ++split_roots;
        continue;
      }
      Step one;
      one.seqs.push_back(plain_seq(s.cached, chain.size()));
      one.seqs.back().pages = s.pages;
      one.finish();
      Data d1;
      d1.k.emplace_back(data.k[b].begin(), data.k[b].begin() + static_cast<std::ptrdiff_t>(s.cached * kv_row));
      d1.v.emplace_back(data.v[b].begin(), data.v[b].begin() + static_cast<std::ptrdiff_t>(s.cached * kv_row));
      d1.q.emplace_back();
      for (const std::size_t a : chain) {
        const auto key = static_cast<std::ptrdiff_t>((s.cached + a) * kv_row);
        d1.k[0].insert(d1.k[0].end(), data.k[b].begin() + key,
                       data.k[b].begin() + key + static_cast<std::ptrdiff_t>(kv_row));
        d1.v[0].insert(d1.v[0].end(), data.v[b].begin() + key,
                       data.v[b].begin() + key + static_cast<std::ptrdiff_t>(kv_row));
        const auto qa = data.q[b].begin() + static_cast<std::ptrdiff_t>(a * row);
        d1.q[0].insert(d1.q[0].end(), qa, qa + static_cast<std::ptrdiff_t>(row));
      }
      pool.restore(cached);
      const Rows plain = run_step(pool, one, d1, options, split);
      const std::size_t last = chain.size() - 1;
      EXPECT_EQ(std::memcmp(&plain.out[last * row], &got.out[t * row], row * sizeof(float)), 0)
          << rope_test::element_name<E>() << " d " << dims.d << ": token " << t << " (sequence " << b << ", new token "
          << i << ", depth " << s.depth(i) << ")";
      EXPECT_EQ(std::memcmp(&plain.lse[last * dims.hq], &got.lse[t * dims.hq], dims.hq * sizeof(float)), 0)
          << "token " << t;
    }
    // All but the star's token 5 (it also sees a sibling) and the 14
    // tokens of the reversed tree whose ancestors come after them.
    EXPECT_EQ(chains, tree_tokens - 15);
    EXPECT_EQ(split_roots, split > 0 ? 2u : 0u);  // the chain's and the binary tree's roots
  }
}

// Test 3: positions c + depth, slots of key c + i, and each tree token's
// keys: the cached ones, then c + j for its bits j in order.
TEST(TreePlan, PositionsSlotsAndKeyLists) {
  const Step step = make_step(true);
  Pool<float> pool(kSmall);
  ra::Plan plan;
  ra::plan(plan, ra::Shape::of(pool.cache, kSmall.hq), step.batch());
  ASSERT_EQ(plan.tokens(), step.tokens());
  for (std::size_t t = 0; t < step.tokens(); ++t) {
    const std::size_t b = step.sequence_of(t), i = step.index_of(t);
    const Seq& s = step.seqs[b];
    const std::int64_t want =
        s.tree() ? static_cast<std::int64_t>(s.cached) + s.depth(i) : static_cast<std::int64_t>(s.cached + i);
    EXPECT_EQ(plan.position(t), want) << "token " << t;
    EXPECT_EQ(plan.positions()[t], want) << "token " << t;
    EXPECT_EQ(plan.slot(t), static_cast<std::int64_t>(s.slot(s.cached + i))) << "token " << t;
  }
  // Every token one item here (no decode token past kv_split), in token
  // order; a tree token's over its list.
  ASSERT_EQ(plan.items().size(), step.tokens());
  for (std::size_t t = 0; t < step.tokens(); ++t) {
    const ra::WorkItem& it = plan.items()[t];
    const std::size_t b = step.sequence_of(t);
    const Seq& s = step.seqs[b];
    EXPECT_EQ(it.token, t);
    EXPECT_EQ(it.sequence, b);
    if (!s.tree()) {
      EXPECT_EQ(it.key_list, nullptr);
      continue;
    }
    ASSERT_NE(it.key_list, nullptr) << "token " << t;
    std::vector<std::int32_t> want;
    for (std::size_t j = 0; j < s.length(); ++j) {
      if (step.sees(t, j)) want.push_back(static_cast<std::int32_t>(j));
    }
    const std::vector<std::int32_t> list(it.key_list + it.first_key, it.key_list + it.first_key + it.keys);
    EXPECT_EQ(list, want) << "token " << t;
  }
}

// Test 4: refusals. Each plan() refusal names the entry and its value; the
// plan it was given (one that had succeeded) then holds no plan: append and
// attend refuse it, writing nothing.
struct Refused {
  const char* what;
  void (*change)(Step&);
  std::string text;  // the whole message after "rope::attention::plan: "
};

std::size_t token_of(const Step& s, std::size_t b, std::size_t i) { return static_cast<std::size_t>(s.starts[b]) + i; }
void set_bit(Step& s, std::size_t t, std::size_t j, bool on) {
  std::uint64_t& w = s.masks[t * s.words + j / 64];
  const std::uint64_t bit = std::uint64_t{1} << (j % 64);
  w = on ? (w | bit) : (w & ~bit);
}

TEST(TreeRefusals, PlanNamesTheEntryAndLeavesNoPlan) {
  // make_step(true): sequence 0 the chain (tokens 0 .. 5), 1 the decode
  // token (6), 2 the star (7 .. 14), 3 the prefill (15 .. 23), 4 the binary
  // tree (24 .. 38), 5 reversed (39 .. 53), 6 the tree of 70 (54 .. 123).
  const std::vector<Refused> cases = {
      {"a depth of n", [](Step& s) { s.depths[token_of(s, 0, 2)] = 6; },
       "batch.tree_depths[2] must be a depth in [0, 6) (sequence 0 is a tree), got 6"},
      {"a depth below -1", [](Step& s) { s.depths[token_of(s, 4, 3)] = -2; },
       "batch.tree_depths[27] must be a depth in [0, 15) (sequence 4 is a tree), got -2"},
      {"a depth of -1 inside a tree", [](Step& s) { s.depths[token_of(s, 2, 3)] = -1; },
       "batch.tree_depths[10] must be a depth in [0, 8) (sequence 2 is a tree), got -1"},
      {"a token that does not see itself", [](Step& s) { set_bit(s, token_of(s, 4, 5), 5, false); },
       "batch.tree_masks[29] bit 5 must be set: a token sees itself, got 0"},
      {"a bit past the new tokens", [](Step& s) { set_bit(s, token_of(s, 0, 4), 6, true); },
       "batch.tree_masks[4] bit 6 must be clear: past the 6 new tokens, got 1"},
      {"a bit in the second word past the new tokens", [](Step& s) { set_bit(s, token_of(s, 4, 0), 64, true); },
       "batch.tree_masks[24] bit 64 must be clear: past the 15 new tokens, got 1"},
      {"a bit past the 70 tokens", [](Step& s) { set_bit(s, token_of(s, 6, 69), 70, true); },
       "batch.tree_masks[123] bit 70 must be clear: past the 70 new tokens, got 1"},
      {"a root that sees its child", [](Step& s) { set_bit(s, token_of(s, 2, 0), 3, true); },
       "batch.tree_masks[7] bit 3 must be clear: new token 10 is at depth 1, after token 7's 0, got 1"},
      {"a token that sees a deeper one past bit 63",
       [](Step& s) {
         // Token 10 of the tree of 70 sees its last token (depth > its own).
         s.depths[token_of(s, 6, 69)] = 60;
         set_bit(s, token_of(s, 6, 10), 69, true);
       },
       "batch.tree_masks[64] bit 69 must be clear: new token 123 is at depth 60"},
      {"a depth in a prefill chunk", [](Step& s) { s.depths[token_of(s, 3, 4)] = 3; },
       "batch.tree_depths[19] must be -1, as for every new token of sequence 3 (not a tree), got 3"},
      {"a depth of 5 for a decode token after -1s", [](Step& s) { s.depths[token_of(s, 1, 0)] = 5; },
       "batch.tree_depths[6] must be a depth in [0, 1) (sequence 1 is a tree), got 5"},
      {"null masks", [](Step& s) { s.masks.clear(); },
       "batch.tree_masks must be non-null when a sequence is a tree, got null"},
      {"one word for 70 tokens",
       [](Step& s) {
         // The rows re-laid at one word each (the first word of each).
         std::vector<std::uint64_t> one(s.tokens());
         for (std::size_t t = 0; t < s.tokens(); ++t) one[t] = s.masks[t * s.words];
         s.masks = one;
         s.words = 1;
       },
       "batch.tree_mask_words must be >= 2 (sequence 6's new tokens), got 1"},
  };
  const Dims dims = kSmall;
  Pool<BFloat16> pool(dims);
  const Step good = make_step(true);
  const Data data = random_data(good, dims, 31);
  const rope::Table<float> table(rope::frequencies(dims.d, 10000.0), kTablePositions);
  ra::AppendOptions options;
  options.rotation = {&table, dims.style};
  fill_cache(pool, good, data, options);
  const std::size_t T = good.tokens();
  std::vector<float> q = rope_test::random_vector<float>(T * dims.hq * dims.d, 32);
  std::vector<float> k = rope_test::random_vector<float>(T * dims.hk * dims.d, 33), v = k;
  std::vector<float> out(T * dims.hq * dims.d, -7.0f), lse(T * dims.hq, -7.0f);
  for (const Refused& c : cases) {
    Step step = good;
    c.change(step);
    ra::Batch batch = step.batch();
    if (step.masks.empty()) batch.tree_masks = nullptr;
    ra::Plan plan;
    ra::plan(plan, ra::Shape::of(pool.cache, dims.hq), good.batch());  // one that succeeds first
    const std::string msg =
        rope_test::thrown_message([&] { ra::plan(plan, ra::Shape::of(pool.cache, dims.hq), batch); });
    EXPECT_PRED_FORMAT2(::testing::IsSubstring, "rope::attention::plan: " + c.text, msg) << c.what;
    const auto before = pool.save();
    const std::vector<float> q0 = q, out0 = out, lse0 = lse;
    const std::string no_plan = "plan must be made by a rope::attention::plan() that succeeded, got no plan";
    const std::string a = rope_test::thrown_message([&] {
      ra::append(plan, pool.cache, rows_of(q, T, dims.hq, dims.d), rows_of(k, T, dims.hk, dims.d),
                 rows_of(v, T, dims.hk, dims.d), rows_of(q, T, dims.hq, dims.d), options);
    });
    EXPECT_PRED_FORMAT2(::testing::IsSubstring, "rope::attention::append: " + no_plan, a) << c.what;
    const std::string a_kv = rope_test::thrown_message(
        [&] { ra::append(plan, pool.cache, rows_of(k, T, dims.hk, dims.d), rows_of(v, T, dims.hk, dims.d), options); });
    EXPECT_PRED_FORMAT2(::testing::IsSubstring, "rope::attention::append: " + no_plan, a_kv) << c.what;
    const std::string b = rope_test::thrown_message([&] {
      ra::attend(plan, pool.cache, rows_of(q, T, dims.hq, dims.d), rows_of(out, T, dims.hq, dims.d), {}, {},
                 lse.data());
    });
    EXPECT_PRED_FORMAT2(::testing::IsSubstring, "rope::attention::attend: " + no_plan, b) << c.what;
    EXPECT_TRUE(pool.save() == before) << c.what << ": the cache was written";
    EXPECT_EQ(q, q0) << c.what;
    EXPECT_EQ(out, out0) << c.what;
    EXPECT_EQ(lse, lse0) << c.what;
  }
}

// A window or a sparse list with trees: refused by attend, which writes
// nothing; the same plan then attends as before.
TEST(TreeRefusals, AttendRefusesAWindowOrASparseListWithTrees) {
  const Dims dims = kSmall;
  Pool<std::int8_t> pool(dims);
  const Step step = make_step(false);
  const Data data = random_data(step, dims, 41);
  const rope::Table<float> table(rope::frequencies(dims.d, 10000.0), kTablePositions);
  ra::AppendOptions options;
  options.rotation = {&table, dims.style};
  fill_cache(pool, step, data, options);
  const Rows want = run_step(pool, step, data, options);
  ra::Plan plan;
  ra::plan(plan, ra::Shape::of(pool.cache, dims.hq), step.batch());
  const std::size_t T = step.tokens();
  std::vector<float> q = rope_test::random_vector<float>(T * dims.hq * dims.d, 42);
  std::vector<float> out(T * dims.hq * dims.d, -7.0f), lse(T * dims.hq, -7.0f);
  const auto before = pool.save();
  ra::Mask window;
  window.window = 8;
  std::vector<std::int32_t> indices(T, 0);
  ra::Mask sparse;
  sparse.indices = indices.data();
  sparse.topk = 1;
  const auto attend = [&](const ra::Mask& mask) {
    return rope_test::thrown_message([&] {
      ra::attend(plan, pool.cache, rows_of(q, T, dims.hq, dims.d), rows_of(out, T, dims.hq, dims.d), {}, mask,
                 lse.data());
    });
  };
  EXPECT_EQ(attend(window), "rope::attention::attend: mask.window must be 0 for a batch with tree sequences, got 8");
  EXPECT_EQ(attend(sparse),
            "rope::attention::attend: mask.indices must be null for a batch with tree sequences, got a list");
  EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](float x) { return x == -7.0f; }));
  EXPECT_TRUE(std::all_of(lse.begin(), lse.end(), [](float x) { return x == -7.0f; }));
  EXPECT_TRUE(pool.save() == before);
  // Without a tree in the batch, the same masks are taken.
  const Step plain = step.without_trees();
  ra::Plan p2;
  ra::plan(p2, ra::Shape::of(pool.cache, dims.hq), plain.batch());
  std::vector<float> q2(plain.tokens() * dims.hq * dims.d, 0.5f), out2(q2.size());
  std::vector<std::int32_t> first(plain.tokens(), 0);
  sparse.indices = first.data();
  for (const ra::Mask* mask : {&window, &sparse}) {
    EXPECT_NO_THROW(ra::attend(p2, pool.cache, rows_of(q2, plain.tokens(), dims.hq, dims.d),
                               rows_of(out2, plain.tokens(), dims.hq, dims.d), {}, *mask));
  }
  // The refused calls changed nothing the plan holds: the tree step attends
  // again to the same bytes.
  pool.restore(before);
  const Rows again = run_step(pool, step, data, options);
  EXPECT_EQ(again.out, want.out);
}

// append rotates a tree token at c + depth, so it checks that position
// against the table, not its sequence's length: a star of 5 after 20 keys
// (positions 20 and 21, length 25) is accepted with a table of 22
// positions; a chain of 5 (positions up to 24) is refused with a table of
// 24, naming the first token past it by its depth, writing nothing.
TEST(TreeRefusals, AppendChecksATreeTokensPositionNotItsLength) {
  const Dims dims = kSmall;
  Pool<float> pool(dims);
  for (const bool chain : {false, true}) {
    Step step;
    step.seqs.push_back(tree_seq(20, chain ? std::vector<int>{-1, 0, 1, 2, 3} : std::vector<int>{-1, 0, 0, 0, 0}));
    step.assign_pages(5);
    const rope::Table<float> table(rope::frequencies(dims.d, 10000.0), chain ? 24 : 22);
    ra::AppendOptions options;
    options.rotation = {&table, dims.style};
    ra::Plan plan;
    ra::plan(plan, ra::Shape::of(pool.cache, dims.hq), step.batch());
    std::vector<float> q = rope_test::random_vector<float>(5 * dims.hq * dims.d, 51);
    std::vector<float> k = rope_test::random_vector<float>(5 * dims.hk * dims.d, 52), v = k;
    const std::vector<float> q0 = q;
    const auto before = pool.save();
    const auto call = [&] {
      ra::append(plan, pool.cache, rows_of(q, 5, dims.hq, dims.d), rows_of(k, 5, dims.hk, dims.d),
                 rows_of(v, 5, dims.hk, dims.d), rows_of(q, 5, dims.hq, dims.d), options);
    };
    if (!chain) {
      EXPECT_NO_THROW(call());
      continue;
    }
    const std::string msg = rope_test::thrown_message(call);
    EXPECT_EQ(msg,
              "rope::attention::append: batch.tree_depths[4] must be < options.rotation.table->positions() - 20 = 4 "
              "(its position is 20 + depth), got 4");
    EXPECT_TRUE(pool.save() == before);
    EXPECT_EQ(q, q0);
  }
}

}  // namespace
