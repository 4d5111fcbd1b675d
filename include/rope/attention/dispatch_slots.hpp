// rope/attention/dispatch_slots.hpp — the slots through which rope::dispatch
// routes attention's decode loop (kernels/kv_decode.hpp, attend_keys), one
// per cache element type, beside the tensor API's table (tensor/
// dispatch_table.hpp) and filled by the same dispatch library.
//
// installed_attention points at the table rope::dispatch chose, or is null:
// then, as in a program without rope::dispatch, attend runs the loop
// compiled in the caller's own translation unit. attend reads the pointer
// once per work item; nothing changes per key. Kept on a floor of its own
// (kernels below it, nothing of the attention module's Eigen side), so
// that the dispatch library and the tensor API parse no attention code.
#pragma once

#include <atomic>
#include <cstdint>

#include "../half.hpp"
#include "../kernels/kv_decode.hpp"

namespace rope::detail {

template <class E>
using AttendKeys = void (*)(const KvKeys<E>&, const float*, float*, float*, float*, float*) noexcept;

// attend_keys compiled for one instruction set, per cache element type.
struct AttentionTable {
  AttendKeys<float> f32 = nullptr;
  AttendKeys<BFloat16> bf16 = nullptr;
  AttendKeys<Float16> f16 = nullptr;
  AttendKeys<std::int8_t> i8 = nullptr;
  AttendKeys<Float8E4M3> e4m3 = nullptr;
  AttendKeys<Float8E5M2> e5m2 = nullptr;
  const char* arch = nullptr;  // the xsimd name of the architecture they were compiled for

  template <class E>
  AttendKeys<E> get() const noexcept {
    if constexpr (std::is_same<E, float>::value) return f32;
    if constexpr (std::is_same<E, BFloat16>::value) return bf16;
    if constexpr (std::is_same<E, Float16>::value) return f16;
    if constexpr (std::is_same<E, std::int8_t>::value) return i8;
    if constexpr (std::is_same<E, Float8E4M3>::value) return e4m3;
    if constexpr (std::is_same<E, Float8E5M2>::value) return e5m2;
  }
};

// The installed table: one object in the whole program (an inline variable),
// constant-initialised to null before any code runs.
inline std::atomic<const AttentionTable*> installed_attention{nullptr};

// The installed attend_keys for E, or null (run the compiled-in one).
template <class E>
AttendKeys<E> installed_attend() noexcept {
  const AttentionTable* table = installed_attention.load(std::memory_order_acquire);
  return table != nullptr ? table->get<E>() : nullptr;
}

// The table of attend_keys compiled for Arch (rope::dispatch instantiates it
// once per instruction set, in a translation unit compiled for it).
template <class Arch>
constexpr AttentionTable make_attention_table() noexcept {
  AttentionTable table{};
  table.f32 = &attend_keys<float, Arch>;
  table.bf16 = &attend_keys<BFloat16, Arch>;
  table.f16 = &attend_keys<Float16, Arch>;
  table.i8 = &attend_keys<std::int8_t, Arch>;
  table.e4m3 = &attend_keys<Float8E4M3, Arch>;
  table.e5m2 = &attend_keys<Float8E5M2, Arch>;
  table.arch = Arch::name();
  return table;
}

}  // namespace rope::detail
