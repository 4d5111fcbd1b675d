// rope/style.hpp — the two channel pairings and the two directions.
//
// A head vector x of length d has a rotary part of r <= d channels (r even),
// split into r/2 pairs (a, b). Pair p is rotated by the angle m * theta_p:
//   y_a = x_a cos - x_b sin,   y_b = x_b cos + x_a sin.
// Which channels form pair p is the pairing:
//   rotate_half:    (p, p + r/2)  Hugging Face Llama / GPT-NeoX / Qwen / Mistral
//   block_diagonal: (2p, 2p + 1)  RoFormer's R_Theta,m, GPT-J, Meta's Llama, ggml
// The inverse direction rotates by -m * theta_p: it undoes the forward
// rotation and is the backward pass (a rotation's gradient is its inverse).
#pragma once

#include <cstddef>
#include <type_traits>

namespace rope {

enum class Style { rotate_half, block_diagonal };
enum class Direction { forward, inverse };

// Channel indices of pair p in a rotary part of rotary_dim channels.
template <Style S>
constexpr std::size_t first_channel(std::size_t p, std::size_t /*rotary_dim*/) noexcept {
  return S == Style::rotate_half ? p : 2 * p;
}
template <Style S>
constexpr std::size_t second_channel(std::size_t p, std::size_t rotary_dim) noexcept {
  return S == Style::rotate_half ? p + rotary_dim / 2 : 2 * p + 1;
}

// A Style as a type, for code templated on the pairing.
template <Style S>
using StyleConstant = std::integral_constant<Style, S>;

// Calls f(StyleConstant<S>{}) with S = s: the one place where a pairing
// chosen at run time becomes a template argument, so that each kernel is
// compiled once per pairing and the branch is taken once per call, not per row.
template <class F>
decltype(auto) with_style(Style s, F&& f) {
  if (s == Style::rotate_half) return f(StyleConstant<Style::rotate_half>{});
  return f(StyleConstant<Style::block_diagonal>{});
}

constexpr const char* name(Style s) noexcept { return s == Style::rotate_half ? "rotate_half" : "block_diagonal"; }
constexpr const char* name(Direction d) noexcept { return d == Direction::forward ? "forward" : "inverse"; }

}  // namespace rope
