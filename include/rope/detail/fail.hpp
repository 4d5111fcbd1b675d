// rope/detail/fail.hpp — the one way every layer of rope reports bad input.
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
// path of a decode step. A check hands its argument and requirement over as
// pieces (a piece, or a braced list of them such as {name, ".head_stride"}
// or {">= ", covered, " (rows would overlap)"}): texts, integers and
// doubles, joined into a string by one out-of-line function. The string
// code is then compiled once per translation unit, not once per check,
// which was most of what a header-only user paid to compile the checks.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "../error.hpp"

#if defined(__GNUC__) || defined(__clang__)
#define ROPE_COLD __attribute__((cold, noinline))
#else
#define ROPE_COLD
#endif

namespace rope::detail {

// The shortest decimal text that reads back as the same double; whole
// numbers below 10^15 without an exponent (4096, not 4.096e+03).
inline void append_double(std::string& out, double v) {
  if (std::isnan(v)) {
    out += std::signbit(v) ? "-nan" : "nan";
    return;
  }
  if (std::isinf(v)) {
    out += v < 0 ? "-inf" : "inf";
    return;
  }
  char buffer[32];
  if (v == std::trunc(v) && std::fabs(v) < 1e15) {
    std::snprintf(buffer, sizeof buffer, "%.0f", v);
  } else {
    for (int digits = 1; digits <= 17; ++digits) {
      std::snprintf(buffer, sizeof buffer, "%.*g", digits, v);
      if (std::strtod(buffer, nullptr) == v) break;
    }
  }
  out += buffer;
}

// One piece of a message, kept as the caller passed it until it is written
// out: a text (a null pointer reads "null"), an integer, a double, a bool.
// A piece of a std::string refers to it: it lives as long as the call that
// fails.
class Piece {
 public:
  Piece(const char* s) noexcept : kind_(Kind::text) { value_.text = s; }                 // NOLINT: implicit on purpose
  Piece(const std::string& s) noexcept : kind_(Kind::text) { value_.text = s.c_str(); }  // NOLINT
  Piece(std::nullptr_t) noexcept : kind_(Kind::text) { value_.text = nullptr; }          // NOLINT
  Piece(bool b) noexcept : kind_(Kind::text) { value_.text = b ? "true" : "false"; }     // NOLINT
  Piece(double v) noexcept : kind_(Kind::real) { value_.real = v; }                      // NOLINT
  Piece(float v) noexcept : Piece(static_cast<double>(v)) {}                             // NOLINT
  template <class I, std::enable_if_t<std::is_integral<I>::value && !std::is_same<I, bool>::value, int> = 0>
  Piece(I v) noexcept {  // NOLINT
    if constexpr (std::is_signed<I>::value) {
      kind_ = Kind::signed_integer;
      value_.signed_integer = static_cast<long long>(v);
    } else {
      kind_ = Kind::unsigned_integer;
      value_.unsigned_integer = static_cast<unsigned long long>(v);
    }
  }

  void append_to(std::string& out) const {
    switch (kind_) {
      case Kind::text: out += value_.text == nullptr ? "null" : value_.text; break;
      case Kind::signed_integer: out += std::to_string(value_.signed_integer); break;
      case Kind::unsigned_integer: out += std::to_string(value_.unsigned_integer); break;
      case Kind::real: append_double(out, value_.real); break;
    }
  }

 private:
  enum class Kind : unsigned char { text, signed_integer, unsigned_integer, real };
  Kind kind_;
  union {
    const char* text;
    long long signed_integer;
    unsigned long long unsigned_integer;
    double real;
  } value_;
};

// An argument's name or a requirement as pieces written one after the
// other: {name, ".head_stride"}, {">= ", covered, " (rows would overlap)"}.
// Taken as a parameter only, so the pieces live as long as the call.
using Pieces = std::initializer_list<Piece>;

ROPE_COLD inline std::string join(Pieces pieces) {
  std::string out;
  for (const Piece& p : pieces) p.append_to(out);
  return out;
}

inline std::string to_text(const std::string& s) { return s; }
inline std::string to_text(const char* s) { return s == nullptr ? "null" : s; }
inline std::string to_text(std::nullptr_t) { return "null"; }
inline std::string to_text(bool b) { return b ? "true" : "false"; }
inline std::string to_text(double v) {
  std::string out;
  append_double(out, v);
  return out;
}
inline std::string to_text(float v) { return to_text(static_cast<double>(v)); }
template <class I, std::enable_if_t<std::is_integral<I>::value && !std::is_same<I, bool>::value, int> = 0>
std::string to_text(I v) {
  return std::to_string(v);
}

// The one message format above.
ROPE_COLD inline std::string message(const char* function, Pieces argument, Pieces requirement, const Piece& value) {
  std::string m = function;
  m += ": ";
  for (const Piece& p : argument) p.append_to(m);
  m += " must be ";
  for (const Piece& p : requirement) p.append_to(m);
  m += ", got ";
  value.append_to(m);
  return m;
}

// Throws E with the one message format above: rope::invalid_argument or
// rope::out_of_range for bad input, which carry the names too; any other
// exception type (a CPU that cannot run a build) gets the message alone.
// Out of line: a check's failing branch is then a call. The argument and
// the requirement are each one piece or a braced list of them.
template <class E = rope::invalid_argument>
[[noreturn]] ROPE_COLD void fail(const char* function, Pieces argument, Pieces requirement, const Piece& value) {
  std::string text = message(function, argument, requirement, value);
  if constexpr (std::is_base_of<ErrorSource, E>::value) {
    throw E(function, join(argument), text);
  } else {
    throw E(text);
  }
}
template <class E = rope::invalid_argument>
[[noreturn]] inline void fail(const char* function, const Piece& argument, Pieces requirement, const Piece& value) {
  fail<E>(function, {argument}, requirement, value);
}
template <class E = rope::invalid_argument>
[[noreturn]] inline void fail(const char* function, Pieces argument, const Piece& requirement, const Piece& value) {
  fail<E>(function, argument, {requirement}, value);
}
template <class E = rope::invalid_argument>
[[noreturn]] inline void fail(const char* function, const Piece& argument, const Piece& requirement,
                              const Piece& value) {
  fail<E>(function, {argument}, {requirement}, value);
}

// Indexed argument names: "positions[3]", "k_positions[0]".
inline std::string indexed(const std::string& name, std::size_t i) { return name + "[" + std::to_string(i) + "]"; }

// "x.head_stride": a field of a named argument.
inline std::string field(const char* name, const char* member) { return std::string(name) + "." + member; }

}  // namespace rope::detail
