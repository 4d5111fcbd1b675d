// The element types of a KV cache, for the suites that sweep them
// (test_kernels_kv_rows, test_attention_batch): their names, a loop over
// them, and the exact widening of one stored value to float.
#pragma once

#include <cstdint>
#include <type_traits>

#include <rope/half.hpp>

namespace rope_test {

template <class E>
const char* element_name() {
  if (std::is_same<E, float>::value) return "f32";
  if (std::is_same<E, rope::BFloat16>::value) return "bf16";
  if (std::is_same<E, rope::Float16>::value) return "f16";
  return "int8";
}

// Calls f(E{}) for every element type of a cache.
template <class F>
void for_each_element(F&& f) {
  f(float{});
  f(rope::BFloat16{});
  f(rope::Float16{});
  f(std::int8_t{});
}

inline float widen(float x) { return x; }
inline float widen(rope::BFloat16 x) { return rope::detail::widen_value(x); }
inline float widen(rope::Float16 x) { return rope::detail::widen_value(x); }
inline float widen(std::int8_t x) { return static_cast<float>(x); }

}  // namespace rope_test
