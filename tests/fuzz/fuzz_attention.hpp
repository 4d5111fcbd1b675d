// What the attention decoders share (fuzz_attention.cpp, fuzz_append.cpp,
// fuzz_serving.cpp): the draws of inputs, threads, logits, paged pools,
// shapes and batches (tree verify's depths and masks too), plan()'s checks
// replicated (judge) and what an accepted plan must hold, the long-double
// softmax oracle with its forward error bound and its check of an attended
// token, the float RMSNorm of the documented order, and the byte
// comparisons every refused call is held to. Built only with
// rope::attention (ROPE_FUZZ_ATTENTION).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <rope/attention.hpp>

#include "fuzz_support.hpp"

namespace rope_fuzz {

using LD = long double;
namespace ra = rope::attention;

constexpr LD kNegInf = -std::numeric_limits<LD>::infinity();

// An attention input: mostly in [-2, 2], sometimes NaN or infinite.
template <class T>
T attention_element(Bytes& in) {
  const std::uint8_t kind = in.u8();
  if (kind == 255) return std::numeric_limits<T>::quiet_NaN();
  if (kind == 254) return std::numeric_limits<T>::infinity();
  return static_cast<T>((static_cast<int>(kind) - 127) / 64.0);
}

template <class T>
std::vector<T> elements(Bytes& in, std::size_t n) {
  std::vector<T> v(std::max<std::size_t>(n, 1));
  for (auto& x : v) x = attention_element<T>(in);
  return v;
}

template <class T>
T from_float(float x) {
  if constexpr (std::is_same<T, float>::value) {
    return x;
  } else {
    return T(x);
  }
}

template <class T>
LD widen(T x) {
  if constexpr (std::is_same<T, double>::value) {
    return x;
  } else {
    return rope::detail::widen_value(x);
  }
}

// Rows of float, bf16 or f16 values drawn as floats (at least one element,
// so that every buffer has an address).
template <class T>
std::vector<T> rows_of(Bytes& in, std::size_t n) {
  std::vector<T> v(std::max<std::size_t>(n, 1));
  for (auto& x : v) x = from_float<T>(attention_element<float>(in));
  return v;
}

// An array of exactly n elements on the heap (n may be 0: a unique pointer
// all the same), so that a read past what a call may read is an overflow
// the sanitizers see.
template <class T>
struct Exact {
  explicit Exact(std::size_t count = 0) : p(new T[count]()), n(count) {}
  T* data() const { return p.get(); }
  T& operator[](std::size_t i) const { return p[i]; }
  std::unique_ptr<T[]> p;
  std::size_t n;
};

template <class T>
bool same_bytes(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}
template <class T>
bool same_bytes(const Exact<T>& a, const std::vector<T>& b) {
  return a.n == b.size() && (a.n == 0 || std::memcmp(a.data(), b.data(), a.n * sizeof(T)) == 0);
}
template <class T>
std::vector<T> copy_of(const Exact<T>& a) {
  return std::vector<T>(a.data(), a.data() + a.n);
}

// Whether a refusal names the function it came from, as documented.
template <class E>
bool named(const E& e, const char* fn) {
  return e.function() == fn && std::string(e.what()).find(std::string(fn) + ": ") == 0;
}

// Rotation of a long-double vector from the table's own cos/sin rows, pair
// p at position position_of(p): the oracle rotates exactly what the library
// was given.
template <class T, class PairPosition>
std::vector<LD> rotate_pairs(const std::vector<LD>& x, const rope::Table<T>& table, rope::Style style, std::size_t r,
                             PairPosition position_of) {
  std::vector<LD> y = x;
  for (std::size_t p = 0; p < r / 2; ++p) {
    const std::size_t a = style == rope::Style::rotate_half ? p : 2 * p;
    const std::size_t b = style == rope::Style::rotate_half ? p + r / 2 : 2 * p + 1;
    const auto m = static_cast<std::size_t>(position_of(p));
    const LD c = table.cos(m)[p], s = table.sin(m)[p];
    y[a] = x[a] * c - x[b] * s;
    y[b] = x[b] * c + x[a] * s;
  }
  return y;
}

template <class T>
std::vector<LD> rotate_ld(const std::vector<LD>& x, const rope::Table<T>& table, rope::Style style, std::size_t r,
                          std::int64_t position) {
  return rotate_pairs(x, table, style, r, [&](std::size_t) { return position; });
}

inline bool finite_all(const std::vector<LD>& x) {
  for (LD v : x) {
    if (!std::isfinite(v)) return false;
  }
  return true;
}

inline LD top_of(const std::vector<LD>& x) {
  LD top = 0;
  for (LD a : x) top = std::max(top, std::fabs(a));
  return top;
}

// |x_c| + |x_partner(c)| for the r channels a rotation of that style mixes
// in pairs, |x_c| for the rest: a bound of the rotated element's magnitude
// and, times a few units of rounding, of its rounding error.
inline std::vector<LD> pair_magnitudes(const std::vector<LD>& x, rope::Style style, std::size_t r) {
  std::vector<LD> m(x.size());
  for (std::size_t c = 0; c < x.size(); ++c) m[c] = std::fabs(x[c]);
  for (std::size_t p = 0; p < r / 2; ++p) {
    const std::size_t a = style == rope::Style::rotate_half ? p : 2 * p;
    const std::size_t b = style == rope::Style::rotate_half ? p + r / 2 : 2 * p + 1;
    m[a] = m[b] = std::fabs(x[a]) + std::fabs(x[b]);
  }
  return m;
}

inline LD dot_magnitude(const std::vector<LD>& a, const std::vector<LD>& b) {
  LD s = 0;
  for (std::size_t c = 0; c < a.size(); ++c) s += a[c] * b[c];
  return s;
}

// The unit roundoff of T: half an ulp of 1.
template <class T>
constexpr LD unit_roundoff() {
  return LD(std::numeric_limits<T>::epsilon()) / 2;
}

// One rounding into an output of O of a value of magnitude at most x: none
// for float and double (the softmax bound covers the arithmetic's own), half
// an ulp of bf16 or f16 (with f16's subnormal step).
template <class O>
LD output_rounding(LD x) {
  if constexpr (std::is_same<O, rope::BFloat16>::value) {
    return std::fabs(x) / 256;
  } else if constexpr (std::is_same<O, rope::Float16>::value) {
    return std::fabs(x) / 2048 + std::ldexp(1.0L, -25);
  } else {
    return 0;
  }
}

template <class E>
constexpr bool is_fp8() {
  return std::is_same<E, rope::Float8E4M3>::value || std::is_same<E, rope::Float8E5M2>::value;
}

// One of the scaled byte cache types drawn, int8 or either fp8 format:
// run(E{}) for it.
template <class Run>
void any_scaled_byte(Bytes& in, Run run) {
  switch (in.u8() % 4) {
    case 0: run(rope::Float8E4M3{}); break;
    case 1: run(rope::Float8E5M2{}); break;
    default: run(std::int8_t{}); break;
  }
}

// The code a scaled byte type gives a row's largest value: int8's 127,
// fp8's largest finite value (docs/attention.md, "fp8 pools").
template <class E>
LD code_max() {
  if constexpr (is_fp8<E>()) {
    return LD(E::max());
  } else {
    return 127;
  }
}

// One fp8 encode of a value of magnitude ax from a row whose largest is top
// (docs/attention.md, "Accuracy of a 16-bit, int8 or fp8 cache"):
// (u + 2^-24 (1 + u)) ax + s h, the scale s = top / max (taken a float
// step up where it must be), u = 2^-4 and h = 2^-10 for E4M3, 2^-3 and
// 2^-17 for E5M2.
template <class E>
LD fp8_rounding(LD ax, LD top) {
  constexpr bool e4m3 = std::is_same<E, rope::Float8E4M3>::value;
  const LD u = std::ldexp(1.0L, e4m3 ? -4 : -3), h = std::ldexp(1.0L, e4m3 ? -10 : -17);
  return (u + std::ldexp(1.0L, -24) * (1 + u)) * ax + top / code_max<E>() * (1 + 1e-6L) * h;
}

// |got - want| within one rounding of a value of type E (int8 and fp8: of
// their vector's scale), want the long-double value, top the largest |want|
// of its row.
template <class E>
bool within_one_rounding(LD got, LD want, LD top) {
  const LD slack = 1e-6L * (1 + top), ax = std::fabs(want);
  LD bound = slack;
  if constexpr (std::is_same<E, rope::BFloat16>::value) {
    bound += ax / 256;
  } else if constexpr (std::is_same<E, rope::Float16>::value) {
    bound += ax / 1024 + std::ldexp(1.0L, -24);
  } else if constexpr (std::is_same<E, std::int8_t>::value) {
    bound += top / 254 * (1 + 1e-5L);
  } else if constexpr (is_fp8<E>()) {
    bound += fp8_rounding<E>(ax + slack, top + slack);
  }
  return std::fabs(got - want) <= bound;
}

// ---------------------------------------------------------------------------
// Threads and logits: one drawing each for every call that takes them.

// An executor that runs the shares on the calling thread, last first: the
// contract allows any order, and the bytes must not depend on it.
inline void run_reversed(void*, std::size_t n, void (*task)(void*, std::size_t), void* context) {
  for (std::size_t i = n; i-- > 0;) task(context, i);
}

struct DrawnThreads {
  rope::Threads threads;
  bool valid = true;
  // Whether the call may split its work: several shares, or an executor.
  bool parallel() const { return threads.executor.set() || threads.count > 1; }
};

// A count of 0 or an executor of 0 workers (refused), an executor of 1 to 4
// workers, or 1 to 3 of rope's threads.
inline DrawnThreads draw_threads(Bytes& in) {
  DrawnThreads d;
  const std::uint8_t kind = in.u8() % 8;
  if (kind == 0) {
    d.threads = rope::Threads(std::size_t{0});
    d.valid = false;
  } else if (kind <= 3) {
    rope::Executor e;
    e.parallel_for = &run_reversed;
    e.workers = kind == 1 ? 0 : 1 + in.u8() % 4;
    d.threads = e;
    d.valid = e.workers > 0;
  } else {
    d.threads = rope::Threads(std::size_t{1} + in.u8() % 3);
  }
  return d;
}

// Logits as a caller may set them, valid or not; valid judged in the
// arithmetic's type T (logits.hpp): a scale finite in double and in T, a
// softcap finite and > 0 in both, one sink per query head, each finite or
// -inf in T.
struct DrawnLogits {
  ra::Logits logits;
  bool valid = true;
};

template <class T>
DrawnLogits draw_logits(Bytes& in, std::size_t heads) {
  DrawnLogits d;
  if (in.flag()) {
    const double odd[] = {std::nan(""), HUGE_VAL, 1e300, -0.5, 0.0};
    const std::uint8_t kind = in.u8() % 32;
    d.logits.scale = kind < 5 ? odd[kind] : 0.05 + in.u8() / 256.0;
  }
  if (in.u8() % 4 == 0) {
    const double caps[] = {0.5, 5.0, 30.0, 0.0, -1.0, std::nan(""), HUGE_VAL, 1e300, 1e-50};
    d.logits.softcap = caps[in.u8() % 9];
  }
  if (in.u8() % 4 == 0) {
    const std::size_t count = in.u8() % 8 == 0 ? heads + 1 : heads;
    for (std::size_t h = 0; h < count; ++h) {
      const std::uint8_t kind = in.u8() % 16;
      d.logits.sinks.push_back(kind == 0   ? -HUGE_VAL
                               : kind == 1 ? std::nan("")
                               : kind == 2 ? 1e300
                               : kind == 3 ? -1e300
                               : kind == 4 ? HUGE_VAL
                                           : (static_cast<int>(in.u8()) - 128) / 32.0);
    }
  }
  const ra::Logits& l = d.logits;
  if (l.scale) d.valid = d.valid && std::isfinite(*l.scale) && std::isfinite(static_cast<T>(*l.scale));
  if (l.softcap) {
    const double cap = *l.softcap;
    d.valid = d.valid && cap > 0 && std::isfinite(cap) && std::isfinite(static_cast<T>(cap)) && static_cast<T>(cap) > 0;
  }
  if (!l.sinks.empty()) {
    d.valid = d.valid && l.sinks.size() == heads;
    for (double s : l.sinks) {
      const T t = static_cast<T>(s);
      d.valid = d.valid && (std::isfinite(t) || t == -std::numeric_limits<T>::infinity());
    }
  }
  return d;
}

// Valid logits as the arithmetic in T applies them.
template <class T>
struct LogitsIn {
  LD scale = 1;
  std::optional<LD> cap;
  std::vector<LD> sinks;  // per query head; -inf: none

  LogitsIn(const ra::Logits& l, std::size_t heads, std::size_t d) {
    scale = static_cast<T>(l.scale ? *l.scale : 1.0 / std::sqrt(static_cast<double>(d)));
    if (l.softcap) cap = static_cast<T>(*l.softcap);
    sinks.assign(heads, kNegInf);
    for (std::size_t h = 0; h < l.sinks.size() && h < heads; ++h) sinks[h] = static_cast<T>(l.sinks[h]);
  }
};

// ---------------------------------------------------------------------------
// The softmax oracle: one row, in long double, over the keys its query sees.

// A visible key: the product q . k (after any rotation), a bound M of
// sum_c |q_c k_c| over pair magnitudes, its value row, and what its score
// may be off by beyond the float arithmetic's bound (a product mode's
// rounding of q: kv_products.hpp).
struct Scored {
  LD dot = 0, magnitude = 0;
  std::vector<LD> v;
  LD extra = 0;
};

struct Want {
  bool sees = false;       // some key is visible
  bool finite = true;      // every visible input is finite
  bool nan_score = false;  // some visible score is NaN
  std::vector<bool> nan_value;
  std::vector<LD> out;
  LD lse = kNegInf;
  LD tolerance = 0;      // on each channel
  LD lse_tolerance = 0;  // on the log-sum-exp
  LD magnitude = 0;      // the largest |v| seen
};

// The exact row over the visible keys, and the rounding error a row
// computed in T may have against it (a forward error bound, not a measured
// one). Each key's score is off by at most delta_n = u ((d + 8) |scale| M_n
// + 8 (|s_n| + |s'_n| + |top| + 1)): d products and sums, two roundings of
// a rotated element, the scale, the cap (s'_n the score before it: its
// division moves the score by at most u |s'_n|) and the subtraction of the
// maximum. The weights exp(s_n - top) are then off by factors within
// exp(+-(delta + 4u)) (the exponential's own error), which moves a weighted
// mean of values of magnitude at most mag by at most expm1(2 (delta + 4u))
// mag; the sums, the rescaling at each chunk and the division add
// (4 n + 16) u mag over n keys. The log-sum-exp is off by at most delta
// plus the relative error of its sum, plus the roundings of its logarithm
// and its addition. Each bound is doubled for the second-order terms left
// out.
template <class T>
Want softmax_want(const std::vector<Scored>& keys, std::size_t d, std::size_t dv, const LogitsIn<T>& logits,
                  std::size_t h, bool finite, bool nan_score, std::vector<bool> nan_value) {
  Want w;
  w.sees = !keys.empty();
  w.finite = finite;
  w.nan_score = nan_score;
  w.nan_value = std::move(nan_value);
  w.nan_value.resize(dv, false);
  if (!w.sees || !finite) return w;
  const LD u = unit_roundoff<T>();
  const LD sink = logits.sinks[h];
  std::vector<LD> pre(keys.size()), scores(keys.size());
  for (std::size_t n = 0; n < keys.size(); ++n) {
    pre[n] = keys[n].dot * logits.scale;
    scores[n] = logits.cap ? *logits.cap * std::tanh(pre[n] / *logits.cap) : pre[n];
  }
  LD top = *std::max_element(scores.begin(), scores.end());
  if (sink != kNegInf) top = std::max(top, sink);
  LD sum = sink != kNegInf ? std::exp(sink - top) : 0;
  LD max_delta = sink != kNegInf ? 8 * u * (std::fabs(sink) + std::fabs(top) + 1) : 0;
  w.out.assign(dv, 0);
  for (std::size_t n = 0; n < keys.size(); ++n) {
    const LD weight = std::exp(scores[n] - top);
    sum += weight;
    const LD delta = u * (LD(d + 8) * keys[n].magnitude * std::fabs(logits.scale) +
                          8 * (std::fabs(scores[n]) + std::fabs(pre[n]) + std::fabs(top) + 1)) +
                     keys[n].extra;
    max_delta = std::max(max_delta, delta);
    for (std::size_t c = 0; c < dv; ++c) {
      w.out[c] += weight * keys[n].v[c];
      w.magnitude = std::max(w.magnitude, std::fabs(keys[n].v[c]));
    }
  }
  for (auto& x : w.out) x /= sum;
  const LD relative = std::expm1(2 * (max_delta + 4 * u)) + LD(4 * keys.size() + 16) * u;
  w.tolerance = 2 * relative * w.magnitude;
  w.lse = top + std::log(sum);
  w.lse_tolerance = 2 * (max_delta + relative) + 8 * u * (std::fabs(w.lse) + std::fabs(top) + 1);
  return w;
}

// A row of O (and its log-sum-exp, when lse is set) against the oracle's: a
// row that sees no key is zeros (its lse the sink, or -inf); a row that sees
// a NaN score is NaN in every channel (and its lse), one that sees a NaN in
// value channel c is NaN there (the promise of softmax.hpp and attend.hpp);
// a row that sees only an infinity, or whose scores are so large that the
// bound itself is not finite, is not asserted on; every other row is
// finite and within the bound.
template <class O>
void check_row(const O* got, const float* lse, const Want& w, std::size_t dv, LD sink, const std::string& at) {
  if (!w.sees) {
    for (std::size_t c = 0; c < dv; ++c) ROPE_FUZZ_CHECK(widen(got[c]) == 0, at + ": a row that sees no key");
    if (lse != nullptr) ROPE_FUZZ_CHECK(LD(*lse) == sink, at + ": the lse of a row that sees no key");
    return;
  }
  if (!w.finite) {
    for (std::size_t c = 0; c < dv; ++c) {
      if (w.nan_score || w.nan_value[c]) {
        ROPE_FUZZ_CHECK(std::isnan(widen(got[c])),
                        at + ": a row that sees a NaN is not NaN in channel " + std::to_string(c));
      }
    }
    if (lse != nullptr && w.nan_score) ROPE_FUZZ_CHECK(std::isnan(*lse), at + ": the lse of a NaN score");
    return;
  }
  // Scores so large that the float arithmetic's own bound is not finite
  // (near FLT_MAX: a dot product's partial sums may overflow where the
  // exact sum does not) promise nothing but what the input decides.
  if (!std::isfinite(w.tolerance) || !std::isfinite(w.lse_tolerance)) return;
  for (std::size_t c = 0; c < dv; ++c) {
    const LD g = widen(got[c]);
    const LD bound = w.tolerance + output_rounding<O>(std::fabs(w.out[c]) + w.tolerance);
    ROPE_FUZZ_CHECK(std::isfinite(g), at + ": a row of finite inputs is not finite");
    ROPE_FUZZ_CHECK(std::fabs(g - w.out[c]) <= bound,
                    at + " channel " + std::to_string(c) + ": got " + std::to_string(double(g)) + ", want " +
                        std::to_string(double(w.out[c])) + ", bound " + std::to_string(double(bound)));
  }
  if (lse != nullptr) {
    ROPE_FUZZ_CHECK(std::isfinite(*lse), at + ": the lse of a row of finite inputs");
    ROPE_FUZZ_CHECK(std::fabs(LD(*lse) - w.lse) <= w.lse_tolerance, at + ": lse " + std::to_string(*lse) + ", want " +
                                                                        std::to_string(double(w.lse)) + ", bound " +
                                                                        std::to_string(double(w.lse_tolerance)));
  }
}

template <class T>
std::vector<LD> head_row(const std::vector<T>& data, std::size_t t, std::size_t h, std::size_t heads, std::size_t dim) {
  std::vector<LD> r(dim);
  for (std::size_t c = 0; c < dim; ++c) r[c] = widen(data[(t * heads + h) * dim + c]);
  return r;
}

template <class T>
std::vector<LD> view_row(const rope::View<T>& x, std::size_t t, std::size_t h) {
  std::vector<LD> r(x.head_dim);
  for (std::size_t c = 0; c < x.head_dim; ++c) r[c] = widen(x.row(t, h)[c]);
  return r;
}

// ---------------------------------------------------------------------------
// Paged caches, shapes and batches.

// A value no row holds, in the gaps between a pool's rows: a call that
// read a gap would make NaN (int8: a code the quantizer never writes).
template <class E>
E poison() {
  if constexpr (std::is_same<E, std::int8_t>::value) {
    return std::int8_t{-128};
  } else {
    return from_float<E>(std::numeric_limits<float>::quiet_NaN());
  }
}

// A pool of K or V rows, its rows filled through store_kv_row (int8: with
// their scales), in one of three layouts: NHD, HND, or NHD with gaps between
// heads, tokens and pages (which no call may read or write).
template <class E>
struct PoolData {
  std::vector<E> data;
  std::vector<float> scales;
  ra::PagePool<E> pool;
};

template <class E>
void fill_rows(const ra::PagePool<E>& pool, Bytes& in) {
  constexpr bool scaled = rope::KvElement<E>::kScaled;
  std::vector<float> row(pool.head_dim);
  for (std::size_t slot = 0; slot < pool.slots(); ++slot) {
    for (std::size_t h = 0; h < pool.heads; ++h) {
      for (auto& x : row) x = attention_element<float>(in);
      rope::store_kv_row(row.data(), pool.head_dim, pool.row(slot, h), scaled ? pool.scale(slot, h) : nullptr);
    }
  }
}

template <class E>
void make_pool(PoolData<E>& p, Bytes& in, std::size_t pages, std::size_t ps, std::size_t heads, std::size_t dim,
               std::uint8_t layout) {
  constexpr bool scaled = rope::KvElement<E>::kScaled;
  p.scales.assign(pages * ps * heads, 0.0f);
  float* scales = scaled ? p.scales.data() : nullptr;
  if (layout % 3 == 2) {
    const std::size_t head_stride = dim + 1, token_stride = heads * head_stride + 2,
                      page_stride = ps * token_stride + 3;
    p.data.assign(pages * page_stride, poison<E>());
    p.pool = ra::PagePool<E>{p.data.data(), scales, pages, ps, heads, dim, page_stride, token_stride, head_stride};
  } else {
    p.data.assign(pages * ps * heads * dim, poison<E>());
    p.pool = layout % 3 == 1 ? ra::PagePool<E>::hnd(p.data.data(), pages, ps, heads, dim, scales)
                             : ra::PagePool<E>::nhd(p.data.data(), pages, ps, heads, dim, scales);
  }
  fill_rows(p.pool, in);
}

// Value c of row (slot, h) as the cache means it: widened, times its scale.
template <class E>
LD stored(const ra::PagePool<E>& p, std::size_t slot, std::size_t h, std::size_t c) {
  const LD x = rope::detail::widen_value(p.row(slot, h)[c]);
  return rope::KvElement<E>::kScaled ? x * LD(*p.scale(slot, h)) : x;
}

// A pool's bytes and scales as they were before a call.
template <class E>
struct PoolBefore {
  std::vector<E> data;
  std::vector<float> scales;
};

template <class E>
PoolBefore<E> before(const PoolData<E>& p) {
  return {p.data, p.scales};
}

template <class E>
bool unchanged(const PoolData<E>& p, const PoolBefore<E>& b) {
  return same_bytes(p.data, b.data) && same_bytes(p.scales, b.scales);
}

// After a call that writes the rows want(t, h) of token writer[slot] into
// its slot, each value within one rounding into E (a non-finite int8 row:
// codes 0 and a NaN scale): every other byte of the pool (other slots, the
// gaps between rows, other scales) as it was.
template <class E, class WantRow>
void check_written(const PoolData<E>& now, const PoolBefore<E>& was, const std::vector<std::int64_t>& writer,
                   WantRow want_row, const std::string& where) {
  constexpr bool scaled = rope::KvElement<E>::kScaled;
  const ra::PagePool<E>& pool = now.pool;
  std::vector<E> data = now.data;
  std::vector<float> scales = now.scales;
  for (std::size_t s = 0; s < writer.size(); ++s) {
    if (writer[s] < 0) continue;
    const auto t = static_cast<std::size_t>(writer[s]);
    for (std::size_t h = 0; h < pool.heads; ++h) {
      const std::string at = where + " slot " + std::to_string(s) + " head " + std::to_string(h);
      const std::vector<LD> x = want_row(t, h);
      if (!finite_all(x)) {
        if (scaled) {
          ROPE_FUZZ_CHECK(std::isnan(*pool.scale(s, h)), at + ": a non-finite row's scale is not NaN");
          for (std::size_t c = 0; c < pool.head_dim; ++c)
            ROPE_FUZZ_CHECK(rope::detail::widen_value(pool.row(s, h)[c]) == 0.0f, at + ": not 0");
        }
      } else {
        const LD top = top_of(x);
        if (scaled) {
          ROPE_FUZZ_CHECK(std::fabs(LD(*pool.scale(s, h)) - top / code_max<E>()) <= 1e-6L * (1 + top),
                          at + ": the scale");
        }
        for (std::size_t c = 0; c < pool.head_dim; ++c) {
          const LD got = stored(pool, s, h, c);
          ROPE_FUZZ_CHECK(within_one_rounding<E>(got, x[c], top), at + " channel " + std::to_string(c) + ": got " +
                                                                      std::to_string(double(got)) + ", want " +
                                                                      std::to_string(double(x[c])));
        }
      }
      // Put the row back as it was: what remains must be the old bytes.
      const auto offset = static_cast<std::size_t>(pool.row(s, h) - pool.data);
      std::copy(was.data.begin() + static_cast<std::ptrdiff_t>(offset),
                was.data.begin() + static_cast<std::ptrdiff_t>(offset + pool.head_dim),
                data.begin() + static_cast<std::ptrdiff_t>(offset));
      if (scaled) scales[s * pool.heads + h] = was.scales[s * pool.heads + h];
    }
  }
  ROPE_FUZZ_CHECK(same_bytes(data, was.data) && same_bytes(scales, was.scales),
                  where + ": bytes written outside the new tokens' rows");
}

// A step's shape as the caller may set it, from the cache's (Shape::of):
// kv_split and cascade drawn, and sometimes a field broken (refused by
// plan()), or one that plan() accepts but the cache does not fit (refused
// by append and attend), or v_head_dim 0 (head_dim: fits only a cache with
// dv == d).
struct DrawnShape {
  ra::Shape shape;
  bool valid = true;  // plan() accepts it
  bool fits = true;   // the cache it came from fits it
};

inline DrawnShape draw_shape(Bytes& in, const ra::Shape& of) {
  DrawnShape d;
  ra::Shape& s = d.shape;
  s = of;
  const std::size_t splits[] = {1, 2, 3, 5, 512, 0};
  s.kv_split = splits[in.u8() % 6];
  switch (in.u8() % 16) {
    case 1: s.q_heads = 0; break;
    case 2: s.kv_heads = 0; break;
    case 3: s.kv_heads = s.q_heads + 1; break;  // not a divisor
    case 4: s.head_dim = 0; break;
    case 5: s.page_size = 0; break;
    case 6: s.pages = 0; break;
    case 7: s.pages += 1; break;
    case 8: s.head_dim += 1; break;
    case 9: s.v_head_dim = 0; break;
    case 10: s.page_size += 1; break;
    default: break;
  }
  s.cascade = in.flag();
  d.valid = s.q_heads >= 1 && s.kv_heads >= 1 && s.q_heads % s.kv_heads == 0 && s.head_dim >= 1 && s.page_size >= 1 &&
            s.pages >= 1 && s.kv_split >= 1;
  d.fits = s.kv_heads == of.kv_heads && s.head_dim == of.head_dim && s.dv() == of.dv() && s.page_size == of.page_size &&
           s.pages == of.pages;
  return d;
}

// A batch as a scheduler may hand it over: new tokens per sequence, lengths
// (sometimes below the new tokens or past the pages), block tables (ids
// outside the pool, a page twice, pages shared with another sequence), and
// sometimes a broken start or a null array; with draw_trees, some
// sequences' new tokens a tree (tree.hpp). Its validity, positions and
// slots are judged by judge() from plan.hpp's and tree.hpp's comments, for
// a shape.
struct DrawnBatch {
  std::size_t sequences = 0, stride = 0, tokens = 0;
  std::vector<std::int64_t> n;
  Exact<std::int64_t> q_starts, lengths;
  Exact<std::int32_t> table;
  // Tree verify (draw_trees): per new token its depth, and `words` words of
  // mask bits at masks + t * words.
  Exact<std::int32_t> depths;
  Exact<std::uint64_t> masks;
  std::size_t words = 0;
  std::uint8_t tree_break = 0;
  ra::Batch batch;
  std::uint8_t broken = 0;
  bool valid = false;
  bool shared_write = false;             // a new token into a page another sequence reads
  bool trees = false;                    // when valid: some sequence is a tree
  std::vector<std::int64_t> positions;   // per new token, when valid
  std::vector<std::int64_t> slots;       // per new token, when valid
  std::vector<std::size_t> sequence_of;  // per new token
  // Per new token, when valid: a tree token's keys (its cached keys, then
  // cached + j for each bit j of its row, sorted); empty for the others.
  std::vector<std::vector<std::int64_t>> tree_keys;
  std::vector<bool> tree_token;

  // Sequence b's key j: its slot (unchecked).
  std::size_t slot(std::size_t b, std::int64_t j, std::size_t ps) const {
    const std::int32_t page = table[b * stride + static_cast<std::size_t>(j) / ps];
    return static_cast<std::size_t>(page) * ps + static_cast<std::size_t>(j) % ps;
  }
  std::int64_t start(std::size_t b) const {
    std::int64_t s = 0;
    for (std::size_t i = 0; i < b; ++i) s += n[i];
    return s;
  }
};

// max_new: new tokens per sequence below it (4 for the decoders whose
// seeds were written with that draw).
inline void draw_batch(DrawnBatch& b, Bytes& in, std::size_t pages, std::size_t ps, std::size_t max_new = 4) {
  b.sequences = in.u8() % 4;
  b.stride = in.u8() % (max_new > 4 ? 5 : 4);
  const auto capacity = static_cast<std::int64_t>(b.stride * ps);
  b.n.assign(b.sequences, 0);
  b.q_starts = Exact<std::int64_t>(b.sequences + 1);
  b.lengths = Exact<std::int64_t>(b.sequences);
  b.table = Exact<std::int32_t>(b.sequences * b.stride);
  std::int64_t start = 0;
  for (std::size_t s = 0; s < b.sequences; ++s) {
    b.n[s] = static_cast<std::int64_t>(in.u8() % max_new);
    b.q_starts[s] = start;
    start += b.n[s];
    const std::uint8_t kind = in.u8() % 16;
    const std::int64_t room = capacity - b.n[s];
    b.lengths[s] = kind == 0   ? b.n[s] - 1
                   : kind == 1 ? capacity + 1
                               : b.n[s] + (room >= 0 ? static_cast<std::int64_t>(in.u8() % (room + 1)) : 0);
  }
  b.q_starts[b.sequences] = start;
  b.tokens = static_cast<std::size_t>(start);
  for (std::size_t i = 0; i < b.table.n; ++i) {
    b.table[i] = in.u8() % 16 == 0 ? (in.flag() ? -1 : static_cast<std::int32_t>(pages))
                                   : static_cast<std::int32_t>(in.u8() % pages);
  }
  // A shared prefix: sequence 1 starts with sequence 0's first pages.
  if (b.sequences >= 2 && b.stride > 0 && in.u8() % 4 == 0) {
    const std::size_t shared = 1 + in.u8() % b.stride;
    for (std::size_t i = 0; i < shared; ++i) b.table[b.stride + i] = b.table[i];
  }
  b.batch = ra::Batch{b.q_starts.data(), b.lengths.data(), b.table.data(), b.stride, b.sequences};
  b.broken = in.u8() % 16;
  switch (b.broken) {
    case 1: b.q_starts[0] = 1; break;
    case 2: b.batch.q_starts = nullptr; break;
    case 3: b.batch.lengths = nullptr; break;
    case 4: b.batch.block_table = nullptr; break;
    case 5:
      if (b.sequences >= 1) b.q_starts[1] = -1;  // starts that decrease
      break;
    default: break;
  }
}

// Trees over a drawn batch's sequences (tree verify, tree.hpp): a tree's
// first token at depth 0, each later one under an earlier token (its depth
// one more, its row its parent's and its own bit), sometimes with the bits
// of other tokens no deeper than itself (allowed: a row need not be a
// path); the other sequences' depths -1 and their rows any bits (not
// read). Then sometimes one thing broken: a token's own bit cleared, a bit
// past the sequence's tokens, a bit of a deeper token, a depth out of
// [0, n), a depth of a sequence that is not a tree, null masks, too few
// words, or no depths at all (a batch without trees).
inline void draw_trees(DrawnBatch& b, Bytes& in) {
  b.words = in.u8() % 8 == 0 ? 2 : 1;
  b.tree_break = in.u8() % 16;
  if (b.tree_break == 8) b.words = 0;
  b.depths = Exact<std::int32_t>(b.tokens);
  b.masks = Exact<std::uint64_t>(b.tokens * b.words);
  std::vector<std::size_t> tree_starts, plain_starts;
  for (std::size_t s = 0; s < b.sequences; ++s) {
    const auto t0 = static_cast<std::size_t>(b.start(s)), n = static_cast<std::size_t>(b.n[s]);
    const bool tree = n >= 1 && in.u8() % 4 != 0;
    (tree ? tree_starts : plain_starts).push_back(s);
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t t = t0 + i;
      for (std::size_t w = 0; w < b.words; ++w) b.masks[t * b.words + w] = tree ? 0 : in.u8() * 0x0101010101010101ull;
      if (!tree) {
        b.depths[t] = -1;
        continue;
      }
      std::uint64_t row = std::uint64_t{1} << i;
      std::int32_t depth = 0;
      if (i > 0) {
        const std::size_t parent = t0 + in.u8() % i;
        depth = b.depths[parent] + 1;
        row |= b.words > 0 ? b.masks[parent * b.words] : 0;
      }
      const std::uint8_t extra = in.u8() % 4 == 0 ? in.u8() : 0;
      for (std::size_t j = 0; j < i && j < 8; ++j) {
        if (((extra >> j) & 1) != 0 && b.depths[t0 + j] <= depth) row |= std::uint64_t{1} << j;
      }
      b.depths[t] = depth;
      if (b.words > 0) b.masks[t * b.words] = row;
    }
  }
  const auto pick = [&](const std::vector<std::size_t>& from) { return from[in.u8() % from.size()]; };
  const auto token_of = [&](std::size_t s) {
    return static_cast<std::size_t>(b.start(s)) + in.u8() % static_cast<std::size_t>(b.n[s]);
  };
  switch (b.tree_break) {
    case 1:
      if (!tree_starts.empty() && b.words > 0) {
        const std::size_t s = pick(tree_starts), t = token_of(s);
        b.masks[t * b.words] &= ~(std::uint64_t{1} << (t - static_cast<std::size_t>(b.start(s))));
      }
      break;
    case 2:
      if (!tree_starts.empty() && b.words > 0) {
        const std::size_t s = pick(tree_starts), t = token_of(s);
        const std::size_t bit =
            static_cast<std::size_t>(b.n[s]) + in.u8() % (64 * b.words - static_cast<std::size_t>(b.n[s]));
        b.masks[t * b.words + bit / 64] |= std::uint64_t{1} << (bit % 64);
      }
      break;
    case 3:
      if (!tree_starts.empty() && b.words > 0) {  // a bit of the deepest token, on a token above it
        const std::size_t s = pick(tree_starts), t0 = static_cast<std::size_t>(b.start(s));
        std::size_t deep = t0;
        for (std::size_t t = t0; t < t0 + static_cast<std::size_t>(b.n[s]); ++t) {
          if (b.depths[t] > b.depths[deep]) deep = t;
        }
        b.masks[t0 * b.words] |= std::uint64_t{1} << (deep - t0);
      }
      break;
    case 4:
      if (!tree_starts.empty()) {
        const std::size_t s = pick(tree_starts), t = token_of(s);
        b.depths[t] = in.flag() ? static_cast<std::int32_t>(b.n[s]) : -2;
      }
      break;
    case 5:
      if (!plain_starts.empty()) {
        const std::size_t s = pick(plain_starts);
        if (b.n[s] > 0) {
          const std::size_t t = token_of(s);
          b.depths[t] = 0;
        }
      }
      break;
    case 6:
      if (!tree_starts.empty()) {  // -1 on a later token of a tree
        const std::size_t s = pick(tree_starts), t = token_of(s);
        b.depths[t] = -1;
      }
      break;
    default: break;
  }
  b.batch.tree_depths = b.tree_break == 9 ? nullptr : b.depths.data();
  b.batch.tree_masks = b.tree_break == 7 ? nullptr : b.masks.data();
  b.batch.tree_mask_words = b.words;
}

// Whether sequence s's tree (tree.hpp) is as check_tree accepts it, and
// whether it is one: -1 on every token (not a tree), or depths in [0, n),
// masks set, enough words, each row its own bit and no bit past the tokens
// or of a deeper token.
inline bool tree_ok(const DrawnBatch& b, std::size_t s, bool* tree) {
  const auto t0 = static_cast<std::size_t>(b.q_starts[s]);
  const auto n = static_cast<std::size_t>(b.q_starts[s + 1] - b.q_starts[s]);
  const std::int32_t* depths = b.batch.tree_depths;
  *tree = false;
  if (n == 0 || depths[t0] == -1) {
    for (std::size_t i = 0; i < n; ++i) {
      if (depths[t0 + i] != -1) return false;
    }
    return true;
  }
  *tree = true;
  const std::uint64_t* masks = b.batch.tree_masks;
  const std::size_t words = b.batch.tree_mask_words;
  if (masks == nullptr || words * 64 < n) return false;
  for (std::size_t i = 0; i < n; ++i) {
    if (depths[t0 + i] < 0 || static_cast<std::size_t>(depths[t0 + i]) >= n) return false;
  }
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t* row = masks + (t0 + i) * words;
    for (std::size_t j = 0; j < words * 64; ++j) {
      const bool bit = ((row[j / 64] >> (j % 64)) & 1) != 0;
      if (j == i && !bit) return false;
      if (bit && (j >= n || depths[t0 + j] > depths[t0 + i])) return false;
    }
  }
  return true;
}

// plan()'s checks of a batch against a shape (plan.hpp, tree.hpp), and the
// positions and slots it must derive.
inline void judge(DrawnBatch& b, const ra::Shape& s) {
  const std::size_t ps = s.page_size;
  bool v = b.batch.q_starts != nullptr && b.q_starts[0] == 0;
  if (b.sequences > 0) v = v && b.batch.lengths != nullptr && b.batch.block_table != nullptr;
  std::vector<std::vector<std::int32_t>> used(b.sequences);
  for (std::size_t i = 0; i < b.sequences && v; ++i) {
    const std::int64_t n = b.q_starts[i + 1] - b.q_starts[i], len = b.lengths[i];
    v = v && n >= 0 && len >= n;
    if (!v || n == 0) continue;
    v = v && static_cast<std::uint64_t>(len) <= static_cast<std::uint64_t>(b.stride) * ps;
    for (std::int64_t j = 0; j < len && v; j += static_cast<std::int64_t>(ps)) {
      const std::int32_t id = b.table[i * b.stride + static_cast<std::size_t>(j) / ps];
      v = v && id >= 0 && static_cast<std::size_t>(id) < s.pages;
      v = v && std::find(used[i].begin(), used[i].end(), id) == used[i].end();
      used[i].push_back(id);
    }
  }
  std::vector<bool> tree(b.sequences, false);
  for (std::size_t i = 0; i < b.sequences && v && b.batch.tree_depths != nullptr; ++i) {
    bool is_tree = false;
    v = tree_ok(b, i, &is_tree);
    tree[i] = is_tree;
  }
  b.valid = v;
  b.positions.clear();
  b.slots.clear();
  b.sequence_of.clear();
  b.tree_keys.clear();
  b.tree_token.clear();
  b.shared_write = false;
  b.trees = false;
  if (!v) return;
  for (std::size_t i = 0; i < b.sequences; ++i) {
    const std::int64_t cached = b.lengths[i] - b.n[i];
    for (std::int64_t t = 0; t < b.n[i]; ++t) {
      const std::int64_t p = cached + t;  // the key's index, and its slot's
      const std::size_t slot = b.slot(i, p, ps);
      std::vector<std::int64_t> keys;
      if (tree[i]) {  // at cached + depth; sees the cached keys and its row's bits
        const auto token = static_cast<std::size_t>(b.q_starts[i] + t);
        for (std::int64_t j = 0; j < cached; ++j) keys.push_back(j);
        const std::uint64_t* row = b.batch.tree_masks + token * b.batch.tree_mask_words;
        for (std::int64_t j = 0; j < b.n[i]; ++j) {
          if (((row[j / 64] >> (j % 64)) & 1) != 0) keys.push_back(cached + j);
        }
        b.positions.push_back(cached + b.batch.tree_depths[token]);
        b.trees = true;
      } else {
        b.positions.push_back(p);
      }
      b.tree_keys.push_back(std::move(keys));
      b.tree_token.push_back(tree[i]);
      b.slots.push_back(static_cast<std::int64_t>(slot));
      b.sequence_of.push_back(i);
      const auto page = static_cast<std::int32_t>(slot / ps);
      for (std::size_t o = 0; o < b.sequences; ++o) {
        if (o != i && std::find(used[o].begin(), used[o].end(), page) != used[o].end()) b.shared_write = true;
      }
    }
  }
}

// What an accepted plan() must hold: each new token's position and slot,
// and its work items in token order over all its sequence's keys, a decode
// token's split at multiples of kv_split and merged from distinct partial
// states, any other token's one direct item.
inline void check_plan(const ra::Plan& plan, const DrawnBatch& b, const ra::Shape& s, const rope::Threads& threads,
                       const std::string& where) {
  ROPE_FUZZ_CHECK(plan.sequences() == b.sequences && plan.tokens() == b.tokens, where + ": the plan's counts");
  ROPE_FUZZ_CHECK(plan.shape().v_head_dim == s.dv() && plan.shape().kv_split == s.kv_split &&
                      plan.shape().q_heads == s.q_heads && plan.shape().page_size == s.page_size,
                  where + ": the plan's shape");
  ROPE_FUZZ_CHECK(plan.threads().shares() == threads.shares(), where + ": the plan's threads");
  const auto& items = plan.items();
  std::vector<std::size_t> partials;
  std::size_t item = 0;
  for (std::size_t t = 0; t < b.tokens; ++t) {
    ROPE_FUZZ_CHECK(plan.position(t) == b.positions[t] && plan.positions()[t] == b.positions[t],
                    where + ": position of token " + std::to_string(t));
    ROPE_FUZZ_CHECK(plan.slot(t) == b.slots[t], where + ": slot of token " + std::to_string(t));
    const std::size_t seq = b.sequence_of[t];
    const auto len = static_cast<std::size_t>(b.lengths[seq]);
    const std::size_t first = item;
    const auto expect = [&](std::size_t key, std::size_t count) {
      ROPE_FUZZ_CHECK(item < items.size(), where + ": too few items");
      const ra::WorkItem& it = items[item++];
      ROPE_FUZZ_CHECK(it.sequence == seq && it.token == t && it.first_key == key && it.keys == count,
                      where + ": item " + std::to_string(item - 1) + " of token " + std::to_string(t));
    };
    if (b.tree_token[t]) {  // one direct item over its list
      const std::vector<std::int64_t>& keys = b.tree_keys[t];
      ROPE_FUZZ_CHECK(item < items.size(), where + ": too few items");
      const ra::WorkItem& it = items[item++];
      bool same =
          it.sequence == seq && it.token == t && it.first_key == 0 && it.keys == keys.size() && it.key_list != nullptr;
      for (std::size_t k = 0; k < keys.size() && same; ++k) same = it.key_list[k] == keys[k];
      ROPE_FUZZ_CHECK(same, where + ": the item of tree token " + std::to_string(t));
    } else if (b.n[seq] == 1) {
      for (std::size_t k = 0; k < len;) {
        const std::size_t end = std::min(len, (k / s.kv_split + 1) * s.kv_split);
        expect(k, end - k);
        k = end;
      }
    } else {
      expect(0, len);
    }
    for (std::size_t i = first; i < item; ++i) {
      if (item - first == 1) {
        ROPE_FUZZ_CHECK(items[i].partial == ra::WorkItem::kDirect, where + ": a lone item is not direct");
      } else {
        ROPE_FUZZ_CHECK(items[i].partial != ra::WorkItem::kDirect, where + ": a split item is direct");
        partials.push_back(items[i].partial);
      }
    }
  }
  ROPE_FUZZ_CHECK(item == items.size(), where + ": items past the tokens'");
  std::sort(partials.begin(), partials.end());
  ROPE_FUZZ_CHECK(std::adjacent_find(partials.begin(), partials.end()) == partials.end(),
                  where + ": two items share a partial state");
}

// Puts into p a plan that the call's views fit (one sequence of `tokens`
// new tokens over pages 0, 1, ...), or one of no tokens where the pool is too
// small: the plan() under test then replaces it, or must leave none.
inline void plan_before(ra::Plan& p, const ra::Shape& of, std::size_t tokens) {
  const std::int64_t none[1] = {0};
  if (tokens > of.pages * of.page_size) {
    ra::plan(p, of, ra::Batch{none, nullptr, nullptr, 0, 0});
    return;
  }
  const std::int64_t starts[2] = {0, static_cast<std::int64_t>(tokens)};
  const std::int64_t length = static_cast<std::int64_t>(tokens);
  std::vector<std::int32_t> row(of.pages);
  for (std::size_t i = 0; i < row.size(); ++i) row[i] = static_cast<std::int32_t>(i);
  ra::plan(p, of, ra::Batch{starts, &length, row.data(), row.size(), 1});
}

// plan() of a drawn shape and batch into p (which held another plan):
// refused exactly when the shape, the threads or the batch break plan.hpp's
// contract, and then with the function's name; accepted, the plan holds what
// check_plan expects. Returns whether it was accepted.
inline bool plan_step(ra::Plan& p, const DrawnShape& shape, DrawnBatch& b, const DrawnThreads& threads,
                      const std::string& where) {
  if (shape.valid) judge(b, shape.shape);
  const bool valid = shape.valid && threads.valid && b.valid;
  bool planned = true;
  try {
    ra::plan(p, shape.shape, b.batch, threads.threads);
  } catch (const rope::invalid_argument& e) {
    planned = false;
    ROPE_FUZZ_CHECK(!valid, where + ": plan refused a valid step: " + e.what());
    ROPE_FUZZ_CHECK(named(e, "rope::attention::plan"), e.what());
  }
  ROPE_FUZZ_CHECK(planned == valid, where + ": plan accepted an invalid step");
  if (planned) check_plan(p, b, shape.shape, threads.threads, where);
  return planned;
}

// The refusal of a call that read a plan whose last plan() failed.
template <class E>
void check_no_plan(const E& e, const char* fn, const std::string& where) {
  ROPE_FUZZ_CHECK(named(e, fn) && e.argument() == "plan",
                  where + ": a plan whose plan() failed must be refused first, got " + e.what());
}

// ---------------------------------------------------------------------------
// append's float RMSNorm and rows.

// RMSNorm in float, in the order pre_attention.hpp documents: eight fused
// sums (channel c into sum c % 8), added pairwise as written there, then
// r = 1 / sqrt(ss / n + eps) and y = (x r) w (or (x r)(1 + w)).
inline std::vector<float> rms_norm_float(std::vector<float> x, const float* w, float eps, bool plus_one) {
  float s[8] = {};
  for (std::size_t c = 0; c < x.size(); ++c) s[c % 8] = std::fma(x[c], x[c], s[c % 8]);
  const float ss = ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
  const float r = 1.0f / std::sqrt(ss / static_cast<float>(x.size()) + eps);
  for (std::size_t c = 0; c < x.size(); ++c) {
    const float xr = x[c] * r;
    x[c] = plus_one ? xr * (1.0f + w[c]) : xr * w[c];
  }
  return x;
}

// A token's rows of a view, widened to float, read before the call.
template <class In>
std::vector<std::vector<float>> token_rows(const rope::View<In>& x) {
  std::vector<std::vector<float>> rows(x.tokens * x.heads);
  for (std::size_t t = 0; t < x.tokens; ++t) {
    for (std::size_t h = 0; h < x.heads; ++h) {
      for (std::size_t c = 0; c < x.head_dim; ++c) {
        rows[t * x.heads + h].push_back(rope::detail::widen_value(x.row(t, h)[c]));
      }
    }
  }
  return rows;
}

// A view of the same layout at the same offset in another buffer.
template <class T, class U>
rope::View<T> rebased(const rope::View<T>& v, const U* from, U* to) {
  rope::View<T> r = v;
  r.data = reinterpret_cast<T*>(reinterpret_cast<char*>(to) +
                                (reinterpret_cast<const char*>(v.data) - reinterpret_cast<const char*>(from)));
  return r;
}

// The attention of token t's query heads (rows of q, read as given) over
// its sequence's keys (key j in slots[j]) that a query at position p sees
// through the mask, checked row by row against out (and lse, when set).
template <class E, class Q, class O>
void check_attend_token(const std::string& where, const rope::View<const Q>& q, const rope::View<O>& out,
                        const float* lse, std::size_t t, std::int64_t p, const std::vector<std::size_t>& slots,
                        const ra::PagePool<E>& kp, const ra::PagePool<E>& vp, std::size_t group,
                        const LogitsIn<float>& logits, const ra::Mask& mask) {
  const std::size_t hq = q.heads, d = q.head_dim, dv = out.head_dim;
  for (std::size_t h = 0; h < hq; ++h) {
    const std::size_t g = h / group;
    const std::vector<LD> qr = view_row(q, t, h);
    std::vector<Scored> keys;
    bool finite = finite_all(qr), nan_score = false;
    std::vector<bool> nan_value(dv, false);
    for (std::size_t j = 0; j < slots.size(); ++j) {
      const auto jj = static_cast<std::int64_t>(j);
      if (mask.causal && jj > p) continue;
      if (mask.window > 0 && jj <= p - static_cast<std::int64_t>(mask.window)) continue;
      Scored s;
      s.v.resize(dv);
      for (std::size_t c = 0; c < d; ++c) {
        const LD kc = stored(kp, slots[j], g, c);
        finite = finite && std::isfinite(kc);
        s.dot += qr[c] * kc;
        s.magnitude += std::fabs(qr[c]) * std::fabs(kc);
      }
      for (std::size_t c = 0; c < dv; ++c) {
        s.v[c] = stored(vp, slots[j], g, c);
        finite = finite && std::isfinite(s.v[c]);
        nan_value[c] = nan_value[c] || std::isnan(s.v[c]);
      }
      nan_score = nan_score || std::isnan(s.dot);
      keys.push_back(std::move(s));
    }
    const Want w = softmax_want<float>(keys, d, dv, logits, h, finite, nan_score, nan_value);
    check_row<O>(out.row(t, h), lse != nullptr ? lse + t * hq + h : nullptr, w, dv, logits.sinks[h],
                 where + ": token " + std::to_string(t) + " head " + std::to_string(h));
  }
}

}  // namespace rope_fuzz
