// rope/tensor/view_checks.hpp — the checks every checked call makes on its
// views (the tensor API and the attention module).
//
// A view is valid when its rows do not overlap each other and its bytes stay
// inside the address range; an output is either the same view as an input
// (in place) or shares no element with any other view of the call.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>

#include "../detail/error.hpp"
#include "../view.hpp"

namespace rope::detail {

// "[tokens, heads, head_dim]" of a view, for messages.
template <class T>
std::string shape_text(const View<T>& v) {
  return "[" + to_text(v.tokens) + ", " + to_text(v.heads) + ", " + to_text(v.head_dim) + "]";
}

template <class T>
std::size_t span_elements(const View<T>& v) noexcept {
  if (v.tokens == 0 || v.heads == 0) return 0;
  return (v.tokens - 1) * v.token_stride + (v.heads - 1) * v.head_stride + v.head_dim;
}

// Whether a * b > limit, exactly, without a division: a 64-bit division is
// slow enough to be most of the cost of a decode step's checks.
inline bool product_above(std::size_t a, std::size_t b, std::size_t limit) noexcept {
#if defined(__GNUC__) || defined(__clang__)
  std::size_t product;
  return __builtin_mul_overflow(a, b, &product) || product > limit;
#else
  return b != 0 && a > limit / b;
#endif
}

// Shape and row layout of one view. Rows must not overlap: sorted by stride,
// each dimension must step past everything the smaller ones cover (the usual
// nested layouts; an interleaving of rows that happens not to collide is
// rejected too). A stride of 0 is allowed only where there is one row along it.
// The view's bytes must fit in half the address range (a pointer difference
// across it is defined): counted in bytes, not elements.
// The most bytes a view may span: a pointer difference must be representable.
constexpr std::size_t kMaxViewBytes = static_cast<std::size_t>(std::numeric_limits<std::ptrdiff_t>::max());

template <class T>
void check_view(const char* fn, const char* name, const View<T>& v) {
  if (v.data == nullptr) fail(fn, field(name, "data"), "non-null", nullptr);
  if (v.head_dim == 0) fail(fn, field(name, "head_dim"), "at least 1", v.head_dim);
  struct Dim {
    std::size_t count, stride;
    const char* name;
  };
  Dim dims[2] = {{v.heads, v.head_stride, "head_stride"}, {v.tokens, v.token_stride, "token_stride"}};
  if (dims[0].count > 1 && dims[1].count > 1 && dims[1].stride < dims[0].stride) std::swap(dims[0], dims[1]);
  std::size_t covered = v.head_dim;
  for (const Dim& d : dims) {
    if (d.count <= 1) continue;
    if (d.stride < covered) {
      fail(fn, field(name, d.name), ">= " + to_text(covered) + " (rows would overlap)", d.stride);
    }
    if (product_above(d.stride, d.count, kMaxViewBytes / sizeof(T))) {
      fail(fn, field(name, d.name), "small enough to stay inside the address range", d.stride);
    }
    covered += d.stride * (d.count - 1);
  }
  if (covered > kMaxViewBytes / sizeof(T)) {
    fail(fn, std::string(name) + "'s span of elements",
         "at most " + to_text(kMaxViewBytes / sizeof(T)) + " (its bytes inside the address range)", covered);
  }
}

template <class T>
bool same_view(const View<const T>& a, const View<const T>& b) noexcept {
  return a.data == b.data && a.tokens == b.tokens && a.heads == b.heads && a.head_dim == b.head_dim &&
         a.token_stride == b.token_stride && a.head_stride == b.head_stride;
}

// Whether no element belongs to both views (each already passed check_view).
// Disjoint address ranges settle most cases. Slices of one packed buffer
// interleave per token; when both views step tokens by the same stride and a
// token's rows fit in that stride, the rows of a token of one view can only
// meet those of the same or the previous token's slot of the other, so two
// sorted sweeps over the heads decide it.
template <class A, class B>
bool disjoint(const View<const A>& a, const View<const B>& b) noexcept {
  const std::size_t na = span_elements(a), nb = span_elements(b);
  if (na == 0 || nb == 0) return true;
  const auto a_lo = reinterpret_cast<std::uintptr_t>(a.data);
  const auto b_lo = reinterpret_cast<std::uintptr_t>(b.data);
  if (a_lo + na * sizeof(A) <= b_lo || b_lo + nb * sizeof(B) <= a_lo) return true;
  if (!std::is_same<A, B>::value) return false;
  const std::size_t ts = a.token_stride;
  if (ts == 0 || b.token_stride != ts) return false;
  const std::size_t a_token = (a.heads - 1) * a.head_stride + a.head_dim;
  const std::size_t b_token = (b.heads - 1) * b.head_stride + b.head_dim;
  if (a_token > ts || b_token > ts) return false;
  const std::uintptr_t gap = b_lo >= a_lo ? b_lo - a_lo : a_lo - b_lo;
  if (gap % sizeof(A) != 0) return false;
  const auto gap_elements = static_cast<std::size_t>(gap / sizeof(A)) % ts;
  // Offset of b's token slot relative to a's, reduced into [0, ts).
  const std::size_t r = (b_lo >= a_lo || gap_elements == 0) ? gap_elements : ts - gap_elements;
  for (const std::ptrdiff_t shift :
       {static_cast<std::ptrdiff_t>(r), static_cast<std::ptrdiff_t>(r) - static_cast<std::ptrdiff_t>(ts)}) {
    std::size_t i = 0, j = 0;
    while (i < a.heads && j < b.heads) {
      const auto a0 = static_cast<std::ptrdiff_t>(i * a.head_stride);
      const auto b0 = shift + static_cast<std::ptrdiff_t>(j * b.head_stride);
      if (a0 + static_cast<std::ptrdiff_t>(a.head_dim) <= b0) {
        ++i;
      } else if (b0 + static_cast<std::ptrdiff_t>(b.head_dim) <= a0) {
        ++j;
      } else {
        return false;
      }
    }
  }
  return true;
}

// An output view must share no element with another view of the same call.
template <class A, class B>
void check_disjoint(const char* fn, const char* out_name, const View<A>& out, const char* other_name,
                    const View<B>& other) {
  if (!disjoint(View<const std::remove_const_t<A>>(out.data, out.tokens, out.heads, out.head_dim, out.token_stride,
                                                   out.head_stride),
                View<const std::remove_const_t<B>>(other.data, other.tokens, other.heads, other.head_dim,
                                                   other.token_stride, other.head_stride))) {
    fail(fn, out_name, std::string("disjoint from ") + other_name, std::string("a view that overlaps ") + other_name);
  }
}

// One tensor to rotate, in -> out (out == in: in place).
template <class T>
struct Pass {
  View<const T> in;
  View<T> out;
};

// Every view checked alone, then every written view against every other
// view: the same view (in place) or no shared element.
template <class T>
void check_passes(const char* fn, const Pass<T>* passes, std::size_t count, const char* const* in_names,
                  const char* const* out_names) {
  for (std::size_t i = 0; i < count; ++i) {
    check_view(fn, in_names[i], passes[i].in);
    check_view(fn, out_names[i], passes[i].out);
    const View<const T> in = passes[i].in;
    const View<const T> out = passes[i].out;
    if (in.tokens != out.tokens || in.heads != out.heads || in.head_dim != out.head_dim) {
      fail(fn, std::string(out_names[i]) + "'s shape",
           "the shape of " + std::string(in_names[i]) + " " + shape_text(in), shape_text(out));
    }
  }
  for (std::size_t i = 0; i < count; ++i) {
    const View<const T> out = passes[i].out;
    for (std::size_t j = 0; j < count; ++j) {
      const View<const T> in = passes[j].in;
      if (i == j && same_view(in, out)) continue;
      if (!disjoint(out, in)) {
        fail(fn, out_names[i],
             i == j ? std::string(in_names[j]) + " itself (in place) or disjoint from it"
                    : std::string("disjoint from ") + in_names[j],
             std::string("a view that overlaps ") + in_names[j]);
      }
      if (j != i) check_disjoint(fn, out_names[i], out, out_names[j], passes[j].out);
    }
  }
}

}  // namespace rope::detail
