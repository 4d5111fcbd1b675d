// The tensor API against the scalar reference evaluated in double: every
// layout helper, strided and packed views, random / repeated / offset
// positions, partial rotary in and out of place, grouped-query Q/K, 16-bit
// storage, M-RoPE and 2-D axial RoPE against a per-pair construction from
// the angles, weight permutations between pairings, thread counts giving
// bit-identical results, every error path leaving the output untouched, and
// the compile-time builds rope::dispatch mirrors against the rounding oracle
// bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iostream>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <Eigen/Core>

#include <rope/apply.hpp>
#include <rope/multi_axis.hpp>
#include <rope/permute.hpp>
#include <rope/reference.hpp>

#include "archs.hpp"
#include "rounding_oracle.hpp"
#include "support.hpp"

namespace {

using rope::Direction;
using rope::Options;
using rope::Style;
using rope::View;

constexpr Style kStyles[] = {Style::rotate_half, Style::block_diagonal};
constexpr Direction kDirections[] = {Direction::forward, Direction::inverse};

std::vector<std::int64_t> random_positions(std::size_t n, std::int64_t limit, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<std::int64_t> dist(0, limit - 1);
  std::vector<std::int64_t> p(n);
  for (auto& x : p) x = dist(gen);
  return p;
}

template <class T>
double to_double(T x) {
  return static_cast<double>(static_cast<float>(x));
}
template <>
double to_double<double>(double x) {
  return x;
}

// The reference rotation of one head vector in double, from the (widened)
// input row and the table's own cos/sin, with the per-channel magnitude
// that bounds any evaluation's rounding error.
template <class T, class U>
void expected_row(const T* in, std::size_t head_dim, const U* cos, const U* sin, std::size_t rotary_dim, Style s,
                  Direction dir, std::vector<double>& y, std::vector<double>& magnitude) {
  std::vector<double> x(head_dim);
  for (std::size_t i = 0; i < head_dim; ++i) x[i] = to_double(in[i]);
  const std::vector<double> c(cos, cos + rotary_dim / 2), sn(sin, sin + rotary_dim / 2);
  std::vector<double> ry, rm;
  if (s == Style::rotate_half) {
    rope_test::reference_in_double<Style::rotate_half>(x.data(), c.data(), sn.data(), rotary_dim, dir, ry, rm);
  } else {
    rope_test::reference_in_double<Style::block_diagonal>(x.data(), c.data(), sn.data(), rotary_dim, dir, ry, rm);
  }
  y = x;
  magnitude.assign(head_dim, 0.0);
  std::copy(ry.begin(), ry.end(), y.begin());
  std::copy(rm.begin(), rm.end(), magnitude.begin());
}

// Error of the computation in the element type's arithmetic (float for
// 16-bit storage): 2 epsilon of the magnitude, as in the kernel tests; a
// 16-bit store adds one rounding of the result: its unit roundoff times |y|.
template <class T>
double tolerance(double y, double magnitude) {
  if (std::is_same<T, double>::value) return 2.0 * std::numeric_limits<double>::epsilon() * magnitude + 1e-300;
  const double f32 = 2.0 * std::numeric_limits<float>::epsilon() * magnitude + 1e-38;
  if (std::is_same<T, float>::value) return f32;
  const double unit = std::is_same<T, rope::Float16>::value || std::is_same<T, Eigen::half>::value
                          ? std::ldexp(1.0, -11)
                          : std::ldexp(1.0, -8);
  return f32 + unit * (std::fabs(y) + f32) + std::ldexp(1.0, -25);  // fp16 subnormal half-step
}

// Every head of every token of out against the reference applied to in;
// channels past rotary_dim must equal the input bit for bit.
template <class T, class U>
void expect_rotated(const View<const T>& in, const View<const T>& out, const rope::Table<U>& table, Style s,
                    Direction dir, const std::vector<std::int64_t>& positions, std::size_t rotary_dim,
                    const std::string& what) {
  std::vector<double> y, magnitude;
  for (std::size_t t = 0; t < in.tokens; ++t) {
    const auto m = static_cast<std::size_t>(positions[t]);
    for (std::size_t h = 0; h < in.heads; ++h) {
      expected_row(in.row(t, h), in.head_dim, table.cos(m), table.sin(m), rotary_dim, s, dir, y, magnitude);
      const T* o = out.row(t, h);
      for (std::size_t c = 0; c < in.head_dim; ++c) {
        if (c < rotary_dim) {
          ASSERT_NEAR(to_double(o[c]), y[c], tolerance<T>(y[c], magnitude[c]))
              << what << " token " << t << " head " << h << " channel " << c;
        } else {
          ASSERT_EQ(std::memcmp(&o[c], in.row(t, h) + c, sizeof(T)), 0)
              << what << " pass-through token " << t << " head " << h << " channel " << c;
        }
      }
    }
  }
}

template <class T>
std::vector<T> random_tensor(std::size_t n, std::uint32_t seed) {
  const auto d = rope_test::random_vector<double>(n, seed, 2.0);
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = T(static_cast<float>(d[i]));
  return v;
}
template <>
std::vector<double> random_tensor<double>(std::size_t n, std::uint32_t seed) {
  return rope_test::random_vector<double>(n, seed, 2.0);
}

template <class T>
bool same_bytes(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

template <class T>
using TableFor = rope::Table<std::conditional_t<std::is_same<T, double>::value, double, float>>;

template <class T>
class Apply : public ::testing::Test {};
using ElementTypes = ::testing::Types<float, double, rope::BFloat16, rope::Float16, Eigen::bfloat16, Eigen::half>;
struct ElementTypeNames {
  template <class T>
  static std::string GetName(int) {
    if (std::is_same<T, float>::value) return "f32";
    if (std::is_same<T, double>::value) return "f64";
    if (std::is_same<T, rope::BFloat16>::value) return "bf16";
    if (std::is_same<T, rope::Float16>::value) return "fp16";
    if (std::is_same<T, Eigen::bfloat16>::value) return "eigen_bf16";
    return "eigen_fp16";
  }
};
TYPED_TEST_SUITE(Apply, ElementTypes, ElementTypeNames);

// Every layout helper, both pairings and directions, in place.
TYPED_TEST(Apply, LayoutHelpersMatchReference) {
  using T = TypeParam;
  constexpr std::size_t kTokens = 13, kHeads = 3, kHeadDim = 72;
  const TableFor<T> table(rope::frequencies(kHeadDim, 10000.0), 512);
  const auto positions = random_positions(kTokens, 512, 7);
  for (Style s : kStyles) {
    for (Direction dir : kDirections) {
      for (int layout = 0; layout < 2; ++layout) {
        const auto original = random_tensor<T>(kTokens * kHeads * kHeadDim, 11);
        auto data = original;
        const auto make = [&](auto* p) {
          using E = std::remove_pointer_t<decltype(p)>;
          return layout == 0 ? View<E>::token_major(p, kTokens, kHeads, kHeadDim)
                             : View<E>::head_major(p, kTokens, kHeads, kHeadDim);
        };
        rope::apply(make(data.data()), table, s, positions.data(), Options{0, dir, 1, rope::Stores::automatic, {}});
        expect_rotated<T>(make(original.data()), make(static_cast<const T*>(data.data())), table, s, dir, positions,
                          kHeadDim, layout == 0 ? "token_major" : "head_major");
      }
    }
  }
}

// Q and K slices of a fused QKV buffer with padding between tokens, rotated
// in one apply_qk call; V and the padding stay as they were.
TYPED_TEST(Apply, PackedQkvSlicesWithPaddedTokenStride) {
  using T = TypeParam;
  constexpr std::size_t kTokens = 9, kQHeads = 4, kKvHeads = 2, kHeadDim = 64, kPad = 5;
  constexpr std::size_t kTotal = kQHeads + 2 * kKvHeads;
  constexpr std::size_t kStride = kTotal * kHeadDim + kPad;
  const TableFor<T> table(rope::frequencies(kHeadDim, 500000.0), 4096);
  const auto positions = random_positions(kTokens, 4096, 3);
  for (Style s : kStyles) {
    const auto original = random_tensor<T>(kTokens * kStride, 5);
    auto data = original;
    const auto qkv = rope::split_qkv(data.data(), kTokens, kQHeads, kKvHeads, kHeadDim);
    const auto q = View<T>(qkv.q.data, kTokens, kQHeads, kHeadDim, kStride, kHeadDim);
    const auto k = View<T>(qkv.k.data, kTokens, kKvHeads, kHeadDim, kStride, kHeadDim);
    rope::apply_qk(q, k, table, s, positions.data());
    const T* base = original.data();
    expect_rotated<T>(View<const T>(base, kTokens, kQHeads, kHeadDim, kStride, kHeadDim), View<const T>(q), table, s,
                      Direction::forward, positions, kHeadDim, "q");
    expect_rotated<T>(View<const T>(base + kQHeads * kHeadDim, kTokens, kKvHeads, kHeadDim, kStride, kHeadDim),
                      View<const T>(k), table, s, Direction::forward, positions, kHeadDim, "k");
    for (std::size_t t = 0; t < kTokens; ++t) {
      const std::size_t v0 = t * kStride + (kQHeads + kKvHeads) * kHeadDim;
      EXPECT_EQ(std::memcmp(data.data() + v0, original.data() + v0, (kKvHeads * kHeadDim + kPad) * sizeof(T)), 0)
          << "V or padding of token " << t << " changed";
    }
  }
}

// Out of place with partial rotary and a head stride wider than head_dim:
// channels past rotary_dim copied, the gaps of the output untouched, and the
// result bit-identical to the in-place call.
TYPED_TEST(Apply, PartialRotaryInAndOutOfPlace) {
  using T = TypeParam;
  constexpr std::size_t kTokens = 11, kHeads = 3, kHeadDim = 80, kRotary = 32, kHeadStride = 90;
  constexpr std::size_t kTokenStride = kHeads * kHeadStride + 3;
  const TableFor<T> table(rope::frequencies(kRotary, 10000.0), 100);
  const auto positions = random_positions(kTokens, 100, 9);
  for (Style s : kStyles) {
    for (std::size_t rotary : {std::size_t{0}, std::size_t{16}}) {
      for (rope::Stores stores : {rope::Stores::cached, rope::Stores::streaming}) {
        const std::size_t r = rotary == 0 ? kRotary : rotary;
        const auto original = random_tensor<T>(kTokens * kTokenStride, 21);
        const auto out_original = random_tensor<T>(kTokens * kTokenStride, 22);
        auto out = out_original;
        const View<const T> x(original.data(), kTokens, kHeads, kHeadDim, kTokenStride, kHeadStride);
        const View<T> y(out.data(), kTokens, kHeads, kHeadDim, kTokenStride, kHeadStride);
        Options o;
        o.rotary_dim = rotary;
        o.stores = stores;
        rope::apply(x, y, table, s, positions.data(), o);
        expect_rotated<T>(x, View<const T>(y), table, s, Direction::forward, positions, r, "out of place");
        for (std::size_t t = 0; t < kTokens; ++t) {
          for (std::size_t h = 0; h < kHeads; ++h) {
            const std::size_t gap = t * kTokenStride + h * kHeadStride + kHeadDim;
            EXPECT_EQ(std::memcmp(out.data() + gap, out_original.data() + gap, (kHeadStride - kHeadDim) * sizeof(T)),
                      0);
          }
        }
        auto in_place = original;
        rope::apply(View<T>(in_place.data(), kTokens, kHeads, kHeadDim, kTokenStride, kHeadStride), table, s,
                    positions.data(), o);
        for (std::size_t t = 0; t < kTokens; ++t) {
          for (std::size_t h = 0; h < kHeads; ++h) {
            const std::size_t row = t * kTokenStride + h * kHeadStride;
            ASSERT_EQ(std::memcmp(out.data() + row, in_place.data() + row, kHeadDim * sizeof(T)), 0);
          }
        }
      }
    }
  }
}

// Grouped-query attention: 8 query heads share 2 key heads; apply_qk equals
// two separate apply calls bit for bit, in and out of place.
TYPED_TEST(Apply, GroupedQueryApplyQkEqualsSeparateCalls) {
  using T = TypeParam;
  constexpr std::size_t kTokens = 17, kQHeads = 8, kKHeads = 2, kHeadDim = 64;
  const TableFor<T> table(rope::frequencies(kHeadDim), 64);
  const auto positions = random_positions(kTokens, 64, 13);
  const auto q0 = random_tensor<T>(kTokens * kQHeads * kHeadDim, 1);
  const auto k0 = random_tensor<T>(kTokens * kKHeads * kHeadDim, 2);
  auto q1 = q0, k1 = k0, q2 = q0, k2 = k0;
  std::vector<T> q3(q0.size()), k3(k0.size());
  rope::apply_qk(View<T>::token_major(q1.data(), kTokens, kQHeads, kHeadDim),
                 View<T>::token_major(k1.data(), kTokens, kKHeads, kHeadDim), table, Style::rotate_half,
                 positions.data());
  rope::apply(View<T>::token_major(q2.data(), kTokens, kQHeads, kHeadDim), table, Style::rotate_half, positions.data());
  rope::apply(View<T>::token_major(k2.data(), kTokens, kKHeads, kHeadDim), table, Style::rotate_half, positions.data());
  rope::apply_qk(View<const T>::token_major(q0.data(), kTokens, kQHeads, kHeadDim),
                 View<const T>::token_major(k0.data(), kTokens, kKHeads, kHeadDim),
                 View<T>::token_major(q3.data(), kTokens, kQHeads, kHeadDim),
                 View<T>::token_major(k3.data(), kTokens, kKHeads, kHeadDim), table, Style::rotate_half,
                 positions.data());
  EXPECT_TRUE(same_bytes(q1, q2));
  EXPECT_TRUE(same_bytes(k1, k2));
  EXPECT_TRUE(same_bytes(q1, q3));
  EXPECT_TRUE(same_bytes(k1, k3));
  expect_rotated<T>(View<const T>::token_major(k0.data(), kTokens, kKHeads, kHeadDim),
                    View<const T>::token_major(k1.data(), kTokens, kKHeads, kHeadDim), table, Style::rotate_half,
                    Direction::forward, positions, kHeadDim, "k");
}

// An offset call equals explicit positions offset + t; repeated positions
// (every token at one position) and a decode step far into the cache.
TYPED_TEST(Apply, OffsetsAndRepeatedPositions) {
  using T = TypeParam;
  constexpr std::size_t kTokens = 10, kHeads = 2, kHeadDim = 128;
  const TableFor<T> table(rope::frequencies(kHeadDim, 500000.0), 4096);
  const auto original = random_tensor<T>(kTokens * kHeads * kHeadDim, 4);
  for (std::int64_t offset : {std::int64_t{0}, std::int64_t{1}, std::int64_t{4086}}) {
    std::vector<std::int64_t> positions(kTokens);
    for (std::size_t t = 0; t < kTokens; ++t) positions[t] = offset + static_cast<std::int64_t>(t);
    auto a = original, b = original;
    rope::apply(View<T>::token_major(a.data(), kTokens, kHeads, kHeadDim), table, Style::block_diagonal, offset);
    rope::apply(View<T>::token_major(b.data(), kTokens, kHeads, kHeadDim), table, Style::block_diagonal,
                positions.data());
    EXPECT_TRUE(same_bytes(a, b)) << "offset " << offset;
    expect_rotated<T>(View<const T>::token_major(original.data(), kTokens, kHeads, kHeadDim),
                      View<const T>::token_major(a.data(), kTokens, kHeads, kHeadDim), table, Style::block_diagonal,
                      Direction::forward, positions, kHeadDim, "offset");
  }
  const std::vector<std::int64_t> repeated(kTokens, 77);
  auto c = original;
  rope::apply(View<T>::token_major(c.data(), kTokens, kHeads, kHeadDim), table, Style::rotate_half, repeated.data());
  expect_rotated<T>(View<const T>::token_major(original.data(), kTokens, kHeads, kHeadDim),
                    View<const T>::token_major(c.data(), kTokens, kHeads, kHeadDim), table, Style::rotate_half,
                    Direction::forward, repeated, kHeadDim, "repeated");
  // Decode: one token at position 4000 of a [1, heads, head_dim] tensor.
  auto d = std::vector<T>(original.begin(), original.begin() + kHeads * kHeadDim);
  const auto d0 = d;
  rope::apply(View<T>::token_major(d.data(), 1, kHeads, kHeadDim), table, Style::rotate_half, 4000);
  expect_rotated<T>(View<const T>::token_major(d0.data(), 1, kHeads, kHeadDim),
                    View<const T>::token_major(d.data(), 1, kHeads, kHeadDim), table, Style::rotate_half,
                    Direction::forward, {4000}, kHeadDim, "decode");
}

// One to four threads, cached and streaming stores: the same bytes.
TYPED_TEST(Apply, ThreadCountsAndStoresAreBitIdentical) {
  using T = TypeParam;
  constexpr std::size_t kTokens = 37, kHeads = 5, kHeadDim = 96;
  const TableFor<T> table(rope::frequencies(kHeadDim), 1000);
  const auto positions = random_positions(kTokens, 1000, 17);
  const auto original = random_tensor<T>(kTokens * kHeads * kHeadDim, 8);
  const auto in = View<const T>::token_major(original.data(), kTokens, kHeads, kHeadDim);
  std::vector<T> first;
  for (std::size_t threads = 1; threads <= 4; ++threads) {
    for (rope::Stores stores : {rope::Stores::cached, rope::Stores::streaming}) {
      std::vector<T> out(original.size());
      rope::apply(in, View<T>::token_major(out.data(), kTokens, kHeads, kHeadDim), table, Style::block_diagonal,
                  positions.data(), Options{0, Direction::forward, threads, stores, {}});
      auto in_place = original;
      rope::apply(View<T>::token_major(in_place.data(), kTokens, kHeads, kHeadDim), table, Style::block_diagonal,
                  positions.data(), Options{0, Direction::forward, threads, stores, {}});
      if (first.empty()) first = out;
      EXPECT_TRUE(same_bytes(out, first)) << threads << " threads, out of place";
      EXPECT_TRUE(same_bytes(in_place, first)) << threads << " threads, in place";
    }
  }
  expect_rotated<T>(in, View<const T>::token_major(first.data(), kTokens, kHeads, kHeadDim), table,
                    Style::block_diagonal, Direction::forward, positions, kHeadDim, "threads");
}

// 16-bit storage is computed in float and rounded once: the result equals
// the float API on the widened tensor, rounded to 16 bits.
TEST(ApplyHalf, SixteenBitEqualsFloatRoundedOnce) {
  constexpr std::size_t kTokens = 19, kHeads = 4, kHeadDim = 128, kRotary = 64;
  const rope::Table<float> table(rope::frequencies(kRotary), 2048);
  const auto positions = random_positions(kTokens, 2048, 23);
  const auto run = [&](auto tag) {
    using T = decltype(tag);
    const auto original = random_tensor<T>(kTokens * kHeads * kHeadDim, 31);
    std::vector<float> wide(original.size());
    for (std::size_t i = 0; i < wide.size(); ++i) wide[i] = static_cast<float>(original[i]);
    rope::apply(View<float>::token_major(wide.data(), kTokens, kHeads, kHeadDim), table, Style::rotate_half,
                positions.data());
    std::vector<T> out(original.size());
    rope::apply(View<const T>::token_major(original.data(), kTokens, kHeads, kHeadDim),
                View<T>::token_major(out.data(), kTokens, kHeads, kHeadDim), table, Style::rotate_half,
                positions.data());
    for (std::size_t i = 0; i < out.size(); ++i) {
      const T expected(wide[i]);
      ASSERT_EQ(std::memcmp(&out[i], &expected, sizeof(T)), 0) << "element " << i;
    }
  };
  run(rope::BFloat16{});
  run(rope::Float16{});
  run(Eigen::bfloat16{});
  run(Eigen::half{});
}

// The inverse undoes the forward rotation within a few roundings.
TEST(ApplyDouble, InverseUndoesForward) {
  constexpr std::size_t kTokens = 8, kHeads = 2, kHeadDim = 64;
  const rope::Table<double> table(rope::frequencies(kHeadDim), 100000);
  const auto positions = random_positions(kTokens, 100000, 41);
  const auto original = random_tensor<double>(kTokens * kHeads * kHeadDim, 42);
  auto x = original;
  const auto v = View<double>::token_major(x.data(), kTokens, kHeads, kHeadDim);
  rope::apply(v, table, Style::rotate_half, positions.data());
  rope::apply(v, table, Style::rotate_half, positions.data(),
              Options{0, Direction::inverse, 2, rope::Stores::automatic, {}});
  for (std::size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(x[i], original[i], 1e-14) << i;
}

// View::slice_heads selects heads first .. first+count-1 of any layout:
// rotating the slice equals rotating the whole tensor on those heads, bit
// for bit (each head is rotated on its own), and leaves every other head's
// bytes as they were.
template <bool HeadMajor>
void expect_slice_heads_rotates_those_heads_alone() {
  constexpr std::size_t kTokens = 5, kHeads = 6, kHeadDim = 32, kFirst = 2, kCount = 3;
  const rope::Table<float> table(rope::frequencies(kHeadDim), 1000);
  const auto positions = random_positions(kTokens, 1000, 51);
  const auto original = random_tensor<float>(kTokens * kHeads * kHeadDim, 52);
  const auto view_of = [](float* d) {
    return HeadMajor ? View<float>::head_major(d, kTokens, kHeads, kHeadDim)
                     : View<float>::token_major(d, kTokens, kHeads, kHeadDim);
  };
  auto whole = original;
  rope::apply(view_of(whole.data()), table, Style::rotate_half, positions.data());
  auto sliced = original;
  const View<float> slice = view_of(sliced.data()).slice_heads(kFirst, kCount);
  ASSERT_EQ(slice.heads, kCount);
  rope::apply(slice, table, Style::rotate_half, positions.data());
  const View<float> ref = view_of(whole.data());
  const View<float> got = view_of(sliced.data());
  for (std::size_t t = 0; t < kTokens; ++t) {
    for (std::size_t h = 0; h < kHeads; ++h) {
      const bool in_slice = h >= kFirst && h < kFirst + kCount;
      const float* want = in_slice ? ref.row(t, h) : original.data() + (got.row(t, h) - sliced.data());
      EXPECT_EQ(std::memcmp(got.row(t, h), want, kHeadDim * sizeof(float)), 0)
          << "token " << t << " head " << h << (in_slice ? " (rotated)" : " (untouched)");
    }
  }
}

TEST(ApplyViews, SliceHeadsRotatesThoseHeadsAlone) {
  expect_slice_heads_rotates_those_heads_alone<false>();
  expect_slice_heads_rotates_those_heads_alone<true>();
}

// Out of place with out == x is documented as in place: the same bits as the
// in-place overload, for both styles and a partial rotary_dim (the copied
// channels past it must survive being read and written through one pointer).
TEST(ApplyViews, OutOfPlaceWithOutEqualToXIsInPlace) {
  constexpr std::size_t kTokens = 7, kHeads = 3, kHeadDim = 40;
  const rope::Table<float> table(rope::frequencies(32), 5000);
  const auto positions = random_positions(kTokens, 5000, 61);
  const auto original = random_tensor<float>(kTokens * kHeads * kHeadDim, 62);
  for (const Style style : {Style::rotate_half, Style::block_diagonal}) {
    auto in_place = original;
    rope::apply(View<float>::token_major(in_place.data(), kTokens, kHeads, kHeadDim), table, style, positions.data());
    auto aliased = original;
    const auto v = View<float>::token_major(aliased.data(), kTokens, kHeads, kHeadDim);
    rope::apply<float>(View<const float>(v), v, table, style, positions.data());
    EXPECT_EQ(std::memcmp(aliased.data(), in_place.data(), aliased.size() * sizeof(float)), 0) << rope::name(style);
    EXPECT_NE(std::memcmp(aliased.data(), original.data(), aliased.size() * sizeof(float)), 0);
  }
}

// ---- multi-axis positions ------------------------------------------------

// y for one head from the angle of each pair given directly (double).
std::vector<double> rotate_by_angles(const std::vector<double>& x, const std::vector<double>& angle,
                                     std::size_t rotary_dim, Style s) {
  std::vector<double> y = x;
  for (std::size_t p = 0; p < rotary_dim / 2; ++p) {
    const std::size_t a = s == Style::rotate_half ? p : 2 * p;
    const std::size_t b = s == Style::rotate_half ? p + rotary_dim / 2 : 2 * p + 1;
    y[a] = x[a] * std::cos(angle[p]) - x[b] * std::sin(angle[p]);
    y[b] = x[b] * std::cos(angle[p]) + x[a] * std::sin(angle[p]);
  }
  return y;
}

// Float table entries carry 2^-24 each, the float evaluation 2 eps of the
// magnitude: 4 eps of (|x_a| + |x_b|) covers both.
void expect_angles(const std::vector<float>& in, const std::vector<float>& out, std::size_t tokens, std::size_t heads,
                   std::size_t head_dim, std::size_t rotary_dim, Style s,
                   const std::function<double(std::size_t t, std::size_t p)>& angle_of) {
  for (std::size_t t = 0; t < tokens; ++t) {
    std::vector<double> angle(rotary_dim / 2);
    for (std::size_t p = 0; p < angle.size(); ++p) angle[p] = angle_of(t, p);
    for (std::size_t h = 0; h < heads; ++h) {
      const std::size_t row = (t * heads + h) * head_dim;
      const std::vector<double> x(in.begin() + static_cast<std::ptrdiff_t>(row),
                                  in.begin() + static_cast<std::ptrdiff_t>(row + head_dim));
      const auto y = rotate_by_angles(x, angle, rotary_dim, s);
      double scale = 0;
      for (double v : x) scale = std::max(scale, std::fabs(v));
      for (std::size_t c = 0; c < head_dim; ++c) {
        ASSERT_NEAR(out[row + c], y[c], 8 * std::numeric_limits<float>::epsilon() * scale)
            << "token " << t << " head " << h << " channel " << c;
      }
    }
  }
}

TEST(ApplyMultiAxis, MropeChunkedAndInterleavedMatchPerPairAngles) {
  constexpr std::size_t kTokens = 12, kHeads = 2, kHeadDim = 128, kRotary = 128, kPairs = kRotary / 2;
  const auto freqs = rope::frequencies(kRotary, 1000000.0);
  const rope::Table<float> table(freqs, 300);
  const auto positions = random_positions(3 * kTokens, 300, 51);  // [3, tokens]
  for (auto order : {rope::SectionOrder::chunked, rope::SectionOrder::interleaved}) {
    // Qwen2-VL's chunked sections and Qwen3-VL's interleaved ones for 64 pairs.
    const bool chunked = order == rope::SectionOrder::chunked;
    const std::size_t s0 = chunked ? 16 : 24, s1 = chunked ? 24 : 20, s2 = chunked ? 24 : 20;
    for (Style s : kStyles) {
      const auto original = random_tensor<float>(kTokens * kHeads * kHeadDim, 52);
      auto x = original;
      rope::apply_mrope(View<float>::token_major(x.data(), kTokens, kHeads, kHeadDim), table, s, positions.data(),
                        rope::MropeSections{{s0, s1, s2}, order});
      // Axis of each pair written from the model descriptions: chunked takes
      // t, h, w in consecutive runs; interleaved cycles t, h, w and hands the
      // cycle's leftovers to t.
      expect_angles(original, x, kTokens, kHeads, kHeadDim, kRotary, s, [&](std::size_t t, std::size_t p) {
        std::size_t axis = 0;
        if (order == rope::SectionOrder::chunked) {
          axis = p < s0 ? 0 : p < s0 + s1 ? 1 : 2;
        } else {
          if (p % 3 == 1 && p < 3 * s1) axis = 1;
          if (p % 3 == 2 && p < 3 * s2) axis = 2;
        }
        return static_cast<double>(positions[axis * kTokens + t]) * freqs.inv_freq[p];
      });
    }
  }
  static_assert(kPairs == 64, "sections sum");
}

TEST(ApplyMultiAxis, MropeWithEqualAxesIsPlainRope) {
  constexpr std::size_t kTokens = 9, kHeads = 3, kHeadDim = 64;
  const rope::Table<float> table(rope::frequencies(kHeadDim), 64);
  const auto t = random_positions(kTokens, 64, 61);
  std::vector<std::int64_t> three(t);
  three.insert(three.end(), t.begin(), t.end());
  three.insert(three.end(), t.begin(), t.end());
  const auto original = random_tensor<float>(kTokens * kHeads * kHeadDim, 62);
  for (auto order : {rope::SectionOrder::chunked, rope::SectionOrder::interleaved}) {
    auto a = original, b = original;
    rope::apply_mrope(View<float>::token_major(a.data(), kTokens, kHeads, kHeadDim), table, Style::rotate_half,
                      three.data(),
                      rope::MropeSections{order == rope::SectionOrder::chunked ? std::array<std::size_t, 3>{8, 12, 12}
                                                                               : std::array<std::size_t, 3>{12, 10, 10},
                                          order},
                      Options{0, Direction::forward, 3, {}, {}});
    rope::apply(View<float>::token_major(b.data(), kTokens, kHeads, kHeadDim), table, Style::rotate_half, t.data());
    EXPECT_TRUE(same_bytes(a, b));
  }
}

TEST(ApplyMultiAxis, AnyPairAxesMatchesPerPairAngles) {
  constexpr std::size_t kTokens = 7, kHeads = 2, kHeadDim = 64, kPairs = kHeadDim / 2;
  const auto freqs = rope::frequencies(kHeadDim, 500000.0);
  const rope::Table<float> table(freqs, 200);
  // An explicit map over four axes (no published model has four; the type
  // allows any), and ERNIE-4.5-VL's layout: 22 pairs alternating h and w,
  // then t.
  rope::PairAxes four{std::vector<std::uint8_t>(kPairs), 4};
  for (std::size_t p = 0; p < kPairs; ++p) four.axis[p] = static_cast<std::uint8_t>((p * 7 + 3) % 4);
  const auto ernie = rope::PairAxes::hw_alternating(22, kPairs);
  ASSERT_EQ(ernie.axis.size(), kPairs);
  for (std::size_t p = 0; p < kPairs; ++p) EXPECT_EQ(ernie.axis[p], p < 22 ? (p % 2 == 0 ? 1 : 2) : 0) << p;
  const rope::PairAxes* const maps[] = {&four, &ernie};
  for (const rope::PairAxes* pa : maps) {
    const auto positions = random_positions(pa->axes * kTokens, 200, 71);
    for (Style s : kStyles) {
      const auto original = random_tensor<float>(kTokens * kHeads * kHeadDim, 72);
      auto x = original;
      rope::apply_mrope(View<float>::token_major(x.data(), kTokens, kHeads, kHeadDim), table, s, positions.data(), *pa);
      expect_angles(original, x, kTokens, kHeads, kHeadDim, kHeadDim, s, [&](std::size_t t, std::size_t p) {
        return static_cast<double>(positions[pa->axis[p] * kTokens + t]) * freqs.inv_freq[p];
      });
    }
  }
}

TEST(ApplyMultiAxis, PairAxesFromSectionsIsTheSectionsCall) {
  constexpr std::size_t kTokens = 6, kHeads = 2, kHeadDim = 128;
  const rope::Table<float> table(rope::frequencies(kHeadDim, 1e6), 100);
  const auto positions = random_positions(3 * kTokens, 100, 81);
  const auto original = random_tensor<float>(kTokens * kHeads * kHeadDim, 82);
  for (const rope::MropeSections& sections : {rope::MropeSections{{16, 24, 24}, rope::SectionOrder::chunked},
                                              rope::MropeSections{{24, 20, 20}, rope::SectionOrder::interleaved}}) {
    auto a = original, b = original;
    rope::apply_mrope(View<float>::token_major(a.data(), kTokens, kHeads, kHeadDim), table, Style::rotate_half,
                      positions.data(), sections);
    rope::apply_mrope(View<float>::token_major(b.data(), kTokens, kHeads, kHeadDim), table, Style::rotate_half,
                      positions.data(), rope::PairAxes::sections(sections, kHeadDim / 2));
    EXPECT_TRUE(same_bytes(a, b));
  }
}

TEST(ApplyMultiAxis, AxialMatchesPerPairAngles) {
  constexpr std::size_t kTokens = 16, kHeads = 2, kHeadDim = 64, kRotary = 64;
  const double base = 10000.0;
  const rope::Table<float> table(rope::axial_frequencies(kRotary, base), 32);
  std::vector<std::int64_t> positions(2 * kTokens);  // a 4 x 4 patch grid: rows, then columns
  for (std::size_t t = 0; t < kTokens; ++t) {
    positions[t] = static_cast<std::int64_t>(t / 4 * 7);
    positions[kTokens + t] = static_cast<std::int64_t>(t % 4 * 5);
  }
  for (Style s : kStyles) {
    const auto original = random_tensor<float>(kTokens * kHeads * kHeadDim, 71);
    auto x = original;
    rope::apply_axial(View<float>::token_major(x.data(), kTokens, kHeads, kHeadDim), table, s, positions.data());
    // Each axis is its own RoPE over kRotary/2 channels: theta_j = base^(-2j/(r/2)).
    expect_angles(original, x, kTokens, kHeads, kHeadDim, kRotary, s, [&](std::size_t t, std::size_t p) {
      const std::size_t quarter = kRotary / 4;
      const std::size_t j = p % quarter;
      const double theta = std::pow(base, -2.0 * static_cast<double>(j) / static_cast<double>(kRotary / 2));
      const auto m = p < quarter ? positions[t] : positions[kTokens + t];
      return static_cast<double>(m) * theta;
    });
  }
}

// ---- weight permutations ---------------------------------------------------

// q = W x per head; rotating with rotate_half after the permuted projection
// gives block_diagonal's rotated vector, permuted, so the scores agree.
TEST(Permute, RotateHalfAfterPermutedProjectionEqualsBlockDiagonal) {
  constexpr std::size_t kHeads = 3, kHeadDim = 16, kIn = 24;
  for (std::size_t rotary : {std::size_t{16}, std::size_t{8}}) {
    const rope::Table<double> table(rope::frequencies(rotary), 64);
    const auto w = rope_test::random_vector<double>(kHeads * kHeadDim * kIn, 81);
    const auto wk = rope_test::random_vector<double>(kHeads * kHeadDim * kIn, 82);
    const auto xq = rope_test::random_vector<double>(kIn, 83);
    const auto xk = rope_test::random_vector<double>(kIn, 84);
    auto w_perm = w, wk_perm = wk;
    rope::permute_to_rotate_half(w_perm.data(), kHeads, kHeadDim, kIn, rotary);
    rope::permute_to_rotate_half(wk_perm.data(), kHeads, kHeadDim, kIn, rotary);
    const auto project = [&](const std::vector<double>& m, const std::vector<double>& v) {
      std::vector<double> out(kHeads * kHeadDim, 0.0);
      for (std::size_t r = 0; r < out.size(); ++r)
        for (std::size_t c = 0; c < kIn; ++c) out[r] += m[r * kIn + c] * v[c];
      return out;
    };
    auto q_block = project(w, xq), k_block = project(wk, xk);
    auto q_half = project(w_perm, xq), k_half = project(wk_perm, xk);
    rope::apply(View<double>::token_major(q_block.data(), 1, kHeads, kHeadDim), table, Style::block_diagonal, 5);
    rope::apply(View<double>::token_major(k_block.data(), 1, kHeads, kHeadDim), table, Style::block_diagonal, 40);
    rope::apply(View<double>::token_major(q_half.data(), 1, kHeads, kHeadDim), table, Style::rotate_half, 5);
    rope::apply(View<double>::token_major(k_half.data(), 1, kHeads, kHeadDim), table, Style::rotate_half, 40);
    for (std::size_t h = 0; h < kHeads; ++h) {
      double score_block = 0, score_half = 0;
      for (std::size_t c = 0; c < kHeadDim; ++c) {
        // Channel c of the block pairing lives at this channel of rotate_half.
        const std::size_t moved = c >= rotary ? c : (c % 2 == 0 ? c / 2 : rotary / 2 + c / 2);
        EXPECT_NEAR(q_half[h * kHeadDim + moved], q_block[h * kHeadDim + c], 1e-12) << "head " << h << " ch " << c;
        score_block += q_block[h * kHeadDim + c] * k_block[h * kHeadDim + c];
        score_half += q_half[h * kHeadDim + c] * k_half[h * kHeadDim + c];
      }
      EXPECT_NEAR(score_half, score_block, 1e-10);
    }
    auto back = w_perm;
    rope::permute_to_block_diagonal(back.data(), kHeads, kHeadDim, kIn, rotary);
    EXPECT_TRUE(same_bytes(back, w));
  }
}

// ---- errors ----------------------------------------------------------------

// Runs f, expects exception E whose message contains every needle, and the
// buffer's bytes unchanged.
template <class E, class F>
void expect_throw_untouched(const std::vector<float>& buffer, const std::vector<float>& second, F&& f,
                            std::initializer_list<const char*> needles) {
  const auto before = buffer;
  const auto second_before = second;
  try {
    f();
    ADD_FAILURE() << "no exception";
  } catch (const E& e) {
    const std::string msg = e.what();
    for (const char* n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
  }
  EXPECT_TRUE(same_bytes(buffer, before)) << "a throwing call wrote to its output";
  EXPECT_TRUE(same_bytes(second, second_before)) << "a throwing call wrote to its output";
}

TEST(ApplyErrors, EveryBadArgumentThrowsAndWritesNothing) {
  constexpr std::size_t kTokens = 6, kHeads = 4, kHeadDim = 32;
  const rope::Table<float> table(rope::frequencies(kHeadDim), 100);
  std::vector<float> buf = random_tensor<float>(4 * kTokens * kHeads * kHeadDim, 91);
  std::vector<float> other = random_tensor<float>(kTokens * kHeads * kHeadDim, 92);
  float* p = buf.data();
  const auto x = View<float>::token_major(p, kTokens, kHeads, kHeadDim);
  std::vector<std::int64_t> pos = {1, 2, 3, 4, 5, 6};
  using IA = std::invalid_argument;
  using OR = std::out_of_range;
  const Style s = Style::rotate_half;
  Options o;

  expect_throw_untouched<IA>(buf, other, [&] { rope::apply(View<float>::token_major(nullptr, 2, 2, 32), table, s, 0); },
                             {"x.data", "null"});
  expect_throw_untouched<IA>(
      buf, other, [&] { rope::apply(x, View<float>::token_major(nullptr, kTokens, kHeads, kHeadDim), table, s, 0); },
      {"out.data", "null"});
  o.rotary_dim = 7;
  expect_throw_untouched<IA>(buf, other, [&] { rope::apply(x, table, s, pos.data(), o); }, {"rotary_dim", "7"});
  o.rotary_dim = 64;
  expect_throw_untouched<IA>(buf, other, [&] { rope::apply(x, table, s, pos.data(), o); },
                             {"options.rotary_dim", "64", "32"});
  o.rotary_dim = 0;
  {
    const rope::Table<float> wide(rope::frequencies(64), 100);
    expect_throw_untouched<IA>(buf, other, [&] { rope::apply(x, wide, s, pos.data()); },
                               {"x.head_dim", "rotary_dim 64", "32"});
  }
  o.threads = 0;
  expect_throw_untouched<IA>(buf, other, [&] { rope::apply(x, table, s, pos.data(), o); }, {"threads", "0"});
  o.threads = 1;
  expect_throw_untouched<IA>(
      buf, other, [&] { rope::apply(View<float>(p, kTokens, kHeads, kHeadDim, kHeads * kHeadDim, 31), table, s, 0); },
      {"x.head_stride", "31", "overlap"});
  expect_throw_untouched<IA>(
      buf, other, [&] { rope::apply(View<float>(p, kTokens, kHeads, kHeadDim, 100, kHeadDim), table, s, 0); },
      {"x.token_stride", "100", "overlap"});
  expect_throw_untouched<IA>(
      buf, other, [&] { rope::apply(x, View<float>::token_major(p + 1, kTokens, kHeads, kHeadDim), table, s, 0); },
      {"out", "overlaps x"});
  expect_throw_untouched<IA>(
      buf, other,
      [&] { rope::apply(x, View<float>::token_major(other.data(), kTokens - 1, kHeads, kHeadDim), table, s, 0); },
      {"out", "[5, 4, 32]", "x [6, 4, 32]"});
  expect_throw_untouched<IA>(buf, other, [&] { rope::apply(x, table, s, static_cast<const std::int64_t*>(nullptr)); },
                             {"positions", "null"});
  // The bad position is the last one: everything before it must still be unwritten.
  pos[5] = 100;
  expect_throw_untouched<OR>(buf, other, [&] { rope::apply(x, table, s, pos.data()); },
                             {"positions[5]", "100", "[0, 100)"});
  const auto out = View<float>::token_major(other.data(), kTokens, kHeads, kHeadDim);
  expect_throw_untouched<OR>(buf, other, [&] { rope::apply(x, out, table, s, pos.data()); }, {"positions[5]", "100"});
  pos[5] = 6;
  pos[3] = -2;
  expect_throw_untouched<OR>(buf, other, [&] { rope::apply(x, table, s, pos.data()); }, {"positions[3]", "-2"});
  pos[3] = 4;
  expect_throw_untouched<OR>(buf, other, [&] { rope::apply(x, table, s, -1); }, {"offset", "-1"});
  expect_throw_untouched<OR>(buf, other, [&] { rope::apply(x, table, s, 95); }, {"token 5", "100"});
  expect_throw_untouched<OR>(buf, other, [&] { rope::apply(x, table, s, std::numeric_limits<std::int64_t>::max()); },
                             {"token 5"});

  // apply_qk: heads that do not divide, token counts that differ, Q and K sharing rows.
  const auto k3 = View<float>::token_major(p + kTokens * kHeads * kHeadDim, kTokens, 3, kHeadDim);
  expect_throw_untouched<IA>(buf, other, [&] { rope::apply_qk(x, k3, table, s, pos.data()); },
                             {"q.heads = 4", "k.heads", "3"});
  const auto k5 = View<float>::token_major(p + kTokens * kHeads * kHeadDim, kTokens - 1, 2, kHeadDim);
  expect_throw_untouched<IA>(buf, other, [&] { rope::apply_qk(x, k5, table, s, pos.data()); },
                             {"k.tokens", "q.tokens = 6", "5"});
  const auto k_overlap = View<float>::packed(p, kTokens, kHeads, 3, 2, kHeadDim);
  expect_throw_untouched<IA>(
      buf, other,
      [&] {
        rope::apply_qk(x, View<float>(k_overlap.data, kTokens, 2, kHeadDim, kHeads * kHeadDim, kHeadDim), table, s, 0);
      },
      {"overlaps"});
  const auto k_ok = View<float>::token_major(p + kTokens * kHeads * kHeadDim, kTokens, 2, kHeadDim);
  pos[2] = 1000;
  expect_throw_untouched<OR>(buf, other, [&] { rope::apply_qk(x, k_ok, table, s, pos.data()); },
                             {"positions[2]", "1000"});
  pos[2] = 3;

  // M-RoPE and axial.
  std::vector<std::int64_t> three(3 * kTokens, 1);
  expect_throw_untouched<IA>(buf, other,
                             [&] {
                               rope::apply_mrope(x, table, s, three.data(), rope::MropeSections{{4, 4, 4}, {}});
                             },
                             {"sections.pairs (4, 4, 4)", "16", "12"});
  expect_throw_untouched<IA>(
      buf, other,
      [&] {
        rope::apply_mrope(x, table, s, three.data(), rope::MropeSections{{2, 7, 7}, rope::SectionOrder::interleaved});
      },
      {"interleav", "(2, 7, 7)"});
  three[2 * kTokens + 4] = 500;
  expect_throw_untouched<OR>(buf, other,
                             [&] {
                               rope::apply_mrope(x, table, s, three.data(), rope::MropeSections{{4, 6, 6}, {}});
                             },
                             {"w positions[4]", "500"});
  {
    const rope::Table<float> t6(rope::frequencies(6), 100);
    expect_throw_untouched<IA>(buf, other, [&] { rope::apply_axial(x, t6, s, three.data()); }, {"multiple of 4", "6"});
  }
  // Pair -> axis maps: one axis per pair, only axes that exist, positions of
  // each axis checked under its name.
  {
    rope::PairAxes pa{std::vector<std::uint8_t>(16, 0), 4};
    std::vector<std::int64_t> four(4 * kTokens, 2);
    expect_throw_untouched<IA>(buf, other,
                               [&] {
                                 rope::apply_mrope(x, table, s, four.data(), rope::PairAxes{pa.axis, 0});
                               },
                               {"pair_axes.axes", "got 0"});
    expect_throw_untouched<IA>(
        buf, other,
        [&] {
          rope::apply_mrope(x, table, s, four.data(), rope::PairAxes{std::vector<std::uint8_t>(15, 0), 4});
        },
        {"pair_axes.axis.size()", "16", "got 15"});
    pa.axis[9] = 4;
    expect_throw_untouched<IA>(buf, other, [&] { rope::apply_mrope(x, table, s, four.data(), pa); },
                               {"pair_axes.axis[9]", "axes = 4", "got 4"});
    pa.axis[9] = 3;
    four[3 * kTokens + 2] = 100;
    expect_throw_untouched<OR>(buf, other, [&] { rope::apply_mrope(x, table, s, four.data(), pa); },
                               {"axis 3 positions[2]", "100"});
    expect_throw_untouched<IA>(buf, other, [&] { (void)rope::PairAxes::hw_alternating(7, 16); }, {"hw_pairs", "got 7"});
    expect_throw_untouched<IA>(buf, other, [&] { (void)rope::PairAxes::hw_alternating(18, 16); },
                               {"hw_pairs", "got 18"});
    expect_throw_untouched<IA>(buf, other,
                               [&] {
                                 (void)rope::PairAxes::sections(rope::MropeSections{{4, 4, 4}, {}}, 16);
                               },
                               {"rope::PairAxes::sections", "(4, 4, 4)", "12"});
  }
  std::vector<std::int64_t> two(2 * kTokens, 0);
  two[kTokens + 1] = -5;
  expect_throw_untouched<OR>(buf, other, [&] { rope::apply_axial(x, table, s, two.data()); },
                             {"col positions[1]", "-5"});

  // Permutations.
  expect_throw_untouched<IA>(buf, other, [&] { rope::permute_to_rotate_half(p, 2, 32, 4, 33); }, {"rotary_dim", "33"});
  expect_throw_untouched<IA>(buf, other, [&] { rope::permute_to_block_diagonal(p, 2, 32, 4, 40); },
                             {"rotary_dim", "40", "head_dim 32"});
  expect_throw_untouched<IA>(
      buf, other, [&] { rope::permute_to_block_diagonal(static_cast<float*>(nullptr), 2, 32, 4); }, {"weight", "null"});
}

// Q and K as neighbouring slices of one packed buffer pass the overlap check.
TEST(ApplyErrors, PackedNeighboursAreNotAnOverlap) {
  constexpr std::size_t kTokens = 3, kHeadDim = 16;
  const rope::Table<float> table(rope::frequencies(kHeadDim), 8);
  std::vector<float> qkv = random_tensor<float>(kTokens * 6 * kHeadDim, 5);
  const auto v = rope::split_qkv(qkv.data(), kTokens, 4, 1, kHeadDim);
  EXPECT_NO_THROW(rope::apply_qk(v.q, v.k, table, Style::rotate_half, 0));
  EXPECT_NO_THROW(rope::apply_qk(v.q, v.v, table, Style::rotate_half, 0));
  EXPECT_THROW(
      rope::apply_qk(v.q, View<float>::packed(qkv.data(), kTokens, 6, 3, 1, kHeadDim), table, Style::rotate_half, 0),
      std::invalid_argument);
}

// A view's bytes must fit in half the address range (the largest
// std::ptrdiff_t, 2^63 - 1 bytes, rounded down to whole elements). Each view
// below claims more and points at a short real buffer, of which a call would
// touch only the first rotary_dim channels of each row: a call that let it
// through would rotate that buffer, so "refused, naming the argument, and
// nothing written" is what shows the checks held. Two ways past the range:
//   - one row of 2^64 bytes (2^62 floats): nothing but the span check sees
//     it, as there is one row along each stride;
//   - three rows 2^63 elements apart: stride * (count - 1) wraps to 0 in a
//     std::size_t, so the span alone reads as one row, and every row lands
//     on the same address once the byte offsets wrap too (a call let
//     through would rotate the one real row three times).
// The largest view the rule allows is accepted and equals the same call on
// a view of just the rotated channels, bit for bit.
template <class T>
void expect_views_past_the_address_range_refused() {
  constexpr std::size_t kRotary = 8;
  const TableFor<T> table(rope::frequencies(kRotary), 4);
  constexpr std::size_t kMaxElements = static_cast<std::size_t>(std::numeric_limits<std::ptrdiff_t>::max()) / sizeof(T);
  constexpr std::size_t kWholeRange = (std::size_t{1} << 63) / sizeof(T) * 2;  // 2^64 bytes, in elements
  constexpr std::size_t kWrap = std::size_t{1} << 63;                          // * 2 wraps to 0
  std::vector<T> row = random_tensor<T>(kRotary, 17), q = random_tensor<T>(3 * kRotary, 18);
  T* const p = row.data();
  const auto untouched = [&, row0 = row, q0 = q](const std::string& what) {
    EXPECT_TRUE(same_bytes(row, row0)) << what << ": a refused call wrote to its view";
    EXPECT_TRUE(same_bytes(q, q0)) << what << ": a refused call wrote to another view";
  };
  const auto refused = [&](const std::string& what, auto&& call, const std::string& argument,
                           const std::string& value) {
    SCOPED_TRACE(what);
    rope_test::expect_names(rope_test::message_of<std::invalid_argument>(call), argument, value);
    untouched(what);
  };
  const Style s = Style::rotate_half;
  const std::string max = std::to_string(kMaxElements);

  // One row of 2^64 bytes, and one element past the limit.
  for (const std::size_t head_dim : {kWholeRange, kMaxElements + 1}) {
    refused(
        "one row of " + std::to_string(head_dim) + " elements",
        [&] { rope::apply(View<T>(p, 1, 1, head_dim, head_dim, head_dim), table, s, 0); }, "x's span of elements",
        "at most " + max);
  }
  // Rows whose offsets wrap around: along the tokens, along the heads, an
  // output of the same shape as a plain input, and K of apply_qk.
  refused(
      "tokens 2^63 elements apart", [&] { rope::apply(View<T>(p, 3, 1, kRotary, kWrap, kRotary), table, s, 0); },
      "x.token_stride", std::to_string(kWrap));
  refused(
      "heads 2^63 elements apart", [&] { rope::apply(View<T>(p, 1, 3, kRotary, 3 * kRotary, kWrap), table, s, 0); },
      "x.head_stride", std::to_string(kWrap));
  refused(
      "an output whose heads are 2^63 elements apart",
      [&] {
        rope::apply<T>(View<const T>(q.data(), 1, 3, kRotary, 3 * kRotary, kRotary),
                       View<T>(p, 1, 3, kRotary, 3 * kRotary, kWrap), table, s, 0);
      },
      "out.head_stride", std::to_string(kWrap));
  refused(
      "K with tokens 2^63 elements apart",
      [&] {
        rope::apply_qk(View<T>(q.data(), 3, 1, kRotary, kRotary, kRotary), View<T>(p, 3, 1, kRotary, kWrap, kRotary),
                       table, s, 0);
      },
      "k.token_stride", std::to_string(kWrap));

  // The largest view allowed: accepted, and only its rotated channels change.
  std::vector<T> want = row;
  rope::apply(View<T>(want.data(), 1, 1, kRotary, kRotary, kRotary), table, s, 3);
  EXPECT_NO_THROW(rope::apply(View<T>(p, 1, 1, kMaxElements, kMaxElements, kMaxElements), table, s, 3));
  EXPECT_TRUE(same_bytes(row, want)) << "the largest view allowed";
}

TEST(ApplyErrors, ViewsPastTheAddressRangeAreRefused) {
  expect_views_past_the_address_range_refused<float>();
  expect_views_past_the_address_range_refused<double>();
  expect_views_past_the_address_range_refused<rope::BFloat16>();
}

// The compile-time builds of the instruction sets rope::dispatch carries
// that have fused multiply-adds (AVX2+FMA and AVX-512 on x86-64, NEON on
// aarch64), through the checked calls with an explicit Arch: bit for bit the
// fused rounding of rounding_oracle.hpp. test_dispatch checks rope::dispatch
// against the same oracle on the same calls, so a dispatched instruction set
// gives the bytes of its compile-time build.
template <class Arch>
constexpr bool kDispatched = std::is_same<Arch, xsimd::fma3<xsimd::avx2>>::value ||
                             std::is_same<Arch, xsimd::avx512bw>::value || std::is_same<Arch, xsimd::neon64>::value;

TEST(ApplyCompileTimeBuilds, FusedInstructionSetsMatchTheRoundingOracleBitForBit) {
  std::vector<std::string> checked;
  rope_test::for_each_arch<float>([&](auto arch) {
    using Arch = decltype(arch);
    if constexpr (kDispatched<Arch>) {
      rope_test::check_calls<float, Arch>(Arch::name(), true, nullptr);
      rope_test::check_calls<double, Arch>(Arch::name(), true, nullptr);
      rope_test::check_calls<rope::BFloat16, Arch>(Arch::name(), true, nullptr);
      rope_test::check_calls<rope::Float16, Arch>(Arch::name(), true, nullptr);
      checked.emplace_back(Arch::name());
    }
  });
  if (checked.empty()) GTEST_SKIP() << "this build targets none of AVX2+FMA, AVX-512 and NEON";
  for (const auto& name : checked) std::cout << "[ checked  ] " << name << "\n";
}

}  // namespace

// ---- Bad input: every refusal names its argument and writes nothing (docs/errors.md).
namespace {
namespace tensor_errors {
namespace scaling = rope::scaling;
[[maybe_unused]] constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
[[maybe_unused]] constexpr double kInf = std::numeric_limits<double>::infinity();
using rope_test::expect_names;
using rope_test::message_of;

// The tensor API. Every case starts from a valid call, breaks one argument,
// and checks the exception, that its message names the argument and shows
// the value, and that every buffer (inputs and outputs) is byte for byte
// what it was.
class TensorApiErrors : public ::testing::Test {
 protected:
  static constexpr std::size_t kTokens = 3, kHeads = 4, kKvHeads = 2, kHeadDim = 72, kRotaryDim = 64;
  static constexpr std::size_t kPositions = 16;

  TensorApiErrors() : table_(rope::frequencies(kRotaryDim), kPositions) {
    for (auto* b : {&q_, &k_, &q_out_, &k_out_}) {
      b->resize(kTokens * kHeads * kHeadDim);
      for (std::size_t i = 0; i < b->size(); ++i) (*b)[i] = static_cast<float>(b == &q_ ? i : 3 * i + 1);
    }
    ids_ = {0, 5, 15};
  }

  rope::View<float> q() { return rope::View<float>::token_major(q_.data(), kTokens, kHeads, kHeadDim); }
  rope::View<float> k() { return rope::View<float>::token_major(k_.data(), kTokens, kKvHeads, kHeadDim); }
  rope::View<float> q_out() { return rope::View<float>::token_major(q_out_.data(), kTokens, kHeads, kHeadDim); }
  rope::View<float> k_out() { return rope::View<float>::token_major(k_out_.data(), kTokens, kKvHeads, kHeadDim); }

  template <class E, class F>
  void expect_rejected(F&& call, const std::string& argument, const std::string& value) {
    SCOPED_TRACE(argument + " = " + value);
    const auto before = std::vector<std::vector<float>>{q_, k_, q_out_, k_out_};
    const auto ids_before = ids_;
    const auto msg = message_of<E>(call);
    expect_names(msg, argument, value);
    const auto after = std::vector<std::vector<float>>{q_, k_, q_out_, k_out_};
    for (std::size_t i = 0; i < before.size(); ++i) {
      EXPECT_EQ(std::memcmp(before[i].data(), after[i].data(), before[i].size() * sizeof(float)), 0)
          << "buffer " << i << " was written by a rejected call";
    }
    EXPECT_EQ(ids_, ids_before);
  }

  rope::Table<float> table_;
  std::vector<float> q_, k_, q_out_, k_out_;
  std::vector<std::int64_t> ids_;
};

TEST_F(TensorApiErrors, ValidCallsSucceed) {
  // The baseline every other case breaks in one place.
  EXPECT_NO_THROW(rope::apply(q(), table_, rope::Style::rotate_half, ids_.data()));
  EXPECT_NO_THROW(rope::apply_qk(q(), k(), table_, rope::Style::block_diagonal, ids_.data()));
}

TEST_F(TensorApiErrors, Views) {
  using rope::Style;
  for (std::size_t threads : {std::size_t{1}, std::size_t{3}}) {
    rope::Options o;
    o.threads = threads;
    auto v = q();
    v.data = nullptr;
    expect_rejected<std::invalid_argument>([&] { rope::apply(v, table_, Style::rotate_half, ids_.data(), o); },
                                           "x.data", "null");
    v = q();
    v.head_dim = 0;
    expect_rejected<std::invalid_argument>([&] { rope::apply(v, table_, Style::rotate_half, ids_.data(), o); },
                                           "x.head_dim", "0");
    v = rope::View<float>(q_.data(), kTokens, kHeads, 30, kHeads * 30, 30);  // 30 < rotary_dim 64
    expect_rejected<std::invalid_argument>([&] { rope::apply(v, table_, Style::rotate_half, ids_.data(), o); },
                                           "head_dim", "30");
    v = q();
    v.head_stride = kHeadDim - 1;  // neighbouring heads would overlap
    expect_rejected<std::invalid_argument>([&] { rope::apply(v, table_, Style::block_diagonal, ids_.data(), o); },
                                           "x.head_stride", std::to_string(kHeadDim - 1));
    v = q();
    v.token_stride = 10;
    expect_rejected<std::invalid_argument>([&] { rope::apply(v, table_, Style::block_diagonal, ids_.data(), o); },
                                           "x.token_stride", "10");
  }
}

TEST_F(TensorApiErrors, Options) {
  using rope::Style;
  rope::Options o;
  o.rotary_dim = 7;
  expect_rejected<std::invalid_argument>([&] { rope::apply(q(), table_, Style::rotate_half, ids_.data(), o); },
                                         "options.rotary_dim", "7");
  o.rotary_dim = kRotaryDim + 2;
  expect_rejected<std::invalid_argument>([&] { rope::apply(q(), table_, Style::rotate_half, ids_.data(), o); },
                                         "options.rotary_dim", std::to_string(kRotaryDim + 2));
  o = rope::Options{};
  o.threads = 0;
  expect_rejected<std::invalid_argument>([&] { rope::apply(q(), table_, Style::rotate_half, ids_.data(), o); },
                                         "options.threads", "0");
}

TEST_F(TensorApiErrors, Positions) {
  using rope::Style;
  for (std::size_t threads : {std::size_t{1}, std::size_t{2}}) {
    rope::Options o;
    o.threads = threads;
    expect_rejected<std::invalid_argument>(
        [&] { rope::apply(q(), table_, Style::rotate_half, static_cast<const std::int64_t*>(nullptr), o); },
        "positions", "null");
    // The last token is bad: nothing of the earlier, valid tokens may be written.
    for (std::int64_t bad : {std::int64_t{-1}, std::int64_t{kPositions}, std::numeric_limits<std::int64_t>::max(),
                             std::numeric_limits<std::int64_t>::min()}) {
      ids_[2] = bad;
      expect_rejected<std::out_of_range>([&] { rope::apply(q(), table_, Style::rotate_half, ids_.data(), o); },
                                         "position", std::to_string(bad));
      expect_rejected<std::out_of_range>(
          [&] { rope::apply_qk(q(), k(), table_, Style::block_diagonal, ids_.data(), o); }, "position",
          std::to_string(bad));
    }
    ids_ = {0, 5, 15};
    expect_rejected<std::out_of_range>([&] { rope::apply(q(), table_, Style::rotate_half, std::int64_t{-3}, o); },
                                       "offset", "-3");
    // Offset 14: tokens at 14, 15, 16, and 16 is past the table.
    expect_rejected<std::out_of_range>([&] { rope::apply(q(), table_, Style::rotate_half, std::int64_t{14}, o); },
                                       "position", "16");
  }
}

TEST_F(TensorApiErrors, OutOfPlaceShapesAndOverlap) {
  using rope::Style;
  const rope::View<const float> x = q();
  auto out = q_out();
  out.heads = kHeads - 1;
  expect_rejected<std::invalid_argument>([&] { rope::apply<float>(x, out, table_, Style::rotate_half, ids_.data()); },
                                         "out", std::to_string(kHeads - 1));
  // out is x shifted by one head: neither the same view nor disjoint.
  const auto shifted =
      rope::View<float>(q_.data() + kHeadDim, kTokens - 1, kHeads, kHeadDim, kHeads * kHeadDim, kHeadDim);
  const rope::View<const float> x2 =
      rope::View<float>(q_.data(), kTokens - 1, kHeads, kHeadDim, kHeads * kHeadDim, kHeadDim);
  expect_rejected<std::invalid_argument>(
      [&] { rope::apply<float>(x2, shifted, table_, Style::rotate_half, ids_.data()); }, "out", "overlaps");
}

TEST_F(TensorApiErrors, ApplyQk) {
  using rope::Style;
  auto k3 = rope::View<float>::token_major(k_.data(), kTokens, 3, kHeadDim);  // 4 % 3 != 0
  expect_rejected<std::invalid_argument>([&] { rope::apply_qk(q(), k3, table_, Style::rotate_half, ids_.data()); },
                                         "k.heads", "3");
  auto k_short = k();
  k_short.tokens = kTokens - 1;
  expect_rejected<std::invalid_argument>([&] { rope::apply_qk(q(), k_short, table_, Style::rotate_half, ids_.data()); },
                                         "k.tokens", std::to_string(kTokens - 1));
  auto k_null = k();
  k_null.data = nullptr;
  expect_rejected<std::invalid_argument>([&] { rope::apply_qk(q(), k_null, table_, Style::rotate_half, ids_.data()); },
                                         "k.data", "null");
  // k_out written over q_out: two outputs sharing memory.
  const auto k_over_q = rope::View<float>::token_major(q_out_.data(), kTokens, kKvHeads, kHeadDim);
  expect_rejected<std::invalid_argument>(
      [&] {
        rope::apply_qk<float>(rope::View<const float>(q()), rope::View<const float>(k()), q_out(), k_over_q, table_,
                              Style::rotate_half, ids_.data());
      },
      "k_out", "overlaps");
}

}  // namespace tensor_errors
}  // namespace
