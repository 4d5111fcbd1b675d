// rope/attention/mla_append.hpp — the step before MLA attention (DeepSeek
// V2/V3, Kimi K2, GLM-4.7-Flash, GLM-5), in one pass per token over the
// projections' outputs, into the slots the step's plan derived:
//
//   row  = [ RMSNorm(c_kv) (kv_a_layernorm) | R_p k_pe ]   rounded or quantized once into the latent cache
//   q_pe <- R_p q_pe                                       rounded once into q_pe_out (which may be q_pe)
//
// at the token's planned position p, with the model's pairing and table
// (interleaved pairs for DeepSeek; YaRN's attention factor in the table's
// rows). The norm is attention's RMSNorm (pre_attention.hpp), over the
// latent_dim values, by options.k_norm's weights. int8 rows are quantized
// part by part, each with its own scale (cache.hpp). The caller has
// applied W_UK to q_nope already (q_lat), or does so next: this step does
// not touch q_lat. Threads: the plan's, over tokens; the same bytes for any
// count. Everything is checked before anything is written.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "../detail/lines.hpp"
#include "../detail/parallel.hpp"
#include "../detail/xsimd.hpp"
#include "../kernels/kv_store.hpp"
#include "../kernels/rms_norm.hpp"
#include "../tensor/view_checks.hpp"
#include "append.hpp"
#include "cache.hpp"
#include "plan.hpp"
#include "pre_attention.hpp"
#include "rotation.hpp"

namespace rope::attention {

namespace detail {

// The plan against a latent cache: the plan made, the cache sound and of
// the plan's shape.
template <class E>
void check_plan_latent(const char* fn, const Plan& plan, const LatentCache<E>& cache) {
  if (!PlanAccess::valid(plan)) fail(fn, "plan", "made by a rope::attention::plan() that succeeded", "no plan");
  check_latent_cache(fn, cache);
  const Shape& s = plan.shape();
  if (s.kv_heads != 1) fail(fn, "the plan's shape.kv_heads", "1 (MLA: one latent row for every head)", s.kv_heads);
  if (s.head_dim != cache.width()) {
    fail(fn, "the plan's shape.head_dim", {"cache.latent_dim + cache.rope_dim = ", cache.width()}, s.head_dim);
  }
  if (s.v_head_dim != cache.latent_dim) {
    fail(fn, "the plan's shape.v_head_dim", {"cache.latent_dim = ", cache.latent_dim}, s.v_head_dim);
  }
  if (s.page_size != cache.page_size) {
    fail(fn, "the plan's shape.page_size", {"cache.page_size = ", cache.page_size}, s.page_size);
  }
  if (s.pages != cache.pages) fail(fn, "the plan's shape.pages", {"cache.pages = ", cache.pages}, s.pages);
}

// A view of the step's rows: its tokens, heads and head_dim, and memory
// apart from the cache and its scales.
template <class T, class E>
void check_latent_rows(const char* fn, const char* name, const View<T>& x, std::size_t tokens, std::size_t heads,
                       std::size_t dim, const LatentCache<E>& cache) {
  rope::detail::check_view(fn, name, x);
  const std::size_t got[3] = {x.tokens, x.heads, x.head_dim}, want[3] = {tokens, heads, dim};
  const char* dims[3] = {".tokens", ".heads", ".head_dim"};
  for (std::size_t i = 0; i < 3; ++i) {
    if (got[i] != want[i]) fail(fn, {name, dims[i]}, want[i], got[i]);
  }
  const std::size_t span = view_span(x);
  if (bytes_overlap(x.data, span, cache.data, latent_span(cache)) ||
      (cache.scales != nullptr && bytes_overlap(x.data, span, cache.scales, 2 * cache.slots()))) {
    fail(fn, name, "memory apart from the cache and its scales", "overlapping");
  }
}

// One token's row into its slot: the latent part normalized, the rope part
// rotated (cos null: not rotated), each rounded or quantized once. x:
// width floats of scratch.
template <class In, class E, class Arch>
void write_latent_row(const View<const In>& c_kv, const View<const In>& k_pe, std::size_t t, const Norm& norm,
                      Style style, std::size_t rotary_dim, const float* cos, const float* sin, E* row, float* scales,
                      std::size_t latent, float* x) noexcept {
  const std::size_t rope = k_pe.head_dim;
  widen_row(c_kv.row(t, 0), latent, x);
  if (norm.weight != nullptr) rms_norm_row<Arch>(x, latent, norm.weight, norm.eps, norm.plus_one, x);
  widen_row(k_pe.row(t, 0), rope, x + latent);
  if (cos != nullptr) rotate_with<float, Arch>(style, rotary_dim, cos, sin, x + latent, 0, 1);
  if constexpr (KvElement<E>::kScaled) {
    store_kv_row<Arch>(x, latent, row, scales);
    store_kv_row<Arch>(x + latent, rope, row + latent, scales + 1);
  } else {
    store_kv_row<Arch>(x, latent + rope, row, nullptr);
  }
}

}  // namespace detail

// The step before MLA attention for one layer (see the header comment):
// c_kv [tokens, 1, latent_dim] and k_pe [tokens, 1, rope_dim] (the
// kv_a projection's two parts, k_pe not yet rotated) into the planned
// slots of the latent cache; q_pe [tokens, q_heads, rope_dim] rotated into
// q_pe_out. options: rotation (the model's pairing; rotary_dim at most
// rope_dim), k_norm (kv_a_layernorm: latent_dim weights, or null for none),
// eps, plus_one; q_norm, write_back_k and pair_axes are refused (this step
// has no such rows); the rows are stored plainly. Refused before anything is
// written as append's other forms refuse (append.hpp), and views that do
// not fit the latent cache.
template <class CV, class PV, class QV, class QO, class E, class Arch = xsimd::default_arch>
void append(const Plan& plan, const LatentCache<E>& cache, const View<CV>& c_kv_view, const View<PV>& k_pe_view,
            const View<QV>& q_pe_view, const View<QO>& q_pe_out, const AppendOptions& options = {}) {
  using In = std::remove_const_t<CV>;
  static_assert(std::is_same<In, std::remove_const_t<PV>>::value && std::is_same<In, std::remove_const_t<QV>>::value,
                "rope::attention::append: c_kv, k_pe and q_pe hold one element type");
  static_assert(!std::is_const<QO>::value, "rope::attention::append: q_pe_out is written");
  detail::check_kv_element<E>();
  detail::check_row_type<In>();
  detail::check_row_type<QO>();
  const char* fn = "rope::attention::append";
  const View<const In> c_kv(c_kv_view), k_pe(k_pe_view), q_pe(q_pe_view);
  detail::check_plan_latent(fn, plan, cache);
  detail::check_writable(fn, plan);
  const std::size_t tokens = plan.tokens(), heads = plan.shape().q_heads;
  detail::check_latent_rows(fn, "c_kv", c_kv, tokens, 1, cache.latent_dim, cache);
  detail::check_latent_rows(fn, "k_pe", k_pe, tokens, 1, cache.rope_dim, cache);
  detail::check_latent_rows(fn, "q_pe", q_pe, tokens, heads, cache.rope_dim, cache);
  detail::check_latent_rows(fn, "q_pe_out", q_pe_out, tokens, heads, cache.rope_dim, cache);
  if (!detail::same_rows(q_pe, q_pe_out)) rope::detail::check_disjoint(fn, "q_pe_out", q_pe_out, "q_pe", q_pe);
  rope::detail::check_disjoint(fn, "q_pe_out", q_pe_out, "c_kv", c_kv);
  rope::detail::check_disjoint(fn, "q_pe_out", q_pe_out, "k_pe", k_pe);
  if (options.q_norm.data != nullptr) {
    detail::fail(fn, "options.q_norm.data", "null: MLA's query norm comes before the caller's q_b projection", "set");
  }
  if (options.write_back_k) detail::fail(fn, "options.write_back_k", "false: an MLA step has no k rows", "true");
  if (options.pair_axes != nullptr) detail::fail(fn, "options.pair_axes", "null for a latent cache", "set");
  AppendOptions kv_norm_options = options;
  kv_norm_options.whole_projection = false;
  const detail::Norm norm = detail::norm_of(fn, "options.k_norm", options.k_norm, cache.latent_dim, kv_norm_options);
  const std::size_t rotary_dim = detail::rotary_width(fn, "options.rotation", options.rotation, cache.rope_dim);
  const detail::TokenAngles angles = detail::angles_of(fn, plan, rotary_dim, options);
  const std::size_t workers = std::min(tokens, std::max<std::size_t>(1, plan.threads().shares()));
  if (tokens == 0) return;
  const std::size_t per = rope::detail::line_floats(std::max(cache.width(), heads * cache.rope_dim));
  std::vector<float> buffer(workers * per + rope::detail::kLineFloats);
  float* const scratch = rope::detail::line_start(buffer);
  const Style style = options.rotation.style;
  rope::detail::parallel_for(workers, workers, plan.threads().executor, [&](std::size_t w, std::size_t) {
    float* x = scratch + w * per;
    for (std::size_t t = tokens * w / workers; t < tokens * (w + 1) / workers; ++t) {
      const float* cos;
      const float* sin;
      angles.of(t, nullptr, cos, sin);
      const auto slot = static_cast<std::size_t>(plan.slot(t));
      detail::write_latent_row<In, E, Arch>(c_kv, k_pe, t, norm, style, rotary_dim, cos, sin, cache.row(slot),
                                            cache.scales != nullptr ? cache.scale(slot) : nullptr, cache.latent_dim, x);
      detail::load_normed<In, Arch>(q_pe, t, detail::Norm{}, x);
      detail::rotate_store<Arch>(x, style, rotary_dim, cos, sin, q_pe_out, t);
    }
  });
}

}  // namespace rope::attention
