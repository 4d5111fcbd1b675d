// What the fuzz target's decoders share: the byte reader and the check that
// aborts with a message (fuzz_rope.cpp, fuzz_attention.cpp).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

namespace rope_fuzz {

[[noreturn]] inline void fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "rope_fuzz: check failed: %s (%s)\n", what, detail.c_str());
  std::abort();
}
#define ROPE_FUZZ_CHECK(cond, detail)              \
  do {                                             \
    if (!(cond)) ::rope_fuzz::fail(#cond, detail); \
  } while (0)

class Bytes {
 public:
  Bytes(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}

  std::uint8_t u8() { return pos_ < size_ ? data_[pos_++] : 0; }
  std::uint16_t u16() { return static_cast<std::uint16_t>(u8() | (u8() << 8)); }
  std::uint32_t u32() { return static_cast<std::uint32_t>(u16()) | (static_cast<std::uint32_t>(u16()) << 16); }
  std::uint64_t u64() { return static_cast<std::uint64_t>(u32()) | (static_cast<std::uint64_t>(u32()) << 32); }
  bool flag() { return (u8() & 1) != 0; }

  // Any double, NaN and infinities included (raw bits), or a plausible one.
  double any_double() {
    if (flag()) {
      const std::uint64_t bits = u64();
      double d;
      std::memcpy(&d, &bits, sizeof d);
      return d;
    }
    return static_cast<double>(static_cast<std::int32_t>(u32())) / 1024.0;
  }

  // A base for frequencies: mostly valid (1 < base < 2^32), sometimes anything.
  double base() {
    if ((u8() & 7) == 0) return any_double();
    return 1.0 + 1.0 / 64.0 + static_cast<double>(u32()) / 8.0;
  }

  // An element of x: non-finite, zero, subnormal or a bounded finite value.
  // The bound (2^64) keeps every product with a |cos|, |sin| <= 1 table entry
  // far from float overflow, so the double reference and a float kernel agree
  // on which outputs are infinite.
  template <class T>
  T element() {
    const std::uint8_t kind = u8();
    switch (kind % 16) {
      case 0: return std::numeric_limits<T>::quiet_NaN();
      case 1: return std::numeric_limits<T>::infinity();
      case 2: return -std::numeric_limits<T>::infinity();
      case 3: return T(0);
      case 4: return -T(0);
      case 5: return std::numeric_limits<T>::denorm_min() * static_cast<T>(u8());
      default: {
        const auto mantissa = static_cast<double>(static_cast<std::int16_t>(u16())) / 32768.0;
        return static_cast<T>(std::ldexp(mantissa, static_cast<int>(u8() % 128) - 63));
      }
    }
  }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
};

// The attention decoders (fuzz_attention.cpp, fuzz_append.cpp,
// fuzz_serving.cpp); without rope::attention they return at once.
void fuzz_softmax(Bytes& in);         // softmax over views, or fuzz_step
void fuzz_step(Bytes& in, bool f32);  // one sequence's step over a contiguous cache (f32, else bf16/f16/int8)
void fuzz_linear(Bytes& in);          // linear attention
void fuzz_attend(Bytes& in);          // plan and attend over paged caches
void fuzz_append_kv(Bytes& in);       // plan and append, the K/V form
void fuzz_append(Bytes& in);          // plan and append with Q
void fuzz_merge(Bytes& in);           // merge, and attend split in two and merged
void fuzz_mla(Bytes& in);             // MLA over a latent cache: plan, append, attend (dense, sparse, trees)
void fuzz_lists(Bytes& in);           // attend with sparse lists, tree verify and product modes
void fuzz_shift(Bytes& in);           // shift: cached keys rotated again by a position delta

}  // namespace rope_fuzz
