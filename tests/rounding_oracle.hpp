// The tensor API's result with every rounding spelled out, for bit-for-bit
// comparisons of builds and of rope::dispatch's instruction sets.
//
// Every kernel computes pair (a, b) as y_a = fnma(x_b, s, x_a c) and
// y_b = fma(x_a, s, x_b c) in the compute type (float for 16-bit storage),
// then rounds once to the storage type. What fnma/fma mean depends on the
// architecture:
//   fused     (AVX2+FMA, AVX-512, NEON on aarch64): x_a c is rounded, then
//             y_a = round(x_a c - x_b s) in one fused step;
//   unfused   (SSE2, compiled without FMA): y_a = round(round(x_a c) - round(x_b s)).
// Both are written here with the roundings forced (a volatile store rounds a
// product; std::fma rounds once), so the compiler's contraction of a*b+c
// into a fused multiply-add (GCC's default -ffp-contract=fast) cannot change
// what the oracle means. 16-bit values are widened and rounded with rope's
// scalar conversions, which test_half checks against Eigen's.
#pragma once

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include <rope/apply.hpp>
#include <rope/half.hpp>
#include <rope/multi_axis.hpp>
#include <rope/style.hpp>

namespace rope_test {

using rope::Direction;
using rope::Style;
using rope::View;

template <class T>
using compute_of = std::conditional_t<std::is_same<T, double>::value, double, float>;

template <class C>
void rotate_pair(C xa, C xb, C c, C s, bool fused, C& ya, C& yb) {
  const volatile C ac = xa * c;
  const volatile C bc = xb * c;
  if (fused) {
    ya = std::fma(-xb, s, static_cast<C>(ac));
    yb = std::fma(xa, s, static_cast<C>(bc));
  } else {
    const volatile C bs = xb * s;
    const volatile C as = xa * s;
    ya = static_cast<C>(ac) - static_cast<C>(bs);
    yb = static_cast<C>(as) + static_cast<C>(bc);
  }
}

// out = in rotated: in is [tokens, heads, head_dim] (contiguous), row(t, p,
// c, s) gives the cos and sin of pair p of token t. Channels past rotary_dim
// are copied.
template <rope::Style S, class T, class RowAt>
std::vector<T> expected_tensor(const std::vector<T>& in, std::size_t tokens, std::size_t heads, std::size_t head_dim,
                               std::size_t rotary_dim, rope::Direction dir, bool fused, RowAt row) {
  using C = compute_of<T>;
  std::vector<T> out = in;
  const std::size_t pairs = rotary_dim / 2;
  for (std::size_t t = 0; t < tokens; ++t) {
    for (std::size_t p = 0; p < pairs; ++p) {
      C c, s;
      row(t, p, c, s);
      if (dir == rope::Direction::inverse) s = -s;
      for (std::size_t h = 0; h < heads; ++h) {
        const std::size_t base = (t * heads + h) * head_dim;
        const std::size_t a = base + rope::first_channel<S>(p, rotary_dim);
        const std::size_t b = base + rope::second_channel<S>(p, rotary_dim);
        C ya, yb;
        rotate_pair<C>(static_cast<C>(in[a]), static_cast<C>(in[b]), c, s, fused, ya, yb);
        out[a] = T(ya);
        out[b] = T(yb);
      }
    }
  }
  return out;
}

// One call of the tensor API: shapes and rotary part.
struct Shape {
  std::size_t tokens, q_heads, k_heads, head_dim, rotary_dim;
};
// Rotary dims of 48, 19, 12 and 1 pairs: whole steps, an overlapping last
// step and rows shorter than a step for SSE2 (4 float lanes), AVX2 (8) and
// AVX-512 (16), for float, double and the 16-bit kernels (whose
// rotate_half step covers twice the lanes).
constexpr Shape kShapes[] = {{7, 4, 2, 96, 96}, {5, 4, 2, 96, 38}, {6, 2, 1, 80, 24}, {3, 2, 2, 8, 2}};

template <class T>
std::vector<T> random_tensor(std::size_t n, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(-2.0, 2.0);
  std::vector<T> v(n);
  for (auto& x : v) x = T(static_cast<compute_of<T>>(dist(gen)));
  return v;
}

template <class T>
bool same_bytes(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

template <class T>
std::size_t first_difference(const std::vector<T>& a, const std::vector<T>& b) {
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return i;
  }
  return a.size();
}

// The tensor calls of one element type through instruction set Arch (the
// default: the caller's own, or rope::dispatch's when installed), each
// against the oracle with the rounding of `arch`: apply and apply_qk, in
// place and out of place; apply_mrope with chunked and interleaved sections
// and with a PairAxes listed pair by pair; apply_axial. The output of each
// call is returned in `outputs` so that callers can compare runs.
template <class T, class Arch = xsimd::default_arch>
void check_calls(const std::string& arch, bool fused, std::vector<std::vector<T>>* outputs) {
  using C = compute_of<T>;
  std::uint32_t seed = 1;
  for (const Shape& shape : kShapes) {
    const rope::Table<C> table(rope::frequencies(shape.rotary_dim, 10000.0), 64);
    std::vector<std::int64_t> positions(shape.tokens);
    for (std::size_t t = 0; t < shape.tokens; ++t) positions[t] = static_cast<std::int64_t>((7 * t + 3) % 64);
    const auto single = [&](std::size_t t, std::size_t p, C& c, C& s) {
      c = table.cos(static_cast<std::size_t>(positions[t]))[p];
      s = table.sin(static_cast<std::size_t>(positions[t]))[p];
    };
    for (Style style : {Style::rotate_half, Style::block_diagonal}) {
      for (Direction dir : {Direction::forward, Direction::inverse}) {
        for (std::size_t threads : {std::size_t{1}, std::size_t{2}}) {
          for (rope::Stores stores : {rope::Stores::cached, rope::Stores::streaming}) {
            const rope::Options options{0, dir, threads, stores, {}};
            const std::string where = arch + " " + rope::name(style) + " " + rope::name(dir) + " rotary " +
                                      std::to_string(shape.rotary_dim) + "/" + std::to_string(shape.head_dim) +
                                      " threads " + std::to_string(threads) +
                                      (stores == rope::Stores::streaming ? " streaming" : " cached");
            const auto expect = [&](const std::vector<T>& in, std::size_t heads, const std::vector<T>& got,
                                    const std::string& what) {
              const auto want = style == Style::rotate_half
                                    ? expected_tensor<Style::rotate_half>(in, shape.tokens, heads, shape.head_dim,
                                                                          shape.rotary_dim, dir, fused, single)
                                    : expected_tensor<Style::block_diagonal>(in, shape.tokens, heads, shape.head_dim,
                                                                             shape.rotary_dim, dir, fused, single);
              ASSERT_TRUE(same_bytes(got, want))
                  << where << " " << what << ": first difference at element " << first_difference(got, want);
              if (outputs != nullptr) outputs->push_back(got);
            };
            // apply, out of place (the input must stay as it was) and in place.
            const auto x = random_tensor<T>(shape.tokens * shape.q_heads * shape.head_dim, seed++);
            std::vector<T> out(x.size(), T(0.0f));
            rope::apply<T, C, Arch>(View<const T>::token_major(x.data(), shape.tokens, shape.q_heads, shape.head_dim),
                                    View<T>::token_major(out.data(), shape.tokens, shape.q_heads, shape.head_dim),
                                    table, style, positions.data(), options);
            expect(x, shape.q_heads, out, "apply out of place");
            auto y = x;
            rope::apply<T, C, Arch>(View<T>::token_major(y.data(), shape.tokens, shape.q_heads, shape.head_dim), table,
                                    style, positions.data(), options);
            expect(x, shape.q_heads, y, "apply in place");
            // apply_qk, grouped-query heads, in place.
            auto q = x;
            const auto k0 = random_tensor<T>(shape.tokens * shape.k_heads * shape.head_dim, seed++);
            auto k = k0;
            rope::apply_qk<T, C, Arch>(View<T>::token_major(q.data(), shape.tokens, shape.q_heads, shape.head_dim),
                                       View<T>::token_major(k.data(), shape.tokens, shape.k_heads, shape.head_dim),
                                       table, style, positions.data(), options);
            expect(x, shape.q_heads, q, "apply_qk q");
            expect(k0, shape.k_heads, k, "apply_qk k");
            // apply_qk out of place.
            std::vector<T> q_out(x.size(), T(0.0f)), k_out(k0.size(), T(0.0f));
            rope::apply_qk<T, C, Arch>(
                View<const T>::token_major(x.data(), shape.tokens, shape.q_heads, shape.head_dim),
                View<const T>::token_major(k0.data(), shape.tokens, shape.k_heads, shape.head_dim),
                View<T>::token_major(q_out.data(), shape.tokens, shape.q_heads, shape.head_dim),
                View<T>::token_major(k_out.data(), shape.tokens, shape.k_heads, shape.head_dim), table, style,
                positions.data(), options);
            expect(x, shape.q_heads, q_out, "apply_qk out of place q");
            expect(k0, shape.k_heads, k_out, "apply_qk out of place k");
          }
        }
        // The multi-axis calls: pair p follows axis_of_pair[p] of positions
        // [axes, tokens], with the layout written out here rather than taken
        // from rope's builders. One row function serves them all, so the
        // oracle is instantiated once per pairing.
        const std::size_t pairs = shape.rotary_dim / 2;
        std::vector<std::int64_t> axes(4 * shape.tokens);
        for (std::size_t i = 0; i < axes.size(); ++i) axes[i] = static_cast<std::int64_t>((5 * i + 1) % 64);
        std::vector<std::uint8_t> axis_of_pair(pairs);
        const auto multi = [&](std::size_t t, std::size_t p, C& c, C& s) {
          const auto m = static_cast<std::size_t>(axes[axis_of_pair[p] * shape.tokens + t]);
          c = table.cos(m)[p];
          s = table.sin(m)[p];
        };
        const auto expect_axes = [&](const std::vector<T>& in, const std::vector<T>& got, const std::string& what) {
          const auto want =
              style == Style::rotate_half
                  ? expected_tensor<Style::rotate_half>(in, shape.tokens, shape.q_heads, shape.head_dim,
                                                        shape.rotary_dim, dir, fused, multi)
                  : expected_tensor<Style::block_diagonal>(in, shape.tokens, shape.q_heads, shape.head_dim,
                                                           shape.rotary_dim, dir, fused, multi);
          ASSERT_TRUE(same_bytes(got, want))
              << arch << " " << what << " " << rope::name(style) << " " << rope::name(dir) << " rotary "
              << shape.rotary_dim << ": first difference at element " << first_difference(got, want);
          if (outputs != nullptr) outputs->push_back(got);
        };
        const auto x = random_tensor<T>(shape.tokens * shape.q_heads * shape.head_dim, seed++);
        const auto view = [&](std::vector<T>& y) {
          return View<T>::token_major(y.data(), shape.tokens, shape.q_heads, shape.head_dim);
        };
        const auto on_threads = [&](std::size_t threads) {
          return rope::Options{0, dir, threads, rope::Stores::automatic, {}};
        };
        // M-RoPE, chunked sections (t, h, w): pairs [0, s0) follow t, the
        // next s1 h, the rest w.
        const std::array<std::size_t, 3> chunked{pairs - pairs / 2, pairs / 4, pairs / 2 - pairs / 4};
        for (std::size_t p = 0; p < pairs; ++p) {
          axis_of_pair[p] = p < chunked[0] ? 0 : p < chunked[0] + chunked[1] ? 1 : 2;
        }
        auto y = x;
        rope::apply_mrope<T, C, Arch>(view(y), table, style, axes.data(),
                                      rope::MropeSections{chunked, rope::SectionOrder::chunked}, on_threads(1));
        expect_axes(x, y, "apply_mrope chunked");
        // Interleaved sections: pair p follows h if p % 3 == 1 and p / 3 <
        // s1, w if p % 3 == 2 and p / 3 < s2, t otherwise.
        const std::array<std::size_t, 3> interleaved{pairs - pairs / 3 - pairs / 4, pairs / 3, pairs / 4};
        for (std::size_t p = 0; p < pairs; ++p) {
          axis_of_pair[p] = p % 3 == 1 && p / 3 < interleaved[1] ? 1 : p % 3 == 2 && p / 3 < interleaved[2] ? 2 : 0;
        }
        y = x;
        rope::apply_mrope<T, C, Arch>(view(y), table, style, axes.data(),
                                      rope::MropeSections{interleaved, rope::SectionOrder::interleaved}, on_threads(2));
        expect_axes(x, y, "apply_mrope interleaved");
        // A PairAxes of four axes in no pattern.
        for (std::size_t p = 0; p < pairs; ++p) axis_of_pair[p] = static_cast<std::uint8_t>((7 * p + 3) % 11 % 4);
        y = x;
        rope::apply_mrope<T, C, Arch>(view(y), table, style, axes.data(), rope::PairAxes{axis_of_pair, 4},
                                      on_threads(1));
        expect_axes(x, y, "apply_mrope PairAxes");
        // 2-D axial: the first rotary_dim/4 pairs follow the row, the rest
        // the column (rotary dims of whole pairs of pairs only).
        if (shape.rotary_dim % 4 == 0) {
          for (std::size_t p = 0; p < pairs; ++p) axis_of_pair[p] = p < shape.rotary_dim / 4 ? 0 : 1;
          y = x;
          rope::apply_axial<T, C, Arch>(view(y), table, style, axes.data(), on_threads(2));
          expect_axes(x, y, "apply_axial");
        }
      }
    }
  }
}

}  // namespace rope_test
