// The product modes' scores (kernels/kv_products.hpp) against their
// definitions, written here value by value, on each architecture whose code
// differs (rope_test::DistinctArchs), in float lanes, in float fused
// multiply-adds (the bf16 mode's twin in x86 code with FMA) and, where the
// CPU has them, through vdpbf16ps and vpdpbusd (and AVX2's vpmaddubsw for
// int8); the output names the instructions that ran on this host and
// those that could not:
//   - bf16: q rounded to nearest even and flushed below 2^-126; 16 lanes,
//     lane i adding for each block of 32 channels the exact product of
//     channels 2i + 1, then of 2i, each sum rounded once to float and
//     flushed (the definition in long double); the lanes' pairwise tree;
//     times the scale: bit for bit, for d below, at and past whole
//     blocks, rows of 1 to 9, normal, huge, tiny and subnormal values, zeros
//     of both signs, NaN and infinities;
//   - int8: q quantized per row (scale max|x| / 127, round half to even), a
//     NaN or infinite row NaN; the integer sum exact; (sum * s_q) * scale:
//     bit for bit;
//   - the fused twin taken exactly where no sum can be flushed (the least
//     exponent fields of q and the key adding to 142 or more), and the
//     same bits at that edge; its vector least-exponent of a key against
//     the scalar one;
//   - vdpbf16ps itself against the definition on random blocks (the
//     definition is what the instruction does, not only what rope computes).
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <limits>
#include <random>
#include <vector>

#include <rope/half.hpp>
#include <rope/kernels/kv_products.hpp>

#include "archs.hpp"

namespace {

using rope::BFloat16;

float bits_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}
float from_bf16(std::uint16_t b) { return bits_float(static_cast<std::uint32_t>(b) << 16); }
float ftz(float x) { return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.0f, x) : x; }
bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

// The bf16 mode's score, from its definition.
float bf16_definition(const std::vector<float>& x, const std::vector<BFloat16>& k, float scale) {
  const std::size_t d = x.size();
  std::vector<float> q(d), key(d);
  for (std::size_t c = 0; c < d; ++c) {
    q[c] = ftz(from_bf16(BFloat16(x[c]).bits));
    key[c] = ftz(from_bf16(k[c].bits));
  }
  float lane[16] = {};
  for (std::size_t base = 0; base < d; base += 32) {
    for (std::size_t i = 0; i < 16; ++i) {
      const std::size_t e = base + 2 * i, o = e + 1;
      // Each product exact (long double), each sum rounded once to float.
      const long double pe = e < d ? static_cast<long double>(q[e]) * key[e] : 0.0L;
      const long double po = o < d ? static_cast<long double>(q[o]) * key[o] : 0.0L;
      lane[i] = ftz(static_cast<float>(ftz(static_cast<float>(lane[i] + po)) + pe));
    }
  }
  for (std::size_t w = 1; w < 16; w *= 2) {
    for (std::size_t i = 0; i < 16; i += 2 * w) lane[i] = lane[i] + lane[i + w];
  }
  return lane[0] * scale;
}

// Values of every kind a row may hold; most of them normal values over a
// range of exponents wide enough that the lanes' sums round (bf16 products
// of like magnitudes add exactly in float, and would hide the order).
float any_value(std::mt19937& gen) {
  std::uniform_int_distribution<int> kind(0, 19), exponent(-12, 12);
  std::normal_distribution<float> normal;
  switch (kind(gen)) {
    case 0: return 0.0f;
    case 1: return -0.0f;
    case 2: return std::ldexp(normal(gen), -130);  // subnormal
    case 3: return std::ldexp(normal(gen), -120);  // tiny: products flush
    case 4: return std::ldexp(normal(gen), 60);    // huge: products overflow
    default: return std::ldexp(normal(gen), exponent(gen));
  }
}

template <class Arch>
class KvProducts : public ::testing::Test {};
TYPED_TEST_SUITE(KvProducts, rope_test::DistinctArchs, rope_test::ArchNames);

TYPED_TEST(KvProducts, Bf16ScoresAreTheDefinitionBitForBit) {
  using Arch = TypeParam;
  std::mt19937 gen(5);
  const bool hardware = rope::detail::kBf16DotArch<Arch> && rope::detail::avx512_bf16_runs<Arch>();
  std::cout << "[ products ] " << Arch::name() << ": bf16 scores in "
            << (hardware ? "vdpbf16ps and lane by lane" : "lane by lane (vdpbf16ps not here)")
            << (rope::detail::kBf16FusedArch<Arch> ? ", and in float fma where the values allow" : "") << "\n";
  for (const bool allow : {true, false}) {
    rope::detail::products_hardware_allowed() = allow;
    for (const std::size_t d : {1, 7, 31, 32, 33, 64, 80, 128, 200, 1000}) {
      for (const std::size_t rows : {1, 3, 4, 5, 9}) {
        for (int trial = 0; trial < 4; ++trial) {
          std::vector<std::vector<float>> x(rows, std::vector<float>(d));
          std::vector<BFloat16> key(d);
          for (auto& row : x) {
            for (float& v : row) v = any_value(gen);
          }
          for (BFloat16& v : key) v = BFloat16(any_value(gen));
          if (trial == 3) {
            x[0][d / 2] = std::numeric_limits<float>::quiet_NaN();
            key[d - 1] = BFloat16(std::numeric_limits<float>::infinity());
          }
          const std::size_t stride = rope::detail::bf16_row(d);
          std::vector<std::uint16_t> q(rows * stride);
          for (std::size_t r = 0; r < rows; ++r) rope::detail::bf16_query(x[r].data(), d, q.data() + r * stride);
          // Without and with the rows widened for the fused twin (where
          // it runs, else the same call again).
          std::vector<float> wide(rows * stride);
          unsigned least = 0x1ff;
          for (std::size_t r = 0; r < rows; ++r) {
            rope::detail::bf16_query_wide(q.data() + r * stride, d, wide.data() + r * stride);
            least = std::min(least, rope::detail::bf16_least_exponent(q.data() + r * stride, d));
          }
          for (const bool widened : {false, true}) {
            std::vector<float> out(rows * 3, -7.0f);
            rope::detail::bf16_scores<Arch>(q.data(), stride, rows, key.data(), d, out.data(), 3, 0.125f,
                                            widened ? wide.data() : nullptr, stride, least);
            for (std::size_t r = 0; r < rows; ++r) {
              const float want = bf16_definition(x[r], key, 0.125f);
              ASSERT_TRUE(same_bits(out[r * 3], want) || (std::isnan(want) && std::isnan(out[r * 3])))
                  << "d " << d << " rows " << rows << " row " << r << " trial " << trial << " hardware " << allow
                  << " widened " << widened << ": " << out[r * 3] << " vs " << want;
              EXPECT_EQ(out[r * 3 + 1], -7.0f);  // nothing between the rows written
            }
          }
        }
      }
    }
  }
  rope::detail::products_hardware_allowed() = true;
}

// A bf16 value of exponent field e (1 .. 254) and significand m (128 ..
// 255, the leading one included): m * 2^(e - 134).
std::uint16_t bf16_of(unsigned e, unsigned m, bool negative) {
  return static_cast<std::uint16_t>((negative ? 0x8000u : 0u) | (e << 7) | (m & 0x7fu));
}

// The fused twin of the bf16 mode (float fused multiply-adds, no flushes)
// is taken only where no sum can be flushed: every product a multiple of
// 2^-126, which holds when the least exponent fields of q's and the key's
// nonzero values add to at least 142. At the edge: one lane adds 129 * 129
// units then -128 * 130 units (units of 2^(Eq + Ek - 268)), leaving one
// unit: 2^-126 when Eq + Ek = 142 (kept), 2^-127 at 141 (a subnormal sum,
// flushed to zero). The scores must be the definition's bits whether the
// twin or the lanes ran, and the twin must run exactly where the fields
// add to 142 or more; then the same over random values of fields from
// the edge up (3 fields wide, and 25 wide, whose sums round, so that the
// steps' order shows), subnormal, infinite and NaN keys among them (the
// lanes' steps).
TYPED_TEST(KvProducts, Bf16FusedTwinRunsOnlyWhereNothingFlushes) {
  using Arch = TypeParam;
  if constexpr (!rope::detail::kBf16FusedArch<Arch>) {
    std::cout << "[ products ] " << Arch::name() << ": no fused twin in code built for it\n";
    return;
  } else {
    rope::detail::products_hardware_allowed() = false;  // the twin, not vdpbf16ps
    std::mt19937 gen(17);
    std::uniform_int_distribution<unsigned> mantissa(128, 255), coin(0, 1);
    std::size_t fused = 0, lanes = 0;
    for (const std::size_t d : {32, 48, 128}) {
      const std::size_t stride = rope::detail::bf16_row(d);
      for (unsigned total = 138; total <= 146; ++total) {
        for (unsigned eq = 10; eq + 10 <= total; eq += 13) {
          const unsigned ek = total - eq;
          if (ek > 254) continue;
          for (int trial = 0; trial < 6; ++trial) {
            std::vector<std::uint16_t> q(stride, 0);
            std::vector<BFloat16> key(d);
            std::vector<float> x(d, 0.0f);
            if (trial == 0) {  // the one-unit lane, alone
              const std::size_t lane = gen() % 16;
              q[2 * lane + 1] = bf16_of(eq, 129, false);
              key[2 * lane + 1].bits = bf16_of(ek, 129, false);
              q[2 * lane] = bf16_of(eq, 128, true);
              key[2 * lane].bits = bf16_of(ek, 130, false);
            } else {  // random values, fields eq .. eq + w and ek .. ek + w
              // (w = 2: sums near the edge; 24: sums that round, which
              // hold the steps' order)
              const unsigned w = trial % 2 == 0 ? 3 : 25;
              for (std::size_t c = 0; c < d; ++c) {
                q[c] = bf16_of(eq + gen() % w, mantissa(gen), coin(gen) != 0);
                key[c].bits = bf16_of(ek + gen() % w, mantissa(gen), coin(gen) != 0);
              }
              q[gen() % d] = bf16_of(eq, 128, false);  // the least fields present
              key[gen() % d].bits = bf16_of(ek, 128, true);
              if (trial == 4) key[gen() % d].bits = 0x0003;                       // a subnormal key value
              if (trial == 5) key[gen() % d].bits = gen() % 2 ? 0x7f80 : 0xffc1;  // infinity or NaN
            }
            for (std::size_t c = 0; c < d; ++c) x[c] = from_bf16(q[c]);
            std::vector<float> wide(stride);
            rope::detail::bf16_query_wide(q.data(), d, wide.data());
            const unsigned q_least = rope::detail::bf16_least_exponent(q.data(), d);
            const unsigned k_least = rope::detail::bf16_key_least(key.data(), d);
            ASSERT_EQ(q_least, eq);
            ASSERT_EQ(k_least, trial >= 4 ? 0u : ek);
            const bool twin = rope::detail::bf16_fused_exact(q_least, k_least);
            EXPECT_EQ(twin, trial < 4 && total >= 142) << "fields " << eq << " + " << ek;
            (twin ? fused : lanes) += 1;
            float out = -7.0f;
            rope::detail::bf16_scores<Arch>(q.data(), stride, 1, key.data(), d, &out, 1, 0.125f, wide.data(), stride,
                                            q_least);
            const float want = bf16_definition(x, key, 0.125f);
            ASSERT_TRUE(same_bits(out, want) || (std::isnan(want) && std::isnan(out)))
                << "d " << d << " fields " << eq << " + " << ek << " trial " << trial << ": " << out << " vs " << want;
            if (trial == 0) {
              EXPECT_EQ(want, total >= 142 ? std::ldexp(0.125f, static_cast<int>(total) - 268) : 0.0f);
            }
          }
        }
      }
    }
    std::cout << "[ products ] " << Arch::name() << ": " << fused << " keys in float fma, " << lanes
              << " lane by lane\n";
    rope::detail::products_hardware_allowed() = true;
  }
}

// bf16_key_least (16 values at a time where the code has AVX2) is
// bf16_least_exponent (one at a time) on keys of every length around the vector's, with zeros, both
// signs, subnormal values, infinities and NaN anywhere.
TEST(KvProductsFused, KeyLeastIsTheScalarLeast) {
  std::mt19937 gen(23);
  for (std::size_t d = 1; d <= 80; ++d) {
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<BFloat16> key(d);
      const int kind = trial % 5;
      for (BFloat16& v : key) {
        const unsigned r = gen();
        v.bits = static_cast<std::uint16_t>(kind == 0 ? r : kind == 1 ? (r & 0x8000u) : (r & 0x80ffu) | 0x3f00u);
        if (kind >= 2 && gen() % 8 == 0)
          v.bits = static_cast<std::uint16_t>(gen() % 3 == 0 ? 0 : (gen() & 0x807fu) | 0x0080u);
        if (kind == 3 && gen() % 16 == 0) v.bits = static_cast<std::uint16_t>(gen() & 0x807fu);  // subnormal or zero
        if (kind == 4 && gen() % 32 == 0) v.bits = static_cast<std::uint16_t>((gen() & 0x807fu) | 0x7f80u);
      }
      const auto* bits = reinterpret_cast<const std::uint16_t*>(key.data());
      ASSERT_EQ(rope::detail::bf16_key_least(key.data(), d), rope::detail::bf16_least_exponent(bits, d))
          << "d " << d << " trial " << trial;
    }
  }
}

TYPED_TEST(KvProducts, Int8ScoresAreTheDefinitionBitForBit) {
  using Arch = TypeParam;
  std::mt19937 gen(9);
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> byte(-128, 127);
  std::cout << "[ products ] " << Arch::name() << ": int8 scores in "
            << rope::detail::products_path<Arch>(rope::Products::int8) << "\n";
  for (const bool allow : {true, false}) {
    rope::detail::products_hardware_allowed() = allow;
    for (const std::size_t d : {1, 5, 63, 64, 65, 128, 130}) {
      for (const std::size_t rows : {1, 2, 4, 5, 8}) {
        const std::size_t stride = rope::detail::int8_row(d);
        std::vector<std::vector<float>> x(rows, std::vector<float>(d));
        for (auto& row : x) {
          for (float& v : row) v = normal(gen) * 3.0f;
        }
        x[0][0] = 1e6f;  // one huge channel
        if (rows > 2) std::fill(x[2].begin(), x[2].end(), 0.0f);
        if (rows > 3) x[3][d - 1] = std::numeric_limits<float>::infinity();
        if (rows > 4) {  // a row so small that max / 127 underflows
          std::fill(x[4].begin(), x[4].end(), 0.0f);
          x[4][0] = 1e-44f;
          x[4][d / 2] = -3e-45f;
        }
        std::vector<std::int8_t> key(d), q(rows * stride);
        for (auto& v : key) v = static_cast<std::int8_t>(byte(gen));
        key[0] = -128;  // the byte whose +128 is 0
        std::vector<float> scales(rows);
        std::vector<std::int32_t> sums(rows);
        for (std::size_t r = 0; r < rows; ++r) {
          const bool finite = rope::detail::int8_query(x[r].data(), d, q.data() + r * stride, &scales[r], &sums[r]);
          EXPECT_EQ(finite, !(rows > 3 && r == 3));
          // The row's bytes from the definition.
          float top = 0;
          for (float v : x[r]) top = std::max(top, std::fabs(v));
          if (!finite) continue;
          // max / 127, or the least subnormal where that underflows.
          const float s = top > 0 && top / 127.0f == 0 ? std::numeric_limits<float>::denorm_min() : top / 127.0f;
          EXPECT_TRUE(same_bits(scales[r], s));
          std::int32_t sum = 0;
          for (std::size_t c = 0; c < stride; ++c) {
            const int want = c < d && top > 0 ? static_cast<int>(std::nearbyint(x[r][c] / s)) : 0;
            ASSERT_EQ(q[r * stride + c], want) << "row " << r << " channel " << c;
            sum += want;
          }
          EXPECT_EQ(sums[r], sum);
        }
        std::vector<float> out(rows, 0.0f);
        rope::detail::int8_scores<Arch>(q.data(), stride, rows, scales.data(), sums.data(), key.data(), d, out.data(),
                                        1, 0.03f);
        for (std::size_t r = 0; r < rows; ++r) {
          std::int64_t exact = 0;
          for (std::size_t c = 0; c < d; ++c) exact += static_cast<std::int64_t>(q[r * stride + c]) * key[c];
          const float want = (static_cast<float>(exact) * scales[r]) * 0.03f;
          ASSERT_TRUE(same_bits(out[r], want) || (std::isnan(want) && std::isnan(out[r])))
              << "d " << d << " row " << r << " hardware " << allow;
          if (rows > 3 && r == 3) {
            EXPECT_TRUE(std::isnan(out[r]));
          }
        }
      }
    }
  }
  rope::detail::products_hardware_allowed() = true;
}

#if defined(__x86_64__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__GNUC__)
// What vdpbf16ps does, block by block, from random accumulators (subnormal
// ones too) and pairs: the steps the definition above takes, or this CPU's
// instruction differs from the one the mode was measured on.
TEST(KvProductsInstruction, Vdpbf16psIsTheDefinitionsStep) {
  if (!rope::detail::avx512_bf16_runs<xsimd::avx512bw>()) {
    std::cout << "[ skipped  ] vdpbf16ps: this CPU has no AVX512-BF16\n";
    GTEST_SKIP();
  }
  std::mt19937 gen(11);
  for (int trial = 0; trial < 20000; ++trial) {
    std::uint16_t a[32], b[32];
    float acc[16];
    for (int i = 0; i < 32; ++i) {
      a[i] = BFloat16(any_value(gen)).bits;
      b[i] = BFloat16(any_value(gen)).bits;
    }
    for (float& v : acc) v = any_value(gen);
    __m512 s = _mm512_loadu_ps(acc);
    __m512i va, vb;
    std::memcpy(&va, a, 64);
    std::memcpy(&vb, b, 64);
    __asm__("vdpbf16ps %2, %1, %0" : "+v"(s) : "v"(va), "v"(vb));
    float got[16];
    _mm512_storeu_ps(got, s);
    for (int i = 0; i < 16; ++i) {
      const long double pe = static_cast<long double>(ftz(from_bf16(a[2 * i]))) * ftz(from_bf16(b[2 * i]));
      const long double po = static_cast<long double>(ftz(from_bf16(a[2 * i + 1]))) * ftz(from_bf16(b[2 * i + 1]));
      const float want = ftz(static_cast<float>(ftz(static_cast<float>(ftz(acc[i]) + po)) + pe));
      ASSERT_TRUE(same_bits(got[i], want) || (std::isnan(want) && std::isnan(got[i])))
          << "trial " << trial << " lane " << i;
    }
  }
}
#endif

}  // namespace
