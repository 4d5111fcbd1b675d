// rope/frequencies.hpp — the rotation frequencies theta_p of each pair, and
// the scaling variants that long-context checkpoints apply to them.
//
//   theta_p = inv_freq[p] = base^(-2p / r),   p = 0 .. r/2 - 1,  r = rotary_dim
//
// Pair p of a token at position m is rotated by m * theta_p; a scaling variant
// replaces theta_p (and may set an attention factor that multiplies every cos
// and sin). Everything here is double precision, evaluated in long double and
// rounded once: tables and on-the-fly angles round to the tensor's type only
// after the angle and its cos/sin are computed. docs/scaling.md says which
// variant each checkpoint family uses and how `rope_scaling` keys map to the
// fields below.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "detail/fail.hpp"

namespace rope {

struct Frequencies {
  std::vector<double> inv_freq;   // rotary_dim/2 values, theta_p
  double attention_factor = 1.0;  // multiplies cos and sin in every table and angle

  std::size_t rotary_dim() const noexcept { return 2 * inv_freq.size(); }
};

// The variants. Fields without a usable default (a factor, a length) start at
// 0, which the checks reject, so a forgotten field throws instead of silently
// meaning something. L0 below is original_max_positions.
namespace scaling {

// The plain schedule.
struct None {};

// Position interpolation: theta_p / factor.
struct Linear {
  double factor = 0.0;
};

// Static NTK-aware: base' = base * factor^(r/(r-2)).
struct Ntk {
  double factor = 0.0;
};

// Dynamic NTK: with L = max(seq_len, L0),
// base' = base * (factor*L/L0 - (factor-1))^(r/(r-2)); the plain schedule
// (bit for bit) whenever seq_len <= L0.
struct DynamicNtk {
  double factor = 0.0;
  std::size_t original_max_positions = 0;
};

// YaRN: a ramp between interpolated (theta_p/factor) and original theta_p
// over the pairs whose wavelength lies between L0/beta_fast and L0/beta_slow,
// and attention factor
//   attention_factor                               when given, else
//   g(factor, mscale) / g(factor, mscale_all_dim)  when both are nonzero, else
//   g(factor, 1),
// g(s, m) = 1 if s <= 1 else 0.1*m*ln(s) + 1. "Both nonzero" is the
// reference's test `if mscale and mscale_all_dim`: a config key that is
// absent counts as 0 there, so a config with mscale_all_dim alone gets
// g(factor, 1), not g(factor, 1) / g(factor, mscale_all_dim) (rope::hf sets
// mscale = 0 when the key is absent). truncate = false keeps the ramp's ends
// fractional (gpt-oss) instead of flooring/ceiling them.
struct Yarn {
  double factor = 0.0;
  std::size_t original_max_positions = 0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 1.0;
  double mscale_all_dim = 0.0;
  std::optional<double> attention_factor;
  bool truncate = true;
};

// Llama 3: wavelengths below L0/high_freq_factor keep theta_p, those above
// L0/low_freq_factor get theta_p/factor, and the band between is a linear
// blend in L0/wavelength. With high_freq_factor <= low_freq_factor there is
// no band (the reference accepts such configs with a warning): theta_p/factor
// above L0/low_freq_factor, theta_p elsewhere.
struct Llama3 {
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  std::size_t original_max_positions = 8192;
};

// LongRoPE (Phi-3): theta_p = 1/(ext_p * base^(2p/r)), ext = long_factor when
// seq_len > L0 else short_factor; attention factor attention_factor when
// given, else sqrt(1 + ln(s)/ln(L0)) when s > 1 and 1 otherwise, with
// s = factor when given, else max_positions/L0 (Phi-3's configs give no
// factor: s is the ratio of the two lengths).
struct LongRope {
  std::vector<double> short_factor, long_factor;  // r/2 values each
  std::size_t original_max_positions = 0;
  std::size_t max_positions = 0;  // read only when factor is not given
  // Default member initialisers keep LongRope{short, long, L0, max} free of
  // -Wmissing-field-initializers, as before these two fields existed.
  std::optional<double> factor = std::nullopt;
  std::optional<double> attention_factor = std::nullopt;
};

// Proportional (Gemma 4's global layers): the full-head schedule
// theta_p = base^(-2p/r) / factor for the first floor(partial_rotary_factor *
// r / 2) pairs and theta_p = 0 (no rotation) for the rest, r = rotary_dim =
// the whole head. Unlike a partial rotary_dim, the pairs that rotate keep
// the exponent of the full head and, with rotate_half, pair channel p with
// p + r/2 of the whole head.
struct Proportional {
  double partial_rotary_factor = 1.0;  // in [0, 1]
  double factor = 1.0;
};

// Anything else: theta_p given directly.
struct Custom {
  std::vector<double> inv_freq;  // r/2 values
  double attention_factor = 1.0;
};

}  // namespace scaling

using Scaling = std::variant<scaling::None, scaling::Linear, scaling::Ntk, scaling::DynamicNtk, scaling::Yarn,
                             scaling::Llama3, scaling::LongRope, scaling::Custom, scaling::Proportional>;

namespace detail {

[[noreturn]] inline void invalid(const Piece& field, const Piece& requirement, const Piece& value) {
  fail("rope::frequencies", field, requirement, value);
}

inline void check_rotary_dim(std::size_t rotary_dim) {
  if (rotary_dim == 0 || rotary_dim % 2 != 0) invalid("rotary_dim", "even and positive", rotary_dim);
}

inline void check_base(double base) {
  if (!(base > 1.0) || !std::isfinite(base)) invalid("base", "finite and > 1", base);
}

inline void check_positive(const char* field, double v) {
  if (!(v > 0.0) || !std::isfinite(v)) invalid(field, "finite and > 0", v);
}

inline void check_finite(const char* field, double v) {
  if (!std::isfinite(v)) invalid(field, "finite", v);
}

inline void check_positive(const char* field, std::size_t v) {
  if (v == 0) invalid(field, "> 0", v);
}

inline void check_factors(const char* field, const std::vector<double>& f, std::size_t rotary_dim) {
  if (f.size() != rotary_dim / 2) {
    fail("rope::frequencies", {field, ".size()"}, {"rotary_dim/2 = ", rotary_dim / 2}, f.size());
  }
  for (std::size_t i = 0; i < f.size(); ++i) {
    if (!(f[i] > 0.0) || !std::isfinite(f[i])) fail("rope::frequencies", {field, "[", i, "]"}, "finite and > 0", f[i]);
  }
}

// theta_p = base^(-2p/r) in long double. The exponent -2p/r is not a double
// in general, and pow magnifies its rounding by ln(base) (~9 for 10^4): in
// double that costs up to 2 ulps; in long double (x86-64) it is ~2^-60.
inline std::vector<long double> schedule(std::size_t rotary_dim, long double base) {
  std::vector<long double> inv_freq(rotary_dim / 2);
  for (std::size_t p = 0; p < inv_freq.size(); ++p) {
    const long double exponent = -2.0L * static_cast<long double>(p) / static_cast<long double>(rotary_dim);
    inv_freq[p] = std::pow(base, exponent);
  }
  return inv_freq;
}

// Rounds the long double schedule once to double. A divisor that is valid
// alone can still overflow a theta (a factor of 1e-310 divides theta_0 = 1
// into infinity): no table may see that, so the field that divided is named.
inline std::vector<double> round_once(const std::vector<long double>& v, const char* divisor_field = nullptr,
                                      double divisor = 0.0) {
  std::vector<double> out(v.begin(), v.end());
  for (std::size_t p = 0; p < out.size(); ++p) {
    if (!std::isfinite(out[p])) {
      fail("rope::frequencies", divisor_field ? divisor_field : "scaling",
           {"large enough to keep every inv_freq finite (inv_freq[", p, "] = ", out[p], ")"}, divisor);
    }
  }
  return out;
}

constexpr long double kTwoPi = 2.0L * 3.141592653589793238462643383279502884L;

// The arguments every variant shares.
struct Schedule {
  std::size_t rotary_dim;
  double base;
  std::size_t seq_len;
};

inline Frequencies scale(const scaling::None&, const Schedule& c) {
  return Frequencies{round_once(schedule(c.rotary_dim, c.base)), 1.0};
}

inline Frequencies scale(const scaling::Linear& s, const Schedule& c) {
  check_positive("scaling::Linear::factor", s.factor);
  auto inv = schedule(c.rotary_dim, c.base);
  for (auto& v : inv) v /= static_cast<long double>(s.factor);
  return Frequencies{round_once(inv, "scaling::Linear::factor", s.factor), 1.0};
}

// NTK stretches the base by a power r/(r-2), which needs r > 2.
inline Frequencies ntk_base(const char* variant, std::size_t rotary_dim, long double base, long double stretch) {
  if (rotary_dim <= 2) {
    fail("rope::frequencies", {"rotary_dim (with ", variant, ")"}, "> 2 (the exponent is r/(r-2))", rotary_dim);
  }
  const long double r = static_cast<long double>(rotary_dim);
  const long double scaled = base * std::pow(stretch, r / (r - 2.0L));
  return Frequencies{round_once(schedule(rotary_dim, scaled)), 1.0};
}

inline Frequencies scale(const scaling::Ntk& s, const Schedule& c) {
  check_positive("scaling::Ntk::factor", s.factor);
  return ntk_base("scaling::Ntk", c.rotary_dim, c.base, s.factor);
}

inline Frequencies scale(const scaling::DynamicNtk& s, const Schedule& c) {
  check_positive("scaling::DynamicNtk::factor", s.factor);
  check_positive("scaling::DynamicNtk::original_max_positions", s.original_max_positions);
  // At or below L0 the stretch is exactly 1; the plain schedule avoids a
  // stretch of 1 - ulp (a base below `base`) from rounding.
  const long double ratio = static_cast<long double>(c.seq_len) / static_cast<long double>(s.original_max_positions);
  const long double stretch = c.seq_len <= s.original_max_positions ? 1.0L : 1.0L + s.factor * (ratio - 1.0L);
  if (c.rotary_dim > 2 && stretch == 1.0L) return scale(scaling::None{}, c);
  // factor*ratio - (factor-1) = 1 + factor*(ratio-1) > 1 for ratio > 1.
  return ntk_base("scaling::DynamicNtk", c.rotary_dim, c.base, stretch);
}

// g(s, m) = 1 if s <= 1 else 0.1 m ln(s) + 1: YaRN's attention temperature
// (the reference's get_mscale); rope::hf reads DeepSeek's softmax scale
// g(factor, mscale_all_dim)^2 from it too, so the formula is written once.
inline long double yarn_g(long double s, long double m) { return s <= 1.0L ? 1.0L : 0.1L * m * std::log(s) + 1.0L; }

inline Frequencies scale(const scaling::Yarn& s, const Schedule& c) {
  check_positive("scaling::Yarn::factor", s.factor);
  check_positive("scaling::Yarn::original_max_positions", s.original_max_positions);
  check_positive("scaling::Yarn::beta_fast", s.beta_fast);
  check_positive("scaling::Yarn::beta_slow", s.beta_slow);
  check_finite("scaling::Yarn::mscale", s.mscale);
  check_finite("scaling::Yarn::mscale_all_dim", s.mscale_all_dim);
  if (s.attention_factor) check_positive("scaling::Yarn::attention_factor", *s.attention_factor);

  const long double r = static_cast<long double>(c.rotary_dim);
  const long double l0 = static_cast<long double>(s.original_max_positions);
  // The (fractional) pair index whose wavelength 2*pi/theta_p is L0/n:
  // pairs below it turn more than n times over the original length.
  const auto correction = [&](long double n) {
    return r * std::log(l0 / (kTwoPi * n)) / (2.0L * std::log(static_cast<long double>(c.base)));
  };
  long double lo = correction(s.beta_fast);
  long double hi = correction(s.beta_slow);
  if (s.truncate) {
    lo = std::floor(lo);
    hi = std::ceil(hi);
  }
  lo = std::max(lo, 0.0L);
  hi = std::min(hi, r - 1.0L);
  if (lo == hi) hi += 0.001L;  // keeps the ramp finite

  const long double factor = s.factor;
  auto inv = schedule(c.rotary_dim, c.base);
  for (std::size_t p = 0; p < inv.size(); ++p) {
    const long double ramp = std::clamp((static_cast<long double>(p) - lo) / (hi - lo), 0.0L, 1.0L);
    const long double extrapolation = 1.0L - ramp;
    inv[p] = (inv[p] / factor) * (1.0L - extrapolation) + inv[p] * extrapolation;
  }

  double attention = 1.0;
  if (s.attention_factor) {
    attention = *s.attention_factor;
  } else if (s.mscale != 0.0 && s.mscale_all_dim != 0.0) {
    attention = static_cast<double>(yarn_g(factor, s.mscale) / yarn_g(factor, s.mscale_all_dim));
  } else {
    attention = static_cast<double>(yarn_g(factor, 1.0L));
  }
  if (!(attention > 0.0) || !std::isfinite(attention)) {
    invalid("scaling::Yarn::mscale (the attention factor g(factor, mscale) / g(factor, mscale_all_dim))",
            "a value that keeps the attention factor finite and > 0", s.mscale);
  }
  return Frequencies{round_once(inv, "scaling::Yarn::factor", s.factor), attention};
}

inline Frequencies scale(const scaling::Llama3& s, const Schedule& c) {
  check_positive("scaling::Llama3::factor", s.factor);
  check_positive("scaling::Llama3::low_freq_factor", s.low_freq_factor);
  check_positive("scaling::Llama3::high_freq_factor", s.high_freq_factor);
  check_positive("scaling::Llama3::original_max_positions", s.original_max_positions);
  const bool band = s.high_freq_factor > s.low_freq_factor;
  const long double factor = s.factor;
  const long double low = s.low_freq_factor;
  const long double high = s.high_freq_factor;
  const long double l0 = static_cast<long double>(s.original_max_positions);
  auto inv = schedule(c.rotary_dim, c.base);
  for (auto& v : inv) {
    const long double wavelength = kTwoPi / v;
    if (wavelength > l0 / low) {
      v /= factor;
    } else if (!band || wavelength < l0 / high) {
      continue;
    } else {
      const long double smooth = (l0 / wavelength - low) / (high - low);
      v = (1.0L - smooth) * v / factor + smooth * v;
    }
  }
  return Frequencies{round_once(inv, "scaling::Llama3::factor", s.factor), 1.0};
}

inline Frequencies scale(const scaling::LongRope& s, const Schedule& c) {
  check_factors("scaling::LongRope::short_factor", s.short_factor, c.rotary_dim);
  check_factors("scaling::LongRope::long_factor", s.long_factor, c.rotary_dim);
  // ln(L0) divides the attention factor: L0 = 1 would make it infinite.
  if (s.original_max_positions < 2) {
    invalid("scaling::LongRope::original_max_positions", ">= 2", s.original_max_positions);
  }
  if (s.factor) {
    check_positive("scaling::LongRope::factor", *s.factor);
  } else {
    check_positive("scaling::LongRope::max_positions", s.max_positions);
  }
  if (s.attention_factor) check_positive("scaling::LongRope::attention_factor", *s.attention_factor);
  const bool long_context = c.seq_len > s.original_max_positions;
  const auto& ext = long_context ? s.long_factor : s.short_factor;
  auto inv = schedule(c.rotary_dim, c.base);
  for (std::size_t p = 0; p < inv.size(); ++p) {
    inv[p] /= static_cast<long double>(ext[p]);  // 1/(ext_p * base^(2p/r))
  }
  const long double l0 = static_cast<long double>(s.original_max_positions);
  const long double ratio =
      s.factor ? static_cast<long double>(*s.factor) : static_cast<long double>(s.max_positions) / l0;
  const long double attention = s.attention_factor ? static_cast<long double>(*s.attention_factor)
                                : ratio <= 1.0L    ? 1.0L
                                                   : std::sqrt(1.0L + std::log(ratio) / std::log(l0));
  const char* field = long_context ? "scaling::LongRope::long_factor" : "scaling::LongRope::short_factor";
  const auto smallest = *std::min_element(ext.begin(), ext.end());
  return Frequencies{round_once(inv, field, smallest), static_cast<double>(attention)};
}

inline Frequencies scale(const scaling::Proportional& s, const Schedule& c) {
  const double prf = s.partial_rotary_factor;
  if (!(prf >= 0.0 && prf <= 1.0)) invalid("scaling::Proportional::partial_rotary_factor", "in [0, 1]", prf);
  check_positive("scaling::Proportional::factor", s.factor);
  // floor(prf * r / 2) with the product rounded to double first, as the
  // reference's int(prf * head_dim // 2) does: 0.3 * 10 is 3.0000000000000004,
  // not 3, and must floor the same way here.
  const double product = prf * static_cast<double>(c.rotary_dim);
  const auto rotating = static_cast<std::size_t>(std::floor(product / 2.0));
  auto inv = schedule(c.rotary_dim, c.base);
  for (std::size_t p = 0; p < inv.size(); ++p) {
    inv[p] = p < rotating ? inv[p] / static_cast<long double>(s.factor) : 0.0L;
  }
  return Frequencies{round_once(inv, "scaling::Proportional::factor", s.factor), 1.0};
}

inline Frequencies scale(const scaling::Custom& s, const Schedule& c) {
  if (s.inv_freq.size() != c.rotary_dim / 2) {
    fail("rope::frequencies", "scaling::Custom::inv_freq.size()", {"rotary_dim/2 = ", c.rotary_dim / 2},
         s.inv_freq.size());
  }
  for (std::size_t i = 0; i < s.inv_freq.size(); ++i) {
    if (!(s.inv_freq[i] >= 0.0) || !std::isfinite(s.inv_freq[i])) {
      fail("rope::frequencies", {"scaling::Custom::inv_freq[", i, "]"}, "finite and >= 0", s.inv_freq[i]);
    }
  }
  check_positive("scaling::Custom::attention_factor", s.attention_factor);
  return Frequencies{s.inv_freq, s.attention_factor};
}

// The variant's own scale(): by index rather than std::visit, whose
// machinery every includer of this header would otherwise compile.
template <std::size_t I = 0>
Frequencies scale_any(const Scaling& scaling, const Schedule& c) {
  if constexpr (I + 1 < std::variant_size<Scaling>::value) {
    if (scaling.index() != I) return scale_any<I + 1>(scaling, c);
  }
  return scale(*std::get_if<I>(&scaling), c);
}

}  // namespace detail

// theta_p for rotary_dim channels under `scaling`. seq_len is the number of
// positions about to be used (the current sequence length): only DynamicNtk
// and LongRope read it. Throws rope::invalid_argument naming the field and
// its value for an odd or zero rotary_dim, base <= 1, a factor <= 0, a length
// of 0, a factor vector of the wrong length, or a factor so small that a
// theta overflows.
inline Frequencies frequencies(std::size_t rotary_dim, double base = 10000.0, const Scaling& scaling = {},
                               std::size_t seq_len = 0) {
  detail::check_rotary_dim(rotary_dim);
  detail::check_base(base);
  const detail::Schedule schedule{rotary_dim, base, seq_len};
  return detail::scale_any(scaling, schedule);
}

// Frequencies for 2-D axial RoPE (image patches, rope/multi_axis.hpp): the
// first rotary_dim/4 pairs follow the row, the last rotary_dim/4 the column,
// each with the schedule of a rotary_dim/2-channel RoPE:
// theta_p = base^(-2p / (rotary_dim/2)).
inline Frequencies axial_frequencies(std::size_t rotary_dim, double base = 10000.0) {
  if (rotary_dim == 0 || rotary_dim % 4 != 0) {
    detail::fail("rope::axial_frequencies", "rotary_dim", "a positive multiple of 4", rotary_dim);
  }
  Frequencies half = frequencies(rotary_dim / 2, base);
  Frequencies f;
  f.inv_freq = half.inv_freq;
  f.inv_freq.insert(f.inv_freq.end(), half.inv_freq.begin(), half.inv_freq.end());
  f.attention_factor = half.attention_factor;
  return f;
}

}  // namespace rope
