// attend in the product modes (Shape::products, kernels/kv_products.hpp):
//   - bf16 products over a bf16 cache and int8 products over an int8 cache,
//     each within its bound (derived below) of a long-double oracle over
//     the stored values: decode tokens split over parts, a prefill chunk, on
//     random rows, rows of a wide dynamic range, a query with one huge
//     channel, and two keys whose scores nearly tie;
//   - the same bytes for any thread count and executor, and with the mode's
//     instruction (vdpbf16ps, vpdpbusd) or without it (in the bf16 mode
//     where AMX runs, the decode tokens: the prompt's tokens run on tiles
//     and are held to the levels' bound, below);
//   - a mode over a cache of another type refused by name, nothing written.
//
// The bounds, per score s_j = scale * sum_c q_c k_jc (int8: times key j's
// scale k_s):
//   bf16: q rounded to bf16 (|dq_c| <= 2^-8 |q_c|), flushed below 2^-126
//     (q and k: at most 2^-126 per channel against the other factor), each
//     lane's sums rounded once each (2 per block of 32 channels, then the
//     4 levels of the tree, then the scale):
//       eps_j = |scale| ((2^-8 (1 + g) + g) sum_c |q_c k_c| + 2^-126 (sum_c |k_c| + sum_c |q_c|) + (4d + 64) 2^-126),
//     g = gamma_(2 ceil(d / 32) + 5);
//   int8: q_c = s_q round(q_c / s_q) within s_q / 2, the integer sum exact,
//     then three float roundings (the sum past 2^24, times s_q, times
//     scale * k_s, which itself rounds):
//       eps_j = |scale k_s| ((s_q / 2) sum_c |k_c| + gamma_4 s_q sum_c |qi_c k_c|).
//   bf16, a prompt's tokens on AMX tiles (test_attention_cascade.cpp's
//     levels): g = gamma_(d + 5) (d exact products summed in any order),
//     and the weights' rounding to bf16 adds (2^-8 + n 2^-126) V.
// With eps the largest over the keys a row sees, n the keys, V their
// largest |v|, the row is within (exp(2 eps) - 1) V + gamma_(2n + 4 parts +
// 16) V of the oracle (docs/attention.md), its lse within eps + gamma.
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
#include <rope/attention/cascade_tiles.hpp>  // level_tiles_run, which a compiled attention library does not bring
#include <rope/kernels/kv_products.hpp>      // products_hardware_allowed, likewise

#include "attention_oracle.hpp"
#include "executors.hpp"

namespace {

namespace at = attention_test;
namespace ra = rope::attention;
using at::LD;
using rope::BFloat16;

constexpr std::size_t kPageSize = 16, kHq = 8, kHk = 2;
constexpr double kTiny = 1.1754943508222875e-38;  // 2^-126

enum class Rows { random, wide, huge_channel, near_tie };

template <class E>
struct Case {
  std::size_t d;
  std::vector<std::int64_t> lengths{700, 90, 40}, starts{0, 1, 2, 7};  // decode (split), decode, a prefill of 5
  std::size_t stride = 48;
  std::vector<std::int32_t> table;
  std::vector<E> k, v;
  std::vector<float> k_scales, v_scales;
  ra::PagedCache<E> cache;
  std::vector<float> q;

  Case(std::size_t dim, Rows rows, std::uint32_t seed) : d(dim) {
    const std::size_t pages = 3 * stride;
    table.resize(3 * stride);
    for (std::size_t i = 0; i < table.size(); ++i) table[i] = static_cast<std::int32_t>((i * 37) % pages);
    k.resize(pages * kPageSize * kHk * d);
    v.resize(k.size());
    std::mt19937 gen(seed);
    std::normal_distribution<float> normal;
    std::uniform_int_distribution<int> exponent(-6, 2);  // scores stay O(10): the bound stays finite
    const auto value = [&]() { return rows == Rows::wide ? std::ldexp(normal(gen), exponent(gen)) : normal(gen); };
    for (auto* pool : {&k, &v}) {
      for (E& x : *pool) {
        if constexpr (std::is_same<E, std::int8_t>::value) {
          x = static_cast<std::int8_t>(std::lround(std::clamp(value() * 40.0f, -127.0f, 127.0f)));
        } else {
          x = E(value());
        }
      }
    }
    if constexpr (std::is_same<E, std::int8_t>::value) {
      k_scales.resize(pages * kPageSize * kHk);
      v_scales.resize(k_scales.size());
      for (auto* s : {&k_scales, &v_scales}) {
        for (float& x : *s) x = 0.02f + 0.01f * std::fabs(normal(gen));
      }
      cache.k = ra::PagePool<E>::nhd(k.data(), pages, kPageSize, kHk, d, k_scales.data());
      cache.v = ra::PagePool<E>::nhd(v.data(), pages, kPageSize, kHk, d, v_scales.data());
    } else {
      cache.k = ra::PagePool<E>::nhd(k.data(), pages, kPageSize, kHk, d);
      cache.v = ra::PagePool<E>::nhd(v.data(), pages, kPageSize, kHk, d);
    }
    q.resize(tokens() * kHq * d);
    for (float& x : q) x = value();
    if (rows == Rows::huge_channel) {
      for (std::size_t r = 0; r < tokens() * kHq; ++r) q[r * d + 3] = 24.0f;  // int8: s_q = 24 / 127
    }
    if (rows == Rows::near_tie) {
      // Sequence 1's keys 10 and 11 a copy of one another but for the last
      // channel's smallest step: their scores nearly tie for every head.
      for (std::size_t g = 0; g < kHk; ++g) {
        E* a = cache.k.row(slot(1, 10), g);
        E* b = cache.k.row(slot(1, 11), g);
        std::copy(a, a + d, b);
        if constexpr (std::is_same<E, std::int8_t>::value) {
          b[d - 1] = static_cast<std::int8_t>(a[d - 1] == 127 ? 126 : a[d - 1] + 1);
          *cache.k.scale(slot(1, 11), g) = *cache.k.scale(slot(1, 10), g);
        } else {
          b[d - 1] = BFloat16::from_bits(static_cast<std::uint16_t>(a[d - 1].bits ^ 1u));
        }
      }
    }
  }
  std::size_t tokens() const { return static_cast<std::size_t>(starts.back()); }
  std::size_t slot(std::size_t b, std::size_t j) const {
    return static_cast<std::size_t>(table[b * stride + j / kPageSize]) * kPageSize + j % kPageSize;
  }
  ra::Batch batch() const { return {starts.data(), lengths.data(), table.data(), stride, lengths.size()}; }
  LD stored(bool key, std::size_t slot_id, std::size_t h, std::size_t c) const {
    const ra::PagePool<E>& pool = key ? cache.k : cache.v;
    const LD x = static_cast<LD>(rope::detail::widen_value(pool.row(slot_id, h)[c]));
    return pool.scales != nullptr ? x * static_cast<LD>(*pool.scale(slot_id, h)) : x;
  }
};

template <class E>
std::vector<float> attend(const Case<E>& c, rope::Products mode, const rope::Threads& threads, std::size_t split,
                          std::vector<float>* lse) {
  ra::Shape shape = ra::Shape::of(c.cache, kHq);
  shape.products = mode;
  shape.kv_split = split;
  ra::Plan plan;
  ra::plan(plan, shape, c.batch(), threads);
  std::vector<float> out(c.tokens() * kHq * c.d);
  lse->assign(c.tokens() * kHq, 0.0f);
  ra::attend(plan, c.cache, rope::View<const float>::token_major(c.q.data(), c.tokens(), kHq, c.d),
             rope::View<float>::token_major(out.data(), c.tokens(), kHq, c.d), {}, {}, lse->data());
  return out;
}

// Every row of the mode against the oracle, within its bound.
bool tiles_here() { return ra::detail::level_tiles_run<xsimd::default_arch>(); }

template <class E>
void check_bound(const Case<E>& c, rope::Products mode, const std::string& what) {
  std::vector<float> lse;
  const std::vector<float> out = attend(c, mode, 1, 256, &lse);
  const std::size_t d = c.d;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  double worst = 0;
  for (std::size_t b = 0; b < c.lengths.size(); ++b) {
    const auto n_b = static_cast<std::size_t>(c.starts[b + 1] - c.starts[b]);
    // The bf16 mode runs a prompt's tokens on AMX tiles where they run.
    const bool on_tiles = mode == rope::Products::bf16 && n_b > 1 && tiles_here();
    for (std::size_t i = 0; i < n_b; ++i) {
      const std::size_t t = static_cast<std::size_t>(c.starts[b]) + i;
      const std::size_t n = static_cast<std::size_t>(c.lengths[b]) - n_b + i + 1;  // causal
      for (std::size_t h = 0; h < kHq; ++h) {
        const std::size_t g = h / (kHq / kHk);
        const float* x = &c.q[(t * kHq + h) * d];
        float top = 0;
        double q_sum = 0;
        for (std::size_t ch = 0; ch < d; ++ch) {
          top = std::max(top, std::fabs(x[ch]));
          q_sum += std::fabs(x[ch]);
        }
        const double s_q = static_cast<double>(top / 127.0f);
        std::vector<LD> s(n);
        at::Mat v(n, std::vector<LD>(d));
        double eps = 0, V = 0;
        for (std::size_t j = 0; j < n; ++j) {
          const std::size_t slot = c.slot(b, j);
          LD dot = 0;
          double mag = 0, k_sum = 0, k_int = 0, qk_int = 0;
          for (std::size_t ch = 0; ch < d; ++ch) {
            const LD kc = c.stored(true, slot, g, ch);
            dot += static_cast<LD>(x[ch]) * kc;
            mag += std::fabs(static_cast<double>(x[ch] * kc));
            k_sum += std::fabs(static_cast<double>(kc));
            v[j][ch] = c.stored(false, slot, g, ch);
            V = std::max(V, static_cast<double>(std::fabs(v[j][ch])));
            if constexpr (std::is_same<E, std::int8_t>::value) {
              const double ki = static_cast<double>(c.cache.k.row(slot, g)[ch]);
              k_int += std::fabs(ki);
              qk_int += std::fabs(std::nearbyint(x[ch] / (top / 127.0f)) * ki);
            }
          }
          s[j] = static_cast<LD>(scale) * dot;
          double e = 0;
          if constexpr (std::is_same<E, std::int8_t>::value) {
            const double ks = std::fabs(scale * static_cast<double>(*c.cache.k.scale(slot, g)));
            e = ks * (s_q / 2 * k_int + at::gamma_float(4) * s_q * qk_int);
          } else {
            // A prompt's tokens on tiles: d products summed in any order.
            const double gm = on_tiles ? at::gamma_float(static_cast<double>(d + 5))
                                       : at::gamma_float(2.0 * static_cast<double>((d + 31) / 32) + 5);
            e = scale * ((std::ldexp(1.0, -8) * (1 + gm) + gm) * mag + kTiny * (k_sum + q_sum) +
                         (4.0 * static_cast<double>(d) + 64) * kTiny);
          }
          eps = std::max(eps, e);
        }
        const at::SoftmaxRow want = at::softmax_row(s, v, d, -std::numeric_limits<LD>::infinity());
        const double parts = static_cast<double>(n) / 256 + 2;
        const double rounding = at::gamma_float(2.0 * static_cast<double>(n) + 4 * parts + 16);
        // And their weights rounded to bf16 (2^-8, those below 2^-126 flushed).
        const double weights = on_tiles ? std::ldexp(1.0, -8) + static_cast<double>(n) * kTiny : 0.0;
        const double tol = std::expm1(2 * eps) * V + (rounding + weights) * V;
        for (std::size_t ch = 0; ch < d; ++ch) {
          const double err = std::fabs(static_cast<double>(out[(t * kHq + h) * d + ch] - want.out[ch]));
          ASSERT_LE(err, tol) << what << ": token " << t << " head " << h << " channel " << ch;
          worst = std::max(worst, err / tol);
        }
        ASSERT_LE(std::fabs(static_cast<double>(lse[t * kHq + h] - want.lse)), eps + rounding)
            << what << ": token " << t << " head " << h;
      }
    }
  }
  std::cout << "[ products ] " << what << ": largest error " << worst << " of the bound\n";
  EXPECT_GT(worst, 0.0) << what << ": a bound no row comes near cannot fail";
}

const char* rows_name(Rows r) {
  return r == Rows::random         ? "random"
         : r == Rows::wide         ? "wide range"
         : r == Rows::huge_channel ? "one huge channel"
                                   : "a near tie";
}

TEST(AttendProducts, Bf16WithinItsBound) {
  for (const Rows rows : {Rows::random, Rows::wide, Rows::huge_channel, Rows::near_tie}) {
    for (const std::size_t d : {64, 128, 80}) {
      const Case<BFloat16> c(d, rows, 3);
      check_bound(c, rope::Products::bf16, std::string("bf16, ") + rows_name(rows) + ", d " + std::to_string(d));
    }
  }
}

TEST(AttendProducts, Int8WithinItsBound) {
  for (const Rows rows : {Rows::random, Rows::wide, Rows::huge_channel, Rows::near_tie}) {
    for (const std::size_t d : {64, 128, 80}) {
      const Case<std::int8_t> c(d, rows, 4);
      check_bound(c, rope::Products::int8, std::string("int8, ") + rows_name(rows) + ", d " + std::to_string(d));
    }
  }
}

template <class E>
void check_same_bytes(rope::Products mode) {
  const Case<E> c(128, Rows::random, 7);
  std::vector<float> lse1, lse;
  const std::vector<float> one = attend(c, mode, 1, 128, &lse1);
  rope_test::ThreadPool pool(3);
  for (const std::size_t n : {2, 3}) {
    EXPECT_EQ(attend(c, mode, n, 128, &lse), one) << n << " threads";
    EXPECT_EQ(lse, lse1);
    EXPECT_EQ(attend(c, mode, rope::Threads(pool.executor(n)), 128, &lse), one) << "an executor of " << n;
  }
  const bool tiles = mode == rope::Products::bf16 && tiles_here();
  rope::detail::products_hardware_allowed() = false;
  std::vector<float> got = attend(c, mode, 2, 128, &lse);
  if (tiles) {
    // The prompt's tokens ran on tiles with the hardware (bounded,
    // check_bound): the decode tokens' rows are the same bytes.
    const std::size_t decode_rows = static_cast<std::size_t>(c.starts[2]) * kHq * c.d;
    got.resize(decode_rows);
    EXPECT_EQ(got, std::vector<float>(one.begin(), one.begin() + static_cast<std::ptrdiff_t>(decode_rows)))
        << "the decode tokens without the mode's instruction";
  } else {
    EXPECT_EQ(got, one) << "without the mode's instruction";
  }
  rope::detail::products_hardware_allowed() = true;
}

TEST(AttendProducts, SameBytesForAnyThreadsAndWithOrWithoutTheInstruction) {
  check_same_bytes<BFloat16>(rope::Products::bf16);
  check_same_bytes<std::int8_t>(rope::Products::int8);
}

template <class E>
void expect_refused(rope::Products mode, const char* cache_name) {
  std::vector<E> k(kPageSize * 2 * 16), v(k.size());
  std::vector<float> scales(kPageSize * 2, 1.0f);
  const bool scaled = std::is_same<E, std::int8_t>::value;
  ra::PagedCache<E> cache{ra::PagePool<E>::nhd(k.data(), 1, kPageSize, 2, 16, scaled ? scales.data() : nullptr),
                          ra::PagePool<E>::nhd(v.data(), 1, kPageSize, 2, 16, scaled ? scales.data() : nullptr)};
  ra::Shape shape = ra::Shape::of(cache, 4);
  shape.products = mode;
  ra::Plan plan;
  ra::plan(plan, shape, 3, 1);
  std::vector<float> q(4 * 16, 1.0f), out(4 * 16, -5.0f);
  try {
    ra::attend(plan, cache, rope::View<const float>::token_major(q.data(), 1, 4, 16),
               rope::View<float>::token_major(out.data(), 1, 4, 16));
    ADD_FAILURE() << "not refused: " << cache_name;
  } catch (const rope::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("shape.products"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(cache_name), std::string::npos) << e.what();
  }
  EXPECT_EQ(out, std::vector<float>(4 * 16, -5.0f));
}

TEST(AttendProducts, AModeOverAnotherCacheTypeIsRefused) {
  expect_refused<float>(rope::Products::bf16, "a float cache");
  expect_refused<rope::Float16>(rope::Products::bf16, "an f16 cache");
  expect_refused<std::int8_t>(rope::Products::bf16, "an int8 cache");
  expect_refused<BFloat16>(rope::Products::int8, "a bf16 cache");
  expect_refused<float>(rope::Products::int8, "a float cache");
}

}  // namespace
