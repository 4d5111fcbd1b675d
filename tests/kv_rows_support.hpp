// What the suites of the KV-cache rows share (tests/test_kernels_kv_*.cpp,
// each a typed suite KvRows over rope_test::DistinctArchs): random stored
// values of each element type, and the row lengths they sweep. The suites
// are split by kernel (and the heaviest by element type) so that no unit
// instantiates every kernel for every element type and architecture at
// once: under g++'s sanitizers that one unit took more than 24 CPU-minutes
// and 7.8 GB to compile.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <type_traits>
#include <vector>

#include <rope/fp8.hpp>
#include <rope/half.hpp>

namespace rope_test {

// n random stored values: floats in [-1, 1] rounded into E; int8 over its
// whole range, -128 included (widening must be exact there too); fp8 every
// finite code.
template <class E>
std::vector<E> random_elements(std::size_t n, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<E> v(n);
  if constexpr (std::is_same<E, std::int8_t>::value) {
    std::uniform_int_distribution<int> dist(-128, 127);
    for (auto& x : v) x = static_cast<std::int8_t>(dist(gen));
  } else if constexpr (std::is_same<E, rope::Float8E4M3>::value || std::is_same<E, rope::Float8E5M2>::value) {
    // fp8: every finite code, subnormals and the largest included.
    std::uniform_int_distribution<int> dist(0, 255);
    for (auto& x : v) {
      do {
        x = E::from_bits(static_cast<std::uint8_t>(dist(gen)));
      } while (!std::isfinite(static_cast<float>(x)));
    }
  } else {
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    for (auto& x : v) {
      if constexpr (std::is_same<E, float>::value) {
        x = dist(gen);
      } else {
        x = E(dist(gen));
      }
    }
  }
  return v;
}

// Row lengths: every one up to 70 (every tail of every lane width), and two
// past 128.
inline std::vector<std::size_t> kv_dims() {
  std::vector<std::size_t> d;
  for (std::size_t i = 1; i <= 70; ++i) d.push_back(i);
  d.push_back(128);
  d.push_back(130);
  return d;
}

}  // namespace rope_test
