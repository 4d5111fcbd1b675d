// The fuzz target's attention decoders: rope::attention's softmax over
// multi-head views (grouped heads, masks, positions, logits, RoPE inside,
// keys already rotated, threads or an executor), linear attention (given
// features with eq. 19, FAVOR+ over views), and the serving path over paged
// caches of f32, bf16, f16, int8 and fp8 in NHD, HND and padded layouts:
// plan, attend (masks, scale, softcap, sinks, kv_split, log-sum-exp) and
// merge. append and one sequence's whole step over a contiguous cache are
// fuzz_append.cpp's, by the same rules.
//
// A decoded call is valid or breaks some of its arguments, its validity
// judged here from the headers' contracts. A refused call must throw the
// documented exception, name its function, and write nothing: its outputs,
// caches, scales and inputs are compared byte for byte before and after. A
// refused plan() must leave its Plan holding no plan, which append and
// attend then refuse. An accepted call must equal the long-double oracle on
// every row that sees only finite inputs, within a forward error bound taken
// from that call's inputs; no row may be touched by a non-finite value it
// does not see; threads and executors give the same bytes as one thread.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "fuzz_support.hpp"

#if defined(ROPE_FUZZ_ATTENTION)
#include "fuzz_attention.hpp"

namespace rope_fuzz {
namespace {

// ---------------------------------------------------------------------------
// softmax over multi-head views.

// softmax over [tokens, heads, head_dim] views with grouped heads: masks,
// positions and sequence ids, logits (scale, softcap, sinks), RoPE inside
// (or keys already rotated), blocks, threads or an executor; broken views,
// a table set without its pairing. Refused: the documented exception,
// nothing written; accepted: the long-double oracle on every row.
template <class T>
void softmax_typed(Bytes& in) {
  const std::size_t lq = in.u8() % 6, lk = in.u8() % 8, hk = 1 + in.u8() % 3, group = 1 + in.u8() % 3;
  const std::size_t hq = hk * group, d = 1 + in.u8() % 9, dv = 1 + in.u8() % 5;
  const bool rotate = in.flag();
  const std::size_t table_dim = 2 * (1 + in.u8() % 4), table_positions = 1 + in.u8() % 24;
  const rope::Table<T> table(rope::frequencies(table_dim, 100.0), table_positions);
  ra::Rotation<T> rotation;
  std::size_t asked = 0;
  if (rotate) {
    const rope::Style style = in.flag() ? rope::Style::rotate_half : rope::Style::block_diagonal;
    asked = in.u8() % 4 == 0 ? in.u8() % 10 : 0;
    rotation = ra::Rotation<T>(&table, style, asked);
  }
  ra::SoftmaxOptions o;
  o.mask.causal = in.flag();
  o.mask.window = in.u8() % 4 == 0 ? in.u8() % 5 : 0;
  const std::size_t blocks[] = {1, 2, 3, 7, 256, std::numeric_limits<std::size_t>::max(), 0};
  o.block = blocks[in.u8() % 7];
  const DrawnThreads threads = draw_threads(in);
  o.threads = threads.threads;
  o.keys_rotated = in.flag();
  const DrawnLogits logits = draw_logits<T>(in, hq);
  o.logits = logits.logits;
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
  const auto q_before = q, k_before = k, v_before = v, out_before = out;
  rope::View<T> out_view = rope::View<T>::token_major(out.data(), lq, hq, dv);
  const std::uint8_t view_break = in.u8() % 16;
  bool views_ok = true, styled = true;
  if (view_break == 1) {
    out_view.data = nullptr;
    views_ok = false;
  } else if (view_break == 2 && lq * hq * dv <= q.size() && lq > 0) {
    out_view = rope::View<T>::token_major(q.data(), lq, hq, dv);  // out over q's own rows
    views_ok = false;
  } else if (view_break == 3 && hq > 1 && lq > 0) {
    out_view.head_stride = 0;
    views_ok = false;
  } else if (view_break == 4) {
    rotation = ra::Rotation<T>();  // a table set by hand, without its pairing
    rotation.table = &table;
    rotation.rotary_dim = asked;
    styled = false;
  }

  // Validity, judged here from softmax.hpp, masks.hpp and logits.hpp.
  const std::int64_t qo = o.q_offset, ko = o.k_offset;
  const auto pq = [&](std::size_t i) { return explicit_positions ? o.q_positions[i] : qo + std::int64_t(i); };
  const auto pk = [&](std::size_t j) { return explicit_positions ? o.k_positions[j] : ko + std::int64_t(j); };
  const std::size_t r = rotation.table != nullptr ? (asked == 0 ? table_dim : asked) : 0;
  bool valid = views_ok && o.block > 0 && threads.valid && logits.valid && styled;
  if (rotation.table != nullptr) valid = valid && r % 2 == 0 && r <= table_dim && r <= d;
  bool positions_ok = true;
  if (rotation.table != nullptr) {
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
    ROPE_FUZZ_CHECK(named(e, "rope::attention::softmax"), e.what());
  } catch (const rope::out_of_range& e) {
    threw = true;
    ROPE_FUZZ_CHECK(valid && !positions_ok, where + ": " + e.what());
    ROPE_FUZZ_CHECK(named(e, "rope::attention::softmax"), e.what());
  }
  ROPE_FUZZ_CHECK(same_bytes(k, k_before) && same_bytes(v, v_before), where + ": k or v written");
  if (threw) {
    ROPE_FUZZ_CHECK(same_bytes(q, q_before), where + ": q written");
    ROPE_FUZZ_CHECK(same_bytes(out, out_before), where + ": out written");
    return;
  }
  ROPE_FUZZ_CHECK(valid && positions_ok, where + ": an invalid call was accepted");
  ROPE_FUZZ_CHECK(same_bytes(q, q_before), where + ": q written");

  // The oracle, per query head: naive softmax in long double over the keys
  // the mask shows.
  const LogitsIn<T> li(o.logits, hq, d);
  const std::size_t rq = r, rk = o.keys_rotated ? 0 : r;
  for (std::size_t i = 0; i < lq; ++i) {
    for (std::size_t h = 0; h < hq; ++h) {
      const std::size_t g = h / group;
      const std::vector<LD> q_raw = head_row(q, i, h, hq, d);
      const std::vector<LD> q_mag = pair_magnitudes(q_raw, rotation.style, rq);
      const std::vector<LD> qi = r > 0 ? rotate_ld(q_raw, table, rotation.style, r, pq(i)) : q_raw;
      std::vector<Scored> keys;
      bool finite = finite_all(qi), nan_score = false;
      std::vector<bool> nan_value(dv, false);
      for (std::size_t j = 0; j < lk; ++j) {
        const std::int64_t sq = o.q_sequence.empty() ? 0 : o.q_sequence[i],
                           sk = o.k_sequence.empty() ? 0 : o.k_sequence[j];
        if (sq != sk || (o.mask.causal && pk(j) > pq(i))) continue;
        if (o.mask.window != 0 && pk(j) <= pq(i) && pq(i) - pk(j) >= std::int64_t(o.mask.window)) continue;
        const std::vector<LD> k_raw = head_row(k, j, g, hk, d);
        Scored s;
        s.v = head_row(v, j, g, hk, dv);
        finite = finite && finite_all(k_raw) && finite_all(s.v);
        for (std::size_t c = 0; c < dv; ++c) nan_value[c] = nan_value[c] || std::isnan(s.v[c]);
        s.magnitude = dot_magnitude(q_mag, pair_magnitudes(k_raw, rotation.style, rk));
        const std::vector<LD> kj = rk > 0 ? rotate_ld(k_raw, table, rotation.style, r, pk(j)) : k_raw;
        for (std::size_t c = 0; c < d; ++c) s.dot += qi[c] * kj[c];
        nan_score = nan_score || std::isnan(s.dot);
        keys.push_back(std::move(s));
      }
      const Want w = softmax_want<T>(keys, d, dv, li, h, finite, nan_score, nan_value);
      check_row<T>(out.data() + (i * hq + h) * dv, nullptr, w, dv, li.sinks[h],
                   where + ": row " + std::to_string(i) + " head " + std::to_string(h));
    }
  }
}

// ---------------------------------------------------------------------------
// Linear attention.

// Given positive features, causal or not, with the eq. 19 rotation (either
// pairing) or not: the quadratic form in long double, masked by position
// and sequence.
template <class T>
void linear_features(Bytes& in) {
  const std::size_t lq = in.u8() % 7, lk = in.u8() % 7, m = 1 + in.u8() % 8, dv = 1 + in.u8() % 4;
  const bool eq19 = in.flag();
  const std::size_t table_dim = in.u8() % 8 == 0 ? 2 + 2 * (in.u8() % 4) : m + (m % 2);
  const std::size_t table_positions = 1 + in.u8() % 16;
  const rope::Table<T> table(rope::frequencies(table_dim, 100.0), table_positions);
  ra::LinearOptions o;
  o.mask.causal = in.flag();
  const std::size_t chunks[] = {1, 2, 3, 5, 64, std::numeric_limits<std::size_t>::max(), 0};
  o.chunk = chunks[in.u8() % 7];
  o.threads = std::size_t{1} + in.u8() % 2;
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
  const rope::Style style = in.flag() ? rope::Style::block_diagonal : rope::Style::rotate_half;

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
    got = eq19 ? ra::linear_eq19(fq, fk, v, ra::Rotation<T>(&table, style), o) : ra::linear(fq, fk, v, o);
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
    const std::vector<LD> q_mag = pair_magnitudes(qn, style, eq19 ? m : 0);
    if (eq19) qn = rotate_ld(qn, table, style, m, pos(o.q_positions, i));
    LD den = 0;
    std::vector<LD> num(dv, 0), num_magnitude(dv, 0);
    bool finite = finite_all(qn) && finite_all(qd), seen = false, nan_score = false;
    std::vector<bool> nan_value(dv, false);
    for (std::size_t j = 0; j < lk; ++j) {
      const std::int64_t sq = o.q_sequence.empty() ? 0 : o.q_sequence[i],
                         sk = o.k_sequence.empty() ? 0 : o.k_sequence[j];
      if (sq != sk || (o.mask.causal && pos(o.k_positions, j) > pos(o.q_positions, i))) continue;
      seen = true;
      std::vector<LD> kn(m), kd(m);
      for (std::size_t c = 0; c < m; ++c) kn[c] = kd[c] = fk(Eigen::Index(j), Eigen::Index(c));
      finite = finite && finite_all(kd);
      const LD a_bound = dot_magnitude(q_mag, pair_magnitudes(kn, style, eq19 ? m : 0));
      if (eq19) kn = rotate_ld(kn, table, style, m, pos(o.k_positions, j));
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
      Want w;
      w.sees = true;
      w.finite = false;
      w.nan_score = nan_score;
      w.nan_value = nan_value;
      check_row<T>(&got(Eigen::Index(i), 0), nullptr, w, dv, kNegInf, at);
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
  const ra::Rotation<double> rotation(&table, rope::Style::rotate_half);
  ra::LinearOptions o;
  o.mask.causal = in.flag();
  o.chunk = 1 + in.u8() % 4;
  const std::size_t threads = in.u8() % 3;
  o.threads = threads;
  auto q = elements<double>(in, l * hq * d), k = elements<double>(in, l * hk * d),
       v = elements<double>(in, l * hk * dv);
  std::vector<double> out(l * hq * dv, -9.0);
  const auto out_before = out;
  rope::View<double> out_view = rope::View<double>::token_major(out.data(), l, hq, dv);
  const bool broken_view = in.u8() % 8 == 0 && hq > 1;
  if (broken_view) out_view.head_stride = 1;
  const bool valid = threads > 0 && !(broken_view && dv > 1);
  const auto qv = rope::View<const double>::token_major(q.data(), l, hq, d);
  const auto kv = rope::View<const double>::token_major(k.data(), l, hk, d);
  const auto vv = rope::View<const double>::token_major(v.data(), l, hk, dv);
  try {
    ra::linear_eq19<double>(qv, kv, vv, out_view, phi, rotation, o);
  } catch (const rope::invalid_argument& e) {
    ROPE_FUZZ_CHECK(!valid, std::string("linear views: ") + e.what());
    ROPE_FUZZ_CHECK(same_bytes(out, out_before), "linear views wrote");
    return;
  }
  ROPE_FUZZ_CHECK(valid, "linear views: an invalid call was accepted");
  if (broken_view) return;
  ra::LinearOptions one = o;
  one.threads = std::size_t{1};
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
    const ra::Matrix<double> want = ra::linear_eq19(qh, kh, vh, phi, rotation, one);
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

// ---------------------------------------------------------------------------
// attend.

// plan and attend over a paged cache of E, q of Q, out of O: random
// sequences (new tokens, lengths, block tables with ids outside the pool, a
// page twice, shared prefixes), shapes and batches plan() refuses or that do
// not fit the cache, a plan whose plan() failed, masks, logits (scale,
// softcap, sinks), kv_split, cascade levels of shared prefixes, threads or
// an executor, lse or not, and broken
// views (out or lse over q, out or the cache, pools with scales wrong or
// overlapping pages). A refused call throws and writes nothing; an accepted
// one leaves the pools and q as they were, writes out's rows (and lse) only,
// is the same bytes with one thread and (without cascade) for each sequence
// planned alone, and equals a long-double recomputation over the dequantized
// cache.
template <class E, class Q, class O>
void attend_typed(Bytes& in) {
  const std::size_t pages = 1 + in.u8() % 6, ps = 1 + in.u8() % 5, hk = 1 + in.u8() % 2, group = 1 + in.u8() % 3;
  const std::size_t hq = hk * group, d = 1 + in.u8() % 9, dv = 1 + in.u8() % 6;
  const std::uint8_t layout = in.u8();
  // Breaks are read before the long arrays, and 0 (what a short input reads)
  // breaks nothing.
  const std::uint8_t view_break = in.u8() % 16;
  DrawnBatch b;
  draw_batch(b, in, pages, ps);
  ra::Mask mask;
  mask.causal = in.flag();
  mask.window = in.u8() % 4 == 0 ? in.u8() % 5 : 0;
  const DrawnLogits logits = draw_logits<float>(in, hq);
  const DrawnThreads threads = draw_threads(in);
  const bool with_lse = in.flag();
  PoolData<E> kp, vp;
  make_pool(kp, in, pages, ps, hk, d, layout);
  make_pool(vp, in, pages, ps, hk, dv, layout);
  const DrawnShape shape = draw_shape(in, ra::Shape::of(ra::PagedCache<E>{kp.pool, vp.pool}, hq));
  const std::size_t tokens = b.tokens;
  std::vector<Q> q = rows_of<Q>(in, tokens * hq * (d + 1));  // room for a q of head_dim d + 1
  std::vector<O> out((tokens + 1) * hq * (dv + 2), from_float<O>(-9.0f));
  std::vector<float> lse(tokens * hq + 1, -9.0f);

  rope::View<const Q> qv = rope::View<const Q>::token_major(q.data(), tokens, hq, d);
  rope::View<O> ov = rope::View<O>::token_major(out.data(), tokens, hq, dv);
  float* lse_ptr = with_lse ? lse.data() : nullptr;
  bool views_ok = true;
  switch (view_break) {
    case 1:
      ov.data = nullptr;
      views_ok = false;
      break;
    case 2:
      if (tokens > 0 && tokens * hq * dv * sizeof(O) <= q.size() * sizeof(Q)) {
        ov = rope::View<O>::token_major(reinterpret_cast<O*>(q.data()), tokens, hq, dv);  // over q
        views_ok = false;
      }
      break;
    case 3:
      if (tokens > 0 && tokens * hq * dv * sizeof(O) <= kp.data.size() * sizeof(E)) {
        ov = rope::View<O>::token_major(reinterpret_cast<O*>(kp.data.data()), tokens, hq, dv);  // over cache.k
        views_ok = false;
      }
      break;
    case 4:
      ov = rope::View<O>::token_major(out.data(), tokens, hq, dv + 1);  // not the cache's dv
      views_ok = false;
      break;
    case 5:
      ov.tokens = tokens + 1;
      views_ok = false;
      break;
    case 6:
      qv = rope::View<const Q>::token_major(q.data(), tokens, hq, d + 1);
      views_ok = false;
      break;
    case 7:
      if (with_lse && tokens > 0) {
        lse_ptr = reinterpret_cast<float*>(out.data());  // over out
        views_ok = false;
      }
      break;
    case 8:
      if (with_lse && tokens > 0) {
        lse_ptr = reinterpret_cast<float*>(q.data());  // over q
        views_ok = false;
      }
      break;
    case 9:
      if (with_lse && tokens > 0 && tokens * hq * sizeof(float) <= vp.data.size() * sizeof(E)) {
        lse_ptr = reinterpret_cast<float*>(vp.data.data());  // over cache.v
        views_ok = false;
      }
      break;
    case 10:
      kp.pool.scales = rope::KvElement<E>::kScaled ? nullptr : kp.scales.data();
      views_ok = false;
      break;
    case 11: {
      const ra::PagePool<E>& p = vp.pool;
      const std::size_t page_span = (p.page_size - 1) * p.token_stride + (p.heads - 1) * p.head_stride + p.head_dim;
      if (pages > 1 && page_span > 1) {
        vp.pool.page_stride = 1;  // pages that overlap
        views_ok = false;
      }
      break;
    }
    case 12:
      // q is only read: it may lie anywhere, even over the cache.
      if constexpr (std::is_same<Q, E>::value) {
        if (tokens * hq * d <= vp.data.size()) qv = rope::View<const Q>::token_major(vp.data.data(), tokens, hq, d);
      }
      break;
    default: break;
  }
  const ra::PagedCache<E> cache{kp.pool, vp.pool};
  const PoolBefore<E> kb = before(kp), vb = before(vp);
  const auto q_before = q;
  const auto out_before = out;
  const auto lse_before = lse;

  std::string where = "attend pages=" + std::to_string(pages) + "x" + std::to_string(ps) +
                      " heads=" + std::to_string(hq) + "/" + std::to_string(hk) + " d=" + std::to_string(d) +
                      " dv=" + std::to_string(dv) + " sequences=" + std::to_string(b.sequences) +
                      " split=" + std::to_string(shape.shape.kv_split) + " break=" + std::to_string(view_break) + "/" +
                      std::to_string(b.broken);
  ra::Plan plan;
  plan_before(plan, ra::Shape::of(ra::PagedCache<E>{kp.pool, vp.pool}, hq), tokens);
  const bool planned = plan_step(plan, shape, b, threads, where);
  const bool valid = planned && shape.fits && views_ok && logits.valid;
  bool threw = false;
  try {
    ra::attend(plan, cache, qv, ov, logits.logits, mask, lse_ptr);
  } catch (const rope::invalid_argument& e) {
    threw = true;
    ROPE_FUZZ_CHECK(!valid, where + ": " + e.what());
    ROPE_FUZZ_CHECK(named(e, "rope::attention::attend"), e.what());
    if (!planned) check_no_plan(e, "rope::attention::attend", where);
  }
  ROPE_FUZZ_CHECK(unchanged(kp, kb) && unchanged(vp, vb), where + ": the cache written");
  if (threw) {
    ROPE_FUZZ_CHECK(same_bytes(q, q_before), where + ": q written");
    ROPE_FUZZ_CHECK(same_bytes(out, out_before), where + ": out written");
    ROPE_FUZZ_CHECK(same_bytes(lse, lse_before), where + ": lse written");
    return;
  }
  ROPE_FUZZ_CHECK(valid, where + ": an invalid call was accepted");
  ROPE_FUZZ_CHECK(same_bytes(q, q_before), where + ": q written");
  // Past out's rows and lse's entries nothing is written.
  const std::size_t out_end = tokens * hq * dv;
  ROPE_FUZZ_CHECK(
      std::memcmp(out.data() + out_end, out_before.data() + out_end, (out.size() - out_end) * sizeof(O)) == 0,
      where + ": past out's rows");
  const std::size_t lse_end = with_lse ? tokens * hq : 0;
  ROPE_FUZZ_CHECK(
      std::memcmp(lse.data() + lse_end, lse_before.data() + lse_end, (lse.size() - lse_end) * sizeof(float)) == 0,
      where + ": past lse's rows");

  if (threads.parallel()) {
    ra::Plan one;
    ra::plan(one, shape.shape, b.batch, std::size_t{1});
    std::vector<O> out1(out.size(), from_float<O>(-9.0f));
    std::vector<float> lse1(lse.size(), -9.0f);
    ra::attend(one, cache, qv, rope::View<O>::token_major(out1.data(), tokens, hq, dv), logits.logits, mask,
               with_lse ? lse1.data() : nullptr);
    ROPE_FUZZ_CHECK(same_bytes(out, out1), where + ": not the same bytes with one thread");
    if (with_lse) ROPE_FUZZ_CHECK(same_bytes(lse, lse1), where + ": not the same lse with one thread");
  }
  // A sequence's rows are the same bytes in any batch: planned alone (not
  // with cascade levels, whose rows depend on which sequences share pages).
  if (b.sequences > 0 && !shape.shape.cascade) {
    const std::size_t s = in.u8() % b.sequences;
    const std::int64_t n = b.n[s], first = b.start(s);
    if (n > 0) {
      const std::int64_t starts[2] = {0, n};
      ra::Plan alone;
      ra::plan(alone, shape.shape, ra::Batch{starts, &b.lengths[s], &b.table[s * b.stride], b.stride, 1},
               threads.threads);
      const auto count = static_cast<std::size_t>(n);
      std::vector<O> out1(count * hq * dv + 1, from_float<O>(-9.0f));
      std::vector<float> lse1(count * hq + 1, -9.0f);
      ra::attend(alone, cache, qv.slice_tokens(static_cast<std::size_t>(first), count),
                 rope::View<O>::token_major(out1.data(), count, hq, dv), logits.logits, mask,
                 with_lse ? lse1.data() : nullptr);
      ROPE_FUZZ_CHECK(
          std::memcmp(out1.data(), ov.row(static_cast<std::size_t>(first), 0), count * hq * dv * sizeof(O)) == 0,
          where + ": sequence " + std::to_string(s) + " planned alone differs");
      if (with_lse) {
        ROPE_FUZZ_CHECK(std::memcmp(lse1.data(), lse.data() + static_cast<std::size_t>(first) * hq,
                                    count * hq * sizeof(float)) == 0,
                        where + ": sequence " + std::to_string(s) + "'s lse planned alone differs");
      }
    }
  }

  // The oracle: each row recomputed in long double over the dequantized
  // cache, at the positions the lengths give.
  const LogitsIn<float> li(logits.logits, hq, d);
  for (std::size_t s = 0; s < b.sequences; ++s) {
    std::vector<std::size_t> slots(static_cast<std::size_t>(b.n[s] > 0 ? b.lengths[s] : 0));
    for (std::size_t j = 0; j < slots.size(); ++j) slots[j] = b.slot(s, static_cast<std::int64_t>(j), ps);
    for (std::int64_t i = 0; i < b.n[s]; ++i) {
      const auto t = static_cast<std::size_t>(b.start(s) + i);
      check_attend_token<E, Q, O>(where + " sequence " + std::to_string(s), qv, ov, lse_ptr, t, b.positions[t], slots,
                                  kp.pool, vp.pool, group, li, mask);
    }
  }
}

// ---------------------------------------------------------------------------
// merge.

// An lse as a partial state may hold: a moderate or large finite value,
// -inf (a part that saw no key), NaN, or +inf (not asserted on).
float draw_lse(Bytes& in) {
  const std::uint8_t kind = in.u8() % 16;
  if (kind == 0) return -std::numeric_limits<float>::infinity();
  if (kind == 1) return std::numeric_limits<float>::quiet_NaN();
  if (kind == 2) return std::numeric_limits<float>::infinity();
  if (kind == 3) return static_cast<float>((static_cast<int>(in.u8()) - 128) * 16);
  return static_cast<float>(static_cast<std::int8_t>(in.u8())) / 16.0f;
}

// merge of two partial states (out_a of A, out_b of B into out of O):
// rows with lse finite, -inf (left out whatever the row holds; both: a zero
// row and -inf), NaN on either side (a NaN row and lse) or +inf (not
// asserted on); out in place over
// out_a, lse over lse_a or lse_b; shapes that differ, a null lse input, out
// overlapping an input or lse overlapping out or an input partially. A
// refused call writes nothing; an accepted one equals the long-double merge
// of the inputs within the rounding of the online-softmax merge.
template <class A, class B, class O>
void merge_typed(Bytes& in) {
  const std::size_t tokens = in.u8() % 4, heads = 1 + in.u8() % 3, dim = 1 + in.u8() % 6, rows = tokens * heads;
  const std::uint8_t view_break = in.u8() % 16, lse_mode = in.u8() % 4;
  const bool in_place = std::is_same<A, O>::value && in.u8() % 4 == 0;
  std::vector<A> a = rows_of<A>(in, (rows + 1) * dim);
  std::vector<B> b = rows_of<B>(in, (rows + 1) * dim);
  Exact<float> lse_a(rows + 1), lse_b(rows + 1), lse_out(rows + 1);
  for (std::size_t i = 0; i < rows + 1; ++i) {
    lse_a[i] = draw_lse(in);
    lse_b[i] = draw_lse(in);
    lse_out[i] = -9.0f;
  }
  std::vector<O> out((rows + 1) * (dim + 2), from_float<O>(-9.0f));
  rope::View<const A> va = rope::View<const A>::token_major(a.data(), tokens, heads, dim);
  rope::View<const B> vb = rope::View<const B>::token_major(b.data(), tokens, heads, dim);
  rope::View<O> vo = rope::View<O>::token_major(out.data(), tokens, heads, dim);
  if constexpr (std::is_same<A, O>::value) {
    if (in_place) vo = rope::View<O>::token_major(a.data(), tokens, heads, dim);
  }
  const float* pa = lse_a.data();
  const float* pb = lse_b.data();
  float* po = lse_mode == 0 ? nullptr : lse_mode == 1 ? lse_a.data() : lse_mode == 2 ? lse_b.data() : lse_out.data();
  bool valid = true;
  switch (view_break) {
    case 1:
      vb.tokens = tokens + 1;
      valid = false;
      break;
    case 2:
      vo.head_dim = dim + 1;
      valid = false;
      break;
    case 3:
      pa = nullptr;
      valid = rows == 0;
      break;
    case 4:
      pb = nullptr;
      valid = rows == 0;
      break;
    case 5:
      if (rows * dim > 1 && !in_place) {
        vo = rope::View<O>::token_major(reinterpret_cast<O*>(a.data() + 1), tokens, heads, dim);  // over out_a, shifted
        valid = false;
      }
      break;
    case 6:
      if (po != nullptr && rows > 0) {
        po = reinterpret_cast<float*>(vo.data);  // lse over out
        valid = false;
      }
      break;
    case 7:
      if (po != nullptr && rows > 1) {
        po = lse_a.data() + 1;  // lse partly over lse_a
        valid = false;
      }
      break;
    case 8:
      vo.data = nullptr;
      valid = false;
      break;
    case 9:
      if (rows * dim > 1) {
        vo = rope::View<O>::token_major(reinterpret_cast<O*>(b.data() + 1), tokens, heads, dim);  // over out_b, shifted
        valid = false;
      }
      break;
    case 10:
      vo.heads = heads + 1;
      valid = false;
      break;
    default: break;
  }
  const auto a_before = a;
  const auto b_before = b;
  const auto out_before = out;
  const std::vector<float> la = copy_of(lse_a), lb = copy_of(lse_b), lo = copy_of(lse_out);
  const std::string where = "merge tokens=" + std::to_string(tokens) + " heads=" + std::to_string(heads) +
                            " dim=" + std::to_string(dim) + " in_place=" + std::to_string(in_place) +
                            " lse=" + std::to_string(lse_mode) + " break=" + std::to_string(view_break);
  bool threw = false;
  try {
    ra::merge(va, pa, vb, pb, vo, po);
  } catch (const rope::invalid_argument& e) {
    threw = true;
    ROPE_FUZZ_CHECK(!valid, where + ": " + e.what());
    ROPE_FUZZ_CHECK(named(e, "rope::attention::merge"), e.what());
  }
  if (threw) {
    ROPE_FUZZ_CHECK(same_bytes(a, a_before) && same_bytes(b, b_before) && same_bytes(out, out_before) &&
                        same_bytes(lse_a, la) && same_bytes(lse_b, lb) && same_bytes(lse_out, lo),
                    where + ": a refused merge wrote");
    return;
  }
  ROPE_FUZZ_CHECK(valid, where + ": an invalid merge was accepted");
  ROPE_FUZZ_CHECK(same_bytes(b, b_before), where + ": out_b written");
  if (!in_place) ROPE_FUZZ_CHECK(same_bytes(a, a_before), where + ": out_a written");
  if (po != lse_a.data()) ROPE_FUZZ_CHECK(same_bytes(lse_a, la), where + ": lse_a written");
  if (po != lse_b.data()) ROPE_FUZZ_CHECK(same_bytes(lse_b, lb), where + ": lse_b written");
  if (po != lse_out.data()) ROPE_FUZZ_CHECK(same_bytes(lse_out, lo), where + ": lse written");
  if (po != nullptr) {
    const float* was = po == lse_a.data() ? &la[rows] : po == lse_b.data() ? &lb[rows] : &lo[rows];
    ROPE_FUZZ_CHECK(std::memcmp(po + rows, was, sizeof(float)) == 0, where + ": past lse");
  }

  const LD u = unit_roundoff<float>();
  const LD neg_inf = kNegInf;
  for (std::size_t t = 0; t < tokens; ++t) {
    for (std::size_t h = 0; h < heads; ++h) {
      const std::size_t row = t * heads + h;
      const std::string at = where + " row " + std::to_string(row);
      const LD x = la[row], y = lb[row];
      const O* got = vo.row(t, h);
      const float* got_lse = po != nullptr ? po + row : nullptr;
      std::vector<LD> ra_(dim), rb(dim);
      for (std::size_t c = 0; c < dim; ++c) {
        ra_[c] = widen(a_before[row * dim + c]);
        rb[c] = widen(b_before[row * dim + c]);
      }
      if (x == std::numeric_limits<LD>::infinity() || y == std::numeric_limits<LD>::infinity()) continue;
      if (std::isnan(x) || std::isnan(y)) {  // on either side, even against an empty part
        for (std::size_t c = 0; c < dim; ++c) ROPE_FUZZ_CHECK(std::isnan(widen(got[c])), at + ": a NaN lse");
        if (got_lse != nullptr) ROPE_FUZZ_CHECK(std::isnan(*got_lse), at + ": a NaN lse's lse");
        continue;
      }
      if (x == neg_inf && y == neg_inf) {
        for (std::size_t c = 0; c < dim; ++c) ROPE_FUZZ_CHECK(widen(got[c]) == 0, at + ": two empty parts");
        if (got_lse != nullptr) ROPE_FUZZ_CHECK(LD(*got_lse) == neg_inf, at + ": the lse of two empty parts");
        continue;
      }
      if (x == neg_inf || y == neg_inf) {  // one part alone, whatever the other row holds
        const std::vector<LD>& keep = x == neg_inf ? rb : ra_;
        for (std::size_t c = 0; c < dim; ++c) {
          const LD g = widen(got[c]);
          if (std::isnan(keep[c])) {
            ROPE_FUZZ_CHECK(std::isnan(g), at + ": the kept part's NaN");
          } else if (std::isfinite(keep[c])) {
            ROPE_FUZZ_CHECK(std::fabs(g - keep[c]) <= output_rounding<O>(keep[c]), at + ": the kept part");
          }
        }
        if (got_lse != nullptr) ROPE_FUZZ_CHECK(LD(*got_lse) == (x == neg_inf ? y : x), at + ": the kept part's lse");
        continue;
      }
      // Both finite: weights exp(l - M) off by u |l - M| + a few u each; the
      // products, the sum and the division add a few u of the weighted mean;
      // weights below float's range are 0 (an absolute 2^-120 of |a| + |b|).
      const LD m = std::max(x, y), wa = std::exp(x - m), wb = std::exp(y - m), l = wa + wb;
      const LD rel = u * (std::fabs(x - m) + std::fabs(y - m)) + 8 * u;
      for (std::size_t c = 0; c < dim; ++c) {
        const LD g = widen(got[c]);
        if (std::isnan(ra_[c]) || std::isnan(rb[c])) {
          ROPE_FUZZ_CHECK(std::isnan(g), at + ": a NaN value");
          continue;
        }
        if (!std::isfinite(ra_[c]) || !std::isfinite(rb[c])) continue;
        const LD want = (wa * ra_[c] + wb * rb[c]) / l;
        const LD mean = (wa * std::fabs(ra_[c]) + wb * std::fabs(rb[c])) / l;
        const LD bound = 2 * rel * mean + std::ldexp(std::fabs(ra_[c]) + std::fabs(rb[c]), -120) +
                         output_rounding<O>(std::fabs(want) + 2 * rel * mean);
        ROPE_FUZZ_CHECK(std::fabs(g - want) <= bound, at + " channel " + std::to_string(c) + ": got " +
                                                          std::to_string(double(g)) + ", want " +
                                                          std::to_string(double(want)));
      }
      if (got_lse != nullptr) {
        const LD want = m + std::log(l);
        ROPE_FUZZ_CHECK(std::fabs(LD(*got_lse) - want) <= 2 * (rel + u * std::fabs(want)),
                        at + ": lse " + std::to_string(*got_lse) + ", want " + std::to_string(double(want)));
      }
    }
  }
}

// attend over a decode token's keys split in two parts a and b (pages
// [0, pa) and [pa, pa + pb) of one pool; the union c shares a's pages), the
// sink given to a alone, then merge(a, b): equals attend over c within the
// parts' bounds, their lse's and the merge's rounding. Ties attend's
// log-sum-exp to what state.hpp merges.
template <class E>
void split_merge(Bytes& in) {
  const std::size_t ps = 1 + in.u8() % 4, hk = 1 + in.u8() % 2, group = 1 + in.u8() % 3, hq = hk * group;
  const std::size_t d = 1 + in.u8() % 8, dv = 1 + in.u8() % 5;
  const std::size_t pages_a = 1 + in.u8() % 3, pages_b = 1 + in.u8() % 3, pages = pages_a + pages_b;
  const std::size_t len_a = pages_a * ps, len_b = 1 + in.u8() % (pages_b * ps), len_c = len_a + len_b;
  const std::uint8_t layout = in.u8();
  ra::Mask mask;
  mask.causal = in.flag();
  ra::Logits with_sinks;
  if (in.flag()) with_sinks.scale = 0.05 + in.u8() / 64.0;
  if (in.u8() % 4 == 0) with_sinks.softcap = 0.5 + in.u8() / 16.0;
  if (in.flag()) {
    for (std::size_t h = 0; h < hq; ++h) {
      with_sinks.sinks.push_back(in.u8() % 8 == 0 ? -HUGE_VAL : (static_cast<int>(in.u8()) - 128) / 32.0);
    }
  }
  ra::Logits no_sinks = with_sinks;
  no_sinks.sinks.clear();
  const std::size_t splits[] = {1, 2, 3, 512};
  const std::size_t kv_split = splits[in.u8() % 4];
  const std::size_t rotate_by = in.u8() % pages;  // page ids rotated: the tables name pages in any order
  const bool in_place = in.flag();
  PoolData<E> kp, vp;
  make_pool(kp, in, pages, ps, hk, d, layout);
  make_pool(vp, in, pages, ps, hk, dv, layout);
  const ra::PagedCache<E> cache{kp.pool, vp.pool};
  const std::vector<float> q = rows_of<float>(in, hq * d);
  std::vector<float> q2(2 * hq * d);
  std::copy(q.begin(), q.end(), q2.begin());
  std::copy(q.begin(), q.end(), q2.begin() + static_cast<std::ptrdiff_t>(hq * d));

  std::vector<std::int32_t> ids(pages);
  for (std::size_t i = 0; i < pages; ++i) ids[i] = static_cast<std::int32_t>((i + rotate_by) % pages);
  ra::Shape shape = ra::Shape::of(cache, hq);
  shape.kv_split = kv_split;
  // Sequences c (every page) and a (the first pages_a; its row's tail unread).
  const std::int64_t starts_ca[3] = {0, 1, 2},
                     lengths_ca[2] = {static_cast<std::int64_t>(len_c), static_cast<std::int64_t>(len_a)};
  std::vector<std::int32_t> table_ca(2 * pages);
  std::copy(ids.begin(), ids.end(), table_ca.begin());
  std::copy(ids.begin(), ids.end(), table_ca.begin() + static_cast<std::ptrdiff_t>(pages));
  ra::Plan plan_ca, plan_b;
  ra::plan(plan_ca, shape, ra::Batch{starts_ca, lengths_ca, table_ca.data(), pages, 2});
  const std::int64_t starts_b[2] = {0, 1}, length_b = static_cast<std::int64_t>(len_b);
  ra::plan(plan_b, shape, ra::Batch{starts_b, &length_b, ids.data() + pages_a, pages_b, 1});
  std::vector<float> out_ca(2 * hq * dv), lse_ca(2 * hq), out_b(hq * dv), lse_b(hq), merged(hq * dv), lse_m(hq);
  ra::attend(plan_ca, cache, rope::View<const float>::token_major(q2.data(), 2, hq, d),
             rope::View<float>::token_major(out_ca.data(), 2, hq, dv), with_sinks, mask, lse_ca.data());
  ra::attend(plan_b, cache, rope::View<const float>::token_major(q.data(), 1, hq, d),
             rope::View<float>::token_major(out_b.data(), 1, hq, dv), no_sinks, mask, lse_b.data());
  const auto a_view = rope::View<const float>::token_major(out_ca.data() + hq * dv, 1, hq, dv);
  if (in_place) {  // into b's own rows
    ra::merge(a_view, lse_ca.data() + hq, rope::View<const float>::token_major(out_b.data(), 1, hq, dv), lse_b.data(),
              rope::View<float>::token_major(out_b.data(), 1, hq, dv), lse_b.data());
    merged = out_b;
    lse_m = lse_b;
  } else {
    ra::merge(a_view, lse_ca.data() + hq, rope::View<const float>::token_major(out_b.data(), 1, hq, dv), lse_b.data(),
              rope::View<float>::token_major(merged.data(), 1, hq, dv), lse_m.data());
  }

  const LogitsIn<float> li_sinks(with_sinks, hq, d), li_plain(no_sinks, hq, d);
  const std::string where = "split merge pages=" + std::to_string(pages_a) + "+" + std::to_string(pages_b) + "x" +
                            std::to_string(ps) + " heads=" + std::to_string(hq) + "/" + std::to_string(hk) +
                            " d=" + std::to_string(d) + "/" + std::to_string(dv) + " split=" + std::to_string(kv_split);
  const LD u = unit_roundoff<float>();
  for (std::size_t h = 0; h < hq; ++h) {
    const std::size_t g = h / group;
    std::vector<LD> qr(d);
    for (std::size_t c = 0; c < d; ++c) qr[c] = q[h * d + c];
    const auto want_of = [&](std::size_t first_page, std::size_t length, const LogitsIn<float>& li) {
      std::vector<Scored> keys;
      bool finite = finite_all(qr);
      for (std::size_t j = 0; j < length; ++j) {
        const std::size_t slot = static_cast<std::size_t>(ids[first_page + j / ps]) * ps + j % ps;
        Scored s;
        for (std::size_t c = 0; c < d; ++c) {
          const LD kc = stored(kp.pool, slot, g, c);
          finite = finite && std::isfinite(kc);
          s.dot += qr[c] * kc;
          s.magnitude += std::fabs(qr[c]) * std::fabs(kc);
        }
        for (std::size_t c = 0; c < dv; ++c) {
          s.v.push_back(stored(vp.pool, slot, g, c));
          finite = finite && std::isfinite(s.v.back());
        }
        keys.push_back(std::move(s));
      }
      return softmax_want<float>(keys, d, dv, li, h, finite, false, {});
    };
    const Want wc = want_of(0, len_c, li_sinks), wa = want_of(0, len_a, li_sinks),
               wb = want_of(pages_a, len_b, li_plain);
    if (!wc.finite) continue;
    const LD mag = std::max(wa.magnitude, wb.magnitude);
    const LD rel = u * (std::fabs(wa.lse - wc.lse) + std::fabs(wb.lse - wc.lse)) + 8 * u;
    const LD bound = wa.tolerance + wb.tolerance + 2 * (wa.lse_tolerance + wb.lse_tolerance) * mag + 2 * rel * mag +
                     std::ldexp(mag, -118);
    const std::string at = where + " head " + std::to_string(h);
    for (std::size_t c = 0; c < dv; ++c) {
      const LD got = merged[h * dv + c];
      ROPE_FUZZ_CHECK(std::fabs(got - wc.out[c]) <= bound,
                      at + " channel " + std::to_string(c) + ": merged " + std::to_string(double(got)) + ", whole " +
                          std::to_string(double(wc.out[c])) + ", bound " + std::to_string(double(bound)));
    }
    const LD lse_bound = wa.lse_tolerance + wb.lse_tolerance + 2 * (rel + u * std::fabs(wc.lse));
    ROPE_FUZZ_CHECK(std::fabs(LD(lse_m[h]) - wc.lse) <= lse_bound,
                    at + ": merged lse " + std::to_string(lse_m[h]) + ", whole " + std::to_string(double(wc.lse)));
  }
}

}  // namespace

void fuzz_softmax(Bytes& in) {
  switch (in.u8() % 4) {
    case 0: softmax_typed<float>(in); break;
    case 1: softmax_typed<double>(in); break;
    case 2: fuzz_step(in, true); break;
    default: fuzz_step(in, false); break;
  }
}

void fuzz_linear(Bytes& in) {
  switch (in.u8() % 3) {
    case 0: linear_features<float>(in); break;
    case 1: linear_features<double>(in); break;
    default: linear_views(in); break;
  }
}

namespace {
// q and out row types of attend: (float, float), (bf16, float), (float, f16).
template <class E>
void attend_any(Bytes& in) {
  switch (in.u8() % 3) {
    case 0: attend_typed<E, float, float>(in); break;
    case 1: attend_typed<E, rope::BFloat16, float>(in); break;
    default: attend_typed<E, float, rope::Float16>(in); break;
  }
}
}  // namespace

void fuzz_attend(Bytes& in) {
  switch (in.u8() % 4) {
    case 0: attend_any<float>(in); break;
    case 1: attend_any<rope::BFloat16>(in); break;
    case 2: attend_any<rope::Float16>(in); break;
    default: any_scaled_byte(in, [&](auto e) { attend_any<decltype(e)>(in); }); break;
  }
}

void fuzz_merge(Bytes& in) {
  switch (in.u8() % 6) {
    case 0: merge_typed<float, float, float>(in); break;
    case 1: merge_typed<rope::BFloat16, float, float>(in); break;
    case 2: merge_typed<float, rope::Float16, rope::BFloat16>(in); break;
    case 3: merge_typed<rope::Float16, rope::Float16, rope::Float16>(in); break;
    case 4: split_merge<float>(in); break;
    default:
      switch (in.u8() % 3) {
        case 0: split_merge<rope::BFloat16>(in); break;
        case 1: split_merge<rope::Float16>(in); break;
        default: split_merge<std::int8_t>(in); break;
      }
      break;
  }
}

}  // namespace rope_fuzz

#else

namespace rope_fuzz {
void fuzz_softmax(Bytes&) {}
void fuzz_linear(Bytes&) {}
void fuzz_attend(Bytes&) {}
void fuzz_merge(Bytes&) {}
}  // namespace rope_fuzz

#endif
