// rope/attention/forwarders.hpp — append and attend as a user's
// translation unit sees them: their options, and thin forwarders to the
// checked calls (append.hpp, attend.hpp, where the contracts are spelled
// out). Header-only by default: the calls are compiled in every unit that
// uses them, for the unit's own instruction set (Arch =
// xsimd::default_arch). With ROPE_ATTENTION_LIBRARY defined (CMake:
// -DROPE_ATTENTION_LIBRARY=ON, which sets it for every user of
// rope::attention and builds rope's attention library,
// src/attention/serving.cpp), the forwarders call the instantiations that
// library holds, compiled once, for every cache type (float, BFloat16,
// Float16, int8, Float8E4M3, Float8E5M2) and every row type (float, BFloat16, Float16) of q, k, v,
// q_out and out; a user's unit then compiles none of the kernels. Define it
// for a whole program or not at all.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "../options.hpp"
#include "../pair_axes.hpp"
#include "../view.hpp"
#include "cache.hpp"
#include "logits.hpp"
#include "masks.hpp"
#include "plan.hpp"
#include "rotation.hpp"
#include "serving_instances.hpp"

#if !defined(ROPE_ATTENTION_LIBRARY)
#include "../detail/xsimd.hpp"
#endif

namespace rope::attention {

// RMSNorm weights of one side (Q or K): null for no norm on that side;
// else `size` values: head_dim for a per-head norm, heads * head_dim with
// whole_projection.
struct NormWeights {
  const float* data = nullptr;
  std::size_t size = 0;
};

struct AppendOptions {
  Rotation<float> rotation;  // no table: no RoPE (the norms and the writes only)
  NormWeights q_norm, k_norm;
  double eps = 1e-6;              // when a norm is set: finite and > 0, also in float
  bool plus_one = false;          // y = x r (1 + w) (Gemma) instead of x r w
  bool whole_projection = false;  // one norm over all heads' channels (OLMo 2)
  bool write_back_k = false;      // also write the normalized, rotated K into k
  // Multi-axis positions (M-RoPE, as rope::apply_mrope): with pair_axes set
  // (and a table), pair p of token t's Q and K is rotated by
  // axis_positions[pair_axes->axis[p] * plan.tokens() + t] * theta_p
  // instead of the plan's position p_t, which still picks the slot.
  // axis_positions is [pair_axes->axes, tokens], axis-major, as apply_mrope
  // takes it. Read only during the call; without a table neither is read.
  const PairAxes* pair_axes = nullptr;
  const std::int64_t* axis_positions = nullptr;
  // How the cache rows are stored (writer.hpp): automatic streams a long
  // prefill's rows, never a decode step's. The same bits either way.
  rope::Stores stores = rope::Stores::automatic;
};

namespace detail {

// The instruction set of rope's compiled attention library (whatever its
// build chose): the Arch of every call a user's unit makes through it.
struct LibraryArch {};

#if defined(ROPE_ATTENTION_LIBRARY)
using ServingArch = LibraryArch;
#else
using ServingArch = xsimd::default_arch;
#endif

// The xsimd architecture a call computes with: Arch itself, or for
// LibraryArch the library's own (defined where the library is compiled).
template <class Arch>
struct ArchOf {
  using type = Arch;
};
template <class Arch>
using arch_of = typename ArchOf<Arch>::type;

// The checked calls (append.hpp, attend.hpp).
template <class In, class QO, class E, class Arch>
void append_call(const Plan& plan, const PagedCache<E>& cache, const View<const In>& q, const View<const In>& k,
                 const View<const In>& v, const View<QO>& q_out, bool k_writable, const AppendOptions& options);
template <class In, class E, class Arch>
void append_kv_call(const Plan& plan, const PagedCache<E>& cache, const View<const In>& k, const View<const In>& v,
                    bool k_writable, const AppendOptions& options);
template <class Q, class E, class O, class Arch>
void attend_call(const Plan& plan, const PagedCache<E>& cache, const View<const Q>& q, const View<O>& out,
                 const Logits& logits, const Mask& mask, float* lse);

#if defined(ROPE_ATTENTION_LIBRARY)
// Compiled in rope's attention library, never in a user's unit (even one
// that includes append.hpp or attend.hpp itself).
#define ROPE_EXTERN_APPEND(In, QO, E)                                                                                \
  extern template void append_call<In, QO, E, LibraryArch>(const Plan&, const PagedCache<E>&, const View<const In>&, \
                                                           const View<const In>&, const View<const In>&,             \
                                                           const View<QO>&, bool, const AppendOptions&);
#define ROPE_EXTERN_APPEND_KV(In, E)                                                                                \
  extern template void append_kv_call<In, E, LibraryArch>(const Plan&, const PagedCache<E>&, const View<const In>&, \
                                                          const View<const In>&, bool, const AppendOptions&);
#define ROPE_EXTERN_ATTEND(Q, O, E)                                                                               \
  extern template void attend_call<Q, E, O, LibraryArch>(const Plan&, const PagedCache<E>&, const View<const Q>&, \
                                                         const View<O>&, const Logits&, const Mask&, float*);
ROPE_SERVING_INSTANCES(ROPE_EXTERN_APPEND, ROPE_EXTERN_APPEND_KV, ROPE_EXTERN_ATTEND)
#undef ROPE_EXTERN_APPEND
#undef ROPE_EXTERN_APPEND_KV
#undef ROPE_EXTERN_ATTEND
#endif

}  // namespace detail

// The step before attention for one layer (append.hpp): q normalized and
// rotated at the plan's positions into q_out (which may be q), k and v
// written into the plan's slots, each value rounded once. q, k, v: one
// element type (float, BFloat16, Float16), read-only views or not.
template <class QV, class KV, class VV, class QO, class E, class Arch = detail::ServingArch>
void append(const Plan& plan, const PagedCache<E>& cache, const View<QV>& q, const View<KV>& k, const View<VV>& v,
            const View<QO>& q_out, const AppendOptions& options = {}) {
  using In = std::remove_const_t<QV>;
  static_assert(std::is_same<In, std::remove_const_t<KV>>::value && std::is_same<In, std::remove_const_t<VV>>::value,
                "rope::attention::append: q, k and v hold one element type");
  static_assert(!std::is_const<QO>::value, "rope::attention::append: q_out is written");
  detail::check_kv_element<E>();
  detail::check_row_type<In>();
  detail::check_row_type<QO>();
  detail::append_call<In, QO, E, Arch>(plan, cache, View<const In>(q), View<const In>(k), View<const In>(v), q_out,
                                       !std::is_const<KV>::value, options);
}

// The K/V form: new keys and values into the plan's slots, K normalized and
// rotated first; no Q (the caller rotates Q at plan.positions(), or its
// layer has no RoPE).
template <class KV, class VV, class E, class Arch = detail::ServingArch>
void append(const Plan& plan, const PagedCache<E>& cache, const View<KV>& k, const View<VV>& v,
            const AppendOptions& options = {}) {
  using In = std::remove_const_t<KV>;
  static_assert(std::is_same<In, std::remove_const_t<VV>>::value,
                "rope::attention::append: k and v hold one element type");
  detail::check_kv_element<E>();
  detail::check_row_type<In>();
  detail::append_kv_call<In, E, Arch>(plan, cache, View<const In>(k), View<const In>(v), !std::is_const<KV>::value,
                                      options);
}

// Softmax attention of the plan's new tokens over the cache (attend.hpp):
// q [tokens, q_heads, head_dim] as given (append rotated it), out [tokens,
// q_heads, v_head_dim], lse (null: not written) tokens * q_heads floats.
template <class QV, class E, class O, class Arch = detail::ServingArch>
void attend(const Plan& plan, const PagedCache<E>& cache, const View<QV>& q, const View<O>& out,
            const Logits& logits = {}, const Mask& mask = {}, float* lse = nullptr) {
  using Q = std::remove_const_t<QV>;
  static_assert(!std::is_const<O>::value, "rope::attention::attend: out is written");
  detail::check_kv_element<E>();
  detail::check_row_type<Q>();
  detail::check_row_type<O>();
  detail::attend_call<Q, E, O, Arch>(plan, cache, View<const Q>(q), out, logits, mask, lse);
}

}  // namespace rope::attention
