// The fuzz target's decoders of the serving path past plain attend: MLA
// over a latent cache (the MLA append and the absorbed attend, dense,
// sparse and over trees), attend over paged caches of every type (fp8
// too) with sparse lists (Mask::indices), tree verify (Batch::tree_depths,
// tree_masks) and the product modes (Shape::products), and shift (cached
// keys rotated again by a position delta).
//
// Held as the other attention decoders (fuzz_attention.cpp): a decoded call
// is valid or breaks some of its arguments, its validity judged here from
// the headers' contracts (mla_append.hpp, mla_attend.hpp, cache.hpp,
// sparse.hpp, tree.hpp, shift.hpp, attend.hpp). A refused call must throw
// the documented exception, name its function and write nothing: every
// pool, scale array, input and output is compared byte for byte before and
// after; a refused plan() leaves no plan. An accepted call must give the
// bytes of one thread and equal the long-double oracle within a forward
// error bound of that call's inputs, computed here.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "fuzz_support.hpp"

#if defined(ROPE_FUZZ_ATTENTION)
#include <rope/attention/cascade_tiles.hpp>  // level_tiles_run, which a compiled attention library does not bring

#include "fuzz_attention.hpp"

namespace rope_fuzz {
namespace {

// ---------------------------------------------------------------------------
// Which keys a new token sees: the mask's range, a sparse list, a tree.

// Keys [lo, hi) a token at position p of a sequence of `length` keys sees
// through the mask (masks.hpp's rule, written out again).
void visible_range(std::int64_t p, std::int64_t length, const ra::Mask& mask, std::int64_t* lo, std::int64_t* hi) {
  *hi = mask.causal ? std::min(length, p + 1) : length;
  *lo = mask.window > 0 ? std::max<std::int64_t>(0, p - static_cast<std::int64_t>(mask.window) + 1) : 0;
  *hi = std::max(*lo, *hi);
}

// A sparse list (Mask::indices) over a drawn batch: topk entries per new
// token at index_stride apart (0: topk; sometimes below topk: refused), in
// an array of exactly what the list spans, each entry a key the token sees
// (drawn from the range its lengths give it), -1, or now and then a broken
// one: -2, the first position past the token or its cache, the last one
// before its window, or the entry before it again.
struct DrawnList {
  std::size_t topk = 0, stride = 0;
  Exact<std::int32_t> indices;
  std::size_t step() const { return stride == 0 ? topk : stride; }
};

void draw_list(DrawnList& l, Bytes& in, const DrawnBatch& b, const ra::Mask& mask) {
  l.topk = in.u8() % 6;
  const std::uint8_t kind = in.u8() % 8;
  l.stride = kind == 0 ? 0 : kind == 1 && l.topk > 0 ? l.topk - 1 : l.topk + kind % 3;
  l.indices = Exact<std::int32_t>(b.tokens == 0 ? 0 : (b.tokens - 1) * l.step() + l.topk);
  std::size_t t = 0;
  for (std::size_t s = 0; s < b.sequences; ++s) {
    for (std::int64_t i = 0; i < b.n[s]; ++i, ++t) {
      const std::int64_t length = b.lengths[s], p = length - b.n[s] + i;
      std::int64_t lo = 0, hi = 0;
      visible_range(p, length, mask, &lo, &hi);
      for (std::size_t k = 0; k < l.topk; ++k) {
        std::int32_t& entry = l.indices[t * l.step() + k];
        const std::uint8_t what = in.u8() % 16;
        const std::int64_t x = what == 0   ? -1
                               : what == 1 ? -2
                               : what == 2 ? hi
                               : what == 3 ? (lo > 0 ? lo - 1 : length)
                               : what == 4 ? (k > 0 ? l.indices[t * l.step() + k - 1] : -1)
                               : hi > lo   ? lo + static_cast<std::int64_t>(in.u8()) % (hi - lo)
                                           : -1;
        entry = static_cast<std::int32_t>(x);
      }
    }
  }
}

// sparse.hpp's checks of a list against an accepted plan (positions b's):
// index_stride 0 or at least topk; each entry -1 or a key the token sees;
// none twice in a token's list. Fills each token's keys, sorted.
bool list_ok(const DrawnList& l, const DrawnBatch& b, const ra::Mask& mask,
             std::vector<std::vector<std::int64_t>>& keys) {
  if (l.step() < l.topk) return false;
  keys.assign(b.tokens, {});
  for (std::size_t t = 0; t < b.tokens; ++t) {
    std::int64_t lo = 0, hi = 0;
    visible_range(b.positions[t], b.lengths[b.sequence_of[t]], mask, &lo, &hi);
    for (std::size_t k = 0; k < l.topk; ++k) {
      const std::int32_t j = l.indices[t * l.step() + k];
      if (j == -1) continue;
      if (j < lo || j >= hi) return false;
      keys[t].push_back(j);
    }
    std::sort(keys[t].begin(), keys[t].end());
    if (std::adjacent_find(keys[t].begin(), keys[t].end()) != keys[t].end()) return false;
  }
  return true;
}

// The keys new token t of an accepted plan sees, in position order: its
// sparse list's (lists non-empty), its tree's, or the mask's range.
std::vector<std::int64_t> keys_of(const DrawnBatch& b, std::size_t t, const ra::Mask& mask,
                                  const std::vector<std::vector<std::int64_t>>& lists) {
  if (!lists.empty()) return lists[t];
  if (b.tree_token[t]) return b.tree_keys[t];
  std::int64_t lo = 0, hi = 0;
  visible_range(b.positions[t], b.lengths[b.sequence_of[t]], mask, &lo, &hi);
  std::vector<std::int64_t> keys;
  for (std::int64_t j = lo; j < hi; ++j) keys.push_back(j);
  return keys;
}

// gamma_k = k u / (1 - k u) of float's unit roundoff.
LD gamma_of(std::size_t k) {
  const LD ku = LD(k) * unit_roundoff<float>();
  return ku / (1 - ku);
}

// ---------------------------------------------------------------------------
// Product modes (kv_products.hpp, docs/attention.md "Product modes").

// A mode as a plan may ask for it: mostly exact, often the cache's own
// (bf16 for a bf16 cache, int8 for an int8 one), now and then the other
// (refused).
template <class E>
rope::Products draw_products(Bytes& in) {
  constexpr bool bf16 = std::is_same<E, rope::BFloat16>::value, int8 = std::is_same<E, std::int8_t>::value;
  const std::uint8_t kind = in.u8() % 8;
  if (kind < 4) return rope::Products::exact;
  if (kind < 7) return bf16 ? rope::Products::bf16 : int8 ? rope::Products::int8 : rope::Products::exact;
  return bf16 ? rope::Products::int8 : rope::Products::bf16;
}

template <class E>
bool products_fit(rope::Products mode) {
  return mode == rope::Products::exact || (mode == rope::Products::bf16 && std::is_same<E, rope::BFloat16>::value) ||
         (mode == rope::Products::int8 && std::is_same<E, std::int8_t>::value);
}

// What a mode's score s_j = scale q . k_j may be off by against the exact
// score over the stored values (q the widened query row, k the stored
// key): bf16, |scale| ((2^-8 (1 + g) + g) sum |q_c k_c| + 2^-126 (sum |k_c|
// + sum |q_c|) + (4d + 64) 2^-126), g = gamma_(2 ceil(d/32) + 5); int8,
// |scale k_scale| ((s_q / 2) sum |k8_c| + gamma_4 s_q sum |q8_c k8_c|) over
// the stored bytes k8 and q's codes q8 (s_q = max |q_c| / 127), which over
// the stored values k = k_scale k8, with |s_q q8_c| <= |q_c| + s_q / 2, is
// at most |scale| ((s_q / 2) (1 + gamma_4) sum |k_c| + gamma_4 sum |q_c k_c|).
LD product_error(rope::Products mode, const std::vector<LD>& q, const std::vector<LD>& k, LD scale,
                 bool tiles = false) {
  if (mode == rope::Products::exact) return 0;
  LD qk = 0, sk = 0, sq = 0, top = 0;
  for (std::size_t c = 0; c < q.size(); ++c) {
    qk += std::fabs(q[c] * k[c]);
    sk += std::fabs(k[c]);
    sq += std::fabs(q[c]);
    top = std::max(top, std::fabs(q[c]));
  }
  const LD tiny = std::ldexp(1.0L, -126);
  if (mode == rope::Products::bf16) {
    // The decode loop's lanes and tree; a cascade level's tiles add the d
    // products in an order of their own (cascade_tiles.hpp).
    const LD g = gamma_of(tiles ? q.size() + 5 : 2 * ((q.size() + 31) / 32) + 5);
    return std::fabs(scale) *
           ((std::ldexp(1.0L, -8) * (1 + g) + g) * qk + tiny * (sk + sq) + LD(4 * q.size() + 64) * tiny);
  }
  const LD s_q = top / 127 * (1 + std::ldexp(1.0L, -20)), g4 = gamma_of(4);
  return std::fabs(scale) * (s_q / 2 * (1 + g4) * sk + g4 * qk);
}

// ---------------------------------------------------------------------------
// attend over paged caches: sparse lists, trees, product modes.

// Token t's query heads over the keys in `slots` (its sequence's keys, in
// position order), checked row by row against out (and lse, when set):
// each score within the float arithmetic's bound and the product mode's.
template <class E, class Q, class O>
void check_keys_token(const std::string& where, const rope::View<const Q>& q, const rope::View<O>& out,
                      const float* lse, std::size_t t, const std::vector<std::size_t>& slots, const ra::PagePool<E>& kp,
                      const ra::PagePool<E>& vp, std::size_t group, const LogitsIn<float>& logits,
                      rope::Products products, bool level = false) {
  // A cascade level in the bf16 mode also rounds its weights to bf16:
  // 2^-8 of each, those below 2^-126 to zero (docs/attention.md).
  const bool tiles = level && products == rope::Products::bf16;
  const std::size_t hq = q.heads, d = q.head_dim, dv = out.head_dim;
  for (std::size_t h = 0; h < hq; ++h) {
    const std::size_t g = h / group;
    const std::vector<LD> qr = view_row(q, t, h);
    std::vector<Scored> keys;
    bool finite = finite_all(qr), nan_score = false;
    std::vector<bool> nan_value(dv, false);
    for (const std::size_t slot : slots) {
      Scored s;
      std::vector<LD> k(d);
      for (std::size_t c = 0; c < d; ++c) {
        k[c] = stored(kp, slot, g, c);
        finite = finite && std::isfinite(k[c]);
        s.dot += qr[c] * k[c];
        s.magnitude += std::fabs(qr[c]) * std::fabs(k[c]);
      }
      s.v.resize(dv);
      for (std::size_t c = 0; c < dv; ++c) {
        s.v[c] = stored(vp, slot, g, c);
        finite = finite && std::isfinite(s.v[c]);
        nan_value[c] = nan_value[c] || std::isnan(s.v[c]);
      }
      if (finite) s.extra = product_error(products, qr, k, logits.scale, tiles);
      nan_score = nan_score || std::isnan(s.dot);
      keys.push_back(std::move(s));
    }
    Want w = softmax_want<float>(keys, d, dv, logits, h, finite, nan_score, nan_value);
    if (tiles) w.tolerance += (std::ldexp(1.0L, -8) + LD(keys.size()) * std::ldexp(1.0L, -126)) * w.magnitude;
    check_row<O>(out.row(t, h), lse != nullptr ? lse + t * hq + h : nullptr, w, dv, logits.sinks[h],
                 where + ": token " + std::to_string(t) + " head " + std::to_string(h));
  }
}

// plan and attend over a paged cache of E (q of Q, out of O) in one of four
// modes: the mask's range, sparse lists, trees (mixed with decode and
// prefill sequences), or trees with lists (refused where a tree is); a
// product mode (the cache's own, or another cache type's: refused),
// kv_split, cascade levels, masks (a window beside a tree: refused),
// logits, threads or an executor, lse or not. Refused: plan() (a bad tree,
// by name, leaving no plan) or attend, writing nothing. Accepted: out's
// rows (and lse) only, the bytes of one thread, and each row the long-
// double softmax over exactly the keys its token sees: its list's, its
// tree's (the cached keys and its mask's bits, literally) or the mask's.
template <class E, class Q, class O>
void lists_typed(Bytes& in) {
  const std::size_t pages = 1 + in.u8() % 6, ps = 1 + in.u8() % 5, hk = 1 + in.u8() % 2, group = 1 + in.u8() % 3;
  const std::size_t hq = hk * group, d = 1 + in.u8() % 9, dv = 1 + in.u8() % 6;
  const std::uint8_t layout = in.u8();
  const std::uint8_t mode = in.u8() % 4;  // 0: the mask's range, 1: lists, 2: trees, 3: trees and lists
  DrawnBatch b;
  draw_batch(b, in, pages, ps, 7);
  if (mode >= 2) draw_trees(b, in);
  ra::Mask mask;
  mask.causal = in.flag();
  mask.window = in.u8() % 4 == 0 ? in.u8() % 5 : 0;
  const rope::Products products = draw_products<E>(in);
  const DrawnLogits logits = draw_logits<float>(in, hq);
  const DrawnThreads threads = draw_threads(in);
  const bool with_lse = in.flag();
  const std::size_t splits[] = {1, 2, 3, 5, 512};
  const std::size_t kv_split = splits[in.u8() % 5];
  const bool cascade = in.flag();
  PoolData<E> kp, vp;
  make_pool(kp, in, pages, ps, hk, d, layout);
  make_pool(vp, in, pages, ps, hk, dv, layout);
  const ra::PagedCache<E> cache{kp.pool, vp.pool};
  const ra::Shape of = ra::Shape::of(cache, hq);
  DrawnShape shape;
  shape.shape = of;
  shape.shape.kv_split = kv_split;
  shape.shape.cascade = cascade;
  shape.shape.products = products;
  DrawnList list;
  if (mode == 1 || mode == 3) {
    draw_list(list, in, b, mask);
    mask.indices = list.indices.data();
    mask.topk = list.topk;
    mask.index_stride = list.stride;
  }
  const std::size_t tokens = b.tokens;
  const std::vector<Q> q = rows_of<Q>(in, tokens * hq * d);
  std::vector<O> out((tokens + 1) * hq * dv, from_float<O>(-9.0f));
  std::vector<float> lse(tokens * hq + 1, -9.0f);
  const auto qv = rope::View<const Q>::token_major(q.data(), tokens, hq, d);
  const auto ov = rope::View<O>::token_major(out.data(), tokens, hq, dv);
  float* lse_ptr = with_lse ? lse.data() : nullptr;

  const std::string where = "attend lists mode=" + std::to_string(mode) + " pages=" + std::to_string(pages) + "x" +
                            std::to_string(ps) + " heads=" + std::to_string(hq) + "/" + std::to_string(hk) +
                            " d=" + std::to_string(d) + "/" + std::to_string(dv) +
                            " sequences=" + std::to_string(b.sequences) + " split=" + std::to_string(kv_split) +
                            " products=" + std::to_string(static_cast<int>(products)) +
                            " topk=" + std::to_string(list.topk) + "/" + std::to_string(list.stride) +
                            " tree_break=" + std::to_string(b.tree_break) + " cascade=" + std::to_string(cascade);
  ra::Plan plan;
  plan_before(plan, of, tokens);
  const bool planned = plan_step(plan, shape, b, threads, where);
  std::vector<std::vector<std::int64_t>> lists;
  bool valid = planned && logits.valid && products_fit<E>(products);
  if (planned && b.trees) valid = valid && mask.window == 0 && mask.indices == nullptr;
  if (planned && mask.indices != nullptr) valid = list_ok(list, b, mask, lists) && valid;
  const PoolBefore<E> kb = before(kp), vb = before(vp);
  const auto out_before = out;
  const auto lse_before = lse;
  const auto list_before = copy_of(list.indices);
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
  ROPE_FUZZ_CHECK(same_bytes(list.indices, list_before), where + ": the list written");
  if (threw) {
    ROPE_FUZZ_CHECK(same_bytes(out, out_before) && same_bytes(lse, lse_before), where + ": a refused attend wrote");
    return;
  }
  ROPE_FUZZ_CHECK(valid, where + ": an invalid call was accepted");
  const std::size_t out_end = tokens * hq * dv, lse_end = with_lse ? tokens * hq : 0;
  ROPE_FUZZ_CHECK(
      std::memcmp(out.data() + out_end, out_before.data() + out_end, (out.size() - out_end) * sizeof(O)) == 0,
      where + ": past out's rows");
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
  // The tokens whose rows took a cascade level's arithmetic, where the plan
  // found levels, and in the bf16 mode over a dense mask where the tiles
  // run, every token of a sequence of two or more new tokens that is not a
  // tree: a prompt's blocks take the levels' arithmetic (attend.hpp,
  // tile_blocks).
  std::vector<bool> in_level(tokens, false);
  if (const ra::detail::WorkLayout* levels = ra::detail::PlanAccess::cascade(plan)) {
    for (const std::size_t token : levels->cascade.members) in_level[token] = true;
  }
  if (products == rope::Products::bf16 && mask.indices == nullptr &&
      ra::detail::level_tiles_run<xsimd::default_arch>()) {
    const std::int64_t* starts = ra::detail::PlanAccess::q_starts(plan);
    for (std::size_t s = 0; s < b.sequences; ++s) {
      if (starts[s + 1] - starts[s] < 2 || ra::detail::PlanAccess::tree(plan, s)) continue;
      for (auto t = static_cast<std::size_t>(starts[s]); t < static_cast<std::size_t>(starts[s + 1]); ++t)
        in_level[t] = true;
    }
  }
  // The oracle: each row over exactly the keys its token sees.
  const LogitsIn<float> li(logits.logits, hq, d);
  for (std::size_t t = 0; t < tokens; ++t) {
    const std::size_t s = b.sequence_of[t];
    std::vector<std::size_t> slots;
    for (const std::int64_t j : keys_of(b, t, mask, lists)) slots.push_back(b.slot(s, j, ps));
    check_keys_token<E, Q, O>(where + " sequence " + std::to_string(s), qv, ov, lse_ptr, t, slots, kp.pool, vp.pool,
                              group, li, products, in_level[t]);
  }
}

// ---------------------------------------------------------------------------
// MLA over a latent cache.

// A latent cache's rows and scales: dense, or with gaps between rows and
// pages (poisoned: no call may read or write them), each row stored as a
// caller's writes would store it (int8: each part with its own scale).
template <class E>
struct LatentData {
  std::vector<E> data;
  std::vector<float> scales;
  ra::LatentCache<E> cache;
};

template <class E>
void make_latent(LatentData<E>& p, Bytes& in, std::size_t pages, std::size_t ps, std::size_t latent,
                 std::size_t rope_dim, std::uint8_t layout) {
  constexpr bool scaled = rope::KvElement<E>::kScaled;
  const std::size_t w = latent + rope_dim;
  p.scales.assign(2 * pages * ps, 0.0f);
  float* scales = scaled ? p.scales.data() : nullptr;
  if (layout % 2 == 1) {
    const std::size_t token_stride = w + 1 + layout % 3, page_stride = ps * token_stride + 2;
    p.data.assign(pages * page_stride, poison<E>());
    p.cache = ra::LatentCache<E>{p.data.data(), scales, pages, ps, latent, rope_dim, page_stride, token_stride};
  } else {
    p.data.assign(pages * ps * w, poison<E>());
    p.cache = ra::LatentCache<E>::dense(p.data.data(), pages, ps, latent, rope_dim, scales);
  }
  std::vector<float> row(w);
  for (std::size_t slot = 0; slot < p.cache.slots(); ++slot) {
    for (auto& x : row) x = attention_element<float>(in);
    if constexpr (scaled) {
      rope::store_kv_row(row.data(), latent, p.cache.row(slot), p.cache.scale(slot));
      rope::store_kv_row(row.data() + latent, rope_dim, p.cache.row(slot) + latent, p.cache.scale(slot) + 1);
    } else {
      rope::store_kv_row(row.data(), w, p.cache.row(slot), nullptr);
    }
  }
}

// Value x of a slot's row as the cache means it: widened, times its part's
// scale.
template <class E>
LD latent_value(const ra::LatentCache<E>& c, std::size_t slot, std::size_t x) {
  const LD v = rope::detail::widen_value(c.row(slot)[x]);
  if constexpr (rope::KvElement<E>::kScaled) {
    return v * LD(c.scale(slot)[x < c.latent_dim ? 0 : 1]);
  } else {
    return v;
  }
}

template <class E>
bool same_cache(const LatentData<E>& p, const std::vector<E>& data, const std::vector<float>& scales) {
  return same_bytes(p.data, data) && same_bytes(p.scales, scales);
}

// After the MLA append: each new token's row in its slot, each part within
// one rounding into E of the oracle's (int8 and fp8: of its own scale, the
// scale max|x| / 127, or over fp8's largest code; a non-finite part: codes
// 0 and a NaN scale), and every
// other byte of the cache and its scales (other slots, the gaps) as it was.
template <class E, class WantRow>
void check_latent_written(const LatentData<E>& now, const std::vector<E>& was_data,
                          const std::vector<float>& was_scales, const std::vector<std::int64_t>& writer,
                          WantRow want_row, const std::string& where) {
  constexpr bool scaled = rope::KvElement<E>::kScaled;
  const ra::LatentCache<E>& c = now.cache;
  std::vector<E> data = now.data;
  std::vector<float> scales = now.scales;
  for (std::size_t slot = 0; slot < writer.size(); ++slot) {
    if (writer[slot] < 0) continue;
    const std::vector<LD> x = want_row(static_cast<std::size_t>(writer[slot]));
    const std::size_t parts[3] = {0, c.latent_dim, c.width()};
    for (std::size_t part = 0; part < 2; ++part) {
      const std::string at = where + " slot " + std::to_string(slot) + (part == 0 ? " latent" : " rope");
      const std::vector<LD> want(x.begin() + static_cast<std::ptrdiff_t>(parts[part]),
                                 x.begin() + static_cast<std::ptrdiff_t>(parts[part + 1]));
      if (!finite_all(want)) {
        if constexpr (scaled) {
          ROPE_FUZZ_CHECK(std::isnan(c.scale(slot)[part]), at + ": a non-finite part's scale is not NaN");
          for (std::size_t i = parts[part]; i < parts[part + 1]; ++i)
            ROPE_FUZZ_CHECK(rope::detail::widen_value(c.row(slot)[i]) == 0.0f,
                            at + ": a non-finite part's codes are not 0");
        }
        continue;
      }
      const LD top = top_of(want);
      if constexpr (scaled) {
        ROPE_FUZZ_CHECK(std::fabs(LD(c.scale(slot)[part]) - top / code_max<E>()) <= 1e-6L * (1 + top),
                        at + ": the scale");
      }
      for (std::size_t i = 0; i < want.size(); ++i) {
        const LD got = latent_value(c, slot, parts[part] + i);
        ROPE_FUZZ_CHECK(within_one_rounding<E>(got, want[i], top), at + " value " + std::to_string(i) + ": got " +
                                                                       std::to_string(double(got)) + ", want " +
                                                                       std::to_string(double(want[i])));
      }
    }
    const auto offset = static_cast<std::size_t>(c.row(slot) - c.data);
    std::copy(was_data.begin() + static_cast<std::ptrdiff_t>(offset),
              was_data.begin() + static_cast<std::ptrdiff_t>(offset + c.width()),
              data.begin() + static_cast<std::ptrdiff_t>(offset));
    if (scaled) {
      scales[2 * slot] = was_scales[2 * slot];
      scales[2 * slot + 1] = was_scales[2 * slot + 1];
    }
  }
  ROPE_FUZZ_CHECK(same_bytes(data, was_data) && same_bytes(scales, was_scales),
                  where + ": bytes written outside the new tokens' rows");
}

// PairAxes for a call that must refuse them (the MLA append has none).
const rope::PairAxes& some_axes() {
  static const rope::PairAxes axes{{0}, 1};
  return axes;
}

// One MLA step over a latent cache of E (c_kv, k_pe, q_pe, q_pe_out and
// q_lat of In, out of O): a drawn batch (some sequences trees, mixed with
// decode and prefill ones), a shape that plan() refuses or the cache does
// not fit, then the MLA append (kv_a_layernorm as options.k_norm or none,
// eps valid or not, RoPE of either pairing at the planned positions, a
// partial or invalid rotary_dim, a table without its pairing, positions
// past the table, q_pe_out in place or not, threads or an executor) and
// the absorbed attend on q_lat and the rotated q_pe (masks, sparse lists,
// logits with and without the required scale, lse, a product mode: bf16
// over a bf16 cache taken, the others refused). Broken views: rows of the
// wrong shape or over the cache (or its scales), outputs over inputs,
// q_norm, write_back_k or pair_axes set, weights of the wrong size, a cache
// unsound (scales, strides, rope_dim).
// A refused call throws, names its function and writes nothing; an
// accepted append writes the planned slots (each part within one rounding
// of the long-double rotation of the float RMSNorm) and q_pe_out, nothing
// else; an accepted attend writes out's rows (and lse) only, each the
// long-double attention over the stored rows (scores q_lat . c_kv + q_pe .
// k_pe times scale; values the latent part) of the keys its token sees,
// within the bf16 mode's bound besides where the plan asks for it (the
// levels' bound over the row's width: its products on tiles or summed by
// the float GEMMs, its weights rounded to bf16). Both give the bytes of
// one thread.
template <class E, class In, class O>
void mla_typed(Bytes& in) {
  constexpr bool scaled = rope::KvElement<E>::kScaled;
  const std::size_t pages = 1 + in.u8() % 4, ps = 1 + in.u8() % 4, heads = 1 + in.u8() % 4;
  const std::size_t latent = 1 + in.u8() % 8, rope_dim = 2 * (1 + in.u8() % 3), width = latent + rope_dim;
  const std::uint8_t layout = in.u8();
  // Read before the long arrays; 0 (what a short input reads) breaks nothing.
  const std::uint8_t append_break = in.u8() % 16, attend_break = in.u8() % 16;
  DrawnBatch b;
  draw_batch(b, in, pages, ps, 6);
  if (in.u8() % 4 == 0) draw_trees(b, in);
  const std::size_t tokens = b.tokens;
  ra::AppendOptions o;
  const bool norm = in.flag();
  o.plus_one = in.flag();
  const double eps_values[] = {1e-6, 1e-5, 1e-3, 0.0, std::nan(""), -1e-6, HUGE_VAL, 1e-60, 1e300};
  o.eps = in.u8() % 4 == 0 ? eps_values[in.u8() % 9] : 1e-6;
  std::vector<float> weights(latent + 1);
  for (auto& w : weights) w = static_cast<float>((static_cast<int>(in.u8()) - 127) / 64.0);
  if (norm) o.k_norm = {weights.data(), latent};
  const bool rotate = in.u8() % 8 != 0;
  const std::size_t table_dim = 2 * (1 + in.u8() % 3), table_positions = 1 + in.u8() % 12;
  const rope::Table<float> table(rope::frequencies(table_dim, 100.0), table_positions);
  rope::Style style = rope::Style::rotate_half;
  std::size_t asked = 0;
  if (rotate) {
    style = in.flag() ? rope::Style::rotate_half : rope::Style::block_diagonal;
    asked = in.u8() % 4 == 0 ? in.u8() % 8 : 0;
    o.rotation = ra::Rotation<float>(&table, style, asked);
  }
  const std::size_t r = rotate ? (asked == 0 ? table_dim : asked) : 0;
  const bool q_in_place = in.flag();
  const DrawnThreads threads = draw_threads(in);
  ra::Mask mask;
  mask.causal = in.flag();
  mask.window = in.u8() % 4 == 0 ? in.u8() % 5 : 0;
  const DrawnLogits logits = draw_logits<float>(in, heads);
  const bool with_lse = in.flag();
  LatentData<E> lc;
  make_latent(lc, in, pages, ps, latent, rope_dim, layout);
  const ra::Shape of = ra::Shape::of(lc.cache, heads);
  DrawnShape shape = draw_shape(in, of);
  if (in.u8() % 16 == 0) shape.shape.products = in.flag() ? rope::Products::bf16 : rope::Products::int8;
  DrawnList list;
  if (in.u8() % 4 == 0) {
    draw_list(list, in, b, mask);
    mask.indices = list.indices.data();
    mask.topk = list.topk;
    mask.index_stride = list.stride;
  }
  // The step's rows, in buffers with room for the broken views.
  const std::size_t q_room = (tokens + 1) * (heads + 1) * (rope_dim + 1);
  const std::size_t row_room = std::max(q_room, (tokens + 1) * (latent + 1) * (heads + 1));
  std::vector<In> c_kv = rows_of<In>(in, tokens * latent), k_pe = rows_of<In>(in, tokens * rope_dim),
                  q_pe = rows_of<In>(in, tokens * heads * rope_dim), q_lat = rows_of<In>(in, tokens * heads * latent);
  c_kv.resize(row_room, from_float<In>(0.0f));
  k_pe.resize(row_room, from_float<In>(0.0f));
  q_pe.resize(q_room, from_float<In>(0.0f));
  q_lat.resize(row_room, from_float<In>(0.0f));
  std::vector<In> q_pe_out(q_room, from_float<In>(-9.0f));

  std::string where =
      "mla pages=" + std::to_string(pages) + "x" + std::to_string(ps) + " heads=" + std::to_string(heads) +
      " latent=" + std::to_string(latent) + "+" + std::to_string(rope_dim) + " tokens=" + std::to_string(tokens) +
      " r=" + std::to_string(r) + " norm=" + std::to_string(norm) + " in_place=" + std::to_string(q_in_place) +
      " split=" + std::to_string(shape.shape.kv_split) + " topk=" + std::to_string(list.topk) + "/" +
      std::to_string(list.stride) + " break=" + std::to_string(append_break) + "/" + std::to_string(attend_break) +
      "/" + std::to_string(b.broken) + "/" + std::to_string(b.tree_break);
  ra::Plan plan;
  plan_before(plan, of, tokens);
  const bool planned = plan_step(plan, shape, b, threads, where);

  // The MLA append.
  auto cv = rope::View<const In>::token_major(c_kv.data(), tokens, 1, latent);
  auto kv = rope::View<const In>::token_major(k_pe.data(), tokens, 1, rope_dim);
  auto qv = rope::View<const In>::token_major(q_pe.data(), tokens, heads, rope_dim);
  auto qo = rope::View<In>::token_major(q_in_place ? q_pe.data() : q_pe_out.data(), tokens, heads, rope_dim);
  bool views_ok = true, styled = true;
  const auto fits_in = [](std::size_t elements, std::size_t size_of, std::size_t bytes) {
    return elements * size_of <= bytes;
  };
  switch (append_break) {
    case 1:
      cv.data = nullptr;
      views_ok = false;
      break;
    case 2:
      kv = rope::View<const In>::token_major(k_pe.data(), tokens, 1, rope_dim + 1);
      views_ok = false;
      break;
    case 3:
      qv = rope::View<const In>::token_major(q_pe.data(), tokens, heads + 1, rope_dim);
      views_ok = false;
      break;
    case 4:
      if (tokens > 0 && !q_in_place) {
        qo = rope::View<In>::token_major(c_kv.data(), tokens, heads, rope_dim);  // q_pe_out over c_kv
        views_ok = false;
      }
      break;
    case 5:
      if (tokens > 0 && !q_in_place) {
        qo = rope::View<In>::token_major(q_pe.data() + 1, tokens, heads, rope_dim);  // over q_pe, shifted
        views_ok = false;
      }
      break;
    case 6:
      if (tokens > 0 && fits_in(tokens * latent, sizeof(In), lc.data.size() * sizeof(E))) {
        cv = rope::View<const In>::token_major(reinterpret_cast<const In*>(lc.data.data()), tokens, 1, latent);
        views_ok = false;
      }
      break;
    case 7:
      o.q_norm = {weights.data(), latent};
      views_ok = false;
      break;
    case 8:
      o.write_back_k = true;
      views_ok = false;
      break;
    case 9:
      o.pair_axes = &some_axes();
      views_ok = false;
      break;
    case 10:
      o.k_norm = {weights.data(), latent + 1};
      views_ok = false;
      break;
    case 11:
      o.k_norm = {nullptr, latent};
      views_ok = false;
      break;
    case 12:
      if (rotate) {
        o.rotation = ra::Rotation<float>();  // a table set by hand, without its pairing
        o.rotation.table = &table;
        o.rotation.rotary_dim = asked;
        styled = false;
        views_ok = false;
      }
      break;
    case 13:
      if (tokens > 0) {
        if (scaled && fits_in(tokens * heads * rope_dim, sizeof(In), lc.scales.size() * sizeof(float))) {
          qo = rope::View<In>::token_major(reinterpret_cast<In*>(lc.scales.data()), tokens, heads, rope_dim);
          views_ok = false;
        } else if (fits_in(tokens * heads * rope_dim, sizeof(In), lc.data.size() * sizeof(E))) {
          qo = rope::View<In>::token_major(reinterpret_cast<In*>(lc.data.data()), tokens, heads, rope_dim);
          views_ok = false;
        }
      }
      break;
    case 14:
      cv = rope::View<const In>::token_major(c_kv.data(), tokens + 1, 1, latent);
      views_ok = false;
      break;
    case 15:
      if (tokens > 0 && !q_in_place) {
        qo = rope::View<In>::token_major(k_pe.data(), tokens, heads, rope_dim);  // q_pe_out over k_pe
        views_ok = false;
      }
      break;
    default: break;
  }
  // Validity, judged here from mla_append.hpp (append.hpp's refusals).
  bool append_valid = planned && shape.fits && !b.shared_write && views_ok;
  if (o.k_norm.data != nullptr && o.k_norm.size == latent) {
    const auto eps = static_cast<float>(o.eps);
    append_valid = append_valid && o.eps > 0 && std::isfinite(o.eps) && std::isfinite(eps) && eps > 0;
  }
  if (rotate && styled) {
    append_valid = append_valid && r % 2 == 0 && r <= table_dim && r <= rope_dim;
    for (std::size_t t = 0; t < tokens && planned; ++t)
      append_valid = append_valid && b.positions[t] < static_cast<std::int64_t>(table_positions);
  }
  const std::vector<E> cache_data = lc.data;
  const std::vector<float> cache_scales = lc.scales;
  const auto c_kv_before = c_kv, k_pe_before = k_pe, q_pe_before = q_pe, q_pe_out_before = q_pe_out;
  bool threw = false;
  try {
    ra::append(plan, lc.cache, cv, kv, qv, qo, o);
  } catch (const rope::invalid_argument& e) {
    threw = true;
    ROPE_FUZZ_CHECK(!append_valid, where + ": append: " + e.what());
    ROPE_FUZZ_CHECK(named(e, "rope::attention::append"), e.what());
    if (!planned) check_no_plan(e, "rope::attention::append", where);
  }
  ROPE_FUZZ_CHECK(same_bytes(c_kv, c_kv_before) && same_bytes(k_pe, k_pe_before), where + ": c_kv or k_pe written");
  if (threw) {
    ROPE_FUZZ_CHECK(same_cache(lc, cache_data, cache_scales), where + ": a refused append wrote the cache");
    ROPE_FUZZ_CHECK(same_bytes(q_pe, q_pe_before) && same_bytes(q_pe_out, q_pe_out_before),
                    where + ": a refused append wrote q_pe or q_pe_out");
  } else {
    ROPE_FUZZ_CHECK(append_valid, where + ": append accepted an invalid call");
    if (!q_in_place) {
      ROPE_FUZZ_CHECK(same_bytes(q_pe, q_pe_before), where + ": q_pe written");
      const std::size_t end = tokens * heads * rope_dim;
      ROPE_FUZZ_CHECK(
          std::memcmp(q_pe_out.data() + end, q_pe_out_before.data() + end, (q_pe_out.size() - end) * sizeof(In)) == 0,
          where + ": past q_pe_out's rows");
    }
    // The same step with one thread: the same bytes.
    if (threads.parallel()) {
      ra::Plan one;
      ra::plan(one, shape.shape, b.batch, std::size_t{1});
      LatentData<E> c1;
      c1.data = cache_data;
      c1.scales = cache_scales;
      c1.cache = lc.cache;
      c1.cache.data = c1.data.data();
      if (scaled) c1.cache.scales = c1.scales.data();
      std::vector<In> q1 = q_pe_before, o1 = q_pe_out_before;
      ra::append(one, c1.cache, cv, kv, rope::View<const In>::token_major(q1.data(), tokens, heads, rope_dim),
                 rope::View<In>::token_major(q_in_place ? q1.data() : o1.data(), tokens, heads, rope_dim), o);
      ROPE_FUZZ_CHECK(
          same_cache(lc, c1.data, c1.scales) && same_bytes(q_in_place ? q_pe : q_pe_out, q_in_place ? q1 : o1),
          where + ": append: not the same bytes with one thread");
    }
    // The oracle: c_kv normalized in float as documented, k_pe and q_pe
    // rotated in long double from the table's own cos/sin at the planned
    // position (a tree token's: cached + depth).
    const float eps = static_cast<float>(o.eps);
    const auto rotated = [&](std::vector<LD> x, std::size_t t) {
      return rotate ? rotate_ld(x, table, style, r, b.positions[t]) : x;
    };
    std::vector<std::vector<LD>> rows(tokens);
    for (std::size_t t = 0; t < tokens; ++t) {
      std::vector<float> c(latent);
      for (std::size_t x = 0; x < latent; ++x) c[x] = rope::detail::widen_value(c_kv[t * latent + x]);
      if (o.k_norm.data != nullptr) c = rms_norm_float(c, o.k_norm.data, eps, o.plus_one);
      std::vector<LD> k(rope_dim);
      for (std::size_t x = 0; x < rope_dim; ++x) k[x] = rope::detail::widen_value(k_pe[t * rope_dim + x]);
      k = rotated(k, t);
      rows[t].assign(c.begin(), c.end());
      rows[t].insert(rows[t].end(), k.begin(), k.end());
      for (std::size_t h = 0; h < heads; ++h) {
        std::vector<LD> qx(rope_dim);
        for (std::size_t x = 0; x < rope_dim; ++x)
          qx[x] = rope::detail::widen_value(q_pe_before[(t * heads + h) * rope_dim + x]);
        qx = rotated(qx, t);
        if (!finite_all(qx)) continue;
        const LD top = top_of(qx);
        for (std::size_t x = 0; x < rope_dim; ++x) {
          const LD got = rope::detail::widen_value(qo.row(t, h)[x]);
          ROPE_FUZZ_CHECK(within_one_rounding<In>(got, qx[x], top),
                          where + ": q_pe_out token " + std::to_string(t) + " head " + std::to_string(h) + " channel " +
                              std::to_string(x) + ": got " + std::to_string(double(got)) + ", want " +
                              std::to_string(double(qx[x])));
        }
      }
    }
    std::vector<std::int64_t> writer(lc.cache.slots(), -1);
    for (std::size_t t = 0; t < tokens; ++t)
      writer[static_cast<std::size_t>(b.slots[t])] = static_cast<std::int64_t>(t);
    check_latent_written(
        lc, cache_data, cache_scales, writer, [&](std::size_t t) { return rows[t]; }, where + ": append");
  }

  // The absorbed attend on q_lat and the rotated q_pe (q_pe_out, or q_pe in
  // place), over the cache as it now is.
  ra::LatentCache<E> cache = lc.cache;
  auto lv = rope::View<const In>::token_major(q_lat.data(), tokens, heads, latent);
  auto pv = rope::View<const In>::token_major(q_in_place ? q_pe.data() : q_pe_out.data(), tokens, heads, rope_dim);
  std::vector<O> out((tokens + 1) * heads * (latent + 1), from_float<O>(-9.0f));
  std::vector<float> lse(tokens * heads + 1, -9.0f);
  auto ov = rope::View<O>::token_major(out.data(), tokens, heads, latent);
  float* lse_ptr = with_lse ? lse.data() : nullptr;
  bool attend_ok = true;
  switch (attend_break) {
    case 1:
      ov.data = nullptr;
      attend_ok = false;
      break;
    case 2:
      if (tokens > 0 && fits_in(tokens * heads * latent, sizeof(O), q_lat.size() * sizeof(In))) {
        ov = rope::View<O>::token_major(reinterpret_cast<O*>(q_lat.data()), tokens, heads, latent);  // over q_lat
        attend_ok = false;
      }
      break;
    case 3:
      if (with_lse && tokens > 0) {
        lse_ptr = reinterpret_cast<float*>(out.data());  // over out
        attend_ok = false;
      }
      break;
    case 4:
      if (with_lse && tokens > 0 && fits_in(tokens * heads, sizeof(float), lc.data.size() * sizeof(E))) {
        lse_ptr = reinterpret_cast<float*>(lc.data.data());  // over the cache
        attend_ok = false;
      }
      break;
    case 5:
      lv = rope::View<const In>::token_major(q_lat.data(), tokens, heads, latent + 1);
      attend_ok = false;
      break;
    case 6:
      if (tokens > 0 && fits_in(tokens * heads * latent, sizeof(O), lc.data.size() * sizeof(E))) {
        ov = rope::View<O>::token_major(reinterpret_cast<O*>(lc.data.data()), tokens, heads, latent);
        attend_ok = false;
      }
      break;
    case 7:
      pv = rope::View<const In>::token_major(pv.data, tokens + 1, heads, rope_dim);
      attend_ok = false;
      break;
    case 8:
      // q_lat is only read, but must lie apart from the cache all the same.
      if (tokens > 0 && fits_in(tokens * heads * latent, sizeof(In), lc.data.size() * sizeof(E))) {
        lv = rope::View<const In>::token_major(reinterpret_cast<const In*>(lc.data.data()), tokens, heads, latent);
        attend_ok = false;
      }
      break;
    case 9:
      cache.scales = scaled ? nullptr : lc.scales.data();
      attend_ok = false;
      break;
    case 10:
      cache.rope_dim = rope_dim - 1;  // odd
      attend_ok = false;
      break;
    case 11:
      if (ps > 1) {
        cache.token_stride = width - 1;  // rows that overlap
        attend_ok = false;
      }
      break;
    case 12:
      if (pages > 1) {
        cache.page_stride = 1;  // pages that overlap
        attend_ok = false;
      }
      break;
    case 13:
      ov = rope::View<O>::token_major(out.data(), tokens, heads, latent + 1);
      attend_ok = false;
      break;
    case 14:
      if (with_lse && tokens > 0) {
        if (scaled && tokens * heads <= lc.scales.size()) {
          lse_ptr = lc.scales.data();  // over the int8 cache's scales
          attend_ok = false;
        } else if (!scaled && fits_in(tokens * heads, sizeof(float), q_lat.size() * sizeof(In))) {
          lse_ptr = reinterpret_cast<float*>(q_lat.data());  // over q_lat
          attend_ok = false;
        }
      }
      break;
    case 15:
      cache.data = nullptr;
      attend_ok = false;
      break;
    default: break;
  }
  std::vector<std::vector<std::int64_t>> lists;
  const rope::Products products = shape.shape.products;
  const bool products_ok =
      products == rope::Products::exact || (products == rope::Products::bf16 && std::is_same<E, rope::BFloat16>::value);
  bool valid = planned && shape.fits && attend_ok && logits.valid && logits.logits.scale.has_value() && products_ok;
  if (planned && b.trees) valid = valid && mask.window == 0 && mask.indices == nullptr;
  if (planned && mask.indices != nullptr) valid = list_ok(list, b, mask, lists) && valid;
  const std::vector<E> data_before = lc.data;
  const std::vector<float> scales_before = lc.scales;
  const auto q_lat_before = q_lat, q_pe_now = q_pe, q_pe_out_now = q_pe_out;
  const auto out_before = out;
  const auto lse_before = lse;
  threw = false;
  try {
    ra::attend(plan, cache, lv, pv, ov, logits.logits, mask, lse_ptr);
  } catch (const rope::invalid_argument& e) {
    threw = true;
    ROPE_FUZZ_CHECK(!valid, where + ": attend: " + e.what());
    ROPE_FUZZ_CHECK(named(e, "rope::attention::attend"), e.what());
    if (!planned) check_no_plan(e, "rope::attention::attend", where);
  }
  if (threw) {
    ROPE_FUZZ_CHECK(same_cache(lc, data_before, scales_before) && same_bytes(q_lat, q_lat_before) &&
                        same_bytes(q_pe, q_pe_now) && same_bytes(q_pe_out, q_pe_out_now) &&
                        same_bytes(out, out_before) && same_bytes(lse, lse_before),
                    where + ": a refused attend wrote");
    return;
  }
  ROPE_FUZZ_CHECK(valid, where + ": attend accepted an invalid call");
  ROPE_FUZZ_CHECK(same_cache(lc, data_before, scales_before) && same_bytes(q_lat, q_lat_before) &&
                      same_bytes(q_pe, q_pe_now) && same_bytes(q_pe_out, q_pe_out_now),
                  where + ": attend wrote its inputs");
  const std::size_t out_end = tokens * heads * latent, lse_end = with_lse ? tokens * heads : 0;
  ROPE_FUZZ_CHECK(
      std::memcmp(out.data() + out_end, out_before.data() + out_end, (out.size() - out_end) * sizeof(O)) == 0,
      where + ": past out's rows");
  ROPE_FUZZ_CHECK(
      std::memcmp(lse.data() + lse_end, lse_before.data() + lse_end, (lse.size() - lse_end) * sizeof(float)) == 0,
      where + ": past lse's rows");
  if (threads.parallel()) {
    ra::Plan one;
    ra::plan(one, shape.shape, b.batch, std::size_t{1});
    std::vector<O> out1(out.size(), from_float<O>(-9.0f));
    std::vector<float> lse1(lse.size(), -9.0f);
    ra::attend(one, cache, lv, pv, rope::View<O>::token_major(out1.data(), tokens, heads, latent), logits.logits, mask,
               with_lse ? lse1.data() : nullptr);
    ROPE_FUZZ_CHECK(same_bytes(out, out1), where + ": attend: not the same bytes with one thread");
    if (with_lse) ROPE_FUZZ_CHECK(same_bytes(lse, lse1), where + ": attend: not the same lse with one thread");
  }
  // The oracle: per query head, q = [q_lat | q_pe] against each seen key's
  // stored row [c_kv | k_pe] (widened, int8 times its part's scale), the
  // values its latent part.
  const LogitsIn<float> li(logits.logits, heads, width);
  for (std::size_t t = 0; t < tokens; ++t) {
    const std::size_t s = b.sequence_of[t];
    const std::vector<std::int64_t> seen = keys_of(b, t, mask, lists);
    for (std::size_t h = 0; h < heads; ++h) {
      std::vector<LD> qr = view_row(lv, t, h);
      const std::vector<LD> qp = view_row(pv, t, h);
      qr.insert(qr.end(), qp.begin(), qp.end());
      std::vector<Scored> keys;
      bool finite = finite_all(qr), nan_score = false;
      std::vector<bool> nan_value(latent, false);
      const bool bf16 = products == rope::Products::bf16;
      for (const std::int64_t j : seen) {
        const std::size_t slot = b.slot(s, j, ps);
        Scored sc;
        std::vector<LD> k(width);
        for (std::size_t x = 0; x < width; ++x) {
          k[x] = latent_value(lc.cache, slot, x);
          finite = finite && std::isfinite(k[x]);
          sc.dot += qr[x] * k[x];
          sc.magnitude += std::fabs(qr[x]) * std::fabs(k[x]);
          if (x < latent) {
            sc.v.push_back(k[x]);
            nan_value[x] = nan_value[x] || std::isnan(k[x]);
          }
        }
        if (bf16 && finite) sc.extra = product_error(products, qr, k, li.scale, true);
        nan_score = nan_score || std::isnan(sc.dot);
        keys.push_back(std::move(sc));
      }
      Want w = softmax_want<float>(keys, width, latent, li, h, finite, nan_score, nan_value);
      if (bf16) w.tolerance += (std::ldexp(1.0L, -8) + LD(keys.size()) * std::ldexp(1.0L, -126)) * w.magnitude;
      check_row<O>(ov.row(t, h), lse_ptr != nullptr ? lse_ptr + t * heads + h : nullptr, w, latent, li.sinks[h],
                   where + ": attend token " + std::to_string(t) + " head " + std::to_string(h));
    }
  }
}

// ---------------------------------------------------------------------------
// shift.

// shift over a paged cache of E (any type; NHD, HND or rows with gaps): a
// block-table row of page_count ids (some outside the pool, some named
// twice, sometimes null), a key range [first, first + count) inside the
// pool and the row or past either, delta within the table or past it (the
// extremes of int64 too), a rotation of either pairing (a partial or
// invalid rotary_dim, a table without its pairing, none), threads or an
// executor, and a pool broken (scales, pages that overlap, pools of
// different page counts).
// Refused: the documented exception naming shift, nothing written.
// Accepted: the values untouched, every key outside the range as it was,
// the bytes of one thread, and each key in the range its stored value
// rotated by delta in long double (the table's own cos and sin at |delta|,
// turned back for a negative delta) within shift.hpp's bound: 3u of
// |x_a c| + |x_b s| for the float rotation (4u for int8: its dequantization
// besides), then one rounding into the type (bf16 2^-8, f16 2^-11 and
// 2^-25 below its normal range, of the result; int8 half the row's new
// scale and u of the result; fp8 the encode's 2^-4 or 2^-3 of it and half
// a subnormal step of the new scale); the channels past rotary_dim
// unchanged (int8 and fp8: dequantized and quantized again).
template <class E>
void shift_typed(Bytes& in) {
  constexpr bool scaled = rope::KvElement<E>::kScaled;
  const std::size_t pages = 1 + in.u8() % 5, ps = 1 + in.u8() % 4, heads = 1 + in.u8() % 2, d = 1 + in.u8() % 8,
                    dv = 1 + in.u8() % 4;
  const std::uint8_t layout = in.u8(), pool_break = in.u8() % 16;
  const std::size_t table_dim = 2 * (1 + in.u8() % 4), table_positions = 1 + in.u8() % 12;
  const rope::Table<float> table(rope::frequencies(table_dim, 100.0), table_positions);
  const rope::Style style = in.flag() ? rope::Style::rotate_half : rope::Style::block_diagonal;
  const std::uint8_t rotation_kind = in.u8() % 8;
  const std::size_t asked = in.u8() % 4 == 0 ? in.u8() % 10 : 0;
  ra::Rotation<float> rotation;
  if (rotation_kind == 1) {
    rotation.table = &table;  // set by hand, without its pairing
    rotation.rotary_dim = asked;
  } else if (rotation_kind != 0) {
    rotation = ra::Rotation<float>(&table, style, asked);
  }
  const std::size_t slots = pages * ps;
  const std::size_t page_count = in.u8() % 6;
  Exact<std::int32_t> row(page_count);
  for (std::size_t i = 0; i < page_count; ++i) {
    row[i] = in.u8() % 16 == 0 ? (in.flag() ? -1 : static_cast<std::int32_t>(pages))
                               : static_cast<std::int32_t>(in.u8() % pages);
  }
  const std::uint8_t range_kind = in.u8() % 16;
  std::size_t first = in.u8() % (slots + 2), count = in.u8() % (slots + 2);
  if (range_kind == 1) count = std::numeric_limits<std::size_t>::max();  // first + count wraps
  if (range_kind == 2) first = std::numeric_limits<std::size_t>::max();
  const auto positions = static_cast<std::int64_t>(table_positions);
  const std::uint8_t delta_kind = in.u8() % 16;
  const std::int64_t deltas[] = {std::numeric_limits<std::int64_t>::min(), std::numeric_limits<std::int64_t>::max(),
                                 positions, -positions, 0};
  const std::int64_t delta =
      delta_kind < 5 ? deltas[delta_kind] : static_cast<std::int64_t>(in.u8() % (2 * positions + 1)) - positions;
  const DrawnThreads threads = draw_threads(in);
  const bool null_pages = in.u8() % 16 == 0;
  PoolData<E> kp, vp;
  make_pool(kp, in, pages, ps, heads, d, layout);
  make_pool(vp, in, pages, ps, heads, dv, layout);
  ra::PagedCache<E> cache{kp.pool, vp.pool};
  bool pool_ok = true;
  switch (pool_break) {
    case 1:
      cache.k.scales = scaled ? nullptr : kp.scales.data();
      pool_ok = false;
      break;
    case 2:
      cache.v.scales = scaled ? nullptr : vp.scales.data();
      pool_ok = false;
      break;
    case 3:
      if (pages > 1) {
        cache.k.page_stride = 1;  // pages that overlap
        pool_ok = false;
      }
      break;
    case 4:
      if (pages > 1) {
        cache.v.pages = pages - 1;  // pools of different page counts
        pool_ok = false;
      }
      break;
    default: break;
  }
  const std::int32_t* ids = null_pages ? nullptr : row.data();

  // Validity, judged here from shift.hpp.
  bool valid = pool_ok && threads.valid && !(count > 0 && ids == nullptr);
  valid = valid && first <= slots && count <= slots - first;
  if (valid && count > 0) {
    const std::size_t last_page = (first + count - 1) / ps;
    valid = last_page < page_count;
    std::vector<bool> seen(pages, false);
    for (std::size_t i = first / ps; i <= last_page && valid; ++i) {
      valid = row[i] >= 0 && static_cast<std::size_t>(row[i]) < pages && !seen[static_cast<std::size_t>(row[i])];
      if (valid) seen[static_cast<std::size_t>(row[i])] = true;
    }
  }
  const std::size_t r = rotation.table != nullptr ? (asked == 0 ? table_dim : asked) : 0;
  if (rotation.table != nullptr) valid = valid && rotation_kind != 1 && r % 2 == 0 && r <= table_dim && r <= d;
  const std::uint64_t magnitude =
      delta < 0 ? static_cast<std::uint64_t>(-(delta + 1)) + 1 : static_cast<std::uint64_t>(delta);
  const bool in_table = rotation.table == nullptr || magnitude < table_positions;

  const std::string where = "shift pages=" + std::to_string(pages) + "x" + std::to_string(ps) +
                            " heads=" + std::to_string(heads) + " d=" + std::to_string(d) + " r=" + std::to_string(r) +
                            " rows=" + std::to_string(page_count) + " first=" + std::to_string(first) +
                            " count=" + std::to_string(count) + " delta=" + std::to_string(delta) +
                            " break=" + std::to_string(pool_break);
  const PoolBefore<E> kb = before(kp), vb = before(vp);
  const auto row_before = copy_of(row);
  bool threw = false;
  try {
    ra::shift(cache, ids, page_count, first, count, delta, rotation, threads.threads);
  } catch (const rope::invalid_argument& e) {
    threw = true;
    ROPE_FUZZ_CHECK(!valid, where + ": " + e.what());
    ROPE_FUZZ_CHECK(named(e, "rope::attention::shift"), e.what());
  } catch (const rope::out_of_range& e) {
    threw = true;
    ROPE_FUZZ_CHECK(valid && !in_table, where + ": " + e.what());
    ROPE_FUZZ_CHECK(named(e, "rope::attention::shift"), e.what());
  }
  ROPE_FUZZ_CHECK(unchanged(vp, vb), where + ": the values written");
  ROPE_FUZZ_CHECK(same_bytes(row, row_before), where + ": the block-table row written");
  if (threw) {
    ROPE_FUZZ_CHECK(unchanged(kp, kb), where + ": a refused shift wrote the keys");
    return;
  }
  ROPE_FUZZ_CHECK(valid && in_table, where + ": an invalid call was accepted");
  if (rotation.table == nullptr || r == 0 || delta == 0 || count == 0) {
    ROPE_FUZZ_CHECK(unchanged(kp, kb), where + ": a shift that turns nothing wrote the keys");
    return;
  }
  if (threads.parallel()) {
    PoolData<E> k1 = kp;
    k1.data = kb.data;
    k1.scales = kb.scales;
    k1.pool.data = k1.data.data();
    if (scaled) k1.pool.scales = k1.scales.data();
    PoolData<E> v1 = vp;
    v1.pool.data = v1.data.data();
    if (scaled) v1.pool.scales = v1.scales.data();
    ra::shift(ra::PagedCache<E>{k1.pool, v1.pool}, ids, page_count, first, count, delta, rotation, std::size_t{1});
    ROPE_FUZZ_CHECK(same_bytes(k1.data, kp.data) && same_bytes(k1.scales, kp.scales),
                    where + ": not the same bytes with one thread");
  }
  // The oracle: each key of the range rotated from its stored value (the
  // pool before the call, widened).
  PoolData<E> was = kp;
  was.data = kb.data;
  was.scales = kb.scales;
  was.pool.data = was.data.data();
  if (scaled) was.pool.scales = was.scales.data();
  const LD u = unit_roundoff<float>();
  const LD k_units = scaled ? 4 : 3;
  const std::size_t mag = static_cast<std::size_t>(magnitude);
  const LD sign = delta < 0 ? -1 : 1;
  std::vector<std::int64_t> writer(slots, -1);
  for (std::size_t j = first; j < first + count; ++j) {
    const std::size_t slot = static_cast<std::size_t>(row[j / ps]) * ps + j % ps;
    writer[slot] = static_cast<std::int64_t>(j);
    for (std::size_t h = 0; h < heads; ++h) {
      const std::string at = where + " key " + std::to_string(j) + " head " + std::to_string(h);
      // y: the rotated row; err: the float rotation's bound; finite: the
      // channel's inputs (its pair's two) are finite.
      std::vector<LD> x(d), y(d), err(d);
      std::vector<bool> finite(d);
      for (std::size_t c = 0; c < d; ++c) {
        x[c] = stored(was.pool, slot, h, c);
        y[c] = x[c];
        err[c] = scaled ? k_units * u * std::fabs(x[c]) : 0;
        finite[c] = std::isfinite(x[c]);
      }
      for (std::size_t p = 0; p < r / 2; ++p) {
        const std::size_t a = style == rope::Style::rotate_half ? p : 2 * p;
        const std::size_t bb = style == rope::Style::rotate_half ? p + r / 2 : 2 * p + 1;
        const LD c = table.cos(mag)[p], s = sign * LD(table.sin(mag)[p]);
        y[a] = x[a] * c - x[bb] * s;
        y[bb] = x[bb] * c + x[a] * s;
        err[a] = k_units * u * (std::fabs(x[a] * c) + std::fabs(x[bb] * s));
        err[bb] = k_units * u * (std::fabs(x[bb] * c) + std::fabs(x[a] * s));
        finite[a] = finite[bb] = std::isfinite(x[a]) && std::isfinite(x[bb]);
      }
      if (scaled && !finite_all(x)) {  // dequantized to NaN (a NaN scale), quantized so again
        ROPE_FUZZ_CHECK(std::isnan(*kp.pool.scale(slot, h)), at + ": a non-finite row's scale is not NaN");
        continue;
      }
      LD top = 0, top_err = 0;
      for (std::size_t c = 0; c < d; ++c) {
        if (!finite[c]) continue;
        top = std::max(top, std::fabs(y[c]));
        top_err = std::max(top_err, err[c]);
      }
      const LD new_scale = scaled ? LD(*kp.pool.scale(slot, h)) : 0;
      if (scaled) {
        ROPE_FUZZ_CHECK(std::fabs(code_max<E>() * new_scale - top) <= top_err + 4 * u * top + std::ldexp(1.0L, -100),
                        at + ": the new scale " + std::to_string(double(new_scale)) + ", want max|y| / " +
                            std::to_string(double(code_max<E>())) + " = " +
                            std::to_string(double(top / code_max<E>())));
      }
      for (std::size_t c = 0; c < d; ++c) {
        const LD got = stored(kp.pool, slot, h, c);
        if (!scaled && c >= r) {  // past rotary_dim: the same bytes
          ROPE_FUZZ_CHECK(std::memcmp(kp.pool.row(slot, h) + c, was.pool.row(slot, h) + c, sizeof(E)) == 0,
                          at + " channel " + std::to_string(c) + ": past rotary_dim, changed");
          continue;
        }
        if (!finite[c]) continue;
        LD bound = err[c];
        if constexpr (std::is_same<E, rope::BFloat16>::value) {
          bound += (std::fabs(y[c]) + err[c]) / 256;
        } else if constexpr (std::is_same<E, rope::Float16>::value) {
          bound += (std::fabs(y[c]) + err[c]) / 2048 + std::ldexp(1.0L, -25);
        } else if constexpr (std::is_same<E, std::int8_t>::value) {
          bound += new_scale / 2 + u * (std::fabs(y[c]) + err[c]);
        } else if constexpr (is_fp8<E>()) {
          bound += fp8_rounding<E>(std::fabs(y[c]) + err[c], code_max<E>() * new_scale);
        }
        ROPE_FUZZ_CHECK(std::fabs(got - y[c]) <= bound,
                        at + " channel " + std::to_string(c) + ": got " + std::to_string(double(got)) + ", want " +
                            std::to_string(double(y[c])) + ", bound " + std::to_string(double(bound)));
      }
    }
  }
  // Every key outside the range as it was: with the range's rows put back,
  // the bytes before the call.
  std::vector<E> rest = kp.data;
  std::vector<float> rest_scales = kp.scales;
  for (std::size_t slot = 0; slot < slots; ++slot) {
    if (writer[slot] < 0) continue;
    for (std::size_t h = 0; h < heads; ++h) {
      const auto offset = static_cast<std::size_t>(kp.pool.row(slot, h) - kp.pool.data);
      std::copy(kb.data.begin() + static_cast<std::ptrdiff_t>(offset),
                kb.data.begin() + static_cast<std::ptrdiff_t>(offset + d),
                rest.begin() + static_cast<std::ptrdiff_t>(offset));
      if (scaled) rest_scales[slot * heads + h] = kb.scales[slot * heads + h];
    }
  }
  ROPE_FUZZ_CHECK(same_bytes(rest, kb.data) && same_bytes(rest_scales, kb.scales),
                  where + ": bytes written outside the range's keys");
}

}  // namespace

void fuzz_lists(Bytes& in) {
  switch (in.u8() % 8) {
    case 0: lists_typed<float, float, float>(in); break;
    case 1: lists_typed<rope::BFloat16, float, float>(in); break;
    case 2: lists_typed<rope::Float16, float, float>(in); break;
    case 3: lists_typed<std::int8_t, float, float>(in); break;
    case 4: lists_typed<float, rope::BFloat16, rope::Float16>(in); break;
    case 5: lists_typed<rope::BFloat16, rope::BFloat16, rope::Float16>(in); break;
    case 6: lists_typed<rope::Float16, rope::BFloat16, rope::Float16>(in); break;
    default:
      // The scaled byte caches: int8 and the two fp8 formats.
      switch (in.u8() % 4) {
        case 0: lists_typed<rope::Float8E4M3, float, float>(in); break;
        case 1: lists_typed<rope::Float8E5M2, rope::BFloat16, rope::Float16>(in); break;
        case 2: lists_typed<rope::Float8E4M3, rope::BFloat16, float>(in); break;
        default: lists_typed<std::int8_t, rope::BFloat16, rope::Float16>(in); break;
      }
      break;
  }
}

namespace {
// Rows of c_kv, k_pe, q_pe, q_pe_out and q_lat, and out: (float, float),
// (bf16, float), (float, f16).
template <class E>
void mla_any(Bytes& in) {
  switch (in.u8() % 3) {
    case 0: mla_typed<E, float, float>(in); break;
    case 1: mla_typed<E, rope::BFloat16, float>(in); break;
    default: mla_typed<E, float, rope::Float16>(in); break;
  }
}
}  // namespace

void fuzz_mla(Bytes& in) {
  switch (in.u8() % 4) {
    case 0: mla_any<float>(in); break;
    case 1: mla_any<rope::BFloat16>(in); break;
    case 2: mla_any<rope::Float16>(in); break;
    default: any_scaled_byte(in, [&](auto e) { mla_any<decltype(e)>(in); }); break;
  }
}

void fuzz_shift(Bytes& in) {
  switch (in.u8() % 4) {
    case 0: shift_typed<float>(in); break;
    case 1: shift_typed<rope::BFloat16>(in); break;
    case 2: shift_typed<rope::Float16>(in); break;
    default: any_scaled_byte(in, [&](auto e) { shift_typed<decltype(e)>(in); }); break;
  }
}

}  // namespace rope_fuzz

#else

namespace rope_fuzz {
void fuzz_lists(Bytes&) {}
void fuzz_mla(Bytes&) {}
void fuzz_shift(Bytes&) {}
}  // namespace rope_fuzz

#endif
