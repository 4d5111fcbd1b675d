// Re-rotating cached keys in place (attention/shift.hpp): a context shift
// turns keys [first, first + count) of a sequence by delta positions,
// k <- R_delta k, each value rounded once back into the cache's type. This
// file holds:
//   - one shift within the bound derived below of a long-double R_delta
//     applied to the stored key (widened exactly; int8: code times scale),
//     for f32, bf16, f16 and int8 caches, both pairings, a rotary_dim equal
//     to and smaller than head_dim (the channels past it untouched bit for
//     bit; int8: quantized again with the row's new scale, within that
//     rounding), token-major and head-major pools, deltas of both signs up
//     to the table's last row;
//   - +delta then -delta back within the sum of the two shifts' bounds, and
//     k shifts within the sum of k (each about the first: the rotation keeps
//     each pair's norm);
//   - a measurement (printed and recorded): the largest error after 1, 4 and
//     16 shifts of 1000 positions per type, and for comparison the error of
//     rotating at read (the stored key turned once by the whole angle in
//     float, nothing rounded back);
//   - the values, the keys outside the range and their scales untouched; the
//     same bytes for 1, 2 and 3 threads and an executor;
//   - refusals by name that write nothing: a range past the pool's slots, a
//     null page row, a page id outside the pool, a page named twice in the
//     range, a rotation without its pairing or wider than the heads, |delta|
//     outside the table; delta 0 and an empty range write nothing.
//
// The bound of one shift. Let x be the stored key (widened exactly), c and
// s the exact cos and sin of delta * theta_p, y = R_delta x the exact
// result and k' what the cache holds after the shift. The kernel computes
// pair (a, b) in float as y_a = fl(fl(x_a c~) - x_b s~) (one rounding with
// a fused multiply-add, two without; the same bound), from table entries
// c~, s~: the cos and sin of the double angle |delta| theta_p rounded once
// to float (within 1/2 ulp + 2^-27 ulp, so within u (1 + 2^-26) of the
// value; the double angle within 2^-53 |delta| theta_p of the exact one),
// sin negated for a negative delta (exact). To first order each of the
// table's, the product's and the result's roundings moves y_a by at most
// u (|x_a c| + |x_b s|), so the float rotation is within
//   rho_a = k u (1 + 2^-20) (|x_a c| + |x_b s|) + 2^-51 |delta| theta_p (|x_a| + |x_b|),
// k = 3 (u = 2^-24; 2^-20 covers the second-order terms), and k = 4 for
// int8, whose widening fl(q * scale) adds u |x| to each input. The result
// is then rounded once into the type:
//   f32   nothing more (the result's rounding is in rho);
//   bf16  2^-8 |y'_a| (y' = the float result, |y'_a| <= |y_a| + rho_a);
//   f16   2^-11 |y'_a| + 2^-25 (half the spacing of its subnormals);
//   int8  s'/2 + u |y'_a| with s' the row's new scale (the code is
//         nearbyint(fl(y' / s')), and |y' / s'| <= 127 (1 + u)^2 never
//         reaches the clamp);
// |k'_a - y_a| <= B_a = rho_a + that rounding. The header's "one rounding of
// the type" is this bound without rho, which matters for f32 (the whole
// error) and little for the others (rho is about 3u of the pair, against
// 2^-8 or 2^-11 of the value, or s'/2). A channel past rotary_dim: f32, bf16
// and f16 keep its bits; int8 quantizes it again with the new scale,
// within s'/2 + 2.001 u |x_c|.
//
// Several shifts. A later shift turns the error an earlier one left with
// the rest of the key, mixing a pair's two errors; so the errors add in
// each pair's 2-norm: after shifts 1 .. k, each channel of a rotated pair
// is within sum_i sqrt(B_a,i^2 + B_b,i^2) of R_(sum of deltas) x_0, where
// B_i is the bound of shift i at the key it shifted (R_d R_e = R_(d + e)
// exactly); a channel past rotary_dim within sum_i of its own bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include <rope/attention.hpp>
#include <rope/frequencies.hpp>
#include <rope/kernels/rotate.hpp>
#include <rope/table.hpp>

#include "attention_oracle.hpp"
#include "executors.hpp"
#include "kv_elements.hpp"
#include "support.hpp"

namespace {

namespace at = attention_test;
namespace ra = rope::attention;
using at::LD;
using rope::BFloat16;
using rope::Float16;
using rope::Style;

constexpr double kU = std::numeric_limits<float>::epsilon() / 2;
constexpr std::size_t kPageSize = 4, kPages = 16, kHeads = 2, kTablePositions = 16001;
// The range shifted: keys 3 .. 52 of a sequence of 64 keys on 16 pages.
constexpr std::size_t kFirst = 3, kCount = 50;

// A pool's geometry and the rotation asked for: the table is built for
// table_dim channels, the rotation turns the first rotary_dim of head_dim.
struct Config {
  std::size_t head_dim, table_dim, rotary_dim;
  Style style;
  bool head_major;
  std::string name() const {
    return "d" + std::to_string(head_dim) + "_r" + std::to_string(rotary_dim) + "_" + rope::name(style) +
           (head_major ? "_hnd" : "_nhd");
  }
};
const Config kConfigs[] = {
    {128, 128, 128, Style::rotate_half, false},
    {64, 64, 64, Style::block_diagonal, true},
    {48, 48, 32, Style::rotate_half, false},  // rotation.rotary_dim 32 of a table for 48
    {40, 24, 24, Style::block_diagonal, true},
};

// One table per width, kTablePositions rows.
const rope::Table<float>& table_for(std::size_t dim) {
  static std::map<std::size_t, std::unique_ptr<rope::Table<float>>> tables;
  auto& t = tables[dim];
  if (!t) t = std::make_unique<rope::Table<float>>(rope::frequencies(dim, 10000.0), kTablePositions);
  return *t;
}
// The frequencies of the pairs the rotation turns.
std::vector<double> turned_freqs(const Config& c) {
  std::vector<double> f = rope::frequencies(c.table_dim, 10000.0).inv_freq;
  f.resize(c.rotary_dim / 2);
  return f;
}
ra::Rotation<float> rotation_of(const Config& c) {
  return {&table_for(c.table_dim), c.style, c.rotary_dim == c.table_dim ? 0 : c.rotary_dim};
}

// A pool of random keys and values of E: rows of magnitudes 1, 7.5, 300 and
// 1e-3 (f16 subnormals), int8 codes with scales of like magnitudes.
template <class E>
struct Pool {
  Config config;
  std::vector<E> k, v;
  std::vector<float> k_scales, v_scales;
  ra::PagedCache<E> cache;
  std::vector<std::int32_t> pages;  // the sequence's block-table row: every page, shuffled

  Pool(const Config& c, std::uint32_t seed) : config(c), k(kPages * kPageSize * kHeads * c.head_dim), v(k.size()) {
    const bool scaled = rope::KvElement<E>::kScaled;
    const auto make = [&](E* data, float* scales) {
      return c.head_major ? ra::PagePool<E>::hnd(data, kPages, kPageSize, kHeads, c.head_dim, scales)
                          : ra::PagePool<E>::nhd(data, kPages, kPageSize, kHeads, c.head_dim, scales);
    };
    if (scaled) {
      k_scales.resize(kPages * kPageSize * kHeads);
      v_scales.resize(k_scales.size());
    }
    cache.k = make(k.data(), scaled ? k_scales.data() : nullptr);
    cache.v = make(v.data(), scaled ? v_scales.data() : nullptr);
    std::mt19937 gen(seed);
    std::normal_distribution<float> normal;
    const float mags[4] = {1.0f, 7.5f, 300.0f, 1e-3f};
    for (const ra::PagePool<E>* pool : {&cache.k, &cache.v}) {
      for (std::size_t slot = 0; slot < pool->slots(); ++slot) {
        for (std::size_t h = 0; h < kHeads; ++h) {
          const float mag = mags[(slot + h) % 4];
          E* row = pool->row(slot, h);
          for (std::size_t ch = 0; ch < c.head_dim; ++ch) {
            if constexpr (std::is_same<E, std::int8_t>::value) {
              row[ch] = static_cast<std::int8_t>(std::lround(std::clamp(normal(gen) * 40.0f, -127.0f, 127.0f)));
            } else {
              row[ch] = E(normal(gen) * mag);
            }
          }
          if (scaled) *pool->scale(slot, h) = mag * (0.02f + 0.01f * std::fabs(normal(gen)));
        }
      }
    }
    pages.resize(kPages);
    std::iota(pages.begin(), pages.end(), 0);
    std::shuffle(pages.begin(), pages.end(), gen);
  }
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  std::size_t slot(std::size_t key) const {
    return static_cast<std::size_t>(pages[key / kPageSize]) * kPageSize + key % kPageSize;
  }
  // The stored key row (key, h), widened exactly.
  std::vector<LD> key(std::size_t j, std::size_t h) const {
    std::vector<LD> x(config.head_dim);
    const E* row = cache.k.row(slot(j), h);
    for (std::size_t c = 0; c < x.size(); ++c) {
      x[c] = static_cast<LD>(rope_test::widen(row[c]));
      if (cache.k.scales != nullptr) x[c] *= static_cast<LD>(*cache.k.scale(slot(j), h));
    }
    return x;
  }
  LD scale(std::size_t j, std::size_t h) const {
    return cache.k.scales != nullptr ? static_cast<LD>(*cache.k.scale(slot(j), h)) : LD(0);
  }
  // Every key of the range, per key and head.
  std::vector<std::vector<LD>> range_keys() const {
    std::vector<std::vector<LD>> x;
    for (std::size_t j = kFirst; j < kFirst + kCount; ++j) {
      for (std::size_t h = 0; h < kHeads; ++h) x.push_back(key(j, h));
    }
    return x;
  }
  void shift(std::int64_t delta, const rope::Threads& threads = {}) {
    ra::shift(cache, pages.data(), pages.size(), kFirst, kCount, delta, rotation_of(config), threads);
  }

  struct Bytes {
    std::vector<unsigned char> k, v, ks, vs;
    bool operator==(const Bytes& o) const { return k == o.k && v == o.v && ks == o.ks && vs == o.vs; }
  };
  template <class T>
  static std::vector<unsigned char> bytes(const std::vector<T>& x) {
    std::vector<unsigned char> b(x.size() * sizeof(T));
    if (!b.empty()) std::memcpy(b.data(), x.data(), b.size());
    return b;
  }
  Bytes save() const { return {bytes(k), bytes(v), bytes(k_scales), bytes(v_scales)}; }
};

template <class E>
LD type_unit() {
  if (std::is_same<E, BFloat16>::value) return std::ldexp(LD(1), -8);
  if (std::is_same<E, Float16>::value) return std::ldexp(LD(1), -11);
  return 0;  // f32: the result's rounding is in rho; int8: by its scale
}

// The bound B of the header comment on every channel of one shift of x (the
// stored key before it) by delta, with s_new the row's scale after it
// (int8).
template <class E>
std::vector<LD> shift_bound(const std::vector<LD>& x, const std::vector<double>& freqs, Style style, LD delta,
                            LD s_new) {
  constexpr bool kInt8 = std::is_same<E, std::int8_t>::value, kFp8 = rope_test::kFp8<E>;
  const std::vector<LD> y = at::rotate(x, freqs, style, delta);
  std::vector<LD> bound(x.size(), 0);
  const LD rel = (kInt8 || kFp8 ? 4 : 3) * kU * (1 + std::ldexp(LD(1), -20));
  const auto rounding = [&](LD value) -> LD {
    if (kInt8) return s_new / 2 + kU * value;
    if (kFp8) return rope_test::fp8_rounding<E>(value, s_new);
    return type_unit<E>() * value + (std::is_same<E, Float16>::value ? std::ldexp(LD(1), -25) : LD(0));
  };
  const std::size_t r = 2 * freqs.size();
  for (std::size_t p = 0; p < freqs.size(); ++p) {
    const std::size_t a = style == Style::rotate_half ? p : 2 * p;
    const std::size_t b = style == Style::rotate_half ? p + r / 2 : 2 * p + 1;
    const LD angle = std::fabs(delta) * static_cast<LD>(freqs[p]);
    const LD c = std::fabs(std::cos(angle)), s = std::fabs(std::sin(angle));
    const LD table = std::ldexp(LD(1), -51) * angle * (std::fabs(x[a]) + std::fabs(x[b]));
    const LD rho_a = rel * (std::fabs(x[a]) * c + std::fabs(x[b]) * s) + table;
    const LD rho_b = rel * (std::fabs(x[b]) * c + std::fabs(x[a]) * s) + table;
    bound[a] = rho_a + rounding(std::fabs(y[a]) + rho_a);
    bound[b] = rho_b + rounding(std::fabs(y[b]) + rho_b);
  }
  // Past rotary_dim: widened (one rounding of q * s) and stored again.
  for (std::size_t c = r; c < x.size(); ++c) {
    const LD a = std::fabs(x[c]);
    bound[c] = kInt8 ? s_new / 2 + 2.001L * kU * a : kFp8 ? rounding(a * (1 + kU)) + kU * a : LD(0);
  }
  return bound;
}

// The partner of each channel in its pair (itself past rotary_dim).
std::vector<std::size_t> partners(std::size_t d, std::size_t r, Style style) {
  std::vector<std::size_t> q(d);
  std::iota(q.begin(), q.end(), 0);
  for (std::size_t p = 0; p < r / 2; ++p) {
    const std::size_t a = style == Style::rotate_half ? p : 2 * p;
    const std::size_t b = style == Style::rotate_half ? p + r / 2 : 2 * p + 1;
    q[a] = b;
    q[b] = a;
  }
  return q;
}

// Shifts the range by each of deltas in turn, then checks every channel
// against R_(sum of deltas) x_0 within the summed bounds; returns the
// largest error over its bound.
template <class E>
double expect_shifts(Pool<E>& pool, const std::vector<std::int64_t>& deltas, const std::string& what) {
  const Config& c = pool.config;
  const std::vector<double> freqs = turned_freqs(c);
  const std::vector<std::size_t> other = partners(c.head_dim, c.rotary_dim, c.style);
  const std::vector<std::vector<LD>> x0 = pool.range_keys();
  std::vector<std::vector<LD>> total(x0.size(), std::vector<LD>(c.head_dim, 0));
  std::vector<std::vector<LD>> x = x0;
  LD sum = 0;
  for (const std::int64_t delta : deltas) {
    pool.shift(delta);
    sum += static_cast<LD>(delta);
    for (std::size_t i = 0; i < x.size(); ++i) {
      const std::size_t j = kFirst + i / kHeads, h = i % kHeads;
      const std::vector<LD> b = shift_bound<E>(x[i], freqs, c.style, static_cast<LD>(delta), pool.scale(j, h));
      for (std::size_t ch = 0; ch < c.head_dim; ++ch) {
        total[i][ch] += other[ch] == ch ? b[ch] : std::sqrt(b[ch] * b[ch] + b[other[ch]] * b[other[ch]]);
      }
    }
    x = pool.range_keys();
  }
  double worst = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const std::vector<LD> want = at::rotate(x0[i], freqs, c.style, sum);
    for (std::size_t ch = 0; ch < c.head_dim; ++ch) {
      const LD err = std::fabs(x[i][ch] - want[ch]);
      EXPECT_LE(err, total[i][ch]) << what << ": key " << kFirst + i / kHeads << " head " << i % kHeads << " channel "
                                   << ch << " (" << x[i][ch] << " for " << want[ch] << ")";
      if (err > total[i][ch]) return static_cast<double>(err / total[i][ch]);
      if (total[i][ch] > 0) worst = std::max(worst, static_cast<double>(err / total[i][ch]));
    }
  }
  return worst;
}

template <class E>
class Shift : public ::testing::Test {};
struct CacheNames {
  template <class E>
  static std::string GetName(int) {
    return rope_test::element_name<E>();
  }
};
using CacheTypes = ::testing::Types<float, BFloat16, Float16, std::int8_t, rope::Float8E4M3, rope::Float8E5M2>;
TYPED_TEST_SUITE(Shift, CacheTypes, CacheNames);

TYPED_TEST(Shift, OneShiftWithinItsBound) {
  using E = TypeParam;
  double worst = 0;
  for (const Config& c : kConfigs) {
    for (const std::int64_t delta : {1, -1, 1000, -1000, 12345, -16000, 16000}) {
      Pool<E> pool(c, 7);
      const std::vector<std::vector<LD>> x0 = pool.range_keys();
      worst = std::max(worst, expect_shifts(pool, {delta}, c.name() + " delta " + std::to_string(delta)));
      if (::testing::Test::HasFailure()) return;
      // Past rotary_dim: the same bits (int8: within its bound, above).
      if (rope::KvElement<E>::kScaled || c.rotary_dim == c.head_dim) continue;
      for (std::size_t j = kFirst; j < kFirst + kCount; ++j) {
        for (std::size_t h = 0; h < kHeads; ++h) {
          const E* row = pool.cache.k.row(pool.slot(j), h);
          const std::vector<LD>& was = x0[(j - kFirst) * kHeads + h];
          for (std::size_t ch = c.rotary_dim; ch < c.head_dim; ++ch) {
            ASSERT_EQ(static_cast<LD>(rope_test::widen(row[ch])), was[ch]) << c.name() << " channel " << ch;
          }
        }
      }
    }
  }
  this->RecordProperty("worst_over_bound", std::to_string(worst));
}

TYPED_TEST(Shift, ThereAndBackAndKShiftsWithinTheSumOfTheirBounds) {
  using E = TypeParam;
  for (const Config& c : kConfigs) {
    const std::vector<std::vector<std::int64_t>> runs = {{1000, -1000},
                                                         {-16000, 16000},
                                                         {1000, 1000, 1000, 1000},
                                                         std::vector<std::int64_t>(16, 1000),
                                                         {7, -3000, 15000, 2}};
    for (const auto& deltas : runs) {
      Pool<E> pool(c, 17);
      expect_shifts(pool, deltas,
                    c.name() + ", " + std::to_string(deltas.size()) + " shifts from " + std::to_string(deltas[0]));
      if (::testing::Test::HasFailure()) return;
    }
  }
}

// The measurement of the header comment: head_dim 128, rotate_half, 50
// keys of 2 heads; errors relative to the pair's norm (which the rotation
// keeps) and to the largest value of the head's row. Rotate at read turns
// the stored key (widened to float) once by the whole angle in float.
struct Errors {
  LD pair = 0, row = 0;
};
Errors errors_of(const std::vector<std::vector<LD>>& got, const std::vector<std::vector<LD>>& want,
                 const std::vector<std::size_t>& other) {
  Errors e;
  for (std::size_t i = 0; i < got.size(); ++i) {
    LD top = 0;
    for (const LD y : want[i]) top = std::max(top, std::fabs(y));
    for (std::size_t c = 0; c < got[i].size(); ++c) {
      const LD err = std::fabs(got[i][c] - want[i][c]);
      const LD norm = std::sqrt(want[i][c] * want[i][c] + want[i][other[c]] * want[i][other[c]]);
      if (norm > 0) e.pair = std::max(e.pair, err / norm);
      if (top > 0) e.row = std::max(e.row, err / top);
    }
  }
  return e;
}

template <class E>
void measure(const char* name) {
  const Config c{128, 128, 128, Style::rotate_half, false};
  const std::vector<double> freqs = turned_freqs(c);
  const std::vector<std::size_t> other = partners(c.head_dim, c.rotary_dim, c.style);
  const rope::Table<float>& table = table_for(c.table_dim);
  Pool<E> pool(c, 27);
  const std::vector<std::vector<LD>> x0 = pool.range_keys();
  std::printf("[ shift    ] %-5s", name);
  std::string line;
  std::size_t done = 0;
  for (const std::size_t k : {1, 4, 16}) {
    while (done < k) {
      pool.shift(1000);
      ++done;
    }
    std::vector<std::vector<LD>> want;
    for (const auto& x : x0) want.push_back(at::rotate(x, freqs, c.style, static_cast<LD>(1000 * k)));
    const Errors shifted = errors_of(pool.range_keys(), want, other);
    // At read: x0 in float (int8: fl(q * scale), as attend widens it), one turn.
    std::vector<std::vector<LD>> read;
    for (std::size_t i = 0; i < x0.size(); ++i) {
      // Exact for f32, bf16 and f16; int8's q * s rounded once, as attend's
      // widening rounds it.
      std::vector<float> xf(c.head_dim), yf(c.head_dim);
      for (std::size_t ch = 0; ch < c.head_dim; ++ch) xf[ch] = static_cast<float>(x0[i][ch]);
      rope::rotate<Style::rotate_half, float>(xf.data(), yf.data(), table.cos(1000 * k), table.sin(1000 * k),
                                              c.rotary_dim);
      read.emplace_back(yf.begin(), yf.end());
    }
    const Errors at_read = errors_of(read, want, other);
    char cell[160];
    std::snprintf(cell, sizeof cell, "  %2zu: %.2e pair, %.2e row | at read %.2e pair, %.2e row", k,
                  static_cast<double>(shifted.pair), static_cast<double>(shifted.row),
                  static_cast<double>(at_read.pair), static_cast<double>(at_read.row));
    std::printf("%s", cell);
    line += cell;
    ::testing::Test::RecordProperty(std::string(name) + "_shifts_" + std::to_string(k),
                                    std::to_string(static_cast<double>(shifted.pair)) + " pair, " +
                                        std::to_string(static_cast<double>(shifted.row)) + " row");
    ::testing::Test::RecordProperty(std::string(name) + "_at_read_" + std::to_string(1000 * k),
                                    std::to_string(static_cast<double>(at_read.pair)) + " pair, " +
                                        std::to_string(static_cast<double>(at_read.row)) + " row");
  }
  std::printf("\n");
}

TEST(ShiftErrors, MeasuredAfter1_4And16ShiftsAndAtRead) {
  measure<float>("f32");
  measure<BFloat16>("bf16");
  measure<Float16>("f16");
  measure<std::int8_t>("int8");
  measure<rope::Float8E4M3>("e4m3");
  measure<rope::Float8E5M2>("e5m2");
}

TYPED_TEST(Shift, ValuesAndOtherKeysUntouched) {
  using E = TypeParam;
  for (const Config& c : kConfigs) {
    Pool<E> pool(c, 37);
    const typename Pool<E>::Bytes before = pool.save();
    pool.shift(-777);
    EXPECT_EQ(pool.save().v, before.v) << c.name();
    EXPECT_EQ(pool.save().vs, before.vs) << c.name();
    std::vector<bool> in_range(kPages * kPageSize, false);
    for (std::size_t j = kFirst; j < kFirst + kCount; ++j) in_range[pool.slot(j)] = true;
    std::size_t changed = 0;
    for (std::size_t slot = 0; slot < kPages * kPageSize; ++slot) {
      for (std::size_t h = 0; h < kHeads; ++h) {
        const E* row = pool.cache.k.row(slot, h);
        const unsigned char* was = before.k.data() + static_cast<std::size_t>(row - pool.k.data()) * sizeof(E);
        const bool same = std::memcmp(row, was, c.head_dim * sizeof(E)) == 0;
        if (!in_range[slot]) {
          EXPECT_TRUE(same) << c.name() << ": slot " << slot << " head " << h << " is outside the range";
          if (rope::KvElement<E>::kScaled) {
            EXPECT_EQ(std::memcmp(pool.cache.k.scale(slot, h), before.ks.data() + (slot * kHeads + h) * sizeof(float),
                                  sizeof(float)),
                      0);
          }
        }
        changed += same ? 0 : 1;
      }
    }
    EXPECT_EQ(changed, kCount * kHeads) << c.name() << ": every row of the range turns";
  }
}

TYPED_TEST(Shift, SameBytesForAnyThreadsAndExecutor) {
  using E = TypeParam;
  rope_test::ThreadPool threads(3);
  rope_test::ReverseExecutor reverse;
  for (const Config& c : kConfigs) {
    Pool<E> one(c, 47);
    one.shift(4321, 1);
    const auto want = one.save();
    for (const std::size_t n : {2, 3}) {
      Pool<E> pool(c, 47);
      pool.shift(4321, n);
      EXPECT_TRUE(pool.save() == want) << c.name() << ", " << n << " threads";
      Pool<E> pooled(c, 47);
      pooled.shift(4321, rope::Threads(threads.executor(n)));
      EXPECT_TRUE(pooled.save() == want) << c.name() << ", an executor of " << n << " workers";
      Pool<E> reversed(c, 47);
      reversed.shift(4321, rope::Threads(reverse.executor(n)));
      EXPECT_TRUE(reversed.save() == want) << c.name() << ", " << n << " shares in reverse";
    }
  }
  EXPECT_GT(threads.tasks_run(), 0u);
  EXPECT_GT(reverse.tasks_run, 0u);
}

// Each refusal names its argument and value, and leaves every byte as it
// was; so do the calls that have nothing to do.
TYPED_TEST(Shift, RefusalsByNameWriteNothing) {
  using E = TypeParam;
  const Config c = kConfigs[1];  // d 64, head-major
  Pool<E> pool(c, 57);
  const auto before = pool.save();
  const ra::Rotation<float> rotation = rotation_of(c);
  const std::string fn = "rope::attention::shift: ";
  const auto refused = [&](const std::string& what, const std::string& want, auto call) {
    const std::string msg = rope_test::thrown_message(call);
    EXPECT_PRED_FORMAT2(::testing::IsSubstring, want, msg) << what;
    EXPECT_TRUE(pool.save() == before) << what << ": written";
  };
  std::vector<std::int32_t> pages = pool.pages;
  const auto shift = [&](std::size_t first, std::size_t count, std::int64_t delta, const ra::Rotation<float>& r) {
    return [&, first, count, delta, r] { ra::shift(pool.cache, pages.data(), pages.size(), first, count, delta, r); };
  };
  refused("a range past the slots", fn + "first + count must be <= the pool's slots 64, got 65",
          shift(60, 5, 10, rotation));
  refused("a first key past the slots", fn + "first + count must be <= the pool's slots 64, got 66",
          shift(65, 1, 10, rotation));
  refused("a range past the row's pages",
          fn + "first + count must be <= the row's pages' keys page_count * page_size = 48, got " +
              std::to_string(kFirst + kCount),
          [&] { ra::shift(pool.cache, pages.data(), 12, kFirst, kCount, 10, rotation); });
  refused("no page row", fn + "pages must be non-null for 50 keys, got null",
          [&] { ra::shift(pool.cache, nullptr, 0, kFirst, kCount, 10, rotation); });
  pages[6] = static_cast<std::int32_t>(kPages);
  refused("a page id past the pool", fn + "pages[6] must be a page id below cache.k.pages = 16, got 16",
          shift(kFirst, kCount, 10, rotation));
  pages[6] = -1;
  refused("a negative page id", fn + "pages[6] must be a page id below cache.k.pages = 16, got -1",
          shift(kFirst, kCount, 10, rotation));
  pages = pool.pages;
  pages[9] = pages[2];
  refused("a page named twice",
          fn + "pages[9] must be a page the range does not already name (it would turn twice), got " +
              std::to_string(pages[2]),
          shift(kFirst, kCount, 10, rotation));
  // Outside the range, a bad or repeated id is not read.
  pages = pool.pages;
  pages[15] = -3;
  pages[14] = pages[0];
  pages[13] = pages[0];  // keys 52 .. 55: only 52 is in the range (page 13)
  refused("a page of the range named again past it",
          fn + "pages[13] must be a page the range does not already name (it would turn twice), got " +
              std::to_string(pages[0]),
          shift(kFirst, kCount, 10, rotation));
  pages[13] = pool.pages[13];
  {
    Pool<E> other(c, 57);
    std::vector<std::int32_t> row = pages;
    EXPECT_NO_THROW(ra::shift(other.cache, row.data(), row.size(), kFirst, kCount, 10, rotation));
  }
  pages = pool.pages;
  ra::Rotation<float> unstyled;
  unstyled.table = &table_for(c.table_dim);
  refused("a table without its pairing",
          fn + "rotation.style must be given with the table: Rotation{&table, style}, never defaulted, got not given",
          shift(kFirst, kCount, 10, unstyled));
  const ra::Rotation<float> wide{&table_for(128), c.style};
  refused("a rotation wider than the heads", fn + "rotation.rotary_dim must be <= the head dimension 64, got 128",
          shift(kFirst, kCount, 10, wide));
  const ra::Rotation<float> odd{&table_for(c.table_dim), c.style, 7};
  refused("an odd rotary_dim", fn + "rotation.rotary_dim", shift(kFirst, kCount, 10, odd));
  const std::string delta_want =
      "out_of_range: " + fn + "delta must be within the table's positions: |delta| < 16001, got ";
  refused("delta of the table's size", delta_want + "16001", shift(kFirst, kCount, 16001, rotation));
  refused("-delta of the table's size", delta_want + "-16001", shift(kFirst, kCount, -16001, rotation));
  refused("the least int64 delta", delta_want + std::to_string(std::numeric_limits<std::int64_t>::min()),
          shift(kFirst, kCount, std::numeric_limits<std::int64_t>::min(), rotation));
  // Nothing to do: nothing written (int8 not quantized again).
  for (const auto& call : {shift(kFirst, kCount, 0, rotation), shift(kFirst, 0, 99, rotation),
                           shift(kFirst, kCount, 10, ra::Rotation<float>{})}) {
    EXPECT_NO_THROW(call());
    EXPECT_TRUE(pool.save() == before);
  }
}

}  // namespace
