// rope/apply.hpp — the tensor API: rotate whole Q/K tensors, checked.
//
// Every head vector of token t is rotated by its position m(t):
//   y_a = x_a cos(m theta_p) - x_b sin(m theta_p),  y_b = x_b cos + x_a sin
// for the pairs (a, b) of the pairing, over the first rotary_dim channels;
// the rest pass through (copied when the output is another tensor).
//
// Layout: a View<T> is a strided [tokens, heads, head_dim] tensor. The
// head_dim channels of one head vector are contiguous; token_stride and
// head_stride are in elements, so [tokens, heads, head_dim],
// [heads, tokens, head_dim] and slices of a packed QKV buffer are all views.
// Positions are one std::int64_t per token (packed variable-length batches
// need nothing else) or a starting offset for contiguous positions. Multi-axis
// positions (M-RoPE, 2-D axial) are axis-major: positions[axis * tokens + t].
//
// Element types: float and double compute as themselves (Table<float> and
// Table<double>); 16-bit storage (rope::BFloat16, rope::Float16, or another
// 2-byte type with explicit float conversions such as Eigen::bfloat16) is
// widened to float, rotated with a Table<float> and rounded once on store.
//
// Every argument is checked before anything is written: a call that throws
// leaves every output byte as it was. std::invalid_argument for bad shapes,
// strides or options, std::out_of_range for positions.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "detail/stream.hpp"
#include "frequencies.hpp"
#include "half.hpp"
#include "kernels.hpp"
#include "style.hpp"
#include "table.hpp"

namespace rope {

// A strided [tokens, heads, head_dim] tensor; the head_dim channels of a head
// vector are contiguous. Strides are in elements.
template <class T>
struct View {
  T* data = nullptr;
  std::size_t tokens = 0;
  std::size_t heads = 0;
  std::size_t head_dim = 0;
  std::size_t token_stride = 0;
  std::size_t head_stride = 0;

  constexpr View() noexcept = default;
  constexpr View(T* data_, std::size_t tokens_, std::size_t heads_, std::size_t head_dim_,
                 std::size_t token_stride_, std::size_t head_stride_) noexcept
      : data(data_),
        tokens(tokens_),
        heads(heads_),
        head_dim(head_dim_),
        token_stride(token_stride_),
        head_stride(head_stride_) {}
  // A read-only view of a writable one.
  template <class U, std::enable_if_t<std::is_same<const U, T>::value && !std::is_same<U, T>::value, int> = 0>
  constexpr View(const View<U>& v) noexcept  // NOLINT: implicit on purpose, like T* -> const T*
      : View(v.data, v.tokens, v.heads, v.head_dim, v.token_stride, v.head_stride) {}

  // Memory laid out as [tokens, heads, head_dim] (what a Q/K projection writes).
  static constexpr View token_major(T* data, std::size_t tokens, std::size_t heads,
                                    std::size_t head_dim) noexcept {
    return View(data, tokens, heads, head_dim, heads * head_dim, head_dim);
  }
  // Memory laid out as [heads, tokens, head_dim] (after a transpose to heads first).
  static constexpr View head_major(T* data, std::size_t tokens, std::size_t heads,
                                   std::size_t head_dim) noexcept {
    return View(data, tokens, heads, head_dim, head_dim, tokens * head_dim);
  }
  // Heads first_head .. first_head+heads-1 of a [tokens, total_heads, head_dim]
  // buffer, e.g. the K part of a fused QKV projection.
  static constexpr View packed(T* base, std::size_t tokens, std::size_t total_heads,
                               std::size_t first_head, std::size_t heads, std::size_t head_dim) noexcept {
    return View(base + first_head * head_dim, tokens, heads, head_dim, total_heads * head_dim, head_dim);
  }

  T* row(std::size_t t, std::size_t h) const noexcept { return data + t * token_stride + h * head_stride; }
};

// The Q, K and V views of a fused projection output [tokens, q_heads + 2 *
// kv_heads, head_dim] (Q heads, then K heads, then V heads per token).
template <class T>
struct QkvViews {
  View<T> q, k, v;
};
template <class T>
constexpr QkvViews<T> split_qkv(T* qkv, std::size_t tokens, std::size_t q_heads, std::size_t kv_heads,
                                std::size_t head_dim) noexcept {
  const std::size_t total = q_heads + 2 * kv_heads;
  return {View<T>::packed(qkv, tokens, total, 0, q_heads, head_dim),
          View<T>::packed(qkv, tokens, total, q_heads, kv_heads, head_dim),
          View<T>::packed(qkv, tokens, total, q_heads + kv_heads, kv_heads, head_dim)};
}

// How an out-of-place call writes its output. Streaming stores skip the read
// a plain store of an uncached line costs, and leave the output out of cache.
enum class Stores { automatic, cached, streaming };

struct Options {
  std::size_t rotary_dim = 0;  // 0: the table's; otherwise its first rotary_dim/2 pairs
  Direction direction = Direction::forward;
  std::size_t threads = 1;  // tokens split across this many threads; 1 starts none
  Stores stores = Stores::automatic;
};

// M-RoPE: which pairs of the rotary part follow which axis of (t, h, w).
//   chunked:     pairs [0, s0) follow t, [s0, s0+s1) h, the rest w (Qwen2-VL);
//   interleaved: pair p follows h if p % 3 == 1 and p / 3 < s1, w if
//                p % 3 == 2 and p / 3 < s2, t otherwise (Qwen3-VL).
// s0 + s1 + s2 must equal rotary_dim / 2.
enum class SectionOrder { chunked, interleaved };
struct MropeSections {
  std::array<std::size_t, 3> pairs{};
  SectionOrder order = SectionOrder::chunked;
};

// Frequencies for 2-D axial RoPE: the first rotary_dim/4 pairs follow the
// row, the last rotary_dim/4 the column, each with the schedule of a
// rotary_dim/2-channel RoPE: theta_p = base^(-2p / (rotary_dim/2)).
inline Frequencies axial_frequencies(std::size_t rotary_dim, double base = 10000.0) {
  if (rotary_dim == 0 || rotary_dim % 4 != 0) {
    throw std::invalid_argument("rope::axial_frequencies: rotary_dim must be a positive multiple of 4, got " +
                                std::to_string(rotary_dim));
  }
  Frequencies half = frequencies(rotary_dim / 2, base);
  Frequencies f;
  f.inv_freq = half.inv_freq;
  f.inv_freq.insert(f.inv_freq.end(), half.inv_freq.begin(), half.inv_freq.end());
  f.attention_factor = half.attention_factor;
  return f;
}

namespace detail {

template <class T>
struct TypeIdentity {
  using type = T;
};
template <class T>
using type_identity_t = typename TypeIdentity<T>::type;

template <class T, class U>
constexpr void check_types() noexcept {
  static_assert(!std::is_const<T>::value, "rope::apply: the output view must be writable");
  static_assert(Storage<T>::kSupported,
                "rope::apply: T must be float, double, rope::BFloat16, rope::Float16 or a 2-byte type "
                "with explicit float conversions");
  static_assert(std::is_same<typename Storage<T>::compute_type, U>::value,
                "rope::apply: use a Table<float> for float and 16-bit tensors, a Table<double> for double");
}

[[noreturn]] inline void fail(const char* fn, const std::string& what) {
  throw std::invalid_argument(std::string(fn) + ": " + what);
}

// One tensor to rotate, in -> out (out == in: in place).
template <class T>
struct Pass {
  View<const T> in;
  View<T> out;
};

template <class T>
std::size_t span_elements(const View<T>& v) noexcept {
  if (v.tokens == 0 || v.heads == 0) return 0;
  return (v.tokens - 1) * v.token_stride + (v.heads - 1) * v.head_stride + v.head_dim;
}

// Shape and row layout of one view. Rows must not overlap: sorted by stride,
// each dimension must step past everything the smaller ones cover (the usual
// nested layouts; an interleaving of rows that happens not to collide is
// rejected too).
template <class T>
void check_view(const char* fn, const char* name, const View<T>& v, std::size_t rotary_dim) {
  // Messages are built only on failure: decode calls are a few hundred ns.
  if (v.data == nullptr) fail(fn, std::string(name) + ".data is null");
  if (v.head_dim == 0) fail(fn, std::string(name) + ".head_dim is 0");
  if (rotary_dim > v.head_dim) {
    fail(fn, "rotary_dim " + std::to_string(rotary_dim) + " exceeds " + name + ".head_dim " +
                 std::to_string(v.head_dim));
  }
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
      fail(fn, std::string(name) + "." + d.name + " " + std::to_string(d.stride) + " makes rows overlap (needs >= " +
                   std::to_string(covered) + ")");
    }
    if (d.stride > std::numeric_limits<std::size_t>::max() / 2 / d.count) {
      fail(fn, std::string(name) + "." + d.name + " " + std::to_string(d.stride) + " overflows the address range");
    }
    covered += d.stride * (d.count - 1);
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
template <class T>
bool disjoint(const View<const T>& a, const View<const T>& b) noexcept {
  const std::size_t na = span_elements(a), nb = span_elements(b);
  if (na == 0 || nb == 0) return true;
  const auto a_lo = reinterpret_cast<std::uintptr_t>(a.data);
  const auto b_lo = reinterpret_cast<std::uintptr_t>(b.data);
  if (a_lo + na * sizeof(T) <= b_lo || b_lo + nb * sizeof(T) <= a_lo) return true;
  const std::size_t ts = a.token_stride;
  if (ts == 0 || b.token_stride != ts) return false;
  const std::size_t a_token = (a.heads - 1) * a.head_stride + a.head_dim;
  const std::size_t b_token = (b.heads - 1) * b.head_stride + b.head_dim;
  if (a_token > ts || b_token > ts) return false;
  const std::uintptr_t gap = b_lo >= a_lo ? b_lo - a_lo : a_lo - b_lo;
  if (gap % sizeof(T) != 0) return false;
  const auto gap_elements = static_cast<std::size_t>(gap / sizeof(T)) % ts;
  // Offset of b's token slot relative to a's, reduced into [0, ts).
  const std::size_t r = (b_lo >= a_lo || gap_elements == 0) ? gap_elements : ts - gap_elements;
  for (const std::ptrdiff_t shift : {static_cast<std::ptrdiff_t>(r), static_cast<std::ptrdiff_t>(r) -
                                                                          static_cast<std::ptrdiff_t>(ts)}) {
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

inline std::size_t resolve_rotary_dim(const char* fn, const Options& o, std::size_t table_rotary_dim) {
  const std::size_t r = o.rotary_dim == 0 ? table_rotary_dim : o.rotary_dim;
  if (r % 2 != 0) fail(fn, "options.rotary_dim must be even, got " + std::to_string(r));
  if (r > table_rotary_dim) {
    fail(fn, "options.rotary_dim " + std::to_string(r) + " exceeds the table's rotary_dim " +
                 std::to_string(table_rotary_dim));
  }
  if (o.threads == 0) fail(fn, "options.threads must be at least 1, got 0");
  return r;
}

// Every view checked alone, then every written view against every other
// view: the same view (in place) or no shared element.
template <class T>
void check_passes(const char* fn, const Pass<T>* passes, std::size_t count, const char* const* in_names,
                  const char* const* out_names, std::size_t rotary_dim) {
  for (std::size_t i = 0; i < count; ++i) {
    check_view(fn, in_names[i], passes[i].in, rotary_dim);
    check_view(fn, out_names[i], passes[i].out, rotary_dim);
    const View<const T> in = passes[i].in;
    const View<const T> out = passes[i].out;
    if (in.tokens != out.tokens || in.heads != out.heads || in.head_dim != out.head_dim) {
      fail(fn, std::string(out_names[i]) + " is [" + std::to_string(out.tokens) + ", " + std::to_string(out.heads) +
                   ", " + std::to_string(out.head_dim) + "] but " + in_names[i] + " is [" +
                   std::to_string(in.tokens) + ", " + std::to_string(in.heads) + ", " +
                   std::to_string(in.head_dim) + "]");
    }
  }
  for (std::size_t i = 0; i < count; ++i) {
    const View<const T> out = passes[i].out;
    for (std::size_t j = 0; j < count; ++j) {
      const View<const T> in = passes[j].in;
      if (i == j && same_view(in, out)) continue;
      if (!disjoint(out, in)) {
        fail(fn, std::string(out_names[i]) + " overlaps " + in_names[j] +
                     (i == j ? " without being the same view (in place)" : ""));
      }
      if (j != i && !disjoint(out, View<const T>(passes[j].out))) {
        fail(fn, std::string(out_names[i]) + " overlaps " + out_names[j]);
      }
    }
  }
}

// Positions of the tokens: one id each, or offset + t.
struct TokenPositions {
  bool by_id;
  const std::int64_t* ids;
  std::int64_t offset;
  std::int64_t at(std::size_t t) const noexcept {
    return by_id ? ids[t] : offset + static_cast<std::int64_t>(t);
  }
};

[[noreturn]] inline void position_outside(const char* fn, const std::string& which, std::size_t token,
                                          std::int64_t position, std::size_t table_positions) {
  throw std::out_of_range(std::string(fn) + ": " + which + " of token index " + std::to_string(token) + " is " +
                          std::to_string(position) +
                          (position < 0 ? ", negative"
                                        : ", outside the table's positions [0, " + std::to_string(table_positions) +
                                              ")"));
}

inline void check_positions(const char* fn, const TokenPositions& p, std::size_t tokens,
                            std::size_t table_positions) {
  if (tokens == 0) return;
  if (!p.by_id) {
    if (p.offset < 0) position_outside(fn, "offset position", 0, p.offset, table_positions);
    const auto last = static_cast<std::uint64_t>(p.offset) + (tokens - 1);
    if (last >= table_positions) {
      position_outside(fn, "offset position", tokens - 1,
                       last > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())
                           ? std::numeric_limits<std::int64_t>::max()
                           : static_cast<std::int64_t>(last),
                       table_positions);
    }
    return;
  }
  for (std::size_t t = 0; t < tokens; ++t) {
    const std::int64_t m = p.ids[t];
    if (m < 0 || static_cast<std::uint64_t>(m) >= table_positions) {
      position_outside(fn, "position", t, m, table_positions);
    }
  }
}

// cos/sin of one token straight from the table.
template <class C>
struct SingleAxis {
  const Table<C>* table;
  TokenPositions positions;
  void row(std::size_t t, C*, const C*& cos, const C*& sin) const noexcept {
    const auto m = static_cast<std::size_t>(positions.at(t));
    cos = table->cos(m);
    sin = table->sin(m);
  }
};

// cos/sin of one token gathered pair by pair from the rows of its per-axis
// positions: pair p at angle positions[axis(p)] * theta_p.
template <class C>
struct MultiAxis {
  const Table<C>* table;
  const std::int64_t* positions;  // [axes, tokens]
  std::size_t tokens;
  const std::uint8_t* axis_of_pair;  // rotary_dim/2 values
  std::size_t pairs;
  void row(std::size_t t, C* scratch, const C*& cos, const C*& sin) const noexcept {
    C* c = scratch;
    C* s = scratch + pairs;
    for (std::size_t p = 0; p < pairs; ++p) {
      const auto m = static_cast<std::size_t>(positions[axis_of_pair[p] * tokens + t]);
      c[p] = table->cos(m)[p];
      s[p] = table->sin(m)[p];
    }
    cos = c;
    sin = s;
  }
};

// Rotates `heads` head vectors of one token (out == in: in place), head h at
// in + h * in_stride and out + h * out_stride. One rotate_heads call
// prepares the row's cos/sin once for all heads. A 16-bit tensor goes
// through compute (heads * rotary_dim values of C, private to the calling
// thread): widened exactly, rotated in C, rounded once on the way out.
template <Style S, class T, class C>
inline void rotate_token_heads(const T* in, std::ptrdiff_t in_stride, T* out, std::ptrdiff_t out_stride,
                               std::size_t heads, std::size_t head_dim, const C* cos, const C* sin,
                               std::size_t rotary_dim, Direction dir, C* compute) noexcept {
  if constexpr (!Storage<T>::kWidened) {
    (void)compute;
    rotate_heads<S, T>(in, in_stride, out, out_stride, heads, cos, sin, rotary_dim, dir);
  } else {
    const auto r = static_cast<std::ptrdiff_t>(rotary_dim);
    for (std::size_t h = 0; h < heads; ++h) {
      Storage<T>::widen(in + static_cast<std::ptrdiff_t>(h) * in_stride, compute + static_cast<std::ptrdiff_t>(h) * r,
                        rotary_dim);
    }
    rotate_heads<S, C>(compute, r, compute, r, heads, cos, sin, rotary_dim, dir);
    for (std::size_t h = 0; h < heads; ++h) {
      Storage<T>::narrow(compute + static_cast<std::ptrdiff_t>(h) * r,
                         out + static_cast<std::ptrdiff_t>(h) * out_stride, rotary_dim);
    }
  }
  if (out != in && head_dim != rotary_dim) {
    for (std::size_t h = 0; h < heads; ++h) {
      std::memcpy(out + static_cast<std::ptrdiff_t>(h) * out_stride + rotary_dim,
                  in + static_cast<std::ptrdiff_t>(h) * in_stride + rotary_dim, (head_dim - rotary_dim) * sizeof(T));
    }
  }
}

// Asks for the next token's rows while this token is rotated, so that their
// loads are already in flight: the row kernel alone keeps too few misses
// outstanding to reach memory bandwidth.
inline void prefetch(const void* p, std::size_t bytes) noexcept {
#if defined(__GNUC__)
  const auto* c = static_cast<const char*>(p);
  for (std::size_t i = 0; i < bytes; i += 64) __builtin_prefetch(c + i, 0, 3);
#else
  (void)p;
  (void)bytes;
#endif
}

// Tokens begin .. end-1 of every pass. With stream set, an out-of-place
// pass is rotated into the staging buffer and streamed to its output: a
// token's heads at once when they are contiguous, so that the streaming
// stores cover whole cache lines and only the ragged ends of a token's
// block go through the cache.
template <Style S, class T, class C, class Source>
void rotate_tokens(const Pass<T>* passes, std::size_t count, const Source& source, std::size_t rotary_dim,
                   Direction dir, bool stream, std::size_t begin, std::size_t end, C* scratch,
                   T* staging) noexcept {
  C* compute = scratch + rotary_dim;  // after the gathered cos/sin of MultiAxis
  for (std::size_t t = begin; t < end; ++t) {
    const C* cos;
    const C* sin;
    source.row(t, scratch, cos, sin);
    for (std::size_t i = 0; i < count; ++i) {
      const Pass<T>& p = passes[i];
      const std::size_t d = p.in.head_dim;
      if (t + 1 < end) {
        for (std::size_t h = 0; h < p.in.heads; ++h) prefetch(p.in.row(t + 1, h), d * sizeof(T));
      }
      const auto in_stride = static_cast<std::ptrdiff_t>(p.in.head_stride);
      if (!stream || p.out.data == p.in.data) {
        rotate_token_heads<S>(p.in.row(t, 0), in_stride, p.out.row(t, 0),
                              static_cast<std::ptrdiff_t>(p.out.head_stride), p.in.heads, d, cos, sin, rotary_dim,
                              dir, compute);
      } else if (p.out.head_stride == d) {
        rotate_token_heads<S>(p.in.row(t, 0), in_stride, staging, static_cast<std::ptrdiff_t>(d), p.in.heads, d, cos,
                              sin, rotary_dim, dir, compute);
        stream_copy(p.out.row(t, 0), staging, p.in.heads * d * sizeof(T));
      } else {
        for (std::size_t h = 0; h < p.in.heads; ++h) {
          rotate_token_heads<S>(p.in.row(t, h), 0, staging, 0, 1, d, cos, sin, rotary_dim, dir, compute);
          stream_copy(p.out.row(t, h), staging, d * sizeof(T));
        }
      }
    }
  }
  if (stream) stream_fence();
}

// Streaming pays off once the output is far beyond what the caches keep;
// below that the output is better left in cache for the attention that
// reads it next.
constexpr std::size_t kStreamingBytes = std::size_t(64) << 20;

// Splits tokens into `threads` contiguous chunks, chunk i on worker i; the
// caller runs chunk 0, so threads = 1 starts no thread. Each row is computed
// the same way whichever worker takes it, so results do not depend on the
// thread count. Everything that can fail is done before the first write: the
// workspaces are allocated here, and a thread that cannot be started has its
// chunk run by the caller instead.
template <Style S, class T, class C, class Source>
void run(const Pass<T>* passes, std::size_t count, const Source& source, std::size_t rotary_dim,
         const Options& options) {
  const std::size_t tokens = passes[0].in.tokens;
  std::size_t token_block = 0;  // the most elements a pass has per token
  std::size_t written = 0;
  bool out_of_place = false;
  for (std::size_t i = 0; i < count; ++i) {
    token_block = std::max(token_block, passes[i].in.heads * passes[i].in.head_dim);
    written += passes[i].in.tokens * passes[i].in.heads * passes[i].in.head_dim * sizeof(T);
    out_of_place = out_of_place || passes[i].out.data != passes[i].in.data;
  }
  if (tokens == 0) return;
  bool stream = false;
  if (out_of_place) {
    stream = options.stores == Stores::streaming ||
             (options.stores == Stores::automatic && written >= kStreamingBytes);
  }
  const std::size_t workers = std::min(options.threads, tokens);
  // Gathered cos/sin rows (multi-axis), then the widened heads of a token.
  const std::size_t scratch_size = rotary_dim + (Storage<T>::kWidened ? token_block : 0);
  // A decode step's workspace fits on the stack; a heap allocation would be
  // a good part of its time.
  constexpr std::size_t kStackScratch = 4608;
  C stack_scratch[kStackScratch];
  std::vector<C> heap_scratch(workers * scratch_size > kStackScratch ? workers * scratch_size : 0);
  C* const scratch = heap_scratch.empty() ? stack_scratch : heap_scratch.data();
  std::vector<T> staging(stream ? workers * token_block : 0);
  auto chunk = [&](std::size_t w) noexcept {
    rotate_tokens<S, T, C>(passes, count, source, rotary_dim, options.direction, stream, tokens * w / workers,
                           tokens * (w + 1) / workers, scratch + w * scratch_size,
                           stream ? staging.data() + w * token_block : nullptr);
  };
  if (workers == 1) {
    chunk(0);
    return;
  }
  std::vector<std::thread> pool;
  pool.reserve(workers - 1);
  std::size_t started = 1;
  for (; started < workers; ++started) {
    try {
      pool.emplace_back(chunk, started);
    } catch (...) {
      break;
    }
  }
  for (std::size_t w = started; w < workers; ++w) chunk(w);
  chunk(0);
  for (auto& th : pool) th.join();
}

template <class T, class C, class Source>
void dispatch(Style style, const Pass<T>* passes, std::size_t count, const Source& source, std::size_t rotary_dim,
              const Options& options) {
  if (style == Style::rotate_half) {
    run<Style::rotate_half, T, C>(passes, count, source, rotary_dim, options);
  } else {
    run<Style::block_diagonal, T, C>(passes, count, source, rotary_dim, options);
  }
}

template <class T, class U>
void apply_positions(const char* fn, const Pass<T>* passes, std::size_t count, const char* const* in_names,
                     const char* const* out_names, const Table<U>& table, Style style, TokenPositions positions,
                     const Options& options) {
  check_types<T, U>();
  const std::size_t rotary_dim = resolve_rotary_dim(fn, options, table.rotary_dim());
  check_passes(fn, passes, count, in_names, out_names, rotary_dim);
  if (positions.by_id && positions.ids == nullptr) fail(fn, "positions is null");
  check_positions(fn, positions, passes[0].in.tokens, table.positions());
  dispatch<T, U>(style, passes, count, SingleAxis<U>{&table, positions}, rotary_dim, options);
}

inline TokenPositions from_ids(const std::int64_t* ids) noexcept { return TokenPositions{true, ids, 0}; }
template <class I>
TokenPositions from_offset(I offset) noexcept {
  return TokenPositions{false, nullptr, static_cast<std::int64_t>(offset)};
}

template <class T, class U>
void apply_qk_positions(const View<const T>& q_in, const View<const T>& k_in, const View<T>& q_out,
                        const View<T>& k_out, const Table<U>& table, Style style, TokenPositions positions,
                        const Options& options, bool in_place) {
  const char* fn = "rope::apply_qk";
  if (q_in.tokens != k_in.tokens) {
    fail(fn, "q has " + std::to_string(q_in.tokens) + " tokens but k has " + std::to_string(k_in.tokens));
  }
  if (k_in.heads == 0 || q_in.heads % k_in.heads != 0) {
    fail(fn, "q.heads " + std::to_string(q_in.heads) + " is not a multiple of k.heads " +
                 std::to_string(k_in.heads));
  }
  const Pass<T> passes[2] = {{q_in, q_out}, {k_in, k_out}};
  static const char* const kIn[2] = {"q", "k"};
  static const char* const kOut[2] = {"q_out", "k_out"};
  apply_positions(fn, passes, 2, kIn, in_place ? kIn : kOut, table, style, positions, options);
}

// Which axis each pair follows, checked against the sections.
inline std::vector<std::uint8_t> mrope_axes(const char* fn, const MropeSections& sections, std::size_t pairs) {
  const auto& s = sections.pairs;
  const std::string listed =
      "(" + std::to_string(s[0]) + ", " + std::to_string(s[1]) + ", " + std::to_string(s[2]) + ")";
  if (s[0] + s[1] + s[2] != pairs) {
    fail(fn, "sections " + listed + " sum to " + std::to_string(s[0] + s[1] + s[2]) +
                 ", expected rotary_dim/2 = " + std::to_string(pairs));
  }
  std::vector<std::uint8_t> axis(pairs, 0);
  std::array<std::size_t, 3> counted{};
  for (std::size_t p = 0; p < pairs; ++p) {
    if (sections.order == SectionOrder::chunked) {
      axis[p] = p < s[0] ? 0 : (p < s[0] + s[1] ? 1 : 2);
    } else if (p % 3 == 1 && p / 3 < s[1]) {
      axis[p] = 1;
    } else if (p % 3 == 2 && p / 3 < s[2]) {
      axis[p] = 2;
    }
    ++counted[axis[p]];
  }
  if (counted != s) {
    fail(fn, "sections " + listed + " cannot be interleaved over " + std::to_string(pairs) + " pairs");
  }
  return axis;
}

template <class T, class U>
void apply_axes(const char* fn, const View<T>& x, const Table<U>& table, Style style, const std::int64_t* positions,
                std::size_t axes, const std::vector<std::uint8_t>& axis_of_pair, std::size_t rotary_dim,
                const Options& options) {
  const Pass<T> pass{x, x};
  static const char* const kName[1] = {"x"};
  check_passes(fn, &pass, 1, kName, kName, rotary_dim);
  if (positions == nullptr) fail(fn, "positions is null");
  static const char* const kAxis[2][3] = {{"t", "h", "w"}, {"row", "col", ""}};
  for (std::size_t a = 0; a < axes; ++a) {
    for (std::size_t t = 0; t < x.tokens; ++t) {
      const std::int64_t m = positions[a * x.tokens + t];
      if (m < 0 || static_cast<std::uint64_t>(m) >= table.positions()) {
        position_outside(fn, std::string(kAxis[axes == 3 ? 0 : 1][a]) + " position", t, m, table.positions());
      }
    }
  }
  const MultiAxis<U> source{&table, positions, x.tokens, axis_of_pair.data(), rotary_dim / 2};
  dispatch<T, U>(style, &pass, 1, source, rotary_dim, options);
}

}  // namespace detail

// Rotates x in place; positions holds one position per token.
template <class T, class U>
void apply(View<T> x, const Table<U>& table, Style style, const std::int64_t* positions, Options options = {}) {
  detail::check_types<T, U>();
  const detail::Pass<T> pass{x, x};
  static const char* const kName[1] = {"x"};
  detail::apply_positions("rope::apply", &pass, 1, kName, kName, table, style, detail::from_ids(positions), options);
}

// Rotates x in place; token t is at position offset + t (a KV cache that
// already holds offset tokens).
template <class T, class U, class I, std::enable_if_t<std::is_integral<I>::value, int> = 0>
void apply(View<T> x, const Table<U>& table, Style style, I offset, Options options = {}) {
  detail::check_types<T, U>();
  const detail::Pass<T> pass{x, x};
  static const char* const kName[1] = {"x"};
  detail::apply_positions("rope::apply", &pass, 1, kName, kName, table, style,
                          detail::from_offset(offset), options);
}

// Out of place: out = rotated x, channels past rotary_dim copied. out may be
// x itself (in place) but must not otherwise overlap it.
template <class T, class U>
void apply(detail::type_identity_t<View<const T>> x, View<T> out, const Table<U>& table, Style style,
           const std::int64_t* positions, Options options = {}) {
  detail::check_types<T, U>();
  const detail::Pass<T> pass{x, out};
  static const char* const kIn[1] = {"x"};
  static const char* const kOut[1] = {"out"};
  detail::apply_positions("rope::apply", &pass, 1, kIn, kOut, table, style, detail::from_ids(positions), options);
}
template <class T, class U, class I, std::enable_if_t<std::is_integral<I>::value, int> = 0>
void apply(detail::type_identity_t<View<const T>> x, View<T> out, const Table<U>& table, Style style, I offset,
           Options options = {}) {
  detail::check_types<T, U>();
  const detail::Pass<T> pass{x, out};
  static const char* const kIn[1] = {"x"};
  static const char* const kOut[1] = {"out"};
  detail::apply_positions("rope::apply", &pass, 1, kIn, kOut, table, style,
                          detail::from_offset(offset), options);
}

// Rotates Q and K in place in one pass over tokens: each token's cos/sin row
// is read once for all its Q and K heads. k may have fewer heads than q
// (grouped-query attention); q.heads must be a multiple of k.heads.
template <class T, class U>
void apply_qk(View<T> q, View<T> k, const Table<U>& table, Style style, const std::int64_t* positions,
              Options options = {}) {
  detail::apply_qk_positions<T, U>(q, k, q, k, table, style, detail::from_ids(positions), options, true);
}
template <class T, class U, class I, std::enable_if_t<std::is_integral<I>::value, int> = 0>
void apply_qk(View<T> q, View<T> k, const Table<U>& table, Style style, I offset, Options options = {}) {
  detail::apply_qk_positions<T, U>(q, k, q, k, table, style,
                                   detail::from_offset(offset), options, true);
}
// Out of place: q_out, k_out = rotated q, k.
template <class T, class U>
void apply_qk(detail::type_identity_t<View<const T>> q, detail::type_identity_t<View<const T>> k, View<T> q_out,
              View<T> k_out, const Table<U>& table, Style style, const std::int64_t* positions,
              Options options = {}) {
  detail::apply_qk_positions<T, U>(q, k, q_out, k_out, table, style, detail::from_ids(positions), options, false);
}
template <class T, class U, class I, std::enable_if_t<std::is_integral<I>::value, int> = 0>
void apply_qk(detail::type_identity_t<View<const T>> q, detail::type_identity_t<View<const T>> k, View<T> q_out,
              View<T> k_out, const Table<U>& table, Style style, I offset, Options options = {}) {
  detail::apply_qk_positions<T, U>(q, k, q_out, k_out, table, style,
                                   detail::from_offset(offset), options,
                                   false);
}

// M-RoPE in place: positions is [3, tokens] (all t, then all h, then all w);
// pair p is rotated by positions[axis(p)] * theta_p, axis(p) given by the
// sections. With all three axes equal this is plain RoPE.
template <class T, class U>
void apply_mrope(View<T> x, const Table<U>& table, Style style, const std::int64_t* positions,
                 const MropeSections& sections, Options options = {}) {
  detail::check_types<T, U>();
  const char* fn = "rope::apply_mrope";
  const std::size_t rotary_dim = detail::resolve_rotary_dim(fn, options, table.rotary_dim());
  const auto axes = detail::mrope_axes(fn, sections, rotary_dim / 2);
  detail::apply_axes(fn, x, table, style, positions, 3, axes, rotary_dim, options);
}

// 2-D axial RoPE in place for image patches: positions is [2, tokens] (all
// rows, then all columns); the first rotary_dim/4 pairs follow the row, the
// rest the column. Build the table from axial_frequencies for the usual
// schedule, one rotary_dim/2-channel RoPE per axis.
template <class T, class U>
void apply_axial(View<T> x, const Table<U>& table, Style style, const std::int64_t* positions,
                 Options options = {}) {
  detail::check_types<T, U>();
  const char* fn = "rope::apply_axial";
  const std::size_t rotary_dim = detail::resolve_rotary_dim(fn, options, table.rotary_dim());
  if (rotary_dim % 4 != 0) {
    detail::fail(fn, "rotary_dim must be a multiple of 4 (two axes of pairs), got " + std::to_string(rotary_dim));
  }
  std::vector<std::uint8_t> axes(rotary_dim / 2, 0);
  std::fill(axes.begin() + static_cast<std::ptrdiff_t>(rotary_dim / 4), axes.end(), std::uint8_t{1});
  detail::apply_axes(fn, x, table, style, positions, 2, axes, rotary_dim, options);
}

namespace detail {

// new_row[to(i)] = old_row[i] within the rotary part of every head.
template <class T, class To>
void permute_rows(const char* fn, T* weight, std::size_t heads, std::size_t head_dim, std::size_t in_features,
                  std::size_t rotary_dim, To to) {
  static_assert(std::is_trivially_copyable<T>::value, "permute: T must be trivially copyable");
  if (weight == nullptr) fail(fn, "weight is null");
  if (head_dim == 0) fail(fn, "head_dim is 0");
  if (in_features == 0) fail(fn, "in_features is 0");
  const std::size_t r = rotary_dim == 0 ? head_dim : rotary_dim;
  if (r % 2 != 0) fail(fn, "rotary_dim must be even, got " + std::to_string(r));
  if (r > head_dim) {
    fail(fn, "rotary_dim " + std::to_string(r) + " exceeds head_dim " + std::to_string(head_dim));
  }
  std::vector<T> old(r * in_features);
  for (std::size_t h = 0; h < heads; ++h) {
    T* head = weight + h * head_dim * in_features;
    std::memcpy(old.data(), head, old.size() * sizeof(T));
    for (std::size_t i = 0; i < r; ++i) {
      std::memcpy(head + to(i, r) * in_features, old.data() + i * in_features, in_features * sizeof(T));
    }
  }
}

}  // namespace detail

// Reorders the rows of a Q or K projection weight (row-major
// [heads * head_dim, in_features]; a bias is the case in_features = 1) from
// the block_diagonal pairing (2p, 2p+1) to rotate_half (p, p + r/2): after it,
// rotating the projection's output with rotate_half gives the same vectors,
// permuted, as block_diagonal on the original — and the same attention scores.
// Channels past rotary_dim (0: head_dim) stay where they are.
template <class T>
void permute_to_rotate_half(T* weight, std::size_t heads, std::size_t head_dim, std::size_t in_features,
                            std::size_t rotary_dim = 0) {
  detail::permute_rows("rope::permute_to_rotate_half", weight, heads, head_dim, in_features, rotary_dim,
                       [](std::size_t i, std::size_t r) { return i % 2 == 0 ? i / 2 : r / 2 + i / 2; });
}

// The inverse: rows from rotate_half (p, p + r/2) to block_diagonal (2p, 2p+1).
template <class T>
void permute_to_block_diagonal(T* weight, std::size_t heads, std::size_t head_dim, std::size_t in_features,
                               std::size_t rotary_dim = 0) {
  detail::permute_rows("rope::permute_to_block_diagonal", weight, heads, head_dim, in_features, rotary_dim,
                       [](std::size_t i, std::size_t r) { return i < r / 2 ? 2 * i : 2 * (i - r / 2) + 1; });
}

}  // namespace rope
