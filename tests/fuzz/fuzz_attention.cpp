// The fuzz target's attention decoders: rope::attention's softmax (multi-head
// views with grouped heads, masks, positions, a KV cache of rotated keys,
// threads), softmax_batch, write_slots and norm_rope_append (the fused
// QK-norm, RoPE and cache write) over paged caches of f32, bf16, f16 and int8, and linear attention (given features
// with eq. 19, and FAVOR+ over views). A decoded call is valid or breaks exactly one argument; a broken call must throw
// the documented exception and write nothing, a valid one must equal the long-double oracle on every row that sees only
// finite inputs, and no row may be touched by a non-finite value it does not see.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "fuzz_support.hpp"

#if defined(ROPE_FUZZ_ATTENTION)
#include <rope/attention.hpp>

namespace rope_fuzz {
namespace {

using LD = long double;
namespace ra = rope::attention;

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

// Rotation of a long-double vector from the table's own cos/sin row: the
// oracle rotates exactly what the library was given.
template <class T>
std::vector<LD> rotate_ld(std::vector<LD> x, const rope::Table<T>& table, rope::Style style, std::size_t r,
                          std::int64_t position) {
  const auto m = static_cast<std::size_t>(position);
  std::vector<LD> y = x;
  for (std::size_t p = 0; p < r / 2; ++p) {
    const std::size_t a = style == rope::Style::rotate_half ? p : 2 * p;
    const std::size_t b = style == rope::Style::rotate_half ? p + r / 2 : 2 * p + 1;
    const LD c = table.cos(m)[p], s = table.sin(m)[p];
    y[a] = x[a] * c - x[b] * s;
    y[b] = x[b] * c + x[a] * s;
  }
  return y;
}

bool finite_all(const std::vector<LD>& x) {
  for (LD v : x) {
    if (!std::isfinite(v)) return false;
  }
  return true;
}

// |x_c| + |x_partner(c)| for the r channels a rotation of that style mixes
// in pairs, |x_c| for the rest: a bound of the rotated element's magnitude
// and, times a few units of rounding, of its rounding error.
std::vector<LD> pair_magnitudes(const std::vector<LD>& x, rope::Style style, std::size_t r) {
  std::vector<LD> m(x.size());
  for (std::size_t c = 0; c < x.size(); ++c) m[c] = std::fabs(x[c]);
  for (std::size_t p = 0; p < r / 2; ++p) {
    const std::size_t a = style == rope::Style::rotate_half ? p : 2 * p;
    const std::size_t b = style == rope::Style::rotate_half ? p + r / 2 : 2 * p + 1;
    m[a] = m[b] = std::fabs(x[a]) + std::fabs(x[b]);
  }
  return m;
}

LD dot_magnitude(const std::vector<LD>& a, const std::vector<LD>& b) {
  LD s = 0;
  for (std::size_t c = 0; c < a.size(); ++c) s += a[c] * b[c];
  return s;
}

// The unit roundoff of T: half an ulp of 1.
template <class T>
constexpr LD unit_roundoff() {
  return LD(std::numeric_limits<T>::epsilon()) / 2;
}

// The rounding error a softmax row computed in T may have against the exact
// row over the same inputs (a forward error bound, not a measured one).
// Each key's score is off by at most delta_n = u ((d + 8) scale M_n +
// 8 (|s_n| + |top| + 1)), where M_n bounds sum_c |q_c k_c| after rotation
// (pair_magnitudes): d products and sums, two roundings of a rotated element,
// then the scale, the cap and the subtraction of the maximum. The weights
// exp(s_n - top) are then off by factors within exp(+-(delta + 4u)) (the
// exponential's own error), which moves a weighted mean of values of
// magnitude at most mag by at most expm1(2 (delta + 4u)) mag; the sums, the
// rescaling at each chunk and the division add (4 n + 16) u mag over n keys.
// The bound is doubled for the second-order terms left out.
template <class T>
LD softmax_row_bound(LD max_delta, std::size_t keys, LD magnitude) {
  const LD u = unit_roundoff<T>();
  return 2 * (std::expm1(2 * (max_delta + 4 * u)) + LD(4 * keys + 16) * u) * magnitude;
}

// What a row whose visible inputs are not all finite must hold (the
// promise of docs/attention.md): NaN in every channel where a visible score
// is NaN, NaN in channel c where a visible value's channel c is NaN. An
// infinity that makes no NaN score is not asserted on.
template <class T>
void check_nan_row(const T* got, std::size_t dv, bool nan_score, const std::vector<bool>& nan_value,
                   const std::string& where) {
  for (std::size_t c = 0; c < dv; ++c) {
    if (nan_score || nan_value[c]) {
      ROPE_FUZZ_CHECK(std::isnan(static_cast<double>(got[c])),
                      where + ": a row that sees a NaN is not NaN in channel " + std::to_string(c));
    }
  }
}

template <class T>
std::vector<LD> head_row(const std::vector<T>& data, std::size_t t, std::size_t h, std::size_t heads, std::size_t dim) {
  std::vector<LD> r(dim);
  for (std::size_t c = 0; c < dim; ++c) r[c] = data[(t * heads + h) * dim + c];
  return r;
}

template <class T>
void softmax_typed(Bytes& in) {
  const std::size_t lq = in.u8() % 6, lk = in.u8() % 8, hk = 1 + in.u8() % 3, group = 1 + in.u8() % 3;
  const std::size_t hq = hk * group, d = 1 + in.u8() % 9, dv = 1 + in.u8() % 5;
  const bool rotate = in.flag();
  const std::size_t table_dim = 2 * (1 + in.u8() % 4), table_positions = 1 + in.u8() % 24;
  const rope::Table<T> table(rope::frequencies(table_dim, 100.0), table_positions);
  ra::Rotation<T> rotation;
  if (rotate) {
    rotation.table = &table;
    rotation.style = in.flag() ? rope::Style::rotate_half : rope::Style::block_diagonal;
    rotation.rotary_dim = in.u8() % 4 == 0 ? in.u8() % 10 : 0;
  }
  ra::SoftmaxOptions o;
  o.causal = in.flag();
  o.window = in.u8() % 4 == 0 ? in.u8() % 5 : 0;
  const std::size_t blocks[] = {1, 2, 3, 7, 256, std::numeric_limits<std::size_t>::max(), 0};
  o.block = blocks[in.u8() % 7];
  o.threads = in.u8() % 4;
  o.keys_rotated = in.flag();
  if (in.flag()) o.scale = in.u8() % 32 == 0 ? std::nan("") : 0.05 + in.u8() / 256.0;
  const bool explicit_positions = in.flag();
  const auto position = [&]() { return static_cast<std::int64_t>(in.u8() % (table_positions + 3)) - 2; };
  if (explicit_positions) {
    for (std::size_t i = 0; i < lq; ++i) o.q_positions.push_back(position());
    for (std::size_t j = 0; j < lk; ++j) o.k_positions.push_back(position());
  } else {
    o.q_offset = position();
    o.k_offset = position();
  }
  if (in.flag()) {
    for (std::size_t i = 0; i < lq; ++i) o.q_sequence.push_back(in.u8() % 2);
    for (std::size_t j = 0; j < lk; ++j) o.k_sequence.push_back(in.u8() % 2);
  }
  auto q = elements<T>(in, lq * hq * d), k = elements<T>(in, lk * hk * d), v = elements<T>(in, lk * hk * dv);
  std::vector<T> out(std::max<std::size_t>(lq * hq * dv, 1), T(-9));
  const auto q_before = q, out_before = out;
  rope::View<T> out_view = rope::View<T>::token_major(out.data(), lq, hq, dv);
  const std::uint8_t view_break = in.u8() % 16;
  bool views_ok = true;
  if (view_break == 0) {
    out_view.data = nullptr;
    views_ok = false;
  } else if (view_break == 1 && lq * hq * dv <= q.size() && lq > 0) {
    out_view = rope::View<T>::token_major(q.data(), lq, hq, dv);  // out over q's own rows
    views_ok = false;
  } else if (view_break == 2 && hq > 1 && lq > 0) {
    out_view.head_stride = 0;
    views_ok = false;
  }

  // Validity, judged here from the documentation.
  const std::int64_t qo = o.q_offset, ko = o.k_offset;
  const auto pq = [&](std::size_t i) { return explicit_positions ? o.q_positions[i] : qo + std::int64_t(i); };
  const auto pk = [&](std::size_t j) { return explicit_positions ? o.k_positions[j] : ko + std::int64_t(j); };
  const std::size_t r = rotate ? (rotation.rotary_dim == 0 ? table_dim : rotation.rotary_dim) : 0;
  bool valid = views_ok && o.block > 0 && o.threads > 0 && (!o.scale || std::isfinite(*o.scale));
  if (rotate) valid = valid && r % 2 == 0 && r <= table_dim && r <= d;
  bool positions_ok = true;
  if (rotate) {
    for (std::size_t i = 0; i < lq; ++i)
      positions_ok = positions_ok && pq(i) >= 0 && pq(i) < std::int64_t(table_positions);
    for (std::size_t j = 0; j < lk && !o.keys_rotated; ++j) {
      positions_ok = positions_ok && pk(j) >= 0 && pk(j) < std::int64_t(table_positions);
    }
  }
  const std::string where = "softmax lq=" + std::to_string(lq) + " lk=" + std::to_string(lk) +
                            " heads=" + std::to_string(hq) + "/" + std::to_string(hk) + " d=" + std::to_string(d) +
                            " r=" + std::to_string(r) + " block=" + std::to_string(o.block) +
                            " break=" + std::to_string(view_break);
  bool threw = false;
  try {
    ra::softmax<T>(rope::View<const T>::token_major(q.data(), lq, hq, d),
                   rope::View<const T>::token_major(k.data(), lk, hk, d),
                   rope::View<const T>::token_major(v.data(), lk, hk, dv), out_view, rotation, o);
  } catch (const rope::invalid_argument& e) {
    threw = true;
    ROPE_FUZZ_CHECK(!valid, where + ": " + e.what());
    ROPE_FUZZ_CHECK(std::string(e.what()).find("rope::attention::softmax: ") == 0, e.what());
  } catch (const rope::out_of_range& e) {
    threw = true;
    ROPE_FUZZ_CHECK(valid && !positions_ok, where + ": " + e.what());
  }
  if (threw) {
    ROPE_FUZZ_CHECK(std::memcmp(q.data(), q_before.data(), q.size() * sizeof(T)) == 0, where + ": q written");
    ROPE_FUZZ_CHECK(std::memcmp(out.data(), out_before.data(), out.size() * sizeof(T)) == 0, where + ": out written");
    return;
  }
  ROPE_FUZZ_CHECK(valid && positions_ok, where + ": an invalid call was accepted");

  // The oracle, per query head: naive softmax in long double over the keys
  // the mask shows.
  const LD scale = o.scale ? LD(*o.scale) : 1.0L / std::sqrt(LD(d));
  const std::size_t rq = rotate ? r : 0, rk = rotate && !o.keys_rotated ? r : 0;
  for (std::size_t i = 0; i < lq; ++i) {
    for (std::size_t h = 0; h < hq; ++h) {
      const std::size_t g = h / group;
      const std::vector<LD> q_raw = head_row(q, i, h, hq, d);
      const std::vector<LD> q_mag = pair_magnitudes(q_raw, rotation.style, rq);
      std::vector<LD> qi = q_raw;
      if (rotate) qi = rotate_ld(qi, table, rotation.style, r, pq(i));
      std::vector<LD> scores, bounds;
      std::vector<std::size_t> keys;
      bool finite = finite_all(qi), nan_score = false;
      std::vector<bool> nan_value(dv, false);
      for (std::size_t j = 0; j < lk; ++j) {
        const std::int64_t sq = o.q_sequence.empty() ? 0 : o.q_sequence[i],
                           sk = o.k_sequence.empty() ? 0 : o.k_sequence[j];
        if (sq != sk || (o.causal && pk(j) > pq(i))) continue;
        if (o.window != 0 && pk(j) <= pq(i) && pq(i) - pk(j) >= std::int64_t(o.window)) continue;
        std::vector<LD> kj = head_row(k, j, g, hk, d);
        const std::vector<LD> vj = head_row(v, j, g, hk, dv);
        finite = finite && finite_all(kj) && finite_all(vj);
        for (std::size_t c = 0; c < dv; ++c) nan_value[c] = nan_value[c] || std::isnan(vj[c]);
        const LD m = dot_magnitude(q_mag, pair_magnitudes(kj, rotation.style, rk));
        if (rotate && !o.keys_rotated) kj = rotate_ld(kj, table, rotation.style, r, pk(j));
        LD s = 0;
        for (std::size_t c = 0; c < d; ++c) s += qi[c] * kj[c];
        nan_score = nan_score || std::isnan(s);
        scores.push_back(s * scale);
        bounds.push_back(m * scale);
        keys.push_back(j);
      }
      const T* got = out.data() + (i * hq + h) * dv;
      const std::string at = where + ": row " + std::to_string(i) + " head " + std::to_string(h);
      if (keys.empty()) {
        for (std::size_t c = 0; c < dv; ++c) ROPE_FUZZ_CHECK(got[c] == T(0), at + ": a row that sees no key");
        continue;
      }
      if (!finite) {  // only the rows that see it are concerned
        check_nan_row(got, dv, nan_score, nan_value, at);
        continue;
      }
      const LD top = *std::max_element(scores.begin(), scores.end());
      const LD u = unit_roundoff<T>();
      LD sum = 0, magnitude = 0, max_delta = 0;
      std::vector<LD> want(dv, 0);
      for (std::size_t n = 0; n < keys.size(); ++n) {
        const LD w = std::exp(scores[n] - top);
        sum += w;
        max_delta = std::max(max_delta, u * (LD(d + 8) * bounds[n] + 8 * (std::fabs(scores[n]) + std::fabs(top) + 1)));
        for (std::size_t c = 0; c < dv; ++c) {
          const LD vc = v[(keys[n] * hk + g) * dv + c];
          want[c] += w * vc;
          magnitude = std::max(magnitude, std::fabs(vc));
        }
      }
      const LD tolerance = softmax_row_bound<T>(max_delta, keys.size(), magnitude);
      for (std::size_t c = 0; c < dv; ++c) {
        ROPE_FUZZ_CHECK(std::isfinite(got[c]), at + ": a row of finite inputs is not finite");
        ROPE_FUZZ_CHECK(std::fabs(LD(got[c]) - want[c] / sum) <= tolerance,
                        at + ": off by " + std::to_string(double(std::fabs(LD(got[c]) - want[c] / sum))) + ", bound " +
                            std::to_string(double(tolerance)));
      }
    }
  }
}

// Given positive features, causal or not, with the eq. 19 rotation or not:
// the quadratic form in long double, masked by position and sequence.
template <class T>
void linear_features(Bytes& in) {
  const std::size_t lq = in.u8() % 7, lk = in.u8() % 7, m = 1 + in.u8() % 8, dv = 1 + in.u8() % 4;
  const bool eq19 = in.flag();
  const std::size_t table_dim = in.u8() % 8 == 0 ? 2 + 2 * (in.u8() % 4) : m + (m % 2);
  const std::size_t table_positions = 1 + in.u8() % 16;
  const rope::Table<T> table(rope::frequencies(table_dim, 100.0), table_positions);
  ra::LinearOptions o;
  o.causal = in.flag();
  const std::size_t chunks[] = {1, 2, 3, 5, 64, std::numeric_limits<std::size_t>::max(), 0};
  o.chunk = chunks[in.u8() % 7];
  o.threads = 1 + in.u8() % 2;
  const bool explicit_positions = in.flag();
  for (std::size_t i = 0; i < lq && explicit_positions; ++i) o.q_positions.push_back(in.u8() % table_positions);
  for (std::size_t j = 0; j < lk && explicit_positions; ++j) o.k_positions.push_back(in.u8() % table_positions);
  if (in.flag()) {
    for (std::size_t i = 0; i < lq; ++i) o.q_sequence.push_back(in.u8() % 2);
    for (std::size_t j = 0; j < lk; ++j) o.k_sequence.push_back(in.u8() % 2);
  }
  const auto feature = [&]() {
    const T x = attention_element<T>(in);
    return std::isfinite(x) ? T(std::exp(double(x))) : x;  // positive, or the non-finite value
  };
  ra::Matrix<T> fq(static_cast<Eigen::Index>(lq), static_cast<Eigen::Index>(m)),
      fk(static_cast<Eigen::Index>(lk), static_cast<Eigen::Index>(m)),
      v(static_cast<Eigen::Index>(lk), static_cast<Eigen::Index>(dv));
  for (Eigen::Index i = 0; i < fq.size(); ++i) fq.data()[i] = feature();
  for (Eigen::Index i = 0; i < fk.size(); ++i) fk.data()[i] = feature();
  for (Eigen::Index i = 0; i < v.size(); ++i) v.data()[i] = attention_element<T>(in);

  const bool valid = o.chunk > 0 && (!eq19 || (m % 2 == 0 && table_dim == m));
  // Eq. 19 looks its positions up in the feature table.
  bool positions_ok = true;
  for (std::size_t i = 0; i < lq && eq19 && !explicit_positions; ++i)
    positions_ok = positions_ok && i < table_positions;
  for (std::size_t j = 0; j < lk && eq19 && !explicit_positions; ++j)
    positions_ok = positions_ok && j < table_positions;
  const std::string where = "linear lq=" + std::to_string(lq) + " lk=" + std::to_string(lk) +
                            " m=" + std::to_string(m) + " eq19=" + std::to_string(eq19) +
                            " table=" + std::to_string(table_dim) + " chunk=" + std::to_string(o.chunk);
  ra::Matrix<T> got;
  try {
    got = eq19 ? ra::linear_eq19(fq, fk, v, ra::Rotation<T>{&table}, o) : ra::linear(fq, fk, v, o);
  } catch (const rope::invalid_argument& e) {
    ROPE_FUZZ_CHECK(!valid, where + ": " + e.what());
    return;
  } catch (const rope::out_of_range& e) {
    ROPE_FUZZ_CHECK(valid && !positions_ok, where + ": " + e.what());
    return;
  }
  ROPE_FUZZ_CHECK(valid && positions_ok, where + ": an invalid call was accepted");
  const auto pos = [&](const std::vector<std::int64_t>& ids, std::size_t i) {
    return ids.empty() ? std::int64_t(i) : ids[i];
  };
  // The forward error bound of a row in T: each numerator term a_j is an
  // m-term dot product of features rotated once (eq. 19), off by at most
  // (m + 8) u A_j where A_j = sum_c |qn_c| |kn_c| over pair magnitudes;
  // the sums over lk keys (in chunks or at once) and the division add
  // (lk + 8) u of their terms' magnitudes; the denominator's terms are
  // positive. Doubled for the second-order terms left out.
  const LD u = unit_roundoff<T>();
  for (std::size_t i = 0; i < lq; ++i) {
    std::vector<LD> qn(m), qd(m);
    for (std::size_t c = 0; c < m; ++c) qn[c] = qd[c] = fq(Eigen::Index(i), Eigen::Index(c));
    const std::vector<LD> q_mag = pair_magnitudes(qn, rope::Style::rotate_half, eq19 ? m : 0);
    if (eq19) qn = rotate_ld(qn, table, rope::Style::rotate_half, m, pos(o.q_positions, i));
    LD den = 0;
    std::vector<LD> num(dv, 0), num_magnitude(dv, 0);
    bool finite = finite_all(qn) && finite_all(qd), seen = false, nan_score = false;
    std::vector<bool> nan_value(dv, false);
    for (std::size_t j = 0; j < lk; ++j) {
      const std::int64_t sq = o.q_sequence.empty() ? 0 : o.q_sequence[i],
                         sk = o.k_sequence.empty() ? 0 : o.k_sequence[j];
      if (sq != sk || (o.causal && pos(o.k_positions, j) > pos(o.q_positions, i))) continue;
      seen = true;
      std::vector<LD> kn(m), kd(m);
      for (std::size_t c = 0; c < m; ++c) kn[c] = kd[c] = fk(Eigen::Index(j), Eigen::Index(c));
      finite = finite && finite_all(kd);
      const LD a_bound = dot_magnitude(q_mag, pair_magnitudes(kn, rope::Style::rotate_half, eq19 ? m : 0));
      if (eq19) kn = rotate_ld(kn, table, rope::Style::rotate_half, m, pos(o.k_positions, j));
      LD a = 0, b = 0;
      for (std::size_t c = 0; c < m; ++c) {
        a += qn[c] * kn[c];
        b += qd[c] * kd[c];
      }
      nan_score = nan_score || std::isnan(a) || std::isnan(b);
      den += b;
      for (std::size_t c = 0; c < dv; ++c) {
        const LD vc = v(Eigen::Index(j), Eigen::Index(c));
        finite = finite && std::isfinite(vc);
        nan_value[c] = nan_value[c] || std::isnan(vc);
        num[c] += a * vc;
        num_magnitude[c] += a_bound * std::fabs(vc);
      }
    }
    if (!seen) {
      for (std::size_t c = 0; c < dv; ++c) ROPE_FUZZ_CHECK(got(Eigen::Index(i), Eigen::Index(c)) == T(0), where);
      continue;
    }
    const std::string at = where + " row " + std::to_string(i);
    if (!finite) {
      check_nan_row(&got(Eigen::Index(i), 0), dv, nan_score, nan_value, at);
      continue;
    }
    for (std::size_t c = 0; c < dv; ++c) {
      const LD g = got(Eigen::Index(i), Eigen::Index(c));
      const LD want = num[c] / den;
      const LD tolerance = 2 * LD(m + lk + 16) * u * 2 * (num_magnitude[c] / den + std::fabs(want));
      ROPE_FUZZ_CHECK(std::isfinite(g), at + ": a row of finite inputs is not finite");
      ROPE_FUZZ_CHECK(std::fabs(g - want) <= tolerance, at + ": off by " + std::to_string(double(std::fabs(g - want))) +
                                                            ", bound " + std::to_string(double(tolerance)));
    }
  }
}

// FAVOR+ over views with grouped heads equals the one-head calls; a broken
// view or option throws and writes nothing.
void linear_views(Bytes& in) {
  const std::size_t l = 1 + in.u8() % 6, hk = 1 + in.u8() % 2, group = 1 + in.u8() % 2, d = 1 + in.u8() % 6,
                    dv = 1 + in.u8() % 3, m = 2 * (1 + in.u8() % 4);
  const std::size_t hq = hk * group;
  ra::FavorOptions fo;
  fo.features = m;
  fo.seed = in.u8();
  const ra::FavorFeatures phi(d, fo);
  const rope::Table<double> table(rope::frequencies(m, 100.0), 16);
  ra::LinearOptions o;
  o.causal = in.flag();
  o.chunk = 1 + in.u8() % 4;
  o.threads = in.u8() % 3;
  auto q = elements<double>(in, l * hq * d), k = elements<double>(in, l * hk * d),
       v = elements<double>(in, l * hk * dv);
  std::vector<double> out(l * hq * dv, -9.0);
  const auto out_before = out;
  rope::View<double> out_view = rope::View<double>::token_major(out.data(), l, hq, dv);
  const bool broken_view = in.u8() % 8 == 0 && hq > 1;
  if (broken_view) out_view.head_stride = 1;
  const bool valid = o.threads > 0 && !(broken_view && dv > 1);
  const auto qv = rope::View<const double>::token_major(q.data(), l, hq, d);
  const auto kv = rope::View<const double>::token_major(k.data(), l, hk, d);
  const auto vv = rope::View<const double>::token_major(v.data(), l, hk, dv);
  try {
    ra::linear_eq19<double>(qv, kv, vv, out_view, phi, {&table}, o);
  } catch (const rope::invalid_argument& e) {
    ROPE_FUZZ_CHECK(!valid, std::string("linear views: ") + e.what());
    ROPE_FUZZ_CHECK(std::memcmp(out.data(), out_before.data(), out.size() * sizeof(double)) == 0, "linear views wrote");
    return;
  }
  ROPE_FUZZ_CHECK(valid, "linear views: an invalid call was accepted");
  if (broken_view) return;
  ra::LinearOptions one = o;
  one.threads = 1;
  for (std::size_t h = 0; h < hq; ++h) {
    ra::Matrix<double> qh(static_cast<Eigen::Index>(l), static_cast<Eigen::Index>(d)),
        kh(static_cast<Eigen::Index>(l), static_cast<Eigen::Index>(d)),
        vh(static_cast<Eigen::Index>(l), static_cast<Eigen::Index>(dv));
    for (std::size_t t = 0; t < l; ++t) {
      for (std::size_t c = 0; c < d; ++c) {
        qh(Eigen::Index(t), Eigen::Index(c)) = q[(t * hq + h) * d + c];
        kh(Eigen::Index(t), Eigen::Index(c)) = k[(t * hk + h / group) * d + c];
      }
      for (std::size_t c = 0; c < dv; ++c) vh(Eigen::Index(t), Eigen::Index(c)) = v[(t * hk + h / group) * dv + c];
    }
    const ra::Matrix<double> want = ra::linear_eq19(qh, kh, vh, phi, ra::Rotation<double>{&table}, one);
    for (std::size_t t = 0; t < l; ++t) {
      for (std::size_t c = 0; c < dv; ++c) {
        const double a = out[(t * hq + h) * dv + c], b = want(Eigen::Index(t), Eigen::Index(c));
        ROPE_FUZZ_CHECK(std::isnan(a) == std::isnan(b), "linear views: NaN where the one-head call has none, or not");
        if (std::isfinite(a) && std::isfinite(b)) {
          ROPE_FUZZ_CHECK(std::fabs(a - b) <= 1e-9 * (1 + std::fabs(b)), "linear views differ from one-head calls");
        }
      }
    }
  }
}

// softmax_step: a cache of `length` of `capacity` tokens, n new tokens,
// positions contiguous from k_offset or given, sometimes a view that
// overlaps the cache or does not fit it. A refused step writes nothing (the
// caches, the output and the length); an accepted one equals its parts done
// by hand: the new keys rotated by rope::apply and the values copied into
// their slots, then softmax over the cache's keys as stored, bit for bit.
template <class T>
void softmax_step_typed(Bytes& in) {
  const std::size_t capacity = 1 + in.u8() % 10, length = in.u8() % (capacity + 2), n = in.u8() % 4;
  const std::size_t hk = 1 + in.u8() % 2, group = 1 + in.u8() % 3, hq = hk * group;
  const std::size_t d = 2 * (1 + in.u8() % 4), dv = 1 + in.u8() % 4, table_positions = 1 + in.u8() % 20;
  const rope::Table<T> table(rope::frequencies(d, 100.0), table_positions);
  const ra::Rotation<T> rotation{&table, in.flag() ? rope::Style::rotate_half : rope::Style::block_diagonal};
  ra::SoftmaxOptions o;
  o.causal = in.flag();
  o.threads = 1 + in.u8() % 3;
  o.k_offset = static_cast<std::int64_t>(in.u8() % (table_positions + 2)) - 1;
  if (in.u8() % 4 == 0) {
    for (std::size_t t = 0; t < n; ++t)
      o.q_positions.push_back(static_cast<std::int64_t>(in.u8() % (table_positions + 1)));
  }
  auto k_cache = elements<T>(in, capacity * hk * d), v_cache = elements<T>(in, capacity * hk * dv);
  auto q = elements<T>(in, n * hq * d), k_new = elements<T>(in, n * hk * d), v_new = elements<T>(in, n * hk * dv);
  std::vector<T> out(std::max<std::size_t>(n * hq * dv, 1), T(-9));
  ra::KvCache<T> cache{rope::View<T>::token_major(k_cache.data(), capacity, hk, d),
                       rope::View<T>::token_major(v_cache.data(), capacity, hk, dv), length};
  rope::View<const T> k_view = rope::View<const T>::token_major(k_new.data(), n, hk, d);
  const std::uint8_t view_break = in.u8() % 8;
  if (view_break == 0 && n > 0 && n <= capacity)
    k_view = rope::View<const T>(cache.k.slice_tokens(0, n));  // in the cache
  const auto k_before = k_cache, v_before = v_cache, out_before = out;
  const std::string where = "softmax_step capacity=" + std::to_string(capacity) + " length=" + std::to_string(length) +
                            " n=" + std::to_string(n) + " break=" + std::to_string(view_break);
  bool threw = false;
  try {
    ra::softmax_step<T>(rope::View<const T>::token_major(q.data(), n, hq, d), k_view,
                        rope::View<const T>::token_major(v_new.data(), n, hk, dv), cache,
                        rope::View<T>::token_major(out.data(), n, hq, dv), rotation, o);
  } catch (const rope::invalid_argument& e) {
    threw = true;
    ROPE_FUZZ_CHECK(std::string(e.what()).find("rope::attention::softmax_step: ") == 0, e.what());
  } catch (const rope::out_of_range& e) {
    threw = true;
    ROPE_FUZZ_CHECK(std::string(e.what()).find("rope::attention::softmax_step: ") == 0, e.what());
  }
  if (threw) {
    ROPE_FUZZ_CHECK(cache.length == length, where + ": length changed");
    ROPE_FUZZ_CHECK(std::memcmp(k_cache.data(), k_before.data(), k_cache.size() * sizeof(T)) == 0,
                    where + ": k written");
    ROPE_FUZZ_CHECK(std::memcmp(v_cache.data(), v_before.data(), v_cache.size() * sizeof(T)) == 0,
                    where + ": v written");
    ROPE_FUZZ_CHECK(std::memcmp(out.data(), out_before.data(), out.size() * sizeof(T)) == 0, where + ": out written");
    return;
  }
  ROPE_FUZZ_CHECK(view_break != 0 || n == 0 || n > capacity, where + ": a k_new inside the cache was accepted");
  ROPE_FUZZ_CHECK(length + n <= capacity && cache.length == length + n, where + ": the length");
  // The same step by hand: rotated keys and values in the slots, then
  // softmax over the cache as stored.
  auto k_want = k_before, v_want = v_before;
  std::vector<std::int64_t> new_positions(n);
  for (std::size_t t = 0; t < n; ++t) {
    new_positions[t] = o.q_positions.empty() ? o.k_offset + static_cast<std::int64_t>(length + t) : o.q_positions[t];
  }
  const std::size_t total = length + n;
  if (n > 0) {
    rope::apply<T>(rope::View<const T>::token_major(k_new.data(), n, hk, d),
                   rope::View<T>::token_major(k_want.data() + length * hk * d, n, hk, d), table, rotation.style,
                   new_positions.data());
    std::memcpy(v_want.data() + length * hk * dv, v_new.data(), n * hk * dv * sizeof(T));
  }
  ROPE_FUZZ_CHECK(std::memcmp(k_cache.data(), k_want.data(), k_cache.size() * sizeof(T)) == 0, where + ": k slots");
  ROPE_FUZZ_CHECK(std::memcmp(v_cache.data(), v_want.data(), v_cache.size() * sizeof(T)) == 0, where + ": v slots");
  ra::SoftmaxOptions plain = o;
  plain.keys_rotated = true;
  plain.q_offset = o.k_offset + static_cast<std::int64_t>(length);
  if (!o.q_positions.empty()) {
    plain.k_positions.clear();
    for (std::size_t j = 0; j < length; ++j) plain.k_positions.push_back(o.k_offset + static_cast<std::int64_t>(j));
    plain.k_positions.insert(plain.k_positions.end(), new_positions.begin(), new_positions.end());
  }
  std::vector<T> want(out.size(), T(-9));
  ra::softmax<T>(rope::View<const T>::token_major(q.data(), n, hq, d),
                 rope::View<const T>::token_major(k_want.data(), total, hk, d),
                 rope::View<const T>::token_major(v_want.data(), total, hk, dv),
                 rope::View<T>::token_major(want.data(), n, hq, dv), rotation, plain);
  ROPE_FUZZ_CHECK(std::memcmp(out.data(), want.data(), out.size() * sizeof(T)) == 0, where + ": the output");
}

// A pool of K or V rows for the batch decoders, its rows filled through
// store_kv_row (int8: with their scales), or with a broken scales pointer.
template <class E>
struct PoolData {
  std::vector<E> data;
  std::vector<float> scales;
  ra::PagePool<E> pool;
};

template <class E>
void make_pool(PoolData<E>& p, Bytes& in, std::size_t pages, std::size_t page_size, std::size_t heads, std::size_t dim,
               bool hnd) {
  constexpr bool scaled = rope::KvElement<E>::kScaled;
  p.data.assign(pages * page_size * heads * dim, E{});
  p.scales.assign(pages * page_size * heads, 0.0f);
  float* scales = scaled ? p.scales.data() : nullptr;
  p.pool = hnd ? ra::PagePool<E>::hnd(p.data.data(), pages, page_size, heads, dim, scales)
               : ra::PagePool<E>::nhd(p.data.data(), pages, page_size, heads, dim, scales);
  std::vector<float> row(dim);
  for (std::size_t slot = 0; slot < p.pool.slots(); ++slot) {
    for (std::size_t h = 0; h < heads; ++h) {
      for (auto& x : row) x = attention_element<float>(in);
      rope::store_kv_row(row.data(), dim, p.pool.row(slot, h), scaled ? p.pool.scale(slot, h) : nullptr);
    }
  }
}

// Value c of row (slot, h) as the cache means it: widened, times its scale.
template <class E>
LD stored(const ra::PagePool<E>& p, std::size_t slot, std::size_t h, std::size_t c) {
  const LD x = rope::detail::widen_value(p.row(slot, h)[c]);
  return rope::KvElement<E>::kScaled ? x * LD(*p.scale(slot, h)) : x;
}

template <class E>
bool same_pool(const PoolData<E>& p, const std::vector<E>& data, const std::vector<float>& scales) {
  return std::memcmp(p.data.data(), data.data(), data.size() * sizeof(E)) == 0 &&
         std::memcmp(p.scales.data(), scales.data(), scales.size() * sizeof(float)) == 0;
}

template <class T>
T from_float(float x) {
  if constexpr (std::is_same<T, float>::value) {
    return x;
  } else {
    return T(x);
  }
}

// softmax_batch over a paged cache of E: random sequences (new tokens,
// lengths, block tables with ids outside the pool), options (scale, softcap,
// sinks, window, rotation, kv_split, threads) and broken views. A refused
// call throws and writes nothing; an accepted one leaves the pools as they
// were, equals a long-double recomputation over the dequantized cache on
// every row that sees only finite values, and is the same bytes with one
// thread.
template <class E>
void batch_typed(Bytes& in) {
  const std::size_t pages = 1 + in.u8() % 6, ps = 1 + in.u8() % 5, hk = 1 + in.u8() % 2, group = 1 + in.u8() % 3;
  const std::size_t hq = hk * group, d = 1 + in.u8() % 9, dv = 1 + in.u8() % 6;
  const bool hnd = in.flag();
  const std::size_t sequences = in.u8() % 4, stride = in.u8() % 4, capacity = stride * ps;
  std::vector<std::int64_t> n(sequences), lengths(sequences), q_starts(sequences + 1, 0);
  for (std::size_t b = 0; b < sequences; ++b) {
    n[b] = in.u8() % 4;
    q_starts[b + 1] = q_starts[b] + n[b];
    const std::uint8_t kind = in.u8() % 16;
    const auto room = static_cast<std::int64_t>(capacity) - n[b];
    lengths[b] = kind == 0   ? n[b] - 1
                 : kind == 1 ? static_cast<std::int64_t>(capacity) + 1
                             : n[b] + (room >= 0 ? static_cast<std::int64_t>(in.u8() % (room + 1)) : 0);
  }
  std::vector<std::int32_t> block_table(std::max<std::size_t>(sequences * stride, 1));
  for (auto& id : block_table) {
    id = in.u8() % 16 == 0 ? (in.flag() ? -1 : static_cast<std::int32_t>(pages))
                           : static_cast<std::int32_t>(in.u8() % pages);
  }
  // Breaks are read before the long arrays, and 0 (what a short input reads)
  // breaks nothing.
  const std::uint8_t starts_break = in.u8() % 16, view_break = in.u8() % 16;
  const std::size_t tokens = static_cast<std::size_t>(q_starts[sequences]) + (starts_break == 2 ? 1 : 0);
  if (starts_break == 1) q_starts[0] = 1;

  const bool rotate = in.flag();
  const std::size_t table_dim = 2 * (1 + in.u8() % 4), table_positions = 1 + in.u8() % 16;
  const rope::Table<float> table(rope::frequencies(table_dim, 100.0), table_positions);
  ra::BatchOptions o;
  if (rotate) {
    o.rotation.table = &table;
    o.rotation.style = in.flag() ? rope::Style::rotate_half : rope::Style::block_diagonal;
    o.rotation.rotary_dim = in.u8() % 4 == 0 ? in.u8() % 10 : 0;
  }
  o.causal = in.flag();
  o.window = in.u8() % 4 == 0 ? in.u8() % 5 : 0;
  if (in.flag()) o.scale = in.u8() % 32 == 0 ? std::nan("") : 0.05 + in.u8() / 256.0;
  if (in.u8() % 4 == 0) {
    const double caps[] = {0.5, 5.0, 30.0, 0.0, -1.0, std::nan("")};
    o.softcap = caps[in.u8() % 6];
  }
  if (in.u8() % 4 == 0) {
    const std::size_t count = in.u8() % 8 == 0 ? hq + 1 : hq;
    for (std::size_t h = 0; h < count; ++h) {
      const std::uint8_t kind = in.u8() % 16;
      o.sinks.push_back(kind == 0   ? -std::numeric_limits<double>::infinity()
                        : kind == 1 ? std::nan("")
                        : kind == 2 ? 1e300
                        : kind == 3 ? -1e300
                                    : (static_cast<int>(in.u8()) - 128) / 32.0);
    }
  }
  const std::size_t splits[] = {1, 2, 3, 5, 512, 0};
  o.kv_split = splits[in.u8() % 6];
  o.threads = in.u8() % 4;

  PoolData<E> kp, vp;
  make_pool(kp, in, pages, ps, hk, d, hnd);
  make_pool(vp, in, pages, ps, hk, dv, hnd);
  const ra::PagedCache<E> cache{kp.pool, vp.pool};
  auto q = elements<float>(in, tokens * hq * d);
  std::vector<float> out(tokens * hq * (dv + 1) + 1, -9.0f);
  rope::View<float> out_view = rope::View<float>::token_major(out.data(), tokens, hq, dv);
  bool views_ok = true;
  if (view_break == 1) {
    out_view.data = nullptr;
    views_ok = false;
  } else if (view_break == 2 && tokens > 0 && dv <= d) {
    out_view = rope::View<float>::token_major(q.data(), tokens, hq, dv);  // over q's rows
    views_ok = false;
  } else if (view_break == 3 && tokens > 0 && tokens * hq * dv * sizeof(float) <= kp.data.size() * sizeof(E)) {
    out_view = rope::View<float>::token_major(reinterpret_cast<float*>(kp.data.data()), tokens, hq, dv);
    views_ok = false;
  } else if (view_break == 4) {
    out_view = rope::View<float>::token_major(out.data(), tokens, hq, dv + 1);  // not the cache's dv
    views_ok = false;
  }
  const auto q_before = q, out_before = out;
  const auto kd = kp.data, vd = vp.data;
  const auto ks = kp.scales, vs = vp.scales;
  const ra::Batch batch{q_starts.data(), lengths.data(), block_table.data(), stride, sequences};

  // Validity, judged here from the documentation.
  const std::size_t r = rotate ? (o.rotation.rotary_dim == 0 ? table_dim : o.rotation.rotary_dim) : 0;
  bool valid = views_ok && (starts_break == 0 || starts_break > 2) && o.threads > 0 && o.kv_split > 0 &&
               (!o.scale || std::isfinite(*o.scale)) && (!o.softcap || (*o.softcap > 0 && std::isfinite(*o.softcap)));
  if (!o.sinks.empty()) {
    valid = valid && o.sinks.size() == hq;
    for (double s : o.sinks) {
      const float f = static_cast<float>(s);
      valid = valid && (std::isfinite(f) || f == -std::numeric_limits<float>::infinity());
    }
  }
  if (rotate) valid = valid && r % 2 == 0 && r <= table_dim && r <= d;
  for (std::size_t b = 0; b < sequences; ++b) {
    valid = valid && lengths[b] >= n[b] && lengths[b] <= static_cast<std::int64_t>(capacity);
    if (!valid) break;
    for (std::int64_t j = 0; j < lengths[b]; j += static_cast<std::int64_t>(ps)) {
      const std::size_t i = static_cast<std::size_t>(j) / ps;
      const std::int32_t id = block_table[b * stride + i];
      valid = valid && id >= 0 && id < static_cast<std::int32_t>(pages);
      // A page twice in one sequence's pages is refused.
      for (std::size_t u = 0; u < i; ++u) valid = valid && block_table[b * stride + u] != id;
    }
    if (rotate && n[b] > 0) valid = valid && lengths[b] - 1 < static_cast<std::int64_t>(table_positions);
  }
  std::string where = "softmax_batch pages=" + std::to_string(pages) + "x" + std::to_string(ps) +
                      " heads=" + std::to_string(hq) + "/" + std::to_string(hk) + " d=" + std::to_string(d) +
                      " dv=" + std::to_string(dv) + " sequences=" + std::to_string(sequences) +
                      " split=" + std::to_string(o.kv_split) + " break=" + std::to_string(view_break) + "/" +
                      std::to_string(starts_break);
  const auto qv = rope::View<const float>::token_major(q.data(), tokens, hq, d);
  bool threw = false;
  try {
    ra::softmax_batch(qv, cache, batch, out_view, o);
  } catch (const rope::invalid_argument& e) {
    threw = true;
    ROPE_FUZZ_CHECK(!valid, where + ": " + e.what());
    ROPE_FUZZ_CHECK(std::string(e.what()).find("rope::attention::softmax_batch: ") == 0, e.what());
  } catch (const rope::out_of_range& e) {
    threw = true;
    ROPE_FUZZ_CHECK(!valid, where + ": " + e.what());
  }
  ROPE_FUZZ_CHECK(same_pool(kp, kd, ks) && same_pool(vp, vd, vs), where + ": the cache written");
  ROPE_FUZZ_CHECK(std::memcmp(q.data(), q_before.data(), q.size() * sizeof(float)) == 0, where + ": q written");
  if (threw) {
    ROPE_FUZZ_CHECK(std::memcmp(out.data(), out_before.data(), out.size() * sizeof(float)) == 0,
                    where + ": out written");
    return;
  }
  ROPE_FUZZ_CHECK(valid, where + ": an invalid call was accepted");

  if (o.threads > 1) {
    std::vector<float> one(out.size(), -9.0f);
    ra::BatchOptions single = o;
    single.threads = 1;
    ra::softmax_batch(qv, cache, batch, rope::View<float>::token_major(one.data(), tokens, hq, dv), single);
    ROPE_FUZZ_CHECK(std::memcmp(out.data(), one.data(), out.size() * sizeof(float)) == 0,
                    where + ": not the same bytes with one thread");
  }

  // The oracle: each row recomputed in long double over the dequantized
  // cache, from the positions the lengths give.
  const LD scale = o.scale ? LD(static_cast<float>(*o.scale)) : LD(static_cast<float>(1.0 / std::sqrt(double(d))));
  for (std::size_t b = 0; b < sequences; ++b) {
    const std::int32_t* row = block_table.data() + b * stride;
    for (std::int64_t i = 0; i < n[b]; ++i) {
      const std::size_t t = static_cast<std::size_t>(q_starts[b] + i);
      const std::int64_t p = lengths[b] - n[b] + i;
      for (std::size_t h = 0; h < hq; ++h) {
        const std::size_t g = h / group;
        const std::vector<LD> q_raw = head_row(q, t, h, hq, d);
        const std::vector<LD> q_mag = pair_magnitudes(q_raw, o.rotation.style, rotate ? r : 0);
        std::vector<LD> qi = q_raw;
        if (rotate) qi = rotate_ld(qi, table, o.rotation.style, r, p);
        bool finite = finite_all(qi), nan_score = false;
        std::vector<bool> nan_value(dv, false);
        std::vector<LD> scores, bounds;
        std::vector<std::size_t> keys;
        LD magnitude = 0;
        for (std::int64_t j = 0; j < lengths[b]; ++j) {
          if (o.causal && j > p) continue;
          if (o.window > 0 && j <= p - static_cast<std::int64_t>(o.window)) continue;
          const std::size_t slot = static_cast<std::size_t>(row[j / std::int64_t(ps)]) * ps + std::size_t(j) % ps;
          LD s = 0, m = 0;
          for (std::size_t c = 0; c < d; ++c) {
            const LD kc = stored(kp.pool, slot, g, c);
            finite = finite && std::isfinite(kc);
            s += qi[c] * kc;
            m += q_mag[c] * std::fabs(kc);
          }
          for (std::size_t c = 0; c < dv; ++c) {
            const LD vc = stored(vp.pool, slot, g, c);
            finite = finite && std::isfinite(vc);
            nan_value[c] = nan_value[c] || std::isnan(vc);
            magnitude = std::max(magnitude, std::fabs(vc));
          }
          nan_score = nan_score || std::isnan(s);
          s *= scale;
          if (o.softcap) {
            const LD cap = static_cast<float>(*o.softcap);
            s = cap * std::tanh(s / cap);
          }
          scores.push_back(s);
          bounds.push_back(m * scale);
          keys.push_back(slot);
        }
        const float* got = out.data() + (t * hq + h) * dv;
        const std::string at =
            where + ": sequence " + std::to_string(b) + " token " + std::to_string(t) + " head " + std::to_string(h);
        if (keys.empty()) {
          for (std::size_t c = 0; c < dv; ++c) ROPE_FUZZ_CHECK(got[c] == 0.0f, at + ": a row that sees no key");
          continue;
        }
        if (!finite) {  // only the rows that see a non-finite value are concerned
          check_nan_row(got, dv, nan_score, nan_value, at);
          continue;
        }
        const float sink = o.sinks.empty() ? -std::numeric_limits<float>::infinity() : static_cast<float>(o.sinks[h]);
        LD top = *std::max_element(scores.begin(), scores.end());
        if (std::isfinite(sink)) top = std::max(top, LD(sink));
        const LD u = unit_roundoff<float>();
        LD sum = std::isfinite(sink) ? std::exp(LD(sink) - top) : 0;
        LD max_delta = std::isfinite(sink) ? 8 * u * (std::fabs(LD(sink)) + std::fabs(top) + 1) : 0;
        std::vector<LD> want(dv, 0);
        for (std::size_t k = 0; k < keys.size(); ++k) {
          const LD w = std::exp(scores[k] - top);
          sum += w;
          max_delta =
              std::max(max_delta, u * (LD(d + 8) * bounds[k] + 8 * (std::fabs(scores[k]) + std::fabs(top) + 1)));
          for (std::size_t c = 0; c < dv; ++c) want[c] += w * stored(vp.pool, keys[k], g, c);
        }
        const LD tolerance = softmax_row_bound<float>(max_delta, keys.size(), magnitude);
        for (std::size_t c = 0; c < dv; ++c) {
          ROPE_FUZZ_CHECK(std::isfinite(got[c]), at + ": a row of finite inputs is not finite");
          ROPE_FUZZ_CHECK(std::fabs(LD(got[c]) - want[c] / sum) <= tolerance,
                          at + ": got " + std::to_string(got[c]) + ", want " + std::to_string(double(want[c] / sum)) +
                              ", bound " + std::to_string(double(tolerance)));
        }
      }
    }
  }
}

// write_slots of In rows into a paged cache of E: slots of -1 (skip), below
// -1, outside the pool and written twice; broken views, rows already in the
// cache (at their own slots: accepted, rotated in place; elsewhere:
// refused), a broken scales pointer, rotation with positions in and outside
// the table. A refused call throws and writes nothing; an accepted one writes
// exactly the named slots, each value within one rounding into E of the
// long-double rotation of its input, and nothing else.
template <class E, class In>
void write_slots_typed(Bytes& in) {
  constexpr bool scaled = rope::KvElement<E>::kScaled;
  const std::size_t pages = 1 + in.u8() % 4, ps = 1 + in.u8() % 4, hk = 1 + in.u8() % 2, d = 1 + in.u8() % 8,
                    dv = 1 + in.u8() % 5;
  const bool hnd = in.flag();
  // Read before the long arrays; 0 (what a short input reads) breaks nothing.
  const std::uint8_t view_break = in.u8() % 16;
  const std::size_t slot_count = pages * ps, n = in.u8() % 5;
  std::vector<std::int64_t> slots(std::max<std::size_t>(n, 1), -1);
  for (std::size_t t = 0; t < n; ++t) {
    const std::uint8_t kind = in.u8() % 8;
    slots[t] = kind == 0   ? -1
               : kind == 1 ? static_cast<std::int64_t>(slot_count + in.u8() % 2)
               : kind == 2 ? -2 - static_cast<std::int64_t>(in.u8() % 3)
               : kind == 3 ? (t > 0 ? slots[in.u8() % t] : -1)
                           : static_cast<std::int64_t>(in.u8() % slot_count);
  }
  const bool rotate = in.flag();
  const std::size_t table_dim = 2 * (1 + in.u8() % 4), table_positions = 1 + in.u8() % 12;
  const rope::Table<float> table(rope::frequencies(table_dim, 100.0), table_positions);
  ra::WriteOptions o;
  std::vector<std::int64_t> positions(std::max<std::size_t>(n, 1), 0);
  if (rotate) {
    o.rotation.table = &table;
    o.rotation.style = in.flag() ? rope::Style::rotate_half : rope::Style::block_diagonal;
    o.rotation.rotary_dim = in.u8() % 4 == 0 ? in.u8() % 10 : 0;
    for (std::size_t t = 0; t < n; ++t) {
      positions[t] = in.u8() % 16 == 0 ? (in.flag() ? -1 : static_cast<std::int64_t>(table_positions))
                                       : static_cast<std::int64_t>(in.u8() % table_positions);
    }
    o.positions = positions.data();
  }
  PoolData<E> kp, vp;
  make_pool(kp, in, pages, ps, hk, d, hnd);
  make_pool(vp, in, pages, ps, hk, dv, hnd);
  std::vector<In> k_new((n + 1) * hk * (d + 1)), v_new((n + 1) * hk * dv);
  for (auto& x : k_new) x = from_float<In>(attention_element<float>(in));
  for (auto& x : v_new) x = from_float<In>(attention_element<float>(in));
  rope::View<const In> kv = rope::View<const In>::token_major(k_new.data(), n, hk, d);
  rope::View<const In> vv = rope::View<const In>::token_major(v_new.data(), n, hk, dv);
  const std::int64_t* slot_ptr = slots.data();
  bool valid = true, in_place = false;
  std::size_t first_slot = 0;
  if (view_break == 1) {
    kv.data = nullptr;
    valid = false;
  } else if (view_break == 2) {
    vv.tokens = n + 1;
    valid = false;
  } else if (view_break == 3) {
    kv = rope::View<const In>::token_major(k_new.data(), n, hk, d + 1);
    valid = false;
  } else if constexpr (std::is_same<E, In>::value) {
    if (view_break == 4 && n <= ps) {
      // Rows of one page as k_new: in place when each token writes its own row.
      const std::size_t p = in.u8() % pages, offset = in.u8() % (ps - n + 1);
      first_slot = p * ps + offset;
      if (in.flag()) {
        for (std::size_t t = 0; t < n; ++t) slots[t] = static_cast<std::int64_t>(first_slot + t);
      }
      kv = rope::View<const In>(kp.pool.page(p).slice_tokens(offset, n));
      in_place = true;
      for (std::size_t t = 0; t < n; ++t) valid = valid && slots[t] == static_cast<std::int64_t>(first_slot + t);
    } else if (view_break == 5 && n > 0 && n <= ps) {
      kv = rope::View<const In>(vp.pool.page(0).slice_tokens(0, n));  // k_new inside cache.v
      valid = false;
    }
  }
  if (view_break == 6) {
    (scaled ? kp.pool.scales : vp.pool.scales) = scaled ? nullptr : vp.scales.data();
    valid = false;
  } else if (view_break == 7) {
    slot_ptr = nullptr;
    valid = valid && n == 0;
  } else if (view_break == 8 && rotate) {
    o.positions = nullptr;  // needed only for tokens to rotate
    valid = valid && n == 0;
  }
  const ra::PagedCache<E> cache{kp.pool, vp.pool};
  const auto kd = kp.data, vd = vp.data;
  const auto ks = kp.scales, vs = vp.scales;
  const auto k_input = k_new, v_input = v_new;

  // Validity, judged here from the documentation.
  const std::size_t r = rotate ? (o.rotation.rotary_dim == 0 ? table_dim : o.rotation.rotary_dim) : 0;
  if (slot_ptr != nullptr) {
    for (std::size_t t = 0; t < n; ++t) {
      valid = valid && slots[t] >= -1 && slots[t] < static_cast<std::int64_t>(slot_count);
      for (std::size_t u = 0; u < t; ++u) valid = valid && (slots[t] < 0 || slots[u] != slots[t]);
    }
  }
  if (rotate) valid = valid && r % 2 == 0 && r <= table_dim && r <= d;
  bool positions_ok = true;
  for (std::size_t t = 0; t < n && rotate && o.positions != nullptr; ++t) {
    positions_ok = positions_ok && positions[t] >= 0 && positions[t] < static_cast<std::int64_t>(table_positions);
  }
  const std::string where = "write_slots pages=" + std::to_string(pages) + "x" + std::to_string(ps) +
                            " heads=" + std::to_string(hk) + " d=" + std::to_string(d) + "/" + std::to_string(dv) +
                            " n=" + std::to_string(n) + " r=" + std::to_string(r) +
                            " break=" + std::to_string(view_break);
  bool threw = false;
  try {
    ra::write_slots(kv, vv, slot_ptr, cache, o);
  } catch (const rope::invalid_argument& e) {
    threw = true;
    ROPE_FUZZ_CHECK(!valid, where + ": " + e.what());
    ROPE_FUZZ_CHECK(std::string(e.what()).find("rope::attention::write_slots: ") == 0, e.what());
  } catch (const rope::out_of_range& e) {
    threw = true;
    ROPE_FUZZ_CHECK(valid && !positions_ok, where + ": " + e.what());
  }
  ROPE_FUZZ_CHECK(std::memcmp(v_new.data(), v_input.data(), v_new.size() * sizeof(In)) == 0, where + ": v_new written");
  if (!in_place) {
    ROPE_FUZZ_CHECK(std::memcmp(k_new.data(), k_input.data(), k_new.size() * sizeof(In)) == 0,
                    where + ": k_new written");
  }
  if (threw) {
    ROPE_FUZZ_CHECK(same_pool(kp, kd, ks) && same_pool(vp, vd, vs), where + ": a refused call wrote the cache");
    return;
  }
  ROPE_FUZZ_CHECK(valid && positions_ok, where + ": an invalid call was accepted");

  // Every slot no token names is as it was; a named one holds its token's
  // row, rotated, rounded once.
  std::vector<std::int64_t> writer(slot_count, -1);
  for (std::size_t t = 0; t < n; ++t) {
    if (slots[t] >= 0) writer[static_cast<std::size_t>(slots[t])] = static_cast<std::int64_t>(t);
  }
  // The pools before, to read their rows.
  std::vector<E> k_old_data = kd, v_old_data = vd;
  std::vector<float> k_old_scales = ks, v_old_scales = vs;
  ra::PagePool<E> k_old = kp.pool, v_old = vp.pool;
  k_old.data = k_old_data.data();
  v_old.data = v_old_data.data();
  k_old.scales = scaled ? k_old_scales.data() : nullptr;
  v_old.scales = scaled ? v_old_scales.data() : nullptr;
  const auto check_rows = [&](const PoolData<E>& now, const ra::PagePool<E>& old, std::size_t dim, bool is_k) {
    for (std::size_t s = 0; s < slot_count; ++s) {
      for (std::size_t h = 0; h < hk; ++h) {
        const std::string at =
            where + (is_k ? ": k" : ": v") + " slot " + std::to_string(s) + " head " + std::to_string(h);
        if (writer[s] < 0) {
          ROPE_FUZZ_CHECK(std::memcmp(now.pool.row(s, h), old.row(s, h), dim * sizeof(E)) == 0, at + " changed");
          if (scaled) ROPE_FUZZ_CHECK(std::memcmp(now.pool.scale(s, h), old.scale(s, h), 4) == 0, at + " scale");
          continue;
        }
        const auto t = static_cast<std::size_t>(writer[s]);
        std::vector<LD> x(dim);
        for (std::size_t c = 0; c < dim; ++c) {
          x[c] = in_place && is_k ? LD(rope::detail::widen_value(old.row(first_slot + t, h)[c]))
                                  : LD(rope::detail::widen_value(is_k ? kv.row(t, h)[c] : vv.row(t, h)[c]));
        }
        if (is_k && rotate) x = rotate_ld(x, table, o.rotation.style, r, positions[t]);
        if (!finite_all(x)) {
          if (scaled) {
            ROPE_FUZZ_CHECK(std::isnan(*now.pool.scale(s, h)), at + ": a non-finite row's scale is not NaN");
            for (std::size_t c = 0; c < dim; ++c)
              ROPE_FUZZ_CHECK(rope::detail::widen_value(now.pool.row(s, h)[c]) == 0.0f, at + ": not 0");
          }
          continue;
        }
        LD top = 0;
        for (LD v : x) top = std::max(top, std::fabs(v));
        const LD slack = 1e-6L * (1 + top);
        if (scaled) {
          ROPE_FUZZ_CHECK(std::fabs(LD(*now.pool.scale(s, h)) - top / 127) <= slack, at + ": the scale");
        }
        for (std::size_t c = 0; c < dim; ++c) {
          const LD got = stored(now.pool, s, h, c), ax = std::fabs(x[c]);
          const LD bound = std::is_same<E, float>::value            ? slack
                           : std::is_same<E, rope::BFloat16>::value ? ax / 256 + slack
                           : std::is_same<E, rope::Float16>::value  ? ax / 1024 + std::ldexp(1.0L, -24) + slack
                                                                    : top / 254 * (1 + 1e-5L) + slack;
          ROPE_FUZZ_CHECK(std::fabs(got - x[c]) <= bound, at + " channel " + std::to_string(c) + ": got " +
                                                              std::to_string(double(got)) + ", want " +
                                                              std::to_string(double(x[c])));
        }
      }
    }
  };
  check_rows(kp, k_old, d, true);
  check_rows(vp, v_old, dv, false);
}

template <class E>
void write_slots_any(Bytes& in) {
  if (in.flag()) {
    write_slots_typed<E, float>(in);
  } else {
    write_slots_typed<E, rope::BFloat16>(in);
  }
}

// RMSNorm in float, in the order append.hpp documents: eight fused sums
// (channel c into sum c % 8), added pairwise as written there, then
// r = 1 / sqrt(ss / n + eps) and y = (x r) w (or (x r)(1 + w)).
std::vector<float> rms_norm_float(std::vector<float> x, const float* w, float eps, bool plus_one) {
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

// |got - want| within one rounding of a value of type E (int8: of its
// vector's scale), want the long-double value, top the largest |want| of its
// row.
template <class E>
bool within_one_rounding(LD got, LD want, LD top) {
  const LD slack = 1e-6L * (1 + top), ax = std::fabs(want);
  const LD bound = std::is_same<E, float>::value            ? slack
                   : std::is_same<E, rope::BFloat16>::value ? ax / 256 + slack
                   : std::is_same<E, rope::Float16>::value  ? ax / 1024 + std::ldexp(1.0L, -24) + slack
                                                            : top / 254 * (1 + 1e-5L) + slack;
  return std::fabs(got - want) <= bound;
}

// norm_rope_append of In rows (float or bfloat16) into a paged cache of E,
// q_out float (apart, or q itself for float rows): per-head, whole-projection
// or no norm on either side, plus_one, eps valid or not (0, NaN, negative,
// infinite, below float's least subnormal), slots of -1, below -1, outside
// the pool and twice, positions from an offset or ids (some outside the
// table), write_back_k, and broken views, weights and scales. A refused call
// throws the function's exception and writes nothing; an accepted one writes
// q_out, the named slots (and k with write_back_k), each value within one
// rounding of the long-double rotation of the float RMSNorm (the documented
// order, replicated) of its input, and nothing else.
template <class E, class In>
void append_typed(Bytes& in) {
  constexpr bool scaled = rope::KvElement<E>::kScaled;
  constexpr bool float_rows = std::is_same<In, float>::value;
  const std::size_t pages = 1 + in.u8() % 4, ps = 1 + in.u8() % 4, hk = 1 + in.u8() % 2, group = 1 + in.u8() % 3,
                    d = 1 + in.u8() % 8, dv = 1 + in.u8() % 5;
  const std::size_t hq = hk * group;
  const bool hnd = in.flag();
  // Read before the long arrays; 0 (what a short input reads) breaks nothing.
  const std::uint8_t view_break = in.u8() % 16;
  const std::size_t slot_count = pages * ps, n = in.u8() % 5;
  std::vector<std::int64_t> slots(std::max<std::size_t>(n, 1), -1);
  for (std::size_t t = 0; t < n; ++t) {
    const std::uint8_t kind = in.u8() % 8;
    slots[t] = kind == 0   ? -1
               : kind == 1 ? static_cast<std::int64_t>(slot_count + in.u8() % 2)
               : kind == 2 ? -2 - static_cast<std::int64_t>(in.u8() % 3)
               : kind == 3 ? (t > 0 ? slots[in.u8() % t] : -1)
                           : static_cast<std::int64_t>(in.u8() % slot_count);
  }
  // The norm: 0 none, 1 per head, 2 over the whole projection.
  const std::uint8_t norm_mode = in.u8() % 3, sides = in.u8() % 4;  // sides 1: Q only, 2: K only, else both
  ra::AppendOptions o;
  o.whole_projection = norm_mode == 2;
  o.plus_one = in.flag();
  o.write_back_k = in.flag();
  o.threads = 1 + in.u8() % 3;
  const double eps_values[] = {1e-6, 1e-5, 1e-3, 0.0, std::nan(""), -1e-6, HUGE_VAL, 1e-60};
  o.eps = eps_values[in.u8() % 8];
  const bool q_in_place = float_rows && in.flag();
  const std::size_t q_size = o.whole_projection ? hq * d : d, k_size = o.whole_projection ? hk * d : d;
  std::vector<float> q_weight(q_size + 1), k_weight(k_size + 1);
  for (auto& w : q_weight) w = static_cast<float>((static_cast<int>(in.u8()) - 127) / 64.0);
  for (auto& w : k_weight) w = static_cast<float>((static_cast<int>(in.u8()) - 127) / 64.0);
  if (norm_mode != 0) {
    if (sides != 2) o.q_norm = {q_weight.data(), q_size};
    if (sides != 1) o.k_norm = {k_weight.data(), k_size};
  }
  const bool rotate = in.flag();
  const std::size_t table_dim = 2 * (1 + in.u8() % 4), table_positions = 1 + in.u8() % 12;
  const rope::Table<float> table(rope::frequencies(table_dim, 100.0), table_positions);
  if (rotate) {
    o.rotation.table = &table;
    o.rotation.style = in.flag() ? rope::Style::rotate_half : rope::Style::block_diagonal;
    o.rotation.rotary_dim = in.u8() % 4 == 0 ? in.u8() % 10 : 0;
  }
  const bool by_id = in.flag();
  std::vector<std::int64_t> ids(std::max<std::size_t>(n, 1), 0);
  const auto position = [&]() {
    return in.u8() % 16 == 0 ? (in.flag() ? std::int64_t(-1) : static_cast<std::int64_t>(table_positions))
                             : static_cast<std::int64_t>(in.u8() % table_positions);
  };
  std::int64_t offset = 0;
  if (by_id) {
    for (std::size_t t = 0; t < n; ++t) ids[t] = position();
  } else {
    offset = position();
  }
  const auto pos = [&](std::size_t t) { return by_id ? ids[t] : offset + static_cast<std::int64_t>(t); };

  PoolData<E> kp, vp;
  make_pool(kp, in, pages, ps, hk, d, hnd);
  make_pool(vp, in, pages, ps, hk, dv, hnd);
  // k's buffer is large enough for q_out over it and for rows of d + 1.
  std::vector<In> q((n + 1) * hq * d), k((n + 1) * hq * (d + 1)), v((n + 1) * hk * dv);
  for (auto& x : q) x = from_float<In>(attention_element<float>(in));
  for (auto& x : k) x = from_float<In>(attention_element<float>(in));
  for (auto& x : v) x = from_float<In>(attention_element<float>(in));
  std::vector<float> q_out_data((n + 1) * hq * d, -9.0f);

  rope::View<In> qv = rope::View<In>::token_major(q.data(), n, hq, d);
  rope::View<In> kv = rope::View<In>::token_major(k.data(), n, hk, d);
  rope::View<In> vv = rope::View<In>::token_major(v.data(), n, hk, dv);
  rope::View<float> ov = rope::View<float>::token_major(q_out_data.data(), n, hq, d);
  if constexpr (float_rows) {
    if (q_in_place) ov = rope::View<float>::token_major(q.data(), n, hq, d);
  }
  const std::int64_t* slot_ptr = slots.data();
  bool valid = true, read_only = false;
  switch (view_break) {
    case 1:
      ov.data = nullptr;
      valid = false;
      break;
    case 2:
      ov.tokens = n + 1;
      valid = false;
      break;
    case 3:
      kv = rope::View<In>::token_major(k.data(), n, hk, d + 1);
      valid = false;
      break;
    case 4:
      if (o.q_norm.data != nullptr) {
        o.q_norm.size += 1;
        valid = false;
      }
      break;
    case 5:
      o.k_norm = {nullptr, std::max<std::size_t>(o.k_norm.size, 1)};
      valid = false;
      break;
    case 6:
      (scaled ? kp.pool.scales : vp.pool.scales) = scaled ? nullptr : vp.scales.data();
      valid = false;
      break;
    case 7:
      slot_ptr = nullptr;
      valid = n == 0;
      break;
    case 8:
      read_only = true;
      o.write_back_k = true;
      valid = false;
      break;
    case 9:
      if constexpr (std::is_same<E, In>::value) {
        if (n > 0 && n <= ps) {
          kv = vp.pool.page(0).slice_tokens(0, n);  // k inside cache.v
          valid = false;
        }
      }
      break;
    case 10:
      if constexpr (float_rows) {
        if (n > 0 && !q_in_place) {
          ov = rope::View<float>::token_major(k.data(), n, hq, d);  // q_out over k
          valid = false;
        }
      }
      break;
    default: break;
  }
  const ra::PagedCache<E> cache{kp.pool, vp.pool};
  const auto kd = kp.data, vd = vp.data;
  const auto ks = kp.scales, vs = vp.scales;
  const auto q_input = q, k_input = k, v_input = v;
  const auto out_before = q_out_data;

  // Validity, judged here from the documentation.
  const std::size_t r = rotate ? (o.rotation.rotary_dim == 0 ? table_dim : o.rotation.rotary_dim) : 0;
  if (slot_ptr != nullptr) {
    for (std::size_t t = 0; t < n; ++t) {
      valid = valid && slots[t] >= -1 && slots[t] < static_cast<std::int64_t>(slot_count);
      for (std::size_t u = 0; u < t; ++u) valid = valid && (slots[t] < 0 || slots[u] != slots[t]);
    }
  }
  if (o.q_norm.data != nullptr || o.k_norm.data != nullptr) {
    valid = valid && o.eps > 0 && std::isfinite(o.eps) && static_cast<float>(o.eps) > 0;
  }
  if (rotate) valid = valid && r % 2 == 0 && r <= table_dim && r <= d;
  bool positions_ok = true;
  for (std::size_t t = 0; t < n && rotate; ++t) {
    positions_ok = positions_ok && pos(t) >= 0 && pos(t) < static_cast<std::int64_t>(table_positions);
  }
  const std::string where = "norm_rope_append pages=" + std::to_string(pages) + "x" + std::to_string(ps) +
                            " heads=" + std::to_string(hq) + "/" + std::to_string(hk) + " d=" + std::to_string(d) +
                            "/" + std::to_string(dv) + " n=" + std::to_string(n) + " r=" + std::to_string(r) +
                            " norm=" + std::to_string(norm_mode) + "/" + std::to_string(sides) +
                            " in_place=" + std::to_string(q_in_place) + " back=" + std::to_string(o.write_back_k) +
                            " break=" + std::to_string(view_break);
  bool threw = false;
  const auto text_ok = [](const char* what) {
    return std::string(what).find("rope::attention::norm_rope_append: ") == 0;
  };
  try {
    if (read_only) {
      ra::norm_rope_append(rope::View<const In>(qv), rope::View<const In>(kv), rope::View<const In>(vv),
                           by_id ? rope::Positions(ids.data()) : rope::Positions(offset), slot_ptr, cache, ov, o);
    } else {
      ra::norm_rope_append(qv, kv, vv, by_id ? rope::Positions(ids.data()) : rope::Positions(offset), slot_ptr, cache,
                           ov, o);
    }
  } catch (const rope::invalid_argument& e) {
    threw = true;
    ROPE_FUZZ_CHECK(!valid, where + ": " + e.what());
    ROPE_FUZZ_CHECK(text_ok(e.what()), e.what());
  } catch (const rope::out_of_range& e) {
    threw = true;
    ROPE_FUZZ_CHECK(valid && !positions_ok, where + ": " + e.what());
    ROPE_FUZZ_CHECK(text_ok(e.what()), e.what());
  }
  ROPE_FUZZ_CHECK(std::memcmp(v.data(), v_input.data(), v.size() * sizeof(In)) == 0, where + ": v written");
  if (threw) {
    ROPE_FUZZ_CHECK(std::memcmp(q.data(), q_input.data(), q.size() * sizeof(In)) == 0, where + ": q written");
    ROPE_FUZZ_CHECK(std::memcmp(k.data(), k_input.data(), k.size() * sizeof(In)) == 0, where + ": k written");
    ROPE_FUZZ_CHECK(std::memcmp(q_out_data.data(), out_before.data(), q_out_data.size() * sizeof(float)) == 0,
                    where + ": q_out written");
    ROPE_FUZZ_CHECK(same_pool(kp, kd, ks) && same_pool(vp, vd, vs), where + ": a refused call wrote the cache");
    return;
  }
  ROPE_FUZZ_CHECK(valid && positions_ok, where + ": an invalid call was accepted");

  // The oracle: each token's heads of one side widened, normalized in float
  // as documented, rotated in long double from the table's own cos/sin.
  const float eps = static_cast<float>(o.eps);
  const auto oracle = [&](const std::vector<In>& data, std::size_t t, std::size_t heads, const ra::NormWeights& w) {
    std::vector<float> x(heads * d);
    for (std::size_t h = 0; h < heads; ++h) {
      for (std::size_t c = 0; c < d; ++c) x[h * d + c] = rope::detail::widen_value(data[(t * heads + h) * d + c]);
    }
    if (w.data != nullptr) {
      if (o.whole_projection) {
        x = rms_norm_float(x, w.data, eps, o.plus_one);
      } else {
        for (std::size_t h = 0; h < heads; ++h) {
          const auto y =
              rms_norm_float(std::vector<float>(x.begin() + h * d, x.begin() + (h + 1) * d), w.data, eps, o.plus_one);
          std::copy(y.begin(), y.end(), x.begin() + h * d);
        }
      }
    }
    std::vector<std::vector<LD>> rows(heads);
    for (std::size_t h = 0; h < heads; ++h) {
      rows[h].assign(x.begin() + h * d, x.begin() + (h + 1) * d);
      if (rotate) rows[h] = rotate_ld(rows[h], table, o.rotation.style, r, pos(t));
    }
    return rows;
  };
  const auto top_of = [](const std::vector<LD>& x) {
    LD top = 0;
    for (LD a : x) top = std::max(top, std::fabs(a));
    return top;
  };
  // A row of In or float values against the oracle's: each finite value
  // within one rounding.
  const auto check_row = [&](const auto* got, const std::vector<LD>& want, const auto* type, const std::string& at) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(type)>>;
    const LD top = finite_all(want) ? top_of(want) : 0;
    for (std::size_t c = 0; c < want.size(); ++c) {
      if (!std::isfinite(want[c]) || !finite_all(want)) continue;
      const LD g = rope::detail::widen_value(got[c]);
      ROPE_FUZZ_CHECK(within_one_rounding<T>(g, want[c], top), at + " channel " + std::to_string(c) + ": got " +
                                                                   std::to_string(double(g)) + ", want " +
                                                                   std::to_string(double(want[c])));
    }
  };
  std::vector<std::vector<std::vector<LD>>> k_want(n);
  for (std::size_t t = 0; t < n; ++t) {
    const auto q_want = oracle(q_input, t, hq, o.q_norm);
    for (std::size_t h = 0; h < hq; ++h) {
      check_row(ov.row(t, h), q_want[h], static_cast<const float*>(nullptr),
                where + ": q_out token " + std::to_string(t) + " head " + std::to_string(h));
    }
    k_want[t] = oracle(k_input, t, hk, o.k_norm);
    for (std::size_t h = 0; h < hk && o.write_back_k; ++h) {
      check_row(k.data() + (t * hk + h) * d, k_want[t][h], static_cast<const In*>(nullptr),
                where + ": k written back, token " + std::to_string(t) + " head " + std::to_string(h));
    }
  }
  if (!o.write_back_k) {
    ROPE_FUZZ_CHECK(std::memcmp(k.data(), k_input.data(), k.size() * sizeof(In)) == 0, where + ": k written");
  }
  if (!q_in_place) {
    ROPE_FUZZ_CHECK(std::memcmp(q.data(), q_input.data(), q.size() * sizeof(In)) == 0, where + ": q written");
  }
  // Past q_out's rows nothing is written.
  const std::size_t out_end = n * hq * d;
  if (!q_in_place) {
    ROPE_FUZZ_CHECK(std::memcmp(q_out_data.data() + out_end, out_before.data() + out_end,
                                (q_out_data.size() - out_end) * sizeof(float)) == 0,
                    where + ": past q_out");
  }

  // Every slot no token names is as it was; a named one holds its token's
  // K row (normalized, rotated) or V row, rounded once.
  std::vector<std::int64_t> writer(slot_count, -1);
  for (std::size_t t = 0; t < n; ++t) {
    if (slots[t] >= 0) writer[static_cast<std::size_t>(slots[t])] = static_cast<std::int64_t>(t);
  }
  std::vector<E> k_old_data = kd, v_old_data = vd;
  std::vector<float> k_old_scales = ks, v_old_scales = vs;
  ra::PagePool<E> k_old = kp.pool, v_old = vp.pool;
  k_old.data = k_old_data.data();
  v_old.data = v_old_data.data();
  k_old.scales = scaled ? k_old_scales.data() : nullptr;
  v_old.scales = scaled ? v_old_scales.data() : nullptr;
  const auto check_slots_of = [&](const PoolData<E>& now, const ra::PagePool<E>& old, std::size_t dim, bool is_k) {
    for (std::size_t s = 0; s < slot_count; ++s) {
      for (std::size_t h = 0; h < hk; ++h) {
        const std::string at =
            where + (is_k ? ": k" : ": v") + " slot " + std::to_string(s) + " head " + std::to_string(h);
        if (writer[s] < 0) {
          ROPE_FUZZ_CHECK(std::memcmp(now.pool.row(s, h), old.row(s, h), dim * sizeof(E)) == 0, at + " changed");
          if (scaled) ROPE_FUZZ_CHECK(std::memcmp(now.pool.scale(s, h), old.scale(s, h), 4) == 0, at + " scale");
          continue;
        }
        const auto t = static_cast<std::size_t>(writer[s]);
        std::vector<LD> x(dim);
        if (is_k) {
          x = k_want[t][h];
        } else {
          for (std::size_t c = 0; c < dim; ++c) x[c] = rope::detail::widen_value(v_input[(t * hk + h) * dv + c]);
        }
        if (!finite_all(x)) {
          if (scaled) {
            ROPE_FUZZ_CHECK(std::isnan(*now.pool.scale(s, h)), at + ": a non-finite row's scale is not NaN");
            for (std::size_t c = 0; c < dim; ++c)
              ROPE_FUZZ_CHECK(rope::detail::widen_value(now.pool.row(s, h)[c]) == 0.0f, at + ": not 0");
          }
          continue;
        }
        const LD top = top_of(x);
        if (scaled) {
          ROPE_FUZZ_CHECK(std::fabs(LD(*now.pool.scale(s, h)) - top / 127) <= 1e-6L * (1 + top), at + ": the scale");
        }
        for (std::size_t c = 0; c < dim; ++c) {
          const LD got = stored(now.pool, s, h, c);
          ROPE_FUZZ_CHECK(within_one_rounding<E>(got, x[c], top), at + " channel " + std::to_string(c) + ": got " +
                                                                      std::to_string(double(got)) + ", want " +
                                                                      std::to_string(double(x[c])));
        }
      }
    }
  };
  check_slots_of(kp, k_old, d, true);
  check_slots_of(vp, v_old, dv, false);
}

template <class E>
void append_any(Bytes& in) {
  if (in.flag()) {
    append_typed<E, float>(in);
  } else {
    append_typed<E, rope::BFloat16>(in);
  }
}

}  // namespace

void fuzz_softmax(Bytes& in) {
  switch (in.u8() % 4) {
    case 0: softmax_typed<float>(in); break;
    case 1: softmax_typed<double>(in); break;
    case 2: softmax_step_typed<float>(in); break;
    default: softmax_step_typed<double>(in); break;
  }
}

void fuzz_batch(Bytes& in) {
  switch (in.u8() % 4) {
    case 0: batch_typed<float>(in); break;
    case 1: batch_typed<rope::BFloat16>(in); break;
    case 2: batch_typed<rope::Float16>(in); break;
    default: batch_typed<std::int8_t>(in); break;
  }
}

void fuzz_write_slots(Bytes& in) {
  switch (in.u8() % 4) {
    case 0: write_slots_any<float>(in); break;
    case 1: write_slots_any<rope::BFloat16>(in); break;
    case 2: write_slots_any<rope::Float16>(in); break;
    default: write_slots_any<std::int8_t>(in); break;
  }
}

void fuzz_norm_rope_append(Bytes& in) {
  switch (in.u8() % 3) {
    case 0: append_any<float>(in); break;
    case 1: append_any<rope::BFloat16>(in); break;
    default: append_any<std::int8_t>(in); break;
  }
}

void fuzz_linear(Bytes& in) {
  switch (in.u8() % 3) {
    case 0: linear_features<float>(in); break;
    case 1: linear_features<double>(in); break;
    default: linear_views(in); break;
  }
}

}  // namespace rope_fuzz

#else

namespace rope_fuzz {
void fuzz_softmax(Bytes&) {}
void fuzz_linear(Bytes&) {}
void fuzz_batch(Bytes&) {}
void fuzz_write_slots(Bytes&) {}
void fuzz_norm_rope_append(Bytes&) {}
}  // namespace rope_fuzz

#endif
