// Shared-prefix (cascade) decode (attention/cascade.hpp, cascade_attend.hpp):
//   - the levels plan() finds from the block tables: nested runs of shared
//     full pages, members the decode sequences that list them, prefill and
//     tree sequences and pages past a member's new token left out;
//   - attend with a cascade plan, and with a plain one, each within the
//     bound derived below of a long-double oracle over the stored values, and
//     the two within the sum of their bounds, for f32, bf16, f16 and int8
//     caches, with sinks, a softcap and the lse;
//   - rows of tokens that are no level's member are the plain plan's bytes;
//     a windowed or sparse mask takes the plain layout (the plain bytes);
//   - the same bytes for any thread count and executor;
//   - a NaN in one member's query or own keys reaches no other token's row.
//
// The bound. Over the stored values widened (int8: q times its scale, the
// real product), key j's exact score is s_j = scale * sum_c q_c k_jc. Each
// path computes it as a float dot product of d terms (any order of
// additions: within gamma_d sum_c |q_c k_jc|), times one or two rounded
// scale factors and, with a softcap, cap * tanh(s / cap) (1-Lipschitz, a few
// roundings of |cap|): |s'_j - s_j| <= eps_j with
//   eps_j = gamma_(d+3) |scale| sum_c |q_c k_jc| + 8 u cap.
// With eps = max_j eps_j the weights move by factors within exp(+-2 eps)
// (docs/attention.md), and the rest of the arithmetic rounds: each weight
// within 2 ulps of its exp (scores.hpp), int8's weight times its value
// scale once, the sums of n keys and of the parts merged in order (gamma_n
// each, relative to sum_j w_j |v_j| <= l max|v|), the final division:
//   |out' - out| <= (exp(2 eps) - 1) V + gamma_(2n + 4 parts + 16) V,
// V = max |v_j| over the keys the row sees. lse: |lse' - lse| <= eps +
// gamma_(2n + 4 parts + 16).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include <rope/attention.hpp>
#include <rope/attention/cascade_tiles.hpp>  // level_tiles_run, which a compiled attention library does not bring
#include <rope/kernels/kv_products.hpp>      // products_hardware_allowed, likewise

#include "attention_oracle.hpp"
#include "executors.hpp"
#include "kv_elements.hpp"

namespace {

namespace at = attention_test;
namespace ra = rope::attention;
using at::LD;
using rope::BFloat16;
using rope::Float16;

constexpr double kU = std::numeric_limits<float>::epsilon() / 2;
constexpr std::size_t kPageSize = 4, kPages = 128, kStride = 40;

// A pool of random rows of E (int8: random values and scales).
template <class E>
struct Pool {
  std::size_t q_heads, kv_heads, d;
  std::vector<E> k, v;
  std::vector<float> k_scales, v_scales;
  ra::PagedCache<E> cache;

  Pool(std::size_t hq, std::size_t hk, std::size_t dim, std::uint32_t seed)
      : q_heads(hq), kv_heads(hk), d(dim), k(kPages * kPageSize * hk * dim), v(k.size()) {
    std::mt19937 gen(seed);
    std::normal_distribution<float> normal;
    const bool scaled = rope::KvElement<E>::kScaled;
    for (auto* rows : {&k, &v}) {
      for (E& x : *rows) {
        if constexpr (std::is_same<E, std::int8_t>::value) {
          x = static_cast<std::int8_t>(std::lround(std::clamp(normal(gen) * 40.0f, -127.0f, 127.0f)));
        } else {
          x = E(normal(gen));
        }
      }
    }
    if (scaled) {
      k_scales.resize(kPages * kPageSize * hk);
      v_scales.resize(k_scales.size());
      for (auto* s : {&k_scales, &v_scales}) {
        for (float& x : *s) x = 0.02f + 0.01f * std::fabs(normal(gen));
      }
    }
    cache.k = ra::PagePool<E>::nhd(k.data(), kPages, kPageSize, hk, dim, scaled ? k_scales.data() : nullptr);
    cache.v = ra::PagePool<E>::nhd(v.data(), kPages, kPageSize, hk, dim, scaled ? v_scales.data() : nullptr);
  }
  // Stored value c of (slot, head) of K or V, exactly.
  LD value(bool key, std::size_t slot, std::size_t h, std::size_t c) const {
    const ra::PagePool<E>& pool = key ? cache.k : cache.v;
    const LD x = static_cast<LD>(rope::detail::widen_value(pool.row(slot, h)[c]));
    return pool.scales != nullptr ? x * static_cast<LD>(*pool.scale(slot, h)) : x;
  }
};

// The step: sequences 0 .. 5 and 8 decode and share pages 0 .. 9 (40 keys);
// 0, 1, 2 and 8 also pages 10 .. 12, and 0, 1, 2 page 13; 3 and 4 share
// pages 20, 21 after the first ten; 6 is a prefill of 3 tokens over pages
// 0 .. 9 as well; 7 decodes over pages of its own.
struct Step {
  std::vector<std::int64_t> lengths{61, 58, 70, 50, 49, 47, 45, 23, 55};
  std::vector<std::int32_t> table;
  std::vector<std::int64_t> starts{0};
  std::vector<std::int32_t> depths;  // set: sequence 5 is a tree of one token
  std::vector<std::uint64_t> masks;

  Step() {
    const std::size_t B = lengths.size();
    table.assign(B * kStride, -1);
    for (std::size_t b = 0; b < B; ++b) {
      for (std::size_t i = 0; i < 10 && b != 7; ++i) table[b * kStride + i] = static_cast<std::int32_t>(i);
      for (std::size_t i = 10; i < 14 && (b <= 2 || b == 8); ++i) table[b * kStride + i] = static_cast<std::int32_t>(i);
      for (std::size_t i = 10; i < 12 && (b == 3 || b == 4); ++i) {
        table[b * kStride + i] = static_cast<std::int32_t>(10 + i);
      }
    }
    table[8 * kStride + 13] = -1;  // 8 parts from 0, 1, 2 at page 13
    std::int32_t next = 30;
    for (std::size_t b = 0; b < B; ++b) {
      const std::size_t used = (static_cast<std::size_t>(lengths[b]) + kPageSize - 1) / kPageSize;
      for (std::size_t i = 0; i < kStride; ++i) {
        std::int32_t& id = table[b * kStride + i];
        if (id == -1) id = i < used ? next++ : 0;
      }
    }
    for (std::size_t b = 0; b < B; ++b) starts.push_back(starts.back() + (b == 6 ? 3 : 1));
  }
  std::size_t tokens() const { return static_cast<std::size_t>(starts.back()); }
  ra::Batch batch() const {
    ra::Batch b{starts.data(), lengths.data(), table.data(), kStride, lengths.size()};
    if (!depths.empty()) {
      b.tree_depths = depths.data();
      b.tree_masks = masks.data();
      b.tree_mask_words = 1;
    }
    return b;
  }
  // Sequence 5 verifies a tree of one token.
  void make_tree() {
    depths.assign(tokens(), -1);
    masks.assign(tokens(), 0);
    depths[static_cast<std::size_t>(starts[5])] = 0;
    masks[static_cast<std::size_t>(starts[5])] = 1;
  }
};

template <class E>
ra::Shape shape_of(const Pool<E>& pool, bool cascade, std::size_t split = 16) {
  ra::Shape s = ra::Shape::of(pool.cache, pool.q_heads);
  s.kv_split = split;
  s.cascade = cascade;
  return s;
}

std::vector<float> random_q(std::size_t n, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal;
  std::vector<float> q(n);
  for (float& x : q) x = normal(gen);
  return q;
}

struct Rows {
  std::vector<float> out, lse;
};

template <class E>
Rows attend_rows(const ra::Plan& plan, const Pool<E>& pool, const std::vector<float>& q, const ra::Logits& logits,
                 const ra::Mask& mask = {}) {
  const std::size_t T = plan.tokens();
  Rows r{std::vector<float>(T * pool.q_heads * pool.d), std::vector<float>(T * pool.q_heads)};
  ra::attend(plan, pool.cache, rope::View<const float>::token_major(q.data(), T, pool.q_heads, pool.d),
             rope::View<float>::token_major(r.out.data(), T, pool.q_heads, pool.d), logits, mask, r.lse.data());
  return r;
}

TEST(CascadeLevels, FoundFromTheBlockTables) {
  Pool<float> pool(4, 2, 8, 1);
  Step step;
  step.make_tree();
  ra::Plan plan;
  ra::plan(plan, shape_of(pool, true), step.batch());
  const ra::detail::WorkLayout* work = ra::detail::PlanAccess::cascade(plan);
  ASSERT_NE(work, nullptr);
  const auto& c = work->cascade;
  struct Want {
    std::size_t first, keys;
    std::set<std::size_t> members;  // sequences
    long parent;                    // index into want, or -1
  };
  // Sequence 5 is a tree and 6 a prefill: in no level. 8's shareable pages
  // end at 13 ((55 - 1) / 4), 0's at 15: page 13 is 0's, 1's and 2's only.
  const std::vector<Want> want = {
      {0, 40, {0, 1, 2, 3, 4, 8}, -1}, {40, 52 - 40, {0, 1, 2, 8}, 0}, {52, 4, {0, 1, 2}, 1}, {40, 8, {3, 4}, 0}};
  ASSERT_EQ(c.levels.size(), want.size());
  std::vector<long> found(want.size(), -1);
  for (std::size_t l = 0; l < c.levels.size(); ++l) {
    const ra::detail::Level& level = c.levels[l];
    std::set<std::size_t> members;
    for (std::size_t i = 0; i < level.members; ++i) members.insert(c.order[level.first_member + i]);
    for (std::size_t w = 0; w < want.size(); ++w) {
      if (want[w].first == level.first_key && want[w].keys == level.keys && want[w].members == members) found[w] = l;
    }
  }
  for (std::size_t w = 0; w < want.size(); ++w) {
    ASSERT_NE(found[w], -1) << "level " << w << " not found";
    const std::size_t parent = c.levels[static_cast<std::size_t>(found[w])].parent;
    if (want[w].parent < 0) {
      EXPECT_EQ(parent, ra::detail::Level::kNone);
    } else {
      EXPECT_EQ(static_cast<long>(parent), found[static_cast<std::size_t>(want[w].parent)]);
    }
  }
  // Each level's parts cover its keys, cut at multiples of kv_split.
  for (const ra::detail::Level& level : c.levels) {
    std::size_t k = level.first_key;
    for (std::size_t i = level.first_item; i < level.first_item + level.items; ++i) {
      EXPECT_EQ(c.items[i].first_key, k);
      k += c.items[i].keys;
      EXPECT_TRUE(k % 16 == 0 || k == level.first_key + level.keys);
    }
    EXPECT_EQ(k, level.first_key + level.keys);
  }
  // Without the opt-in, or with no pages shared, there is no cascade.
  ra::plan(plan, shape_of(pool, false), step.batch());
  EXPECT_EQ(ra::detail::PlanAccess::cascade(plan), nullptr);
  Step apart;
  for (std::size_t b = 0; b < apart.lengths.size(); ++b) {
    for (std::size_t i = 0; i < 2; ++i) apart.table[b * kStride + i] = static_cast<std::int32_t>(40 + 2 * b + i);
    apart.lengths[b] = 8;
  }
  apart.starts = {0};
  for (std::size_t b = 0; b < apart.lengths.size(); ++b) apart.starts.push_back(static_cast<std::int64_t>(b + 1));
  ra::plan(plan, shape_of(pool, true), apart.batch());
  EXPECT_EQ(ra::detail::PlanAccess::cascade(plan), nullptr);
}

// The bound of the header comment for token t's row of head h, and the
// oracle's row and lse.
template <class E>
void oracle_row(const Pool<E>& pool, const ra::Plan& plan, const Step& step, const std::vector<float>& q, std::size_t t,
                std::size_t h, double scale, double cap, const std::vector<double>& sinks, std::vector<LD>* out,
                LD* lse, double* tol_out, double* tol_lse, bool bf16 = false, std::size_t window = 0) {
  std::size_t b = 0;
  while (static_cast<std::size_t>(step.starts[b + 1]) <= t) ++b;
  const std::size_t n = static_cast<std::size_t>(plan.position(t)) + 1;  // causal: keys 0 .. position
  const std::size_t lo = window > 0 && n > window ? n - window : 0;      // and a window: the last `window`
  const std::size_t g = h / (pool.q_heads / pool.kv_heads), d = pool.d;
  std::vector<LD> s(n);
  at::Mat v(n, std::vector<LD>(d));
  double eps = 0, V = 0;
  for (std::size_t j = 0; j < n; ++j) {
    if (j < lo) {
      s[j] = -std::numeric_limits<LD>::infinity();
      continue;
    }
    const std::size_t slot =
        static_cast<std::size_t>(step.table[b * kStride + j / kPageSize]) * kPageSize + j % kPageSize;
    LD dot = 0, mag = 0, q_sum = 0, k_sum = 0;
    for (std::size_t c = 0; c < d; ++c) {
      const LD qc = static_cast<LD>(q[(t * pool.q_heads + h) * d + c]);
      const LD kc = pool.value(true, slot, g, c);
      dot += qc * kc;
      mag += std::fabs(qc * kc);
      q_sum += std::fabs(qc);
      k_sum += std::fabs(kc);
      v[j][c] = pool.value(false, slot, g, c);
      V = std::max(V, static_cast<double>(std::fabs(v[j][c])));
    }
    LD x = static_cast<LD>(scale) * dot;
    if (cap > 0) x = static_cast<LD>(cap) * std::tanh(x / static_cast<LD>(cap));
    s[j] = x;
    eps = std::max(
        eps, at::gamma_float(static_cast<double>(d + 3)) * std::fabs(scale) * static_cast<double>(mag) + 8 * kU * cap);
    if (bf16) {
      const double gm = at::gamma_float(static_cast<double>(d + 5)), tiny = std::ldexp(1.0, -126);
      eps = std::max(eps, std::fabs(scale) * ((std::ldexp(1.0, -8) * (1 + gm) + gm) * static_cast<double>(mag) +
                                              tiny * static_cast<double>(k_sum + q_sum) + (4.0 * d + 64) * tiny) +
                              8 * kU * cap);
    }
  }
  const LD sink = sinks.empty() ? -std::numeric_limits<LD>::infinity() : static_cast<LD>(sinks[h]);
  const at::SoftmaxRow row = at::softmax_row(s, v, d, sink);
  *out = row.out;
  *lse = row.lse;
  const double parts = static_cast<double>(n) / 16 + 2;
  const double rounding = at::gamma_float(2.0 * static_cast<double>(n) + 4 * parts + 16);
  // The bf16 mode's levels round their weights to bf16 (2^-8 relative,
  // those below 2^-126 to zero): the weighted mean moves by that of V.
  const double weights = bf16 ? std::ldexp(1.0, -8) + static_cast<double>(n) * std::ldexp(1.0, -126) : 0.0;
  *tol_out = std::expm1(2 * eps) * V + (rounding + weights) * V;
  *tol_lse = eps + rounding;
}

template <class E>
class AttendCascade : public ::testing::Test {};
using CacheTypes = ::testing::Types<float, BFloat16, Float16, std::int8_t, rope::Float8E4M3, rope::Float8E5M2>;
// A name generator, which clang's -Wpedantic asks of TYPED_TEST_SUITE.
struct CacheNames {
  template <class E>
  static std::string GetName(int) {
    return rope_test::element_name<E>();
  }
};
TYPED_TEST_SUITE(AttendCascade, CacheTypes, CacheNames);

TYPED_TEST(AttendCascade, WithinTheBoundOfTheOracleAndOfThePlainStep) {
  using E = TypeParam;
  for (const bool shaped : {false, true}) {
    // 4/2 heads of d 8, and 32/8 heads of d 128: the decode loop's
    // compiled shape beside the loops for any shape.
    const std::size_t hq = shaped ? 32 : 4, hk = shaped ? 8 : 2, d = shaped ? 128 : 8;
    Pool<E> pool(hq, hk, d, 11);
    Step step;
    const std::vector<float> q = random_q(step.tokens() * hq * d, 12);
    ra::Logits logits;
    logits.softcap = 20.0;
    for (std::size_t h = 0; h < hq; ++h) logits.sinks.push_back(h % 3 == 0 ? -1.5 : 0.25 * static_cast<double>(h));
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    ra::Plan plain, cascade;
    ra::plan(plain, shape_of(pool, false), step.batch());
    ra::plan(cascade, shape_of(pool, true), step.batch());
    const Rows p = attend_rows(plain, pool, q, logits), c = attend_rows(cascade, pool, q, logits);
    double worst = 0;  // the largest error of the cascade rows over their bound
    for (std::size_t t = 0; t < step.tokens(); ++t) {
      for (std::size_t h = 0; h < hq; ++h) {
        std::vector<LD> want;
        LD lse = 0;
        double tol = 0, tol_lse = 0;
        oracle_row(pool, plain, step, q, t, h, scale, 20.0, logits.sinks, &want, &lse, &tol, &tol_lse);
        const std::size_t r = t * hq + h;
        for (std::size_t x = 0; x < d; ++x) {
          const double e_c = std::fabs(static_cast<double>(c.out[r * d + x] - want[x]));
          const double e_p = std::fabs(static_cast<double>(p.out[r * d + x] - want[x]));
          ASSERT_LE(e_c, tol) << "cascade, token " << t << " head " << h << " channel " << x;
          ASSERT_LE(e_p, tol) << "plain, token " << t << " head " << h << " channel " << x;
          ASSERT_LE(std::fabs(c.out[r * d + x] - p.out[r * d + x]), 2 * tol);
          worst = std::max(worst, e_c / tol);
        }
        ASSERT_LE(std::fabs(static_cast<double>(c.lse[r] - lse)), tol_lse) << "token " << t << " head " << h;
        ASSERT_LE(std::fabs(static_cast<double>(p.lse[r] - lse)), tol_lse) << "token " << t << " head " << h;
      }
    }
    this->RecordProperty(shaped ? "worst_over_bound_shaped" : "worst_over_bound", std::to_string(worst));
  }
}

// Twenty sequences over one prefix: 80 rows of a head in one level part,
// past the widest register tile of kernels/level_gemm.hpp.
TYPED_TEST(AttendCascade, ManyMembersWithinTheBound) {
  using E = TypeParam;
  Pool<E> pool(8, 2, 64, 51);
  Step step;
  const std::size_t B = 20;
  step.lengths.assign(B, 0);
  step.table.assign(B * kStride, 0);
  step.starts = {0};
  for (std::size_t b = 0; b < B; ++b) {
    step.lengths[b] = static_cast<std::int64_t>(12 + 1 + b % 7);  // 3 shared pages, then 1 .. 7 keys of its own
    for (std::size_t i = 0; i < 3; ++i) step.table[b * kStride + i] = static_cast<std::int32_t>(i);
    for (std::size_t i = 3; i < 5; ++i) step.table[b * kStride + i] = static_cast<std::int32_t>(3 + 2 * b + (i - 3));
    step.starts.push_back(static_cast<std::int64_t>(b + 1));
  }
  const std::vector<float> q = random_q(B * 8 * 64, 52);
  ra::Plan plain, cascade;
  ra::plan(plain, shape_of(pool, false), step.batch());
  ra::plan(cascade, shape_of(pool, true), step.batch());
  ASSERT_NE(ra::detail::PlanAccess::cascade(cascade), nullptr);
  ASSERT_EQ(ra::detail::PlanAccess::cascade(cascade)->cascade.levels[0].members, B);
  const Rows p = attend_rows(plain, pool, q, {}), c = attend_rows(cascade, pool, q, {});
  for (std::size_t t = 0; t < B; ++t) {
    for (std::size_t h = 0; h < 8; ++h) {
      std::vector<LD> want;
      LD lse = 0;
      double tol = 0, tol_lse = 0;
      oracle_row(pool, plain, step, q, t, h, 1.0 / 8.0, 0.0, {}, &want, &lse, &tol, &tol_lse);
      for (std::size_t x = 0; x < 64; ++x) {
        ASSERT_LE(std::fabs(static_cast<double>(c.out[(t * 8 + h) * 64 + x] - want[x])), tol)
            << "token " << t << " head " << h << " channel " << x;
      }
      ASSERT_LE(std::fabs(static_cast<double>(c.lse[t * 8 + h] - lse)), tol_lse);
      ASSERT_LE(std::fabs(static_cast<double>(p.lse[t * 8 + h] - lse)), tol_lse);
    }
  }
}

TYPED_TEST(AttendCascade, OthersRowsAndOtherMasksAreThePlainBytes) {
  using E = TypeParam;
  Pool<E> pool(8, 2, 16, 21);
  Step step;
  step.make_tree();
  const std::vector<float> q = random_q(step.tokens() * 8 * 16, 22);
  ra::Plan plain, cascade;
  ra::plan(plain, shape_of(pool, false), step.batch());
  ra::plan(cascade, shape_of(pool, true), step.batch());
  const Rows p = attend_rows(plain, pool, q, {}), c = attend_rows(cascade, pool, q, {});
  // 5 (a tree), 6 (a prefill) and 7 (nothing shared) are in no level.
  const std::size_t row = 8 * 16;
  for (const std::size_t b : {5, 6, 7}) {
    for (auto t = static_cast<std::size_t>(step.starts[b]); t < static_cast<std::size_t>(step.starts[b + 1]); ++t) {
      EXPECT_EQ(std::memcmp(&c.out[t * row], &p.out[t * row], row * sizeof(float)), 0) << "sequence " << b;
    }
  }
  // A member's row is not the plain bytes (the sums are cut differently):
  // the cascade was taken.
  EXPECT_NE(std::memcmp(&c.out[0], &p.out[0], row * sizeof(float)), 0);
  // A window or a top-k list (neither goes with trees): the plain layout,
  // the plain bytes.
  step = Step();
  ra::plan(plain, shape_of(pool, false), step.batch());
  ra::plan(cascade, shape_of(pool, true), step.batch());
  ra::Mask window;
  window.window = 30;
  EXPECT_EQ(attend_rows(cascade, pool, q, {}, window).out, attend_rows(plain, pool, q, {}, window).out);
  std::vector<std::int32_t> indices(step.tokens() * 4, -1);
  for (std::size_t t = 0; t < step.tokens(); ++t) {
    for (std::size_t i = 0; i < 4; ++i) indices[t * 4 + i] = static_cast<std::int32_t>(3 * i);
  }
  ra::Mask sparse;
  sparse.indices = indices.data();
  sparse.topk = 4;
  EXPECT_EQ(attend_rows(cascade, pool, q, {}, sparse).out, attend_rows(plain, pool, q, {}, sparse).out);
}

TYPED_TEST(AttendCascade, SameBytesForAnyThreadsAndExecutor) {
  using E = TypeParam;
  Pool<E> pool(8, 2, 16, 31);
  Step step;
  const std::vector<float> q = random_q(step.tokens() * 8 * 16, 32);
  ra::Plan one;
  ra::plan(one, shape_of(pool, true, 8), step.batch(), 1);
  const Rows want = attend_rows(one, pool, q, {});
  rope_test::ThreadPool threads(3);
  for (const std::size_t n : {2, 3, 5}) {
    ra::Plan plan;
    ra::plan(plan, shape_of(pool, true, 8), step.batch(), n);
    const Rows got = attend_rows(plan, pool, q, {});
    EXPECT_EQ(got.out, want.out) << n << " threads";
    EXPECT_EQ(got.lse, want.lse) << n << " threads";
    ra::plan(plan, shape_of(pool, true, 8), step.batch(), rope::Threads(threads.executor(n)));
    EXPECT_EQ(attend_rows(plan, pool, q, {}).out, want.out) << "an executor of " << n << " workers";
  }
}

TYPED_TEST(AttendCascade, ANaNReachesNoOtherTokensRow) {
  using E = TypeParam;
  Pool<E> pool(8, 2, 16, 41);
  Step step;
  std::vector<float> q = random_q(step.tokens() * 8 * 16, 42);
  ra::Plan plan;
  ra::plan(plan, shape_of(pool, true), step.batch());
  const Rows clean = attend_rows(plan, pool, q, {});
  const std::size_t row = 8 * 16;
  const auto only = [&](const Rows& got, std::size_t token) {
    for (std::size_t t = 0; t < step.tokens(); ++t) {
      const bool same = std::memcmp(&got.out[t * row], &clean.out[t * row], row * sizeof(float)) == 0;
      if (t == token) {
        EXPECT_TRUE(std::isnan(got.out[t * row])) << "token " << t;
      } else {
        EXPECT_TRUE(same) << "token " << t << " changed";
      }
    }
  };
  // Sequence 1 (a member of three levels): a NaN in its query.
  const float was = q[1 * row + 3];
  q[1 * row + 3] = std::numeric_limits<float>::quiet_NaN();
  only(attend_rows(plan, pool, q, {}), 1);
  q[1 * row + 3] = was;
  // Sequence 2: a NaN in a key of its own page (past its levels).
  const std::size_t key = 60;  // 2's key 60, on its page 15
  const std::size_t slot =
      static_cast<std::size_t>(step.table[2 * kStride + key / kPageSize]) * kPageSize + key % kPageSize;
  E* k = pool.cache.k.row(slot, 0);
  const E saved = k[0];
  if constexpr (std::is_same<E, std::int8_t>::value) {
    *pool.cache.k.scale(slot, 0) = std::numeric_limits<float>::quiet_NaN();
  } else {
    k[0] = E(std::numeric_limits<float>::quiet_NaN());
  }
  const Rows got = attend_rows(plan, pool, q, {});
  for (std::size_t t = 0; t < step.tokens(); ++t) {
    const bool same = std::memcmp(&got.out[t * row], &clean.out[t * row], row * sizeof(float)) == 0;
    EXPECT_EQ(same, t != 2) << "token " << t;
  }
  k[0] = saved;
}

// The bf16 product mode (rope/products.hpp) with cascade levels: q rounded
// to bf16 in the levels and in the decode loop, and the levels' weights
// rounded to bf16 too; on AMX tiles where the CPU and the OS have them
// (tdpbf16ps, whose order of additions is not documented), else by float
// fma over the rounded values (and with products_hardware_allowed() false).
// Each within the bf16 mode's bound of the oracle (oracle_row: per score
//   eps_j = |scale| ((2^-8 (1 + g) + g) sum_c |q_c k_jc| + 2^-126 (sum_c
//   |k_jc| + sum_c |q_c|) + (4d + 64) 2^-126) + 8 u cap,
// g = gamma_(d+5): q's rounding, values flushed below 2^-126, d exact
// products summed in any order and the scale; the weights' rounding adds
// (2^-8 + n 2^-126) V), and the same bytes for any thread count.
// A step of B sequences over one prefix of `shared` pages, each with one to
// seven keys of its own on two pages: level parts past one block of keys
// (kLevelBlock), and rows past one pair of tiles where B G > 32.
Step one_prefix(std::size_t B, std::size_t shared) {
  Step step;
  step.lengths.assign(B, 0);
  step.table.assign(B * kStride, 0);
  step.starts = {0};
  for (std::size_t b = 0; b < B; ++b) {
    step.lengths[b] = static_cast<std::int64_t>(shared * kPageSize + 1 + b % 7);
    for (std::size_t i = 0; i < shared; ++i) step.table[b * kStride + i] = static_cast<std::int32_t>(i);
    for (std::size_t i = shared; i < shared + 2; ++i) {
      step.table[b * kStride + i] = static_cast<std::int32_t>(shared + 2 * b + (i - shared));
    }
    step.starts.push_back(static_cast<std::int64_t>(b + 1));
  }
  return step;
}

// Whether the bf16 mode's instructions run here (AMX tiles or vdpbf16ps):
// without them, turning them off runs the same path again.
bool bf16_hardware_here() {
  return ra::detail::level_tiles_run<xsimd::default_arch>() || rope::detail::avx512_bf16_runs<xsimd::default_arch>();
}

// One bf16-mode cascade step (or, cascade false, a plain step with a
// causal mask of `window` keys, 0: none) against the oracle within the
// mode's bound, with the hardware and without, and the same bytes for 2
// and 3 threads.
void check_bf16_step(const Pool<BFloat16>& pool, const Step& step, const std::string& what, bool cascade = true,
                     std::size_t window = 0) {
  const std::size_t hq = pool.q_heads, d = pool.d;
  const std::vector<float> q = random_q(step.tokens() * hq * d, 32);
  ra::Logits logits;
  logits.softcap = 20.0;
  for (std::size_t h = 0; h < hq; ++h) logits.sinks.push_back(h % 3 == 0 ? -1.5 : 0.25 * static_cast<double>(h));
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  ra::Shape shape = shape_of(pool, cascade, 256);
  shape.products = rope::Products::bf16;
  ra::Mask mask;
  mask.window = window;
  ra::Plan plain, tested;
  ra::plan(plain, shape_of(pool, false), step.batch());
  ra::plan(tested, shape, step.batch());
  if (cascade) {
    ASSERT_NE(ra::detail::PlanAccess::cascade(tested), nullptr) << what;
  }
  // The oracle's rows, once for both runs.
  const std::size_t rows = step.tokens() * hq;
  std::vector<std::vector<LD>> want(rows);
  std::vector<LD> want_lse(rows, 0);
  std::vector<double> tol(rows, 0), tol_lse(rows, 0);
  for (std::size_t t = 0; t < step.tokens(); ++t) {
    for (std::size_t h = 0; h < hq; ++h) {
      const std::size_t r = t * hq + h;
      oracle_row(pool, plain, step, q, t, h, scale, 20.0, logits.sinks, &want[r], &want_lse[r], &tol[r], &tol_lse[r],
                 true, window);
    }
  }
  for (const bool hardware : {true, false}) {
    if (!hardware && !bf16_hardware_here()) continue;  // the same path twice
    rope::detail::products_hardware_allowed() = hardware;
    const Rows c = attend_rows(tested, pool, q, logits, mask);
    const std::string how = what + (hardware ? "" : ", without the hardware");
    double worst = 0;
    for (std::size_t r = 0; r < rows; ++r) {
      const std::size_t t = r / hq, h = r % hq;
      for (std::size_t x = 0; x < d; ++x) {
        const double e = std::fabs(static_cast<double>(c.out[r * d + x] - want[r][x]));
        ASSERT_LE(e, tol[r]) << how << ": token " << t << " head " << h << " channel " << x;
        worst = std::max(worst, e / tol[r]);
      }
      ASSERT_LE(std::fabs(static_cast<double>(c.lse[r] - want_lse[r])), tol_lse[r])
          << how << ": token " << t << " head " << h;
    }
    std::cout << "[ tiles ] " << how << ": largest error " << worst << " of the bound\n";
    for (const std::size_t threads : {2, 3}) {
      ra::Plan more;
      ra::plan(more, shape, step.batch(), threads);
      const Rows m = attend_rows(more, pool, q, logits, mask);
      EXPECT_EQ(std::memcmp(m.out.data(), c.out.data(), c.out.size() * sizeof(float)), 0)
          << how << ", " << threads << " threads";
    }
  }
  rope::detail::products_hardware_allowed() = true;
}

TEST(AttendCascadeBf16, OnTilesAndWithoutWithinTheModesBound) {
  std::cout << "[ tiles ] cascade levels on AMX tiles here: "
            << (ra::detail::level_tiles_run<xsimd::default_arch>() ? "yes" : "no") << "\n";
  for (const std::size_t d : {128, 8, 80}) {
    const std::size_t hq = d == 128 ? 32 : 4, hk = d == 128 ? 8 : 2;
    const Pool<BFloat16> pool(hq, hk, d, 31);
    check_bf16_step(pool, Step(), "nested levels, d " + std::to_string(d));
    check_bf16_step(pool, one_prefix(9, 18), "9 sequences over 72 keys, d " + std::to_string(d));
  }
}

// A prompt's tokens in the bf16 mode: on AMX tiles where they run, in
// blocks of kTileBlockRows query rows over the keys the block's tokens
// see, each row masked to its own (attend.hpp, cascade_tiles.hpp); the
// weights rounded to bf16 there as a level's are. Within the levels'
// bound of the oracle, with the tiles and without (the decode loop, whose
// bound is tighter), causal and with a window, and the same bytes for any
// thread count. A step of a 150-token prompt (blocks of 32 and 64 tokens,
// keys past one block of kTileBlockKeys), a decode token and a chunk of 21
// tokens after 44 cached keys.
Step prompt_step() {
  Step step;
  step.lengths = {150, 30, 65};
  step.starts = {0, 150, 151, 172};
  step.table.assign(3 * kStride, 0);
  std::int32_t next = 0;
  for (std::size_t b = 0; b < 3; ++b) {
    const std::size_t used = (static_cast<std::size_t>(step.lengths[b]) + kPageSize - 1) / kPageSize;
    for (std::size_t i = 0; i < used; ++i) step.table[b * kStride + i] = next++;
  }
  return step;
}

TEST(AttendPromptTiles, WithinTheModesBoundCausalAndWindowed) {
  std::cout << "[ tiles ] a prompt's tokens on AMX tiles here: "
            << (ra::detail::level_tiles_run<xsimd::default_arch>() ? "yes" : "no") << "\n";
  for (const std::size_t d : {128, 8, 80}) {
    const std::size_t hq = d == 128 ? 32 : 4, hk = d == 128 ? 8 : 2;
    const Pool<BFloat16> pool(hq, hk, d, 51);
    check_bf16_step(pool, prompt_step(), "a prompt, d " + std::to_string(d), false);
    check_bf16_step(pool, prompt_step(), "a prompt, a window of 24, d " + std::to_string(d), false, 24);
  }
}

// A NaN in the value of prompt token 40 (of sequence 0's 150) reaches the
// rows of the tokens that see it (40 on) and no other's: the tiles' zero
// weight times NaN is kept out of the rows that do not see it.
TEST(AttendPromptTiles, ANaNValueReachesOnlyTheTokensThatSeeIt) {
  Pool<BFloat16> pool(32, 8, 128, 52);
  const Step step = prompt_step();
  ra::Shape shape = shape_of(pool, false, 256);
  shape.products = rope::Products::bf16;
  ra::Plan plan;
  ra::plan(plan, shape, step.batch());
  const std::vector<float> q = random_q(step.tokens() * 32 * 128, 53);
  const Rows clean = attend_rows(plan, pool, q, {});
  const std::size_t key = 40,
                    slot = static_cast<std::size_t>(step.table[key / kPageSize]) * kPageSize + key % kPageSize;
  BFloat16* v = pool.cache.v.row(slot, 5);
  const BFloat16 saved = v[7];
  v[7] = BFloat16(std::numeric_limits<float>::quiet_NaN());
  const Rows got = attend_rows(plan, pool, q, {});
  v[7] = saved;
  const std::size_t row = 32 * 128;
  for (std::size_t t = 0; t < step.tokens(); ++t) {
    const bool sees = t >= key && t < 150;
    for (std::size_t h = 0; h < 32; ++h) {
      const float* a = &got.out[t * row + h * 128];
      const float* b = &clean.out[t * row + h * 128];
      if (sees && h / 4 == 5) {
        EXPECT_TRUE(std::isnan(a[7])) << "token " << t << " head " << h;
      } else {
        EXPECT_EQ(std::memcmp(a, b, 128 * sizeof(float)), 0) << "token " << t << " head " << h << " changed";
      }
    }
  }
}

}  // namespace
