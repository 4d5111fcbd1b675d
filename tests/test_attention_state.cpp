// Partial softmax states merged (attention/state.hpp), against a long-double
// oracle of the merged softmax and against attend over the union of keys:
//   - merge of (out, lse) pairs of float, bf16 and f16 rows within the bound
//     of its roundings (derived below) of the oracle's merge;
//   - attend over two disjoint key sets (a prefix and a suffix of one
//     sequence's keys, each the cache of a sequence of its own, not causal),
//     merged, = attend over the union within the bound of the three calls
//     and the merge; the sink given to one part only;
//   - in place (out = out_a or out_b, lse = lse_a) the same bytes;
//   - a part of lse -inf is left out whatever its row holds, NaN rows too;
//     two such give zeros and -inf; a NaN lse gives a NaN row and lse;
//   - refusals name the argument and write nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include <rope/attention.hpp>

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
using rope_test::widen;

constexpr double kEps = std::numeric_limits<float>::epsilon();
constexpr double kU = kEps / 2;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInfF = std::numeric_limits<float>::infinity();

template <class T>
double unit_roundoff() {
  if (std::is_same<T, BFloat16>::value) return std::ldexp(1.0, -8);
  if (std::is_same<T, Float16>::value) return std::ldexp(1.0, -11);
  return kU;
}

template <class T>
const char* type_name() {
  return std::is_same<T, float>::value ? "f32" : std::is_same<T, BFloat16>::value ? "bf16" : "f16";
}

template <class T>
std::vector<T> rounded(const std::vector<float>& x) {
  std::vector<T> y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = T(x[i]);
  return y;
}

template <class T>
bool same_bytes(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// The rounding of merge_row on one row, to first order in u: with
// M = max(lse_a, lse_b) and exact weights w_a = exp(lse_a - lse),
// w_b = exp(lse_b - lse),
//   the carries exp(lse_x - M): the subtraction (u |lse_x - M|) and exp
//     (within an ulp: 2 u) move w_x by a relative theta_x, which moves the
//     weighted mean by w_x theta_x |x - out|;
//   acc = a c_a + b c_b rounds each product and the sum: u (w_a |a| + w_b |b| + |out|);
//   l = c_a + c_b, and out = acc / l: 2 u |out|;
//   the output type rounds once more: u_O |out| (with the inputs' own
//   errors, times 1.001 for the second-order terms);
//   lse = M + log(l): l's relative error (u plus the carries' thetas), log's
//   rounding (2 u |log l|) and the sum's (u |lse|).
struct MergeBound {
  double out = 0, lse = 0;
};
MergeBound merge_bound(double a, LD lse_a, double b, LD lse_b, LD out, LD lse, double u_out) {
  const LD top = std::max(lse_a, lse_b);
  const LD wa = std::exp(lse_a - lse), wb = std::exp(lse_b - lse);
  const LD ta = kU * std::fabs(lse_a - top) + 2 * kU, tb = kU * std::fabs(lse_b - top) + 2 * kU;
  MergeBound m;
  m.out = static_cast<double>(1.001L * (wa * ta * std::fabs(a - out) + wb * tb * std::fabs(b - out) +
                                        kU * (wa * std::fabs(a) + wb * std::fabs(b) + 3 * std::fabs(out)) +
                                        u_out * std::fabs(out)));
  m.lse = static_cast<double>(1.001L * (wa * ta + wb * tb + kU + 2 * kU * std::fabs(lse - top) + kU * std::fabs(lse)));
  return m;
}

// merge of random states of the three row types against the oracle's merge
// of the values they hold: lse spreads from equal to 60 apart, negative and
// positive, a part of -inf.
template <class A, class B, class O>
void check_merge_oracle() {
  const std::size_t tokens = 7, heads = 3, d = 13, rows = tokens * heads;
  const auto fa = rope_test::random_vector<float>(rows * d, 1, 2.0),
             fb = rope_test::random_vector<float>(rows * d, 2, 3.0);
  const std::vector<A> a = rounded<A>(fa);
  const std::vector<B> b = rounded<B>(fb);
  std::vector<float> lse_a(rows), lse_b(rows);
  std::mt19937 gen(3);
  std::uniform_real_distribution<float> base(-40.0f, 40.0f), gap(-60.0f, 60.0f);
  for (std::size_t r = 0; r < rows; ++r) {
    lse_a[r] = base(gen);
    lse_b[r] = r % 5 == 0 ? lse_a[r] : r % 7 == 1 ? -kInfF : lse_a[r] + gap(gen) * (r % 3 == 0 ? 0.01f : 1.0f);
  }
  std::vector<O> out(rows * d, O(-9.0f));
  std::vector<float> lse(rows, -9.0f);
  ra::merge(View<const A>::token_major(a.data(), tokens, heads, d), lse_a.data(),
            View<const B>::token_major(b.data(), tokens, heads, d), lse_b.data(),
            View<O>::token_major(out.data(), tokens, heads, d), lse.data());
  const std::string what = std::string(type_name<A>()) + " + " + type_name<B>() + " -> " + type_name<O>();
  double worst = 0;
  for (std::size_t r = 0; r < rows; ++r) {
    std::vector<LD> ra_(d), rb(d), want;
    for (std::size_t c = 0; c < d; ++c) ra_[c] = widen(a[r * d + c]), rb[c] = widen(b[r * d + c]);
    LD want_lse = 0;
    at::merge_states(ra_, lse_a[r], rb, lse_b[r], &want, &want_lse);
    if (std::isinf(lse_b[r])) {  // left out: a's row and lse as they are (rounded into O)
      for (std::size_t c = 0; c < d; ++c) {
        const O once(static_cast<float>(ra_[c]));
        ASSERT_EQ(std::memcmp(&out[r * d + c], &once, sizeof(O)), 0) << what << " row " << r;
      }
      ASSERT_EQ(lse[r], lse_a[r]) << what << " row " << r;
      continue;
    }
    for (std::size_t c = 0; c < d; ++c) {
      const MergeBound m = merge_bound(static_cast<double>(ra_[c]), lse_a[r], static_cast<double>(rb[c]), lse_b[r],
                                       want[c], want_lse, unit_roundoff<O>());
      const double err = std::fabs(static_cast<double>(widen(out[r * d + c])) - static_cast<double>(want[c]));
      ASSERT_LE(err, m.out) << what << " row " << r << " channel " << c << " lse " << lse_a[r] << ", " << lse_b[r];
      worst = std::max(worst, err / m.out);
      if (c == 0) {
        const double lerr = std::fabs(static_cast<double>(lse[r]) - static_cast<double>(want_lse));
        ASSERT_LE(lerr, m.lse) << what << " lse of row " << r;
      }
    }
  }
  if (std::getenv("ROPE_TEST_VERBOSE") != nullptr) std::cout << what << ": worst error / bound " << worst << "\n";
}

TEST(AttentionState, MergeMatchesTheLongDoubleMergeOfTheSoftmax) {
  check_merge_oracle<float, float, float>();
  check_merge_oracle<BFloat16, float, float>();
  check_merge_oracle<float, Float16, BFloat16>();
  check_merge_oracle<Float16, BFloat16, Float16>();
  check_merge_oracle<BFloat16, BFloat16, BFloat16>();
}

// In place: out the rows of out_a (or out_b) and lse that of lse_a (or
// lse_b): the bytes of the merge into other memory. Also through strided
// views (heads apart in memory).
TEST(AttentionState, MergeInPlaceGivesTheSameBytes) {
  const std::size_t tokens = 5, heads = 4, d = 9, rows = tokens * heads;
  const auto fa = rope_test::random_vector<float>(rows * d, 4), fb = rope_test::random_vector<float>(rows * d, 5);
  std::vector<float> lse_a = rope_test::random_vector<float>(rows, 6, 5.0);
  std::vector<float> lse_b = rope_test::random_vector<float>(rows, 7, 5.0);
  lse_b[3] = -kInfF;
  lse_a[8] = -kInfF;
  std::vector<float> want(rows * d), want_lse(rows);
  ra::merge(View<const float>::token_major(fa.data(), tokens, heads, d), lse_a.data(),
            View<const float>::token_major(fb.data(), tokens, heads, d), lse_b.data(),
            View<float>::token_major(want.data(), tokens, heads, d), want_lse.data());
  {
    std::vector<float> a = fa, la = lse_a;
    const auto av = View<float>::token_major(a.data(), tokens, heads, d);
    ra::merge(View<const float>(av), la.data(), View<const float>::token_major(fb.data(), tokens, heads, d),
              lse_b.data(), av, la.data());
    EXPECT_TRUE(same_bytes(a, want)) << "out = out_a";
    EXPECT_TRUE(same_bytes(la, want_lse)) << "lse = lse_a";
  }
  {
    std::vector<float> b = fb, lb = lse_b;
    const auto bv = View<float>::token_major(b.data(), tokens, heads, d);
    ra::merge(View<const float>::token_major(fa.data(), tokens, heads, d), lse_a.data(), View<const float>(bv),
              lb.data(), bv, lb.data());
    EXPECT_TRUE(same_bytes(b, want)) << "out = out_b";
    EXPECT_TRUE(same_bytes(lb, want_lse)) << "lse = lse_b";
  }
  {  // head-major rows with a gap after each head's tokens, in place
    const std::size_t head_stride = tokens * d + 3;
    std::vector<float> a(heads * head_stride, 123.0f);
    for (std::size_t t = 0; t < tokens; ++t) {
      for (std::size_t h = 0; h < heads; ++h) std::copy_n(&fa[(t * heads + h) * d], d, &a[h * head_stride + t * d]);
    }
    const View<float> av(a.data(), tokens, heads, d, d, head_stride);
    std::vector<float> la = lse_a;
    ra::merge(View<const float>(av), la.data(), View<const float>::token_major(fb.data(), tokens, heads, d),
              lse_b.data(), av, la.data());
    for (std::size_t t = 0; t < tokens; ++t) {
      for (std::size_t h = 0; h < heads; ++h) {
        EXPECT_EQ(std::memcmp(av.row(t, h), &want[(t * heads + h) * d], d * sizeof(float)), 0) << t << " " << h;
      }
    }
    for (std::size_t h = 0; h < heads; ++h) {
      for (std::size_t i = tokens * d; i < head_stride; ++i) EXPECT_EQ(a[h * head_stride + i], 123.0f) << "a gap";
    }
    EXPECT_TRUE(same_bytes(la, want_lse));
  }
}

// A part of lse -inf saw no key: left out whatever its row holds (NaN,
// Inf, garbage), the other part's row and lse as they are; two such: a
// zero row and -inf. A NaN lse gives NaN (row and lse) against a finite
// one and against a part of -inf alike: a state that is not one keeps
// nothing of either row.
TEST(AttentionState, EmptyPartsAreLeftOutAndNaNStaysNaN) {
  const std::size_t d = 6;
  const std::vector<float> row = {1.5f, -2.0f, 0.25f, 3.0f, -0.5f, 7.0f};
  const std::vector<float> nan_row = {kNaN, kInfF, -kInfF, kNaN, 1e30f, kNaN};
  auto merge_one = [&](const std::vector<float>& a, float la, const std::vector<float>& b, float lb,
                       std::vector<float>* out, float* lse) {
    out->assign(d, -1.0f);
    ra::merge(View<const float>::token_major(a.data(), 1, 1, d), &la, View<const float>::token_major(b.data(), 1, 1, d),
              &lb, View<float>::token_major(out->data(), 1, 1, d), lse);
  };
  std::vector<float> out;
  float lse = 0;
  merge_one(nan_row, -kInfF, row, 2.5f, &out, &lse);
  EXPECT_TRUE(same_bytes(out, row));
  EXPECT_EQ(lse, 2.5f);
  merge_one(row, -3.0f, nan_row, -kInfF, &out, &lse);
  EXPECT_TRUE(same_bytes(out, row));
  EXPECT_EQ(lse, -3.0f);
  merge_one(nan_row, -kInfF, nan_row, -kInfF, &out, &lse);
  EXPECT_TRUE(same_bytes(out, std::vector<float>(d, 0.0f)));
  EXPECT_EQ(lse, -kInfF);
  // bf16 rows of NaN left out too.
  {
    const std::vector<BFloat16> bad = rounded<BFloat16>(nan_row);
    std::vector<BFloat16> o(d, BFloat16(-1.0f));
    const float la = -kInfF, lb = 0.5f;
    ra::merge(View<const BFloat16>::token_major(bad.data(), 1, 1, d), &la,
              View<const float>::token_major(row.data(), 1, 1, d), &lb, View<BFloat16>::token_major(o.data(), 1, 1, d));
    EXPECT_TRUE(same_bytes(o, rounded<BFloat16>(row)));
  }
  for (const bool nan_first : {true, false}) {
    merge_one(row, nan_first ? kNaN : 1.0f, row, nan_first ? 1.0f : kNaN, &out, &lse);
    EXPECT_TRUE(std::isnan(lse)) << nan_first;
    for (float x : out) EXPECT_TRUE(std::isnan(x)) << nan_first;
  }
  merge_one(row, kNaN, row, -kInfF, &out, &lse);
  EXPECT_TRUE(std::isnan(lse));
  for (float x : out) EXPECT_TRUE(std::isnan(x));
  merge_one(row, -kInfF, row, kNaN, &out, &lse);
  EXPECT_TRUE(std::isnan(lse));
  for (float x : out) EXPECT_TRUE(std::isnan(x));
}

// One sequence's keys split into a prefix [0, P) and a suffix [P, L), each
// the cache of a sequence of its own, and the union [0, L) a third, all
// with the same n new queries and no mask (causal false): attend over the
// prefix and the suffix, merged, against attend over the union. Each attend
// row is within its oracle's bound of the exact partial softmax
// (test_attention_attend.cpp derives it), so the merge of the two is
// within w_a e_a + w_b e_b + (d_a + d_b) / 4 |out_a - out_b| (the weights
// of two states move by at most a quarter of their lse errors d) plus the
// merge's own rounding of the exact merged row, and the union within its
// own bound: the test holds the difference to their sum. The sink, a key
// of value zero, goes to one part only (its call has the sinks, the
// other's none).
TEST(AttentionState, AttendOverTwoKeySetsMergedEqualsAttendOverTheirUnion) {
  const std::size_t q_heads = 4, kv_heads = 2, d = 16, dv = 12, ps = 8;
  for (const auto& [prefix, total, n, split] :
       std::vector<std::tuple<std::size_t, std::size_t, std::size_t, std::size_t>>{
           {40, 100, 1, 512}, {40, 100, 1, 16}, {64, 65, 1, 64}, {17, 50, 3, 512}, {9, 10, 1, 4}}) {
    const std::size_t suffix = total - prefix, tokens = 3 * n;
    const auto k_all = rope_test::random_vector<float>(total * kv_heads * d, 20 + total, 1.5);
    const auto v_all = rope_test::random_vector<float>(total * kv_heads * dv, 21 + total, 2.0);
    const auto q1 = rope_test::random_vector<float>(n * q_heads * d, 22 + n, 1.5);
    std::vector<float> q;  // the same n queries for each of the three sequences
    for (int i = 0; i < 3; ++i) q.insert(q.end(), q1.begin(), q1.end());
    // Pages: prefix, suffix, union, each from its own pages of one pool.
    const std::size_t pa = (prefix + ps - 1) / ps, pb = (suffix + ps - 1) / ps, pu = (total + ps - 1) / ps;
    const std::size_t pages = pa + pb + pu, stride = pu;
    std::vector<float> kd(pages * ps * kv_heads * d, kNaN), vd(pages * ps * kv_heads * dv, kNaN);
    const ra::PagedCache<float> cache{ra::PagePool<float>::nhd(kd.data(), pages, ps, kv_heads, d),
                                      ra::PagePool<float>::nhd(vd.data(), pages, ps, kv_heads, dv)};
    std::vector<std::int32_t> table(3 * stride, 0);
    const std::size_t first_page[3] = {0, pa, pa + pb}, count[3] = {pa, pb, pu};
    const std::size_t first_key[3] = {0, prefix, 0}, keys[3] = {prefix, suffix, total};
    for (std::size_t s = 0; s < 3; ++s) {
      for (std::size_t i = 0; i < count[s]; ++i) table[s * stride + i] = static_cast<std::int32_t>(first_page[s] + i);
      for (std::size_t j = 0; j < keys[s]; ++j) {
        const std::size_t slot = (first_page[s] + j / ps) * ps + j % ps;
        for (std::size_t g = 0; g < kv_heads; ++g) {
          std::copy_n(&k_all[((first_key[s] + j) * kv_heads + g) * d], d, cache.k.row(slot, g));
          std::copy_n(&v_all[((first_key[s] + j) * kv_heads + g) * dv], dv, cache.v.row(slot, g));
        }
      }
    }
    const std::vector<std::int64_t> starts = {0, std::int64_t(n), std::int64_t(2 * n), std::int64_t(3 * n)};
    const std::vector<std::int64_t> lengths = {std::int64_t(prefix), std::int64_t(suffix), std::int64_t(total)};
    ra::Shape shape = ra::Shape::of(cache, q_heads);
    shape.kv_split = split;
    ra::Plan plan;
    ra::plan(plan, shape, ra::Batch{starts.data(), lengths.data(), table.data(), stride, 3});
    ra::Mask mask;
    mask.causal = false;
    ra::Logits with_sinks;
    with_sinks.sinks = {0.5, -1.0, 2.0, -std::numeric_limits<double>::infinity()};
    for (const bool sinks : {false, true}) {
      std::vector<float> out(tokens * q_heads * dv), lse(tokens * q_heads), out_b(out.size()), lse_b(lse.size());
      const auto qv = View<const float>::token_major(q.data(), tokens, q_heads, d);
      ra::attend(plan, cache, qv, View<float>::token_major(out.data(), tokens, q_heads, dv),
                 sinks ? with_sinks : ra::Logits{}, mask, lse.data());
      ra::attend(plan, cache, qv, View<float>::token_major(out_b.data(), tokens, q_heads, dv), ra::Logits{}, mask,
                 lse_b.data());
      // Prefix (with the sinks, if any) + suffix (without).
      std::vector<float> merged(n * q_heads * dv, -1.0f), merged_lse(n * q_heads, -1.0f);
      ra::merge(View<const float>::token_major(out.data(), n, q_heads, dv), lse.data(),
                View<const float>::token_major(out_b.data() + n * q_heads * dv, n, q_heads, dv),
                lse_b.data() + n * q_heads, View<float>::token_major(merged.data(), n, q_heads, dv), merged_lse.data());
      const std::string what = "prefix " + std::to_string(prefix) + " of " + std::to_string(total) + " n " +
                               std::to_string(n) + " split " + std::to_string(split) + (sinks ? " sinks" : "");
      // The exact partial and whole rows, and attend's bounds on them.
      const LD scale = 1.0L / std::sqrt(static_cast<LD>(d));
      for (std::size_t t = 0; t < n; ++t) {
        for (std::size_t h = 0; h < q_heads; ++h) {
          const std::size_t g = h / (q_heads / kv_heads), r = t * q_heads + h;
          const LD sink =
              sinks ? static_cast<LD>(static_cast<float>(with_sinks.sinks[h])) : -std::numeric_limits<LD>::infinity();
          std::vector<LD> s[3];
          at::Mat v[3];
          double eps_s[3] = {0, 0, 0}, max_v[3] = {0, 0, 0};
          for (std::size_t part = 0; part < 3; ++part) {
            for (std::size_t j = first_key[part]; j < first_key[part] + keys[part]; ++j) {
              LD dot = 0, mag = 0;
              for (std::size_t c = 0; c < d; ++c) {
                const LD x = static_cast<LD>(q1[r * d + c]) * k_all[(j * kv_heads + g) * d + c];
                dot += x;
                mag += std::fabs(x);
              }
              s[part].push_back(scale * dot);
              const float* vr = &v_all[(j * kv_heads + g) * dv];
              v[part].emplace_back(vr, vr + dv);
              eps_s[part] = std::max(
                  eps_s[part], static_cast<double>((d + 8) * kEps * scale * mag + 2 * kEps * std::fabs(scale * dot)));
              for (std::size_t c = 0; c < dv; ++c)
                max_v[part] = std::max(max_v[part], static_cast<double>(std::fabs(vr[c])));
            }
          }
          const at::SoftmaxRow ea = at::softmax_row(s[0], v[0], dv, sink);
          const at::SoftmaxRow eb = at::softmax_row(s[1], v[1], dv, -std::numeric_limits<LD>::infinity());
          const at::SoftmaxRow eu = at::softmax_row(s[2], v[2], dv, sink);
          // A structured binding is not captured by a lambda in C++17 (clang 14 refuses it).
          const std::size_t split_keys = split;
          auto bounds = [&](std::size_t part, const at::SoftmaxRow& e, double* out_bound, double* lse_bound) {
            const double n_keys = static_cast<double>(keys[part]);
            const double parts = n_keys / static_cast<double>(split_keys) + 2;
            *out_bound = max_v[part] * (2 * eps_s[part] + (3 * n_keys + 6 * parts + 30) * kEps);
            *lse_bound =
                eps_s[part] + (n_keys + 6 * parts + 10) * kEps + 2 * kEps * std::fabs(static_cast<double>(e.lse));
          };
          double oa, la, ob, lb, ou, lu;
          bounds(0, ea, &oa, &la);
          bounds(1, eb, &ob, &lb);
          bounds(2, eu, &ou, &lu);
          const LD wa = std::exp(ea.lse - eu.lse), wb = std::exp(eb.lse - eu.lse);
          // The merged lse of the exact parts is the union's.
          ASSERT_NEAR(static_cast<double>(std::log(std::exp(ea.lse - eu.lse) + std::exp(eb.lse - eu.lse))), 0.0, 1e-15);
          for (std::size_t c = 0; c < dv; ++c) {
            const double got = merged[r * dv + c], whole = out[(2 * n + t) * q_heads * dv + h * dv + c];
            const MergeBound m = merge_bound(static_cast<double>(ea.out[c]), ea.lse, static_cast<double>(eb.out[c]),
                                             eb.lse, eu.out[c], eu.lse, kU);
            const double allowed = static_cast<double>(wa) * oa + static_cast<double>(wb) * ob +
                                   (la + lb) / 4 * std::fabs(static_cast<double>(ea.out[c] - eb.out[c])) + m.out + ou;
            ASSERT_LE(std::fabs(got - whole), allowed) << what << " token " << t << " head " << h << " channel " << c;
            ASSERT_LE(std::fabs(got - static_cast<double>(eu.out[c])), allowed - ou) << what << " vs the oracle";
          }
          // lse: each part's error moves the merged one by at most the larger.
          const MergeBound m = merge_bound(0, ea.lse, 0, eb.lse, 0, eu.lse, 0);
          const double whole_lse = lse[(2 * n + t) * q_heads + h];
          ASSERT_LE(std::fabs(merged_lse[r] - whole_lse), std::max(la, lb) + m.lse + lu)
              << what << " lse of token " << t << " head " << h;
        }
      }
    }
  }
}

// Refusals: each names its argument, and nothing is written (out, lse, and
// the inputs).
TEST(AttentionState, RefusalsNameTheArgumentAndWriteNothing) {
  const std::size_t tokens = 3, heads = 2, d = 5, rows = tokens * heads;
  std::vector<float> a = rope_test::random_vector<float>(rows * d + 8, 30);
  std::vector<float> b = rope_test::random_vector<float>(rows * d, 31);
  std::vector<float> out(rows * d + 8, -4.0f), la(rows + 4, 1.0f), lb(rows + 4, 2.0f), lse(rows + 4, -3.0f);
  auto expect = [&](const std::string& what, const std::string& argument, const std::string& value, auto call) {
    SCOPED_TRACE(what);
    const auto a0 = a, b0 = b, out0 = out, la0 = la, lb0 = lb, lse0 = lse;
    const std::string msg = rope_test::thrown_message(call);
    EXPECT_EQ(msg.rfind("rope::attention::merge: " + argument + " must be ", 0), 0u) << msg;
    rope_test::expect_names(msg, argument, value);
    EXPECT_TRUE(same_bytes(a, a0) && same_bytes(b, b0) && same_bytes(la, la0) && same_bytes(lb, lb0))
        << "an input was written";
    EXPECT_TRUE(same_bytes(out, out0)) << "out was written";
    EXPECT_TRUE(same_bytes(lse, lse0)) << "lse was written";
  };
  const auto av = View<const float>::token_major(a.data(), tokens, heads, d);
  const auto bv = View<const float>::token_major(b.data(), tokens, heads, d);
  const auto ov = View<float>::token_major(out.data(), tokens, heads, d);
  expect("out_b heads", "out_b.heads", "out_a.heads = 2", [&] {
    ra::merge(av, la.data(), View<const float>::token_major(b.data(), tokens, 1, d), lb.data(), ov, lse.data());
  });
  expect("out_b head_dim", "out_b.head_dim", "out_a.head_dim = 5", [&] {
    ra::merge(av, la.data(), View<const float>::token_major(b.data(), tokens, heads, 4), lb.data(), ov, lse.data());
  });
  expect("out tokens", "out.tokens", "out_a.tokens = 3", [&] {
    ra::merge(av, la.data(), bv, lb.data(), View<float>::token_major(out.data(), 2, heads, d), lse.data());
  });
  expect("lse_a null", "lse_a", "non-null (6 floats)",
         [&] { ra::merge(av, static_cast<const float*>(nullptr), bv, lb.data(), ov, lse.data()); });
  expect("lse_b null", "lse_b", "non-null (6 floats)",
         [&] { ra::merge(av, la.data(), bv, static_cast<const float*>(nullptr), ov, lse.data()); });
  expect("out overlaps out_a", "out", "", [&] {
    ra::merge(View<const float>::token_major(out.data() + 1, tokens, heads, d), la.data(), bv, lb.data(), ov,
              lse.data());
  });
  expect("out overlaps out_b", "out", "", [&] {
    ra::merge(av, la.data(), View<const float>::token_major(out.data() + 3, tokens, heads, d), lb.data(), ov,
              lse.data());
  });
  {  // out_a's own rows, but as another type: not an in-place call
    std::vector<BFloat16> ab(rows * d * 2, BFloat16(1.0f));
    const auto ab0 = ab;
    expect("out over out_a's rows of another type", "out", "", [&] {
      ra::merge(View<const BFloat16>::token_major(ab.data(), tokens, heads, d), la.data(), bv, lb.data(),
                View<float>::token_major(reinterpret_cast<float*>(ab.data()), tokens, heads, d), lse.data());
    });
    EXPECT_TRUE(same_bytes(ab, ab0));
  }
  expect("lse overlaps out", "lse", "memory apart from out",
         [&] { ra::merge(av, la.data(), bv, lb.data(), ov, out.data() + 4); });
  expect("lse overlaps lse_a, not itself", "lse", "lse_a itself or apart",
         [&] { ra::merge(av, la.data(), bv, lb.data(), ov, la.data() + 1); });
  expect("lse overlaps lse_b, not itself", "lse", "lse_b itself or apart",
         [&] { ra::merge(av, la.data(), bv, lb.data(), ov, lb.data() + 1); });
  // out is written while lse_a and lse_b are read, lse while out_a and
  // out_b are: overlaps read what was already overwritten.
  expect("out overlaps lse_a", "out", "memory apart from lse_a",
         [&] { ra::merge(av, out.data() + 2, bv, lb.data(), ov, lse.data()); });
  expect("out overlaps lse_b", "out", "memory apart from lse_b",
         [&] { ra::merge(av, la.data(), bv, out.data() + 7, ov, lse.data()); });
  expect("lse overlaps out_a", "lse", "memory apart from out_a",
         [&] { ra::merge(av, la.data(), bv, lb.data(), ov, a.data() + 3); });
  expect("lse overlaps out_b", "lse", "memory apart from out_b",
         [&] { ra::merge(av, la.data(), bv, lb.data(), ov, b.data() + 1); });
  // Zero rows: no lse needed, nothing read.
  EXPECT_EQ(rope_test::thrown_message([&] {
              ra::merge(View<const float>::token_major(a.data(), 0, heads, d), static_cast<const float*>(nullptr),
                        View<const float>::token_major(b.data(), 0, heads, d), static_cast<const float*>(nullptr),
                        View<float>::token_major(out.data(), 0, heads, d));
            }),
            "no exception");
}

}  // namespace
