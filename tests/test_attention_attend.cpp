// Softmax attention of a step's new tokens over a paged KV cache, as its
// plan lays it out (attention/attend.hpp, plan.hpp, cache.hpp), against a
// long-double oracle of the header's math and against itself:
//   - f32 cache vs the oracle (causal by position, window, GQA, softcap,
//     sinks, scale, kv_split, kv_splits that do not divide the lengths)
//     within a bound derived from the rounding of the scores and of the
//     sums (oracle() below); the log-sum-exp against the oracle's, with and
//     without sinks;
//   - paged = contiguous (one page per sequence, and PagedCache::contiguous
//     with the one-sequence plan) = HND, bit for bit; a batch = one call per
//     sequence, bit for bit; any thread count, executor or reused plan =
//     threads 1, bit for bit;
//   - bf16 / f16 / int8 caches: within the bound of rounding K and V once of
//     the f32 cache of the original values, and against the f32 cache of
//     their widened values within the bound of the decode loop's different
//     order of the products (QuantizedCaches* below: they are not that
//     cache's bytes);
//   - append then attend (the fused step) = append of K/V, Q rotated by
//     rope::apply at the plan's positions, then attend, bit for bit, and
//     the oracle of the relative scores;
//   - sinks, NaN and Inf confined to the queries that see them, a sequence
//     without new tokens never read, and the refusals (nothing written).
// Slots a sequence does not own hold NaN in every test, so a read outside a
// sequence's keys would show. The fixture (values, caches, plan + attend)
// is attend_fixture.hpp; bf16 and f16 queries and outputs on every built
// architecture are test_attention_attend_archs.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include <rope/attention.hpp>
#include <rope/frequencies.hpp>
#include <rope/kernels/kv_decode.hpp>  // kAttendMaxChunk, which a compiled attention library does not bring
#include <rope/table.hpp>

#include "archs.hpp"
#include "attend_fixture.hpp"
#include "attention_oracle.hpp"
#include "executors.hpp"
#include "kv_elements.hpp"
#include "support.hpp"

namespace {

using namespace attend_test;
namespace at = attention_test;
using at::LD;

// The visible keys [lo, hi) of query position p in a sequence of `length`
// keys, from masks.hpp's rule.
void visible(std::int64_t p, std::int64_t length, const Mask& m, std::int64_t* lo, std::int64_t* hi) {
  *hi = m.causal ? std::min(length, p + 1) : length;
  *lo = m.window > 0 ? std::max<std::int64_t>(0, p - static_cast<std::int64_t>(m.window) + 1) : 0;
}

struct Rope {
  const std::vector<double>* inv_freq = nullptr;  // set: Q rotated at p and K at j
  rope::Style style = rope::Style::rotate_half;
};

LD scale_of(const Options& o, std::size_t d) {
  return o.logits.scale ? static_cast<LD>(static_cast<float>(*o.logits.scale)) : 1.0L / std::sqrt(static_cast<LD>(d));
}
LD sink_of(const Options& o, std::size_t h) {
  return o.logits.sinks.empty() ? -std::numeric_limits<LD>::infinity()
                                : static_cast<LD>(static_cast<float>(o.logits.sinks[h]));
}

// The exact scores of token t, query head h over the keys it sees
// [lo, hi): raw (scale q . k), capped (what the softmax takes), and
// mag = scale sum_c |q_c k_c|, the magnitude every rounding of the dot
// product is relative to.
struct Scores {
  std::int64_t lo = 0, hi = 0;
  std::vector<LD> raw, s, mag;
};

Scores scores_of(const Values& x, const Options& o, std::size_t t, std::size_t h, Rope rot = {}) {
  const Dims& dims = x.dims;
  const std::size_t b = x.sequence_of(t), g = h / (dims.q_heads / dims.kv_heads);
  const std::int64_t p = x.position_of(t);
  Scores r;
  visible(p, x.lengths[b], o.mask, &r.lo, &r.hi);
  const LD scale = scale_of(o, dims.d);
  const LD cap = o.logits.softcap ? static_cast<LD>(static_cast<float>(*o.logits.softcap)) : 0;
  std::vector<LD> q(x.q_row(t, h), x.q_row(t, h) + dims.d);
  if (rot.inv_freq != nullptr) q = at::rotate(q, *rot.inv_freq, rot.style, static_cast<LD>(p));
  for (std::int64_t j = r.lo; j < r.hi; ++j) {
    const float* kr = x.k_row(b, static_cast<std::size_t>(j), g);
    std::vector<LD> k(kr, kr + dims.d);
    if (rot.inv_freq != nullptr) k = at::rotate(k, *rot.inv_freq, rot.style, static_cast<LD>(j));
    LD dot = 0, mag = 0;
    for (std::size_t c = 0; c < dims.d; ++c) dot += q[c] * k[c], mag += std::fabs(q[c] * k[c]);
    r.raw.push_back(scale * dot);
    r.s.push_back(cap > 0 ? cap * std::tanh(scale * dot / cap) : scale * dot);
    r.mag.push_back(scale * mag);
  }
  return r;
}

// Rows of V of token t's sequence seen by head h: [lo, hi).
at::Mat values_of(const Values& x, std::size_t t, std::size_t h, std::int64_t lo, std::int64_t hi) {
  const std::size_t b = x.sequence_of(t), g = h / (x.dims.q_heads / x.dims.kv_heads);
  at::Mat v;
  for (std::int64_t j = lo; j < hi; ++j) {
    const float* r = x.v_row(b, static_cast<std::size_t>(j), g);
    v.emplace_back(r, r + x.dims.dv);
  }
  return v;
}

// The oracle's output and log-sum-exp and, per (token, head), the bounds on
// a float evaluation's errors. Rounding of a float evaluation:
//   score j: d products summed (d eps sum |q k|), times the scale, capped
//     (a few ulps of the cap), Q and K rotated in float (4 eps each on
//     sum |q k|): e_j = scale (d + 8) eps sum_c |q_c k_jc| + 2 eps |s_j|,
//     with a softcap e_j sech^2((|s_j| - e_j) / cap) + 8 eps cap; eps_s = max_j e_j;
//   each weight exp(s_j - M) then has a relative error <= eps_s + 4 eps (exp)
//     + eps |s_j - M| / 2, and the running max rescales once per chunk or
//     part (3 eps each); the weighted sum and the denominator add n terms
//     (n eps each); the division and the sink's factor round twice.
//   A weighted mean whose weights are off by a factor in [1 - a, 1 + a]
//   moves by at most 2a max |v|, so
//   |out - exact| <= max_j |v_j| (2 eps_s + (3 n + 6 parts + 30) eps).
//   The log-sum-exp moves by at most eps_s with the scores (it is 1-Lipschitz
//   in their largest change), by the relative error of the denominator
//   ((n + 6 parts + 10) eps) through the log, and by its last two roundings
//   (2 eps |lse|).
struct Expected {
  std::vector<LD> out;            // [tokens, q_heads, dv]
  std::vector<LD> lse;            // [tokens, q_heads]
  std::vector<double> bound;      // [tokens, q_heads]
  std::vector<double> lse_bound;  // [tokens, q_heads]
  std::vector<double> eps_s;      // [tokens, q_heads]: the score error part alone
  std::vector<double> max_v;      // [tokens, q_heads]: max |v| over the visible keys
};

Expected oracle(const Values& x, const Options& o, Rope rot = {}) {
  const Dims& s = x.dims;
  const LD cap = o.logits.softcap ? static_cast<LD>(static_cast<float>(*o.logits.softcap)) : 0;
  Expected e;
  e.out.assign(x.tokens * s.q_heads * s.dv, 0);
  e.lse.assign(x.tokens * s.q_heads, -std::numeric_limits<LD>::infinity());
  e.bound.assign(x.tokens * s.q_heads, 0);
  e.lse_bound.assign(x.tokens * s.q_heads, 0);
  e.eps_s.assign(x.tokens * s.q_heads, 0);
  e.max_v.assign(x.tokens * s.q_heads, 0);
  for (std::size_t t = 0; t < x.tokens; ++t) {
    for (std::size_t h = 0; h < s.q_heads; ++h) {
      const Scores sc = scores_of(x, o, t, h, rot);
      const at::Mat v = values_of(x, t, h, sc.lo, sc.hi);
      const std::size_t th = t * s.q_heads + h;
      const LD sink = sink_of(o, h);
      const at::SoftmaxRow row = at::softmax_row(sc.s, v, s.dv, sink);
      e.lse[th] = row.lse;
      if (sc.s.empty()) continue;
      LD eps_s = 0, max_v = 0;
      for (std::size_t j = 0; j < sc.s.size(); ++j) {
        LD err = (s.d + 8) * kEps * sc.mag[j] + 2 * kEps * std::fabs(sc.raw[j]);
        if (cap > 0) {
          // The cap contracts an error by its slope sech^2 (mean value
          // theorem over [|s| - err, |s| + err]), then rounds (8 eps cap).
          const LD a = std::max<LD>(0, std::fabs(sc.raw[j]) - err) / cap;
          err = err / (std::cosh(a) * std::cosh(a)) + 8 * kEps * cap;
        }
        eps_s = std::max(eps_s, err);
        for (std::size_t c = 0; c < s.dv; ++c) max_v = std::max(max_v, std::fabs(v[j][c]));
      }
      for (std::size_t c = 0; c < s.dv; ++c) e.out[th * s.dv + c] = row.out[c];
      const double keys = static_cast<double>(sc.s.size());
      const double parts = keys / static_cast<double>(o.kv_split) + 2;
      e.eps_s[th] = static_cast<double>(eps_s);
      e.max_v[th] = static_cast<double>(max_v);
      e.bound[th] = static_cast<double>(max_v) * (2 * static_cast<double>(eps_s) + (3 * keys + 6 * parts + 30) * kEps);
      e.lse_bound[th] = static_cast<double>(eps_s) + (keys + 6 * parts + 10) * kEps +
                        2 * kEps * static_cast<double>(std::fabs(row.lse));
    }
  }
  return e;
}

// Every element of got within the oracle's bound; returns the largest error
// relative to its bound.
double expect_near_oracle(const std::vector<float>& got, const Expected& want, const Values& x,
                          const std::string& what) {
  const std::size_t dv = x.dims.dv;
  double worst = 0;
  int reported = 0;
  for (std::size_t th = 0; th < want.bound.size(); ++th) {
    for (std::size_t c = 0; c < dv; ++c) {
      const double err = std::fabs(static_cast<double>(got[th * dv + c]) - static_cast<double>(want.out[th * dv + c]));
      worst = std::max(worst, err / std::max(want.bound[th], 1e-300));
      if (!(err <= want.bound[th]) && reported++ < 5) {
        ADD_FAILURE() << what << ": token " << th / x.dims.q_heads << " head " << th % x.dims.q_heads << " channel "
                      << c << ": got " << got[th * dv + c] << " want " << static_cast<double>(want.out[th * dv + c])
                      << " error " << err << " bound " << want.bound[th];
      }
    }
  }
  return worst;
}

std::vector<std::pair<std::string, Options>> option_cases() {
  std::vector<std::pair<std::string, Options>> cases;
  Options o;
  cases.emplace_back("default (causal)", o);
  o.mask.causal = false;
  cases.emplace_back("not causal", o);
  o = {};
  o.mask.window = 7;
  cases.emplace_back("window 7", o);
  o.mask.causal = false;
  o.mask.window = 5;
  cases.emplace_back("window 5 not causal", o);
  o = {};
  o.logits.scale = 3.0;
  o.logits.softcap = 2.0;  // order matters: cap tanh(scale s / cap), not scale cap tanh(s / cap)
  cases.emplace_back("scale 3 softcap 2", o);
  o.logits.sinks = {0.5, -kInf, 5.0, -2.0};  // a sink above the cap stays uncapped
  cases.emplace_back("softcap and sinks", o);
  o = {};
  o.kv_split = 5;
  o.logits.scale = 0.37;
  cases.emplace_back("split 5 scale 0.37", o);
  o = {};
  o.kv_split = 1;
  o.mask.window = 9;
  o.logits.sinks = {-1.0, 0.0, 1.0, 2.0};
  cases.emplace_back("split 1 window 9 sinks", o);
  return cases;
}

TEST(AttentionAttend, F32CacheMatchesLongDoubleOracle) {
  for (const Dims& dims : {mixed_dims(), Dims{3, 1, 128, 64, 16, {{1, 50}, {9, 20}, {4, 33}}},
                           Dims{2, 2, 5, 3, 3, {{1, 11}, {6, 6}, {2, 8}}}}) {
    const Values x = make_values(dims, 100);
    const Cache<float> c = build<float>(x, Layout::nhd);
    for (auto [name, o] : option_cases()) {
      if (!o.logits.sinks.empty()) o.logits.sinks.resize(dims.q_heads, 0.25);
      const auto got = run(x, c, o);
      const Expected want = oracle(x, o);
      const double worst = expect_near_oracle(got, want, x, name + " d " + std::to_string(dims.d));
      EXPECT_LE(worst, 1.0) << name;
      if (std::getenv("ROPE_TEST_VERBOSE") != nullptr) std::cout << name << " worst error / bound " << worst << "\n";
      // The worst-case bound stays below 2e-3 of max |v| at scales <= 1 (d = 128,
      // split 5); at scale 3 it is looser. Observed errors are below 1% of it.
      for (std::size_t th = 0; th < want.bound.size(); ++th) {
        if (want.max_v[th] > 0 && (!o.logits.scale || *o.logits.scale <= 1)) {
          ASSERT_LE(want.bound[th] / want.max_v[th], 2e-3) << name;
        }
      }
    }
  }
}

// lse: the natural log-sum-exp of each row's scaled, capped scores and its
// sink, against the oracle's, within the bound oracle() derives; every row
// written (the pattern gone), and a sink of -inf is no sink in lse too.
TEST(AttentionAttend, LogSumExpMatchesTheOracle) {
  for (const Dims& dims : {mixed_dims(), Dims{8, 2, 128, 128, 16, {{1, 300}, {7, 40}, {1, 65}}}}) {
    const Values x = make_values(dims, 150);
    const Cache<float> c = build<float>(x, Layout::nhd);
    for (auto [name, o] : option_cases()) {
      if (!o.logits.sinks.empty()) o.logits.sinks.resize(dims.q_heads, -kInf);
      std::vector<float> lse;
      run(x, c, o, &lse);
      const Expected want = oracle(x, o);
      double worst = 0;
      for (std::size_t th = 0; th < lse.size(); ++th) {
        const double err = std::fabs(static_cast<double>(lse[th]) - static_cast<double>(want.lse[th]));
        worst = std::max(worst, err / want.lse_bound[th]);
        ASSERT_LE(err, want.lse_bound[th])
            << name << " d " << dims.d << " token " << th / dims.q_heads << " head " << th % dims.q_heads << ": got "
            << lse[th] << " want " << static_cast<double>(want.lse[th]);
      }
      if (std::getenv("ROPE_TEST_VERBOSE") != nullptr)
        std::cout << name << " lse worst error / bound " << worst << "\n";
    }
  }
}

// The cache holds keys rotated at their positions (append of K/V with a
// table, every key a new token of a plan of the whole cache); Q is rotated
// by the caller at the step plan's positions: the scores are q_p . R_(j - p) k_j.
TEST(AttentionAttend, RotationMatchesOracleOfRelativeScores) {
  const Dims dims = mixed_dims();
  const Values x = make_values(dims, 200);
  const auto freqs = rope::frequencies(16, 10000.0);  // partial rotary: 16 of 24 channels
  const rope::Table<float> table(freqs, 128);
  for (const rope::Style style : {rope::Style::rotate_half, rope::Style::block_diagonal}) {
    Cache<float> c = build<float>(x, Layout::nhd);
    std::fill(c.kd.begin(), c.kd.end(), kNaN);
    // Every key of every sequence as a new token: a plan of the whole cache.
    std::vector<std::int64_t> fill_starts = {0};
    std::vector<float> k_all, v_all;
    for (std::size_t b = 0; b < dims.seqs.size(); ++b) {
      fill_starts.push_back(fill_starts.back() + x.lengths[b]);
      k_all.insert(k_all.end(), x.k[b].begin(), x.k[b].end());
      v_all.insert(v_all.end(), x.v[b].begin(), x.v[b].end());
    }
    const std::size_t all = static_cast<std::size_t>(fill_starts.back());
    Plan fill;
    Batch fb = c.batch();
    fb.q_starts = fill_starts.data();
    ra::plan(fill, c.shape(dims.q_heads, 512), fb);
    ra::AppendOptions w;
    w.rotation = {&table, style};
    ra::append(fill, c.cache, View<const float>::token_major(k_all.data(), all, dims.kv_heads, dims.d),
               View<const float>::token_major(v_all.data(), all, dims.kv_heads, dims.dv), w);
    Options o;
    o.mask.window = 20;
    Plan step;
    ra::plan(step, c.shape(dims.q_heads, o.kv_split), c.batch());
    std::vector<float> q = x.q;
    rope::apply(View<float>::token_major(q.data(), x.tokens, dims.q_heads, dims.d), table, style,
                rope::Positions(step.positions()));
    std::vector<float> got(x.tokens * dims.q_heads * dims.dv);
    ra::attend(step, c.cache, View<const float>::token_major(q.data(), x.tokens, dims.q_heads, dims.d),
               View<float>::token_major(got.data(), x.tokens, dims.q_heads, dims.dv), o.logits, o.mask);
    const Expected want = oracle(x, o, {&freqs.inv_freq, style});
    EXPECT_LE(expect_near_oracle(got, want, x, rope::name(style)), 1.0);
  }
}

template <class E>
void check_layouts_agree() {
  const Values x = make_values(mixed_dims(), 300);
  const Cache<E> nhd = build<E>(x, Layout::nhd, 1), nhd2 = build<E>(x, Layout::nhd, 2);
  const Cache<E> hnd = build<E>(x, Layout::hnd, 3), contiguous = build<E>(x, Layout::contiguous);
  for (auto [name, o] : option_cases()) {
    std::vector<float> lse_a, lse_b;
    const auto a = run(x, nhd, o, &lse_a);
    EXPECT_TRUE(same_bytes(a, run(x, nhd2, o))) << element_name<E>() << " " << name << ": other page order";
    EXPECT_TRUE(same_bytes(a, run(x, hnd, o))) << element_name<E>() << " " << name << ": HND";
    EXPECT_TRUE(same_bytes(a, run(x, contiguous, o, &lse_b))) << element_name<E>() << " " << name << ": contiguous";
    EXPECT_TRUE(same_bytes(lse_a, lse_b)) << element_name<E>() << " " << name << ": lse";
    for (float f : a) ASSERT_TRUE(std::isfinite(f)) << element_name<E>() << " " << name << ": a poisoned slot read";
  }
}

TEST(AttentionAttend, PagedEqualsContiguousAndHndBitForBit) {
  for_each_element([](auto e) { check_layouts_agree<decltype(e)>(); });
}

// A batch's rows = one call per sequence (a batch of one over the same
// pages), and = the one-sequence plan over that sequence's own contiguous
// cache (PagedCache::contiguous of its page in the contiguous layout).
template <class E>
void check_batch_equals_singles() {
  const Values x = make_values(mixed_dims(), 400);
  const Cache<E> c = build<E>(x, Layout::nhd), cc = build<E>(x, Layout::contiguous);
  const Dims& s = x.dims;
  Options o;
  o.kv_split = 16;
  o.logits.sinks = {0.5, -1.0, -kInf, 2.0};
  for (const std::size_t window : {std::size_t{0}, std::size_t{12}}) {
    o.mask.window = window;
    std::vector<float> lse_all;
    const auto all = run(x, c, o, &lse_all);
    for (std::size_t b = 0; b < s.seqs.size(); ++b) {
      const std::int64_t n = s.seqs[b].n;
      if (n == 0) continue;
      const auto nu = static_cast<std::size_t>(n);
      const std::int64_t starts[2] = {0, n};
      const Batch one{starts, &c.lengths[b], &c.table[b * c.stride], c.stride, 1};
      const std::size_t row = static_cast<std::size_t>(x.q_starts[b]) * s.q_heads;
      const auto q = View<const float>::token_major(x.q.data() + row * s.d, nu, s.q_heads, s.d);
      std::vector<float> out(nu * s.q_heads * s.dv), lse(nu * s.q_heads);
      Plan p;
      ra::plan(p, c.shape(s.q_heads, o.kv_split), one);
      ra::attend(p, c.cache, q, View<float>::token_major(out.data(), nu, s.q_heads, s.dv), o.logits, o.mask,
                 lse.data());
      const std::string what =
          std::string(element_name<E>()) + " sequence " + std::to_string(b) + " window " + std::to_string(window);
      EXPECT_EQ(std::memcmp(out.data(), all.data() + row * s.dv, out.size() * sizeof(float)), 0) << what;
      EXPECT_EQ(std::memcmp(lse.data(), lse_all.data() + row, lse.size() * sizeof(float)), 0) << what << " lse";
      // The sequence's own contiguous cache: its page of the contiguous layout.
      const std::size_t capacity = cc.cache.k.page_size;
      const PagedCache<E> own = PagedCache<E>::contiguous(
          cc.cache.k.page(b), cc.cache.v.page(b),
          rope::KvElement<E>::kScaled ? const_cast<float*>(cc.ks.data()) + b * capacity * s.kv_heads : nullptr,
          rope::KvElement<E>::kScaled ? const_cast<float*>(cc.vs.data()) + b * capacity * s.kv_heads : nullptr);
      ra::Shape shape = ra::Shape::of(own, s.q_heads);
      shape.kv_split = o.kv_split;
      ASSERT_EQ(shape.pages, 1u);
      ASSERT_EQ(shape.page_size, capacity);
      ra::plan(p, shape, static_cast<std::size_t>(c.lengths[b] - n), nu);
      std::fill(out.begin(), out.end(), -1.0f);
      ra::attend(p, own, q, View<float>::token_major(out.data(), nu, s.q_heads, s.dv), o.logits, o.mask);
      EXPECT_EQ(std::memcmp(out.data(), all.data() + row * s.dv, out.size() * sizeof(float)), 0)
          << what << " contiguous";
    }
  }
}

TEST(AttentionAttend, BatchEqualsOneCallPerSequenceBitForBit) {
  for_each_element([](auto e) { check_batch_equals_singles<decltype(e)>(); });
}

// bf16 / f16 / int8 / fp8 caches against the f32 cache of the ORIGINAL values:
// over its own widened values each is a float evaluation of the math (the
// oracle's bound), and rounding K moved each score by at most eps_s and V
// each value by at most dv_max, so the outputs differ by at most
// dv_max + expm1(2 eps_s) max |v| plus both evaluations' rounding.
template <class E>
void check_rounded_once() {
  const Values x = make_values(mixed_dims(), 500);
  const Cache<E> q = build<E>(x, Layout::nhd);
  const Values xw = widened(x, q);
  const Cache<float> f = build<float>(x, Layout::nhd);
  const Dims& s = x.dims;
  const std::size_t group = s.q_heads / s.kv_heads;
  for (auto [name, o] : option_cases()) {
    const std::string what = std::string(element_name<E>()) + " " + name;
    const auto got = run(x, q, o), got_f = run(x, f, o);
    const Expected want_w = oracle(xw, o), want_f = oracle(x, o);
    EXPECT_LE(expect_near_oracle(got, want_w, xw, what + " vs widened oracle"), 1.0);
    bool moved = false;
    for (std::size_t t = 0; t < x.tokens; ++t) {
      const std::size_t b = x.sequence_of(t);
      std::int64_t lo = 0, hi = 0;
      visible(x.position_of(t), x.lengths[b], o.mask, &lo, &hi);
      for (std::size_t h = 0; h < s.q_heads; ++h) {
        const std::size_t th = t * s.q_heads + h, g = h / group;
        const LD scale = scale_of(o, s.d);
        LD eps_s = 0, dv_max = 0, v_max = 0;
        for (std::int64_t j = lo; j < hi; ++j) {
          const std::size_t ju = static_cast<std::size_t>(j);
          LD diff = 0;
          for (std::size_t c = 0; c < s.d; ++c) {
            diff += static_cast<LD>(x.q_row(t, h)[c]) *
                    (static_cast<LD>(xw.k_row(b, ju, g)[c]) - static_cast<LD>(x.k_row(b, ju, g)[c]));
          }
          eps_s = std::max(eps_s, std::fabs(scale * diff));
          for (std::size_t c = 0; c < s.dv; ++c) {
            dv_max = std::max(dv_max, std::fabs(static_cast<LD>(xw.v_row(b, ju, g)[c]) - x.v_row(b, ju, g)[c]));
            v_max = std::max(v_max, std::fabs(static_cast<LD>(x.v_row(b, ju, g)[c])));
          }
        }
        const double allowed =
            static_cast<double>(dv_max + std::expm1(2 * eps_s) * v_max) + want_w.bound[th] + want_f.bound[th];
        for (std::size_t c = 0; c < s.dv; ++c) {
          const double diff = std::fabs(static_cast<double>(got[th * s.dv + c]) - got_f[th * s.dv + c]);
          ASSERT_LE(diff, allowed) << what << " token " << t << " head " << h << " channel " << c << " eps_s "
                                   << static_cast<double>(eps_s) << " dv_max " << static_cast<double>(dv_max);
          moved = moved || diff > 0;
        }
      }
    }
    EXPECT_TRUE(moved) << what << ": rounding the cache changed nothing?";
  }
}

TEST(AttentionAttend, RoundedCachesWithinTheBoundOfRoundingOnce) {
  check_rounded_once<BFloat16>();
  check_rounded_once<Float16>();
  check_rounded_once<std::int8_t>();
  check_rounded_once<rope::Float8E4M3>();
  check_rounded_once<rope::Float8E5M2>();
}

// The 16-bit and int8 caches against the f32 cache of their widened values.
// The docs once said they equal it; they do not, in the last bits, and this
// is the relation that holds, from the arithmetic of the decode loop
// (kernels/kv_dot.hpp, kv_decode.hpp, scores.hpp; u = 2^-24, gamma_n =
// n u / (1 - n u)):
//
// Scores. Both caches hold the same values (a 16-bit value widens exactly;
// an int8 row is s q_c, which the f32 cache holds as fl(s q_c)), but the dot
// products add the products in different orders: each lane of each plane of
// W = P * lanes stored values keeps its own chain, the P planes are added,
// then the lanes in a tree of log2(lanes) steps, then the channels past the
// last whole block one fused multiply-add each. P is 1 for f32, 2 for the
// 16-bit types, 4 for int8, so the chains hold different products. A
// product passes through at most
//   n_E = full / W + (P - 1) + log2(lanes) + (d - full)    (full = d - d % W; d if full = 0)
// roundings (one more without fused multiply-adds), so the float score is
// within gamma_(n_E) mag_j + u |s_j| of the exact one, mag_j = scale sum_c
// |q_c k_jc| (the last u: times the scale; int8 also rounds scale * s_k once,
// and its f32 twin each value fl(s q_c): u mag more). Two caches' scores:
//   |s^E_j - s^F_j| <= D_j = (gamma(n_E) + gamma(n_F) + [int8] u) mag_j + (2 + [int8]) u |s_j|
// and with a softcap, through its slope (at most sech^2) and the rounding of
// cap * tanh(s / cap) in each (a division, tanh within 4 ulps, a product):
//   D_j <- sech^2((|s_j| - D_j) / cap) (D_j + 2 u |s_j|) + 18 u |cap tanh(s_j / cap)|.
// With a window of one key every query sees only its own key: the row is
// that key's value row (weight exp(0) = 1, sum 1) in both, bit for bit, and
// its lse is its score, so the scores' relation is read off lse directly.
//
// Outputs. From the scores on, both run the same loop over the same values
// (V in channel order per plane, each channel value after value; int8's
// weights times the value scales, rounded once, where the f32 twin rounded
// s q once), so the rows differ by
//   S: the exact softmax moved by the score differences: weights off by
//      factors within exp(+-D_j) move the weighted mean by at most
//      e^(max D) sum_j p_j expm1(D_j) |v_jc - out_c|  (+ int8: 2 u sum_j p_j |v_jc|)
//   R: plus each evaluation's own rounding of the same arithmetic on its
//      own scores, followed step by step through the loop (band() below):
//      each weight exp(x), x = fl(s_j - m), off by u |x| + 4 u (exp within
//      2 ulps) + 2 u per carry exp(m_old - m_new) after it; each running sum
//      of acc (one fused multiply-add per key, in key order) off by u times
//      its partial sum; each carry and merge product by u times what it
//      scales; l's sums of weights by gamma of their tree's depth; the end
//      acc * num / den by u (9 u with a sink). A weighted mean whose weights
//      move by relative theta_j moves by sum_j p_j theta_j |v_jc - out_c|.
// so |out^E - out^F| <= S + R^E + R^F, to first order in u (the second-order
// terms are below 1e-3 of it for these sizes: times 1.001).
namespace tight {

template <class E, class Arch = xsimd::default_arch>
std::size_t dot_roundings(std::size_t d) {
  constexpr std::size_t lanes = xsimd::batch<float, Arch>::size, P = rope::KvElement<E>::kPerLane, W = P * lanes;
  const std::size_t full = d - d % W;
  std::size_t n = d - full;
  if (full > 0) {
    n += full / W + (P - 1);
    for (std::size_t l = lanes; l > 1; l /= 2) ++n;
    if (!rope_test::kFusedMultiplyAdd<Arch>) ++n;
  }
  return n;
}

// The depth of the sum of `count` weights in softmax_weights_row: a chain
// per lane, the lanes' tree, the tail one by one.
std::size_t sum_depth(std::size_t count, std::size_t lanes) {
  const std::size_t full = count - count % lanes;
  std::size_t n = count - full;
  if (full > 0) {
    n += full / lanes;
    for (std::size_t l = lanes; l > 1; l /= 2) ++n;
  }
  return n;
}

using Chunks = std::vector<std::pair<std::int64_t, std::int64_t>>;

// How attend walks a token's visible keys [lo, hi) of a sequence of
// `length` keys (plan.hpp, attend.hpp): in parts (a decode token's split at
// multiples of kv_split, any other token's one) cut to [lo, hi), empty ones
// skipped, each in chunks of min(kv_split, 64) keys from its first.
std::vector<Chunks> walk(bool decode, std::int64_t length, std::int64_t lo, std::int64_t hi, std::size_t split) {
  const auto S = static_cast<std::int64_t>(split);
  const std::int64_t chunk = std::min<std::int64_t>(S, static_cast<std::int64_t>(rope::kAttendMaxChunk));
  std::vector<Chunks> parts;
  for (std::int64_t first = 0; first < length; first = decode ? first + S : length) {
    const std::int64_t last = decode ? std::min(length, first + S) : length;
    const std::int64_t a = std::max(first, lo), b = std::min(last, hi);
    if (a >= b) continue;
    Chunks c;
    for (std::int64_t k = a; k < b; k += chunk) c.emplace_back(k, std::min(b, k + chunk));
    parts.push_back(c);
  }
  return parts;
}

// R above, per channel: the rounding of one float evaluation of a row with
// exact scores s (keys lo ..), values v, its exact row `row` (weights p),
// over the walk `parts`.
std::vector<double> band(const std::vector<LD>& s, const at::Mat& v, const at::SoftmaxRow& row, bool sink,
                         const std::vector<Chunks>& parts, std::int64_t lo, std::size_t lanes, bool int8) {
  const std::size_t dv = row.out.size();
  std::vector<LD> theta(s.size(), 0), ea(dv, 0), ta(dv, 0);
  LD el = 0, tl = 0;
  std::vector<std::size_t> seen;  // keys of the parts merged so far
  for (std::size_t k = 0; k < parts.size(); ++k) {
    std::vector<LD> a(dv, 0);
    LD l = 0, m = -std::numeric_limits<LD>::infinity();
    std::vector<std::size_t> mine;
    for (const auto& [c0, c1] : parts[k]) {
      LD mc = m;
      for (std::int64_t j = c0; j < c1; ++j) mc = std::max(mc, s[static_cast<std::size_t>(j - lo)]);
      if (std::isfinite(m) && mc > m) {  // exp(m - m_new), times acc and l
        for (const std::size_t i : mine) theta[i] += 2 * kU;
        for (std::size_t c = 0; c < dv; ++c) ea[c] += kU * std::fabs(a[c]);
        el += kU * l;
      }
      LD lc = 0;
      for (std::int64_t j = c0; j < c1; ++j) {
        const auto i = static_cast<std::size_t>(j - lo);
        theta[i] = kU * std::fabs(s[i] - mc) + 4 * kU;
        for (std::size_t c = 0; c < dv; ++c) {
          a[c] += row.p[i] * v[i][c];
          ea[c] += kU * std::fabs(a[c]);
        }
        lc += row.p[i];
        mine.push_back(i);
      }
      el += at::gamma_float(static_cast<double>(sum_depth(static_cast<std::size_t>(c1 - c0), lanes))) * lc;
      l += lc;
      el += kU * l;
      m = mc;
    }
    if (k > 0) {  // merge_state: both sides carried, multiplied, added
      for (const std::size_t i : seen) theta[i] += 2 * kU;
      for (const std::size_t i : mine) theta[i] += 2 * kU;
      for (std::size_t c = 0; c < dv; ++c) ea[c] += kU * (std::fabs(ta[c]) + std::fabs(a[c]) + std::fabs(ta[c] + a[c]));
      el += 2 * kU * (tl + l);
    }
    for (std::size_t c = 0; c < dv; ++c) ta[c] += a[c];
    tl += l;
    seen.insert(seen.end(), mine.begin(), mine.end());
  }
  std::vector<double> r(dv);
  for (std::size_t c = 0; c < dv; ++c) {
    LD x = ea[c] + std::fabs(row.out[c]) * (el + (sink ? 9 : 1) * kU);
    for (std::size_t i = 0; i < s.size(); ++i) {
      x += row.p[i] * theta[i] * std::fabs(v[i][c] - row.out[c]);
      if (int8) x += row.p[i] * kU * std::fabs(v[i][c]);  // w * s_v rounded once
    }
    r[c] = static_cast<double>(x);
  }
  return r;
}

// D_j above for the keys of row (t, h), from the exact scores of the
// widened values.
template <class E>
std::vector<LD> score_gaps(const Scores& sc, const Options& o, std::size_t d) {
  constexpr bool int8 = rope::KvElement<E>::kScaled;
  const double g = at::gamma_float(static_cast<double>(dot_roundings<E>(d))) +
                   at::gamma_float(static_cast<double>(dot_roundings<float>(d))) + (int8 ? kU : 0);
  const LD cap = o.logits.softcap ? static_cast<LD>(static_cast<float>(*o.logits.softcap)) : 0;
  std::vector<LD> gaps;
  for (std::size_t j = 0; j < sc.s.size(); ++j) {
    LD gap = g * sc.mag[j] * (1 + 2 * kU) + (int8 ? 3 : 2) * kU * std::fabs(sc.raw[j]);
    if (cap > 0) {
      const LD a = std::max<LD>(0, std::fabs(sc.raw[j]) - gap) / cap;
      gap = (gap + 2 * kU * std::fabs(sc.raw[j])) / (std::cosh(a) * std::cosh(a)) + 18 * kU * std::fabs(sc.s[j]);
    }
    gaps.push_back(gap);
  }
  return gaps;
}

}  // namespace tight

// Worst |got - want| / bound of the scores (window 1) and of the rows, for
// the verbose log: how much of the bound the arithmetic uses.
template <class E>
void check_against_widened_f32(const Dims& dims, double* worst_score, double* worst_row, std::size_t* differ) {
  const Values x = make_values(dims, 1300);
  const Cache<E> q = build<E>(x, Layout::nhd);
  const Values xw = widened(x, q);
  const Cache<float> fw = build<float>(xw, Layout::nhd);
  constexpr std::size_t lanes = xsimd::batch<float, xsimd::default_arch>::size;
  const std::string name = std::string(element_name<E>()) + " d " + std::to_string(dims.d);
  // Scores: a window of one key, so lse is the score and the row the value.
  for (const bool capped : {false, true}) {
    Options o;
    o.mask.window = 1;
    if (capped) o.logits.scale = 3.0, o.logits.softcap = 2.0;
    std::vector<float> lse_q, lse_f;
    const auto out_q = run(x, q, o, &lse_q), out_f = run(xw, fw, o, &lse_f);
    EXPECT_TRUE(same_bytes(out_q, out_f)) << name << ": a one-key row is its value row in both";
    for (std::size_t t = 0; t < x.tokens; ++t) {
      for (std::size_t h = 0; h < dims.q_heads; ++h) {
        const std::size_t th = t * dims.q_heads + h;
        const Scores sc = scores_of(xw, o, t, h);
        const double gap = static_cast<double>(tight::score_gaps<E>(sc, o, dims.d)[0]);
        const double diff = std::fabs(static_cast<double>(lse_q[th]) - lse_f[th]);
        ASSERT_LE(diff, gap) << name << (capped ? " capped" : "") << " score of token " << t << " head " << h;
        *worst_score = std::max(*worst_score, diff / gap);
        *differ += diff > 0;
      }
    }
  }
  // Rows, over the option cases.
  for (auto [case_name, o] : option_cases()) {
    if (!o.logits.sinks.empty()) o.logits.sinks.resize(dims.q_heads, 0.25);
    const auto got_q = run(x, q, o), got_f = run(xw, fw, o);
    for (std::size_t t = 0; t < x.tokens; ++t) {
      const std::size_t b = x.sequence_of(t);
      for (std::size_t h = 0; h < dims.q_heads; ++h) {
        const std::size_t th = t * dims.q_heads + h;
        const Scores sc = scores_of(xw, o, t, h);
        const at::Mat v = values_of(xw, t, h, sc.lo, sc.hi);
        const LD sink = sink_of(o, h);
        const at::SoftmaxRow row = at::softmax_row(sc.s, v, dims.dv, sink);
        const std::vector<LD> gaps = tight::score_gaps<E>(sc, o, dims.d);
        const auto parts = tight::walk(dims.seqs[b].n == 1, x.lengths[b], sc.lo, sc.hi, o.kv_split);
        const bool has_sink = std::isfinite(static_cast<double>(sink));
        const auto r_q = tight::band(sc.s, v, row, has_sink, parts, sc.lo, lanes, rope::KvElement<E>::kScaled);
        const auto r_f = tight::band(sc.s, v, row, has_sink, parts, sc.lo, lanes, false);
        const LD top = *std::max_element(gaps.begin(), gaps.end());
        for (std::size_t c = 0; c < dims.dv; ++c) {
          LD moved = 0;
          for (std::size_t j = 0; j < gaps.size(); ++j) {
            moved += row.p[j] * std::expm1(gaps[j]) * std::fabs(v[j][c] - row.out[c]);
            if (rope::KvElement<E>::kScaled) moved += 2 * kU * row.p[j] * std::fabs(v[j][c]);
          }
          const double bound = 1.001 * (static_cast<double>(std::exp(top) * moved) + r_q[c] + r_f[c]);
          const double diff = std::fabs(static_cast<double>(got_q[th * dims.dv + c]) - got_f[th * dims.dv + c]);
          ASSERT_LE(diff, bound) << name << " " << case_name << " token " << t << " head " << h << " channel " << c;
          *worst_row = std::max(*worst_row, diff / bound);
        }
      }
    }
  }
}

TEST(AttentionAttend, QuantizedCachesAgreeWithTheF32CacheOfTheirValuesWithinTheOrderOfTheirProducts) {
  const bool verbose = std::getenv("ROPE_TEST_VERBOSE") != nullptr;
  for (const Dims& dims : {mixed_dims(), Dims{8, 2, 128, 128, 16, {{1, 300}, {7, 40}, {1, 65}, {2, 2}}},
                           Dims{6, 3, 64, 32, 8, {{1, 90}, {12, 12}, {3, 17}}}}) {
    for_each_element([&](auto e) {
      using E = decltype(e);
      // d 128 on bf16 and int8 only where long double is software
      // (kv_elements.hpp).
      if (dims.d >= 128 && !rope_test::widest_case_runs<E>()) return;
      if constexpr (!std::is_same<E, float>::value) {
        double worst_score = 0, worst_row = 0;
        std::size_t differ = 0;
        check_against_widened_f32<E>(dims, &worst_score, &worst_row, &differ);
        if (verbose) {
          std::cout << element_name<E>() << " d " << dims.d << ": scores differing " << differ
                    << ", worst score gap / bound " << worst_score << ", worst row gap / bound " << worst_row << "\n";
        }
      }
    });
  }
}

Dims decode_heavy_dims() {
  Dims s;
  s.seqs = {{1, 300}, {1, 129}, {1, 64}, {1, 1}, {4, 50}, {1, 257}, {1, 33}};
  return s;
}

// Split-KV against the oracle: kv_split that divides none of the lengths
// (7, 100), that divides some (1, 32, 64), one larger than any length.
TEST(AttentionAttend, KvSplitsAgreeWithOracle) {
  const Values x = make_values(decode_heavy_dims(), 600);
  const Cache<float> c = build<float>(x, Layout::nhd);
  for (const std::size_t split : {1, 3, 7, 32, 64, 100, 256, 512, 4096}) {
    for (const std::size_t window : {std::size_t{0}, std::size_t{100}}) {
      Options o;
      o.kv_split = split;
      o.mask.window = window;
      o.logits.sinks = {0.3, -kInf, 2.0, -1.0};
      std::vector<float> lse;
      const std::string what = "split " + std::to_string(split) + " window " + std::to_string(window);
      const Expected want = oracle(x, o);
      EXPECT_LE(expect_near_oracle(run(x, c, o, &lse), want, x, what), 1.0);
      for (std::size_t th = 0; th < lse.size(); ++th) {
        ASSERT_LE(std::fabs(static_cast<double>(lse[th]) - static_cast<double>(want.lse[th])), want.lse_bound[th])
            << what << " lse " << th;
      }
    }
  }
}

template <class E>
void check_threads() {
  const Values x = make_values(decode_heavy_dims(), 700);
  const Cache<E> c = build<E>(x, Layout::nhd);
  Options o;
  o.kv_split = 32;  // the long decodes split into many parts
  o.logits.softcap = 30.0;
  std::vector<float> lse_one, lse;
  const auto one = run(x, c, o, &lse_one);
  Plan reused;
  for (const std::size_t threads : {1, 2, 3, 4}) {
    o.threads = threads;
    EXPECT_TRUE(same_bytes(one, run(x, c, o, &lse))) << element_name<E>() << " threads " << threads;
    EXPECT_TRUE(same_bytes(lse_one, lse)) << element_name<E>() << " threads " << threads << " lse";
    EXPECT_TRUE(same_bytes(one, run(x, c, o, nullptr, &reused)))
        << element_name<E>() << " threads " << threads << " reused plan";
  }
  rope_test::ThreadPool pool(3);
  o.threads = pool.executor(4);
  EXPECT_TRUE(same_bytes(one, run(x, c, o, &lse, &reused))) << element_name<E>() << " thread pool";
  EXPECT_TRUE(same_bytes(lse_one, lse)) << element_name<E>() << " thread pool lse";
  EXPECT_GT(pool.tasks_run(), 0u);
  rope_test::ReverseExecutor reverse;
  o.threads = reverse.executor(3);
  EXPECT_TRUE(same_bytes(one, run(x, c, o))) << element_name<E>() << " reverse executor";
  EXPECT_GT(reverse.tasks_run, 0u);
}

TEST(AttentionAttend, ThreadsAndExecutorsGiveTheSameBytes) {
  for_each_element([](auto e) { check_threads<decltype(e)>(); });
}

// The items of a batch go to threads in contiguous shares of about equal
// cost (keys): every item runs once, a share's items are consecutive and
// in order, and no share costs more than an equal part plus its largest
// item; all costs zero falls back to shares of equal counts.
TEST(AttentionAttend, ItemsGoToContiguousSharesOfAboutEqualCost) {
  std::vector<std::vector<std::size_t>> cases = {
      {512, 512, 3, 512, 512, 512, 512, 256, 100, 512, 512, 1, 1, 1, 512},
      {100000, 1, 1, 1, 1, 1},
      {1, 1, 1, 1, 1, 1, 1, 100000},
      {1, 1, 1, 1, 1, 1, 1, 1, 100, 100, 100, 100, 100, 100, 100, 100},
      {0, 0, 0, 0, 0},
      {7},
  };
  std::mt19937 gen(11);
  std::uniform_int_distribution<std::size_t> dist(0, 600);
  cases.emplace_back(67);
  for (auto& c : cases.back()) c = dist(gen);
  rope_test::ThreadPool pool(2);
  for (const auto& costs : cases) {
    const std::size_t total = std::accumulate(costs.begin(), costs.end(), std::size_t{0});
    const std::size_t largest = *std::max_element(costs.begin(), costs.end());
    for (const std::size_t threads : {1, 2, 3, 5}) {
      for (const bool pooled : {false, true}) {
        std::vector<std::size_t> share(costs.size(), 99), runs(costs.size(), 0);
        std::vector<std::vector<std::size_t>> order(threads);
        const rope::Executor executor = pooled ? pool.executor(threads) : rope::Executor{};
        rope::detail::parallel_for_costs(
            costs.size(), threads, executor, [&](std::size_t i) { return costs[i]; },
            [&](std::size_t i, std::size_t w) {
              share[i] = w;
              ++runs[i];
              order[w].push_back(i);
            });
        const std::string what = "case of " + std::to_string(costs.size()) + " items, threads " +
                                 std::to_string(threads) + (pooled ? " (executor)" : "");
        const std::size_t workers = std::min(threads, costs.size());
        std::vector<std::size_t> cost_of(workers, 0);
        for (std::size_t i = 0; i < costs.size(); ++i) {
          ASSERT_EQ(runs[i], 1u) << what << ": item " << i;
          ASSERT_LT(share[i], workers) << what << ": item " << i;
          if (i > 0) {
            ASSERT_GE(share[i], share[i - 1]) << what << ": item " << i << " before its predecessor's share";
          }
          cost_of[share[i]] += costs[i];
        }
        for (std::size_t w = 0; w < workers; ++w) {
          EXPECT_TRUE(std::is_sorted(order[w].begin(), order[w].end())) << what << ": share " << w;
          if (total > 0) {
            EXPECT_LE(cost_of[w] * workers, total + workers * largest) << what << ": share " << w;
          } else {
            const std::size_t n = costs.size();
            EXPECT_EQ(order[w].size(), n * (w + 1) / workers - n * w / workers) << what << ": share " << w;
          }
        }
      }
    }
  }
}

// The fused step: append (Q rotated into q_out, K rotated and V into the
// planned slots) then attend, against the K/V form of append with Q rotated
// by the caller (rope::apply at plan.positions()) then attend: the same
// cache bytes and outputs; and, for the f32 cache, the oracle of the
// relative scores. The cache holds the earlier keys, rotated at their
// positions by an earlier step; the new tokens' slots start poisoned.
template <class E>
void check_append_then_attend() {
  const Values x = make_values(mixed_dims(), 800);
  const Dims& s = x.dims;
  const auto freqs = rope::frequencies(s.d, 10000.0);
  const rope::Table<float> table(freqs, 128);
  const rope::Style style = rope::Style::block_diagonal;
  Cache<E> a = build<E>(x, Layout::nhd);
  // Earlier steps: every cached key rotated at its position.
  {
    std::vector<std::int64_t> starts = {0}, lengths;
    std::vector<float> k_old, v_old;
    for (std::size_t b = 0; b < s.seqs.size(); ++b) {
      const std::int64_t cached = x.lengths[b] - s.seqs[b].n;
      starts.push_back(starts.back() + cached);
      lengths.push_back(cached);
      const auto rows = static_cast<std::size_t>(cached);
      k_old.insert(k_old.end(), x.k[b].begin(), x.k[b].begin() + rows * s.kv_heads * s.d);
      v_old.insert(v_old.end(), x.v[b].begin(), x.v[b].begin() + rows * s.kv_heads * s.dv);
    }
    Batch fb = a.batch();
    fb.q_starts = starts.data();
    fb.lengths = lengths.data();
    Plan fill;
    ra::plan(fill, a.shape(s.q_heads, 512), fb);
    const auto n = static_cast<std::size_t>(starts.back());
    ra::AppendOptions w;
    w.rotation = {&table, style};
    ra::append(fill, a.cache, View<const float>::token_major(k_old.data(), n, s.kv_heads, s.d),
               View<const float>::token_major(v_old.data(), n, s.kv_heads, s.dv), w);
    // The new tokens' slots: poison, so that the step must write them.
    for (std::size_t b = 0; b < s.seqs.size(); ++b) {
      for (std::int64_t j = x.lengths[b] - s.seqs[b].n; j < x.lengths[b]; ++j) {
        for (std::size_t g = 0; g < s.kv_heads; ++g) {
          std::fill_n(a.cache.k.row(a.slot(b, static_cast<std::size_t>(j)), g), s.d, poison<E>());
          std::fill_n(a.cache.v.row(a.slot(b, static_cast<std::size_t>(j)), g), s.dv, poison<E>());
        }
      }
    }
  }
  Cache<E> b = a;
  b.cache.k.data = b.kd.data();
  b.cache.v.data = b.vd.data();
  if (rope::KvElement<E>::kScaled) {
    b.cache.k.scales = b.ks.data();
    b.cache.v.scales = b.vs.data();
  }
  const auto before = a.bytes();
  std::vector<float> kn, vn;
  for (std::size_t sb = 0; sb < s.seqs.size(); ++sb) {
    const auto first = static_cast<std::size_t>(x.lengths[sb] - s.seqs[sb].n);
    kn.insert(kn.end(), x.k[sb].begin() + first * s.kv_heads * s.d, x.k[sb].end());
    vn.insert(vn.end(), x.v[sb].begin() + first * s.kv_heads * s.dv, x.v[sb].end());
  }
  const auto k_new = View<const float>::token_major(kn.data(), x.tokens, s.kv_heads, s.d);
  const auto v_new = View<const float>::token_major(vn.data(), x.tokens, s.kv_heads, s.dv);
  Options o;
  o.kv_split = 8;
  Plan p;
  ra::plan(p, a.shape(s.q_heads, o.kv_split), a.batch());
  ra::AppendOptions w;
  w.rotation = {&table, style};
  // Fused: Q rotated into q_a.
  std::vector<float> q_a(x.q.size(), kNaN), out_a(x.tokens * s.q_heads * s.dv), out_b(out_a.size());
  ra::append(p, a.cache, q_view(x), k_new, v_new, View<float>::token_major(q_a.data(), x.tokens, s.q_heads, s.d), w);
  ra::attend(p, a.cache, View<const float>::token_major(q_a.data(), x.tokens, s.q_heads, s.d),
             View<float>::token_major(out_a.data(), x.tokens, s.q_heads, s.dv), o.logits, o.mask);
  // The caller's way: K/V append, Q rotated by rope::apply at the plan's positions.
  std::vector<float> q_b = x.q;
  ra::append(p, b.cache, k_new, v_new, w);
  rope::apply(View<float>::token_major(q_b.data(), x.tokens, s.q_heads, s.d), table, style,
              rope::Positions(p.positions()));
  ra::attend(p, b.cache, View<const float>::token_major(q_b.data(), x.tokens, s.q_heads, s.d),
             View<float>::token_major(out_b.data(), x.tokens, s.q_heads, s.dv), o.logits, o.mask);
  EXPECT_TRUE(a.bytes() == b.bytes()) << element_name<E>() << ": the caches differ";
  EXPECT_FALSE(a.bytes() == before) << element_name<E>() << ": nothing was written";
  EXPECT_TRUE(same_bytes(q_a, q_b)) << element_name<E>() << ": the rotated queries differ";
  EXPECT_TRUE(same_bytes(out_a, out_b)) << element_name<E>() << ": the outputs differ";
  for (float f : out_a) ASSERT_TRUE(std::isfinite(f)) << element_name<E>() << ": a poisoned slot read";
  if constexpr (std::is_same<E, float>::value) {
    EXPECT_LE(expect_near_oracle(out_a, oracle(x, o, {&freqs.inv_freq, style}), x, "append then attend"), 1.0);
  }
}

TEST(AttentionAttend, AppendThenAttendEqualsTheCallersRotationAndTheOracle) {
  for_each_element([](auto e) { check_append_then_attend<decltype(e)>(); });
}

TEST(AttentionAttend, SinkMinusInfinityIsNoSink) {
  const Values x = make_values(mixed_dims(), 900);
  const Cache<float> c = build<float>(x, Layout::nhd);
  Options o;
  o.kv_split = 9;
  std::vector<float> lse_none, lse;
  const auto none = run(x, c, o, &lse_none);
  o.logits.sinks.assign(4, -kInf);
  EXPECT_TRUE(same_bytes(none, run(x, c, o, &lse)));
  EXPECT_TRUE(same_bytes(lse_none, lse));
  o.logits.sinks = {-kInf, 3.0, -kInf, -0.5};
  const auto some = run(x, c, o, &lse);
  const std::size_t dv = x.dims.dv;
  for (std::size_t t = 0; t < x.tokens; ++t) {
    for (std::size_t h = 0; h < 4; ++h) {
      const std::size_t th = t * 4 + h;
      const bool same = std::memcmp(&some[th * dv], &none[th * dv], dv * sizeof(float)) == 0;
      EXPECT_EQ(same, h == 0 || h == 2) << "token " << t << " head " << h;
      EXPECT_EQ(std::memcmp(&lse[th], &lse_none[th], sizeof(float)) == 0, h == 0 || h == 2)
          << "lse token " << t << " head " << h;
      if (h == 1 || h == 3) {
        EXPECT_GT(lse[th], lse_none[th]) << "a sink adds to the sum";
      }
    }
  }
  // A large sink takes almost all the weight: |out| <= exp(max s - sink) max |v| (1 + slack).
  o.logits.sinks.assign(4, 60.0);
  const auto big = run(x, c, o, &lse);
  const Expected want = oracle(x, o);
  EXPECT_LE(expect_near_oracle(big, want, x, "sink 60"), 1.0);
  for (float f : big) EXPECT_LT(std::fabs(f), 1e-10f);
  for (std::size_t th = 0; th < lse.size(); ++th) {
    EXPECT_LE(std::fabs(static_cast<double>(lse[th]) - static_cast<double>(want.lse[th])), want.lse_bound[th]);
  }
}

// NaN and Inf reach only the queries that see them.
template <class E>
void check_confinement() {
  const Dims s = mixed_dims();
  const Values clean = make_values(s, 1000);
  Values bad = clean;
  // Sequence 0 (decode at 36, window 8 sees 29 ..): a NaN key at 3, an Inf value at 10.
  bad.k_row(0, 3, 1)[2] = kNaN;
  bad.v_row(0, 10, 0)[4] = std::numeric_limits<float>::infinity();
  // Sequence 2 (chunked prefill at 35 .. 39): a NaN key at 37, seen by 37 .. 39 only.
  bad.k_row(2, 37, 0)[0] = kNaN;
  // Sequence 1 (prefill 0 .. 22): a NaN in token 4's query head 1; an Inf value at 20.
  bad.q[(4 * s.q_heads + 1) * s.d + 3] = kNaN;
  bad.v_row(1, 20, 1)[0] = -std::numeric_limits<float>::infinity();
  const Cache<E> cc = build<E>(clean, Layout::nhd), cb = build<E>(bad, Layout::nhd);
  Options o;
  o.mask.window = 8;
  o.kv_split = 4;
  std::vector<float> lse_want, lse_got;
  const auto want = run(clean, cc, o, &lse_want), got = run(bad, cb, o, &lse_got);
  const std::size_t group = s.q_heads / s.kv_heads;
  for (std::size_t t = 0; t < clean.tokens; ++t) {
    const std::size_t b = clean.sequence_of(t);
    const std::int64_t p = clean.position_of(t);
    for (std::size_t h = 0; h < s.q_heads; ++h) {
      const std::size_t g = h / group;
      const bool sees_nan = (b == 2 && g == 0 && p >= 37) || (b == 1 && t == 4 && h == 1);
      const bool sees = sees_nan || (b == 1 && g == 1 && p >= 20 && p < 28);
      const std::size_t th = t * s.q_heads + h, at = th * s.dv;
      bool any_bad = false;
      for (std::size_t c = 0; c < s.dv; ++c) any_bad = any_bad || !std::isfinite(got[at + c]);
      if (sees) {
        EXPECT_TRUE(any_bad) << element_name<E>() << " token " << t << " head " << h << ": poison not seen?";
        if (sees_nan) {
          EXPECT_TRUE(std::isnan(lse_got[th])) << element_name<E>() << " token " << t << " lse";
        }
      } else {
        EXPECT_EQ(std::memcmp(&got[at], &want[at], s.dv * sizeof(float)), 0)
            << element_name<E>() << " token " << t << " (sequence " << b << ", position " << p << ") head " << h;
        EXPECT_EQ(std::memcmp(&lse_got[th], &lse_want[th], sizeof(float)), 0)
            << element_name<E>() << " token " << t << " head " << h << " lse";
      }
    }
  }
}

TEST(AttentionAttend, NonFiniteValuesReachOnlyTheQueriesThatSeeThem) {
  for_each_element([](auto e) { check_confinement<decltype(e)>(); });
}

// A sequence with no new tokens is neither checked nor read: its block-table
// row may hold anything (ids past the pool, a page twice, -1), and the last
// such row need not even exist in memory; its pages (poisoned here) are
// never read, and the other sequences' rows are those of the batch without it.
TEST(AttentionAttend, SequenceWithoutNewTokensIsNeitherCheckedNorRead) {
  Dims dims = mixed_dims();  // sequence 4 has no new tokens
  dims.seqs.push_back({0, 12});
  const Values x = make_values(dims, 1200);
  Cache<float> c = build<float>(x, Layout::nhd);
  // Their pages: NaN everywhere, as if their keys were poison.
  for (const std::size_t b : {std::size_t{4}, dims.seqs.size() - 1}) {
    for (std::size_t j = 0; j < static_cast<std::size_t>(x.lengths[b]); ++j) {
      for (std::size_t g = 0; g < dims.kv_heads; ++g) {
        std::fill_n(c.cache.k.row(c.slot(b, j), g), dims.d, kNaN);
        std::fill_n(c.cache.v.row(c.slot(b, j), g), dims.dv, kNaN);
      }
    }
  }
  // The batch without them: sequences 0 .. 3, 5, 6 over the same pages.
  Dims kept = dims;
  kept.seqs.erase(kept.seqs.begin() + 4);
  kept.seqs.pop_back();
  Values xk = make_values(kept, 1);
  xk.q = x.q;
  Cache<float> ck = c;
  ck.cache.k.data = ck.kd.data();
  ck.cache.v.data = ck.vd.data();
  ck.q_starts = xk.q_starts;
  ck.lengths = xk.lengths;
  ck.table.erase(ck.table.begin() + static_cast<std::ptrdiff_t>(4 * c.stride),
                 ck.table.begin() + static_cast<std::ptrdiff_t>(5 * c.stride));
  ck.table.resize(6 * c.stride);
  Options o;
  o.kv_split = 16;
  const auto want = run(xk, ck, o);
  // Garbage in sequence 4's row; the last sequence's row cut off the table.
  std::vector<std::int32_t> table(c.table.begin(), c.table.begin() + static_cast<std::ptrdiff_t>(7 * c.stride));
  table[4 * c.stride + 0] = -1;
  table[4 * c.stride + 1] = std::numeric_limits<std::int32_t>::max();
  for (const std::size_t threads : {1, 3}) {
    Batch batch = c.batch();
    batch.block_table = table.data();  // 7 rows: the 8th would be past the end
    Plan p;
    ra::plan(p, c.shape(dims.q_heads, o.kv_split), batch, threads);
    EXPECT_EQ(p.tokens(), x.tokens);
    for (const auto& it : p.items()) EXPECT_TRUE(it.sequence != 4 && it.sequence != 7) << "an item of no new token";
    const auto before = c.bytes();
    std::vector<float> out(x.tokens * dims.q_heads * dims.dv, -777.0f);
    ra::attend(p, c.cache, q_view(x), View<float>::token_major(out.data(), x.tokens, dims.q_heads, dims.dv));
    EXPECT_TRUE(same_bytes(out, want)) << "threads " << threads;
    // append of K/V writes only the planned slots: sequences 4 and 7's pages stay.
    const auto kn = rope_test::random_vector<float>(x.tokens * dims.kv_heads * dims.d, 1201);
    const auto vn = rope_test::random_vector<float>(x.tokens * dims.kv_heads * dims.dv, 1202);
    ra::append(p, c.cache, View<const float>::token_major(kn.data(), x.tokens, dims.kv_heads, dims.d),
               View<const float>::token_major(vn.data(), x.tokens, dims.kv_heads, dims.dv));
    for (const std::size_t b : {std::size_t{4}, dims.seqs.size() - 1}) {
      for (std::size_t j = 0; j < static_cast<std::size_t>(x.lengths[b]); ++j) {
        for (std::size_t g = 0; g < dims.kv_heads; ++g) {
          for (std::size_t ch = 0; ch < dims.d; ++ch) ASSERT_TRUE(std::isnan(c.cache.k.row(c.slot(b, j), g)[ch]));
        }
      }
    }
    EXPECT_FALSE(c.bytes() == before);
    // Back to the keys of the batch for the next round.
    c = build<float>(x, Layout::nhd);
    for (const std::size_t b : {std::size_t{4}, dims.seqs.size() - 1}) {
      for (std::size_t j = 0; j < static_cast<std::size_t>(x.lengths[b]); ++j) {
        for (std::size_t g = 0; g < dims.kv_heads; ++g) {
          std::fill_n(c.cache.k.row(c.slot(b, j), g), dims.d, kNaN);
          std::fill_n(c.cache.v.row(c.slot(b, j), g), dims.dv, kNaN);
        }
      }
    }
  }
}

// Refusals: each names its argument, and nothing is written.
template <class E>
struct Refusals {
  Values x = make_values(Dims{4, 2, 8, 6, 4, {{1, 9}, {3, 5}, {2, 6}}}, 1100);
  Cache<E> c = build<E>(x, Layout::nhd);
  std::vector<float> out = std::vector<float>(x.tokens * 4 * 6, -5.0f);
  std::vector<float> lse = std::vector<float>(x.tokens * 4, -6.0f);
  Plan plan;

  Refusals() { ra::plan(plan, c.shape(4, 512), c.batch()); }
  View<float> out_view() { return View<float>::token_major(out.data(), x.tokens, 4, 6); }

  // f() throws; its message names `argument` and shows `value`; the cache,
  // out and lse are as they were.
  template <class F>
  void expect(const std::string& what, const std::string& argument, const std::string& value, F&& f) {
    const auto cache_before = c.bytes();
    const std::vector<float> out_before = out, lse_before = lse;
    const std::string msg = rope_test::thrown_message(f);
    SCOPED_TRACE(std::string(element_name<E>()) + " " + what);
    EXPECT_EQ(msg.rfind("rope::attention::attend: ", 0), 0u) << msg;
    rope_test::expect_names(msg, argument, value);
    EXPECT_TRUE(c.bytes() == cache_before) << "the cache was written";
    EXPECT_TRUE(same_bytes(out, out_before)) << "out was written";
    EXPECT_TRUE(same_bytes(lse, lse_before)) << "lse was written";
  }
};

template <class E>
void check_refusals() {
  Refusals<E> r;
  const auto q = q_view(r.x);
  auto attend = [&](const Logits& logits, const PagedCache<E>& cache) {
    ra::attend(r.plan, cache, q, r.out_view(), logits, Mask{}, r.lse.data());
  };
  {
    Logits l;
    l.sinks = {1.0, 2.0};
    r.expect("sinks size", "logits.sinks.size()", "2", [&] { attend(l, r.c.cache); });
    l.sinks = {1.0, std::nan(""), 0.0, 0.0};
    r.expect("sink NaN", "logits.sinks[1]", "nan", [&] { attend(l, r.c.cache); });
    l.sinks = {1.0, 0.0, 0.0, kInf};
    r.expect("sink +inf", "logits.sinks[3]", "inf", [&] { attend(l, r.c.cache); });
    l.sinks = {1.0, 0.0, 0.0, 1e300};  // finite as a double, +inf as a float
    r.expect("sink overflowing float", "logits.sinks[3]", "finite or -inf", [&] { attend(l, r.c.cache); });
  }
  for (const double cap : {0.0, -1.0, std::nan(""), kInf, 1e-60, 1e300}) {
    Logits l;
    l.softcap = cap;
    r.expect("softcap " + std::to_string(cap), "logits.softcap", "finite and > 0", [&] { attend(l, r.c.cache); });
  }
  for (const double scale : {std::nan(""), kInf, 1e300}) {
    Logits l;
    l.scale = scale;
    r.expect("scale " + std::to_string(scale), "logits.scale", "finite", [&] { attend(l, r.c.cache); });
  }
  {  // a plan that was never made, and one whose plan() failed
    Plan none;
    r.expect("no plan", "plan", "made by a rope::attention::plan() that succeeded",
             [&] { ra::attend(none, r.c.cache, q, r.out_view()); });
    Plan failed = r.plan;
    ra::Shape bad = r.c.shape(4, 512);
    bad.kv_split = 0;
    EXPECT_NE(rope_test::thrown_message([&] { ra::plan(failed, bad, r.c.batch()); }), "no exception");
    r.expect("failed plan", "plan", "made by a rope::attention::plan() that succeeded",
             [&] { ra::attend(failed, r.c.cache, q, r.out_view()); });
  }
  {  // q and out against the plan's shape
    const auto q3 = View<const float>::token_major(r.x.q.data(), r.x.tokens, 3, 8);
    r.expect("q heads", "q.heads", "the plan's 4",
             [&] { ra::attend(r.plan, r.c.cache, q3, View<float>::token_major(r.out.data(), r.x.tokens, 3, 6)); });
    const auto q7 = View<const float>::token_major(r.x.q.data(), r.x.tokens, 4, 7);
    r.expect("q head_dim", "q.head_dim", "7", [&] { ra::attend(r.plan, r.c.cache, q7, r.out_view()); });
    const auto q_short = View<const float>::token_major(r.x.q.data(), r.x.tokens - 1, 4, 8);
    r.expect("q tokens", "q.tokens", "the plan's " + std::to_string(r.x.tokens),
             [&] { ra::attend(r.plan, r.c.cache, q_short, r.out_view()); });
    r.expect("out head_dim", "out.head_dim", "the plan's 6",
             [&] { ra::attend(r.plan, r.c.cache, q, View<float>::token_major(r.out.data(), r.x.tokens, 4, 5)); });
    r.expect("out tokens", "out.tokens", "the plan's " + std::to_string(r.x.tokens),
             [&] { ra::attend(r.plan, r.c.cache, q, View<float>::token_major(r.out.data(), 1, 4, 6)); });
  }
  {  // overlaps: out with q, out with the cache, lse with out, q or the cache
    std::vector<float> qbuf(r.x.q.begin(), r.x.q.end());
    qbuf.resize(std::max(qbuf.size(), r.out.size()));
    const std::vector<float> qbuf_before = qbuf;
    r.expect("out overlaps q", "out", "overlaps q", [&] {
      ra::attend(r.plan, r.c.cache, View<const float>::token_major(qbuf.data(), r.x.tokens, 4, 8),
                 View<float>::token_major(qbuf.data(), r.x.tokens, 4, 6));
    });
    EXPECT_TRUE(same_bytes(qbuf, qbuf_before));
    r.expect("lse overlaps out", "lse", "memory apart from q and out",
             [&] { ra::attend(r.plan, r.c.cache, q, r.out_view(), Logits{}, Mask{}, r.out.data() + 3); });
    r.expect("lse overlaps q", "lse", "memory apart from q and out", [&] {
      ra::attend(r.plan, r.c.cache, View<const float>::token_major(qbuf.data(), r.x.tokens, 4, 8), r.out_view(),
                 Logits{}, Mask{}, qbuf.data() + 5);
    });
    EXPECT_TRUE(same_bytes(qbuf, qbuf_before));
    if constexpr (std::is_same<E, float>::value) {
      r.expect("out in the cache", "out", "memory apart from cache.k", [&] {
        ra::attend(r.plan, r.c.cache, q, View<float>::token_major(r.c.kd.data() + 2, r.x.tokens, 4, 6));
      });
      r.expect("lse in the cache", "lse", "memory apart from cache.v",
               [&] { ra::attend(r.plan, r.c.cache, q, r.out_view(), Logits{}, Mask{}, r.c.vd.data() + 1); });
    }
    if constexpr (rope::KvElement<E>::kScaled) {
      r.expect("lse in the scales", "lse", "memory apart from cache.k",
               [&] { ra::attend(r.plan, r.c.cache, q, r.out_view(), Logits{}, Mask{}, r.c.ks.data() + 1); });
    }
  }
  {  // the cache against the plan and itself
    PagedCache<E> cache = r.c.cache;
    std::vector<float> fake(cache.k.slots() * cache.k.heads, 1.0f);
    cache.k.scales = rope::KvElement<E>::kScaled ? nullptr : fake.data();
    r.expect("scales", "cache.k.scales", "", [&] { attend(Logits{}, cache); });
    cache = r.c.cache;
    cache.k.heads = cache.v.heads = 1;
    r.expect("cache heads", "cache.k.heads", "the plan's shape.kv_heads = 2", [&] { attend(Logits{}, cache); });
    cache = r.c.cache;
    cache.k.pages -= 1;
    cache.v.pages -= 1;
    r.expect("cache pages", "cache.k.pages", "the plan's shape.pages", [&] { attend(Logits{}, cache); });
    cache = r.c.cache;
    cache.v.head_dim = 5;
    r.expect("cache v head_dim", "cache.v.head_dim", "the plan's shape.v_head_dim = 6",
             [&] { attend(Logits{}, cache); });
    cache = r.c.cache;
    cache.v.pages -= 1;
    r.expect("cache v pages", "cache.v.pages", "cache.k.pages", [&] { attend(Logits{}, cache); });
  }
  // attend reads a page shared by two sequences without complaint (only
  // append refuses to write into one).
  {
    std::vector<std::int32_t> table = r.c.table;
    table[1 * r.c.stride + 0] = r.c.table[0];
    Batch b = r.c.batch();
    b.block_table = table.data();
    Plan shared;
    ra::plan(shared, r.c.shape(4, 512), b);
    EXPECT_EQ(rope_test::thrown_message([&] { ra::attend(shared, r.c.cache, q, r.out_view()); }), "no exception");
  }
}

TEST(AttentionAttend, RefusalsNameTheArgumentAndWriteNothing) {
  for_each_element([](auto e) { check_refusals<decltype(e)>(); });
}

}  // namespace
