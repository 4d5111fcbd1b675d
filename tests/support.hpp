// Shared helpers of rope's tests: deterministic random data, buffers with
// guard values around them, and the double-precision oracle.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <gtest/gtest.h>

#include <rope/error.hpp>
#include <rope/frequencies.hpp>
#include <rope/reference.hpp>
#include <rope/style.hpp>

namespace rope_test {

// Names the instances of a typed test over float and double; passing a name
// generator is also what clang's -Wpedantic asks of TYPED_TEST_SUITE.
struct ScalarNames {
  template <class T>
  static std::string GetName(int) {
    return std::is_same<T, float>::value ? "float" : "double";
  }
};

// What a checked call throws: the message of its rope::invalid_argument, or
// "out_of_range: " and the message of its rope::out_of_range, or "no
// exception". A standard exception that is not rope's own reads "not rope's:
// " and its message, so every comparison of a message also asserts the type.
// The names the error carries must open its message ("<function>: <argument>
// must be"); a mismatch reads "names do not match the message: ...".
template <class E>
std::string checked_names(const E& e, std::string prefix) {
  const std::string what = e.what();
  const std::string head = e.function() + ": " + e.argument() + " must be ";
  if (what.compare(0, head.size(), head) != 0)
    return "names do not match the message: " + e.function() + " / " + e.argument() + " / " + what;
  return prefix + what;
}
template <class F>
std::string thrown_message(F&& call) {
  try {
    call();
  } catch (const rope::invalid_argument& e) {
    return checked_names(e, "");
  } catch (const rope::out_of_range& e) {
    return checked_names(e, "out_of_range: ");
  } catch (const std::invalid_argument& e) {
    return std::string("not rope's: ") + e.what();
  } catch (const std::out_of_range& e) {
    return std::string("not rope's: out_of_range: ") + e.what();
  }
  return "no exception";
}

// Runs f, which must throw E (and an error of rope's own type); returns the
// message ("" and a failure if not).
template <class E, class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    if (dynamic_cast<const rope::detail::ErrorSource*>(&e) == nullptr) {
      ADD_FAILURE() << "not an error of rope's own type: " << e.what();
    }
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw another exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "did not throw";
  return "";
}

// The message names `argument` and shows `value` as written in it.
inline void expect_names(const std::string& msg, const std::string& argument, const std::string& value) {
  EXPECT_NE(msg.find(argument), std::string::npos) << "message does not name " << argument << ": " << msg;
  EXPECT_NE(msg.find(value), std::string::npos) << "message does not show " << value << ": " << msg;
}

template <class T>
std::vector<T> random_vector(std::size_t n, std::uint32_t seed, double scale = 1.0) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(-scale, scale);
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(dist(gen));
  return v;
}

// A buffer of n values at a chosen element offset from a 64-byte boundary,
// with kGuard guard values on both sides holding a recognisable pattern.
template <class T>
class Guarded {
 public:
  static constexpr std::size_t kGuard = 64;

  Guarded(std::size_t n, std::size_t misalign) : n_(n), offset_(kGuard + misalign) {
    storage_.resize(n + 2 * kGuard + 64 / sizeof(T) + misalign);
    // Align the first element of the storage's interior to 64 bytes.
    const auto address = reinterpret_cast<std::uintptr_t>(storage_.data() + kGuard);
    const std::size_t shift = ((64 - address % 64) % 64) / sizeof(T);
    offset_ += shift;
    for (std::size_t i = 0; i < storage_.size(); ++i) storage_[i] = guard_value(i);
  }

  T* data() noexcept { return storage_.data() + offset_; }
  const T* data() const noexcept { return storage_.data() + offset_; }
  std::size_t size() const noexcept { return n_; }

  // True when every value outside [data(), data() + size()) is unchanged.
  bool guards_intact() const {
    for (std::size_t i = 0; i < storage_.size(); ++i) {
      if (i >= offset_ && i < offset_ + n_) continue;
      const T expected = guard_value(i);
      if (std::memcmp(&storage_[i], &expected, sizeof(T)) != 0) return false;
    }
    return true;
  }

 private:
  static T guard_value(std::size_t i) { return static_cast<T>(-12345.0 - double(i)); }

  std::size_t n_;
  std::size_t offset_;
  std::vector<T> storage_;
};

// cos/sin rows of one position computed in double from the schedule: the
// oracle for tables, and rows at positions beyond any table.
struct Row {
  std::vector<double> cos, sin;
};
inline Row exact_row(const rope::Frequencies& f, double position) {
  Row r;
  for (double theta : f.inv_freq) {
    r.cos.push_back(f.attention_factor * std::cos(position * theta));
    r.sin.push_back(f.attention_factor * std::sin(position * theta));
  }
  return r;
}

template <class To, class From>
std::vector<To> convert(const From* p, std::size_t n) {
  return std::vector<To>(p, p + n);
}

// The reference rotation evaluated in double on the (exactly widened)
// inputs, together with the per-channel magnitude |x_a c| + |x_b s| that
// bounds the rounding error of any evaluation of the same formula.
template <rope::Style S, class T>
void reference_in_double(const T* x, const T* cos, const T* sin, std::size_t rotary_dim, rope::Direction dir,
                         std::vector<double>& y, std::vector<double>& magnitude) {
  const auto xd = convert<double>(x, rotary_dim);
  const auto cd = convert<double>(cos, rotary_dim / 2);
  const auto sd = convert<double>(sin, rotary_dim / 2);
  y.assign(rotary_dim, 0.0);
  magnitude.assign(rotary_dim, 0.0);
  rope::reference::rotate<S>(xd.data(), y.data(), cd.data(), sd.data(), rotary_dim, dir);
  for (std::size_t p = 0; p < rotary_dim / 2; ++p) {
    const std::size_t a = rope::first_channel<S>(p, rotary_dim);
    const std::size_t b = rope::second_channel<S>(p, rotary_dim);
    const double m =
        std::fabs(xd[a] * cd[p]) + std::fabs(xd[b] * sd[p]) + std::fabs(xd[b] * cd[p]) + std::fabs(xd[a] * sd[p]);
    magnitude[a] = magnitude[b] = m;
  }
}

}  // namespace rope_test
