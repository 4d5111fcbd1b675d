// rope::attention::append's K/V form (attention/append.hpp, the cache
// writer of attention/writer.hpp): new keys and values into the slots the
// plan derived (append_fixture.hpp derives them apart from the plan).
//   - each value rounded once as store_kv_row rounds it, from rows of
//     float, BFloat16 or Float16 into caches of every element type, V rows
//     of another width than K's, an HND K pool beside an NHD V pool; every
//     slot no new token names left as it was;
//   - K rotated at the plan's positions: rope::apply's rotation of the
//     float row, then rounded once (and that rotation within
//     4 eps (|x_a| + |x_b|) of reference::rotate); V not rotated; streamed
//     and cached stores the same bytes;
//   - rows the projection already wrote into their own slots: accepted, K
//     normalized and rotated in place, V left as it is; rows of the pool at
//     other slots, or of another type than the pool's: refused, nothing
//     written;
//   - the K/V form writes the fused form's K and V, bit for bit, over every
//     norm form, layout, store and thread count, with multi-axis positions
//     too, and refuses a Q norm.
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
#include <rope/reference.hpp>
#include <rope/table.hpp>

#include "append_fixture.hpp"
#include "kv_elements.hpp"
#include "support.hpp"

namespace {

using namespace append_test;  // NOLINT: the suite's own fixture
using rope::View;
using rope_test::element_name;
using rope_test::for_each_element;

constexpr float kEps = std::numeric_limits<float>::epsilon();

// Pools of E filled with values (int8: each value its own one-element
// vector, with a scale), K as HND and V as NHD, of `pages` pages of 4.
template <class E>
struct Pools {
  std::vector<E> kd, vd;
  std::vector<float> ks, vs;
  ra::PagedCache<E> cache;

  Pools(std::size_t pages, std::size_t heads, std::size_t d, std::size_t dv, std::uint32_t seed) {
    const auto fill = [&](std::vector<E>& out, std::size_t n, std::uint32_t s) {
      out.resize(n);
      const auto r = rope_test::random_vector<float>(n, s, 0.5);
      float unused = 0;
      for (std::size_t i = 0; i < n; ++i) rope::store_kv_row(&r[i], 1, &out[i], &unused);
    };
    const std::size_t slots = pages * kPageSize;
    fill(kd, slots * heads * d, seed);
    fill(vd, slots * heads * dv, seed + 1);
    float* kp = nullptr;
    float* vp = nullptr;
    if (rope::KvElement<E>::kScaled) {
      ks = rope_test::random_vector<float>(slots * heads, seed + 2);
      vs = rope_test::random_vector<float>(slots * heads, seed + 3);
      kp = ks.data();
      vp = vs.data();
    }
    cache = {ra::PagePool<E>::hnd(kd.data(), pages, kPageSize, heads, d, kp),
             ra::PagePool<E>::nhd(vd.data(), pages, kPageSize, heads, dv, vp)};
  }
  Pools(const Pools&) = delete;
};

ra::Shape shape_of(const Layout& lay, std::size_t heads, std::size_t d, std::size_t dv) {
  ra::Shape s;
  s.q_heads = heads;
  s.kv_heads = heads;
  s.head_dim = d;
  s.v_head_dim = dv;
  s.page_size = kPageSize;
  s.pages = lay.pages;
  return s;
}

// The K/V form into a cache of E from rows of In, no norm, no rotation:
// every planned slot holds what store_kv_row makes of the widened row,
// every other slot (and its scale) is as it was.
template <class E, class In>
void check_rounds_once() {
  const std::size_t heads = 2, d = 12, dv = 10;
  const Layout lay = make_layout({{5, 2}, {3, 0}, {0, 3}, {12, 1}}, kPageSize, 3);
  const std::size_t n = lay.positions.size();
  Pools<E> pools(lay.pages, heads, d, dv, 1);
  const std::vector<E> kd0 = pools.kd, vd0 = pools.vd;
  const std::vector<float> ks0 = pools.ks, vs0 = pools.vs;
  const auto kf = rope_test::random_vector<float>(n * heads * d, 4, 3.0);
  const auto vf = rope_test::random_vector<float>(n * heads * dv, 5, 3.0);
  std::vector<In> kin(kf.size()), vin(vf.size());
  for (std::size_t i = 0; i < kf.size(); ++i) kin[i] = round_to<In>(kf[i]);
  for (std::size_t i = 0; i < vf.size(); ++i) vin[i] = round_to<In>(vf[i]);
  ra::Plan p;
  ra::plan(p, shape_of(lay, heads, d, dv), lay.batch());
  ra::append(p, pools.cache, View<const In>::token_major(kin.data(), n, heads, d),
             View<const In>::token_major(vin.data(), n, heads, dv));
  const auto k0 = ra::PagePool<E>::hnd(const_cast<E*>(kd0.data()), lay.pages, kPageSize, heads, d);
  const auto v0 = ra::PagePool<E>::nhd(const_cast<E*>(vd0.data()), lay.pages, kPageSize, heads, dv);
  const bool scaled = rope::KvElement<E>::kScaled;
  for (std::size_t s = 0; s < lay.pages * kPageSize; ++s) {
    const auto it = std::find(lay.slots.begin(), lay.slots.end(), static_cast<std::int64_t>(s));
    const std::size_t t = static_cast<std::size_t>(it - lay.slots.begin());
    for (std::size_t h = 0; h < heads; ++h) {
      std::vector<E> want_k(d), want_v(dv);
      float want_ks = 0, want_vs = 0;
      if (t < n) {
        std::vector<float> row(d);
        for (std::size_t c = 0; c < d; ++c) row[c] = widen_any(kin[(t * heads + h) * d + c]);
        rope::store_kv_row(row.data(), d, want_k.data(), &want_ks);
        row.resize(dv);
        for (std::size_t c = 0; c < dv; ++c) row[c] = widen_any(vin[(t * heads + h) * dv + c]);
        rope::store_kv_row(row.data(), dv, want_v.data(), &want_vs);
      } else {
        std::copy(k0.row(s, h), k0.row(s, h) + d, want_k.begin());
        std::copy(v0.row(s, h), v0.row(s, h) + dv, want_v.begin());
        if (scaled) want_ks = ks0[s * heads + h], want_vs = vs0[s * heads + h];
      }
      const std::string what = std::string(element_name<E>()) + " slot " + std::to_string(s) + " head " +
                               std::to_string(h) + (t < n ? " written" : " not named");
      EXPECT_EQ(std::memcmp(pools.cache.k.row(s, h), want_k.data(), d * sizeof(E)), 0) << what;
      EXPECT_EQ(std::memcmp(pools.cache.v.row(s, h), want_v.data(), dv * sizeof(E)), 0) << what;
      if (scaled) {
        EXPECT_EQ(std::memcmp(pools.cache.k.scale(s, h), &want_ks, sizeof(float)), 0) << what;
        EXPECT_EQ(std::memcmp(pools.cache.v.scale(s, h), &want_vs, sizeof(float)), 0) << what;
      }
    }
  }
}

TEST(AppendKv, RoundsEachValueOnceIntoThePlannedSlots) {
  for_each_element([](auto e) {
    check_rounds_once<decltype(e), float>();
    check_rounds_once<decltype(e), BFloat16>();
    check_rounds_once<decltype(e), Float16>();
  });
}

// K rotated at the plan's positions (a table of rotary_dim 8 over rows of
// 12: the last 4 channels pass): rope::apply's rotation of the float row,
// then rounded once; that rotation within 4 eps (|x_a| + |x_b|) of
// reference::rotate. V is not rotated.
template <class E>
void check_rotated() {
  const std::size_t heads = 2, d = 12;
  const rope::Table<float> table(rope::frequencies(8, 10000.0), 64);
  // Positions 0 .. 1, 63 (a decode token at the table's last row), 17 .. 18, 40.
  const Layout lay = make_layout({{0, 2}, {63, 1}, {17, 2}, {40, 1}}, kPageSize, 9);
  const std::size_t n = lay.positions.size();
  const auto kf = rope_test::random_vector<float>(n * heads * d, 6, 2.0);
  const auto vf = rope_test::random_vector<float>(n * heads * d, 7, 2.0);
  ra::Plan p;
  ra::plan(p, shape_of(lay, heads, d, d), lay.batch());
  for (const rope::Stores stores : {rope::Stores::cached, rope::Stores::streaming}) {
    for (const Style style : {Style::rotate_half, Style::block_diagonal}) {
      Pools<E> pools(lay.pages, heads, d, d, 2);
      ra::AppendOptions o;
      o.rotation = {&table, style};
      o.stores = stores;  // streamed rows: the same bytes
      ra::append(p, pools.cache, View<const float>::token_major(kf.data(), n, heads, d),
                 View<const float>::token_major(vf.data(), n, heads, d), o);
      std::vector<float> rotated = kf;
      rope::apply(View<float>::token_major(rotated.data(), n, heads, d), table, style,
                  rope::Positions(lay.positions.data()));
      for (std::size_t t = 0; t < n; ++t) {
        const auto m = static_cast<std::size_t>(lay.positions[t]);
        for (std::size_t h = 0; h < heads; ++h) {
          const float* r = &rotated[(t * heads + h) * d];
          const float* x = &kf[(t * heads + h) * d];
          std::vector<float> twin(x, x + d);
          if (style == Style::rotate_half) {
            rope::reference::rotate<Style::rotate_half>(x, twin.data(), table.cos(m), table.sin(m), 8);
          } else {
            rope::reference::rotate<Style::block_diagonal>(x, twin.data(), table.cos(m), table.sin(m), 8);
          }
          for (std::size_t c = 0; c < d; ++c) {
            ASSERT_LE(std::fabs(r[c] - twin[c]), 4 * kEps * 2 * 2.0) << "rotation far from reference::rotate";
          }
          std::vector<E> want_k(d), want_v(d);
          float want_ks = 0, want_vs = 0;
          rope::store_kv_row(r, d, want_k.data(), &want_ks);
          rope::store_kv_row(&vf[(t * heads + h) * d], d, want_v.data(), &want_vs);
          const auto s = static_cast<std::size_t>(lay.slots[t]);
          const std::string what = std::string(element_name<E>()) + " " + rope::name(style) + " token " +
                                   std::to_string(t) + " head " + std::to_string(h) +
                                   (stores == rope::Stores::streaming ? " streaming" : "");
          EXPECT_EQ(std::memcmp(pools.cache.k.row(s, h), want_k.data(), d * sizeof(E)), 0) << what;
          EXPECT_EQ(std::memcmp(pools.cache.v.row(s, h), want_v.data(), d * sizeof(E)), 0) << "V rotated? " << what;
          if (rope::KvElement<E>::kScaled) {
            EXPECT_EQ(*pools.cache.k.scale(s, h), want_ks) << what;
            EXPECT_EQ(*pools.cache.v.scale(s, h), want_vs) << what;
          }
        }
      }
    }
  }
}

TEST(AppendKv, RotatesKAtThePlansPositions) {
  for_each_element([](auto e) { check_rotated<decltype(e)>(); });
}

// Rows the projection already wrote into their own slots (one sequence, 1
// key cached, 3 new at positions 1 .. 3 of its first page): accepted, K
// normalized (or not) and rotated in place, V left as it is, every other
// slot as it was; an NHD and an HND pool, a float and a BFloat16 cache.
template <class E>
void check_in_place(bool hnd, bool norm) {
  const std::size_t heads = 2, d = 8, n = 3;
  const rope::Table<float> table(rope::frequencies(d, 10000.0), 32);
  const Layout lay = make_layout({{1, n}}, kPageSize, 4);
  std::vector<E> kd(lay.pages * kPageSize * heads * d), vd(kd.size());
  const auto kr = rope_test::random_vector<float>(kd.size(), 8), vr = rope_test::random_vector<float>(vd.size(), 9);
  for (std::size_t i = 0; i < kd.size(); ++i) kd[i] = round_to<E>(kr[i]), vd[i] = round_to<E>(vr[i]);
  const auto pool = hnd ? &ra::PagePool<E>::hnd : &ra::PagePool<E>::nhd;
  const ra::PagedCache<E> cache{pool(kd.data(), lay.pages, kPageSize, heads, d, nullptr),
                                pool(vd.data(), lay.pages, kPageSize, heads, d, nullptr)};
  const auto first = static_cast<std::size_t>(lay.slots[0]);
  for (std::size_t t = 1; t < n; ++t) ASSERT_EQ(lay.slots[t], lay.slots[0] + static_cast<std::int64_t>(t));
  const View<E> k_new(cache.k.row(first, 0), n, heads, d, cache.k.token_stride, cache.k.head_stride);
  const View<E> v_new(cache.v.row(first, 0), n, heads, d, cache.v.token_stride, cache.v.head_stride);
  const std::vector<float> kw = rope_test::random_vector<float>(d, 10, 1.0);
  // The unfused steps on the widened rows.
  std::vector<float> want(n * heads * d);
  for (std::size_t t = 0; t < n; ++t) {
    for (std::size_t h = 0; h < heads; ++h) {
      float* row = &want[(t * heads + h) * d];
      for (std::size_t c = 0; c < d; ++c) row[c] = widen_any(k_new.row(t, h)[c]);
      if (norm) plain_rms_norm(row, d, kw.data(), 1e-6f, false);
    }
  }
  rope::apply(View<float>::token_major(want.data(), n, heads, d), table, Style::rotate_half,
              rope::Positions(lay.positions.data()));
  const std::vector<E> k_before = kd, v_before = vd;
  ra::AppendOptions o;
  o.rotation = {&table, Style::rotate_half};
  if (norm) o.k_norm = {kw.data(), d};
  ra::Plan p;
  ra::plan(p, shape_of(lay, heads, d, d), lay.batch());
  ra::append(p, cache, k_new, v_new, o);
  const auto k0 = pool(const_cast<E*>(k_before.data()), lay.pages, kPageSize, heads, d, nullptr);
  const std::string what = std::string(element_name<E>()) + (hnd ? " hnd" : " nhd") + (norm ? " norm" : "");
  for (std::size_t s = 0; s < lay.pages * kPageSize; ++s) {
    const bool mine = s >= first && s < first + n;
    for (std::size_t h = 0; h < heads; ++h) {
      std::vector<E> row(k0.row(s, h), k0.row(s, h) + d);
      if (mine) {
        for (std::size_t c = 0; c < d; ++c) row[c] = round_to<E>(want[((s - first) * heads + h) * d + c]);
      }
      EXPECT_EQ(std::memcmp(cache.k.row(s, h), row.data(), d * sizeof(E)), 0) << what << " slot " << s << " head " << h;
    }
  }
  EXPECT_TRUE(same_bytes(vd, v_before, "cache.v")) << what;
  // The same rows under a plan whose slots they are not (no key cached:
  // slots one lower): refused, nothing written.
  const Layout other = make_layout({{0, n}}, kPageSize, 4);
  ASSERT_EQ(other.block_table, lay.block_table);
  ra::plan(p, shape_of(other, heads, d, d), other.batch());
  const std::vector<E> k_now = kd;
  const std::string msg = rope_test::thrown_message([&] { ra::append(p, cache, k_new, v_new, o); });
  EXPECT_EQ(msg.rfind("rope::attention::append: k must be apart from cache.k, or each row the row of its own slot", 0),
            0u)
      << msg;
  EXPECT_TRUE(same_bytes(kd, k_now, "cache.k")) << what;
  EXPECT_TRUE(same_bytes(vd, v_before, "cache.v")) << what;
}

TEST(AppendKv, RowsAlreadyInTheirOwnSlotsAreRotatedInPlace) {
  for (const bool hnd : {false, true}) {
    for (const bool norm : {false, true}) {
      check_in_place<float>(hnd, norm);
      check_in_place<BFloat16>(hnd, norm);
    }
  }
}

// Rows at their own slots but of another type than the pool's (float rows
// over a BFloat16 pool's bytes): not the slots' rows, refused.
TEST(AppendKv, RowsOverThePoolOfAnotherTypeAreRefused) {
  const std::size_t heads = 2, d = 8, n = 2;
  const Layout lay = make_layout({{0, n}}, kPageSize, 4);
  std::vector<BFloat16> kd(lay.pages * kPageSize * heads * d, BFloat16(1.0f)), vd(kd.size(), BFloat16(2.0f));
  const ra::PagedCache<BFloat16> cache{ra::PagePool<BFloat16>::nhd(kd.data(), lay.pages, kPageSize, heads, d),
                                       ra::PagePool<BFloat16>::nhd(vd.data(), lay.pages, kPageSize, heads, d)};
  const auto first = static_cast<std::size_t>(lay.slots[0]);
  std::vector<float> vf(n * heads * d, 0.5f);
  const View<float> k_new(reinterpret_cast<float*>(cache.k.row(first, 0)), n, heads, d / 2, heads * d / 2, d / 2);
  ra::Shape s = shape_of(lay, heads, d / 2, d);
  ra::Plan p;
  ra::plan(p, s, lay.batch());
  ra::PagedCache<BFloat16> half = cache;
  half.k.head_dim = d / 2;  // rows of d/2 floats span the bytes of d bfloat16 values
  half.k.token_stride = heads * d;
  half.k.head_stride = d;
  half.k.page_stride = kPageSize * heads * d;
  for (std::size_t t = 0; t < n; ++t) {
    for (std::size_t h = 0; h < heads; ++h) {
      ASSERT_EQ(static_cast<const void*>(k_new.row(t, h)),
                static_cast<const void*>(half.k.row(static_cast<std::size_t>(lay.slots[t]), h)));
    }
  }
  const std::vector<BFloat16> k0 = kd, v0 = vd;
  const std::string msg =
      rope_test::thrown_message([&] { ra::append(p, half, k_new, View<float>::token_major(vf.data(), n, heads, d)); });
  EXPECT_EQ(msg.rfind("rope::attention::append: k must be apart from cache.k, or each row the row of its own slot", 0),
            0u)
      << msg;
  EXPECT_TRUE(same_bytes(kd, k0, "cache.k"));
  EXPECT_TRUE(same_bytes(vd, v0, "cache.v"));
}

// The K/V form (no Q norm) writes the cache, its scales and k's write-back
// of the fused form, bit for bit, and nothing else.
template <class In, class QO, class E>
void expect_kv_is_fused(Case c, bool multi_axis) {
  c.in_place = false;
  const Fixture<In, QO, E> s(c);
  ra::AppendOptions o = s.options();
  const std::size_t pairs = (c.rotary_dim != 0 ? c.rotary_dim : s.table.rotary_dim()) / 2;
  const rope::PairAxes pa = rope::PairAxes::sections({{pairs - 8, 4, 4}, rope::SectionOrder::chunked}, pairs);
  const std::vector<std::int64_t> axis_positions = mrope_positions(c.tokens);
  if (multi_axis) {
    o.pair_axes = &pa;
    o.axis_positions = axis_positions.data();
  }
  const State<In, QO, E> fused = s.run_with(o);
  State<In, QO, E> kv = s.initial;
  const auto b = s.bind(kv);
  ra::Plan p;
  s.plan(p);
  o.q_norm = {};
  ra::append(p, b.cache, b.k, b.v, o);
  const std::string what = describe(c) + (multi_axis ? " multi-axis" : "");
  EXPECT_TRUE(same_bytes(kv.out, s.initial.out, "q_out (the K/V form writes no Q)")) << what;
  EXPECT_FALSE(same_state(fused, s.initial)) << "the fused call wrote nothing: " << what;
  kv.out = fused.out;
  EXPECT_TRUE(same_state(kv, fused)) << what;
}

TEST(AppendKv, WritesTheFusedFormsKv) {
  for (const NormKind norm : {NormKind::none, NormKind::per_head, NormKind::whole}) {
    for (int layout = 0; layout < 4; ++layout) {
      Case c;
      c.norm = norm;
      c.plus_one = layout == 1;
      c.batch = layout & 1;
      c.hnd = layout & 2;
      c.fused = layout == 2;
      c.write_back = layout != 0;
      c.style = layout == 3 ? Style::block_diagonal : Style::rotate_half;
      c.rotary_dim = layout == 3 ? 20 : 0;
      c.stores = layout == 2 ? rope::Stores::streaming : rope::Stores::automatic;
      c.threads = layout == 3 ? 3 : 1;
      expect_kv_is_fused<float, float, I8>(c, false);
      expect_kv_is_fused<BFloat16, BFloat16, BFloat16>(c, false);
      expect_kv_is_fused<Float16, float, float>(c, layout == 1);
      expect_kv_is_fused<float, float, Float16>(c, layout == 3);
    }
  }
  // A prefill past the grouped norm's tokens.
  Case c;
  c.tokens = ra::kGroupedNormTokens + 5;
  c.write_back = true;
  expect_kv_is_fused<float, float, float>(c, false);
  expect_kv_is_fused<BFloat16, BFloat16, I8>(c, false);
}

// The K/V form writes no Q: a Q norm is refused by name, nothing written.
TEST(AppendKv, RefusesAQNorm) {
  Case c;
  c.write_back = true;
  const Fixture<float, float, I8> s(c);
  State<float, float, I8> st = s.initial;
  const auto b = s.bind(st);
  ra::Plan p;
  s.plan(p);
  const ra::AppendOptions o = s.options();
  ASSERT_NE(o.q_norm.data, nullptr);
  EXPECT_EQ(rope_test::thrown_message([&] { ra::append(p, b.cache, b.k, b.v, o); }),
            "rope::attention::append: options.q_norm.data must be null: this form writes no Q, got set");
  EXPECT_TRUE(same_state(st, s.initial));
}

}  // namespace
