// rope::attention::append with 16-bit rows (attention/append.hpp) on each
// architecture of the build whose code differs (rope_test::DistinctArchs;
// append's last template argument), each suite named by it: BFloat16 and
// Float16 q, q_out, k and v into caches of every element type give, bit for
// bit,
//   - the float call on the same architecture of the inputs widened to
//     float, each result then rounded once (q_out, k's write-back, the
//     cache's rows; int8 quantized), and
//   - the composition spelled out here: the widened rows, the plain RMSNorm
//     loop, each pair rotated with the architecture's rounding (one fused
//     multiply-add where it has them, rounded products elsewhere:
//     rounding_oracle.hpp's rotate_pair), rounded once;
// and the K/V form writes the fused form's K and V.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include <rope/attention.hpp>
// The checked call's definition: the test calls it on architectures of its
// own choosing, and a compiled attention library holds only its own.
#include <rope/attention/append.hpp>

#include "append_fixture.hpp"
#include "archs.hpp"
#include "rounding_oracle.hpp"

namespace {

using namespace append_test;  // NOLINT: the suite's own fixture
using rope::View;

template <class Arch>
class AppendArchs : public ::testing::Test {};
TYPED_TEST_SUITE(AppendArchs, rope_test::DistinctArchs, rope_test::ArchNames);

// The fused call of s's case on Arch, from s's initial state.
template <class Arch, class In, class QO, class E>
State<In, QO, E> run_on(const Fixture<In, QO, E>& s) {
  State<In, QO, E> st = s.initial;
  const auto b = s.bind(st);
  ra::Plan p;
  s.plan(p);
  ra::append<In, In, In, QO, E, Arch>(p, b.cache, b.q, b.k, b.v, b.q_out, s.options());
  return st;
}

// Rows of x widened and normalized (the fixture's plain loop), then each
// pair of the rotary part rotated at its token's position as Arch rounds.
template <class Arch, class In, class QO, class E>
std::vector<float> oracle_rows(const Fixture<In, QO, E>& s, const View<In>& x, const std::vector<float>& w) {
  std::vector<float> f = s.unfused(x, w, false);
  if (!s.c.rotate) return f;
  const std::size_t D = s.c.head_dim, r = s.c.rotary_dim != 0 ? s.c.rotary_dim : s.table.rotary_dim();
  for (std::size_t t = 0; t < x.tokens; ++t) {
    const auto m = static_cast<std::size_t>(s.lay.positions[t]);
    for (std::size_t h = 0; h < x.heads; ++h) {
      float* row = f.data() + (t * x.heads + h) * D;
      for (std::size_t p = 0; p < r / 2; ++p) {
        const bool half = s.c.style == Style::rotate_half;
        const std::size_t a =
            half ? rope::first_channel<Style::rotate_half>(p, r) : rope::first_channel<Style::block_diagonal>(p, r);
        const std::size_t bc =
            half ? rope::second_channel<Style::rotate_half>(p, r) : rope::second_channel<Style::block_diagonal>(p, r);
        float ya, yb;
        rope_test::rotate_pair<float>(row[a], row[bc], s.table.cos(m)[p], s.table.sin(m)[p],
                                      rope_test::kFusedMultiplyAdd<Arch>, ya, yb);
        row[a] = ya;
        row[bc] = yb;
      }
    }
  }
  return f;
}

template <class Arch, class In, class QO, class E>
void check_16_bit(const Case& c) {
  const Fixture<In, QO, E> s(c);
  const State<In, QO, E> got = run_on<Arch>(s);
  SCOPED_TRACE(std::string(Arch::name()) + " " + describe(c));
  // The float call on Arch of the widened inputs.
  Fixture<float, float, float> wide(c);
  for (std::size_t i = 0; i < s.initial.in.size(); ++i) wide.initial.in[i] = widen_any(s.initial.in[i]);
  State<float, float, float> fw = run_on<Arch>(wide);
  const auto fb = wide.bind(fw);
  const std::size_t T = c.tokens, H = c.q_heads, G = c.kv_heads, D = c.head_dim;
  std::vector<float> qf(T * H * D), kf(T * G * D);
  for (std::size_t t = 0; t < T; ++t) {
    for (std::size_t h = 0; h < H; ++h) std::memcpy(&qf[(t * H + h) * D], fb.q_out.row(t, h), D * sizeof(float));
    const auto slot = static_cast<std::size_t>(wide.lay.slots[t]);
    for (std::size_t h = 0; h < G; ++h) std::memcpy(&kf[(t * G + h) * D], fb.cache.k.row(slot, h), D * sizeof(float));
  }
  EXPECT_TRUE(same_state(got, s.written(qf, kf))) << "against the float call, rounded once";
  // The composition spelled out.
  State<In, QO, E> source = s.initial;
  const auto src = s.bind(source);
  const std::vector<float> qo = oracle_rows<Arch>(s, src.q, s.qw), ko = oracle_rows<Arch>(s, src.k, s.kw);
  EXPECT_TRUE(same_bytes(qf, qo, "the float call's Q against the oracle"));
  EXPECT_TRUE(same_bytes(kf, ko, "the float call's K against the oracle"));
  EXPECT_TRUE(same_state(got, s.written(qo, ko))) << "against the oracle, rounded once";
}

template <class Arch, class In, class QO>
void check_caches(const Case& c) {
  check_16_bit<Arch, In, QO, float>(c);
  check_16_bit<Arch, In, QO, BFloat16>(c);
  check_16_bit<Arch, In, QO, Float16>(c);
  check_16_bit<Arch, In, QO, I8>(c);
}

std::vector<Case> cases() {
  std::vector<Case> out;
  Case a;  // per-head norm, full rotary, a batch, K written back, q_out in place
  a.batch = true;
  a.write_back = true;
  a.in_place = true;
  out.push_back(a);
  Case b;  // whole-projection norm (Gemma's 1 + w), partial rotary, HND, streamed rows
  b.style = Style::block_diagonal;
  b.norm = NormKind::whole;
  b.plus_one = true;
  b.rotary_dim = 20;
  b.hnd = true;
  b.write_back = true;
  b.stores = rope::Stores::streaming;
  out.push_back(b);
  Case d;  // no norm, a fused QKV buffer, head_dim 18 (partial SIMD steps), past the grouped norm, 3 threads
  d.norm = NormKind::none;
  d.fused = true;
  d.head_dim = 18;
  d.rotary_dim = 14;
  d.tokens = ra::kGroupedNormTokens + 7;
  d.threads = 3;
  out.push_back(d);
  Case e = d;  // the same with a per-head norm
  e.norm = NormKind::per_head;
  e.batch = true;
  out.push_back(e);
  // Many values: a float result one ulp off rounds to another 16-bit value
  // only near a rounding boundary (about 2^-12 of Float16 values, 2^-15 of
  // BFloat16 ones), so a rotation rounded as another architecture rounds
  // shows in the 16-bit rows only over tens of thousands of them.
  Case f;
  f.tokens = 160;
  f.head_dim = 64;
  f.batch = true;
  out.push_back(f);
  return out;
}

TYPED_TEST(AppendArchs, BFloat16RowsAreTheFloatCallRoundedOnce) {
  for (const Case& c : cases()) check_caches<TypeParam, BFloat16, BFloat16>(c);
}

TYPED_TEST(AppendArchs, Float16RowsAreTheFloatCallRoundedOnce) {
  for (const Case& c : cases()) check_caches<TypeParam, Float16, Float16>(c);
}

TYPED_TEST(AppendArchs, BFloat16RowsIntoFloat16QOut) {
  for (Case c : cases()) {
    c.in_place = false;
    check_16_bit<TypeParam, BFloat16, Float16, I8>(c);
  }
}

// The K/V form on Arch writes the cache and k's write-back of the fused form.
TYPED_TEST(AppendArchs, KvFormWritesTheFusedFormsKv) {
  using Arch = TypeParam;
  for (Case c : cases()) {
    c.in_place = false;
    c.write_back = true;
    const Fixture<BFloat16, BFloat16, I8> s(c);
    const State<BFloat16, BFloat16, I8> fused = run_on<Arch>(s);
    State<BFloat16, BFloat16, I8> kv = s.initial;
    const auto b = s.bind(kv);
    ra::Plan p;
    s.plan(p);
    ra::AppendOptions o = s.options();
    o.q_norm = {};
    ra::append<BFloat16, BFloat16, I8, Arch>(p, b.cache, b.k, b.v, o);
    EXPECT_TRUE(same_bytes(kv.out, s.initial.out, "q_out (the K/V form writes no Q)"));
    kv.out = fused.out;
    EXPECT_TRUE(same_state(kv, fused)) << Arch::name() << " " << describe(c);
  }
}

}  // namespace
