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

#include "../detail/fail.hpp"
#include "../detail/inline.hpp"
#include "../view.hpp"

namespace rope::detail {

// A view's layout whatever its element type: what the checks read. Strides
// in elements of `element` bytes. The checks take extents, so their code is
// compiled once per translation unit rather than once per element type.
struct Extent {
  std::uintptr_t data;
  std::size_t tokens, heads, head_dim, token_stride, head_stride;
  std::size_t element;  // bytes
};

template <class T>
ROPE_ALWAYS_INLINE Extent extent(const View<T>& v) noexcept {
  return {reinterpret_cast<std::uintptr_t>(v.data),
          v.tokens,
          v.heads,
          v.head_dim,
          v.token_stride,
          v.head_stride,
          sizeof(T)};
}

// "[tokens, heads, head_dim]" of a view, for messages.
ROPE_COLD inline std::string shape_text(const Extent& v) {
  return join({"[", v.tokens, ", ", v.heads, ", ", v.head_dim, "]"});
}

// The value of an overlap error: "a view that overlaps <name>".
ROPE_COLD inline std::string overlaps(const char* name) { return join({"a view that overlaps ", name}); }

inline std::size_t span_elements(const Extent& v) noexcept {
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

// The most bytes a view may span: a pointer difference must be representable.
constexpr std::size_t kMaxViewBytes = static_cast<std::size_t>(std::numeric_limits<std::ptrdiff_t>::max());

// Shape and row layout of one view. Rows must not overlap: sorted by stride,
// each dimension must step past everything the smaller ones cover (the usual
// nested layouts; an interleaving of rows that happens not to collide is
// rejected too). A stride of 0 is allowed only where there is one row along it.
// The view's bytes must fit in half the address range (a pointer difference
// across it is defined): counted in bytes, not elements.
inline void check_view(const char* fn, const char* name, const Extent& v) {
  if (v.data == 0) fail(fn, {name, ".data"}, "non-null", nullptr);
  if (v.head_dim == 0) fail(fn, {name, ".head_dim"}, "at least 1", v.head_dim);
  struct Dim {
    std::size_t count, stride;
    const char* name;
  };
  Dim dims[2] = {{v.heads, v.head_stride, "head_stride"}, {v.tokens, v.token_stride, "token_stride"}};
  if (dims[0].count > 1 && dims[1].count > 1 && dims[1].stride < dims[0].stride) std::swap(dims[0], dims[1]);
  const std::size_t max_elements = kMaxViewBytes / v.element;
  std::size_t covered = v.head_dim;
  for (const Dim& d : dims) {
    if (d.count <= 1) continue;
    if (d.stride < covered) fail(fn, {name, ".", d.name}, {">= ", covered, " (rows would overlap)"}, d.stride);
    if (product_above(d.stride, d.count, max_elements)) {
      fail(fn, {name, ".", d.name}, "small enough to stay inside the address range", d.stride);
    }
    covered += d.stride * (d.count - 1);
  }
  if (covered > max_elements) {
    fail(fn, {name, "'s span of elements"}, {"at most ", max_elements, " (its bytes inside the address range)"},
         covered);
  }
}
template <class T>
void check_view(const char* fn, const char* name, const View<T>& v) {
  check_view(fn, name, extent(v));
}

inline bool same_view(const Extent& a, const Extent& b) noexcept {
  return a.data == b.data && a.tokens == b.tokens && a.heads == b.heads && a.head_dim == b.head_dim &&
         a.token_stride == b.token_stride && a.head_stride == b.head_stride && a.element == b.element;
}

// Whether no element belongs to both views (each already passed check_view).
// Disjoint address ranges settle most cases. Slices of one packed buffer
// interleave per token; when both views have elements of one size, step
// tokens by the same stride and a token's rows fit in that stride, the rows
// of a token of one view can only meet those of the same or the previous
// token's slot of the other, so two sorted sweeps over the heads decide it.
inline bool disjoint(const Extent& a, const Extent& b) noexcept {
  const std::size_t na = span_elements(a), nb = span_elements(b);
  if (na == 0 || nb == 0) return true;
  const std::uintptr_t a_lo = a.data, b_lo = b.data;
  if (a_lo + na * a.element <= b_lo || b_lo + nb * b.element <= a_lo) return true;
  if (a.element != b.element) return false;
  const std::size_t ts = a.token_stride;
  if (ts == 0 || b.token_stride != ts) return false;
  const std::size_t a_token = (a.heads - 1) * a.head_stride + a.head_dim;
  const std::size_t b_token = (b.heads - 1) * b.head_stride + b.head_dim;
  if (a_token > ts || b_token > ts) return false;
  const std::uintptr_t gap = b_lo >= a_lo ? b_lo - a_lo : a_lo - b_lo;
  if (gap % a.element != 0) return false;
  const auto gap_elements = static_cast<std::size_t>(gap / a.element) % ts;
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
inline void check_disjoint(const char* fn, const char* out_name, const Extent& out, const char* other_name,
                           const Extent& other) {
  if (!disjoint(out, other)) fail(fn, out_name, {"disjoint from ", other_name}, overlaps(other_name));
}
template <class A, class B>
void check_disjoint(const char* fn, const char* out_name, const View<A>& out, const char* other_name,
                    const View<B>& other) {
  check_disjoint(fn, out_name, extent(out), other_name, extent(other));
}

// One tensor to rotate, in -> out (out == in: in place).
template <class T>
struct Pass {
  View<const T> in;
  View<T> out;
};

// Every view checked alone, then every written view against every other
// view: the same view (in place) or no shared element. view(passes, i, out)
// is the extent of pass i's input or output.
using PassExtent = Extent (*)(const void* passes, std::size_t i, bool out) noexcept;
inline void check_passes(const char* fn, const void* passes, PassExtent view, std::size_t count,
                         const char* const* in_names, const char* const* out_names) {
  for (std::size_t i = 0; i < count; ++i) {
    const Extent in = view(passes, i, false), out = view(passes, i, true);
    check_view(fn, in_names[i], in);
    check_view(fn, out_names[i], out);
    if (in.tokens != out.tokens || in.heads != out.heads || in.head_dim != out.head_dim) {
      fail(fn, {out_names[i], "'s shape"}, {"the shape of ", in_names[i], " ", shape_text(in)}, shape_text(out));
    }
  }
  for (std::size_t i = 0; i < count; ++i) {
    const Extent out = view(passes, i, true);
    for (std::size_t j = 0; j < count; ++j) {
      const Extent in = view(passes, j, false);
      if (i == j && same_view(in, out)) continue;
      if (!disjoint(out, in)) {
        if (i == j)
          fail(fn, out_names[i], {in_names[j], " itself (in place) or disjoint from it"}, overlaps(in_names[j]));
        fail(fn, out_names[i], {"disjoint from ", in_names[j]}, overlaps(in_names[j]));
      }
      if (j != i) check_disjoint(fn, out_names[i], out, out_names[j], view(passes, j, true));
    }
  }
}
template <class T>
void check_passes(const char* fn, const Pass<T>* passes, std::size_t count, const char* const* in_names,
                  const char* const* out_names) {
  const PassExtent view = [](const void* p, std::size_t i, bool out) noexcept {
    const Pass<T>& pass = static_cast<const Pass<T>*>(p)[i];
    return out ? extent(pass.out) : extent(pass.in);
  };
  check_passes(fn, passes, view, count, in_names, out_names);
}

}  // namespace rope::detail
