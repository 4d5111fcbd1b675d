// The fuzz target's decoders of the serving path's writes: append over
// paged caches of f32, bf16, f16, int8 and fp8 (the K/V form and the form
// with Q: QK-norm, RoPE, multi-axis positions, the cache write), and one
// sequence's whole step over a contiguous cache (plan, append, attend). A
// unit of its own beside fuzz_attention.cpp, so that the fuzz target's
// heaviest code builds on two cores at once. The rules a decoded call is
// judged by: fuzz_attention.cpp's header comment.
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
// append.

// append over a paged cache of E from rows of In (float or bf16), with Q
// (q_out of QO) or in its K/V form: a drawn step (as attend_typed's), per-
// head, whole-projection or no QK-norm on either side, plus_one, eps valid
// or not (0, NaN, negative, infinite, 1e300 and 1e-60: not finite or 0 in
// float), RoPE (either pairing, a partial or invalid rotary_dim, a table
// without its pairing, positions past the table) or multi-axis positions
// (pair axes valid or not, positions in and outside the table),
// write_back_k, threads or an executor, and broken views: k or v of the
// wrong shape, k already in its own slots (accepted) or elsewhere in the
// cache, k inside cache.v, v over k, q or q_out over the cache, q_out over
// k or shifted over q, broken norm weights and scales, a read-only k to
// write back, a new token into a page another sequence reads. A refused
// call throws the documented exception and writes nothing; an accepted one
// writes q_out, the slots of the plan's tokens (and k with write_back_k),
// each value within one rounding of the long-double rotation of the float
// RMSNorm (the documented order, replicated) of its input, the same bytes
// with one thread, and nothing else.
template <class E, class In, class QO>
void append_typed(Bytes& in, bool with_q) {
  constexpr bool scaled = rope::KvElement<E>::kScaled;
  constexpr bool same_rows_type = std::is_same<In, QO>::value;
  const std::size_t pages = 1 + in.u8() % 4, ps = 1 + in.u8() % 4, hk = 1 + in.u8() % 2, group = 1 + in.u8() % 3,
                    d = 1 + in.u8() % 8, dv = 1 + in.u8() % 5;
  const std::size_t hq = hk * group;
  const std::uint8_t layout = in.u8();
  // Read before the long arrays; 0 (what a short input reads) breaks nothing.
  const std::uint8_t view_break = in.u8() % 16;
  DrawnBatch b;
  draw_batch(b, in, pages, ps);
  const std::size_t tokens = b.tokens;
  // The norm: 0 none, 1 per head, 2 over the whole projection.
  const std::uint8_t norm_mode = in.u8() % 3, sides = in.u8() % 4;  // sides 1: Q only, 2: K only, else both
  ra::AppendOptions o;
  o.whole_projection = norm_mode == 2;
  o.plus_one = in.flag();
  o.write_back_k = in.flag();
  const DrawnThreads threads = draw_threads(in);
  const double eps_values[] = {1e-6, 1e-5, 1e-3, 0.0, std::nan(""), -1e-6, HUGE_VAL, 1e-60, 1e300};
  o.eps = eps_values[in.u8() % 9];
  const bool q_in_place = with_q && same_rows_type && in.flag();
  const std::size_t q_size = o.whole_projection ? hq * d : d, k_size = o.whole_projection ? hk * d : d;
  std::vector<float> q_weight(q_size + 1), k_weight(k_size + 1);
  for (auto& w : q_weight) w = static_cast<float>((static_cast<int>(in.u8()) - 127) / 64.0);
  for (auto& w : k_weight) w = static_cast<float>((static_cast<int>(in.u8()) - 127) / 64.0);
  if (norm_mode != 0) {
    if (with_q && sides != 2) o.q_norm = {q_weight.data(), q_size};
    if (sides != 1) o.k_norm = {k_weight.data(), k_size};
  }
  const bool rotate = in.flag();
  const std::size_t table_dim = 2 * (1 + in.u8() % 4), table_positions = 1 + in.u8() % 12;
  const rope::Table<float> table(rope::frequencies(table_dim, 100.0), table_positions);
  rope::Style style = rope::Style::rotate_half;
  std::size_t asked = 0;
  if (rotate) {
    style = in.flag() ? rope::Style::rotate_half : rope::Style::block_diagonal;
    asked = in.u8() % 4 == 0 ? in.u8() % 10 : 0;
    o.rotation = ra::Rotation<float>(&table, style, asked);
  }
  const std::size_t r = rotate ? (asked == 0 ? table_dim : asked) : 0;
  // Multi-axis positions: pair p of token t at axis_positions[axis[p] * tokens + t].
  const std::uint8_t axes_mode = rotate ? in.u8() % 8 : 0;
  const bool multi = axes_mode == 1 || axes_mode == 2;
  rope::PairAxes pair_axes;
  if (multi) {
    pair_axes.axes = 1 + in.u8() % 3;
    pair_axes.axis.resize(r / 2);
    for (auto& a : pair_axes.axis) a = static_cast<std::uint8_t>(in.u8() % pair_axes.axes);
    if (axes_mode == 2) {
      const std::uint8_t kind = in.u8() % 3;
      if (kind == 0) {
        pair_axes.axes = 0;
      } else if (kind == 1 || pair_axes.axis.empty()) {
        pair_axes.axis.push_back(0);
      } else {
        pair_axes.axis[in.u8() % pair_axes.axis.size()] = static_cast<std::uint8_t>(pair_axes.axes);
      }
    }
  }
  Exact<std::int64_t> axis_positions(multi ? pair_axes.axes * tokens : 0);
  for (std::size_t i = 0; i < axis_positions.n; ++i) {
    axis_positions[i] = in.u8() % 16 == 0 ? (in.flag() ? std::int64_t(-1) : static_cast<std::int64_t>(table_positions))
                                          : static_cast<std::int64_t>(in.u8() % table_positions);
  }
  if (multi) {
    o.pair_axes = &pair_axes;
    // Null only where there are tokens: with none, append.hpp means to
    // accept a null array but refuses it (reported with this target).
    o.axis_positions = tokens > 0 && in.u8() % 16 == 0 ? nullptr : axis_positions.data();
  }

  PoolData<E> kp, vp;
  make_pool(kp, in, pages, ps, hk, d, layout);
  make_pool(vp, in, pages, ps, hk, dv, layout);
  const ra::Shape of = ra::Shape::of(ra::PagedCache<E>{kp.pool, vp.pool}, hq);
  const DrawnShape shape = draw_shape(in, of);
  // k's buffer is large enough for q_out over it and for rows of d + 1.
  std::vector<In> q = rows_of<In>(in, (tokens + 1) * hq * d), k = rows_of<In>(in, (tokens + 1) * hq * (d + 1)),
                  v = rows_of<In>(in, (tokens + 1) * hk * dv);
  std::vector<QO> q_out((tokens + 1) * hq * d, from_float<QO>(-9.0f));

  std::string where =
      std::string(with_q ? "append" : "append k/v") + " pages=" + std::to_string(pages) + "x" + std::to_string(ps) +
      " heads=" + std::to_string(hq) + "/" + std::to_string(hk) + " d=" + std::to_string(d) + "/" + std::to_string(dv) +
      " tokens=" + std::to_string(tokens) + " r=" + std::to_string(r) + " norm=" + std::to_string(norm_mode) + "/" +
      std::to_string(sides) + " in_place=" + std::to_string(q_in_place) + " back=" + std::to_string(o.write_back_k) +
      " break=" + std::to_string(view_break) + "/" + std::to_string(b.broken) + " axes=" + std::to_string(axes_mode);
  ra::Plan plan;
  plan_before(plan, of, tokens);
  const bool planned = plan_step(plan, shape, b, threads, where);

  rope::View<In> qv = rope::View<In>::token_major(q.data(), tokens, hq, d);
  rope::View<In> kv = rope::View<In>::token_major(k.data(), tokens, hk, d);
  rope::View<In> vv = rope::View<In>::token_major(v.data(), tokens, hk, dv);
  rope::View<QO> ov = rope::View<QO>::token_major(q_out.data(), tokens, hq, d);
  if constexpr (same_rows_type) {
    if (q_in_place) ov = rope::View<QO>::token_major(q.data(), tokens, hq, d);
  }
  bool valid = true, read_only = false, k_in_place = false, styled = true;
  switch (view_break) {
    case 1:
      kv.data = nullptr;
      valid = false;
      break;
    case 2:
      vv.tokens = tokens + 1;
      valid = false;
      break;
    case 3:
      kv = rope::View<In>::token_major(k.data(), tokens, hk, d + 1);
      valid = false;
      break;
    case 4:
    case 5:
      // k as rows of the cache's pages: accepted only where each row is the
      // row of its own slot (the projection wrote into the cache).
      if constexpr (std::is_same<E, In>::value) {
        if (planned && shape.fits && tokens > 0) {
          const auto first = static_cast<std::size_t>(b.slots[0]);
          const std::size_t page = view_break == 4 ? first / ps : in.u8() % pages;
          const std::size_t offset = view_break == 4 ? first % ps : in.u8() % ps;
          if (offset + tokens <= ps) {
            kv = kp.pool.page(page).slice_tokens(offset, tokens);
            k_in_place = true;
            for (std::size_t t = 0; t < tokens; ++t) {
              for (std::size_t h = 0; h < hk; ++h) {
                k_in_place = k_in_place && kv.row(t, h) == kp.pool.row(static_cast<std::size_t>(b.slots[t]), h);
              }
            }
            valid = k_in_place;
          }
        }
      }
      break;
    case 6:
      if (tokens > 0 && tokens * hk * d * sizeof(In) <= vp.data.size() * sizeof(E)) {
        kv = rope::View<In>::token_major(reinterpret_cast<In*>(vp.data.data()), tokens, hk, d);  // k inside cache.v
        valid = false;
      }
      break;
    case 7:
      (scaled ? kp.pool.scales : vp.pool.scales) = scaled ? nullptr : vp.scales.data();
      valid = false;
      break;
    case 8:
      if (!with_q) {
        o.q_norm = {q_weight.data(), d};  // the K/V form writes no Q
        valid = false;
      } else if (o.q_norm.data != nullptr) {
        o.q_norm.size += 1;
        valid = false;
      }
      break;
    case 9:
      o.k_norm = {nullptr, std::max<std::size_t>(o.k_norm.size, 1)};
      valid = false;
      break;
    case 10:
      read_only = true;
      o.write_back_k = true;
      valid = false;
      break;
    case 11:
      if (with_q) {
        if constexpr (same_rows_type) {
          if (tokens > 0 && !q_in_place) {
            ov = rope::View<QO>::token_major(k.data(), tokens, hq, d);  // q_out over k
            valid = false;
          }
        }
      } else if (tokens > 0 && tokens * hk * dv <= k.size()) {
        vv = rope::View<In>::token_major(k.data(), tokens, hk, dv);  // v over k: both only read
        valid = valid && !o.write_back_k;
      }
      break;
    case 12:
      if constexpr (same_rows_type) {
        if (with_q && !q_in_place && tokens * hq * d > 1) {
          ov = rope::View<QO>::token_major(q.data() + 1, tokens, hq, d);  // over q, shifted
          valid = false;
        }
      }
      break;
    case 13:
      if (rotate) {
        o.rotation = ra::Rotation<float>();  // a table set by hand, without its pairing
        o.rotation.table = &table;
        o.rotation.rotary_dim = asked;
        styled = false;
        valid = false;
      }
      break;
    case 14:
      if (with_q && tokens > 0 && tokens * hq * d * sizeof(In) <= kp.data.size() * sizeof(E)) {
        qv = rope::View<In>::token_major(reinterpret_cast<In*>(kp.data.data()), tokens, hq, d);  // q over cache.k
        valid = false;
      }
      break;
    case 15:
      if (with_q && tokens > 0 && tokens * hq * d * sizeof(QO) <= vp.data.size() * sizeof(E)) {
        ov = rope::View<QO>::token_major(reinterpret_cast<QO*>(vp.data.data()), tokens, hq, d);  // q_out over cache.v
        valid = false;
      }
      break;
    default: break;
  }
  const ra::PagedCache<E> cache{kp.pool, vp.pool};
  const PoolBefore<E> kb = before(kp), vb = before(vp);
  const auto q_input = q, k_input = k, v_input = v;
  const auto out_before = q_out;

  // Validity, judged here from append.hpp.
  if (o.q_norm.data != nullptr || o.k_norm.data != nullptr) {
    valid = valid && o.eps > 0 && std::isfinite(o.eps) && std::isfinite(static_cast<float>(o.eps)) &&
            static_cast<float>(o.eps) > 0;
  }
  if (rotate && styled) valid = valid && r % 2 == 0 && r <= table_dim && r <= d;
  bool in_table = true;
  if (rotate && styled && !multi) {
    for (std::int64_t p : b.positions) valid = valid && p < static_cast<std::int64_t>(table_positions);
  }
  if (rotate && styled && multi) {
    valid = valid && pair_axes.axes >= 1 && pair_axes.axes <= 256 && pair_axes.axis.size() == r / 2;
    for (std::uint8_t a : pair_axes.axis) valid = valid && a < pair_axes.axes;
    valid = valid && (o.axis_positions != nullptr || tokens == 0);
    for (std::size_t i = 0; i < axis_positions.n && o.axis_positions != nullptr; ++i) {
      in_table = in_table && axis_positions[i] >= 0 && axis_positions[i] < static_cast<std::int64_t>(table_positions);
    }
  }
  const bool args_ok = planned && shape.fits && !b.shared_write && valid;
  // The rows as they were (k may be the cache's own rows).
  std::vector<std::vector<float>> q_rows, k_rows, v_rows;
  if (args_ok) {
    if (with_q) q_rows = token_rows(qv);
    k_rows = token_rows(kv);
    v_rows = token_rows(vv);
  }

  bool threw = false;
  try {
    if (with_q) {
      if (read_only) {
        ra::append(plan, cache, rope::View<const In>(qv), rope::View<const In>(kv), rope::View<const In>(vv), ov, o);
      } else {
        ra::append(plan, cache, qv, kv, vv, ov, o);
      }
    } else {
      if (read_only) {
        ra::append(plan, cache, rope::View<const In>(kv), rope::View<const In>(vv), o);
      } else {
        ra::append(plan, cache, kv, vv, o);
      }
    }
  } catch (const rope::invalid_argument& e) {
    threw = true;
    ROPE_FUZZ_CHECK(!args_ok, where + ": " + e.what());
    ROPE_FUZZ_CHECK(named(e, "rope::attention::append"), e.what());
    if (!planned) check_no_plan(e, "rope::attention::append", where);
  } catch (const rope::out_of_range& e) {
    threw = true;
    ROPE_FUZZ_CHECK(args_ok && !in_table, where + ": " + e.what());
    ROPE_FUZZ_CHECK(named(e, "rope::attention::append"), e.what());
  }
  ROPE_FUZZ_CHECK(same_bytes(v, v_input), where + ": v written");
  if (threw) {
    ROPE_FUZZ_CHECK(same_bytes(q, q_input), where + ": q written");
    ROPE_FUZZ_CHECK(same_bytes(k, k_input), where + ": k written");
    ROPE_FUZZ_CHECK(same_bytes(q_out, out_before), where + ": q_out written");
    ROPE_FUZZ_CHECK(unchanged(kp, kb) && unchanged(vp, vb), where + ": a refused call wrote the cache");
    return;
  }
  ROPE_FUZZ_CHECK(args_ok && in_table, where + ": an invalid call was accepted");

  // The same step with one thread: the same bytes everywhere.
  if (threads.parallel() && view_break == 0 && !q_in_place) {
    ra::Plan one;
    ra::plan(one, shape.shape, b.batch, std::size_t{1});
    PoolData<E> k1 = kp, v1 = vp;
    k1.data = kb.data;
    k1.scales = kb.scales;
    v1.data = vb.data;
    v1.scales = vb.scales;
    k1.pool.data = k1.data.data();
    v1.pool.data = v1.data.data();
    if (scaled) {
      k1.pool.scales = k1.scales.data();
      v1.pool.scales = v1.scales.data();
    }
    auto k_copy = k_input;
    auto out_copy = out_before;
    const rope::View<In> k1v = rebased(kv, k.data(), k_copy.data());
    if (with_q) {
      ra::append(one, ra::PagedCache<E>{k1.pool, v1.pool}, qv, k1v, vv, rebased(ov, q_out.data(), out_copy.data()), o);
    } else {
      ra::append(one, ra::PagedCache<E>{k1.pool, v1.pool}, k1v, vv, o);
    }
    ROPE_FUZZ_CHECK(same_bytes(k1.data, kp.data) && same_bytes(k1.scales, kp.scales) && same_bytes(v1.data, vp.data) &&
                        same_bytes(v1.scales, vp.scales) && same_bytes(k_copy, k) && same_bytes(out_copy, q_out),
                    where + ": not the same bytes with one thread");
  }

  // The oracle: each token's heads of one side widened, normalized in float
  // as documented, rotated in long double from the table's own cos/sin at
  // the plan's position (or each pair at its axis' position).
  const float eps = static_cast<float>(o.eps);
  const auto oracle = [&](const std::vector<std::vector<float>>& rows, std::size_t t, std::size_t heads,
                          const ra::NormWeights& w) {
    std::vector<float> x(heads * d);
    for (std::size_t h = 0; h < heads; ++h)
      std::copy(rows[t * heads + h].begin(), rows[t * heads + h].end(), &x[h * d]);
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
    std::vector<std::vector<LD>> out(heads);
    for (std::size_t h = 0; h < heads; ++h) {
      out[h].assign(x.begin() + h * d, x.begin() + (h + 1) * d);
      if (!rotate) continue;
      if (multi) {
        out[h] = rotate_pairs(out[h], table, style, r,
                              [&](std::size_t p) { return axis_positions[pair_axes.axis[p] * tokens + t]; });
      } else {
        out[h] = rotate_ld(out[h], table, style, r, b.positions[t]);
      }
    }
    return out;
  };
  // A row of In or QO values against the oracle's: each finite value within
  // one rounding.
  const auto check_values = [&](const auto* got, const std::vector<LD>& want, const std::string& at) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(got)>>;
    if (!finite_all(want)) return;
    const LD top = top_of(want);
    for (std::size_t c = 0; c < want.size(); ++c) {
      const LD g = rope::detail::widen_value(got[c]);
      ROPE_FUZZ_CHECK(within_one_rounding<T>(g, want[c], top), at + " channel " + std::to_string(c) + ": got " +
                                                                   std::to_string(double(g)) + ", want " +
                                                                   std::to_string(double(want[c])));
    }
  };
  std::vector<std::vector<std::vector<LD>>> k_want(tokens);
  for (std::size_t t = 0; t < tokens; ++t) {
    if (with_q) {
      const auto q_want = oracle(q_rows, t, hq, o.q_norm);
      for (std::size_t h = 0; h < hq; ++h) {
        check_values(static_cast<const QO*>(ov.row(t, h)), q_want[h],
                     where + ": q_out token " + std::to_string(t) + " head " + std::to_string(h));
      }
    }
    k_want[t] = oracle(k_rows, t, hk, o.k_norm);
    for (std::size_t h = 0; h < hk && o.write_back_k && !k_in_place; ++h) {
      check_values(static_cast<const In*>(kv.row(t, h)), k_want[t][h],
                   where + ": k written back, token " + std::to_string(t) + " head " + std::to_string(h));
    }
  }
  if (!o.write_back_k || k_in_place) {
    ROPE_FUZZ_CHECK(same_bytes(k, k_input), where + ": k written");
  } else {  // only k's rows: with them put back, k is as it was
    auto k_rest = k;
    for (std::size_t t = 0; t < tokens; ++t) {
      for (std::size_t h = 0; h < hk; ++h) {
        const auto at = static_cast<std::ptrdiff_t>(kv.row(t, h) - k.data());
        std::copy(k_input.begin() + at, k_input.begin() + at + static_cast<std::ptrdiff_t>(d), k_rest.begin() + at);
      }
    }
    ROPE_FUZZ_CHECK(same_bytes(k_rest, k_input), where + ": k written outside its rows");
  }
  if (!q_in_place) {
    ROPE_FUZZ_CHECK(same_bytes(q, q_input), where + ": q written");
    // Past q_out's rows nothing is written.
    const std::size_t end = with_q ? tokens * hq * d : 0;
    ROPE_FUZZ_CHECK(std::memcmp(q_out.data() + end, out_before.data() + end, (q_out.size() - end) * sizeof(QO)) == 0,
                    where + ": past q_out");
  }

  // Every slot no token writes is as it was; a written one holds its token's
  // K row (normalized, rotated) or V row, rounded once.
  std::vector<std::int64_t> writer(pages * ps, -1);
  for (std::size_t t = 0; t < tokens; ++t) writer[static_cast<std::size_t>(b.slots[t])] = static_cast<std::int64_t>(t);
  check_written(
      kp, kb, writer, [&](std::size_t t, std::size_t h) { return k_want[t][h]; }, where + ": k");
  check_written(
      vp, vb, writer,
      [&](std::size_t t, std::size_t h) {
        return std::vector<LD>(v_rows[t * hk + h].begin(), v_rows[t * hk + h].end());
      },
      where + ": v");
}

// ---------------------------------------------------------------------------
// One sequence's step over a contiguous cache.

// A step of one sequence over its contiguous cache (PagedCache::contiguous,
// token- or head-major rows) and the plan of one sequence: `cached` keys
// before, n new ones, sometimes more than the capacity (plan refused, and
// the plan it held before then refused by append and attend). Then append
// (with Q, or the K/V form with Q rotated by rope::apply at
// plan.positions()) and attend on append's Q. A refused call writes
// nothing; an accepted append writes the new tokens' slots, within one
// rounding of their rotated rows (a float cache: the bytes of rope::apply,
// as is q_out), and attend equals the oracle over the cache as it then is.
template <class E>
void step_typed(Bytes& in) {
  constexpr bool scaled = rope::KvElement<E>::kScaled;
  const std::size_t capacity = 1 + in.u8() % 10, cached = in.u8() % (capacity + 2), n = in.u8() % 4;
  const std::size_t hk = 1 + in.u8() % 2, group = 1 + in.u8() % 3, hq = hk * group;
  const std::size_t d = 2 * (1 + in.u8() % 4), dv = 1 + in.u8() % 4, table_positions = 1 + in.u8() % 20;
  const rope::Table<float> table(rope::frequencies(d, 100.0), table_positions);
  const rope::Style style = in.flag() ? rope::Style::rotate_half : rope::Style::block_diagonal;
  const bool head_major = in.flag(), kv_form = in.u8() % 4 == 0;
  const DrawnThreads threads = draw_threads(in);
  ra::Mask mask;
  mask.causal = in.flag();
  mask.window = in.u8() % 4 == 0 ? in.u8() % 5 : 0;
  const std::size_t splits[] = {1, 2, 3, 512};
  const std::size_t kv_split = splits[in.u8() % 4];
  const std::uint8_t view_break = in.u8() % 8;
  const DrawnLogits logits = draw_logits<float>(in, hq);

  PoolData<E> kp, vp;
  kp.data.assign(capacity * hk * d, poison<E>());
  vp.data.assign(capacity * hk * dv, poison<E>());
  kp.scales.assign(capacity * hk, 0.0f);
  vp.scales.assign(capacity * hk, 0.0f);
  const auto rows = [&](std::vector<E>& data, std::size_t dim) {
    return head_major ? rope::View<E>::head_major(data.data(), capacity, hk, dim)
                      : rope::View<E>::token_major(data.data(), capacity, hk, dim);
  };
  ra::PagedCache<E> cache = ra::PagedCache<E>::contiguous(
      rows(kp.data, d), rows(vp.data, dv), scaled ? kp.scales.data() : nullptr, scaled ? vp.scales.data() : nullptr);
  kp.pool = cache.k;
  vp.pool = cache.v;
  fill_rows(kp.pool, in);
  fill_rows(vp.pool, in);
  auto q = elements<float>(in, n * hq * d), k_new = elements<float>(in, n * hk * d),
       v_new = elements<float>(in, n * hk * dv);
  std::vector<float> q_out(std::max<std::size_t>(n * hq * d, 1), -9.0f);
  std::vector<float> out(n * hq * dv + 1, -9.0f), lse(n * hq + 1, -9.0f);

  ra::Shape shape = ra::Shape::of(cache, hq);
  shape.kv_split = kv_split;
  const std::string where = "step capacity=" + std::to_string(capacity) + " cached=" + std::to_string(cached) +
                            " n=" + std::to_string(n) + " heads=" + std::to_string(hq) + "/" + std::to_string(hk) +
                            " d=" + std::to_string(d) + "/" + std::to_string(dv) +
                            " kv_form=" + std::to_string(kv_form) + " break=" + std::to_string(view_break);
  ra::Plan plan;
  if (n <= capacity) ra::plan(plan, shape, 0, n);  // a plan these views fit, before the one under test
  const bool plan_valid = cached + n <= capacity && threads.valid;
  bool planned = true;
  try {
    ra::plan(plan, shape, cached, n, threads.threads);
  } catch (const rope::invalid_argument& e) {
    planned = false;
    ROPE_FUZZ_CHECK(!plan_valid, where + ": plan refused a valid step: " + e.what());
    ROPE_FUZZ_CHECK(named(e, "rope::attention::plan"), e.what());
  }
  ROPE_FUZZ_CHECK(planned == plan_valid, where + ": plan accepted an invalid step");
  for (std::size_t t = 0; t < n && planned; ++t) {
    ROPE_FUZZ_CHECK(plan.position(t) == static_cast<std::int64_t>(cached + t) &&
                        plan.slot(t) == static_cast<std::int64_t>(cached + t),
                    where + ": a new token's position or slot");
  }

  ra::AppendOptions ao;
  ao.rotation = ra::Rotation<float>(&table, style);
  rope::View<const float> kv = rope::View<const float>::token_major(k_new.data(), n, hk, d);
  rope::View<float> qo = rope::View<float>::token_major(q_out.data(), n, hq, d);
  rope::View<float> ov = rope::View<float>::token_major(out.data(), n, hq, dv);
  float* lse_ptr = lse.data();
  bool append_ok = true, attend_ok = true;
  switch (view_break) {
    case 1:
      if constexpr (std::is_same<E, float>::value) {
        if (n > 0 && cached + n <= capacity) {
          kv = cache.k.page(0).slice_tokens(cached, n);  // already in its own slots
        }
      }
      break;
    case 2:
      if constexpr (std::is_same<E, float>::value) {
        if (n > 0 && cached > 0 && n <= capacity) {
          kv = cache.k.page(0).slice_tokens(0, n);  // in the cache, not its slots
          append_ok = false;
        }
      }
      break;
    case 3:
      ao.rotation = ra::Rotation<float>();  // a table set by hand, without its pairing
      ao.rotation.table = &table;
      append_ok = false;
      break;
    case 4:
      if (n > 0 && dv <= d) {
        ov = rope::View<float>::token_major(q_out.data(), n, hq, dv);  // out over attend's q
        attend_ok = false;
      }
      break;
    case 5:
      if (n > 0) {
        lse_ptr = out.data();  // lse over out
        attend_ok = false;
      }
      break;
    case 6:
      if (!kv_form && n > 0 && n * hq * d * sizeof(float) <= kp.data.size() * sizeof(E)) {
        qo = rope::View<float>::token_major(reinterpret_cast<float*>(kp.data.data()), n, hq, d);  // q_out over cache.k
        append_ok = false;
      }
      break;
    default: break;
  }
  for (std::size_t t = 0; t < n; ++t) append_ok = append_ok && cached + t < table_positions;
  append_ok = append_ok && planned;
  const PoolBefore<E> kb = before(kp), vb = before(vp);
  const auto q_before = q, k_before = k_new, q_out_before = q_out;
  std::vector<std::vector<float>> k_rows;
  if (append_ok) k_rows = token_rows(kv);

  bool threw = false;
  try {
    if (kv_form) {
      ra::append(plan, cache, kv, rope::View<const float>::token_major(v_new.data(), n, hk, dv), ao);
    } else {
      ra::append(plan, cache, rope::View<const float>::token_major(q.data(), n, hq, d), kv,
                 rope::View<const float>::token_major(v_new.data(), n, hk, dv), qo, ao);
    }
  } catch (const rope::invalid_argument& e) {
    threw = true;
    ROPE_FUZZ_CHECK(!append_ok, where + ": append: " + e.what());
    ROPE_FUZZ_CHECK(named(e, "rope::attention::append"), e.what());
    if (!planned) check_no_plan(e, "rope::attention::append", where);
  }
  ROPE_FUZZ_CHECK(same_bytes(q, q_before) && same_bytes(k_new, k_before), where + ": q or k written");
  if (threw) {
    ROPE_FUZZ_CHECK(unchanged(kp, kb) && unchanged(vp, vb), where + ": a refused append wrote the cache");
    ROPE_FUZZ_CHECK(same_bytes(q_out, q_out_before), where + ": a refused append wrote q_out");
  } else {
    ROPE_FUZZ_CHECK(append_ok, where + ": append accepted an invalid call");
    // Q rotated by the caller at the plan's positions (the K/V form), else
    // append's own q_out: the bytes of rope::apply at those positions.
    std::vector<float> q_apply(q_out.size(), -9.0f);
    // (With no new tokens plan.positions() is null, which rope::apply
    // refuses even for no tokens: reported with this target.)
    if (n > 0) {
      rope::apply<float>(rope::View<const float>::token_major(q.data(), n, hq, d),
                         rope::View<float>::token_major(q_apply.data(), n, hq, d), table, style,
                         rope::Positions(plan.positions()));
    }
    if (kv_form) {
      q_out = q_apply;
    } else {
      ROPE_FUZZ_CHECK(same_bytes(q_out, q_apply), where + ": q_out is not rope::apply's bytes");
    }
    std::vector<std::int64_t> writer(capacity, -1);
    for (std::size_t t = 0; t < n; ++t) writer[cached + t] = static_cast<std::int64_t>(t);
    std::vector<std::vector<std::vector<LD>>> k_want(n);
    for (std::size_t t = 0; t < n; ++t) {
      for (std::size_t h = 0; h < hk; ++h) {
        const std::vector<LD> x(k_rows[t * hk + h].begin(), k_rows[t * hk + h].end());
        k_want[t].push_back(rotate_ld(x, table, style, d, static_cast<std::int64_t>(cached + t)));
      }
    }
    check_written(
        kp, kb, writer, [&](std::size_t t, std::size_t h) { return k_want[t][h]; }, where + ": k");
    check_written(
        vp, vb, writer, [&](std::size_t t, std::size_t h) { return head_row(v_new, t, h, hk, dv); }, where + ": v");
    if constexpr (std::is_same<E, float>::value) {
      // A float cache holds rope::apply's bytes of the new keys.
      std::vector<float> k_apply(std::max<std::size_t>(n * hk * d, 1));
      std::vector<float> k_in(k_apply.size());
      for (std::size_t t = 0; t < n; ++t) {
        for (std::size_t h = 0; h < hk; ++h)
          std::copy(k_rows[t * hk + h].begin(), k_rows[t * hk + h].end(), &k_in[(t * hk + h) * d]);
      }
      if (n > 0) {
        rope::apply<float>(rope::View<const float>::token_major(k_in.data(), n, hk, d),
                           rope::View<float>::token_major(k_apply.data(), n, hk, d), table, style,
                           rope::Positions(plan.positions()));
      }
      for (std::size_t t = 0; t < n; ++t) {
        for (std::size_t h = 0; h < hk; ++h) {
          ROPE_FUZZ_CHECK(std::memcmp(cache.k.row(cached + t, h), &k_apply[(t * hk + h) * d], d * sizeof(float)) == 0,
                          where + ": a key is not rope::apply's bytes");
        }
      }
    }
  }

  // attend on the rotated Q, over the cache as it now is.
  const PoolBefore<E> ka = before(kp), va = before(vp);
  const auto qo_before = q_out, out_before = out, lse_before = lse;
  const bool attend_valid = planned && attend_ok && logits.valid;
  threw = false;
  try {
    ra::attend(plan, cache, rope::View<const float>(qo), ov, logits.logits, mask, lse_ptr);
  } catch (const rope::invalid_argument& e) {
    threw = true;
    ROPE_FUZZ_CHECK(!attend_valid, where + ": attend: " + e.what());
    ROPE_FUZZ_CHECK(named(e, "rope::attention::attend"), e.what());
    if (!planned) check_no_plan(e, "rope::attention::attend", where);
  }
  ROPE_FUZZ_CHECK(unchanged(kp, ka) && unchanged(vp, va) && same_bytes(q_out, qo_before),
                  where + ": attend wrote its inputs");
  if (threw) {
    ROPE_FUZZ_CHECK(same_bytes(out, out_before) && same_bytes(lse, lse_before), where + ": a refused attend wrote");
    return;
  }
  ROPE_FUZZ_CHECK(attend_valid, where + ": attend accepted an invalid call");
  const LogitsIn<float> li(logits.logits, hq, d);
  std::vector<std::size_t> slots(cached + n);
  for (std::size_t j = 0; j < slots.size(); ++j) slots[j] = j;
  for (std::size_t t = 0; t < n; ++t) {
    check_attend_token<E, float, float>(where, rope::View<const float>(qo), ov, lse_ptr, t,
                                        static_cast<std::int64_t>(cached + t), slots, kp.pool, vp.pool, group, li,
                                        mask);
  }
}

// Rows of q, k, v and q_out: (float, float), (bf16, float), (bf16, bf16).
template <class E>
void append_any(Bytes& in, bool with_q) {
  switch (in.u8() % 3) {
    case 0: append_typed<E, float, float>(in, with_q); break;
    case 1: append_typed<E, rope::BFloat16, float>(in, with_q); break;
    default: append_typed<E, rope::BFloat16, rope::BFloat16>(in, with_q); break;
  }
}

// append over a cache of any type: the K/V form or the form with Q.
void append_any_cache(Bytes& in, bool with_q) {
  switch (in.u8() % 4) {
    case 0: append_any<float>(in, with_q); break;
    case 1: append_any<rope::BFloat16>(in, with_q); break;
    case 2: append_any<rope::Float16>(in, with_q); break;
    default: any_scaled_byte(in, [&](auto e) { append_any<decltype(e)>(in, with_q); }); break;
  }
}
}  // namespace

void fuzz_step(Bytes& in, bool f32) {
  if (f32) return step_typed<float>(in);
  switch (in.u8() % 3) {
    case 0: step_typed<rope::BFloat16>(in); break;
    case 1: step_typed<rope::Float16>(in); break;
    default: step_typed<std::int8_t>(in); break;
  }
}

void fuzz_append_kv(Bytes& in) { append_any_cache(in, false); }

void fuzz_append(Bytes& in) { append_any_cache(in, true); }

}  // namespace rope_fuzz

#else

namespace rope_fuzz {
void fuzz_step(Bytes&, bool) {}
void fuzz_append_kv(Bytes&) {}
void fuzz_append(Bytes&) {}
}  // namespace rope_fuzz

#endif
