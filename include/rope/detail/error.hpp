// rope/detail/error.hpp — the one way every layer of rope reports bad input.
//
//   "<function>: <argument> must be <requirement>, got <value>"
//
// e.g. "rope::apply: x.head_stride must be >= 72 (rows would overlap), got 71".
// The function is the public entry point the caller called, the argument is
// spelled as the caller wrote it (q.head_stride, options.block,
// scaling::Yarn::factor, positions[3]), and the value is shown as the caller
// passed it: integers exactly, doubles with the fewest digits that read back
// as the same double, null pointers as "null". rope::invalid_argument for
// shapes, strides, options and fields; rope::out_of_range for positions
// (error.hpp: both derive from the std exceptions and carry the function and
// argument names).
//
// Messages are built only on failure, so a check costs a compare on the hot
// path of a decode step.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "../error.hpp"

namespace rope::detail {

inline std::string to_text(const std::string& s) { return s; }
inline std::string to_text(const char* s) { return s == nullptr ? "null" : s; }
inline std::string to_text(std::nullptr_t) { return "null"; }
inline std::string to_text(bool b) { return b ? "true" : "false"; }

// The shortest decimal text that reads back as the same double; whole
// numbers below 10^15 without an exponent (4096, not 4.096e+03).
inline std::string to_text(double v) {
  if (std::isnan(v)) return std::signbit(v) ? "-nan" : "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  char buffer[32];
  if (v == std::trunc(v) && std::fabs(v) < 1e15) {
    std::snprintf(buffer, sizeof buffer, "%.0f", v);
    return buffer;
  }
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(buffer, sizeof buffer, "%.*g", digits, v);
    if (std::strtod(buffer, nullptr) == v) break;
  }
  return buffer;
}
inline std::string to_text(float v) { return to_text(static_cast<double>(v)); }

template <class I, std::enable_if_t<std::is_integral<I>::value && !std::is_same<I, bool>::value, int> = 0>
std::string to_text(I v) {
  return std::to_string(v);
}

// Throws E with the one message format above: rope::invalid_argument or
// rope::out_of_range for bad input, which carry the names too; any other
// exception type (a CPU that cannot run a build) gets the message alone.
template <class E = rope::invalid_argument, class V>
[[noreturn]] void fail(const char* function, const std::string& argument, const std::string& requirement,
                       const V& value) {
  std::string message = std::string(function) + ": " + argument + " must be " + requirement + ", got " + to_text(value);
  if constexpr (std::is_base_of<ErrorSource, E>::value) {
    throw E(function, argument, message);
  } else {
    throw E(message);
  }
}

// Indexed argument names: "positions[3]", "k_positions[0]".
inline std::string indexed(const std::string& name, std::size_t i) { return name + "[" + std::to_string(i) + "]"; }

// "x.head_stride": a field of a named argument.
inline std::string field(const char* name, const char* member) { return std::string(name) + "." + member; }

}  // namespace rope::detail
