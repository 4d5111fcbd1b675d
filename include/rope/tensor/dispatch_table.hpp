// rope/tensor/dispatch_table.hpp — the table through which rope::dispatch routes the
// checked tensor calls (apply, apply_qk, apply_mrope, apply_axial). Attention's
// slots are on its own floor (attention/dispatch_slots.hpp).
//
// A DispatchTable holds the token loop (token_loop.hpp) compiled for one
// instruction set: one entry per element type, source of cos/sin rows and
// pairing. installed_table points at the table rope::dispatch chose, or is
// null: then, as in a program without rope::dispatch, every call runs the
// loop compiled in the caller's own translation unit. A checked call reads
// the pointer once, after its checks; the dispatched loop costs one indirect
// call per chunk of tokens (per thread), nothing per row.
//
// Element types in the table: float, double, BFloat16, Float16 (the types
// the tensor API supports natively); other 2-byte storage types always take
// the compiled-in path.
#pragma once

#include <atomic>
#include <cstddef>

#include "../half.hpp"
#include "../style.hpp"
#include "token_loop.hpp"

namespace rope::detail {

template <class T>
using compute_t = typename Storage<T>::compute_type;

// The loops of one element type and source, indexed by pairing.
template <class T, class Source>
struct LoopSlot {
  TokenLoop<T, compute_t<T>, Source> by_style[2];
};

struct DispatchTable : LoopSlot<float, SingleAxis<float>>,
                       LoopSlot<float, MultiAxis<float>>,
                       LoopSlot<double, SingleAxis<double>>,
                       LoopSlot<double, MultiAxis<double>>,
                       LoopSlot<BFloat16, SingleAxis<float>>,
                       LoopSlot<BFloat16, MultiAxis<float>>,
                       LoopSlot<Float16, SingleAxis<float>>,
                       LoopSlot<Float16, MultiAxis<float>> {
  const char* arch;  // the xsimd name of the architecture they were compiled for
};

// The installed table: one object in the whole program (an inline variable),
// constant-initialised to null before any code runs.
inline std::atomic<const DispatchTable*> installed_table{nullptr};

constexpr std::size_t style_index(Style s) noexcept { return s == Style::rotate_half ? 0 : 1; }

// The installed loop for this call, or null (run the compiled-in one).
template <Style S, class T, class Source>
TokenLoop<T, compute_t<T>, Source> installed_loop() noexcept {
  if constexpr (std::is_base_of<LoopSlot<T, Source>, DispatchTable>::value) {
    if (const DispatchTable* loops = installed_table.load(std::memory_order_acquire)) {
      return static_cast<const LoopSlot<T, Source>&>(*loops).by_style[style_index(S)];
    }
  }
  return nullptr;
}

// Runs the token loop of pairing `style`: the installed one if there is one
// for T and Source, else the one compiled here for Arch.
template <class Arch, class T, class Source>
void run_loop(Style style, const Pass<T>* passes, std::size_t count, const Source& source, std::size_t rotary_dim,
              const Options& options) {
  using C = compute_t<T>;
  // One run for both pairings and both origins of the loop: a pointer per
  // chunk costs nothing a token would notice, and each copy of run is
  // compiled code every user of the tensor API pays for.
  TokenLoop<T, C, Source> loop = nullptr;
  with_style(style, [&](auto s) {
    constexpr Style S = decltype(s)::value;
    loop = installed_loop<S, T, Source>();
    if (loop == nullptr) loop = &rotate_tokens<S, Arch, T, C, Source>;
  });
  run<T, C>(passes, count, source, rotary_dim, options, loop);
}

// The table of rotate_tokens compiled for Arch (rope::dispatch instantiates
// it once per instruction set, in a translation unit compiled for it).
template <class Arch, class T, class Source>
constexpr void fill_slot(LoopSlot<T, Source>& slot) noexcept {
  slot.by_style[style_index(Style::rotate_half)] = &rotate_tokens<Style::rotate_half, Arch, T, compute_t<T>, Source>;
  slot.by_style[style_index(Style::block_diagonal)] =
      &rotate_tokens<Style::block_diagonal, Arch, T, compute_t<T>, Source>;
}

template <class Arch>
constexpr DispatchTable make_dispatch_table() noexcept {
  DispatchTable table{};
  fill_slot<Arch, float, SingleAxis<float>>(table);
  fill_slot<Arch, float, MultiAxis<float>>(table);
  fill_slot<Arch, double, SingleAxis<double>>(table);
  fill_slot<Arch, double, MultiAxis<double>>(table);
  fill_slot<Arch, BFloat16, SingleAxis<float>>(table);
  fill_slot<Arch, BFloat16, MultiAxis<float>>(table);
  fill_slot<Arch, Float16, SingleAxis<float>>(table);
  fill_slot<Arch, Float16, MultiAxis<float>>(table);
  table.arch = Arch::name();
  return table;
}

}  // namespace rope::detail
