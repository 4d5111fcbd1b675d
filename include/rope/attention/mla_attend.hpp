// rope/attention/mla_attend.hpp — absorbed multi-head latent attention (MLA:
// DeepSeek V2/V3, Kimi K2, GLM-4.7-Flash, GLM-5) over a paged latent cache
// (cache.hpp, LatentCache), for decode, short chunks and prefill, dense or
// sparse (Mask::indices: DeepSeek V3.2's and GLM-5's top-k).
//
// Per query head h of new token t at position p, over the cache rows
// [c_kv_j | k_pe_j] of the keys j it sees:
//   s_j   = scale * (q_lat_h . c_kv_j + q_pe_h . k_pe_j)    q_lat_h = q_nope_h W_UK_h (the caller's)
//   s_j  <- cap * tanh(s_j / cap), the mask, the sink        (logits.hpp's order)
//   out_h = sum_j softmax_j(s) c_kv_j                        (the caller applies W_UV_h)
// V is the latent part of the same rows, never a copy. scale is the
// model's (DeepSeek: mscale^2 / sqrt(qk_nope + qk_rope), rope::hf's
// ModelRope::mla->softmax_scale): logits.scale must be given.
//
// MLA is compute-bound (per cached row of 576 values, 128 heads do about
// 139k multiply-adds), so the work is GEMMs: every query head of a token
// (and, in a chunk of a prompt, of up to kMlaRows / q_heads tokens) reads
// a block of kMlaChunk cache rows once, widened to float:
//   S = Q [rows x width] K^T,  the online softmax of each row of S,  acc += P V
// with the running max and sum of scores.hpp. A decode token's keys are
// split as the plan splits them (parts of kv_split keys, merged in order),
// a sparse token's list likewise: the same bytes for any thread count.
// Arithmetic in float over the stored values widened exactly (int8 times
// its part's scale, one rounding); the products by Eigen's GEMM.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include <Eigen/Core>

#include "../detail/parallel.hpp"
#include "../detail/xsimd.hpp"
#include "../kernels/kv_store.hpp"
#include "../kernels/scores.hpp"
#include "../tensor/view_checks.hpp"
#include "cache.hpp"
#include "cascade_tiles.hpp"
#include "logits.hpp"
#include "masks.hpp"
#include "mla_append.hpp"
#include "plan.hpp"
#include "sparse.hpp"
#include "types.hpp"

namespace rope::attention {

// Cache rows per GEMM block, and the most query rows (tokens x heads) a
// block of a prompt's tokens stacks into one GEMM.
constexpr std::size_t kMlaChunk = 256;
constexpr std::size_t kMlaRows = 512;

namespace detail {

// What a checked MLA call runs with.
struct MlaParams {
  std::size_t heads = 0, latent = 0, rope = 0;
  LogitParams<float> logits;
  Mask mask;
  bool bf16 = false;  // Products::bf16: q and the weights rounded to bf16 (on tiles where they run)
};

// The work of an MLA call: decode tokens (and sparse tokens) as the plan
// splits them, the tokens of a longer chunk in blocks of kMlaRows / heads.
inline void mla_layout(const Plan& plan, std::size_t heads, WorkLayout& out) {
  out.clear();
  const std::int64_t* q_starts = PlanAccess::q_starts(plan);
  const std::size_t block = std::max<std::size_t>(1, kMlaRows / heads);
  for (std::size_t b = 0; b < plan.sequences(); ++b) {
    const auto n = static_cast<std::size_t>(q_starts[b + 1] - q_starts[b]);
    const auto len = static_cast<std::size_t>(PlanAccess::lengths(plan)[b]);
    const auto t0 = static_cast<std::size_t>(q_starts[b]);
    if (n == 1 && !PlanAccess::tree(plan, b)) {
      out.add(b, t0, len, plan.shape().kv_split, true);
      continue;
    }
    if (PlanAccess::tree(plan, b)) {  // the plan's items, each over its token's list
      for (const WorkItem& it : PlanAccess::work(plan).items) {
        if (it.sequence == b) out.items.push_back(it);
      }
      continue;
    }
    for (std::size_t t = t0; t < t0 + n; t += block) {
      out.items.push_back({b, t, 0, len, WorkItem::kDirect, std::min(block, t0 + n - t)});
    }
  }
}

template <class E>
struct MlaKeys {
  const LatentCache<E>* cache;
  const std::int32_t* pages;
  const std::int32_t* positions;  // sparse: the token's list; null: key j is j
};

// The per-worker matrices of an MLA call (grown on first use).
struct MlaScratch {
  Matrix<float> q, keys, scores, acc;
  std::vector<float> m, l, row;
  std::vector<unsigned char> finite;  // per key row of the block: its latent part finite
  LevelScratch tiles;                 // the bf16 mode's tiles (cascade_tiles.hpp)
};

template <class QL, class QP, class E, class O, class Arch>
class MlaRun {
 public:
  MlaRun(const Plan& plan, const LatentCache<E>& cache, const View<const QL>& q_lat, const View<const QP>& q_pe,
         const View<O>& out, float* lse, const MlaParams& p, const WorkLayout& work, float* partials) noexcept
      : plan_(plan),
        cache_(cache),
        q_lat_(q_lat),
        q_pe_(q_pe),
        out_(out),
        lse_(lse),
        p_(p),
        work_(work),
        partials_(partials) {
    if constexpr (std::is_same<E, BFloat16>::value && rope::detail::kTilesArch<Arch>) {
      tiles_ = p.bf16 && level_tiles_run<Arch>();
    }
  }

  // Item i's keys: [first, first + count) of its positions (dense: cut to
  // what its tokens see together; sparse: its list, checked already).
  void cut(std::size_t i, std::size_t* first, std::size_t* count) const noexcept {
    const WorkItem& it = work_.items[i];
    if (it.key_list != nullptr) {
      *first = it.first_key;
      *count = it.keys;
      return;
    }
    std::size_t lo = 0, hi = 0, lo_last = 0, hi_last = 0;
    const std::int64_t length = PlanAccess::lengths(plan_)[it.sequence];
    visible_keys(plan_.position(it.token), length, p_.mask, &lo, &hi);
    visible_keys(plan_.position(it.token + it.tokens - 1), length, p_.mask, &lo_last, &hi_last);
    const std::size_t a = std::max(lo, it.first_key), b = std::min(hi_last, it.first_key + it.keys);
    *first = a;
    *count = b > a ? b - a : 0;
  }

  void item(std::size_t index, MlaScratch& s) const {
    const WorkItem& it = work_.items[index];
    const std::size_t rows = it.tokens * p_.heads;
    std::size_t first = 0, count = 0;
    cut(index, &first, &count);
    s.m.assign(rows, -std::numeric_limits<float>::infinity());
    s.l.assign(rows, 0.0f);
    s.acc.setZero(static_cast<Eigen::Index>(rows), static_cast<Eigen::Index>(p_.latent));
    if (count > 0 && tiles_ && it.key_list == nullptr) {
      item_tiles(it, first, count, s);
    } else if (count > 0) {
      load_queries(it, s);
      for (std::size_t c = first; c < first + count; c += kMlaChunk)
        block(it, c, std::min(kMlaChunk, first + count - c), s);
    }
    if (it.partial == WorkItem::kDirect) {
      for (std::size_t r = 0; r < rows; ++r) finish(it.token + r / p_.heads, r % p_.heads, count > 0, s, r);
      return;
    }
    float* part = partial(it.partial);
    for (std::size_t r = 0; r < rows; ++r) {
      std::copy_n(s.acc.row(static_cast<Eigen::Index>(r)).data(), p_.latent, part + r * p_.latent);
    }
    std::copy(s.m.begin(), s.m.end(), part + rows * p_.latent);
    std::copy(s.l.begin(), s.l.end(), part + rows * p_.latent + rows);
  }

  // One token of several items: their partial states merged in item order,
  // those left empty skipped.
  void merge(std::size_t index, MlaScratch& s) const {
    const TokenMerge& mg = work_.merges[index];
    const std::size_t H = p_.heads, L = p_.latent;
    s.m.assign(H, -std::numeric_limits<float>::infinity());
    s.l.assign(H, 0.0f);
    s.acc.setZero(static_cast<Eigen::Index>(H), static_cast<Eigen::Index>(L));
    bool sees = false;
    for (std::size_t k = 0; k < mg.items; ++k) {
      std::size_t first = 0, count = 0;
      cut(mg.first_item + k, &first, &count);
      if (count == 0) continue;
      sees = true;
      const float* part = partial(work_.items[mg.first_item + k].partial);
      for (std::size_t h = 0; h < H; ++h) {
        rope::detail::merge_state(s.m[h], s.l[h], s.acc.row(static_cast<Eigen::Index>(h)).data(), part[H * L + h],
                                  part[H * L + H + h], part + h * L, L);
      }
    }
    for (std::size_t h = 0; h < H; ++h) finish(mg.token, h, sees, s, h);
  }

 private:
  // The item's keys [first, first + count) on AMX tiles in the bf16 mode
  // (attend_block_tiles, one key/value head: every query head's rows read
  // each cache row once, the values its latent part): the state in s.acc,
  // s.m, s.l as block() leaves it.
  void item_tiles(const WorkItem& it, std::size_t first, std::size_t count, MlaScratch& s) const {
    if constexpr (std::is_same<E, BFloat16>::value && rope::detail::kTilesArch<Arch>) {
      const std::size_t H = p_.heads, L = p_.latent, width = L + p_.rope, R = it.tokens * H;
      std::size_t lo[kMlaRows] = {}, hi[kMlaRows] = {};
      for (std::size_t k = 0; k < it.tokens; ++k) {
        visible_keys(plan_.position(it.token + k), PlanAccess::lengths(plan_)[it.sequence], p_.mask, lo + k, hi + k);
        lo[k] = std::clamp(lo[k], first, first + count);
        hi[k] = std::clamp(hi[k], lo[k], first + count);
      }
      KvKeys<BFloat16> keys;
      keys.k = keys.v = cache_.data;
      keys.pages = PlanAccess::pages_of(plan_, it.sequence);
      keys.page_size = cache_.page_size;
      keys.k_page_stride = keys.v_page_stride = cache_.page_stride;
      keys.k_token_stride = keys.v_token_stride = cache_.token_stride;
      keys.q_heads = H;
      keys.kv_heads = 1;
      keys.d = width;
      keys.dv = L;
      keys.scale = p_.logits.scale;
      keys.softcap = p_.logits.softcap;
      const auto pack = [&](std::uint16_t* qv, std::size_t rows, float* wide, std::uint16_t* words) noexcept {
        for (std::size_t r = 0; r < R; ++r) {
          const std::size_t t = it.token + r / H, h = r % H;
          widen_row(q_lat_.row(t, h), L, wide);
          widen_row(q_pe_.row(t, h), p_.rope, wide + L);
          pack_query_row<Arch>(wide, width, r, rows, qv, words);
        }
      };
      const auto done = [&](std::size_t, const float* acc, const float* m, const float* l) noexcept {
        const std::size_t da = rope::detail::tile_span(L);
        for (std::size_t r = 0; r < R; ++r) {
          std::copy_n(acc + r * da, L, s.acc.row(static_cast<Eigen::Index>(r)).data());
          s.m[r] = m[r];
          s.l[r] = l[r];
        }
      };
      attend_block_tiles<Arch>(it.tokens, lo, hi, first, count, pack, keys, s.tiles, done);
    } else {
      (void)it, (void)first, (void)count, (void)s;
    }
  }

  // The item's query rows [q_lat | q_pe], widened (in the bf16 mode
  // rounded to bf16 as its q is) and scaled once.
  void load_queries(const WorkItem& it, MlaScratch& s) const {
    const std::size_t width = p_.latent + p_.rope, rows = it.tokens * p_.heads;
    s.q.resize(static_cast<Eigen::Index>(rows), static_cast<Eigen::Index>(width));
    for (std::size_t r = 0; r < rows; ++r) {
      float* row = s.q.row(static_cast<Eigen::Index>(r)).data();
      const std::size_t t = it.token + r / p_.heads, h = r % p_.heads;
      widen_row(q_lat_.row(t, h), p_.latent, row);
      widen_row(q_pe_.row(t, h), p_.rope, row + p_.latent);
      if (p_.bf16) {
        for (std::size_t x = 0; x < width; ++x) row[x] = bf16_mode_value(row[x]);
      }
    }
    s.q *= p_.logits.scale;
  }

  // Rows [c, c + n) of the item's keys widened into s.keys, each row's
  // latent part checked finite (a value a masked query must not see).
  void gather(const WorkItem& it, std::size_t c, std::size_t n, MlaScratch& s) const {
    const std::size_t width = p_.latent + p_.rope, ps = cache_.page_size;
    if (s.keys.rows() < static_cast<Eigen::Index>(kMlaChunk)) {
      s.keys.resize(static_cast<Eigen::Index>(kMlaChunk), static_cast<Eigen::Index>(width));
    }
    s.finite.assign(n, 1);
    const std::int32_t* pages = PlanAccess::pages_of(plan_, it.sequence);
    const std::int32_t* list = it.key_list;
    for (std::size_t j = 0; j < n; ++j) {
      const std::size_t position = list != nullptr ? static_cast<std::size_t>(list[c + j]) : c + j;
      const std::size_t slot = static_cast<std::size_t>(pages[position / ps]) * ps + position % ps;
      const E* src = cache_.row(slot);
      float* dst = s.keys.row(static_cast<Eigen::Index>(j)).data();
      widen_row(src, width, dst);
      if constexpr (KvElement<E>::kScaled) {
        const float* scale = cache_.scale(slot);
        for (std::size_t x = 0; x < p_.latent; ++x) dst[x] *= scale[0];
        for (std::size_t x = p_.latent; x < width; ++x) dst[x] *= scale[1];
      }
      for (std::size_t x = 0; x < p_.latent && s.finite[j]; ++x) s.finite[j] = std::isfinite(dst[x]) ? 1 : 0;
    }
  }

  // One block of n keys from position index c: scores, the online softmax,
  // the weighted latent rows.
  void block(const WorkItem& it, std::size_t c, std::size_t n, MlaScratch& s) const {
    const auto rows = static_cast<Eigen::Index>(it.tokens * p_.heads), ni = static_cast<Eigen::Index>(n);
    gather(it, c, n, s);
    if (s.scores.rows() < rows || s.scores.cols() < static_cast<Eigen::Index>(kMlaChunk)) {
      s.scores.resize(rows, static_cast<Eigen::Index>(kMlaChunk));
    }
    auto scores = s.scores.topLeftCorner(rows, ni);
    scores.noalias() = s.q * s.keys.topRows(ni).transpose();
    const bool masked = it.key_list == nullptr && it.tokens > 1;
    bool masked_any = false;
    for (Eigen::Index r = 0; r < rows; ++r) {
      float* sr = scores.row(r).data();
      if (p_.logits.softcap > 0.0f) softcap_row<Arch>(sr, n, p_.logits.softcap);
      if (masked) masked_any = mask_row(it, static_cast<std::size_t>(r), c, n, sr) || masked_any;
      const auto ri = static_cast<std::size_t>(r);
      const float m_new = std::max(s.m[ri], max_row<Arch>(sr, n));
      const float carried = rope::detail::carry(s.m[ri], m_new);
      const float shift = m_new == -std::numeric_limits<float>::infinity() ? 0.0f : m_new;
      const float sum = softmax_weights_row<Arch>(sr, sr, n, shift, false);
      if (p_.bf16) {  // the weights rounded as the tiles round them, the sum not
        for (std::size_t j = 0; j < n; ++j) sr[j] = bf16_mode_value(sr[j]);
      }
      s.l[ri] = s.l[ri] * carried + sum;
      if (carried != 1.0f) s.acc.row(r) *= carried;
      if (m_new != -std::numeric_limits<float>::infinity()) s.m[ri] = m_new;
    }
    const bool clean =
        !masked_any || std::all_of(s.finite.begin(), s.finite.end(), [](unsigned char f) { return f != 0; });
    const auto values = s.keys.topLeftCorner(ni, static_cast<Eigen::Index>(p_.latent));
    if (clean) {
      s.acc.noalias() += scores * values;
      return;
    }
    // A masked key whose latent row is not finite: each row sums only the
    // keys it sees, never a masked one times zero.
    for (Eigen::Index r = 0; r < rows; ++r) {
      for (Eigen::Index j = 0; j < ni; ++j) {
        if (visible(it, static_cast<std::size_t>(r), c + static_cast<std::size_t>(j))) {
          s.acc.row(r) += scores(r, j) * values.row(j);
        }
      }
    }
  }

  bool visible(const WorkItem& it, std::size_t r, std::size_t position) const noexcept {
    std::size_t lo = 0, hi = 0;
    visible_keys(plan_.position(it.token + r / p_.heads), PlanAccess::lengths(plan_)[it.sequence], p_.mask, &lo, &hi);
    return position >= lo && position < hi;
  }

  // Row r's scores of keys [c, c + n) that its token does not see set to
  // -inf; whether any was.
  bool mask_row(const WorkItem& it, std::size_t r, std::size_t c, std::size_t n, float* sr) const noexcept {
    std::size_t lo = 0, hi = 0;
    visible_keys(plan_.position(it.token + r / p_.heads), PlanAccess::lengths(plan_)[it.sequence], p_.mask, &lo, &hi);
    bool any = false;
    for (std::size_t j = 0; j < n; ++j) {
      if (c + j < lo || c + j >= hi) {
        sr[j] = -std::numeric_limits<float>::infinity();
        any = true;
      }
    }
    return any;
  }

  void finish(std::size_t t, std::size_t h, bool sees, MlaScratch& s, std::size_t r) const noexcept {
    s.row.resize(p_.latent);
    finish_float_row<Arch>(s.m[r], s.l[r], s.acc.row(static_cast<Eigen::Index>(r)).data(), p_.latent, p_.logits.sink(h),
                           sees, s.row.data(), lse_ != nullptr ? lse_ + t * p_.heads + h : nullptr);
    store_kv_row<Arch>(s.row.data(), p_.latent, out_.row(t, h), nullptr);
  }

  float* partial(std::size_t i) const noexcept { return partials_ + i * p_.heads * (p_.latent + 2); }

  const Plan& plan_;
  const LatentCache<E>& cache_;
  View<const QL> q_lat_;
  View<const QP> q_pe_;
  View<O> out_;
  float* lse_;
  const MlaParams& p_;
  const WorkLayout& work_;
  float* partials_;
  bool tiles_ = false;  // the bf16 mode on AMX tiles
};

}  // namespace detail

// Absorbed MLA attention of the plan's new tokens over a latent cache that
// holds their rows (the MLA append, or the caller's writes) — see the
// header comment. q_lat [tokens, q_heads, latent_dim] (q_nope W_UK), q_pe
// [tokens, q_heads, rope_dim] (rotated at the token's position: the MLA
// append does it), out [tokens, q_heads, latent_dim]; lse as attend's. The
// mask as attend's (causal by default, a window, sparse indices); logits
// with the model's scale, which must be set. Refused before out is written:
// as attend's refusals (attend.hpp), views that do not fit the latent cache,
// a missing logits.scale.
template <class LV, class PV, class E, class O, class Arch = xsimd::default_arch>
void attend(const Plan& plan, const LatentCache<E>& cache, const View<LV>& q_lat_view, const View<PV>& q_pe_view,
            const View<O>& out, const Logits& logits, const Mask& mask = {}, float* lse = nullptr) {
  using QL = std::remove_const_t<LV>;
  using QP = std::remove_const_t<PV>;
  static_assert(!std::is_const<O>::value, "rope::attention::attend: out is written");
  detail::check_kv_element<E>();
  detail::check_row_type<QL>();
  detail::check_row_type<QP>();
  detail::check_row_type<O>();
  const char* fn = "rope::attention::attend";
  const View<const QL> q_lat(q_lat_view);
  const View<const QP> q_pe(q_pe_view);
  detail::check_plan_latent(fn, plan, cache);
  const std::size_t tokens = plan.tokens(), heads = plan.shape().q_heads;
  detail::check_latent_rows(fn, "q_lat", q_lat, tokens, heads, cache.latent_dim, cache);
  detail::check_latent_rows(fn, "q_pe", q_pe, tokens, heads, cache.rope_dim, cache);
  detail::check_latent_rows(fn, "out", out, tokens, heads, cache.latent_dim, cache);
  rope::detail::check_disjoint(fn, "out", out, "q_lat", q_lat);
  rope::detail::check_disjoint(fn, "out", out, "q_pe", q_pe);
  if (lse != nullptr) {
    const std::size_t n = tokens * heads;
    if (detail::bytes_overlap(lse, n, out.data, detail::view_span(out)) ||
        detail::bytes_overlap(lse, n, q_lat.data, detail::view_span(q_lat)) ||
        detail::bytes_overlap(lse, n, q_pe.data, detail::view_span(q_pe)) ||
        detail::bytes_overlap(lse, n, cache.data, detail::latent_span(cache)) ||
        (cache.scales != nullptr && detail::bytes_overlap(lse, n, cache.scales, 2 * cache.slots()))) {
      detail::fail(fn, "lse", "memory apart from q_lat, q_pe, out and the cache (and its scales)", "overlapping");
    }
  }
  if (!logits.scale) {
    detail::fail(fn, "logits.scale", "set for MLA: the model's softmax scale (rope::hf::ModelRope::mla)", "empty");
  }
  const Products mode = plan.shape().products;
  if (mode == Products::int8 || (mode == Products::bf16 && !std::is_same<E, BFloat16>::value)) {
    detail::fail(
        fn, "shape.products",
        "Products::exact, or Products::bf16 with a bf16 latent cache (its rows are the products' bf16 factors)",
        mode == Products::bf16 ? detail::kv_type_name<E>() : "Products::int8");
  }
  detail::MlaParams p;
  p.heads = heads;
  p.latent = cache.latent_dim;
  p.rope = cache.rope_dim;
  p.logits = detail::check_logits<float>(fn, "logits", logits, heads, cache.width());
  p.mask = mask;
  p.bf16 = mode == Products::bf16;
  detail::check_tree_mask(fn, plan, mask);
  detail::PlanScratch& ws = detail::PlanAccess::scratch(plan);
  if (mask.indices != nullptr) {
    detail::sparse_lists(fn, plan, mask, ws);
  } else {
    detail::mla_layout(plan, heads, ws.call_work);
  }
  const detail::WorkLayout& work = ws.call_work;
  ws.partials.resize(work.partials * heads * (p.latent + 2));
  const detail::MlaRun<QL, QP, E, O, Arch> run(plan, cache, q_lat, q_pe, out, lse, p, work, ws.partials.data());
  const std::size_t items = work.items.size();
  const std::size_t threads = std::max<std::size_t>(1, plan.threads().shares());
  // One scratch per share of the items and of the merges (a token whose
  // sparse list is empty has a merge but no item).
  std::vector<detail::MlaScratch> scratch(
      std::max<std::size_t>(1, std::min(threads, std::max(items, work.merges.size()))));
  const Executor& executor = plan.threads().executor;
  rope::detail::parallel_for_costs(
      items, threads, executor,
      [&](std::size_t i) {
        std::size_t first = 0, count = 0;
        run.cut(i, &first, &count);
        return count * work.items[i].tokens + detail::kItemCost;
      },
      [&](std::size_t i, std::size_t w) { run.item(i, scratch[w]); });
  rope::detail::parallel_for(work.merges.size(), threads, executor,
                             [&](std::size_t i, std::size_t w) { run.merge(i, scratch[w]); });
}

}  // namespace rope::attention
