// The fixture of the append suites (test_attention_append*.cpp,
// test_attention_writer.cpp): a step of new tokens over a paged KV cache,
// its Q, K, V and q_out buffers, and the unfused composition that
// rope::attention::append's header documents, computed here step by step:
// the plain RMSNorm loop, rope::apply on float rows at the new tokens'
// positions, then one rounding into each stored type (store_kv_row; int8:
// quantized the same way) into each token's slot.
//
// The positions and slots are derived here from the batch as plan.hpp's
// header defines them (new token i of sequence b at lengths[b] - n_b + i,
// in slot block_table[b][p / page_size] * page_size + p % page_size), not
// read from the plan, so a plan that derived them otherwise shows.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include <rope/apply.hpp>
#include <rope/attention.hpp>
#include <rope/frequencies.hpp>
#include <rope/multi_axis.hpp>
#include <rope/table.hpp>

#include "kv_elements.hpp"
#include "support.hpp"

namespace append_test {

namespace ra = rope::attention;
using rope::BFloat16;
using rope::Float16;
using rope::Style;
using I8 = std::int8_t;

enum class NormKind { none, per_head, whole };

struct Case {
  Style style = Style::rotate_half;
  std::size_t tokens = 7, q_heads = 8, kv_heads = 2, head_dim = 32;
  std::size_t rotary_dim = 0;  // rotation.rotary_dim (0: the table's)
  bool rotate = true;
  NormKind norm = NormKind::per_head;
  bool plus_one = false;
  bool batch = false;  // several sequences (else one, 3 keys cached before the step)
  bool hnd = false;
  bool fused = false;     // q, k, v: split_qkv of one buffer
  bool in_place = false;  // q_out == q
  bool write_back = false;
  std::size_t threads = 1;
  rope::Executor executor;                        // set: the plan's threads are its shares
  rope::Stores stores = rope::Stores::automatic;  // small calls: cached
  int nan_token = -1;                             // >= 0: one NaN in that token's row of nan_in
  char nan_in = 'q';
  std::size_t nan_head = 0;
};

constexpr std::size_t kPageSize = 4;
constexpr std::size_t kTablePositions = 64;
// Block-table entries a sequence does not use (never read): far outside the pool.
constexpr std::int32_t kUnusedPage = std::int32_t(1) << 30;

// A step's batch and the new tokens' positions and slots, derived from the
// header's formulas.
struct Layout {
  std::vector<std::int64_t> q_starts, lengths;
  std::vector<std::int32_t> block_table;
  std::size_t stride = 0, page_size = kPageSize, pages = 0;
  std::vector<std::int64_t> positions, slots;  // per new token
  // Tree verify (tree.hpp; empty: no trees): per new token its depth (-1
  // outside a tree) and its row of one mask word.
  std::vector<std::int32_t> tree_depths;
  std::vector<std::uint64_t> tree_masks;

  ra::Batch batch() const {
    ra::Batch b{q_starts.data(), lengths.data(), block_table.data(), stride, lengths.size()};
    if (!tree_depths.empty()) {
      b.tree_depths = tree_depths.data();
      b.tree_masks = tree_masks.data();
      b.tree_mask_words = 1;
    }
    return b;
  }
  std::size_t sequences() const { return lengths.size(); }
};

struct Sequence {
  std::size_t cached, fresh;  // keys before the step, new tokens
};

// Sequences into pages of a shuffled pool (two pages no sequence reads);
// a sequence without new tokens lists no page at all (plan.hpp: its block
// table is not read).
inline Layout make_layout(const std::vector<Sequence>& seqs, std::size_t page_size, std::uint32_t seed) {
  Layout l;
  l.page_size = page_size;
  std::vector<std::size_t> need;
  for (const Sequence& s : seqs) {
    need.push_back(s.fresh == 0 ? 0 : (s.cached + s.fresh + page_size - 1) / page_size);
    l.pages += need.back();
    l.stride = std::max(l.stride, need.back() + 1);
  }
  l.pages += 2;
  std::vector<std::int32_t> ids(l.pages);
  std::iota(ids.begin(), ids.end(), 0);
  std::mt19937 gen(seed);
  std::shuffle(ids.begin(), ids.end(), gen);
  l.block_table.assign(seqs.size() * l.stride, kUnusedPage);
  l.q_starts.push_back(0);
  std::size_t next = 0;
  for (std::size_t b = 0; b < seqs.size(); ++b) {
    for (std::size_t i = 0; i < need[b]; ++i) l.block_table[b * l.stride + i] = ids[next++];
    const std::size_t len = seqs[b].cached + seqs[b].fresh;
    l.lengths.push_back(static_cast<std::int64_t>(len));
    l.q_starts.push_back(l.q_starts.back() + static_cast<std::int64_t>(seqs[b].fresh));
    for (std::size_t i = 0; i < seqs[b].fresh; ++i) {
      const std::size_t p = len - seqs[b].fresh + i;
      l.positions.push_back(static_cast<std::int64_t>(p));
      l.slots.push_back(static_cast<std::int64_t>(
          static_cast<std::size_t>(l.block_table[b * l.stride + p / page_size]) * page_size + p % page_size));
    }
  }
  return l;
}

// Sequence b of l made a tree (tree.hpp) of its new tokens: token i at
// depth depths[i], seeing its parent's ancestors and itself (parents[i]:
// the token it follows, -1 for a root); its position becomes cached +
// depth, its slot stays that of key cached + i.
inline void make_tree(Layout& l, std::size_t b, const std::vector<std::int32_t>& depths,
                      const std::vector<int>& parents) {
  const auto t0 = static_cast<std::size_t>(l.q_starts[b]);
  const std::size_t n = depths.size();
  const std::int64_t cached = l.lengths[b] - static_cast<std::int64_t>(n);
  if (l.tree_depths.empty()) {
    l.tree_depths.assign(l.positions.size(), -1);
    l.tree_masks.assign(l.positions.size(), 0);
  }
  for (std::size_t i = 0; i < n; ++i) {
    l.tree_depths[t0 + i] = depths[i];
    std::uint64_t row = 0;
    for (int j = static_cast<int>(i); j >= 0; j = parents[static_cast<std::size_t>(j)]) row |= std::uint64_t{1} << j;
    l.tree_masks[t0 + i] = row;
    l.positions[t0 + i] = cached + depths[i];
  }
}

// The step of a case: one sequence with 3 keys cached, or a batch of a
// two-token chunk after 9 keys, a sequence with no new tokens, a decode
// token after 30 keys and a prefill from position 0 of the rest.
inline Layout layout_of(std::size_t tokens, bool batch) {
  if (!batch) return make_layout({{3, tokens}}, kPageSize, 7);
  std::vector<Sequence> seqs;
  std::size_t left = tokens;
  const auto take = [&](std::size_t n) {
    n = std::min(n, left);
    left -= n;
    return n;
  };
  seqs.push_back({9, take(2)});
  seqs.push_back({5, 0});
  seqs.push_back({30, take(1)});
  seqs.push_back({0, left});
  return make_layout(seqs, kPageSize, 11);
}

template <class T>
T round_to(float x) {
  return T(x);
}

template <class T>
std::vector<unsigned char> bytes_of(const std::vector<T>& v) {
  std::vector<unsigned char> b(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// One stored or row value as float, exactly (every element type).
template <class T>
float widen_any(T x) {
  return rope_test::widen(x);
}

template <class T>
::testing::AssertionResult same_bytes(const std::vector<T>& got, const std::vector<T>& want, const char* what) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << what << ": sizes differ";
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
      return ::testing::AssertionFailure() << what << ": element " << i << " of " << got.size() << " differs: got "
                                           << widen_any(got[i]) << ", want " << widen_any(want[i]);
    }
  }
  return ::testing::AssertionSuccess();
}

// Every buffer a call may write: the inputs (k's write-back, q in place),
// q_out, the pools and their scales.
template <class In, class QO, class E>
struct State {
  std::vector<In> in;
  std::vector<QO> out;
  std::vector<E> kp, vp;
  std::vector<float> ks, vs;
};

template <class In, class QO, class E>
::testing::AssertionResult same_state(const State<In, QO, E>& a, const State<In, QO, E>& b) {
  for (auto r : {same_bytes(a.in, b.in, "q/k/v"), same_bytes(a.out, b.out, "q_out"), same_bytes(a.kp, b.kp, "cache.k"),
                 same_bytes(a.vp, b.vp, "cache.v"), same_bytes(a.ks, b.ks, "cache.k.scales"),
                 same_bytes(a.vs, b.vs, "cache.v.scales")}) {
    if (!r) return r;
  }
  return ::testing::AssertionSuccess();
}

// The unfused RMSNorm, exactly as pre_attention.hpp documents it: the sum
// of squares in eight running fma sums folded pairwise, then x * r * w.
inline void plain_rms_norm(float* x, std::size_t n, const float* w, float eps, bool plus_one) {
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (std::size_t c = 0; c < n; ++c) s[c % 8] = std::fma(x[c], x[c], s[c % 8]);
  const float ss = ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
  const float r = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  for (std::size_t c = 0; c < n; ++c) x[c] = (x[c] * r) * (plus_one ? 1.0f + w[c] : w[c]);
}

template <class In, class QO, class E>
struct Fixture {
  Case c;
  rope::Table<float> table;
  Layout lay;
  std::vector<float> qw, kw;
  State<In, QO, E> initial;
  float eps = 1e-5f;

  struct Bound {
    rope::View<In> q, k, v;
    rope::View<QO> q_out;
    ra::PagedCache<E> cache;
  };

  std::size_t d() const { return c.head_dim; }
  std::size_t region(std::size_t heads) const { return c.tokens * heads * d(); }

  explicit Fixture(const Case& c_)
      : c(c_),
        table(rope::frequencies(c_.head_dim, 10000.0), std::max(kTablePositions, c_.tokens + 3)),
        lay(layout_of(c_.tokens, c_.batch)) {
    const std::size_t qn = c.norm == NormKind::whole ? c.q_heads * d() : d();
    const std::size_t kn = c.norm == NormKind::whole ? c.kv_heads * d() : d();
    const double wscale = c.plus_one ? 0.5 : 1.0;
    qw = rope_test::random_vector<float>(qn, 21, wscale);
    kw = rope_test::random_vector<float>(kn, 22, wscale);
    if (!c.plus_one) {
      for (auto& w : qw) w += 1.0f;
      for (auto& w : kw) w += 1.0f;
    }
    // Inputs, then padding the size of q (room for views that overlap).
    const std::size_t n_in = region(c.q_heads) + 2 * region(c.kv_heads) + region(c.q_heads);
    const auto x = rope_test::random_vector<float>(n_in, 23, 2.0);
    for (float v : x) initial.in.push_back(round_to<In>(v));
    if (!(c.in_place && std::is_same<In, QO>::value)) initial.out.assign(region(c.q_heads), round_to<QO>(-7.5f));
    const std::size_t pool = lay.pages * kPageSize * c.kv_heads * d();
    initial.kp.resize(pool);
    initial.vp.resize(pool);
    std::memset(static_cast<void*>(initial.kp.data()), 0xA5, pool * sizeof(E));
    std::memset(static_cast<void*>(initial.vp.data()), 0x5A, pool * sizeof(E));
    if (rope::KvElement<E>::kScaled) {
      initial.ks.assign(lay.pages * kPageSize * c.kv_heads, -3.25f);
      initial.vs.assign(lay.pages * kPageSize * c.kv_heads, -4.5f);
    }
    if (c.nan_token >= 0) {
      const Bound b = bind(initial);
      const auto nt = static_cast<std::size_t>(c.nan_token);
      const rope::View<In>& view = c.nan_in == 'q' ? b.q : c.nan_in == 'k' ? b.k : b.v;
      view.row(nt, c.nan_head)[3] = round_to<In>(std::numeric_limits<float>::quiet_NaN());
    }
  }

  Bound bind(State<In, QO, E>& s) const {
    Bound b;
    In* base = s.in.data();
    const std::size_t T = c.tokens, H = c.q_heads, G = c.kv_heads;
    if (c.fused) {
      const auto qkv = rope::split_qkv(base, T, H, G, d());
      b.q = qkv.q;
      b.k = qkv.k;
      b.v = qkv.v;
    } else {
      b.q = rope::View<In>::token_major(base, T, H, d());
      b.k = rope::View<In>::token_major(base + region(H), T, G, d());
      b.v = rope::View<In>::token_major(base + region(H) + region(G), T, G, d());
    }
    if constexpr (std::is_same<In, QO>::value) {
      if (c.in_place) b.q_out = b.q;
    }
    if (b.q_out.data == nullptr) b.q_out = rope::View<QO>::token_major(s.out.data(), T, H, d());
    float* ks = s.ks.empty() ? nullptr : s.ks.data();
    float* vs = s.vs.empty() ? nullptr : s.vs.data();
    const auto pool = c.hnd ? &ra::PagePool<E>::hnd : &ra::PagePool<E>::nhd;
    b.cache.k = pool(s.kp.data(), lay.pages, kPageSize, G, d(), ks);
    b.cache.v = pool(s.vp.data(), lay.pages, kPageSize, G, d(), vs);
    return b;
  }

  ra::Shape shape() const {
    ra::Shape s;
    s.q_heads = c.q_heads;
    s.kv_heads = c.kv_heads;
    s.head_dim = d();
    s.page_size = kPageSize;
    s.pages = lay.pages;
    return s;
  }
  rope::Threads threads() const { return c.executor.set() ? rope::Threads(c.executor) : rope::Threads(c.threads); }
  void plan(ra::Plan& p) const { ra::plan(p, shape(), lay.batch(), threads()); }

  ra::AppendOptions options() const {
    ra::AppendOptions o;
    if (c.rotate) o.rotation = ra::Rotation<float>{&table, c.style, c.rotary_dim};
    if (c.norm != NormKind::none) {
      o.q_norm = {qw.data(), qw.size()};
      o.k_norm = {kw.data(), kw.size()};
    }
    o.eps = eps;
    o.plus_one = c.plus_one;
    o.whole_projection = c.norm == NormKind::whole;
    o.write_back_k = c.write_back;
    o.stores = c.stores;
    return o;
  }

  // The fused call of the case, from the initial state.
  State<In, QO, E> run() const { return run_with(options()); }
  State<In, QO, E> run_with(const ra::AppendOptions& o) const {
    State<In, QO, E> s = initial;
    const Bound b = bind(s);
    ra::Plan p;
    plan(p);
    ra::append(p, b.cache, b.q, b.k, b.v, b.q_out, o);
    return s;
  }

  // Rows of one side widened, normalized and rotated (unless !rotate) as
  // separate steps.
  std::vector<float> unfused(const rope::View<In>& x, const std::vector<float>& w, bool rotate = true) const {
    const std::size_t T = x.tokens, H = x.heads;
    std::vector<float> f(T * H * d());
    for (std::size_t t = 0; t < T; ++t) {
      for (std::size_t h = 0; h < H; ++h) {
        for (std::size_t i = 0; i < d(); ++i) f[(t * H + h) * d() + i] = widen_any(x.row(t, h)[i]);
      }
    }
    for (std::size_t t = 0; t < T; ++t) {
      if (c.norm == NormKind::whole) plain_rms_norm(f.data() + t * H * d(), H * d(), w.data(), eps, c.plus_one);
      if (c.norm == NormKind::per_head) {
        for (std::size_t h = 0; h < H; ++h)
          plain_rms_norm(f.data() + (t * H + h) * d(), d(), w.data(), eps, c.plus_one);
      }
    }
    if (c.rotate && rotate) {
      rope::Options o;
      o.rotary_dim = c.rotary_dim;
      rope::apply(rope::View<float>::token_major(f.data(), T, H, d()), table, c.style,
                  rope::Positions(lay.positions.data()), o);
    }
    return f;
  }

  // The state after the unfused steps, from float rows of Q and K already
  // normalized and rotated: Q rounded into q_out, K into k (write-back) and
  // its slot, V widened and rounded into its slot.
  State<In, QO, E> written(const std::vector<float>& qf, const std::vector<float>& kf) const {
    State<In, QO, E> s = initial;
    State<In, QO, E> source = initial;
    const Bound src = bind(source);
    const Bound b = bind(s);
    const std::size_t G = c.kv_heads, D = d();
    for (std::size_t t = 0; t < c.tokens; ++t) {
      for (std::size_t h = 0; h < c.q_heads; ++h) {
        for (std::size_t i = 0; i < D; ++i) b.q_out.row(t, h)[i] = round_to<QO>(qf[(t * c.q_heads + h) * D + i]);
      }
      if (c.write_back) {
        for (std::size_t h = 0; h < G; ++h) {
          for (std::size_t i = 0; i < D; ++i) b.k.row(t, h)[i] = round_to<In>(kf[(t * G + h) * D + i]);
        }
      }
      const auto slot = static_cast<std::size_t>(lay.slots[t]);
      for (std::size_t h = 0; h < G; ++h) {
        const bool scaled = rope::KvElement<E>::kScaled;
        rope::store_kv_row(kf.data() + (t * G + h) * D, D, b.cache.k.row(slot, h),
                           scaled ? b.cache.k.scale(slot, h) : nullptr);
        std::vector<float> vrow(D);
        for (std::size_t i = 0; i < D; ++i) vrow[i] = widen_any(src.v.row(t, h)[i]);
        rope::store_kv_row(vrow.data(), D, b.cache.v.row(slot, h), scaled ? b.cache.v.scale(slot, h) : nullptr);
      }
    }
    return s;
  }

  State<In, QO, E> expected() const {
    State<In, QO, E> source = initial;
    const Bound src = bind(source);
    return written(unfused(src.q, qw), unfused(src.k, kw));
  }
};

inline std::string describe(const Case& c) {
  return std::string(rope::name(c.style)) + " rotary " + std::to_string(c.rotary_dim) + " rotate " +
         std::to_string(c.rotate) + " norm " + std::to_string(int(c.norm)) + " plus_one " + std::to_string(c.plus_one) +
         " batch " + std::to_string(c.batch) + " hnd " + std::to_string(c.hnd) + " fused " + std::to_string(c.fused) +
         " in_place " + std::to_string(c.in_place) + " write_back " + std::to_string(c.write_back) + " threads " +
         std::to_string(c.threads) + " tokens " + std::to_string(c.tokens);
}

template <class In, class QO, class E>
void expect_matches_unfused(const Case& c, const std::string& what) {
  const Fixture<In, QO, E> s(c);
  EXPECT_TRUE(same_state(s.run(), s.expected())) << what;
}

// [3, tokens] positions, axis-major; the three axes differ at every token,
// so a pair read from the wrong axis changes its angle.
inline std::vector<std::int64_t> mrope_positions(std::size_t tokens) {
  std::vector<std::int64_t> p(3 * tokens);
  for (std::size_t t = 0; t < tokens; ++t) {
    p[t] = static_cast<std::int64_t>((t * 7 + 3) % kTablePositions);
    p[tokens + t] = static_cast<std::int64_t>((t * 13 + 40) % kTablePositions);
    p[2 * tokens + t] = static_cast<std::int64_t>((t * 29 + 21) % kTablePositions);
  }
  return p;
}

}  // namespace append_test
