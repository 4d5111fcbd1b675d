// norm_rope_append (attention/append.hpp) against the unfused composition
// that its header documents: the plain RMSNorm loop, rope::apply on float
// rows with the same table, pairing, rotary width and positions, then one
// rounding into the stored type (store_kv_row; int8: quantized the same
// way). Bit for bit, over input, q_out and cache types, both pairings,
// partial rotary, grouped-query heads, every norm form, positions as offset
// and ids, NHD and HND pools, a fused QKV buffer, padding slots, K's
// write-back, threads and executors, long calls (the norm one head at a
// time) against the same tokens one call each; NaN confinement to its own
// token; and
// every refusal, which must leave every output byte as it was. Multi-axis
// positions (options.pair_axes) against the norm, rope::apply_mrope on float
// rows and write_slots of the results, and against the one-position call
// when every axis holds the same positions.
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

#include "executors.hpp"
#include "support.hpp"

namespace {

namespace ra = rope::attention;
using rope::BFloat16;
using rope::Float16;
using rope::Style;
using I8 = std::int8_t;

enum class NormKind { none, per_head, whole };

struct Case {
  Style style = Style::rotate_half;
  std::size_t tokens = 7, q_heads = 8, kv_heads = 2, head_dim = 32;
  std::size_t rotary_dim = 0;  // rotation.rotary_dim (0: the table's)
  bool rotate = true;
  NormKind norm = NormKind::per_head;
  bool plus_one = false;
  bool ids = false;
  bool hnd = false;
  bool fused = false;     // q, k, v: split_qkv of one buffer
  bool in_place = false;  // q_out == q
  bool write_back = false;
  std::size_t threads = 1;
  rope::Executor executor;
  rope::Stores stores = rope::Stores::automatic;  // small calls: cached
  int nan_token = -1;                             // >= 0: one NaN in that token's row of nan_in
  char nan_in = 'q';
  std::size_t nan_head = 0;
};

constexpr std::size_t kPages = 8, kPageSize = 4;
constexpr std::size_t kTablePositions = 64;
// Token t's slot: spread over pages, token 5 padding.
const std::int64_t kSlots[] = {13, 2, 7, 30, 0, -1, 21, 9, 16, 25, 4};

template <class T>
T round_to(float x) {
  return T(x);
}

template <class T>
std::vector<unsigned char> bytes_of(const std::vector<T>& v) {
  std::vector<unsigned char> b(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

template <class T>
::testing::AssertionResult same_bytes(const std::vector<T>& got, const std::vector<T>& want, const char* what) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << what << ": sizes differ";
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
      return ::testing::AssertionFailure()
             << what << ": element " << i << " of " << got.size() << " differs: got "
             << rope::detail::widen_value(got[i]) << ", want " << rope::detail::widen_value(want[i]);
    }
  }
  return ::testing::AssertionSuccess();
}
::testing::AssertionResult same_bytes(const std::vector<I8>& got, const std::vector<I8>& want, const char* what) {
  if (got != want) {
    for (std::size_t i = 0; i < got.size(); ++i) {
      if (got[i] != want[i]) {
        return ::testing::AssertionFailure()
               << what << ": element " << i << " differs: got " << int(got[i]) << ", want " << int(want[i]);
      }
    }
    return ::testing::AssertionFailure() << what << ": sizes differ";
  }
  return ::testing::AssertionSuccess();
}

// Every buffer a call may write: the inputs (k's write-back, q in place),
// q_out, the pools and their scales.
template <class In, class QO, class E>
struct State {
  std::vector<In> in;
  std::vector<QO> out;
  std::vector<E> kp, vp;
  std::vector<float> ks, vs;
};

template <class In, class QO, class E>
::testing::AssertionResult same_state(const State<In, QO, E>& a, const State<In, QO, E>& b) {
  for (auto r : {same_bytes(a.in, b.in, "q/k/v"), same_bytes(a.out, b.out, "q_out"), same_bytes(a.kp, b.kp, "cache.k"),
                 same_bytes(a.vp, b.vp, "cache.v"), same_bytes(a.ks, b.ks, "cache.k.scales"),
                 same_bytes(a.vs, b.vs, "cache.v.scales")}) {
    if (!r) return r;
  }
  return ::testing::AssertionSuccess();
}

// The unfused RMSNorm, exactly as append.hpp documents it.
void plain_rms_norm(float* x, std::size_t n, const float* w, float eps, bool plus_one) {
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (std::size_t c = 0; c < n; ++c) s[c % 8] = std::fma(x[c], x[c], s[c % 8]);
  const float ss = ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
  const float r = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  for (std::size_t c = 0; c < n; ++c) x[c] = (x[c] * r) * (plus_one ? 1.0f + w[c] : w[c]);
}

template <class In, class QO, class E>
struct Fixture {
  Case c;
  rope::Table<float> table;
  std::vector<std::int64_t> slots, ids;
  std::vector<float> qw, kw;
  std::size_t pages = kPages;  // of the pools
  State<In, QO, E> initial;
  float eps = 1e-5f;

  struct Bound {
    rope::View<In> q, k, v;
    rope::View<QO> q_out;
    ra::PagedCache<E> cache;
  };

  std::size_t d() const { return c.head_dim; }
  std::size_t region(std::size_t heads) const { return c.tokens * heads * d(); }

  explicit Fixture(const Case& c_)
      : c(c_), table(rope::frequencies(c_.head_dim, 10000.0), std::max(kTablePositions, c_.tokens + 3)) {
    const std::size_t t = c.tokens;
    // kSlots for the first tokens; more tokens (a prefill) take the slots
    // after the first kPages pages, in pages added for them.
    constexpr std::size_t listed = sizeof(kSlots) / sizeof(kSlots[0]);
    slots.assign(kSlots, kSlots + std::min(t, listed));
    for (std::size_t i = listed; i < t; ++i)
      slots.push_back(static_cast<std::int64_t>(kPages * kPageSize + i - listed));
    pages = kPages + (t > listed ? (t - listed + kPageSize - 1) / kPageSize : 0);
    for (std::size_t i = 0; i < t; ++i) ids.push_back(static_cast<std::int64_t>((i * 37 + 11) % kTablePositions));
    const std::size_t qn = c.norm == NormKind::whole ? c.q_heads * d() : d();
    const std::size_t kn = c.norm == NormKind::whole ? c.kv_heads * d() : d();
    const double wscale = c.plus_one ? 0.5 : 1.0;
    qw = rope_test::random_vector<float>(qn, 21, wscale);
    kw = rope_test::random_vector<float>(kn, 22, wscale);
    if (!c.plus_one) {
      for (auto& w : qw) w += 1.0f;
      for (auto& w : kw) w += 1.0f;
    }
    // Inputs, then padding the size of q (room for views that overlap).
    const std::size_t n_in = region(c.q_heads) + 2 * region(c.kv_heads) + region(c.q_heads);
    const auto x = rope_test::random_vector<float>(n_in, 23, 2.0);
    for (float v : x) initial.in.push_back(round_to<In>(v));
    if (!(c.in_place && std::is_same<In, QO>::value)) initial.out.assign(region(c.q_heads), round_to<QO>(-7.5f));
    const std::size_t pool = pages * kPageSize * c.kv_heads * d();
    initial.kp.resize(pool);
    initial.vp.resize(pool);
    std::memset(static_cast<void*>(initial.kp.data()), 0xA5, pool * sizeof(E));
    std::memset(static_cast<void*>(initial.vp.data()), 0x5A, pool * sizeof(E));
    if (rope::KvElement<E>::kScaled) {
      initial.ks.assign(pages * kPageSize * c.kv_heads, -3.25f);
      initial.vs.assign(pages * kPageSize * c.kv_heads, -4.5f);
    }
    if (c.nan_token >= 0) {
      const Bound b = bind(initial);
      const auto nt = static_cast<std::size_t>(c.nan_token);
      const rope::View<In>& view = c.nan_in == 'q' ? b.q : c.nan_in == 'k' ? b.k : b.v;
      view.row(nt, c.nan_head)[3] = round_to<In>(std::numeric_limits<float>::quiet_NaN());
    }
  }

  Bound bind(State<In, QO, E>& s) const {
    Bound b;
    In* base = s.in.data();
    const std::size_t T = c.tokens, H = c.q_heads, G = c.kv_heads;
    if (c.fused) {
      const auto qkv = rope::split_qkv(base, T, H, G, d());
      b.q = qkv.q;
      b.k = qkv.k;
      b.v = qkv.v;
    } else {
      b.q = rope::View<In>::token_major(base, T, H, d());
      b.k = rope::View<In>::token_major(base + region(H), T, G, d());
      b.v = rope::View<In>::token_major(base + region(H) + region(G), T, G, d());
    }
    if constexpr (std::is_same<In, QO>::value) {
      if (c.in_place) b.q_out = b.q;
    }
    if (b.q_out.data == nullptr) b.q_out = rope::View<QO>::token_major(s.out.data(), T, H, d());
    float* ks = s.ks.empty() ? nullptr : s.ks.data();
    float* vs = s.vs.empty() ? nullptr : s.vs.data();
    const auto pool = c.hnd ? &ra::PagePool<E>::hnd : &ra::PagePool<E>::nhd;
    b.cache.k = pool(s.kp.data(), pages, kPageSize, G, d(), ks);
    b.cache.v = pool(s.vp.data(), pages, kPageSize, G, d(), vs);
    return b;
  }

  rope::Positions positions() const { return c.ids ? rope::Positions(ids.data()) : rope::Positions(std::int64_t{3}); }

  ra::AppendOptions options() const {
    ra::AppendOptions o;
    if (c.rotate) o.rotation = ra::Rotation<float>{&table, c.style, c.rotary_dim};
    if (c.norm != NormKind::none) {
      o.q_norm = {qw.data(), qw.size()};
      o.k_norm = {kw.data(), kw.size()};
    }
    o.eps = eps;
    o.plus_one = c.plus_one;
    o.whole_projection = c.norm == NormKind::whole;
    o.write_back_k = c.write_back;
    o.threads = c.threads;
    o.executor = c.executor;
    o.stores = c.stores;
    return o;
  }

  State<In, QO, E> run() const {
    State<In, QO, E> s = initial;
    const Bound b = bind(s);
    ra::norm_rope_append(b.q, b.k, b.v, positions(), slots.data(), b.cache, b.q_out, options());
    return s;
  }

  // Rows of one side widened, normalized and rotated (unless !rotate) as
  // separate steps.
  std::vector<float> unfused(const rope::View<In>& x, const std::vector<float>& w, bool rotate = true) const {
    const std::size_t T = x.tokens, H = x.heads;
    std::vector<float> f(T * H * d());
    for (std::size_t t = 0; t < T; ++t) {
      for (std::size_t h = 0; h < H; ++h) {
        for (std::size_t i = 0; i < d(); ++i) f[(t * H + h) * d() + i] = rope::detail::widen_value(x.row(t, h)[i]);
      }
    }
    for (std::size_t t = 0; t < T; ++t) {
      if (c.norm == NormKind::whole) plain_rms_norm(f.data() + t * H * d(), H * d(), w.data(), eps, c.plus_one);
      if (c.norm == NormKind::per_head) {
        for (std::size_t h = 0; h < H; ++h)
          plain_rms_norm(f.data() + (t * H + h) * d(), d(), w.data(), eps, c.plus_one);
      }
    }
    if (c.rotate && rotate) {
      rope::Options o;
      o.rotary_dim = c.rotary_dim;
      rope::apply(rope::View<float>::token_major(f.data(), T, H, d()), table, c.style, positions(), o);
    }
    return f;
  }

  State<In, QO, E> expected() const {
    State<In, QO, E> s = initial;
    State<In, QO, E> source = initial;
    const Bound src = bind(source);
    const Bound b = bind(s);
    const std::size_t G = c.kv_heads, D = d();
    const std::vector<float> qf = unfused(src.q, qw), kf = unfused(src.k, kw);
    for (std::size_t t = 0; t < c.tokens; ++t) {
      for (std::size_t h = 0; h < c.q_heads; ++h) {
        for (std::size_t i = 0; i < D; ++i) b.q_out.row(t, h)[i] = round_to<QO>(qf[(t * c.q_heads + h) * D + i]);
      }
      if (c.write_back) {
        for (std::size_t h = 0; h < G; ++h) {
          for (std::size_t i = 0; i < D; ++i) b.k.row(t, h)[i] = round_to<In>(kf[(t * G + h) * D + i]);
        }
      }
      if (slots[t] < 0) continue;
      const auto slot = static_cast<std::size_t>(slots[t]);
      for (std::size_t h = 0; h < G; ++h) {
        const bool scaled = rope::KvElement<E>::kScaled;
        rope::store_kv_row(kf.data() + (t * G + h) * D, D, b.cache.k.row(slot, h),
                           scaled ? b.cache.k.scale(slot, h) : nullptr);
        std::vector<float> vrow(D);
        for (std::size_t i = 0; i < D; ++i) vrow[i] = rope::detail::widen_value(src.v.row(t, h)[i]);
        rope::store_kv_row(vrow.data(), D, b.cache.v.row(slot, h), scaled ? b.cache.v.scale(slot, h) : nullptr);
      }
    }
    return s;
  }
};

template <class In, class QO, class E>
void expect_matches_unfused(const Case& c, const std::string& what) {
  const Fixture<In, QO, E> s(c);
  EXPECT_TRUE(same_state(s.run(), s.expected())) << what;
}

std::string describe(const Case& c) {
  return std::string(rope::name(c.style)) + " rotary " + std::to_string(c.rotary_dim) + " rotate " +
         std::to_string(c.rotate) + " norm " + std::to_string(int(c.norm)) + " plus_one " + std::to_string(c.plus_one) +
         " ids " + std::to_string(c.ids) + " hnd " + std::to_string(c.hnd) + " fused " + std::to_string(c.fused) +
         " in_place " + std::to_string(c.in_place) + " write_back " + std::to_string(c.write_back) + " threads " +
         std::to_string(c.threads);
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
            c.ids = layout & 1;
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

TEST(NormRopeAppend, MatchesUnfusedFloatInput) {
  sweep_q_out_types<float, float>();
  sweep_q_out_types<float, BFloat16>();
  sweep_q_out_types<float, Float16>();
  sweep_q_out_types<float, I8>();
}
TEST(NormRopeAppend, MatchesUnfusedBFloat16Input) {
  sweep_q_out_types<BFloat16, float>();
  sweep_q_out_types<BFloat16, BFloat16>();
  sweep_q_out_types<BFloat16, Float16>();
  sweep_q_out_types<BFloat16, I8>();
  sweep<BFloat16, Float16, BFloat16>(false);
}
TEST(NormRopeAppend, MatchesUnfusedFloat16Input) {
  sweep_q_out_types<Float16, float>();
  sweep_q_out_types<Float16, BFloat16>();
  sweep_q_out_types<Float16, Float16>();
  sweep_q_out_types<Float16, I8>();
}

// Calls of more tokens per worker than kGroupedNormTokens normalize one
// head at a time (a prefill), fewer four at a time: both give the
// unfused bits, with the float path that normalizes Q as the rotation loads
// it and with the widening path, in place and out of place.
TEST(NormRopeAppend, MatchesUnfusedPastTheGroupedNormTokens) {
  for (const Style style : {Style::rotate_half, Style::block_diagonal}) {
    for (const std::size_t rotary : {std::size_t{0}, std::size_t{20}}) {
      for (const bool plus_one : {false, true}) {
        Case c;
        c.tokens = ra::kGroupedNormTokens + 9;
        c.style = style;
        c.rotary_dim = rotary;
        c.plus_one = plus_one;
        const std::string what = describe(c) + " tokens " + std::to_string(c.tokens);
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
TEST(NormRopeAppend, MatchesUnfusedOddWidthsAndNoRotation) {
  for (const std::size_t d : {std::size_t{2}, std::size_t{6}, std::size_t{18}, std::size_t{40}, std::size_t{128}}) {
    for (const Style style : {Style::rotate_half, Style::block_diagonal}) {
      Case c;
      c.head_dim = d;
      c.style = style;
      c.rotary_dim = d >= 6 ? d - 4 : 0;
      expect_matches_unfused<float, float, float>(c, describe(c) + " d " + std::to_string(d));
      expect_matches_unfused<BFloat16, BFloat16, I8>(c, describe(c) + " d " + std::to_string(d));
    }
  }
  Case c;
  c.rotate = false;
  expect_matches_unfused<float, float, BFloat16>(c, "no rotation");
  c.norm = NormKind::none;
  expect_matches_unfused<Float16, Float16, Float16>(c, "no rotation, no norm: rounding only");
  // Neither: q_out is q widened and rounded, the cache the rows rounded.
  const Fixture<float, float, float> s(c);
  const auto got = s.run();
  auto src = s.initial;
  const auto b = s.bind(src);
  auto g = got;
  const auto bg = s.bind(g);
  for (std::size_t t = 0; t < c.tokens; ++t) {
    EXPECT_EQ(std::memcmp(bg.q_out.row(t, 0), b.q.row(t, 0), c.q_heads * c.head_dim * sizeof(float)), 0);
    if (s.slots[t] >= 0) {
      EXPECT_EQ(std::memcmp(bg.cache.v.row(static_cast<std::size_t>(s.slots[t]), 1), b.v.row(t, 1),
                            c.head_dim * sizeof(float)),
                0);
    }
  }
}

// A padding slot (-1): Q is still normalized and rotated, its K written
// back when asked, and no cache byte changes; every other slot is written.
TEST(NormRopeAppend, PaddingSlotLeavesTheCacheAndStillRotatesQ) {
  Case c;
  c.write_back = true;
  const Fixture<float, float, I8> s(c);
  ASSERT_EQ(s.slots[5], -1);
  const auto got = s.run();
  EXPECT_TRUE(same_state(got, s.expected()));
  // Slots that no token names are untouched; named slots all changed.
  auto g = got;
  const auto b = s.bind(g);
  auto init = s.initial;
  const auto b0 = s.bind(init);
  for (std::size_t slot = 0; slot < kPages * kPageSize; ++slot) {
    const bool named = std::find(s.slots.begin(), s.slots.end(), std::int64_t(slot)) != s.slots.end();
    for (std::size_t h = 0; h < c.kv_heads; ++h) {
      const bool same = std::memcmp(b.cache.k.row(slot, h), b0.cache.k.row(slot, h), c.head_dim) == 0 &&
                        *b.cache.k.scale(slot, h) == *b0.cache.k.scale(slot, h);
      EXPECT_EQ(same, !named) << "slot " << slot;
    }
  }
  // Token 5's Q differs from the input (rotated at position 8), its K was written back.
  float q5 = 0, k5 = 0;
  for (std::size_t i = 0; i < c.head_dim; ++i) {
    q5 += std::fabs(b.q_out.row(5, 0)[i] - b0.q.row(5, 0)[i]);
    k5 += std::fabs(b.k.row(5, 0)[i] - b0.k.row(5, 0)[i]);
  }
  EXPECT_GT(q5, 0.0f);
  EXPECT_GT(k5, 0.0f);
}

// write_back_k: k holds the normalized, rotated K rounded to the input
// type; without it k is left as it was (checked with a fused buffer, where
// k sits between q and v in every token).
TEST(NormRopeAppend, WriteBackOnlyWhenAsked) {
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

// Threads 1, 2, 3 and executors: the same bytes, and the work goes through
// the executor when one is set.
template <class In, class QO, class E>
void expect_same_bytes_whoever_runs(Case c) {
  c.tokens = 11;
  c.threads = 1;
  const Fixture<In, QO, E> one(c);
  const auto want = one.run();
  EXPECT_TRUE(same_state(want, one.expected()));
  for (const std::size_t threads : {std::size_t{2}, std::size_t{3}}) {
    c.threads = threads;
    EXPECT_TRUE(same_state(Fixture<In, QO, E>(c).run(), want)) << "threads " << threads;
  }
  rope_test::ThreadPool pool(3);
  for (const std::size_t threads : {std::size_t{1}, std::size_t{4}}) {
    for (const std::size_t workers : {std::size_t{2}, std::size_t{3}}) {
      c.threads = threads;
      c.executor = pool.executor(workers);
      const std::size_t before = pool.tasks_run();
      EXPECT_TRUE(same_state(Fixture<In, QO, E>(c).run(), want))
          << "pool workers " << workers << " threads " << threads;
      EXPECT_EQ(pool.tasks_run() - before, workers) << "threads " << threads;
      rope_test::ReverseExecutor reverse;
      c.executor = reverse.executor(workers);
      EXPECT_TRUE(same_state(Fixture<In, QO, E>(c).run(), want)) << "reverse workers " << workers;
      EXPECT_EQ(reverse.tasks_run, workers) << "threads " << threads;
    }
  }
}

TEST(NormRopeAppend, SameBytesOnEveryThreadCountAndExecutor) {
  Case c;
  c.norm = NormKind::whole;
  c.write_back = true;
  expect_same_bytes_whoever_runs<float, float, float>(c);
  c.fused = true;
  c.in_place = true;
  c.hnd = true;
  c.ids = true;
  expect_same_bytes_whoever_runs<BFloat16, BFloat16, I8>(c);
}

// A call of more tokens per worker than ra::kGroupedNormTokens normalizes
// one head at a time, a short one several at a time: the same bytes as the
// long call made token by token (each call one token, so grouped), on 1
// and 3 threads, per-head norm over an f32 and an i8 cache.
template <class E>
void expect_long_call_is_token_by_token() {
  const std::size_t T = 3 * ra::kGroupedNormTokens + 5, H = 6, G = 2, D = 40, page = 16;
  const std::size_t pages = (T + page - 1) / page;
  const rope::Table<float> table(rope::frequencies(D, 10000.0), T);
  const auto x = rope_test::random_vector<float>(T * (H + 2 * G) * D, 31, 2.0);
  auto qw = rope_test::random_vector<float>(D, 32, 1.0);
  auto kw = rope_test::random_vector<float>(D, 33, 1.0);
  std::vector<std::int64_t> slots(T);
  for (std::size_t t = 0; t < T; ++t) slots[t] = static_cast<std::int64_t>((t * 7) % T);  // 7 is prime to T
  slots[9] = -1;
  ra::AppendOptions o;
  o.rotation.table = &table;
  o.q_norm = {qw.data(), D};
  o.k_norm = {kw.data(), D};
  o.eps = 1e-5f;
  struct Out {
    std::vector<float> q;
    std::vector<E> kp, vp;
    std::vector<float> ks, vs;
  };
  const auto run = [&](std::size_t threads, bool token_by_token) {
    Out out;
    out.q.assign(T * H * D, -3.0f);
    out.kp.assign(pages * page * G * D, E{});
    out.vp.assign(pages * page * G * D, E{});
    out.ks.assign(rope::KvElement<E>::kScaled ? pages * page * G : 0, -1.0f);
    out.vs.assign(out.ks.size(), -1.0f);
    float* ks = out.ks.empty() ? nullptr : out.ks.data();
    float* vs = out.vs.empty() ? nullptr : out.vs.data();
    const ra::PagedCache<E> cache{ra::PagePool<E>::nhd(out.kp.data(), pages, page, G, D, ks),
                                  ra::PagePool<E>::nhd(out.vp.data(), pages, page, G, D, vs)};
    const std::size_t row = (H + 2 * G) * D;
    ra::AppendOptions opt = o;
    opt.threads = threads;
    const std::size_t step = token_by_token ? 1 : T;
    for (std::size_t t0 = 0; t0 < T; t0 += step) {
      const float* base = x.data() + t0 * row;
      const rope::View<const float> q(base, step, H, D, row, D), k(base + H * D, step, G, D, row, D),
          v(base + (H + G) * D, step, G, D, row, D);
      const rope::View<float> qo(out.q.data() + t0 * H * D, step, H, D, H * D, D);
      ra::norm_rope_append(q, k, v, static_cast<std::int64_t>(t0), slots.data() + t0, cache, qo, opt);
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

TEST(NormRopeAppend, LongCallIsTheCallTokenByToken) {
  expect_long_call_is_token_by_token<float>();
  expect_long_call_is_token_by_token<I8>();
}

// A NaN in one token's q, k or v row reaches that token's own outputs only.
template <class In, class E>
void expect_nan_confined(NormKind norm, char where) {
  Case c;
  c.norm = norm;
  c.tokens = 9;
  c.threads = 2;
  c.write_back = true;
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
      if (std::isnan(rope::detail::widen_value(x[i]))) return true;
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
      if (s.slots[t] < 0) continue;
      const auto slot = static_cast<std::size_t>(s.slots[t]);
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
  const auto slot4 = static_cast<std::size_t>(s.slots[4]);
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

TEST(NormRopeAppend, NanStaysInItsToken) {
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

// [3, tokens] positions, axis-major; the three axes differ at every token,
// so a pair read from the wrong axis changes its angle.
std::vector<std::int64_t> mrope_positions(std::size_t tokens) {
  std::vector<std::int64_t> p(3 * tokens);
  for (std::size_t t = 0; t < tokens; ++t) {
    p[t] = static_cast<std::int64_t>((t * 7 + 3) % kTablePositions);
    p[tokens + t] = static_cast<std::int64_t>((t * 13 + 40) % kTablePositions);
    p[2 * tokens + t] = static_cast<std::int64_t>((t * 29 + 21) % kTablePositions);
  }
  return p;
}

// The fused call with multi-axis positions equals, bit for bit, the steps
// one after another: the norm by hand (or none), rope::apply_mrope on the
// float rows of Q and K, Q rounded into q_out, and write_slots of the
// rotated K and of V (no rotation there) into the cache.
template <class E>
void expect_mrope_matches_unfused(const Case& c, const rope::MropeSections& sections) {
  const Fixture<float, float, E> s(c);
  const std::size_t pairs = (c.rotary_dim != 0 ? c.rotary_dim : s.table.rotary_dim()) / 2;
  const rope::PairAxes pa = rope::PairAxes::sections(sections, pairs);
  const std::vector<std::int64_t> axis_positions = mrope_positions(c.tokens);
  State<float, float, E> got = s.initial;
  {
    const auto b = s.bind(got);
    ra::AppendOptions o = s.options();
    o.pair_axes = &pa;
    o.axis_positions = axis_positions.data();
    ra::norm_rope_append(b.q, b.k, b.v, 0, s.slots.data(), b.cache, b.q_out, o);
  }
  State<float, float, E> want = s.initial;
  State<float, float, E> source = s.initial;
  const auto src = s.bind(source);
  const auto b = s.bind(want);
  std::vector<float> qf = s.unfused(src.q, s.qw, false), kf = s.unfused(src.k, s.kw, false);
  rope::Options ro;
  ro.rotary_dim = c.rotary_dim;
  const std::size_t T = c.tokens, D = c.head_dim;
  const auto qv = rope::View<float>::token_major(qf.data(), T, c.q_heads, D);
  const auto kv = rope::View<float>::token_major(kf.data(), T, c.kv_heads, D);
  rope::apply_mrope(qv, s.table, c.style, axis_positions.data(), pa, ro);
  rope::apply_mrope(kv, s.table, c.style, axis_positions.data(), pa, ro);
  for (std::size_t t = 0; t < T; ++t) {
    for (std::size_t h = 0; h < c.q_heads; ++h) std::memcpy(b.q_out.row(t, h), qv.row(t, h), D * sizeof(float));
    if (c.write_back) {
      for (std::size_t h = 0; h < c.kv_heads; ++h) std::memcpy(b.k.row(t, h), kv.row(t, h), D * sizeof(float));
    }
  }
  ra::write_slots(rope::View<const float>(kv), rope::View<const float>(src.v), s.slots.data(), b.cache);
  EXPECT_TRUE(same_state(got, want));
  // The rotation did something: q_out is not the normalized, unrotated Q.
  const std::vector<float> unrotated = s.unfused(src.q, s.qw, false);
  EXPECT_NE(std::memcmp(b.q_out.row(1, 0), unrotated.data() + c.q_heads * D, D * sizeof(float)), 0);
}

TEST(NormRopeAppendMultiAxis, MatchesNormThenApplyMropeThenWriteSlots) {
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
  expect_mrope_matches_unfused<BFloat16>(c, interleaved_full);
}

// Every axis holding the token's one position: the same bytes as the
// one-position call, positions as ids and as an offset.
TEST(NormRopeAppendMultiAxis, EqualAxesAreTheOnePositionCall) {
  for (const bool ids : {true, false}) {
    Case c;
    c.ids = ids;
    c.rotary_dim = 24;
    c.write_back = true;
    const Fixture<float, float, BFloat16> s(c);
    std::vector<std::int64_t> same(3 * c.tokens);
    for (std::size_t a = 0; a < 3; ++a) {
      for (std::size_t t = 0; t < c.tokens; ++t) same[a * c.tokens + t] = s.positions().at(t);
    }
    for (const auto order : {rope::SectionOrder::chunked, rope::SectionOrder::interleaved}) {
      const rope::PairAxes pa = rope::PairAxes::sections({{4, 4, 4}, order}, 12);
      State<float, float, BFloat16> got = s.initial;
      const auto b = s.bind(got);
      ra::AppendOptions o = s.options();
      o.pair_axes = &pa;
      o.axis_positions = same.data();
      ra::norm_rope_append(b.q, b.k, b.v, 0, s.slots.data(), b.cache, b.q_out, o);
      EXPECT_TRUE(same_state(got, s.run())) << "ids " << ids << " order " << int(order);
    }
  }
}

// ---- Refusals: the message names the argument, and nothing is written.

const char kFn[] = "rope::attention::norm_rope_append: ";

template <class E>
struct Refusal {
  Case c;
  Fixture<float, float, E> s;
  Refusal() : c(make()), s(c) {}
  static Case make() {
    Case c;
    c.write_back = true;
    return c;
  }
  using Bound = typename Fixture<float, float, E>::Bound;

  // Calls with the arguments as `change` leaves them; returns the message
  // and checks that no byte of any output changed.
  template <class Change>
  std::string message(Change&& change) {
    State<float, float, E> st = s.initial;
    Bound b = s.bind(st);
    ra::AppendOptions o = s.options();
    std::vector<std::int64_t> slots = s.slots;
    std::vector<std::int64_t> ids = s.ids;
    rope::Positions p = s.positions();
    change(b, o, slots, ids, p, st);
    const std::string m =
        rope_test::thrown_message([&] { ra::norm_rope_append(b.q, b.k, b.v, p, slots.data(), b.cache, b.q_out, o); });
    EXPECT_TRUE(same_state(st, s.initial)) << m;
    return m;
  }
};

void expect_refused(const std::string& msg, const std::string& argument, const std::string& also = "") {
  const std::string head = kFn + argument + " must be ";
  EXPECT_TRUE(msg.find(head) == 0 || msg.find("out_of_range: " + head) == 0) << "want " << head << "\ngot " << msg;
  if (!also.empty()) {
    EXPECT_NE(msg.find(also), std::string::npos) << msg;
  }
}

TEST(NormRopeAppendRefuses, SlotsOutsideThePoolOrTwice) {
  Refusal<I8> r;
  expect_refused(
      r.message([](auto&, auto&, auto& slots, auto&, auto&, auto&) { slots[2] = std::int64_t{kPages * kPageSize}; }),
      "slots[2]");
  expect_refused(r.message([](auto&, auto&, auto& slots, auto&, auto&, auto&) { slots[6] = -2; }), "slots[6]");
  expect_refused(r.message([](auto&, auto&, auto& slots, auto&, auto&, auto&) { slots[4] = slots[1]; }), "slots[1]",
                 "no other new token");
}

TEST(NormRopeAppendRefuses, NormWeightsOfTheWrongSize) {
  Refusal<I8> r;
  expect_refused(r.message([](auto&, auto& o, auto&, auto&, auto&, auto&) { o.q_norm.size += 1; }),
                 "options.q_norm.size");
  expect_refused(r.message([](auto&, auto& o, auto&, auto&, auto&, auto&) { o.k_norm.size -= 2; }),
                 "options.k_norm.size");
  // Per-head weights (head_dim values) with whole_projection.
  expect_refused(r.message([](auto&, auto& o, auto&, auto&, auto&, auto&) { o.whole_projection = true; }),
                 "options.q_norm.size", "whole_projection");
  expect_refused(r.message([&](auto&, auto& o, auto&, auto&, auto&, auto&) {
    o.whole_projection = true;
    o.q_norm = {nullptr, 0};
  }),
                 "options.k_norm.size", "whole_projection");
  expect_refused(r.message([](auto&, auto& o, auto&, auto&, auto&, auto&) { o.q_norm.data = nullptr; }),
                 "options.q_norm.data");
  expect_refused(r.message([](auto&, auto& o, auto&, auto&, auto&, auto&) { o.k_norm.data = nullptr; }),
                 "options.k_norm.data");
}

TEST(NormRopeAppendRefuses, EpsNotPositiveOrNotFinite) {
  Refusal<I8> r;
  for (const double eps :
       {0.0, -1e-6, std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(), 1e-60}) {
    expect_refused(r.message([&](auto&, auto& o, auto&, auto&, auto&, auto&) { o.eps = eps; }), "options.eps");
  }
}

TEST(NormRopeAppendRefuses, PositionsOutsideTheTable) {
  Refusal<I8> r;
  const std::int64_t last = static_cast<std::int64_t>(kTablePositions) - static_cast<std::int64_t>(r.c.tokens);
  expect_refused(r.message([&](auto&, auto&, auto&, auto&, auto& p, auto&) { p = last + 1; }),
                 "offset + 6 (the position of token 6)");
  expect_refused(r.message([&](auto&, auto&, auto&, auto&, auto& p, auto&) { p = std::int64_t{-1}; }),
                 "offset (the position of token 0)");
  expect_refused(r.message([&](auto&, auto&, auto&, auto& ids, auto& p, auto&) {
    ids[3] = std::int64_t{kTablePositions};
    p = ids.data();
  }),
                 "positions[3]");
  expect_refused(r.message([&](auto&, auto&, auto&, auto& ids, auto& p, auto&) {
    ids[5] = -1;  // the padding token too: Q is rotated
    p = ids.data();
  }),
                 "positions[5]");
  // The offset that just fits is accepted.
  EXPECT_EQ(rope_test::thrown_message([&] {
              State<float, float, I8> st = r.s.initial;
              const auto b = r.s.bind(st);
              ra::norm_rope_append(b.q, b.k, b.v, last, r.s.slots.data(), b.cache, b.q_out, r.s.options());
            }),
            "no exception");
}

TEST(NormRopeAppendRefuses, MultiAxisPositions) {
  Refusal<I8> r;
  const std::size_t T = r.c.tokens;
  const rope::PairAxes good = rope::PairAxes::sections({{8, 4, 4}, rope::SectionOrder::chunked}, 16);
  std::vector<std::int64_t> axis_positions = mrope_positions(T);
  const auto with = [&](const rope::PairAxes& pa, std::vector<std::int64_t>& positions) {
    return [&pa, &positions](auto&, auto& o, auto&, auto&, auto& p, auto&) {
      p = 0;
      o.pair_axes = &pa;
      o.axis_positions = positions.data();
    };
  };
  // Pair axes that do not fit the 16 pairs, or name an axis that is not there.
  rope::PairAxes short_axes = good;
  short_axes.axis.pop_back();
  expect_refused(r.message(with(short_axes, axis_positions)), "options.pair_axes->axis.size()",
                 "rotary_dim/2 = 16, got 15");
  rope::PairAxes bad_axis = good;
  bad_axis.axis[3] = 3;
  expect_refused(r.message(with(bad_axis, axis_positions)), "options.pair_axes->axis[3]", "< axes = 3, got 3");
  rope::PairAxes no_axes = good;
  no_axes.axes = 0;
  expect_refused(r.message(with(no_axes, axis_positions)), "options.pair_axes->axes", "got 0");
  // No positions for the axes.
  expect_refused(r.message([&](auto&, auto& o, auto&, auto&, auto& p, auto&) {
    p = 0;
    o.pair_axes = &good;
  }),
                 "options.axis_positions", "non-null when options.pair_axes is set, got null");
  // An axis' position outside the table (the padding token's too: Q is rotated).
  std::vector<std::int64_t> outside = axis_positions;
  outside[1 * T + 4] = std::int64_t{kTablePositions};
  expect_refused(r.message(with(good, outside)), "options.axis_positions[1][4]", "[0, 64), got 64");
  outside = axis_positions;
  outside[2 * T + 5] = -1;
  expect_refused(r.message(with(good, outside)), "options.axis_positions[2][5]", "got -1");
  // Positions of their own besides the pair axes.
  expect_refused(r.message([&](auto& b, auto& o, auto& s, auto& i, auto& p, auto& st) {
    with(good, axis_positions)(b, o, s, i, p, st);
    p = std::int64_t{3};
  }),
                 "positions", "0 when options.pair_axes is set (options.axis_positions holds the positions), got 3");
  expect_refused(r.message([&](auto& b, auto& o, auto& s, auto& ids, auto& p, auto& st) {
    with(good, axis_positions)(b, o, s, ids, p, st);
    p = ids.data();
  }),
                 "positions", "got an array of ids");
  // The same arguments with good axes and positions are accepted.
  EXPECT_EQ(rope_test::thrown_message([&] {
              State<float, float, I8> st = r.s.initial;
              const auto b = r.s.bind(st);
              ra::AppendOptions o = r.s.options();
              o.pair_axes = &good;
              o.axis_positions = axis_positions.data();
              ra::norm_rope_append(b.q, b.k, b.v, 0, r.s.slots.data(), b.cache, b.q_out, o);
            }),
            "no exception");
}

TEST(NormRopeAppendRefuses, OverlappingViews) {
  Refusal<I8> r;
  // q_out over k's rows (the padding after v leaves room for the whole view).
  expect_refused(r.message([](auto& b, auto&, auto&, auto&, auto&, auto&) { b.q_out.data = b.k.data; }), "q_out",
                 "disjoint from k");
  expect_refused(r.message([](auto& b, auto&, auto&, auto&, auto&, auto&) { b.q_out.data = b.v.data; }), "q_out",
                 "disjoint from v");
  // q_out over q, not exactly q.
  expect_refused(r.message([](auto& b, auto&, auto&, auto&, auto&, auto&) { b.q_out.data = b.q.data + 1; }), "q_out",
                 "disjoint from q");
}

TEST(NormRopeAppendRefuses, ViewsOverTheCache) {
  Refusal<float> r;
  expect_refused(r.message([](auto& b, auto&, auto&, auto&, auto&, auto&) { b.q.data = b.cache.k.data; }), "q",
                 "cache.k");
  expect_refused(r.message([](auto& b, auto&, auto&, auto&, auto&, auto&) { b.q.data = b.cache.v.data + 64; }), "q",
                 "cache.v");
  expect_refused(r.message([](auto& b, auto&, auto&, auto&, auto&, auto&) { b.k.data = b.cache.v.data; }), "k",
                 "cache.v");
  expect_refused(r.message([](auto& b, auto&, auto&, auto&, auto&, auto&) { b.q_out.data = b.cache.k.data; }), "q_out",
                 "cache.k");
  // int8 pools: a view over the scales.
  Refusal<I8> r8;
  expect_refused(r8.message([](auto& b, auto&, auto&, auto&, auto&, auto&) { b.q_out.data = b.cache.v.scales; }),
                 "q_out", "cache.v");
}

TEST(NormRopeAppendRefuses, ThreadsAndExecutor) {
  Refusal<I8> r;
  expect_refused(r.message([](auto&, auto& o, auto&, auto&, auto&, auto&) { o.threads = 0; }), "options.threads");
  rope_test::ReverseExecutor reverse;
  expect_refused(r.message([&](auto&, auto& o, auto&, auto&, auto&, auto&) { o.executor = reverse.executor(0); }),
                 "options.executor.workers");
  EXPECT_EQ(reverse.tasks_run, 0u);
}

TEST(NormRopeAppendRefuses, WriteBackOfAReadOnlyK) {
  Refusal<I8> r;
  State<float, float, I8> st = r.s.initial;
  const auto b = r.s.bind(st);
  const rope::View<const float> q(b.q), k(b.k), v(b.v);
  const std::string m = rope_test::thrown_message(
      [&] { ra::norm_rope_append(q, k, v, r.s.positions(), r.s.slots.data(), b.cache, b.q_out, r.s.options()); });
  expect_refused(m, "options.write_back_k", "read-only");
  EXPECT_TRUE(same_state(st, r.s.initial));
  // Without the write-back the read-only views are accepted.
  ra::AppendOptions o = r.s.options();
  o.write_back_k = false;
  EXPECT_EQ(rope_test::thrown_message(
                [&] { ra::norm_rope_append(q, k, v, r.s.positions(), r.s.slots.data(), b.cache, b.q_out, o); }),
            "no exception");
}

}  // namespace
