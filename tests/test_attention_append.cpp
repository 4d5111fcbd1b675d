// rope::attention::append (attention/append.hpp), the fused form, against
// the unfused composition its header documents (append_fixture.hpp): the
// plain RMSNorm loop, rope::apply on float rows with the same table,
// pairing, rotary width and the plan's positions, then one rounding into
// each stored type (store_kv_row; int8: quantized the same way) into each
// new token's slot. Bit for bit, over input, q_out and cache types, both
// pairings, partial rotary, grouped-query heads, every norm form (per head,
// whole projection, plus_one), one sequence and a batch (decode, chunk,
// prefill and a sequence without new tokens), NHD and HND pools, a fused
// QKV buffer, K's write-back, streamed and cached stores, threads and
// executors, long calls (the norm one head at a time) against the same
// tokens one call each, a contiguous cache (a pool of one page); NaN
// confined to its own token; multi-axis positions (options.pair_axes)
// against the norm, rope::apply_mrope on float rows and the rounded writes,
// and against the one-position call when every axis holds the same
// positions. Refusals: test_attention_append_refusals.cpp; each
// architecture: test_attention_append_archs.cpp; the K/V form:
// test_attention_writer.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include <rope/apply.hpp>
#include <rope/attention.hpp>
#include <rope/frequencies.hpp>
#include <rope/multi_axis.hpp>
#include <rope/table.hpp>

#include "append_fixture.hpp"
#include "executors.hpp"
#include "support.hpp"

namespace {

using namespace append_test;  // NOLINT: the suite's own fixture

// The plan's positions and slots are the header's (derived here apart from
// the plan), for one sequence and for a batch.
TEST(Append, PlanPositionsAndSlotsAreTheHeaders) {
  for (const bool batch : {false, true}) {
    Case c;
    c.batch = batch;
    c.tokens = 9;
    const Fixture<float, float, float> s(c);
    ra::Plan p;
    s.plan(p);
    ASSERT_EQ(p.tokens(), c.tokens);
    for (std::size_t t = 0; t < c.tokens; ++t) {
      EXPECT_EQ(p.position(t), s.lay.positions[t]) << "batch " << batch << " token " << t;
      EXPECT_EQ(p.positions()[t], s.lay.positions[t]) << "batch " << batch << " token " << t;
      EXPECT_EQ(p.slot(t), s.lay.slots[t]) << "batch " << batch << " token " << t;
    }
  }
}

// Every pairing of the cases that change what is computed, for one type triple.
template <class In, class QO, class E>
void sweep(bool in_place) {
  for (const Style style : {Style::rotate_half, Style::block_diagonal}) {
    for (const std::size_t rotary : {std::size_t{0}, std::size_t{20}}) {
      for (const NormKind norm : {NormKind::none, NormKind::per_head, NormKind::whole}) {
        for (const bool plus_one : {false, true}) {
          if (norm == NormKind::none && plus_one) continue;
          for (int layout = 0; layout < 4; ++layout) {
            Case c;
            c.style = style;
            c.rotary_dim = rotary;
            c.norm = norm;
            c.plus_one = plus_one;
            c.batch = layout & 1;
            c.hnd = layout & 2;
            c.fused = layout == 1 || layout == 2;
            c.write_back = layout >= 2;
            c.in_place = in_place;
            expect_matches_unfused<In, QO, E>(c, describe(c));
            // Streamed cache rows: the same bytes.
            c.stores = rope::Stores::streaming;
            c.threads = layout == 3 ? 2 : 1;
            expect_matches_unfused<In, QO, E>(c, describe(c) + " streaming");
          }
        }
      }
    }
  }
}

template <class In, class E>
void sweep_q_out_types() {
  sweep<In, In, E>(true);
  sweep<In, float, E>(false);
  if (std::is_same<In, float>::value) sweep<In, BFloat16, E>(false);
}

TEST(Append, MatchesUnfusedFloatInput) {
  sweep_q_out_types<float, float>();
  sweep_q_out_types<float, BFloat16>();
  sweep_q_out_types<float, Float16>();
  sweep_q_out_types<float, I8>();
}
TEST(Append, MatchesUnfusedBFloat16Input) {
  sweep_q_out_types<BFloat16, float>();
  sweep_q_out_types<BFloat16, BFloat16>();
  sweep_q_out_types<BFloat16, Float16>();
  sweep_q_out_types<BFloat16, I8>();
  sweep<BFloat16, Float16, BFloat16>(false);
}
TEST(Append, MatchesUnfusedFloat16Input) {
  sweep_q_out_types<Float16, float>();
  sweep_q_out_types<Float16, BFloat16>();
  sweep_q_out_types<Float16, Float16>();
  sweep_q_out_types<Float16, I8>();
}

// Calls of more tokens per worker than kGroupedNormTokens normalize one
// head at a time (a prefill), fewer four at a time: both give the
// unfused bits, with the float path that normalizes Q as the rotation loads
// it and with the widening path, in place and out of place.
TEST(Append, MatchesUnfusedPastTheGroupedNormTokens) {
  for (const Style style : {Style::rotate_half, Style::block_diagonal}) {
    for (const std::size_t rotary : {std::size_t{0}, std::size_t{20}}) {
      for (const bool plus_one : {false, true}) {
        Case c;
        c.tokens = ra::kGroupedNormTokens + 9;
        c.style = style;
        c.rotary_dim = rotary;
        c.plus_one = plus_one;
        c.batch = plus_one;
        const std::string what = describe(c);
        c.in_place = true;
        expect_matches_unfused<float, float, float>(c, what + " in place");
        expect_matches_unfused<float, float, I8>(c, what + " in place");
        c.in_place = false;
        expect_matches_unfused<float, float, BFloat16>(c, what);
        expect_matches_unfused<BFloat16, float, Float16>(c, what);
      }
    }
  }
}

// Head dimensions whose rows end in partial SIMD steps, and no rotation.
TEST(Append, MatchesUnfusedOddWidthsAndNoRotation) {
  for (const std::size_t d : {std::size_t{2}, std::size_t{6}, std::size_t{18}, std::size_t{40}, std::size_t{128}}) {
    for (const Style style : {Style::rotate_half, Style::block_diagonal}) {
      Case c;
      c.head_dim = d;
      c.style = style;
      c.rotary_dim = d >= 6 ? d - 4 : 0;
      c.batch = d == 18;
      expect_matches_unfused<float, float, float>(c, describe(c) + " d " + std::to_string(d));
      expect_matches_unfused<BFloat16, BFloat16, I8>(c, describe(c) + " d " + std::to_string(d));
    }
  }
  Case c;
  c.rotate = false;
  expect_matches_unfused<float, float, BFloat16>(c, "no rotation");
  c.norm = NormKind::none;
  expect_matches_unfused<Float16, Float16, Float16>(c, "no rotation, no norm: rounding only");
  // Neither: q_out is q as it was, the cache the rows as they were.
  const Fixture<float, float, float> s(c);
  const auto got = s.run();
  auto src = s.initial;
  const auto b = s.bind(src);
  auto g = got;
  const auto bg = s.bind(g);
  for (std::size_t t = 0; t < c.tokens; ++t) {
    EXPECT_EQ(std::memcmp(bg.q_out.row(t, 0), b.q.row(t, 0), c.q_heads * c.head_dim * sizeof(float)), 0);
    const auto slot = static_cast<std::size_t>(s.lay.slots[t]);
    EXPECT_EQ(std::memcmp(bg.cache.k.row(slot, 1), b.k.row(t, 1), c.head_dim * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(bg.cache.v.row(slot, 1), b.v.row(t, 1), c.head_dim * sizeof(float)), 0);
  }
}

// The slots of the plan's new tokens are written, every other slot (the
// keys cached before the step, the pages no sequence reads, and a
// sequence without new tokens, whose block-table row lists no page in the
// pool) is left as it was; Q is normalized and rotated at every token, K
// written back when asked.
TEST(Append, OnlyTheNewTokensSlotsAreWritten) {
  Case c;
  c.batch = true;
  c.write_back = true;
  const Fixture<float, float, I8> s(c);
  ASSERT_EQ(s.lay.lengths[1], 5);
  ASSERT_EQ(s.lay.q_starts[1], s.lay.q_starts[2]);  // sequence 1 has no new tokens
  const auto got = s.run();
  EXPECT_TRUE(same_state(got, s.expected()));
  auto g = got;
  const auto b = s.bind(g);
  auto init = s.initial;
  const auto b0 = s.bind(init);
  std::size_t named_slots = 0;
  for (std::size_t slot = 0; slot < s.lay.pages * kPageSize; ++slot) {
    const bool named = std::find(s.lay.slots.begin(), s.lay.slots.end(), std::int64_t(slot)) != s.lay.slots.end();
    named_slots += named;
    for (std::size_t h = 0; h < c.kv_heads; ++h) {
      const bool k_same = std::memcmp(b.cache.k.row(slot, h), b0.cache.k.row(slot, h), c.head_dim) == 0 &&
                          *b.cache.k.scale(slot, h) == *b0.cache.k.scale(slot, h);
      const bool v_same = std::memcmp(b.cache.v.row(slot, h), b0.cache.v.row(slot, h), c.head_dim) == 0 &&
                          *b.cache.v.scale(slot, h) == *b0.cache.v.scale(slot, h);
      EXPECT_EQ(k_same, !named) << "cache.k slot " << slot;
      EXPECT_EQ(v_same, !named) << "cache.v slot " << slot;
    }
  }
  EXPECT_EQ(named_slots, c.tokens);
  // Each token's Q and written-back K differ from its input (rotated at a position > 0).
  for (std::size_t t = 0; t < c.tokens; ++t) {
    if (s.lay.positions[t] == 0) continue;
    float dq = 0, dk = 0;
    for (std::size_t i = 0; i < c.head_dim; ++i) {
      dq += std::fabs(b.q_out.row(t, 0)[i] - b0.q.row(t, 0)[i]);
      dk += std::fabs(b.k.row(t, 0)[i] - b0.k.row(t, 0)[i]);
    }
    EXPECT_GT(dq, 0.0f) << "token " << t;
    EXPECT_GT(dk, 0.0f) << "token " << t;
  }
}

// write_back_k: k holds the normalized, rotated K rounded to the input
// type; without it k is left as it was (checked with a fused buffer, where
// k sits between q and v in every token).
TEST(Append, WriteBackOnlyWhenAsked) {
  for (const bool wb : {false, true}) {
    Case c;
    c.fused = true;
    c.in_place = true;
    c.write_back = wb;
    const Fixture<BFloat16, BFloat16, I8> s(c);
    const auto got = s.run();
    EXPECT_TRUE(same_state(got, s.expected())) << wb;
    auto g = got;
    auto init = s.initial;
    const auto b = s.bind(g);
    const auto b0 = s.bind(init);
    bool k_same = true, v_same = true;
    for (std::size_t t = 0; t < c.tokens; ++t) {
      for (std::size_t h = 0; h < c.kv_heads; ++h) {
        k_same = k_same && std::memcmp(b.k.row(t, h), b0.k.row(t, h), c.head_dim * sizeof(BFloat16)) == 0;
        v_same = v_same && std::memcmp(b.v.row(t, h), b0.v.row(t, h), c.head_dim * sizeof(BFloat16)) == 0;
      }
    }
    EXPECT_EQ(k_same, !wb);
    EXPECT_TRUE(v_same);
  }
}

// The plan's threads: counts 1 to 5 and executors of 2 and 3 workers (a
// pool's threads, and in reverse order on the calling thread) give the same
// bytes, and the work goes through the executor, one task per share.
template <class In, class QO, class E>
void expect_same_bytes_whoever_runs(Case c) {
  c.tokens = 13;
  c.threads = 1;
  const Fixture<In, QO, E> one(c);
  const auto want = one.run();
  EXPECT_TRUE(same_state(want, one.expected()));
  for (const std::size_t threads : {std::size_t{2}, std::size_t{3}, std::size_t{4}, std::size_t{5}}) {
    c.threads = threads;
    EXPECT_TRUE(same_state(Fixture<In, QO, E>(c).run(), want)) << "threads " << threads;
  }
  c.threads = 1;
  rope_test::ThreadPool pool(3);
  for (const std::size_t workers : {std::size_t{2}, std::size_t{3}}) {
    c.executor = pool.executor(workers);
    const std::size_t before = pool.tasks_run();
    EXPECT_TRUE(same_state(Fixture<In, QO, E>(c).run(), want)) << "pool workers " << workers;
    EXPECT_EQ(pool.tasks_run() - before, workers);
    rope_test::ReverseExecutor reverse;
    c.executor = reverse.executor(workers);
    EXPECT_TRUE(same_state(Fixture<In, QO, E>(c).run(), want)) << "reverse workers " << workers;
    EXPECT_EQ(reverse.tasks_run, workers);
  }
}

TEST(Append, SameBytesOnEveryThreadCountAndExecutor) {
  Case c;
  c.norm = NormKind::whole;
  c.write_back = true;
  expect_same_bytes_whoever_runs<float, float, float>(c);
  c.fused = true;
  c.in_place = true;
  c.hnd = true;
  c.batch = true;
  expect_same_bytes_whoever_runs<BFloat16, BFloat16, I8>(c);
  // Read-only views of a fused buffer, per-head norms, an int8 cache.
  c = Case{};
  c.fused = true;
  c.batch = true;
  expect_same_bytes_whoever_runs<float, float, I8>(c);
}

// A call of more tokens per worker than ra::kGroupedNormTokens normalizes
// one head at a time, a short one several at a time: the same bytes as the
// long call made token by token (each step one new token of the sequence,
// so grouped), on 1 and 3 threads, per-head norm over an f32 and an i8
// cache; the token-by-token plans derive the long call's slots.
template <class E>
void expect_long_call_is_token_by_token() {
  const std::size_t T = 3 * ra::kGroupedNormTokens + 5, H = 6, G = 2, D = 40, page = 16;
  const Layout lay = make_layout({{0, T}}, page, 5);
  const rope::Table<float> table(rope::frequencies(D, 10000.0), T);
  const auto x = rope_test::random_vector<float>(T * (H + 2 * G) * D, 31, 2.0);
  auto qw = rope_test::random_vector<float>(D, 32, 1.0);
  auto kw = rope_test::random_vector<float>(D, 33, 1.0);
  ra::AppendOptions o;
  o.rotation = {&table, Style::rotate_half};
  o.q_norm = {qw.data(), D};
  o.k_norm = {kw.data(), D};
  o.eps = 1e-5f;
  struct Out {
    std::vector<float> q;
    std::vector<E> kp, vp;
    std::vector<float> ks, vs;
  };
  ra::Shape shape;
  shape.q_heads = H;
  shape.kv_heads = G;
  shape.head_dim = D;
  shape.page_size = page;
  shape.pages = lay.pages;
  const auto run = [&](std::size_t threads, bool token_by_token) {
    Out out;
    out.q.assign(T * H * D, -3.0f);
    out.kp.assign(lay.pages * page * G * D, E{});
    out.vp.assign(lay.pages * page * G * D, E{});
    out.ks.assign(rope::KvElement<E>::kScaled ? lay.pages * page * G : 0, -1.0f);
    out.vs.assign(out.ks.size(), -1.0f);
    float* ks = out.ks.empty() ? nullptr : out.ks.data();
    float* vs = out.vs.empty() ? nullptr : out.vs.data();
    const ra::PagedCache<E> cache{ra::PagePool<E>::nhd(out.kp.data(), lay.pages, page, G, D, ks),
                                  ra::PagePool<E>::nhd(out.vp.data(), lay.pages, page, G, D, vs)};
    const std::size_t row = (H + 2 * G) * D;
    const std::size_t step = token_by_token ? 1 : T;
    ra::Plan p;
    for (std::size_t t0 = 0; t0 < T; t0 += step) {
      const std::int64_t starts[2] = {0, static_cast<std::int64_t>(step)};
      const std::int64_t length = static_cast<std::int64_t>(t0 + step);
      ra::plan(p, shape, ra::Batch{starts, &length, lay.block_table.data(), lay.stride, 1}, threads);
      const float* base = x.data() + t0 * row;
      const rope::View<const float> q(base, step, H, D, row, D), k(base + H * D, step, G, D, row, D),
          v(base + (H + G) * D, step, G, D, row, D);
      const rope::View<float> qo(out.q.data() + t0 * H * D, step, H, D, H * D, D);
      ra::append(p, cache, q, k, v, qo, o);
    }
    return out;
  };
  const Out want = run(1, true);
  for (const std::size_t threads : {std::size_t{1}, std::size_t{3}}) {
    const Out got = run(threads, false);
    EXPECT_EQ(bytes_of(got.q), bytes_of(want.q)) << threads;
    EXPECT_EQ(bytes_of(got.kp), bytes_of(want.kp)) << threads;
    EXPECT_EQ(bytes_of(got.vp), bytes_of(want.vp)) << threads;
    EXPECT_EQ(bytes_of(got.ks), bytes_of(want.ks)) << threads;
    EXPECT_EQ(bytes_of(got.vs), bytes_of(want.vs)) << threads;
  }
}

TEST(Append, LongCallIsTheCallTokenByToken) {
  expect_long_call_is_token_by_token<float>();
  expect_long_call_is_token_by_token<I8>();
}

// A contiguous cache (PagedCache::contiguous, a pool of one page of its
// capacity) planned by the one-sequence plan(): the new tokens' rows land
// at rows cached .. cached + n - 1 of the caller's K and V buffers, with
// the bits the paged cache gets for the same step; the other rows stay.
template <class E>
void expect_contiguous_is_one_page() {
  Case c;
  c.write_back = true;
  const Fixture<float, float, E> s(c);  // one sequence, 3 keys cached
  const std::size_t cached = 3, capacity = 13, G = c.kv_heads, D = c.head_dim;
  std::vector<E> kc(capacity * G * D), vc(kc.size());
  std::memset(static_cast<void*>(kc.data()), 0x3C, kc.size() * sizeof(E));
  std::memset(static_cast<void*>(vc.data()), 0xC3, vc.size() * sizeof(E));
  const bool scaled = rope::KvElement<E>::kScaled;
  std::vector<float> ks(scaled ? capacity * G : 0, -2.0f), vs(ks.size(), -2.0f);
  const std::vector<E> kc0 = kc, vc0 = vc;
  const auto cache = ra::PagedCache<E>::contiguous(rope::View<E>::token_major(kc.data(), capacity, G, D),
                                                   rope::View<E>::token_major(vc.data(), capacity, G, D),
                                                   scaled ? ks.data() : nullptr, scaled ? vs.data() : nullptr);
  ra::Shape shape = ra::Shape::of(cache, c.q_heads);
  EXPECT_EQ(shape.pages, 1u);
  EXPECT_EQ(shape.page_size, capacity);
  auto st = s.initial;
  const auto b = s.bind(st);
  ra::Plan p;
  ra::plan(p, shape, cached, c.tokens);
  ra::append(p, cache, b.q, b.k, b.v, b.q_out, s.options());
  const auto want = s.expected();
  EXPECT_TRUE(same_bytes(st.in, want.in, "k (write-back)"));
  EXPECT_TRUE(same_bytes(st.out, want.out, "q_out"));
  auto w = want;
  const auto bw = s.bind(w);
  for (std::size_t row = 0; row < capacity; ++row) {
    const bool fresh = row >= cached && row < cached + c.tokens;
    for (std::size_t h = 0; h < G; ++h) {
      const std::size_t at = (row * G + h) * D;
      const E* k_want = fresh ? bw.cache.k.row(static_cast<std::size_t>(s.lay.slots[row - cached]), h) : &kc0[at];
      const E* v_want = fresh ? bw.cache.v.row(static_cast<std::size_t>(s.lay.slots[row - cached]), h) : &vc0[at];
      EXPECT_EQ(std::memcmp(&kc[at], k_want, D * sizeof(E)), 0) << "row " << row << " head " << h;
      EXPECT_EQ(std::memcmp(&vc[at], v_want, D * sizeof(E)), 0) << "row " << row << " head " << h;
      if (scaled) {
        const std::size_t slot = fresh ? static_cast<std::size_t>(s.lay.slots[row - cached]) : 0;
        EXPECT_EQ(ks[row * G + h], fresh ? *bw.cache.k.scale(slot, h) : -2.0f) << "row " << row;
        EXPECT_EQ(vs[row * G + h], fresh ? *bw.cache.v.scale(slot, h) : -2.0f) << "row " << row;
      }
    }
  }
}

TEST(Append, ContiguousCacheIsAPoolOfOnePage) {
  expect_contiguous_is_one_page<float>();
  expect_contiguous_is_one_page<BFloat16>();
  expect_contiguous_is_one_page<I8>();
}

// Tree verify (tree.hpp): a tree token is rotated at cached + its depth
// (siblings share a position) and written to the slot of key cached + its
// index; in a batch with a decode sequence and a chunk of two siblings.
TEST(Append, TreeTokensRotateAtTheirDepthIntoTheirOwnSlots) {
  Case c;
  c.batch = true;
  c.tokens = 9;  // a chunk of 2 after 9 keys, a decode token, 6 new tokens from position 0
  c.write_back = true;
  const auto check = [&](auto in, auto q_out, auto e) {
    using In = decltype(in);
    using QO = decltype(q_out);
    using E = decltype(e);
    Fixture<In, QO, E> s(c);
    const Layout plain = s.lay;
    make_tree(s.lay, 0, {0, 0}, {-1, -1});
    make_tree(s.lay, 3, {0, 1, 1, 2, 2, 2}, {-1, 0, 0, 1, 1, 2});
    ASSERT_EQ(s.lay.positions[1], 9);  // both siblings at position 9
    ASSERT_EQ(s.lay.positions[7], 2);
    ASSERT_EQ(s.lay.slots, plain.slots);
    ra::Plan p;
    s.plan(p);
    for (std::size_t t = 0; t < c.tokens; ++t) {
      EXPECT_EQ(p.position(t), s.lay.positions[t]) << "token " << t;
      EXPECT_EQ(p.slot(t), s.lay.slots[t]) << "token " << t;
    }
    EXPECT_TRUE(same_state(s.run(), s.expected())) << describe(c);
  };
  check(float{}, float{}, float{});
  check(BFloat16{}, BFloat16{}, I8{});
  c.norm = NormKind::whole;
  c.style = Style::block_diagonal;
  check(Float16{}, float{}, BFloat16{});
}

// eps at the ends of float's range (the largest float, the smallest
// subnormal) is accepted and gives the unfused bits with that eps.
TEST(Append, EpsAtTheEndsOfFloatsRangeIsAccepted) {
  for (const float eps : {std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min()}) {
    for (const NormKind norm : {NormKind::per_head, NormKind::whole}) {
      Case c;
      c.norm = norm;
      c.write_back = true;
      Fixture<float, float, BFloat16> s(c);
      s.eps = eps;
      EXPECT_TRUE(same_state(s.run(), s.expected())) << "eps " << eps << " norm " << int(norm);
      Fixture<BFloat16, Float16, I8> h(c);
      h.eps = eps;
      EXPECT_TRUE(same_state(h.run(), h.expected())) << "eps " << eps << " norm " << int(norm);
    }
  }
}

// A NaN in one token's q, k or v row reaches that token's own outputs only.
template <class In, class E>
void expect_nan_confined(NormKind norm, char where) {
  Case c;
  c.norm = norm;
  c.tokens = 9;
  c.threads = 2;
  c.write_back = true;
  c.batch = true;
  const Fixture<In, In, E> clean_setup(c);
  const auto clean = clean_setup.run();
  c.nan_token = 4;
  c.nan_in = where;
  c.nan_head = 1;
  const Fixture<In, In, E> s(c);
  auto got = s.run();
  auto ref = clean;
  const auto b = s.bind(got);
  const auto r = s.bind(ref);
  const std::size_t D = c.head_dim;
  const auto row_is = [&](const auto* x, const auto* y, std::size_t n) {
    return std::memcmp(x, y, n * sizeof(*x)) == 0;
  };
  const auto has_nan = [&](const auto* x) {
    for (std::size_t i = 0; i < D; ++i) {
      if (std::isnan(widen_any(x[i]))) return true;
    }
    return false;
  };
  bool nan_seen = false;
  for (std::size_t t = 0; t < c.tokens; ++t) {
    const bool own = t == 4;
    for (std::size_t h = 0; h < c.q_heads; ++h) {
      if (!own) {
        EXPECT_TRUE(row_is(b.q_out.row(t, h), r.q_out.row(t, h), D)) << "q_out token " << t;
      }
      if (own && where == 'q') nan_seen = nan_seen || has_nan(b.q_out.row(t, h));
    }
    for (std::size_t h = 0; h < c.kv_heads; ++h) {
      if (!own) {
        EXPECT_TRUE(row_is(b.k.row(t, h), r.k.row(t, h), D)) << "k token " << t;
      }
      const auto slot = static_cast<std::size_t>(s.lay.slots[t]);
      if (own) {
        if (where == 'k') nan_seen = nan_seen || has_nan(b.k.row(t, h));
        continue;
      }
      EXPECT_TRUE(row_is(b.cache.k.row(slot, h), r.cache.k.row(slot, h), D)) << "cache.k token " << t;
      EXPECT_TRUE(row_is(b.cache.v.row(slot, h), r.cache.v.row(slot, h), D)) << "cache.v token " << t;
      if (rope::KvElement<E>::kScaled) {
        EXPECT_TRUE(row_is(b.cache.k.scale(slot, h), r.cache.k.scale(slot, h), 1)) << "k scale token " << t;
        EXPECT_TRUE(row_is(b.cache.v.scale(slot, h), r.cache.v.scale(slot, h), 1)) << "v scale token " << t;
      }
    }
  }
  // The NaN token's own outputs do carry it.
  const auto slot4 = static_cast<std::size_t>(s.lay.slots[4]);
  if (where == 'v') {
    if (rope::KvElement<E>::kScaled) {
      EXPECT_TRUE(std::isnan(*b.cache.v.scale(slot4, 1)));
    } else {
      EXPECT_TRUE(has_nan(b.cache.v.row(slot4, 1)));
    }
  } else {
    EXPECT_TRUE(nan_seen) << where;
    if (where == 'k') {
      if (rope::KvElement<E>::kScaled) {
        EXPECT_TRUE(std::isnan(*b.cache.k.scale(slot4, 1)));
      } else {
        EXPECT_TRUE(has_nan(b.cache.k.row(slot4, 1)));
      }
    }
  }
}

TEST(Append, NanStaysInItsToken) {
  for (const char where : {'q', 'k', 'v'}) {
    for (const NormKind norm : {NormKind::per_head, NormKind::whole}) {
      SCOPED_TRACE(std::string(1, where) + " norm " + std::to_string(int(norm)));
      expect_nan_confined<float, float>(norm, where);
      expect_nan_confined<BFloat16, BFloat16>(norm, where);
      expect_nan_confined<Float16, I8>(norm, where);
    }
  }
}

// ---- Multi-axis positions (options.pair_axes): M-RoPE in the fused step.

// The fused call with multi-axis positions equals, bit for bit, the steps
// one after another: the norm by hand (or none), rope::apply_mrope on the
// float rows of Q and K, Q rounded into q_out, the rotated K and V rounded
// into the slots the plan's positions (not the axes') pick.
template <class E>
void expect_mrope_matches_unfused(const Case& c, const rope::MropeSections& sections) {
  const Fixture<float, float, E> s(c);
  const std::size_t pairs = (c.rotary_dim != 0 ? c.rotary_dim : s.table.rotary_dim()) / 2;
  const rope::PairAxes pa = rope::PairAxes::sections(sections, pairs);
  const std::vector<std::int64_t> axis_positions = mrope_positions(c.tokens);
  ra::AppendOptions o = s.options();
  o.pair_axes = &pa;
  o.axis_positions = axis_positions.data();
  const State<float, float, E> got = s.run_with(o);
  State<float, float, E> source = s.initial;
  const auto src = s.bind(source);
  std::vector<float> qf = s.unfused(src.q, s.qw, false), kf = s.unfused(src.k, s.kw, false);
  const std::vector<float> unrotated = qf;
  rope::Options ro;
  ro.rotary_dim = c.rotary_dim;
  const std::size_t T = c.tokens, D = c.head_dim;
  rope::apply_mrope(rope::View<float>::token_major(qf.data(), T, c.q_heads, D), s.table, c.style, axis_positions.data(),
                    pa, ro);
  rope::apply_mrope(rope::View<float>::token_major(kf.data(), T, c.kv_heads, D), s.table, c.style,
                    axis_positions.data(), pa, ro);
  EXPECT_TRUE(same_state(got, s.written(qf, kf)));
  // The rotation did something: q_out is not the normalized, unrotated Q.
  auto g = got;
  const auto b = s.bind(g);
  EXPECT_NE(std::memcmp(b.q_out.row(1, 0), unrotated.data() + c.q_heads * D, D * sizeof(float)), 0);
}

TEST(AppendMultiAxis, MatchesNormThenApplyMropeThenTheRoundedWrites) {
  using rope::SectionOrder;
  // head_dim 32: 16 pairs in full, 12 with rotary_dim 24 (8 channels pass).
  const rope::MropeSections chunked_full{{8, 4, 4}, SectionOrder::chunked};
  const rope::MropeSections interleaved_full{{6, 5, 5}, SectionOrder::interleaved};
  const rope::MropeSections chunked_partial{{4, 4, 4}, SectionOrder::chunked};
  const rope::MropeSections interleaved_partial{{4, 4, 4}, SectionOrder::interleaved};
  for (const NormKind norm : {NormKind::per_head, NormKind::none}) {
    for (const bool partial : {false, true}) {
      Case c;
      c.norm = norm;
      c.rotary_dim = partial ? 24 : 0;
      c.write_back = true;
      c.batch = partial;
      const auto& ch = partial ? chunked_partial : chunked_full;
      const auto& il = partial ? interleaved_partial : interleaved_full;
      SCOPED_TRACE(std::string("norm ") + std::to_string(int(norm)) + (partial ? " partial" : " full"));
      expect_mrope_matches_unfused<float>(c, ch);
      expect_mrope_matches_unfused<BFloat16>(c, il);
      c.style = Style::block_diagonal;
      c.hnd = true;
      c.write_back = false;
      expect_mrope_matches_unfused<BFloat16>(c, ch);
      expect_mrope_matches_unfused<float>(c, il);
    }
  }
  // Whole-projection norm, threads: the same bytes.
  Case c;
  c.norm = NormKind::whole;
  c.threads = 3;
  c.batch = true;
  expect_mrope_matches_unfused<BFloat16>(c, interleaved_full);
}

// Every axis holding the token's one position: the same bytes as the
// one-position call, for one sequence and for a batch.
TEST(AppendMultiAxis, EqualAxesAreTheOnePositionCall) {
  for (const bool batch : {true, false}) {
    Case c;
    c.batch = batch;
    c.rotary_dim = 24;
    c.write_back = true;
    const Fixture<float, float, BFloat16> s(c);
    std::vector<std::int64_t> same(3 * c.tokens);
    for (std::size_t a = 0; a < 3; ++a) {
      for (std::size_t t = 0; t < c.tokens; ++t) same[a * c.tokens + t] = s.lay.positions[t];
    }
    for (const auto order : {rope::SectionOrder::chunked, rope::SectionOrder::interleaved}) {
      const rope::PairAxes pa = rope::PairAxes::sections({{4, 4, 4}, order}, 12);
      ra::AppendOptions o = s.options();
      o.pair_axes = &pa;
      o.axis_positions = same.data();
      EXPECT_TRUE(same_state(s.run_with(o), s.run())) << "batch " << batch << " order " << int(order);
    }
  }
}

}  // namespace
