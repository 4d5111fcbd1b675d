// rope/attention/rotation.hpp — how an attention call asks for RoPE
// (Rotation), checked once, and the one rotate-at-a-position of the module:
// Q, K, the cache writer and linear attention's features all go through it.
//
//   x -> R_m x:  pair p of the first rotary_dim channels rotated by m * theta_p,
//                the channels past rotary_dim unchanged
//
// A Rotation names a table and a pairing (rope::Style) together: the
// pairing is never defaulted, because a model with interleaved pairs
// rotated as rotate_half gives wrong logits and no error. A default
// Rotation rotates nothing.
#pragma once

#include <cstddef>
#include <cstring>

#include "../detail/fail.hpp"
#include "../kernels/rotate.hpp"
#include "../style.hpp"
#include "../table.hpp"
#include "../tensor/shared_checks.hpp"

namespace rope::attention {

// RoPE inside attention: which table, which pairing, how many channels
// (rotary_dim 0: the table's; the channels past it pass through).
//   Rotation<float>{}                                  no rotation
//   Rotation<float>{&table, rope::Style::rotate_half}  Llama, Qwen, Mistral
//   Rotation<float>{&table, model.style, 64}           from rope::hf, a partial rotary part
// A table set by hand on a default Rotation (r.table = &t) has no pairing
// and is refused by the call that reads it.
template <class T>
struct Rotation {
  const Table<T>* table = nullptr;
  Style style = Style::rotate_half;  // read only with a table given with it
  std::size_t rotary_dim = 0;

  Rotation() noexcept = default;
  Rotation(const Table<T>* t, Style s, std::size_t r = 0) noexcept : table(t), style(s), rotary_dim(r), styled_(true) {}

  // Whether the pairing was given with the table (the constructor).
  bool styled() const noexcept { return styled_; }

 private:
  bool styled_ = false;
};

namespace detail {

using rope::detail::fail;

// The rotary width a Rotation asks for (0: its table's), checked against the
// table and the rows it rotates; 0 without a table. Refused: a table
// without its pairing, a destroyed table, a width that is odd, wider than
// the table or than the rows.
template <class T>
std::size_t rotary_width(const char* fn, const char* name, const Rotation<T>& rotation, std::size_t head_dim) {
  if (rotation.table == nullptr) return 0;
  if (!rotation.styled()) {
    fail(fn, {name, ".style"}, "given with the table: Rotation{&table, style}, never defaulted", "not given");
  }
  if (!rotation.table->alive()) {
    fail(fn, {name, ".table"}, "a live rope::Table", "a table that was destroyed");
  }
  const std::string field = std::string(name) + ".rotary_dim";
  const std::size_t r = rope::detail::rotary_width(fn, field, rotation.rotary_dim, rotation.table->rotary_dim());
  if (r > head_dim) fail(fn, field, {"<= the head dimension ", head_dim}, r);
  return r;
}

// Rotates `heads` rows in place (row h at x + h * stride), the first
// rotary_dim channels, with one row of cos and sin (rotary_dim/2 values
// each): a table's row (rotate_at) or one gathered pair by pair from the
// rows of several positions (multi-axis positions).
template <class T, class Arch = xsimd::default_arch>
void rotate_with(Style style, std::size_t rotary_dim, const T* cos, const T* sin, T* x, std::ptrdiff_t stride,
                 std::size_t heads) noexcept {
  if (rotary_dim == 0) return;
  with_style(style, [&](auto s) {
    rotate_heads<decltype(s)::value, T, Arch>(x, stride, x, stride, heads, cos, sin, rotary_dim);
  });
}

// Rotates `heads` rows of d channels in place (row h at x + h * stride), all
// at position m, the first rotary_dim channels; the rest stay. out != x:
// rotates x into out and copies the channels past rotary_dim.
template <class T>
void rotate_at(const Rotation<T>& rotation, std::size_t rotary_dim, std::size_t m, const T* x, T* out,
               std::ptrdiff_t stride, std::size_t heads, std::size_t d) noexcept {
  if (out != x) {
    for (std::size_t h = 0; h < heads; ++h) {
      const auto o = static_cast<std::ptrdiff_t>(h) * stride;
      std::memcpy(out + o, x + o, d * sizeof(T));
    }
  }
  if (rotation.table == nullptr || rotary_dim == 0) return;
  rotate_with(rotation.style, rotary_dim, rotation.table->cos(m), rotation.table->sin(m), out, stride, heads);
}

}  // namespace detail
}  // namespace rope::attention
