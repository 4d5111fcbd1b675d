// The serving path compiled once: append (both forms) and attend for every
// cache type and every row type, for the users of rope::attention built
// with -DROPE_ATTENTION_LIBRARY=ON (cmake/ropeAttentionLibrary.cmake), whose
// translation units see the forwarders of forwarders.hpp only. Compiled
// with the build's flags; its attend takes the decode loop rope::dispatch
// installed, where a program installs one (dispatch.md).
#if !defined(ROPE_ATTENTION_LIBRARY)
#error "src/attention/serving.cpp is built with ROPE_ATTENTION_LIBRARY defined (the rope_attention_library target)"
#endif

#include <cstdint>

#include <rope/attention/append.hpp>
#include <rope/attention/attend.hpp>
#include <rope/attention/serving_instances.hpp>
#include <rope/half.hpp>

namespace rope::attention::detail {

// The library's calls compute with the instruction set of its own build.
template <>
struct ArchOf<LibraryArch> {
  using type = xsimd::default_arch;
};

}  // namespace rope::attention::detail

// append, both forms, and attend, for every row type and cache type
// (serving_instances.hpp).
#define ROPE_INSTANTIATE_APPEND(In, QO, E)                                                                         \
  template void append_call<In, QO, E, LibraryArch>(const Plan&, const PagedCache<E>&, const View<const In>&,      \
                                                    const View<const In>&, const View<const In>&, const View<QO>&, \
                                                    bool, const AppendOptions&);
#define ROPE_INSTANTIATE_APPEND_KV(In, E)                                                                    \
  template void append_kv_call<In, E, LibraryArch>(const Plan&, const PagedCache<E>&, const View<const In>&, \
                                                   const View<const In>&, bool, const AppendOptions&);
#define ROPE_INSTANTIATE_ATTEND(Q, O, E)                                                                   \
  template void attend_call<Q, E, O, LibraryArch>(const Plan&, const PagedCache<E>&, const View<const Q>&, \
                                                  const View<O>&, const Logits&, const Mask&, float*);

namespace rope::attention::detail {
ROPE_SERVING_INSTANCES(ROPE_INSTANTIATE_APPEND, ROPE_INSTANTIATE_APPEND_KV, ROPE_INSTANTIATE_ATTEND)
}  // namespace rope::attention::detail
