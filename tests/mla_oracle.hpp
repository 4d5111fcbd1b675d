// The MLA tests' fixture and oracle (test_attention_mla*.cpp,
// test_attention_sparse.cpp), written from the math of multi-head latent
// attention in long double and independent of rope::attention's MLA code:
//
//   per head h of new token t at position p, over the keys j it sees,
//   k_hj = [W_UK_h c_j | k_pe_j],  v_hj = W_UV_h c_j,  q_h = [q_nope_h | q_pe_h]
//   s_j  = scale * q_h . k_hj  (capped, masked, the sink: logits.hpp's order)
//   o_h  = sum_j softmax_j(s) v_hj
//
// the UNABSORBED form, with the caller's weights W_UK_h [nope x latent] and
// W_UV_h [v_head x latent]. rope computes the absorbed form over the latent
// rows: q_lat_h = W_UK_h^T q_nope_h (here in float, in order, as a caller
// would), out_h = sum_j p_j c_j, and the test applies W_UV_h to out_h in long
// double. The oracle reads the rows the cache holds (c_j and k_pe_j widened
// exactly, int8 times its part's scale), so its bound is the float
// arithmetic of the attention alone; the rounding of the rows themselves is
// test_attention_mla.cpp's append suite.
//
// The bound (softmax_expect below), per (token, head):
//   score j in float: q_lat_h rounded (nope products summed in float:
//     |dq_x| <= nope eps sum_i |W_UK_h[i][x] q_nope_i|), q scaled once, the
//     width = latent + rope products summed by the GEMM in an order not known
//     (gamma_width <= width eps / 2 of sum_x |q_x k_x|), int8 rows widened
//     (one rounding of each product q s):
//       e_j = scale (sum_x |dq_x c_jx| + (width + 4) eps sum_x |q_x k_jx|) + 2 eps |s_j|
//     and with a softcap the cap's slope sech^2 at |s_j| - e_j contracts it,
//     plus 8 eps cap for the float tanh; eps_s = max_j e_j;
//   the softmax (docs/attention.md, "Accuracy"): scores off by at most eps_s
//     move each weight by a factor in [exp(-2 eps_s), exp(2 eps_s)], so the
//     weighted mean of a channel by at most expm1(2 eps_s) max_j |v_j|;
//   the weighted sum's rounding: exp(s_j - M) (a few ulps, and eps/2
//     |s_j - M| from the subtraction, whose weight x exp(-x) <= 1/e), the n
//     weights and the n products summed (gamma_n each), the running max's
//     rescales once per block of 256 keys and per split part, the merges, the
//     sink's factor and the division: (3 n + 6 parts + 30) eps of max_j |v_j|;
//   so |out_x - exact_x| <= (expm1(2 eps_s) + (3 n + 6 parts + 30) eps) max_j |v_jx|
//   per channel (the weights are the same for every channel), and through
//   W_UV_h: sum_x |W_UV_h[v][x]| times that.
//   The log-sum-exp is 1-Lipschitz in the scores (eps_s), and moves by the
//   denominator's relative error ((n + 6 parts + 10) eps) and its own two
//   roundings (2 eps |lse|).
// The bf16 product mode (Call::products, docs/attention.md "Product
// modes"): q rounded to bf16 (2^-8 relative, values below 2^-126 flushed),
// the width products exact and summed in any order, the weights rounded
// to bf16:
//   e_j = scale ((1 + 2^-8) sum_x |dq_x c_jx| + (2^-8 (1 + g) + g) sum_x |q_x k_jx|
//         + 2^-126 (sum_x |k_jx| + sum_x |q_x|) + (4 width + 64) 2^-126) + 2 eps |s_j|,
//   g = (width + 5) eps, and (2^-8 + n 2^-126) max_j |v_j| more per channel
//   for the weights; the tiles' blocks of 128 keys in parts.
// eps = 2^-23 throughout, twice float's unit roundoff: every gamma_k above
// is taken at twice its size.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include <rope/apply.hpp>
#include <rope/attention.hpp>
#include <rope/frequencies.hpp>
#include <rope/table.hpp>

#include "attention_oracle.hpp"
#include "kv_elements.hpp"
#include "support.hpp"

namespace mla_test {

namespace ra = rope::attention;
namespace at = attention_test;
using at::LD;

constexpr double kEps = std::numeric_limits<float>::epsilon();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr LD kNegInf = -std::numeric_limits<LD>::infinity();

// Whether two vectors hold the same bytes (never handing memcmp the null
// data of an empty vector).
template <class T>
bool same_bytes(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

// A sequence of a step: n new tokens, `length` keys in its cache after the
// step (the new ones included).
struct Seq {
  std::int64_t n, length;
};

// A paged batch: pages drawn from a shuffled pool (never in order, a few no
// sequence reads), table entries past a sequence's pages far outside the
// pool (a read of one would fault or show).
struct Layout {
  std::size_t page_size = 0, pages = 0, stride = 0;
  std::vector<std::int64_t> q_starts, lengths;    // the step
  std::vector<std::int64_t> h_starts, h_lengths;  // the keys before it: each sequence's first length - n
  std::vector<std::int32_t> table;

  std::size_t tokens() const { return static_cast<std::size_t>(q_starts.back()); }
  std::size_t history_tokens() const { return static_cast<std::size_t>(h_starts.back()); }
  std::size_t sequences() const { return lengths.size(); }
  ra::Batch batch() const { return {q_starts.data(), lengths.data(), table.data(), stride, lengths.size()}; }
  ra::Batch history() const { return {h_starts.data(), h_lengths.data(), table.data(), stride, lengths.size()}; }
  std::size_t slot(std::size_t b, std::int64_t j) const {
    const auto u = static_cast<std::size_t>(j);
    return static_cast<std::size_t>(table[b * stride + u / page_size]) * page_size + u % page_size;
  }
  std::size_t sequence_of(std::size_t t) const {
    std::size_t b = 0;
    while (static_cast<std::int64_t>(t) >= q_starts[b + 1]) ++b;
    return b;
  }
  // Token t's position: lengths[b] - n_b + its index among b's new tokens.
  std::int64_t position_of(std::size_t t) const {
    const std::size_t b = sequence_of(t);
    const std::int64_t n = q_starts[b + 1] - q_starts[b];
    return lengths[b] - n + (static_cast<std::int64_t>(t) - q_starts[b]);
  }
};

inline Layout make_layout(const std::vector<Seq>& seqs, std::size_t page_size, std::uint32_t seed) {
  Layout lay;
  lay.page_size = page_size;
  lay.q_starts = {0};
  lay.h_starts = {0};
  std::vector<std::size_t> need;
  for (const Seq& s : seqs) {
    lay.q_starts.push_back(lay.q_starts.back() + s.n);
    lay.lengths.push_back(s.length);
    lay.h_starts.push_back(lay.h_starts.back() + s.length - s.n);
    lay.h_lengths.push_back(s.length - s.n);
    need.push_back((static_cast<std::size_t>(s.length) + page_size - 1) / page_size);
    lay.pages += need.back();
    lay.stride = std::max(lay.stride, need.back() + 1);
  }
  lay.pages += 3;
  std::vector<std::int32_t> ids(lay.pages);
  std::iota(ids.begin(), ids.end(), 0);
  std::mt19937 gen(seed);
  std::shuffle(ids.begin(), ids.end(), gen);
  lay.table.assign(seqs.size() * lay.stride, std::int32_t(1) << 30);
  std::size_t next = 0;
  for (std::size_t b = 0; b < seqs.size(); ++b) {
    for (std::size_t i = 0; i < need[b]; ++i) lay.table[b * lay.stride + i] = ids[next++];
  }
  return lay;
}

// The heads and widths of an MLA layer.
struct Dims {
  std::size_t heads, latent, rope, nope, v_head;
  std::size_t width() const { return latent + rope; }
};

// One layer's inputs and weights, as the model's projections give them.
struct Model {
  Dims d;
  Layout lay;
  rope::Frequencies freqs;
  std::unique_ptr<rope::Table<float>> table;
  rope::Style style = rope::Style::block_diagonal;
  double scale = 0;
  std::vector<std::vector<float>> c_kv,
      k_pe;                         // per sequence: [length, latent], [length, rope] (not normed, not rotated)
  std::vector<float> q_nope, q_pe;  // [tokens, heads, nope], [tokens, heads, rope] (not rotated)
  std::vector<float> w_uk, w_uv;    // per head: [nope, latent], [v_head, latent]
  std::vector<float> norm;          // kv_a_layernorm: latent weights
  std::vector<float> q_lat;         // [tokens, heads, latent]: W_UK_h^T q_nope_h in float, in order

  Model(const Dims& dims, const std::vector<Seq>& seqs, std::size_t page_size, std::uint32_t seed,
        rope::Style s = rope::Style::block_diagonal)
      : d(dims), lay(make_layout(seqs, page_size, seed)), freqs(rope::frequencies(dims.rope, 10000.0)), style(s) {
    std::int64_t longest = 1;
    for (const Seq& q : seqs) longest = std::max(longest, q.length);
    table = std::make_unique<rope::Table<float>>(freqs, static_cast<std::size_t>(longest) + 1);
    // Scores of a few units: W_UK of variance 1/latent keeps W_UK c of the
    // size of c; DeepSeek's 1/sqrt(nope + rope), doubled.
    scale = 2.0 / std::sqrt(static_cast<double>(d.nope + d.rope));
    const double w = std::sqrt(3.0 / static_cast<double>(d.latent));
    std::uint32_t k = seed * 1000;
    for (const Seq& q : seqs) {
      c_kv.push_back(rope_test::random_vector<float>(static_cast<std::size_t>(q.length) * d.latent, ++k, 2.0));
      k_pe.push_back(rope_test::random_vector<float>(static_cast<std::size_t>(q.length) * d.rope, ++k, 1.5));
    }
    const std::size_t T = lay.tokens(), H = d.heads;
    q_nope = rope_test::random_vector<float>(T * H * d.nope, ++k, 1.7);
    q_pe = rope_test::random_vector<float>(T * H * d.rope, ++k, 1.5);
    w_uk = rope_test::random_vector<float>(H * d.nope * d.latent, ++k, w);
    w_uv = rope_test::random_vector<float>(H * d.v_head * d.latent, ++k, w);
    norm = rope_test::random_vector<float>(d.latent, ++k, 0.2);
    for (float& x : norm) x += 1.0f;
    q_lat.assign(T * H * d.latent, 0.0f);
    for (std::size_t t = 0; t < T; ++t) {
      for (std::size_t h = 0; h < H; ++h) {
        for (std::size_t x = 0; x < d.latent; ++x) {
          float acc = 0.0f;
          for (std::size_t i = 0; i < d.nope; ++i) acc += uk(h, i, x) * q_nope[(t * H + h) * d.nope + i];
          q_lat[(t * H + h) * d.latent + x] = acc;
        }
      }
    }
  }

  float uk(std::size_t h, std::size_t i, std::size_t x) const { return w_uk[(h * d.nope + i) * d.latent + x]; }
  float uv(std::size_t h, std::size_t v, std::size_t x) const { return w_uv[(h * d.v_head + v) * d.latent + x]; }

  // The rows of c_kv (or k_pe) of the step's tokens, or of the keys before
  // it, packed as [tokens, 1, dim].
  std::vector<float> rows(bool latent, bool history) const {
    const std::size_t dim = latent ? d.latent : d.rope;
    std::vector<float> out;
    for (std::size_t b = 0; b < lay.sequences(); ++b) {
      const std::int64_t n = lay.q_starts[b + 1] - lay.q_starts[b];
      const std::int64_t from = history ? 0 : lay.lengths[b] - n, to = history ? lay.lengths[b] - n : lay.lengths[b];
      const std::vector<float>& src = latent ? c_kv[b] : k_pe[b];
      for (std::int64_t j = from; j < to; ++j) {
        out.insert(out.end(), src.begin() + j * static_cast<std::int64_t>(dim),
                   src.begin() + (j + 1) * static_cast<std::int64_t>(dim));
      }
    }
    return out;
  }

  ra::AppendOptions append_options() const {
    ra::AppendOptions o;
    o.rotation = {table.get(), style};
    o.k_norm = {norm.data(), norm.size()};
    return o;
  }
  ra::Shape shape(std::size_t kv_split = 512) const {
    ra::Shape s;
    s.q_heads = d.heads;
    s.kv_heads = 1;
    s.head_dim = d.width();
    s.v_head_dim = d.latent;
    s.page_size = lay.page_size;
    s.pages = lay.pages;
    s.kv_split = kv_split;
    return s;
  }
};

template <class E>
E poison() {
  if constexpr (std::is_same<E, std::int8_t>::value) {
    return std::int8_t(127);
  } else {
    return E(kNaN);
  }
}

// A paged latent cache of E for a model's layout, every slot poisoned (NaN,
// int8: code 127 and a NaN scale) until written.
template <class E>
struct Store {
  std::vector<E> data;
  std::vector<float> scales;
  ra::LatentCache<E> cache;

  Store(const Layout& lay, const Dims& d) {
    data.assign(lay.pages * lay.page_size * d.width(), poison<E>());
    if (rope::KvElement<E>::kScaled) scales.assign(2 * lay.pages * lay.page_size, kNaN);
    bind(lay.pages, lay.page_size, d);
  }
  Store(const Store& o) : data(o.data), scales(o.scales), cache(o.cache) { rebind(); }
  Store& operator=(const Store&) = delete;

  void bind(std::size_t pages, std::size_t page_size, const Dims& d) {
    cache = ra::LatentCache<E>::dense(data.data(), pages, page_size, d.latent, d.rope,
                                      scales.empty() ? nullptr : scales.data());
  }
  void rebind() {
    cache.data = data.data();
    cache.scales = scales.empty() ? nullptr : scales.data();
  }
  // The values of a slot's row, widened exactly (int8: code times its part's scale).
  std::vector<LD> row(std::size_t slot) const {
    const E* r = cache.row(slot);
    std::vector<LD> out(cache.width());
    for (std::size_t x = 0; x < out.size(); ++x) {
      out[x] = static_cast<LD>(rope_test::widen(r[x]));
      if constexpr (rope::KvElement<E>::kScaled)
        out[x] *= static_cast<LD>(cache.scale(slot)[x < cache.latent_dim ? 0 : 1]);
    }
    return out;
  }
  bool same_bytes(const Store& o) const {
    return mla_test::same_bytes(data, o.data) && mla_test::same_bytes(scales, o.scales);
  }
};

// The keys before the step and the step's own rows appended through MLA's
// append (the model's norm and pairing); returns the step's q_pe rotated
// ([tokens, heads, rope], what attend reads).
template <class E>
std::vector<float> write(const Model& m, Store<E>& st, const rope::Threads& threads = 1) {
  const ra::AppendOptions o = m.append_options();
  const std::size_t H = m.d.heads, R = m.d.rope, L = m.d.latent;
  ra::Plan p;
  if (m.lay.history_tokens() > 0) {
    ra::plan(p, m.shape(), m.lay.history(), threads);
    const std::size_t n = m.lay.history_tokens();
    const auto c = m.rows(true, true), k = m.rows(false, true);
    std::vector<float> q(n * H * R, 0.5f);
    ra::append(p, st.cache, rope::View<const float>::token_major(c.data(), n, 1, L),
               rope::View<const float>::token_major(k.data(), n, 1, R),
               rope::View<float>::token_major(q.data(), n, H, R), rope::View<float>::token_major(q.data(), n, H, R), o);
  }
  ra::plan(p, m.shape(), m.lay.batch(), threads);
  const std::size_t T = m.lay.tokens();
  const auto c = m.rows(true, false), k = m.rows(false, false);
  std::vector<float> q_pe_out(T * H * R, -9.0f);
  ra::append(p, st.cache, rope::View<const float>::token_major(c.data(), T, 1, L),
             rope::View<const float>::token_major(k.data(), T, 1, R),
             rope::View<const float>::token_major(m.q_pe.data(), T, H, R),
             rope::View<float>::token_major(q_pe_out.data(), T, H, R), o);
  return q_pe_out;
}

// What an attend call is given besides its tensors.
struct Call {
  ra::Logits logits;
  ra::Mask mask;
  std::size_t kv_split = 512;
  rope::Threads threads;
  rope::Products products = rope::Products::exact;
};

struct Result {
  std::vector<float> out, lse;  // [tokens, heads, latent], [tokens, heads]
  bool same_bytes(const Result& o) const {
    return mla_test::same_bytes(out, o.out) && mla_test::same_bytes(lse, o.lse);
  }
};

// plan (the call's kv_split and threads) then MLA attend; out and lse
// filled with a pattern first.
template <class E>
Result attend(const Model& m, const Store<E>& st, const std::vector<float>& q_pe, const Call& c) {
  const std::size_t T = m.lay.tokens(), H = m.d.heads, L = m.d.latent;
  ra::Plan p;
  ra::Shape shape = m.shape(c.kv_split);
  shape.products = c.products;
  ra::plan(p, shape, m.lay.batch(), c.threads);
  Result r;
  r.out.assign(T * H * L, -777.0f);
  r.lse.assign(T * H, -555.0f);
  ra::attend(p, st.cache, rope::View<const float>::token_major(m.q_lat.data(), T, H, L),
             rope::View<const float>::token_major(q_pe.data(), T, H, m.d.rope),
             rope::View<float>::token_major(r.out.data(), T, H, L), c.logits, c.mask, r.lse.data());
  return r;
}

// The keys [lo, hi) a token at position p of a sequence of `length` keys
// sees, from masks.hpp's rule.
inline void visible(std::int64_t p, std::int64_t length, const ra::Mask& m, std::int64_t* lo, std::int64_t* hi) {
  *hi = m.causal ? std::min(length, p + 1) : length;
  *lo = m.window > 0 ? std::max<std::int64_t>(0, p - static_cast<std::int64_t>(m.window) + 1) : 0;
}

// The positions token t attends to: its list (the entries other than -1),
// or the keys its mask lets it see.
inline std::vector<std::int64_t> keys_of(const Layout& lay, const ra::Mask& m, std::size_t t) {
  std::vector<std::int64_t> keys;
  if (m.indices != nullptr) {
    const std::size_t stride = m.index_stride == 0 ? m.topk : m.index_stride;
    for (std::size_t i = 0; i < m.topk; ++i) {
      const std::int32_t j = m.indices[t * stride + i];
      if (j != -1) keys.push_back(j);
    }
    return keys;
  }
  std::int64_t lo = 0, hi = 0;
  visible(lay.position_of(t), lay.lengths[lay.sequence_of(t)], m, &lo, &hi);
  for (std::int64_t j = lo; j < hi; ++j) keys.push_back(j);
  return keys;
}

// The float arithmetic's scale, cap and sink as the call rounds them.
inline LD scale_of(const ra::Logits& l, std::size_t width) {
  return l.scale ? static_cast<LD>(static_cast<float>(*l.scale)) : 1.0L / std::sqrt(static_cast<LD>(width));
}
inline LD cap_of(const ra::Logits& l) { return l.softcap ? static_cast<LD>(static_cast<float>(*l.softcap)) : 0; }
inline LD sink_of(const ra::Logits& l, std::size_t h) {
  return l.sinks.empty() ? kNegInf : static_cast<LD>(static_cast<float>(l.sinks[h]));
}

// A score's error bound e through the cap (none: cap 0): the slope sech^2
// at |raw| - e contracts it, the float tanh adds 8 eps cap.
inline LD through_cap(LD raw, LD e, LD cap) {
  if (cap <= 0) return e;
  const LD a = std::max<LD>(0, std::fabs(raw) - e) / cap;
  return e / (std::cosh(a) * std::cosh(a)) + 8 * kEps * cap;
}

// One query row of the oracle: the exact output over value rows v (dv
// each) and log-sum-exp, and the float bounds of the header comment: per
// channel, and of the log-sum-exp.
struct RowExpect {
  std::vector<LD> out;
  LD lse = kNegInf;
  std::vector<double> bound;
  double lse_bound = 0;
  double eps_s = 0;
};

// s: the capped exact scores; err: each score's float error bound (after
// the cap); parts: the blocks and split parts the keys were summed in.
inline RowExpect softmax_expect(const std::vector<LD>& s, const std::vector<LD>& err, const at::Mat& v, std::size_t dv,
                                LD sink, double parts, bool bf16_weights = false) {
  RowExpect r;
  const at::SoftmaxRow row = at::softmax_row(s, v, dv, sink);
  r.out = row.out;
  r.lse = row.lse;
  r.bound.assign(dv, 0.0);
  if (s.empty()) return r;
  LD eps_s = 0;
  for (const LD e : err) eps_s = std::max(eps_s, e);
  const double n = static_cast<double>(s.size());
  const double weights = bf16_weights ? std::ldexp(1.0, -8) + n * std::ldexp(1.0, -126) : 0.0;
  const double f = std::expm1(2 * static_cast<double>(eps_s)) + (3 * n + 6 * parts + 30) * kEps + weights;
  for (std::size_t c = 0; c < dv; ++c) {
    LD top = 0;
    for (const auto& vj : v) top = std::max(top, std::fabs(vj[c]));
    r.bound[c] = f * static_cast<double>(top);
  }
  r.eps_s = static_cast<double>(eps_s);
  r.lse_bound = r.eps_s + (n + 6 * parts + 10) * kEps + 2 * kEps * static_cast<double>(std::fabs(row.lse));
  return r;
}

// The oracle's rows of a call: per (token, head) the unabsorbed output
// ([v_head]) and the latent output ([latent]) with their bounds, the
// log-sum-exp with its bound.
struct Expected {
  std::vector<LD> out, lat, lse;  // [T, H, v_head], [T, H, latent], [T, H]
  std::vector<double> out_bound, lat_bound, lse_bound;
  std::vector<double> lat_bound_rel;  // [T, H]: max_x lat bound / max_jx |c_jx| (0 for a row of no key)
};

// The split parts and blocks a row of n keys is summed in (over-counted
// for a prompt's tokens, which are not split).
inline double parts_of(std::size_t n, std::size_t kv_split) {
  return static_cast<double>(n / kv_split + n / ra::kMlaChunk + 3);
}

// The rows a cache holds for the sequences with new tokens, widened, and
// per head their unabsorbed keys W_UK_h c_j and values W_UV_h c_j: what
// every call's oracle over that cache reads.
struct Stored {
  std::vector<std::vector<std::vector<LD>>> rows;  // [b][j]: width values
  std::vector<std::vector<at::Mat>> k_nope, v;     // [b][h][j]: nope, v_head values
};

template <class E>
Stored stored(const Model& m, const Store<E>& st) {
  const Dims& d = m.d;
  Stored s;
  s.rows.resize(m.lay.sequences());
  s.k_nope.resize(m.lay.sequences());
  s.v.resize(m.lay.sequences());
  for (std::size_t b = 0; b < m.lay.sequences(); ++b) {
    if (m.lay.q_starts[b + 1] == m.lay.q_starts[b]) continue;
    const auto len = static_cast<std::size_t>(m.lay.lengths[b]);
    for (std::size_t j = 0; j < len; ++j) s.rows[b].push_back(st.row(m.lay.slot(b, static_cast<std::int64_t>(j))));
    for (std::size_t h = 0; h < d.heads; ++h) {
      at::Mat k_nope(len, std::vector<LD>(d.nope, 0)), v(len, std::vector<LD>(d.v_head, 0));
      for (std::size_t j = 0; j < len; ++j) {
        const std::vector<LD>& row = s.rows[b][j];
        for (std::size_t i = 0; i < d.nope; ++i) {
          for (std::size_t x = 0; x < d.latent; ++x) k_nope[j][i] += static_cast<LD>(m.uk(h, i, x)) * row[x];
        }
        for (std::size_t c = 0; c < d.v_head; ++c) {
          for (std::size_t x = 0; x < d.latent; ++x) v[j][c] += static_cast<LD>(m.uv(h, c, x)) * row[x];
        }
      }
      s.k_nope[b].push_back(std::move(k_nope));
      s.v[b].push_back(std::move(v));
    }
  }
  return s;
}

// The oracle of a call over stored rows (see the header comment); q_pe:
// the rotated rows the call reads.
inline Expected oracle(const Model& m, const Stored& st, const std::vector<float>& q_pe, const Call& c) {
  const Dims& d = m.d;
  const std::size_t T = m.lay.tokens(), H = d.heads, L = d.latent, R = d.rope, N = d.nope, V = d.v_head;
  const LD scale = scale_of(c.logits, d.width()), cap = cap_of(c.logits);
  const bool bf16 = c.products == rope::Products::bf16;
  Expected e;
  e.out.assign(T * H * V, 0);
  e.lat.assign(T * H * L, 0);
  e.lse.assign(T * H, kNegInf);
  e.out_bound.assign(T * H * V, 0);
  e.lat_bound.assign(T * H * L, 0);
  e.lse_bound.assign(T * H, 0);
  e.lat_bound_rel.assign(T * H, 0);
  for (std::size_t t = 0; t < T; ++t) {
    const std::size_t b = m.lay.sequence_of(t);
    const std::vector<std::int64_t> keys = keys_of(m.lay, c.mask, t);
    for (std::size_t h = 0; h < H; ++h) {
      const std::size_t th = t * H + h;
      const float* qn = &m.q_nope[th * N];
      const float* qp = &q_pe[th * R];
      const float* ql = &m.q_lat[th * L];
      // |dq_x|: the float q_lat's rounding, nope products summed.
      std::vector<LD> dq(L, 0);
      for (std::size_t x = 0; x < L; ++x) {
        for (std::size_t i = 0; i < N; ++i) dq[x] += std::fabs(static_cast<LD>(m.uk(h, i, x)) * qn[i]);
        dq[x] *= N * kEps;
      }
      std::vector<LD> s, err;
      at::Mat lat_v, out_v;
      for (const std::int64_t j64 : keys) {
        const auto j = static_cast<std::size_t>(j64);
        const std::vector<LD>& row = st.rows[b][j];
        const std::vector<LD>& kn = st.k_nope[b][h][j];
        LD dot = 0, mag = 0, dq_mag = 0, k_sum = 0, q_sum = 0;
        for (std::size_t i = 0; i < N; ++i) dot += static_cast<LD>(qn[i]) * kn[i];
        for (std::size_t r = 0; r < R; ++r) {
          dot += static_cast<LD>(qp[r]) * row[L + r];
          mag += std::fabs(static_cast<LD>(qp[r]) * row[L + r]);
          k_sum += std::fabs(row[L + r]);
          q_sum += std::fabs(static_cast<LD>(qp[r]));
        }
        for (std::size_t x = 0; x < L; ++x) {
          mag += std::fabs(static_cast<LD>(ql[x]) * row[x]);
          dq_mag += dq[x] * std::fabs(row[x]);
          k_sum += std::fabs(row[x]);
          q_sum += std::fabs(static_cast<LD>(ql[x]));
        }
        const LD raw = scale * dot;
        LD e0 = scale * (dq_mag + (d.width() + 4) * kEps * mag) + 2 * kEps * std::fabs(raw);
        if (bf16) {
          const LD u8 = std::ldexp(1.0L, -8), tiny = std::ldexp(1.0L, -126), g = (d.width() + 5) * kEps;
          e0 = scale * ((1 + u8) * dq_mag + (u8 * (1 + g) + g) * mag + tiny * (k_sum + q_sum) +
                        (4.0L * d.width() + 64) * tiny) +
               2 * kEps * std::fabs(raw);
        }
        s.push_back(cap > 0 ? cap * std::tanh(raw / cap) : raw);
        err.push_back(through_cap(raw, e0, cap));
        lat_v.emplace_back(row.begin(), row.begin() + static_cast<std::ptrdiff_t>(L));
        out_v.push_back(st.v[b][h][j]);
      }
      const double parts = parts_of(s.size(), c.kv_split) + (bf16 ? static_cast<double>(s.size() / 128) : 0.0);
      const LD sink = sink_of(c.logits, h);
      const RowExpect lat = softmax_expect(s, err, lat_v, L, sink, parts, bf16);
      const RowExpect out = softmax_expect(s, err, out_v, V, sink, parts, bf16);
      e.lse[th] = lat.lse;
      e.lse_bound[th] = lat.lse_bound;
      LD top_c = 0;
      double top_bound = 0;
      for (std::size_t x = 0; x < L; ++x) {
        e.lat[th * L + x] = lat.out[x];
        e.lat_bound[th * L + x] = lat.bound[x];
        top_bound = std::max(top_bound, lat.bound[x]);
        for (const auto& cj : lat_v) top_c = std::max(top_c, std::fabs(cj[x]));
      }
      if (top_c > 0) e.lat_bound_rel[th] = top_bound / static_cast<double>(top_c);
      // Through W_UV_h: sum_x |W_UV_h[v][x]| times the latent bound, and
      // the long double's own rounding of the projections (2^-63 relative).
      for (std::size_t v = 0; v < V; ++v) {
        LD b_v = 0, mag = 0;
        for (std::size_t x = 0; x < L; ++x) {
          b_v += std::fabs(static_cast<LD>(m.uv(h, v, x))) * lat.bound[x];
          mag += std::fabs(static_cast<LD>(m.uv(h, v, x)) * lat.out[x]);
        }
        e.out[th * V + v] = out.out[v];
        e.out_bound[th * V + v] =
            static_cast<double>(b_v + 4 * L * std::numeric_limits<LD>::epsilon() * (mag + std::fabs(out.out[v])));
      }
    }
  }
  return e;
}

// W_UV_h applied in long double to rope's latent row of (t, h).
inline std::vector<LD> project(const Model& m, const std::vector<float>& out_lat, std::size_t th) {
  const std::size_t L = m.d.latent, V = m.d.v_head, h = th % m.d.heads;
  std::vector<LD> o(V, 0);
  for (std::size_t v = 0; v < V; ++v) {
    for (std::size_t x = 0; x < L; ++x) o[v] += static_cast<LD>(m.uv(h, v, x)) * static_cast<LD>(out_lat[th * L + x]);
  }
  return o;
}

// rope's rows against the oracle: the projected output (W_UV_h out_h vs
// the unabsorbed o_h), the latent output and the log-sum-exp, each within
// its bound; a row that sees no key exactly zero with lse its sink (-inf:
// none). Returns the largest error relative to its bound.
inline double expect_near(const Model& m, const Result& got, const Expected& want, const std::string& what) {
  const std::size_t T = m.lay.tokens(), H = m.d.heads, L = m.d.latent, V = m.d.v_head;
  double worst = 0;
  int reported = 0;
  auto check = [&](double err, double bound, const char* part, std::size_t th, std::size_t c, double g, double w) {
    if (bound > 0) worst = std::max(worst, err / bound);
    if (!(err <= bound) && reported++ < 6) {
      ADD_FAILURE() << what << ": " << part << " token " << th / H << " head " << th % H << " channel " << c << ": got "
                    << g << " want " << w << " error " << err << " bound " << bound;
    }
  };
  for (std::size_t th = 0; th < T * H; ++th) {
    const std::vector<LD> o = project(m, got.out, th);
    for (std::size_t v = 0; v < V; ++v) {
      const LD err = std::fabs(o[v] - want.out[th * V + v]);
      check(static_cast<double>(err), want.out_bound[th * V + v], "W_UV out", th, v, static_cast<double>(o[v]),
            static_cast<double>(want.out[th * V + v]));
    }
    for (std::size_t x = 0; x < L; ++x) {
      const LD err = std::fabs(static_cast<LD>(got.out[th * L + x]) - want.lat[th * L + x]);
      check(static_cast<double>(err), want.lat_bound[th * L + x], "latent out", th, x, got.out[th * L + x],
            static_cast<double>(want.lat[th * L + x]));
    }
    const LD wl = want.lse[th];
    const double gl = got.lse[th];
    if (std::isinf(static_cast<double>(wl))) {
      check(gl == static_cast<double>(wl) ? 0.0 : 1.0, 0.0, "lse", th, 0, gl, static_cast<double>(wl));
    } else {
      check(static_cast<double>(std::fabs(static_cast<LD>(gl) - wl)), want.lse_bound[th], "lse", th, 0, gl,
            static_cast<double>(wl));
    }
  }
  return worst;
}

}  // namespace mla_test
