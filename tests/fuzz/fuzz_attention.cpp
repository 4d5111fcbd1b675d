// The fuzz target's attention decoders: rope::attention's softmax (multi-head
// views with grouped heads, masks, positions, a KV cache of rotated keys,
// threads) and linear attention (given features with eq. 19, and FAVOR+
// over views). A decoded call is valid or breaks exactly one argument; a
// broken call must throw the documented exception and write nothing, a valid
// one must equal the long-double oracle on every row that sees only finite
// inputs, and no row may be touched by a non-finite value it does not see.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
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
  const double tolerance = sizeof(T) == 4 ? 2e-4 : 1e-9;
  for (std::size_t i = 0; i < lq; ++i) {
    for (std::size_t h = 0; h < hq; ++h) {
      const std::size_t g = h / group;
      std::vector<LD> qi = head_row(q, i, h, hq, d);
      if (rotate) qi = rotate_ld(qi, table, rotation.style, r, pq(i));
      std::vector<LD> scores;
      std::vector<std::size_t> keys;
      bool finite = finite_all(qi);
      for (std::size_t j = 0; j < lk; ++j) {
        const std::int64_t sq = o.q_sequence.empty() ? 0 : o.q_sequence[i],
                           sk = o.k_sequence.empty() ? 0 : o.k_sequence[j];
        if (sq != sk || (o.causal && pk(j) > pq(i))) continue;
        if (o.window != 0 && pk(j) <= pq(i) && pq(i) - pk(j) >= std::int64_t(o.window)) continue;
        std::vector<LD> kj = head_row(k, j, g, hk, d);
        finite = finite && finite_all(kj) && finite_all(head_row(v, j, g, hk, dv));
        if (rotate && !o.keys_rotated) kj = rotate_ld(kj, table, rotation.style, r, pk(j));
        LD s = 0;
        for (std::size_t c = 0; c < d; ++c) s += qi[c] * kj[c];
        scores.push_back(s * scale);
        keys.push_back(j);
      }
      const T* got = out.data() + (i * hq + h) * dv;
      if (keys.empty()) {
        for (std::size_t c = 0; c < dv; ++c) ROPE_FUZZ_CHECK(got[c] == T(0), where + ": a row that sees no key");
        continue;
      }
      if (!finite) continue;  // NaN or not: only the rows that see it are concerned
      const LD top = *std::max_element(scores.begin(), scores.end());
      LD sum = 0, magnitude = 0;
      std::vector<LD> want(dv, 0);
      for (std::size_t n = 0; n < keys.size(); ++n) {
        const LD w = std::exp(scores[n] - top);
        sum += w;
        for (std::size_t c = 0; c < dv; ++c) {
          const LD vc = v[(keys[n] * hk + g) * dv + c];
          want[c] += w * vc;
          magnitude = std::max(magnitude, std::fabs(vc));
        }
      }
      for (std::size_t c = 0; c < dv; ++c) {
        ROPE_FUZZ_CHECK(std::isfinite(got[c]), where + ": a row of finite inputs is not finite");
        ROPE_FUZZ_CHECK(std::fabs(LD(got[c]) - want[c] / sum) <= tolerance * (1 + magnitude),
                        where + ": row " + std::to_string(i) + " head " + std::to_string(h));
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
  const double tolerance = sizeof(T) == 4 ? 1e-3 : 1e-9;
  for (std::size_t i = 0; i < lq; ++i) {
    std::vector<LD> qn(m), qd(m);
    for (std::size_t c = 0; c < m; ++c) qn[c] = qd[c] = fq(Eigen::Index(i), Eigen::Index(c));
    if (eq19) qn = rotate_ld(qn, table, rope::Style::rotate_half, m, pos(o.q_positions, i));
    LD den = 0;
    std::vector<LD> num(dv, 0);
    bool finite = finite_all(qn), seen = false;
    LD magnitude = 0;
    for (std::size_t j = 0; j < lk; ++j) {
      const std::int64_t sq = o.q_sequence.empty() ? 0 : o.q_sequence[i],
                         sk = o.k_sequence.empty() ? 0 : o.k_sequence[j];
      if (sq != sk || (o.causal && pos(o.k_positions, j) > pos(o.q_positions, i))) continue;
      seen = true;
      std::vector<LD> kn(m), kd(m);
      for (std::size_t c = 0; c < m; ++c) kn[c] = kd[c] = fk(Eigen::Index(j), Eigen::Index(c));
      finite = finite && finite_all(kd);
      if (eq19) kn = rotate_ld(kn, table, rope::Style::rotate_half, m, pos(o.k_positions, j));
      LD a = 0, b = 0;
      for (std::size_t c = 0; c < m; ++c) {
        a += qn[c] * kn[c];
        b += qd[c] * kd[c];
      }
      den += b;
      for (std::size_t c = 0; c < dv; ++c) {
        const LD vc = v(Eigen::Index(j), Eigen::Index(c));
        finite = finite && std::isfinite(vc);
        num[c] += a * vc;
        magnitude = std::max(magnitude, std::fabs(a * vc));
      }
    }
    if (!seen) {
      for (std::size_t c = 0; c < dv; ++c) ROPE_FUZZ_CHECK(got(Eigen::Index(i), Eigen::Index(c)) == T(0), where);
      continue;
    }
    if (!finite || !(den > 1e-3L)) continue;
    for (std::size_t c = 0; c < dv; ++c) {
      const LD g = got(Eigen::Index(i), Eigen::Index(c));
      ROPE_FUZZ_CHECK(std::isfinite(g), where + ": a row of finite inputs is not finite");
      ROPE_FUZZ_CHECK(std::fabs(g - num[c] / den) <= tolerance * (1 + magnitude / den),
                      where + " row " + std::to_string(i));
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

}  // namespace

void fuzz_softmax(Bytes& in) {
  switch (in.u8() % 4) {
    case 0: softmax_typed<float>(in); break;
    case 1: softmax_typed<double>(in); break;
    case 2: softmax_step_typed<float>(in); break;
    default: softmax_step_typed<double>(in); break;
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
}  // namespace rope_fuzz

#endif
