// libFuzzer target of rope's checked API. The bytes of one input are decoded
// into the arguments of one call; the call must either throw the exception
// its documentation names for those arguments, or return a result equal to an
// independent oracle (the scalar reference in double, or the closed form in
// long double). A crash, a hang, a sanitizer report or a failed check aborts.
//
// Input layout: byte 0 picks the operation (frequencies, frequencies with a
// scaling variant, the row kernel on float/double, apply/apply_qk on
// float/double, and with rope::attention built, softmax (and one sequence's
// step over a contiguous cache) and linear attention, then the serving path
// over paged caches: plan with attend, plan with append (its K/V form and
// its form with Q), and merge: fuzz_attention.cpp); the rest are read in
// order by Bytes (missing bytes read as zero, so every input decodes to
// something).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include <rope/apply.hpp>
#include <rope/frequencies.hpp>
#include <rope/kernels.hpp>
#include <rope/reference.hpp>
#include <rope/style.hpp>
#include <rope/table.hpp>

#include "fuzz_support.hpp"

namespace {

using rope_fuzz::Bytes;

// frequencies(rotary_dim, base): std::invalid_argument exactly when
// rotary_dim is zero or odd, or base is not finite and > 1; otherwise
// theta_p = base^(-2p/r) within one ulp of the long double closed form.
void fuzz_frequencies(Bytes& in) {
  const std::size_t rotary_dim = (in.u8() & 15) == 0 ? in.u16() : in.u8();
  const double base = in.base();
  const bool valid = rotary_dim != 0 && rotary_dim % 2 == 0 && std::isfinite(base) && base > 1.0;
  const std::string args = "rotary_dim=" + std::to_string(rotary_dim) + " base=" + std::to_string(base);
  rope::Frequencies f;
  try {
    f = rope::frequencies(rotary_dim, base);
  } catch (const rope::invalid_argument& e) {
    ROPE_FUZZ_CHECK(!valid, args + ": " + e.what());
    const std::string msg = e.what();
    const bool names_argument = msg.find("rotary_dim") != std::string::npos || msg.find("base") != std::string::npos;
    ROPE_FUZZ_CHECK(names_argument, msg);
    return;
  }
  ROPE_FUZZ_CHECK(valid, args);
  ROPE_FUZZ_CHECK(f.inv_freq.size() == rotary_dim / 2, args);
  ROPE_FUZZ_CHECK(f.attention_factor == 1.0, args);
  for (std::size_t p = 0; p < f.inv_freq.size(); ++p) {
    const long double exact =
        std::pow(static_cast<long double>(base), -2.0L * static_cast<long double>(p) / rotary_dim);
    const double bound = 0x1p-52 * static_cast<double>(exact) + std::numeric_limits<double>::denorm_min();
    ROPE_FUZZ_CHECK(std::fabs(f.inv_freq[p] - static_cast<double>(exact)) <= bound, args + " p=" + std::to_string(p));
  }
}

// A factor-like field: mostly plausible, sometimes any double (0, negative,
// NaN, infinite, huge, subnormal).
double field(Bytes& in) {
  if ((in.u8() & 3) == 0) return in.any_double();
  return static_cast<double>(in.u16()) / 256.0;
}
std::size_t length_field(Bytes& in) {
  return (in.u8() & 7) == 0 ? static_cast<std::size_t>(in.u64()) : static_cast<std::size_t>(in.u16());
}
bool positive(double v) { return v > 0.0 && std::isfinite(v); }

std::vector<double> factor_vector(Bytes& in, std::size_t pairs) {
  // Usually the right length, sometimes one off.
  const std::uint8_t shape = in.u8();
  std::size_t n = pairs;
  if (shape % 8 == 1) n = pairs + 1;
  if (shape % 8 == 2 && pairs > 0) n = pairs - 1;
  std::vector<double> v(n);
  for (auto& x : v) x = (in.u8() % 16 == 0) ? in.any_double() : 0.25 + static_cast<double>(in.u8()) / 32.0;
  return v;
}

long double plain(std::size_t p, std::size_t r, long double base) {
  return std::pow(base, -2.0L * static_cast<long double>(p) / static_cast<long double>(r));
}

// frequencies(rotary_dim, base, scaling, seq_len) for every variant:
// std::invalid_argument exactly when a field breaks its documented
// requirement (checked here independently), naming a field; otherwise
// inv_freq holds rotary_dim/2 finite values >= 0, the attention factor is
// finite and > 0, and where the variant has a closed form (None, Linear,
// Ntk, DynamicNtk, Llama3, LongRope, Custom) each theta_p is within two ulps
// of it evaluated here in long double. YaRN, whose ramp has no short closed
// form, must lie between theta_p/factor and theta_p.
void fuzz_scaling(Bytes& in) {
  const std::size_t rotary_dim = (in.u8() & 15) == 0 ? in.u16() : 2 * (in.u8() % 80);
  const double base = in.base();
  const std::size_t seq_len = length_field(in);
  const std::size_t pairs = rotary_dim / 2;
  bool valid = rotary_dim != 0 && rotary_dim % 2 == 0 && std::isfinite(base) && base > 1.0;
  bool may_throw_derived = false;  // YaRN's computed attention factor may be rejected
  rope::Scaling scaling;
  std::vector<long double> closed;  // empty: no closed form
  long double low = 0, high = 0;    // YaRN's bounds
  double attention = 1.0;
  const auto schedule = [&](long double b) {
    std::vector<long double> v(pairs);
    for (std::size_t p = 0; p < pairs; ++p) v[p] = plain(p, rotary_dim, b);
    return v;
  };
  switch (in.u8() % 8) {
    case 0:
      scaling = rope::scaling::None{};
      if (valid) closed = schedule(base);
      break;
    case 1: {
      const double f = field(in);
      scaling = rope::scaling::Linear{f};
      valid = valid && positive(f);
      if (valid) {
        closed = schedule(base);
        for (auto& v : closed) v /= f;
      }
      break;
    }
    case 2: {
      const double f = field(in);
      scaling = rope::scaling::Ntk{f};
      valid = valid && positive(f) && rotary_dim > 2;
      if (valid) {
        const long double r = static_cast<long double>(rotary_dim);
        closed = schedule(base * std::pow(static_cast<long double>(f), r / (r - 2)));
      }
      break;
    }
    case 3: {
      const double f = field(in);
      const std::size_t l0 = length_field(in);
      scaling = rope::scaling::DynamicNtk{f, l0};
      valid = valid && positive(f) && l0 > 0 && rotary_dim > 2;
      if (valid) {
        const long double r = static_cast<long double>(rotary_dim);
        const long double len = static_cast<long double>(std::max(seq_len, l0));
        const long double stretch = f * len / static_cast<long double>(l0) - (static_cast<long double>(f) - 1);
        closed = seq_len <= l0 ? schedule(base) : schedule(base * std::pow(stretch, r / (r - 2)));
      }
      break;
    }
    case 4: {
      rope::scaling::Yarn y;
      y.factor = field(in);
      y.original_max_positions = length_field(in);
      if (in.flag()) y.beta_fast = field(in);
      if (in.flag()) y.beta_slow = field(in);
      if (in.flag()) y.mscale = in.any_double();
      if (in.flag()) y.mscale_all_dim = in.any_double();
      if (in.flag()) y.attention_factor = field(in);
      y.truncate = in.flag();
      scaling = y;
      valid = valid && positive(y.factor) && y.original_max_positions > 0 && positive(y.beta_fast) &&
              positive(y.beta_slow) && std::isfinite(y.mscale) && std::isfinite(y.mscale_all_dim) &&
              (!y.attention_factor || positive(*y.attention_factor));
      may_throw_derived = !y.attention_factor;
      low = 1.0L / static_cast<long double>(y.factor);
      high = 1.0L;
      break;
    }
    case 5: {
      rope::scaling::Llama3 l;
      if (in.flag()) l.factor = field(in);
      if (in.flag()) l.low_freq_factor = field(in);
      if (in.flag()) l.high_freq_factor = field(in);
      if (in.flag()) l.original_max_positions = length_field(in);
      scaling = l;
      valid = valid && positive(l.factor) && positive(l.low_freq_factor) && positive(l.high_freq_factor) &&
              l.original_max_positions > 0;
      if (valid) {
        closed = schedule(base);
        const long double two_pi = 2.0L * 3.141592653589793238462643383279502884L;
        const long double l0 = static_cast<long double>(l.original_max_positions);
        for (auto& v : closed) {
          const long double wavelength = two_pi / v;
          // No blend band unless high_freq_factor > low_freq_factor.
          if (wavelength > l0 / l.low_freq_factor) {
            v /= l.factor;
          } else if (l.high_freq_factor <= l.low_freq_factor || wavelength < l0 / l.high_freq_factor) {
            continue;
          } else {
            const long double smooth = (l0 / wavelength - l.low_freq_factor) /
                                       (static_cast<long double>(l.high_freq_factor) - l.low_freq_factor);
            v = (1 - smooth) * v / l.factor + smooth * v;
          }
        }
      }
      break;
    }
    case 6: {
      rope::scaling::LongRope lr;
      lr.short_factor = factor_vector(in, pairs);
      lr.long_factor = factor_vector(in, pairs);
      lr.original_max_positions = length_field(in);
      lr.max_positions = length_field(in);
      scaling = lr;
      const auto good = [&](const std::vector<double>& v) {
        return v.size() == pairs && std::all_of(v.begin(), v.end(), positive);
      };
      valid = valid && good(lr.short_factor) && good(lr.long_factor) && lr.original_max_positions >= 2 &&
              lr.max_positions > 0;
      if (valid) {
        const auto& ext = seq_len > lr.original_max_positions ? lr.long_factor : lr.short_factor;
        closed = schedule(base);
        for (std::size_t p = 0; p < pairs; ++p) closed[p] /= ext[p];
        const long double l0 = static_cast<long double>(lr.original_max_positions);
        const long double ratio = static_cast<long double>(lr.max_positions) / l0;
        attention = ratio <= 1 ? 1.0 : static_cast<double>(std::sqrt(1 + std::log(ratio) / std::log(l0)));
      }
      break;
    }
    default: {
      rope::scaling::Custom cu;
      cu.inv_freq = factor_vector(in, pairs);
      if (in.u8() % 4 == 0) cu.inv_freq.assign(cu.inv_freq.size(), 0.0);  // zero is allowed
      cu.attention_factor = in.flag() ? field(in) : 1.0;
      scaling = cu;
      valid =
          valid && cu.inv_freq.size() == pairs &&
          std::all_of(cu.inv_freq.begin(), cu.inv_freq.end(), [](double v) { return v >= 0 && std::isfinite(v); }) &&
          positive(cu.attention_factor);
      if (valid) {
        closed.assign(cu.inv_freq.begin(), cu.inv_freq.end());
        attention = cu.attention_factor;
      }
      break;
    }
  }
  const std::string args = "variant=" + std::to_string(scaling.index()) + " rotary_dim=" + std::to_string(rotary_dim) +
                           " base=" + std::to_string(base) + " seq_len=" + std::to_string(seq_len);
  rope::Frequencies f;
  try {
    f = rope::frequencies(rotary_dim, base, scaling, seq_len);
  } catch (const rope::invalid_argument& e) {
    const std::string msg = e.what();
    // Fields valid one by one may still overflow together (a tiny factor
    // divides theta into infinity); frequencies() refuses that result.
    const bool overflow = msg.find("keep every inv_freq finite") != std::string::npos &&
                          (closed.empty() || std::any_of(closed.begin(), closed.end(), [](long double v) {
                             return !(v <= static_cast<long double>(std::numeric_limits<double>::max()));
                           }));
    ROPE_FUZZ_CHECK(!valid || overflow || (may_throw_derived && msg.find("attention factor") != std::string::npos),
                    args + ": " + msg);
    ROPE_FUZZ_CHECK(msg.find("rope::frequencies: ") == 0 && msg.find(", got ") != std::string::npos, msg);
    return;
  }
  ROPE_FUZZ_CHECK(valid, args);
  ROPE_FUZZ_CHECK(f.inv_freq.size() == pairs, args);
  ROPE_FUZZ_CHECK(positive(f.attention_factor), args + " attention_factor=" + std::to_string(f.attention_factor));
  if (scaling.index() != 4) {
    ROPE_FUZZ_CHECK(f.attention_factor == attention || std::fabs(f.attention_factor - attention) <= 0x1p-51 * attention,
                    args + " attention_factor");
  }
  const std::vector<long double> plain_schedule = schedule(base);
  for (std::size_t p = 0; p < pairs; ++p) {
    const double v = f.inv_freq[p];
    ROPE_FUZZ_CHECK(std::isfinite(v) && v >= 0.0, args + " p=" + std::to_string(p));
    if (!closed.empty()) {
      const long double exact = closed[p];
      const double bound = 0x1p-51 * static_cast<double>(exact) + std::numeric_limits<double>::denorm_min();
      ROPE_FUZZ_CHECK(std::fabs(v - static_cast<double>(exact)) <= bound,
                      args + " p=" + std::to_string(p) + " got " + std::to_string(v));
    } else if (scaling.index() == 4) {
      // Between the interpolated and the original frequency (either order).
      const double a = static_cast<double>(plain_schedule[p] * low);
      const double b = static_cast<double>(plain_schedule[p] * high);
      const double lo = std::min(a, b), hi = std::max(a, b);
      const double slack = 0x1p-50 * hi + std::numeric_limits<double>::denorm_min();
      ROPE_FUZZ_CHECK(v >= lo - slack && v <= hi + slack, args + " p=" + std::to_string(p));
    }
  }
}

// One output channel against the reference in double: the same class
// (NaN, +Inf, -Inf or finite) and, when finite, within a few ulps of the
// magnitude |x_a c| + |x_b s| + |x_b c| + |x_a s| of its pair.
template <class T>
bool same_as_reference(T y, double expected, double magnitude) {
  if (std::isnan(expected)) return std::isnan(y);
  if (std::isinf(expected)) return static_cast<double>(y) == expected;
  if (!std::isfinite(y)) return false;
  const double tol = 2.0 * std::numeric_limits<T>::epsilon() * magnitude + 2.0 * std::numeric_limits<T>::denorm_min();
  return std::fabs(static_cast<double>(y) - expected) <= tol;
}

// The SIMD row kernel on a table row against the scalar reference in double:
// a rotary_dim-sized heap vector, so any access past it is an overflow the
// sanitizers report; in place must equal out of place bit for bit.
template <class T, rope::Style S>
void fuzz_kernel_row(Bytes& in) {
  const std::size_t rotary_dim = 2 * (1 + in.u8() % 96);
  const std::size_t positions = 1 + in.u16() % 256;
  const std::size_t m = in.u16() % positions;
  const double base = 1.5 + static_cast<double>(in.u32() % 1000000);
  const rope::Direction dir = in.flag() ? rope::Direction::inverse : rope::Direction::forward;
  std::vector<T> x(rotary_dim);
  for (auto& v : x) v = in.template element<T>();

  const rope::Table<T> table(rope::frequencies(rotary_dim, base), positions);
  const T* cos = table.cos(m);
  const T* sin = table.sin(m);
  std::vector<T> y(rotary_dim);
  rope::rotate<S>(x.data(), y.data(), cos, sin, rotary_dim, dir);
  std::vector<T> z = x;
  rope::rotate<S>(z.data(), z.data(), cos, sin, rotary_dim, dir);

  std::vector<double> xd(x.begin(), x.end()), cd(cos, cos + rotary_dim / 2), sd(sin, sin + rotary_dim / 2);
  std::vector<double> expected(rotary_dim);
  rope::reference::rotate<S>(xd.data(), expected.data(), cd.data(), sd.data(), rotary_dim, dir);
  const std::string where =
      std::string(rope::name(S)) + " " + rope::name(dir) + " T=" + (sizeof(T) == 4 ? "float" : "double") +
      " rotary_dim=" + std::to_string(rotary_dim) + " m=" + std::to_string(m) + " base=" + std::to_string(base);
  for (std::size_t p = 0; p < rotary_dim / 2; ++p) {
    const std::size_t a = rope::first_channel<S>(p, rotary_dim);
    const std::size_t b = rope::second_channel<S>(p, rotary_dim);
    const double magnitude =
        std::fabs(xd[a] * cd[p]) + std::fabs(xd[b] * sd[p]) + std::fabs(xd[b] * cd[p]) + std::fabs(xd[a] * sd[p]);
    ROPE_FUZZ_CHECK(same_as_reference(y[a], expected[a], magnitude), where + " channel " + std::to_string(a));
    ROPE_FUZZ_CHECK(same_as_reference(y[b], expected[b], magnitude), where + " channel " + std::to_string(b));
  }
  ROPE_FUZZ_CHECK(std::memcmp(y.data(), z.data(), rotary_dim * sizeof(T)) == 0, where + " in place");
}

template <class T>
void fuzz_kernel(Bytes& in) {
  if (in.flag()) {
    fuzz_kernel_row<T, rope::Style::rotate_half>(in);
  } else {
    fuzz_kernel_row<T, rope::Style::block_diagonal>(in);
  }
}

// The strides of one view as the tensor API must judge them: sorted by
// stride, each dimension with more than one entry steps past everything the
// smaller ones cover.
bool rows_nested(std::size_t tokens, std::size_t heads, std::size_t head_dim, std::size_t token_stride,
                 std::size_t head_stride) {
  std::size_t counts[2] = {heads, tokens}, strides[2] = {head_stride, token_stride};
  if (heads > 1 && tokens > 1 && token_stride < head_stride) {
    std::swap(counts[0], counts[1]);
    std::swap(strides[0], strides[1]);
  }
  std::size_t covered = head_dim;
  for (int d = 0; d < 2; ++d) {
    if (counts[d] <= 1) continue;
    if (strides[d] < covered) return false;
    covered += strides[d] * (counts[d] - 1);
  }
  return true;
}

template <class T>
struct Buffer {
  std::vector<T> data;  // exactly the view's span: a stray access is an overflow
  std::vector<T> before;
  bool null = false;
  T* ptr() { return null ? nullptr : data.data(); }
};

template <class T>
Buffer<T> make_buffer(Bytes& in, std::size_t span) {
  Buffer<T> b;
  b.null = in.u8() % 32 == 0;
  b.data.resize(std::max<std::size_t>(span, 1));
  std::uint32_t state = in.u8() * 2654435761u + 1;
  for (std::size_t i = 0; i < b.data.size(); ++i) {
    if (i < 8) {
      b.data[i] = in.template element<T>();
    } else {
      state = state * 1664525u + 1013904223u;
      b.data[i] = static_cast<T>(static_cast<std::int32_t>(state >> 8) / double(1 << 22));
    }
  }
  b.before = b.data;
  return b;
}

std::size_t span_of(std::size_t tokens, std::size_t heads, std::size_t head_dim, std::size_t ts, std::size_t hs) {
  if (tokens == 0 || heads == 0) return 0;
  return (tokens - 1) * ts + (heads - 1) * hs + head_dim;
}

// The output of one view after a successful call: rotated channels equal the
// reference in double on the table's rows, pass-through channels hold x's bits,
// every other element of the buffer is as before.
template <class T, rope::Style S>
void check_rotated(const rope::Table<T>& table, const std::vector<T>& x, const std::vector<T>& before,
                   const std::vector<T>& y, std::size_t tokens, std::size_t heads, std::size_t head_dim, std::size_t ts,
                   std::size_t hs, std::size_t rotary_dim, const std::vector<std::int64_t>& pos, rope::Direction dir,
                   const std::string& where) {
  std::vector<char> role(y.size(), 0);
  const std::size_t pairs = rotary_dim / 2;
  std::vector<double> xd(rotary_dim), cd(pairs), sd(pairs), expected(rotary_dim);
  for (std::size_t t = 0; t < tokens; ++t) {
    const auto m = static_cast<std::size_t>(pos[t]);
    for (std::size_t p = 0; p < pairs; ++p) {
      cd[p] = table.cos(m)[p];
      sd[p] = table.sin(m)[p];
    }
    for (std::size_t h = 0; h < heads; ++h) {
      const std::size_t o = t * ts + h * hs;
      for (std::size_t i = 0; i < rotary_dim; ++i) xd[i] = x[o + i];
      rope::reference::rotate<S>(xd.data(), expected.data(), cd.data(), sd.data(), rotary_dim, dir);
      for (std::size_t p = 0; p < pairs; ++p) {
        const std::size_t a = rope::first_channel<S>(p, rotary_dim), b = rope::second_channel<S>(p, rotary_dim);
        const double mag =
            std::fabs(xd[a] * cd[p]) + std::fabs(xd[b] * sd[p]) + std::fabs(xd[b] * cd[p]) + std::fabs(xd[a] * sd[p]);
        ROPE_FUZZ_CHECK(same_as_reference(y[o + a], expected[a], mag), where + " t=" + std::to_string(t));
        ROPE_FUZZ_CHECK(same_as_reference(y[o + b], expected[b], mag), where + " t=" + std::to_string(t));
      }
      for (std::size_t i = 0; i < head_dim; ++i) role[o + i] = i < rotary_dim ? 1 : 2;
    }
  }
  for (std::size_t i = 0; i < y.size(); ++i) {
    if (role[i] == 1) continue;
    const T& want = role[i] == 2 ? x[i] : before[i];
    ROPE_FUZZ_CHECK(std::memcmp(&y[i], &want, sizeof(T)) == 0, where + " untouched element " + std::to_string(i));
  }
}

// rope::apply and rope::apply_qk on small tensors with arbitrary shapes,
// strides, options and positions: they throw std::invalid_argument or
// std::out_of_range exactly when an argument is invalid (judged here
// independently), and then every buffer is byte for byte unchanged;
// otherwise every output equals the reference.
template <class T, rope::Style S>
void fuzz_apply_typed(Bytes& in) {
  const std::size_t table_rd = 2 * (1 + in.u8() % 24);
  const std::size_t table_positions = 1 + in.u8() % 64;
  const rope::Table<T> table(rope::frequencies(table_rd, 10000.0), table_positions);
  const std::uint8_t mode = in.u8() % 5;  // apply in place, out of place, by offset, apply_qk, qk out of place
  const std::size_t tokens = in.u8() % 5;
  const std::size_t heads = in.u8() % 4;
  const std::size_t head_dim = in.u8() % 40;
  // Strides: mostly a real layout (token- or head-major, a little padding),
  // sometimes anything, so both accepted and rejected shapes are explored.
  const auto strides = [&](std::size_t h, std::size_t& t_stride, std::size_t& h_stride) {
    const std::uint8_t kind = in.u8();
    const std::size_t pad = kind >> 5;
    if (kind % 4 == 0) {
      t_stride = in.u8() % 128;
      h_stride = in.u8() % 64;
    } else if (kind % 4 == 3) {
      t_stride = head_dim + pad;
      h_stride = tokens * t_stride + (kind >> 2) % 8;
    } else {
      h_stride = head_dim + pad;
      t_stride = h * h_stride + (kind >> 2) % 8;
    }
  };
  std::size_t ts = 0, hs = 0, k_ts = 0, k_hs = 0;
  strides(heads, ts, hs);
  const std::size_t k_heads = in.u8() % 4;
  strides(k_heads, k_ts, k_hs);
  rope::Options options;
  options.rotary_dim = in.flag() ? 0 : in.u8() % 50;
  options.direction = in.flag() ? rope::Direction::inverse : rope::Direction::forward;
  options.threads = in.u8() % 4;
  const bool null_positions = in.u8() % 32 == 0;
  std::vector<std::int64_t> pos(std::max<std::size_t>(tokens, 1));
  for (auto& m : pos) {
    m = in.u8() % 16 == 0 ? static_cast<std::int64_t>(in.u64()) : static_cast<std::int64_t>(in.u8() % table_positions);
  }
  const std::int64_t offset =
      in.u8() % 16 == 0 ? static_cast<std::int64_t>(in.u64()) : static_cast<std::int64_t>(in.u8() % table_positions);

  const bool qk = mode >= 3;
  const bool out_of_place = mode == 1 || mode == 4;
  const bool by_offset = mode == 2;
  Buffer<T> x = make_buffer<T>(in, span_of(tokens, heads, head_dim, ts, hs));
  Buffer<T> out = make_buffer<T>(in, span_of(tokens, heads, head_dim, ts, hs));
  Buffer<T> k = make_buffer<T>(in, span_of(tokens, k_heads, head_dim, k_ts, k_hs));
  Buffer<T> k_out = make_buffer<T>(in, span_of(tokens, k_heads, head_dim, k_ts, k_hs));

  // What the documentation makes valid, decided here.
  const std::size_t r = options.rotary_dim == 0 ? table_rd : options.rotary_dim;
  const auto view_ok = [&](const Buffer<T>& b, std::size_t h, std::size_t t_stride, std::size_t h_stride) {
    return !b.null && head_dim > 0 && r <= head_dim && rows_nested(tokens, h, head_dim, t_stride, h_stride);
  };
  bool valid = r % 2 == 0 && r <= table_rd && options.threads >= 1 && view_ok(x, heads, ts, hs);
  if (out_of_place) valid = valid && view_ok(out, heads, ts, hs);
  if (qk) {
    valid = valid && view_ok(k, k_heads, k_ts, k_hs) && k_heads > 0 && heads % k_heads == 0;
    if (out_of_place) valid = valid && view_ok(k_out, k_heads, k_ts, k_hs);
  }
  bool positions_ok = true;
  if (by_offset) {
    positions_ok = tokens == 0 || (offset >= 0 && static_cast<std::uint64_t>(offset) + tokens - 1 < table_positions);
  } else {
    positions_ok = !null_positions;
    for (std::size_t t = 0; t < tokens; ++t) {
      positions_ok = positions_ok && pos[t] >= 0 && static_cast<std::uint64_t>(pos[t]) < table_positions;
    }
  }
  valid = valid && positions_ok;

  const rope::View<T> xv(x.ptr(), tokens, heads, head_dim, ts, hs);
  const rope::View<T> ov(out.ptr(), tokens, heads, head_dim, ts, hs);
  const rope::View<T> kv(k.ptr(), tokens, k_heads, head_dim, k_ts, k_hs);
  const rope::View<T> kov(k_out.ptr(), tokens, k_heads, head_dim, k_ts, k_hs);
  const std::int64_t* ids = null_positions ? nullptr : pos.data();
  const std::string where = std::string(rope::name(S)) + " mode=" + std::to_string(mode) +
                            " tokens=" + std::to_string(tokens) + " heads=" + std::to_string(heads) + "/" +
                            std::to_string(k_heads) + " head_dim=" + std::to_string(head_dim) +
                            " strides=" + std::to_string(ts) + "," + std::to_string(hs) + " r=" + std::to_string(r) +
                            " threads=" + std::to_string(options.threads);
  bool threw = false;
  try {
    switch (mode) {
      case 0: rope::apply(xv, table, S, ids, options); break;
      case 1: rope::apply<T>(rope::View<const T>(xv), ov, table, S, ids, options); break;
      case 2: rope::apply(xv, table, S, offset, options); break;
      case 3: rope::apply_qk(xv, kv, table, S, ids, options); break;
      default:
        rope::apply_qk<T>(rope::View<const T>(xv), rope::View<const T>(kv), ov, kov, table, S, ids, options);
        break;
    }
  } catch (const rope::invalid_argument& e) {
    threw = true;
    ROPE_FUZZ_CHECK(!valid, where + ": " + e.what());
    ROPE_FUZZ_CHECK(std::string(e.what()).find("rope::apply") == 0, e.what());
  } catch (const rope::out_of_range& e) {
    threw = true;
    ROPE_FUZZ_CHECK(!valid && !positions_ok, where + ": " + e.what());
    ROPE_FUZZ_CHECK(std::string(e.what()).find("position") != std::string::npos, e.what());
  }
  if (threw) {
    for (const Buffer<T>* b : {&x, &out, &k, &k_out}) {
      ROPE_FUZZ_CHECK(std::memcmp(b->data.data(), b->before.data(), b->data.size() * sizeof(T)) == 0,
                      where + ": a rejected call wrote");
    }
    return;
  }
  ROPE_FUZZ_CHECK(valid, where + ": an invalid call was accepted");
  if (by_offset) {
    for (std::size_t t = 0; t < tokens; ++t) pos[t] = offset + static_cast<std::int64_t>(t);
  }
  const auto& qy = out_of_place ? out.data : x.data;
  check_rotated<T, S>(table, x.before, out_of_place ? out.before : x.before, qy, tokens, heads, head_dim, ts, hs, r,
                      pos, options.direction, where + " q");
  if (qk) {
    const auto& ky = out_of_place ? k_out.data : k.data;
    check_rotated<T, S>(table, k.before, out_of_place ? k_out.before : k.before, ky, tokens, k_heads, head_dim, k_ts,
                        k_hs, r, pos, options.direction, where + " k");
  }
  if (out_of_place) {
    ROPE_FUZZ_CHECK(std::memcmp(x.data.data(), x.before.data(), x.data.size() * sizeof(T)) == 0, where + " input");
    ROPE_FUZZ_CHECK(std::memcmp(k.data.data(), k.before.data(), k.data.size() * sizeof(T)) == 0, where + " input");
  }
}

template <class T>
void fuzz_apply(Bytes& in) {
  if (in.flag()) {
    fuzz_apply_typed<T, rope::Style::rotate_half>(in);
  } else {
    fuzz_apply_typed<T, rope::Style::block_diagonal>(in);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Bytes in(data, size);
  // A first byte below 192 keeps the meaning the corpus was written with
  // (selector byte % 12: 0 .. 7, then 8 .. 11 the serving path's; every seed
  // of those starts with a byte below 192); 192 .. 255 pick the serving
  // path's later entry points: MLA, sparse lists and trees, shift.
  const std::uint8_t selector = in.u8();
  if (selector >= 192) {
    switch ((selector - 192) % 3) {
      case 0: rope_fuzz::fuzz_mla(in); break;
      case 1: rope_fuzz::fuzz_lists(in); break;
      default: rope_fuzz::fuzz_shift(in); break;
    }
    return 0;
  }
  switch (selector % 12) {
    case 0: fuzz_frequencies(in); break;
    case 1: fuzz_scaling(in); break;
    case 2: fuzz_kernel<float>(in); break;
    case 3: fuzz_kernel<double>(in); break;
    case 4: fuzz_apply<float>(in); break;
    case 5: fuzz_apply<double>(in); break;
    case 6: rope_fuzz::fuzz_softmax(in); break;
    case 7: rope_fuzz::fuzz_linear(in); break;
    case 8: rope_fuzz::fuzz_attend(in); break;
    case 9: rope_fuzz::fuzz_append_kv(in); break;
    case 10: rope_fuzz::fuzz_append(in); break;
    case 11: rope_fuzz::fuzz_merge(in); break;
  }
  return 0;
}
