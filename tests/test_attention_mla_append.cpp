// The MLA append (attention/mla_append.hpp): the step before MLA
// attention, one pass per token, against its header's composition written
// apart from it:
//   row  = [ RMSNorm(c_kv) | R_p k_pe ]  rounded or quantized once into the planned slot
//   q_pe <- R_p q_pe                     rounded once into q_pe_out (which may be q_pe)
// - bit for bit: the latent part is a plain float loop in
//   kernels/rms_norm.hpp's order (eight fma chains folded pairwise, r,
//   (x r) w or (x r)(1 + w)); k_pe and q_pe are what rope::apply makes of
//   the same float rows at the plan's positions (both pairings, a partial
//   rotary width); each value rounded once into the cache type (bf16 and
//   f16 to nearest even, int8 per part: s = max |part| / 127, q = x / s
//   rounded to nearest even), every other slot and scale left as it was;
//   over input types, q_pe_out types, in place, strided views (the parts of
//   the kv_a projection's output and of q), pages not in order, a mixed
//   batch, threads and an executor;
// - the float row against long double: RMSNorm within (n/16 + 8) eps of
//   each value (the sum of squares in eight fma chains of n/8 and three
//   folds, gamma_(n/8 + 3) of ss, halved through the square root; sqrt, the
//   division, the addition of eps and 1/x: 4 roundings of r; x r w: 2), the
//   rotation within 2 eps (|x_a cos| + |x_b sin|) + 1e-12 (|x_a| + |x_b|)
//   (the table's cos and sin within half an ulp, two roundings of the
//   rotation, the double angle p theta off by 2^-53 of itself);
// - each stored value against that float row: bf16 within 2^-8 |x|, f16
//   within 2^-11 |x| (normal values), int8 within (m / 127) (1/2 + 2^-16)
//   with m the part's own max |x| (s = m / 127 and x / s each rounded once:
//   |s q - x| <= s/2 + 128 u s with u = 2^-24); the rope part a hundred
//   times smaller than the latent part, so one scale for
//   both would not hold it; ties to even, shown on rows built to tie.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include <rope/apply.hpp>
#include <rope/attention.hpp>

#include "executors.hpp"
#include "kv_elements.hpp"
#include "mla_oracle.hpp"

namespace {

using namespace mla_test;  // NOLINT: the suite's own fixture
using rope::BFloat16;
using rope::Float16;
using rope::View;
using rope_test::element_name;
using rope_test::for_each_element;

template <class T>
T round_to(float x) {
  return T(x);
}
inline float widen_any(float x) { return x; }
inline float widen_any(BFloat16 x) { return rope::detail::widen_value(x); }
inline float widen_any(Float16 x) { return rope::detail::widen_value(x); }

template <class T>
const char* row_name() {
  return std::is_same<T, float>::value ? "f32" : std::is_same<T, BFloat16>::value ? "bf16" : "f16";
}

// kernels/rms_norm.hpp's RMSNorm as a plain loop in its order.
void plain_rms_norm(float* x, std::size_t n, const float* w, float eps, bool plus_one) {
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (std::size_t c = 0; c < n; ++c) s[c % 8] = std::fma(x[c], x[c], s[c % 8]);
  const float ss = ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
  const float r = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  for (std::size_t c = 0; c < n; ++c) {
    const float xr = x[c] * r;
    x[c] = plus_one ? xr * (1.0f + w[c]) : xr * w[c];
  }
}

// One part of a row rounded once into E, from the definitions
// (kernels/kv_store.hpp's comment): int8 and fp8 with the part's own scale.
template <class E>
void round_part(const float* x, std::size_t n, E* out, float* scale) {
  if constexpr (std::is_same<E, std::int8_t>::value) {
    float m = 0.0f;
    for (std::size_t c = 0; c < n; ++c) m = std::max(m, std::fabs(x[c]));
    const float s = m / 127.0f;
    *scale = s;
    for (std::size_t c = 0; c < n; ++c) {
      out[c] = s > 0.0f ? static_cast<std::int8_t>(std::min(127.0f, std::max(-127.0f, std::nearbyint(x[c] / s)))) : 0;
    }
  } else if constexpr (rope_test::kFp8<E>) {
    // fp8: the part's own scale maps its largest onto the format's.
    float m = 0.0f;
    for (std::size_t c = 0; c < n; ++c) m = std::max(m, std::fabs(x[c]));
    const float s = m / E::max();
    *scale = s;
    for (std::size_t c = 0; c < n; ++c) out[c] = s > 0.0f ? E(x[c] / s) : E::from_bits(0);
  } else {
    (void)scale;
    for (std::size_t c = 0; c < n; ++c) out[c] = E(x[c]);
  }
}

enum class NormKind { none, weights, plus_one };

struct AppendCase {
  rope::Style style = rope::Style::block_diagonal;
  std::size_t rotary_dim = 0;  // 0: the table's, all of rope_dim
  NormKind norm = NormKind::weights;
  int threads = 1;  // 0: a pool's executor of 3 workers
  bool in_place = false;
  bool strided =
      false;  // c_kv and k_pe parts of one [tokens, latent + rope] row, q_pe part of [tokens, heads, nope + rope]
  double pe_size = 0.01;  // k_pe's magnitude, against c_kv's 2
};

std::string describe(const AppendCase& c) {
  return std::string(c.style == rope::Style::block_diagonal ? "block_diagonal" : "rotate_half") + ", rotary " +
         std::to_string(c.rotary_dim) + ", norm " + std::to_string(static_cast<int>(c.norm)) + ", threads " +
         std::to_string(c.threads) + (c.in_place ? ", in place" : "") + (c.strided ? ", strided" : "");
}

constexpr std::size_t kHeads = 6, kLatent = 44, kRope = 10, kNope = 7;

// The batch of every append test: a decode token after 36 keys, a chunk
// of 9 after 11, a sequence without new tokens, a prompt of 14, a one-key
// sequence; pages of 8, not in order.
Model append_model(const AppendCase& c) {
  return Model({kHeads, kLatent, kRope, kNope, 4}, {{1, 37}, {9, 20}, {0, 5}, {14, 14}, {1, 1}}, 8, 5, c.style);
}

// The float rows the header's composition makes for every new token: the
// latent part normed, k_pe and q_pe rotated by rope::apply.
struct Reference {
  std::vector<float> lat, pe, q_pe;  // [T, latent], [T, rope], [T, heads, rope]
};

template <class In>
struct Inputs {
  std::vector<In> kv_a, q;  // [T, latent + rope] (or two packed arrays), [T, heads, nope + rope] (or [T, heads, rope])
  std::vector<In> c_kv, k_pe;
  View<In> c_view, k_view, q_view;
};

template <class In>
Inputs<In> make_inputs(const Model& m, const AppendCase& c) {
  const std::size_t T = m.lay.tokens(), L = kLatent, R = kRope, H = kHeads;
  Inputs<In> in;
  const auto c_kv = rope_test::random_vector<float>(T * L, 31, 2.0);
  const auto k_pe = rope_test::random_vector<float>(T * R, 32, c.pe_size);
  const auto q_pe = rope_test::random_vector<float>(T * H * R, 33, 1.5);
  const auto q_nope = rope_test::random_vector<float>(T * H * kNope, 34, 1.5);
  if (c.strided) {
    in.kv_a.resize(T * (L + R));
    in.q.resize(T * H * (kNope + R));
    for (std::size_t t = 0; t < T; ++t) {
      for (std::size_t x = 0; x < L; ++x) in.kv_a[t * (L + R) + x] = round_to<In>(c_kv[t * L + x]);
      for (std::size_t x = 0; x < R; ++x) in.kv_a[t * (L + R) + L + x] = round_to<In>(k_pe[t * R + x]);
      for (std::size_t h = 0; h < H; ++h) {
        In* row = &in.q[(t * H + h) * (kNope + R)];
        for (std::size_t x = 0; x < kNope; ++x) row[x] = round_to<In>(q_nope[(t * H + h) * kNope + x]);
        for (std::size_t x = 0; x < R; ++x) row[kNope + x] = round_to<In>(q_pe[(t * H + h) * R + x]);
      }
    }
    in.c_view = View<In>(in.kv_a.data(), T, 1, L, L + R, L + R);
    in.k_view = View<In>(in.kv_a.data() + L, T, 1, R, L + R, L + R);
    in.q_view = View<In>(in.q.data() + kNope, T, H, R, H * (kNope + R), kNope + R);
  } else {
    for (float x : c_kv) in.c_kv.push_back(round_to<In>(x));
    for (float x : k_pe) in.k_pe.push_back(round_to<In>(x));
    for (float x : q_pe) in.q.push_back(round_to<In>(x));
    in.c_view = View<In>::token_major(in.c_kv.data(), T, 1, L);
    in.k_view = View<In>::token_major(in.k_pe.data(), T, 1, R);
    in.q_view = View<In>::token_major(in.q.data(), T, H, R);
  }
  return in;
}

template <class In>
Reference reference(const Model& m, const Inputs<In>& in, const AppendCase& c, float eps) {
  const std::size_t T = m.lay.tokens(), L = kLatent, R = kRope, H = kHeads;
  Reference ref;
  ref.lat.resize(T * L);
  ref.pe.resize(T * R);
  ref.q_pe.resize(T * H * R);
  for (std::size_t t = 0; t < T; ++t) {
    for (std::size_t x = 0; x < L; ++x) ref.lat[t * L + x] = widen_any(in.c_view.row(t, 0)[x]);
    for (std::size_t x = 0; x < R; ++x) ref.pe[t * R + x] = widen_any(in.k_view.row(t, 0)[x]);
    for (std::size_t h = 0; h < H; ++h) {
      for (std::size_t x = 0; x < R; ++x) ref.q_pe[(t * H + h) * R + x] = widen_any(in.q_view.row(t, h)[x]);
    }
    if (c.norm != NormKind::none) plain_rms_norm(&ref.lat[t * L], L, m.norm.data(), eps, c.norm == NormKind::plus_one);
  }
  std::vector<std::int64_t> positions(T);
  for (std::size_t t = 0; t < T; ++t) positions[t] = m.lay.position_of(t);
  rope::Options o;
  o.rotary_dim = c.rotary_dim;
  rope::apply(View<float>::token_major(ref.pe.data(), T, 1, R), *m.table, c.style, rope::Positions(positions.data()),
              o);
  rope::apply(View<float>::token_major(ref.q_pe.data(), T, H, R), *m.table, c.style, rope::Positions(positions.data()),
              o);
  return ref;
}

// The append of a case into a poisoned cache of E, q_pe_out of QO; every
// byte of the cache, q_pe_out and the inputs against the composition.
template <class In, class QO, class E>
void expect_matches_composition(const AppendCase& c) {
  const std::string what =
      std::string(row_name<In>()) + " -> " + row_name<QO>() + " q_pe, " + element_name<E>() + " cache, " + describe(c);
  SCOPED_TRACE(what);
  const Model m = append_model(c);
  const std::size_t T = m.lay.tokens(), L = kLatent, R = kRope, H = kHeads;
  Inputs<In> in = make_inputs<In>(m, c);
  const Inputs<In> before_in = make_inputs<In>(m, c);  // the same values, its own views
  std::vector<QO> q_out_data(T * H * R, round_to<QO>(-7.5f));
  View<QO> q_out = View<QO>::token_major(q_out_data.data(), T, H, R);
  if constexpr (std::is_same<In, QO>::value) {
    if (c.in_place) q_out = in.q_view;
  }
  Store<E> st(m.lay, m.d);
  const Store<E> before(st);
  ra::AppendOptions o;
  o.rotation = {m.table.get(), c.style, c.rotary_dim};
  if (c.norm != NormKind::none) o.k_norm = {m.norm.data(), m.norm.size()};
  o.plus_one = c.norm == NormKind::plus_one;
  o.eps = 1e-5;
  rope_test::ThreadPool pool(3);
  ra::Plan p;
  ra::plan(p, m.shape(), m.lay.batch(), c.threads == 0 ? rope::Threads(pool.executor(3)) : rope::Threads(c.threads));
  ra::append(p, st.cache, in.c_view, in.k_view, in.q_view, q_out, o);
  const Reference ref = reference(m, before_in, c, static_cast<float>(o.eps));

  std::vector<bool> written(m.lay.pages * m.lay.page_size, false);
  for (std::size_t t = 0; t < T; ++t) {
    const std::size_t b = m.lay.sequence_of(t), slot = m.lay.slot(b, m.lay.position_of(t));
    ASSERT_EQ(p.slot(t), static_cast<std::int64_t>(slot));
    written[slot] = true;
    std::vector<E> want(L + R);
    float scales[2] = {0, 0};
    round_part(&ref.lat[t * L], L, want.data(), &scales[0]);
    round_part(&ref.pe[t * R], R, want.data() + L, &scales[1]);
    EXPECT_EQ(std::memcmp(st.cache.row(slot), want.data(), (L + R) * sizeof(E)), 0) << "token " << t;
    if constexpr (rope::KvElement<E>::kScaled) {
      EXPECT_EQ(std::memcmp(st.cache.scale(slot), scales, sizeof(scales)), 0)
          << "token " << t << ": scales " << st.cache.scale(slot)[0] << ", " << st.cache.scale(slot)[1] << " want "
          << scales[0] << ", " << scales[1];
    }
    for (std::size_t h = 0; h < H; ++h) {
      for (std::size_t x = 0; x < R; ++x) {
        const QO want_q = round_to<QO>(ref.q_pe[(t * H + h) * R + x]);
        EXPECT_EQ(std::memcmp(&q_out.row(t, h)[x], &want_q, sizeof(QO)), 0) << "q_pe_out token " << t << " head " << h;
      }
    }
  }
  // Every other slot, its scales, and whatever the call does not write: as before.
  for (std::size_t slot = 0; slot < written.size(); ++slot) {
    if (written[slot]) continue;
    EXPECT_EQ(std::memcmp(st.cache.row(slot), before.cache.row(slot), (L + R) * sizeof(E)), 0) << "slot " << slot;
    if constexpr (rope::KvElement<E>::kScaled) {
      EXPECT_EQ(std::memcmp(st.cache.scale(slot), before.cache.scale(slot), 2 * sizeof(float)), 0) << "slot " << slot;
    }
  }
  EXPECT_EQ(in.kv_a.size(), before_in.kv_a.size());
  EXPECT_TRUE(same_bytes(in.kv_a, before_in.kv_a)) << "kv_a";
  EXPECT_TRUE(same_bytes(in.c_kv, before_in.c_kv)) << "c_kv";
  EXPECT_TRUE(same_bytes(in.k_pe, before_in.k_pe)) << "k_pe";
  if (!c.in_place) {
    EXPECT_TRUE(same_bytes(in.q, before_in.q)) << "q";
  } else if (c.strided) {
    for (std::size_t i = 0; i < in.q.size(); ++i) {
      if (i % (kNope + R) < kNope) {
        EXPECT_EQ(std::memcmp(&in.q[i], &before_in.q[i], sizeof(In)), 0) << "q_nope " << i;
      }
    }
  }
}

template <class In, class QO>
void sweep_cache_types(const AppendCase& c) {
  expect_matches_composition<In, QO, float>(c);
  expect_matches_composition<In, QO, BFloat16>(c);
  expect_matches_composition<In, QO, Float16>(c);
  expect_matches_composition<In, QO, std::int8_t>(c);
}

TEST(MlaAppend, MatchesTheComposition) {
  for (const rope::Style style : {rope::Style::block_diagonal, rope::Style::rotate_half}) {
    for (const std::size_t rotary : {std::size_t{0}, std::size_t{6}}) {
      for (const NormKind norm : {NormKind::none, NormKind::weights, NormKind::plus_one}) {
        AppendCase c;
        c.style = style;
        c.rotary_dim = rotary;
        c.norm = norm;
        c.threads = norm == NormKind::none ? 1 : norm == NormKind::weights ? 3 : 0;
        c.strided = rotary != 0;
        c.in_place = style == rope::Style::block_diagonal;
        sweep_cache_types<float, float>(c);
        c.in_place = false;
        sweep_cache_types<float, BFloat16>(c);
      }
    }
  }
}

TEST(MlaAppend, MatchesTheCompositionFor16BitInputs) {
  for (const bool in_place : {false, true}) {
    AppendCase c;
    c.in_place = in_place;
    c.strided = in_place;
    c.threads = 2;
    sweep_cache_types<BFloat16, BFloat16>(c);
    sweep_cache_types<Float16, Float16>(c);
    if (!in_place) sweep_cache_types<BFloat16, float>(c);
  }
}

// The append of a case (float inputs) into a fresh cache of E; returns the
// store, with q_pe_out (float) in *q_out.
template <class E>
Store<E> appended(const Model& m, const AppendCase& c, std::vector<float>* q_out) {
  const std::size_t T = m.lay.tokens();
  Inputs<float> in = make_inputs<float>(m, c);
  q_out->assign(T * kHeads * kRope, 0.0f);
  Store<E> st(m.lay, m.d);
  ra::AppendOptions o;
  o.rotation = {m.table.get(), c.style, c.rotary_dim};
  if (c.norm != NormKind::none) o.k_norm = {m.norm.data(), m.norm.size()};
  o.plus_one = c.norm == NormKind::plus_one;
  ra::Plan p;
  ra::plan(p, m.shape(), m.lay.batch(), c.threads);
  ra::append(p, st.cache, in.c_view, in.k_view, in.q_view, View<float>::token_major(q_out->data(), T, kHeads, kRope),
             o);
  return st;
}

// x rotated at position p in long double with the exact angles, and each
// rotated value's bound 2 eps (|x_a cos| + |x_b sin|) + 1e-12 (|x_a| + |x_b|).
void rotate_ld(const std::vector<LD>& x, const Model& m, rope::Style style, std::int64_t p, std::vector<LD>* y,
               std::vector<double>* bound) {
  *y = at::rotate(x, m.freqs.inv_freq, style, static_cast<LD>(p));
  bound->assign(x.size(), 0.0);
  const std::size_t pairs = m.freqs.inv_freq.size(), r = 2 * pairs;
  for (std::size_t i = 0; i < pairs; ++i) {
    const std::size_t a = style == rope::Style::rotate_half ? i : 2 * i;
    const std::size_t b = style == rope::Style::rotate_half ? i + r / 2 : 2 * i + 1;
    const LD angle = static_cast<LD>(p) * static_cast<LD>(m.freqs.inv_freq[i]);
    const LD mag = std::fabs(x[a] * std::cos(angle)) + std::fabs(x[b] * std::sin(angle)) +
                   std::fabs(x[b] * std::cos(angle)) + std::fabs(x[a] * std::sin(angle));
    (*bound)[a] = (*bound)[b] = static_cast<double>(2 * kEps * mag + 1e-12L * (std::fabs(x[a]) + std::fabs(x[b])));
  }
}

// The float row against long double: RMSNorm(c_kv) * w within
// (n/16 + 8) eps of each value, k_pe and q_pe rotated within the rotation's
// bound (the header comment derives both).
TEST(MlaAppend, FloatRowWithinItsBoundOfLongDouble) {
  for (const rope::Style style : {rope::Style::block_diagonal, rope::Style::rotate_half}) {
    for (const NormKind norm : {NormKind::weights, NormKind::plus_one}) {
      AppendCase c;
      c.style = style;
      c.norm = norm;
      c.pe_size = 1.5;
      const Model m = append_model(c);
      const Inputs<float> in = make_inputs<float>(m, c);
      std::vector<float> q_out;
      const Store<float> st = appended<float>(m, c, &q_out);
      const LD eps = static_cast<LD>(static_cast<float>(ra::AppendOptions{}.eps));
      double worst = 0;
      for (std::size_t t = 0; t < m.lay.tokens(); ++t) {
        const std::int64_t p = m.lay.position_of(t);
        const float* row = st.cache.row(m.lay.slot(m.lay.sequence_of(t), p));
        LD ss = 0;
        for (std::size_t x = 0; x < kLatent; ++x)
          ss += static_cast<LD>(in.c_view.row(t, 0)[x]) * in.c_view.row(t, 0)[x];
        const LD r = 1.0L / std::sqrt(ss / kLatent + eps);
        for (std::size_t x = 0; x < kLatent; ++x) {
          const LD w = norm == NormKind::plus_one ? 1.0L + m.norm[x] : static_cast<LD>(m.norm[x]);
          const LD want = static_cast<LD>(in.c_view.row(t, 0)[x]) * r * w;
          const double bound = (kLatent / 16.0 + 8) * kEps * static_cast<double>(std::fabs(want));
          const double err = static_cast<double>(std::fabs(row[x] - want));
          worst = std::max(worst, err / bound);
          EXPECT_LE(err, bound) << "token " << t << " latent " << x;
        }
        std::vector<LD> k(in.k_view.row(t, 0), in.k_view.row(t, 0) + kRope), want;
        std::vector<double> bound;
        rotate_ld(k, m, style, p, &want, &bound);
        for (std::size_t x = 0; x < kRope; ++x) {
          EXPECT_LE(static_cast<double>(std::fabs(row[kLatent + x] - want[x])), bound[x])
              << "token " << t << " k_pe " << x;
        }
        for (std::size_t h = 0; h < kHeads; ++h) {
          std::vector<LD> q(in.q_view.row(t, h), in.q_view.row(t, h) + kRope);
          rotate_ld(q, m, style, p, &want, &bound);
          for (std::size_t x = 0; x < kRope; ++x) {
            EXPECT_LE(static_cast<double>(std::fabs(q_out[(t * kHeads + h) * kRope + x] - want[x])), bound[x])
                << "token " << t << " q_pe head " << h;
          }
        }
      }
      EXPECT_GT(worst, 0.0);
    }
  }
}

// Each stored value of a 16-bit or int8 cache against the float row (the
// f32 cache's, of the same call): one rounding, bf16 within 2^-8 |x|, f16
// within 2^-11 |x| for normal values (2^-25 for the rope part's subnormal
// ones: half their spacing), int8 within (m / 127) (1/2 + 2^-16), m the
// largest |x| of the value's own part. The rope part is a hundred times
// smaller than the latent part: one scale for the row would put its error
// near the latent's s / 2. The bound is reached: the worst value comes
// within 80% of it.
TEST(MlaAppend, StoredValuesWithinOneRoundingOfTheFloatRow) {
  AppendCase c;
  c.norm = NormKind::weights;
  const Model m = append_model(c);
  std::vector<float> q_out;
  const Store<float> exact = appended<float>(m, c, &q_out);
  for_each_element([&](auto e) {
    using E = decltype(e);
    if constexpr (!std::is_same<E, float>::value) {
      const Store<E> st = appended<E>(m, c, &q_out);
      double worst[2] = {0, 0};
      for (std::size_t t = 0; t < m.lay.tokens(); ++t) {
        const std::size_t slot = m.lay.slot(m.lay.sequence_of(t), m.lay.position_of(t));
        const float* x = exact.cache.row(slot);
        const std::vector<LD> got = st.row(slot);
        for (std::size_t part = 0; part < 2; ++part) {
          const std::size_t from = part == 0 ? 0 : kLatent, to = part == 0 ? kLatent : kLatent + kRope;
          for (std::size_t i = from; i < to; ++i) {
            double bound = 0;
            if constexpr (std::is_same<E, std::int8_t>::value) {
              // The part's own scale, from the float row: max |part| / 127.
              float top = 0.0f;
              for (std::size_t k = from; k < to; ++k) top = std::max(top, std::fabs(x[k]));
              bound = top / 127.0 * (0.5 + std::ldexp(1.0, -16));
            } else if constexpr (rope_test::kFp8<E>) {
              float top = 0.0f;
              for (std::size_t k = from; k < to; ++k) top = std::max(top, std::fabs(x[k]));
              bound = static_cast<double>(rope_test::fp8_rounding<E>(std::fabs(static_cast<LD>(x[i])), top / E::max()));
            } else if (std::is_same<E, Float16>::value && std::fabs(x[i]) < std::ldexp(1.0f, -14)) {
              bound = std::ldexp(1.0, -25);  // a subnormal f16: half its spacing 2^-24
            } else {
              bound = std::ldexp(std::fabs(static_cast<double>(x[i])), std::is_same<E, BFloat16>::value ? -8 : -11);
            }
            const double err = static_cast<double>(std::fabs(got[i] - x[i]));
            EXPECT_LE(err, bound) << element_name<E>() << " token " << t << " value " << i;
            worst[part] = std::max(worst[part], err / bound);
          }
        }
      }
      EXPECT_GE(worst[0], 0.8) << element_name<E>() << ": the latent part's bound is not reached";
      EXPECT_GE(worst[1], 0.8) << element_name<E>() << ": the rope part's bound is not reached";
    }
  });
}

// Rows built to tie, stored without a norm at position 0 (where the
// rotation is the identity: cos 1, sin 0): each tie goes to the even
// neighbour. bf16 (7 fraction bits): 1 + 2^-8 -> 1, 1 + 3 2^-8 -> 1 + 2^-6;
// f16 (10 bits): 1 + 2^-11 -> 1, 1 + 3 2^-11 -> 1 + 2^-9; int8: the
// latent part's scale 1 (max 127), 2.5 -> 2, 3.5 -> 4, -2.5 -> -2, -0.5 -> 0;
// the rope part's own scale 2 (max 254), 5 -> 2, 7 -> 4, -3 -> -2.
TEST(MlaAppend, TiesRoundToEven) {
  constexpr std::size_t L = 8, R = 4, H = 1;
  const rope::Table<float> table(rope::frequencies(R, 10000.0), 4);
  ra::AppendOptions o;
  o.rotation = {&table, rope::Style::block_diagonal};
  auto run = [&](auto e, const std::vector<float>& c_kv, const std::vector<float>& k_pe) {
    using E = decltype(e);
    std::vector<E> data(2 * (L + R), poison<E>());
    std::vector<float> scales(rope::KvElement<E>::kScaled ? 4 : 0, kNaN);
    const auto cache = ra::LatentCache<E>::contiguous(data.data(), 2, L, R, scales.empty() ? nullptr : scales.data());
    ra::Plan p;
    ra::plan(p, ra::Shape::of(cache, H), 0, 1);
    std::vector<float> q(R, 1.0f);
    ra::append(p, cache, View<const float>::token_major(c_kv.data(), 1, 1, L),
               View<const float>::token_major(k_pe.data(), 1, 1, R), View<float>::token_major(q.data(), 1, H, R),
               View<float>::token_major(q.data(), 1, H, R), o);
    std::vector<float> got(L + R);
    for (std::size_t i = 0; i < L + R; ++i) got[i] = rope_test::widen(data[i]);
    return std::make_pair(got, scales);
  };
  const float u8 = std::ldexp(1.0f, -8), u11 = std::ldexp(1.0f, -11);
  {
    const auto [got, scales] =
        run(BFloat16{}, {1 + u8, 1 + 3 * u8, -(1 + u8), 4 + 4 * u8, 1, 2, 3, 4}, {1 + u8, -(1 + 3 * u8), 0.5f, 0.25f});
    const std::vector<float> want = {1, 1 + 4 * u8, -1, 4, 1, 2, 3, 4, 1, -(1 + 4 * u8), 0.5f, 0.25f};
    EXPECT_EQ(got, want) << "bf16";
  }
  {
    const auto [got, scales] = run(Float16{}, {1 + u11, 1 + 3 * u11, -(1 + u11), 4 + 4 * u11, 1, 2, 3, 4},
                                   {1 + u11, -(1 + 3 * u11), 0.5f, 0.25f});
    const std::vector<float> want = {1, 1 + 4 * u11, -1, 4, 1, 2, 3, 4, 1, -(1 + 4 * u11), 0.5f, 0.25f};
    EXPECT_EQ(got, want) << "f16";
  }
  {
    const auto [got, scales] = run(std::int8_t{}, {127, 2.5f, 3.5f, -2.5f, -0.5f, 0.5f, 1.5f, 126.5f}, {254, 5, 7, -3});
    const std::vector<float> want = {127, 2, 4, -2, 0, 0, 2, 126, 127, 2, 4, -2};
    EXPECT_EQ(got, want) << "int8 codes";
    ASSERT_EQ(scales.size(), 4u);
    EXPECT_EQ(scales[0], 1.0f);
    EXPECT_EQ(scales[1], 2.0f);
  }
}

}  // namespace
