// Multi-head latent attention over a paged latent cache
// (attention/mla_attend.hpp, cache.hpp's LatentCache, plan.hpp), against
// the long-double oracle of the UNABSORBED form with the caller's weights
// (mla_oracle.hpp: W_UK_h and W_UV_h per head, the keys W_UK_h c_j | k_pe_j,
// the values W_UV_h c_j), rope's latent rows projected by W_UV_h in long
// double:
//   - every cache type (f32, bf16, f16, int8) over the rows it stores, read
//     back, within the float bound mla_oracle.hpp derives; a mixed batch
//     (decode tokens split into parts of kv_split 5, 7, 16, 256 and 512, a
//     prompt in several blocks of tokens, a chunk over more than one block of
//     256 keys, a one-key sequence, one without new tokens), pages not in
//     order; causal and not, a window, a softcap, sinks (one of them -inf),
//     the log-sum-exp; the widths of DeepSeek V3's cache (512 + 64);
//   - the same bytes for any thread count and executor, and over a cache
//     whose rows and pages have room between them (its padding untouched);
//   - bf16 and f16 queries and outputs: the float call rounded once;
//   - a NaN row reaches only the tokens that see it, also inside a block of
//     a prompt's tokens, where earlier tokens mask it;
//   - one sequence over a contiguous latent cache (the one-sequence plan):
//     its decode steps write the cache a prompt of the same tokens writes,
//     and their rows and the one-shot causal call's are each within the
//     oracle's bound (not the same bits: a decode token is a GEMM of one row
//     per head, a prompt's token one row of a block of them).
// The MLA append: test_attention_mla_append.cpp; refusals:
// test_attention_mla_refusals.cpp; sparse lists: test_attention_sparse.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <rope/attention.hpp>
#include <rope/attention/cascade_tiles.hpp>  // level_tiles_run, which a compiled attention library does not bring
#include <rope/kernels/kv_products.hpp>      // products_hardware_allowed, likewise

#include "executors.hpp"
#include "kv_elements.hpp"
#include "mla_oracle.hpp"

namespace {

using namespace mla_test;  // NOLINT: the suite's own fixture
using rope::View;
using rope_test::element_name;
using rope_test::for_each_element;

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Case {
  std::string name;
  Dims dims;
  std::vector<Seq> seqs;
  std::size_t page_size;
  rope::Style style;
  double bound_limit;  // the largest bound, relative to max |c|, the case may need
};

// A decode token over more than one block of 256 keys, a prompt of more
// tokens than a block of rows (512 / heads), a chunk after 291 keys, a
// one-key sequence, one without new tokens; DeepSeek V3's widths; 48
// heads (blocks of 10 tokens) over a narrow cache.
std::vector<Case> cases() {
  return {
      {"16 heads, 40 + 8",
       {16, 40, 8, 12, 10},
       {{1, 290}, {40, 40}, {9, 300}, {0, 10}, {1, 1}, {1, 37}},
       8,
       rope::Style::block_diagonal,
       2e-3},
      {"8 heads, 512 + 64",
       {8, 512, 64, 32, 16},
       {{1, 300}, {5, 262}, {66, 66}},
       64,
       rope::Style::block_diagonal,
       8e-3},
      {"48 heads, 24 + 4", {48, 24, 4, 8, 6}, {{23, 23}, {1, 40}, {3, 17}}, 5, rope::Style::rotate_half, 2e-3},
  };
}

// The options of the calls: the model's scale (MLA has no default), causal
// or not, a window, a softcap, sinks with one of them -inf, small kv_splits.
std::vector<std::pair<std::string, Call>> calls(const Model& m, bool all) {
  std::vector<std::pair<std::string, Call>> out;
  Call c;
  c.logits.scale = m.scale;
  out.emplace_back("causal", c);
  c.kv_split = 5;
  c.logits.softcap = 3.0;
  c.logits.sinks.assign(m.d.heads, 0.5);
  c.logits.sinks[1] = -kInf;
  c.logits.sinks[0] = 4.0;  // above the cap: a sink is not capped
  out.emplace_back("split 5, softcap 3, sinks", c);
  if (!all) return out;
  c = {};
  c.logits.scale = m.scale;
  c.mask.window = 7;
  c.kv_split = 7;
  out.emplace_back("window 7, split 7", c);
  c = {};
  c.logits.scale = m.scale;
  c.mask.causal = false;
  c.kv_split = 16;
  out.emplace_back("not causal, split 16", c);
  c.mask.window = 20;
  c.logits.sinks.assign(m.d.heads, -1.0);
  c.logits.sinks[0] = -kInf;
  out.emplace_back("not causal, window 20, split 16, sinks", c);
  c = {};
  c.logits.scale = 0.5 * m.scale;
  c.logits.softcap = 1.5;
  c.mask.window = 33;
  c.kv_split = 256;
  out.emplace_back("scale / 2, softcap 1.5, window 33, split 256", c);
  return out;
}

// One test per cache type, so that CTest runs them side by side (under
// the sanitizers the six took 52 s in one test).
template <class E>
class MlaAttendOracle : public ::testing::Test {};
using CacheElements =
    ::testing::Types<float, rope::BFloat16, rope::Float16, std::int8_t, rope::Float8E4M3, rope::Float8E5M2>;
struct ElementNames {
  template <class E>
  static std::string GetName(int) {
    return element_name<E>();
  }
};
TYPED_TEST_SUITE(MlaAttendOracle, CacheElements, ElementNames);

TYPED_TEST(MlaAttendOracle, MatchesTheUnabsorbedOracle) {
  using E = TypeParam;
  for (const Case& k : cases()) {
    const Model m(k.dims, k.seqs, k.page_size, 7, k.style);
    // Where long double is software (kv_elements.hpp), f16 and fp8 take
    // the narrower cases' first two calls only: their decode is what
    // differs, and the masks and windows are every type's alike.
    const bool all_calls = rope_test::widest_case_runs<E>();
    if (k.dims.latent >= 512 && !all_calls) continue;
    Store<E> st(m.lay, m.d);
    const std::vector<float> q_pe = write(m, st);
    const Stored rows = stored(m, st);
    for (const auto& [name, c] : calls(m, k.dims.latent < 512 && all_calls)) {
      const std::string what = k.name + ", " + element_name<E>() + ", " + name;
      const Result got = attend(m, st, q_pe, c);
      const Expected want = oracle(m, rows, q_pe, c);
      const double worst = expect_near(m, got, want, what);
      EXPECT_LE(worst, 1.0) << what;
      double widest = 0;
      for (const double r : want.lat_bound_rel) widest = std::max(widest, r);
      // The bound is not vacuous: a fraction of the values' size.
      EXPECT_LE(widest, k.bound_limit) << what;
      if (std::getenv("ROPE_TEST_VERBOSE") != nullptr) {
        std::cout << what << ": worst error / bound " << worst << ", widest bound / max|c| " << widest << "\n";
      }
    }
  }
}

// The bf16 product mode over a bf16 latent cache (docs/attention.md,
// "Product modes"): q and the weights rounded to bf16, on AMX tiles where
// they run (one key/value head: every query head's rows read each cache
// row once), else float GEMMs over the rounded values. Within the mode's
// bound (mla_oracle.hpp) of the unabsorbed oracle, with the tiles and
// without, for every call of the cases (decode parts, prompts in blocks,
// windows, softcaps, sinks); the same bytes for 1 and 3 threads.
TEST(MlaAttend, Bf16ProductsWithinTheirBoundOnTilesAndWithout) {
  const bool tiles = ra::detail::level_tiles_run<xsimd::default_arch>();
  std::cout << "[ tiles ] MLA on AMX tiles here: " << (tiles ? "yes" : "no (the float GEMMs only)") << "\n";
  for (const Case& k : cases()) {
    const Model m(k.dims, k.seqs, k.page_size, 17, k.style);
    Store<rope::BFloat16> st(m.lay, m.d);
    const std::vector<float> q_pe = write(m, st);
    const Stored rows = stored(m, st);
    double worst[2] = {0, 0};  // with the tiles, without
    for (auto [name, c] : calls(m, k.dims.latent < 512)) {
      c.products = rope::Products::bf16;
      const Expected want = oracle(m, rows, q_pe, c);
      for (const bool hardware : {true, false}) {
        if (!hardware && !tiles) continue;  // the same path twice
        rope::detail::products_hardware_allowed() = hardware;
        const std::string what = k.name + ", " + name + (hardware ? "" : ", without the hardware");
        c.threads = 1;
        const Result got = attend(m, st, q_pe, c);
        worst[hardware ? 0 : 1] = std::max(worst[hardware ? 0 : 1], expect_near(m, got, want, what));
        c.threads = 3;
        EXPECT_TRUE(attend(m, st, q_pe, c).same_bytes(got)) << what << ", 3 threads";
      }
      rope::detail::products_hardware_allowed() = true;
    }
    for (const bool hardware : {true, false}) {
      if (!hardware && !tiles) continue;
      const double w = worst[hardware ? 0 : 1];
      std::cout << "[ tiles ] " << k.name << (hardware ? "" : ", without the hardware") << ": largest error " << w
                << " of the bound\n";
      EXPECT_LE(w, 1.0);
      EXPECT_GT(w, 0.0) << "a bound no row comes near cannot fail";
    }
  }
}

// Threads 1, 2, 3, a pool's executor and one that runs the shares in
// reverse: the same bytes of out and lse, for every cache type, with
// decode tokens split into parts and a prompt in several blocks.
TEST(MlaAttend, SameBytesForAnyThreadCountAndExecutor) {
  const Case k = cases()[0];
  const Model m(k.dims, k.seqs, k.page_size, 11, k.style);
  rope_test::ThreadPool pool(3);
  rope_test::ReverseExecutor reverse;
  for_each_element([&](auto e) {
    using E = decltype(e);
    Store<E> st(m.lay, m.d);
    const std::vector<float> q_pe = write(m, st);
    for (auto [name, c] : calls(m, true)) {
      c.threads = 1;
      const Result one = attend(m, st, q_pe, c);
      for (const rope::Threads& t :
           {rope::Threads(2), rope::Threads(3), rope::Threads(pool.executor(3)), rope::Threads(reverse.executor(4))}) {
        c.threads = t;
        EXPECT_TRUE(attend(m, st, q_pe, c).same_bytes(one)) << element_name<E>() << ", " << name;
      }
    }
  });
  EXPECT_GT(pool.tasks_run(), 0u);
  EXPECT_GT(reverse.tasks_run, 0u);
}

// The write of the cache does not depend on the threads either: the
// append's rows and q_pe with 1 and 3 threads, byte for byte.
TEST(MlaAttend, AppendSameBytesForAnyThreadCount) {
  const Case k = cases()[0];
  const Model m(k.dims, k.seqs, k.page_size, 12, k.style);
  for_each_element([&](auto e) {
    using E = decltype(e);
    Store<E> one(m.lay, m.d), three(m.lay, m.d);
    const std::vector<float> q1 = write(m, one, 1), q3 = write(m, three, 3);
    EXPECT_TRUE(one.same_bytes(three)) << element_name<E>();
    EXPECT_TRUE(same_bytes(q1, q3)) << element_name<E>();
  });
}

// One sequence over a contiguous latent cache, with the one-sequence plan:
// a prompt of 5 tokens, then a decode step per token (plan(p, shape,
// cached, 1)), against one causal call over the same 29 tokens (plan(p,
// shape, 0, 29)). The steps write the cache, byte for byte, that the
// one-shot append writes, and the same q_pe; each step's rows are the
// one-shot call's within their oracle bound (a decode token is one GEMM
// row per head, a prompt's token one of a block of them: the float sums
// may differ in their last bits), and so are the one-shot call's.
TEST(MlaAttend, DecodeStepsOverAContiguousCacheAreTheOneShotCall) {
  constexpr std::size_t kTokens = 29, kPrompt = 5, kCapacity = 40;
  Model m({8, 32, 8, 8, 8}, {{kTokens, kTokens}}, kCapacity, 21);
  m.lay.pages = 1;  // one page of the capacity: a contiguous cache
  m.lay.stride = 1;
  m.lay.table = {0};
  const std::size_t H = m.d.heads, L = m.d.latent, R = m.d.rope;
  const auto c_kv = m.rows(true, false), k_pe = m.rows(false, false);
  Call call;
  call.logits.scale = m.scale;
  call.logits.sinks.assign(H, 0.25);
  call.kv_split = 6;
  for_each_element([&](auto e) {
    using E = decltype(e);
    const std::string what = element_name<E>();
    Store<E> once(m.lay, m.d), steps(m.lay, m.d);
    for (Store<E>* st : {&once, &steps}) {
      st->cache = ra::LatentCache<E>::contiguous(st->data.data(), kCapacity, L, R,
                                                 st->scales.empty() ? nullptr : st->scales.data());
    }
    const ra::AppendOptions o = m.append_options();
    ra::Shape shape = ra::Shape::of(once.cache, H);
    shape.kv_split = call.kv_split;
    // A step of tokens [from, to): append, then attend; its rows into r.
    std::vector<float> q_pe_steps(kTokens * H * R), q_pe_once(kTokens * H * R);
    Result r_steps{std::vector<float>(kTokens * H * L, -777.0f), std::vector<float>(kTokens * H, -555.0f)};
    Result r_once = r_steps;
    auto step = [&](Store<E>& st, std::vector<float>& q_pe, Result& r, std::size_t from, std::size_t to) {
      ra::Plan p;
      ra::plan(p, shape, from, to - from);
      const std::size_t n = to - from;
      ra::append(p, st.cache, rope::View<const float>::token_major(&c_kv[from * L], n, 1, L),
                 rope::View<const float>::token_major(&k_pe[from * R], n, 1, R),
                 rope::View<const float>::token_major(&m.q_pe[from * H * R], n, H, R),
                 rope::View<float>::token_major(&q_pe[from * H * R], n, H, R), o);
      ra::attend(p, st.cache, rope::View<const float>::token_major(&m.q_lat[from * H * L], n, H, L),
                 rope::View<const float>::token_major(&q_pe[from * H * R], n, H, R),
                 rope::View<float>::token_major(&r.out[from * H * L], n, H, L), call.logits, ra::Mask{},
                 &r.lse[from * H]);
    };
    step(once, q_pe_once, r_once, 0, kTokens);
    step(steps, q_pe_steps, r_steps, 0, kPrompt);
    for (std::size_t t = kPrompt; t < kTokens; ++t) step(steps, q_pe_steps, r_steps, t, t + 1);
    EXPECT_TRUE(once.same_bytes(steps)) << what;
    EXPECT_TRUE(same_bytes(q_pe_once, q_pe_steps)) << what;
    const Expected want = oracle(m, stored(m, once), q_pe_once, call);
    EXPECT_LE(expect_near(m, r_once, want, what + " one shot"), 1.0);
    EXPECT_LE(expect_near(m, r_steps, want, what + " steps"), 1.0);
    std::size_t same = 0;
    for (std::size_t i = 0; i < r_once.out.size(); ++i) same += r_once.out[i] == r_steps.out[i];
    if (std::getenv("ROPE_TEST_VERBOSE") != nullptr) {
      std::cout << what << ": " << same << " of " << r_once.out.size() << " values the same bits\n";
    }
  });
}

// Rows and pages with room between them (token_stride past the width,
// page_stride past the page's rows): the same bytes out as the dense cache
// of the same rows, and the room left as it was.
TEST(MlaAttend, PaddedRowsAndPagesAreTheDenseCachesBytes) {
  const Case k = cases()[0];
  const Model m(k.dims, k.seqs, k.page_size, 13, k.style);
  const std::size_t W = m.d.width(), ps = m.lay.page_size, row_stride = W + 5, page_stride = ps * row_stride + 7;
  for_each_element([&](auto e) {
    using E = decltype(e);
    Store<E> dense(m.lay, m.d), padded(m.lay, m.d);
    padded.data.assign(m.lay.pages * page_stride, poison<E>());
    padded.cache.token_stride = row_stride;
    padded.cache.page_stride = page_stride;
    padded.rebind();
    const std::vector<E> room = padded.data;
    const std::vector<float> q_dense = write(m, dense), q_padded = write(m, padded);
    ASSERT_TRUE(same_bytes(q_dense, q_padded));
    for (const auto& [name, c] : calls(m, true)) {
      EXPECT_TRUE(attend(m, padded, q_padded, c).same_bytes(attend(m, dense, q_dense, c)))
          << element_name<E>() << ", " << name;
    }
    // Every element outside the rows: untouched.
    for (std::size_t i = 0; i < padded.data.size(); ++i) {
      const std::size_t in_page = i % page_stride;
      if (in_page < ps * row_stride && in_page % row_stride < W) continue;
      ASSERT_EQ(std::memcmp(&padded.data[i], &room[i], sizeof(E)), 0) << element_name<E>() << ": element " << i;
    }
  });
}

// bf16 and f16 queries and outputs: the float call on the widened queries,
// its rows rounded once (out), the same log-sum-exp.
template <class Q, class O>
void expect_rounded_float_call(const Model& m, const Store<std::int8_t>& st, const std::vector<float>& q_pe,
                               const Call& c) {
  const std::size_t T = m.lay.tokens(), H = m.d.heads, L = m.d.latent, R = m.d.rope;
  std::vector<Q> ql, qp;
  std::vector<float> ql_f, qp_f;
  for (const float x : m.q_lat) ql.push_back(Q(x)), ql_f.push_back(rope_test::widen(ql.back()));
  for (const float x : q_pe) qp.push_back(Q(x)), qp_f.push_back(rope_test::widen(qp.back()));
  ra::Plan p;
  ra::plan(p, m.shape(c.kv_split), m.lay.batch(), c.threads);
  std::vector<float> out_f(T * H * L), lse_f(T * H), lse(T * H);
  std::vector<O> out(T * H * L, O(-7.0f));
  ra::attend(p, st.cache, View<const float>::token_major(ql_f.data(), T, H, L),
             View<const float>::token_major(qp_f.data(), T, H, R), View<float>::token_major(out_f.data(), T, H, L),
             c.logits, c.mask, lse_f.data());
  ra::attend(p, st.cache, View<const Q>::token_major(ql.data(), T, H, L),
             View<const Q>::token_major(qp.data(), T, H, R), View<O>::token_major(out.data(), T, H, L), c.logits,
             c.mask, lse.data());
  for (std::size_t i = 0; i < out.size(); ++i) {
    const O want(out_f[i]);
    ASSERT_EQ(std::memcmp(&out[i], &want, sizeof(O)), 0) << "value " << i;
  }
  EXPECT_TRUE(same_bytes(lse, lse_f));
}

TEST(MlaAttend, SixteenBitQueriesAndOutputsAreTheFloatCallRoundedOnce) {
  const Case k = cases()[0];
  const Model m(k.dims, k.seqs, k.page_size, 14, k.style);
  Store<std::int8_t> st(m.lay, m.d);
  const std::vector<float> q_pe = write(m, st);
  const Call c = calls(m, false)[1].second;
  expect_rounded_float_call<rope::BFloat16, rope::BFloat16>(m, st, q_pe, c);
  expect_rounded_float_call<rope::Float16, rope::Float16>(m, st, q_pe, c);
  expect_rounded_float_call<rope::BFloat16, float>(m, st, q_pe, c);
}

// A NaN in the row of one position of a prompt (in its c_kv, so the whole
// stored latent part; int8: its scale) reaches only the tokens that see it:
// those are NaN, while the prompt's tokens that do not (earlier ones, in
// the same block of rows, which mask it; those past a window) and every
// other sequence's tokens stay within the oracle's bound.
TEST(MlaAttend, ANaNRowReachesOnlyTheTokensThatSeeIt) {
  constexpr std::int64_t kNaNPosition = 10;
  Model m({16, 40, 8, 12, 10}, {{1, 37}, {20, 20}, {1, 300}}, 8, 15);
  for (std::size_t x = 0; x < m.d.latent; x += 7) m.c_kv[1][kNaNPosition * m.d.latent + x] = kNaN;
  const std::size_t H = m.d.heads, L = m.d.latent;
  for_each_element([&](auto e) {
    using E = decltype(e);
    Store<E> st(m.lay, m.d);
    const std::vector<float> q_pe = write(m, st);
    const Stored rows = stored(m, st);
    for (auto [name, c] : calls(m, true)) {
      const Result got = attend(m, st, q_pe, c);
      const Expected want = oracle(m, rows, q_pe, c);
      for (std::size_t t = 0; t < m.lay.tokens(); ++t) {
        const std::vector<std::int64_t> keys = keys_of(m.lay, c.mask, t);
        const bool sees = m.lay.sequence_of(t) == 1 && std::find(keys.begin(), keys.end(), kNaNPosition) != keys.end();
        for (std::size_t h = 0; h < H; ++h) {
          for (std::size_t x = 0; x < L; ++x) {
            const std::size_t i = (t * H + h) * L + x;
            if (sees) {
              ASSERT_TRUE(std::isnan(got.out[i])) << element_name<E>() << ", " << name << ": token " << t;
            } else {
              ASSERT_LE(std::fabs(static_cast<LD>(got.out[i]) - want.lat[i]), want.lat_bound[i])
                  << element_name<E>() << ", " << name << ": token " << t << " head " << h;
            }
          }
        }
      }
    }
  });
}

}  // namespace
