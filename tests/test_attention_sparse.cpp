// Sparse attention (Mask::indices, attention/sparse.hpp): each new token
// attends only to the positions listed for it (top-k, -1 for none), for
// MLA over a latent cache (mla_attend.hpp) and for GQA over a paged cache
// (attend.hpp), every cache type:
//   - sparse = dense with a mask keeping exactly the listed keys: against
//     the long-double oracle over the listed keys of the stored rows
//     (mla_oracle.hpp's bound for MLA; for GQA the decode loop's: d products
//     per score, e_j = scale (d + 8) eps sum |q k| + 2 eps |s_j|, then the
//     same softmax bound), lists in any order with -1 entries among them,
//     an index_stride past topk whose padding is never read, decode tokens
//     split into parts, softcap, sinks, a window, not causal;
//   - a list of every key a token sees (in any order, -1 mixed in) gives
//     the dense call's bytes where the work is cut the same way: the same
//     kv_split, no window (a decode token's parts then begin at the same
//     keys); every GQA token, and MLA's decode tokens (a prompt's tokens are
//     MLA blocks of several tokens when dense, one token each when sparse:
//     within the bound there);
//   - the same bytes for any thread count and executor;
//   - a token whose list is all -1, and topk 0: a zero row, lse its sink
//     (-inf without one);
//   - the refusals, each naming mask.indices[t][i] (or mask.index_stride)
//     and writing nothing: a position past the token, before its window,
//     past its sequence's cache, negative other than -1, listed twice; and
//     the tensor calls, which have no lists.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include <rope/attention.hpp>

#include "executors.hpp"
#include "kv_elements.hpp"
#include "mla_oracle.hpp"
#include "support.hpp"

namespace {

using namespace mla_test;  // NOLINT: the suites' shared fixture
using rope::View;
using rope_test::element_name;
using rope_test::for_each_element;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr std::int32_t kPadding = std::int32_t(1) << 30;  // past index_stride's topk: never read

// Lists of a call: topk entries per token at t * stride, then padding.
struct Lists {
  std::size_t topk = 0, stride = 0;
  std::vector<std::int32_t> idx;
  ra::Mask mask(ra::Mask m) const {
    m.indices = idx.data();
    m.topk = topk;
    m.index_stride = stride;
    return m;
  }
};

// Per token, up to `keep` of the keys its mask lets it see, drawn at random
// (all of them with keep = -1), shuffled among -1 entries (`blanks` of
// them); a token listed as all -1 when `empty_token` names it.
Lists make_lists(const Layout& lay, const ra::Mask& m, std::size_t topk, long keep, std::size_t blanks,
                 std::uint32_t seed, long empty_token = -1) {
  Lists l;
  l.topk = topk;
  l.stride = topk + 3;
  l.idx.assign(lay.tokens() * l.stride, kPadding);
  std::mt19937 gen(seed);
  for (std::size_t t = 0; t < lay.tokens(); ++t) {
    std::vector<std::int64_t> seen = keys_of(lay, m, t);
    std::shuffle(seen.begin(), seen.end(), gen);
    if (keep >= 0 && seen.size() > static_cast<std::size_t>(keep)) seen.resize(static_cast<std::size_t>(keep));
    if (static_cast<long>(t) == empty_token) seen.clear();
    std::vector<std::int32_t> row(seen.begin(), seen.end());
    row.resize(std::min(topk, row.size() + blanks), -1);
    EXPECT_LE(row.size(), topk) << "a list longer than topk";
    row.resize(topk, -1);
    std::shuffle(row.begin(), row.end(), gen);
    std::copy(row.begin(), row.end(), l.idx.begin() + static_cast<std::ptrdiff_t>(t * l.stride));
  }
  return l;
}

// The most keys a token of the layout sees under m.
std::size_t widest(const Layout& lay, const ra::Mask& m) {
  std::size_t w = 0;
  for (std::size_t t = 0; t < lay.tokens(); ++t) w = std::max(w, keys_of(lay, m, t).size());
  return w;
}

bool decode_token(const Layout& lay, std::size_t t) {
  const std::size_t b = lay.sequence_of(t);
  return lay.q_starts[b + 1] - lay.q_starts[b] == 1;
}

// ---- MLA ----

// Decode tokens over more than a block of 256 keys and over a few, a chunk
// of 9 after 291 keys, a prompt of 40 (two blocks of rows when dense), a
// sequence without new tokens.
Model mla_model(std::uint32_t seed) {
  return Model({16, 40, 8, 12, 10}, {{1, 290}, {40, 40}, {9, 300}, {0, 10}, {1, 1}, {1, 37}}, 8, seed);
}

std::vector<std::pair<std::string, Call>> sparse_calls(const Model& m) {
  std::vector<std::pair<std::string, Call>> out;
  Call c;
  c.logits.scale = m.scale;
  c.kv_split = 5;
  out.emplace_back("split 5", c);
  c.logits.softcap = 2.5;
  c.logits.sinks.assign(m.d.heads, 1.0);
  c.logits.sinks[3] = -kInf;
  c.kv_split = 7;
  out.emplace_back("split 7, softcap, sinks", c);
  c = {};
  c.logits.scale = m.scale;
  c.mask.window = 50;
  out.emplace_back("window 50", c);
  c.mask.causal = false;
  c.kv_split = 16;
  out.emplace_back("not causal, window 50, split 16", c);
  return out;
}

TEST(MlaSparse, MatchesTheOracleOverTheListedKeys) {
  const Model m = mla_model(3);
  for_each_element([&](auto e) {
    using E = decltype(e);
    Store<E> st(m.lay, m.d);
    const std::vector<float> q_pe = write(m, st);
    const Stored rows = stored(m, st);
    std::uint32_t seed = 100;
    for (auto [name, c] : sparse_calls(m)) {
      for (const long keep : {1L, 12L, 30L}) {
        // A decode token's list of 30 is in parts of 5 and 7 entries.
        const Lists l = make_lists(m.lay, c.mask, 36, keep, 5, ++seed, /*empty_token=*/3);
        c.mask = l.mask(c.mask);
        const std::string what = std::string(element_name<E>()) + ", " + name + ", keep " + std::to_string(keep);
        const Result got = attend(m, st, q_pe, c);
        EXPECT_LE(expect_near(m, got, oracle(m, rows, q_pe, c), what), 1.0) << what;
        c.mask.indices = nullptr;
      }
    }
  });
}

// Lists of every key each token sees, shuffled among -1 entries: MLA's
// decode tokens give the dense call's bytes (out and lse) with the same
// kv_split; a prompt's tokens, one item each instead of blocks of tokens,
// are within the oracle's bound.
TEST(MlaSparse, FullListsAreTheDenseCallsBytesForDecodeTokens) {
  const Model m = mla_model(4);
  const std::size_t H = m.d.heads, L = m.d.latent;
  for_each_element([&](auto e) {
    using E = decltype(e);
    Store<E> st(m.lay, m.d);
    const std::vector<float> q_pe = write(m, st);
    const Stored rows = stored(m, st);
    for (const std::size_t split : {std::size_t{5}, std::size_t{64}, std::size_t{512}}) {
      Call c;
      c.logits.scale = m.scale;
      c.logits.sinks.assign(H, 0.5);
      c.kv_split = split;
      const Result dense = attend(m, st, q_pe, c);
      const Lists l =
          make_lists(m.lay, c.mask, widest(m.lay, c.mask) + 4, -1, 4, 7 + static_cast<std::uint32_t>(split));
      c.mask = l.mask(c.mask);
      const Result sparse = attend(m, st, q_pe, c);
      const std::string what = std::string(element_name<E>()) + ", split " + std::to_string(split);
      std::size_t decode = 0;
      for (std::size_t t = 0; t < m.lay.tokens(); ++t) {
        if (!decode_token(m.lay, t)) continue;
        ++decode;
        EXPECT_EQ(std::memcmp(&sparse.out[t * H * L], &dense.out[t * H * L], H * L * sizeof(float)), 0)
            << what << ": token " << t;
        EXPECT_EQ(std::memcmp(&sparse.lse[t * H], &dense.lse[t * H], H * sizeof(float)), 0) << what << ": token " << t;
      }
      EXPECT_EQ(decode, 3u);
      EXPECT_LE(expect_near(m, sparse, oracle(m, rows, q_pe, c), what), 1.0) << what;
    }
  });
}

TEST(MlaSparse, SameBytesForAnyThreadCountAndExecutor) {
  const Model m = mla_model(5);
  rope_test::ThreadPool pool(3);
  for_each_element([&](auto e) {
    using E = decltype(e);
    Store<E> st(m.lay, m.d);
    const std::vector<float> q_pe = write(m, st);
    Call c = sparse_calls(m)[1].second;
    const Lists l = make_lists(m.lay, c.mask, 40, 33, 3, 9);
    c.mask = l.mask(c.mask);
    const Result one = attend(m, st, q_pe, c);
    for (const rope::Threads& t : {rope::Threads(2), rope::Threads(3), rope::Threads(pool.executor(4))}) {
      c.threads = t;
      EXPECT_TRUE(attend(m, st, q_pe, c).same_bytes(one)) << element_name<E>();
    }
  });
}

// A token whose list is all -1, and topk 0 (no token sees anything): zero
// rows, lse the head's sink, -inf where it has none.
TEST(MlaSparse, TokensThatSeeNothing) {
  const Model m = mla_model(6);
  const std::size_t H = m.d.heads, L = m.d.latent;
  Store<float> st(m.lay, m.d);
  const std::vector<float> q_pe = write(m, st);
  Call c;
  c.logits.scale = m.scale;
  c.logits.sinks.assign(H, 0.75);
  c.logits.sinks[2] = -kInf;
  const Lists l = make_lists(m.lay, c.mask, 8, 5, 2, 11, /*empty_token=*/41);
  for (const bool none : {false, true}) {
    c.mask = l.mask(ra::Mask{});
    if (none) c.mask.topk = 0;
    const Result r = attend(m, st, q_pe, c);
    for (std::size_t t = 0; t < m.lay.tokens(); ++t) {
      if (!none && t != 41) continue;
      for (std::size_t h = 0; h < H; ++h) {
        for (std::size_t x = 0; x < L; ++x) ASSERT_EQ(r.out[(t * H + h) * L + x], 0.0f) << "token " << t;
        EXPECT_EQ(r.lse[t * H + h], h == 2 ? -std::numeric_limits<float>::infinity() : 0.75f) << "token " << t;
      }
    }
    EXPECT_LE(expect_near(m, r, oracle(m, stored(m, st), q_pe, c), none ? "topk 0" : "token 41 all -1"), 1.0);
  }
}

// ---- GQA ----

struct Gqa {
  std::size_t q_heads = 4, kv_heads = 2, d = 24, dv = 20;
};

// K, V (per sequence: [length, kv_heads, d or dv]) and Q ([tokens, q_heads,
// d]) of a layout, and a paged cache of E holding K and V rounded once.
template <class E>
struct GqaStore {
  Gqa g;
  const Layout& lay;
  std::vector<float> q;
  std::vector<E> kd, vd;
  std::vector<float> ks, vs;
  ra::PagedCache<E> cache;

  GqaStore(const Layout& l, std::uint32_t seed) : lay(l) {
    q = rope_test::random_vector<float>(lay.tokens() * g.q_heads * g.d, seed, 1.5);
    const std::size_t slots = lay.pages * lay.page_size;
    kd.assign(slots * g.kv_heads * g.d, poison<E>());
    vd.assign(slots * g.kv_heads * g.dv, poison<E>());
    if (rope::KvElement<E>::kScaled) {
      ks.assign(slots * g.kv_heads, kNaN);
      vs.assign(slots * g.kv_heads, kNaN);
    }
    float* k_scales = ks.empty() ? nullptr : ks.data();
    float* v_scales = vs.empty() ? nullptr : vs.data();
    cache.k = ra::PagePool<E>::nhd(kd.data(), lay.pages, lay.page_size, g.kv_heads, g.d, k_scales);
    cache.v = ra::PagePool<E>::hnd(vd.data(), lay.pages, lay.page_size, g.kv_heads, g.dv, v_scales);
    for (std::size_t b = 0; b < lay.sequences(); ++b) {
      const auto len = static_cast<std::size_t>(lay.lengths[b]);
      const auto k = rope_test::random_vector<float>(len * g.kv_heads * g.d, seed + 10 + 2 * b, 1.5);
      const auto v = rope_test::random_vector<float>(len * g.kv_heads * g.dv, seed + 11 + 2 * b, 2.0);
      for (std::size_t j = 0; j < len; ++j) {
        const std::size_t slot = lay.slot(b, static_cast<std::int64_t>(j));
        for (std::size_t h = 0; h < g.kv_heads; ++h) {
          rope::store_kv_row(&k[(j * g.kv_heads + h) * g.d], g.d, cache.k.row(slot, h),
                             k_scales != nullptr ? cache.k.scale(slot, h) : nullptr);
          rope::store_kv_row(&v[(j * g.kv_heads + h) * g.dv], g.dv, cache.v.row(slot, h),
                             v_scales != nullptr ? cache.v.scale(slot, h) : nullptr);
        }
      }
    }
  }
  // A stored row read back exactly (int8: code times its row's scale).
  std::vector<LD> row(bool key, std::size_t slot, std::size_t h) const {
    const ra::PagePool<E>& p = key ? cache.k : cache.v;
    const E* r = p.row(slot, h);
    std::vector<LD> out(p.head_dim);
    for (std::size_t c = 0; c < out.size(); ++c) {
      out[c] = static_cast<LD>(rope_test::widen(r[c]));
      if constexpr (rope::KvElement<E>::kScaled) out[c] *= static_cast<LD>(*p.scale(slot, h));
    }
    return out;
  }
  ra::Shape shape(std::size_t kv_split) const {
    ra::Shape s = ra::Shape::of(cache, g.q_heads);
    s.kv_split = kv_split;
    return s;
  }
  Result attend(const Call& c) const {
    ra::Plan p;
    ra::plan(p, shape(c.kv_split), lay.batch(), c.threads);
    Result r;
    r.out.assign(lay.tokens() * g.q_heads * g.dv, -777.0f);
    r.lse.assign(lay.tokens() * g.q_heads, -555.0f);
    ra::attend(p, cache, View<const float>::token_major(q.data(), lay.tokens(), g.q_heads, g.d),
               View<float>::token_major(r.out.data(), lay.tokens(), g.q_heads, g.dv), c.logits, c.mask, r.lse.data());
    return r;
  }
};

// The GQA oracle over the listed (or visible) keys of the stored rows, and
// rope's rows against it; returns the largest error relative to its bound.
template <class E>
double gqa_expect_near(const GqaStore<E>& st, const Call& c, const Result& got, const std::string& what) {
  const Gqa& g = st.g;
  const LD scale = scale_of(c.logits, g.d), cap = cap_of(c.logits);
  const double parts_per = 1.0 / static_cast<double>(std::min<std::size_t>(c.kv_split, 64));
  double worst = 0;
  int reported = 0;
  for (std::size_t t = 0; t < st.lay.tokens(); ++t) {
    const std::size_t b = st.lay.sequence_of(t);
    for (std::size_t h = 0; h < g.q_heads; ++h) {
      const std::size_t kv = h / (g.q_heads / g.kv_heads), th = t * g.q_heads + h;
      std::vector<LD> s, err;
      at::Mat v;
      for (const std::int64_t j : keys_of(st.lay, c.mask, t)) {
        const std::size_t slot = st.lay.slot(b, j);
        const std::vector<LD> k = st.row(true, slot, kv);
        LD dot = 0, mag = 0;
        for (std::size_t x = 0; x < g.d; ++x) {
          const LD p = static_cast<LD>(st.q[th * g.d + x]) * k[x];
          dot += p;
          mag += std::fabs(p);
        }
        const LD raw = scale * dot;
        s.push_back(cap > 0 ? cap * std::tanh(raw / cap) : raw);
        err.push_back(through_cap(raw, scale * (g.d + 8) * kEps * mag + 2 * kEps * std::fabs(raw), cap));
        v.push_back(st.row(false, slot, kv));
      }
      const double n = static_cast<double>(s.size());
      const double parts = n * parts_per + n / static_cast<double>(c.kv_split) + 3;
      const RowExpect want = softmax_expect(s, err, v, g.dv, sink_of(c.logits, h), parts);
      for (std::size_t x = 0; x < g.dv; ++x) {
        const double e = static_cast<double>(std::fabs(static_cast<LD>(got.out[th * g.dv + x]) - want.out[x]));
        if (want.bound[x] > 0) worst = std::max(worst, e / want.bound[x]);
        if (!(e <= want.bound[x]) && reported++ < 6) {
          ADD_FAILURE() << what << ": token " << t << " head " << h << " channel " << x << ": got "
                        << got.out[th * g.dv + x] << " want " << static_cast<double>(want.out[x]) << " bound "
                        << want.bound[x];
        }
      }
      const double gl = got.lse[th];
      const bool lse_ok = std::isinf(static_cast<double>(want.lse))
                              ? gl == static_cast<double>(want.lse)
                              : std::fabs(static_cast<LD>(gl) - want.lse) <= want.lse_bound;
      if (!lse_ok && reported++ < 6) {
        ADD_FAILURE() << what << ": lse token " << t << " head " << h << ": got " << gl << " want "
                      << static_cast<double>(want.lse) << " bound " << want.lse_bound;
      }
    }
  }
  return worst;
}

// Decode tokens (one over 150 keys), a chunk of 7 after 33, a prompt of
// 20, a sequence without new tokens, a one-key sequence; pages of 8.
Layout gqa_layout(std::uint32_t seed) {
  return make_layout({{1, 150}, {7, 40}, {0, 9}, {20, 20}, {1, 1}, {1, 23}}, 8, seed);
}

std::vector<std::pair<std::string, Call>> gqa_calls() {
  std::vector<std::pair<std::string, Call>> out;
  Call c;
  c.kv_split = 5;
  out.emplace_back("default scale, split 5", c);
  c.logits.scale = 0.3;
  c.logits.softcap = 2.0;
  c.logits.sinks = {0.5, -kInf, 2.0, -1.0};
  c.kv_split = 16;
  out.emplace_back("scale 0.3, softcap 2, sinks, split 16", c);
  c = {};
  c.mask.window = 30;
  c.kv_split = 7;
  out.emplace_back("window 30, split 7", c);
  c.mask.causal = false;
  out.emplace_back("not causal, window 30, split 7", c);
  return out;
}

TEST(GqaSparse, MatchesTheOracleOverTheListedKeys) {
  const Layout lay = gqa_layout(21);
  for_each_element([&](auto e) {
    using E = decltype(e);
    const GqaStore<E> st(lay, 22);
    std::uint32_t seed = 200;
    for (auto [name, c] : gqa_calls()) {
      for (const long keep : {1L, 9L, 25L}) {
        const Lists l = make_lists(lay, c.mask, 30, keep, 4, ++seed, /*empty_token=*/2);
        c.mask = l.mask(c.mask);
        const std::string what = std::string(element_name<E>()) + ", " + name + ", keep " + std::to_string(keep);
        EXPECT_LE(gqa_expect_near(st, c, st.attend(c), what), 1.0) << what;
        c.mask.indices = nullptr;
      }
    }
  });
}

// Lists of every key each token sees, shuffled among -1 entries: the dense
// call's bytes, for every token (decode tokens split alike with the same
// kv_split; a prompt's tokens one item each either way).
TEST(GqaSparse, FullListsAreTheDenseCallsBytes) {
  const Layout lay = gqa_layout(23);
  for_each_element([&](auto e) {
    using E = decltype(e);
    const GqaStore<E> st(lay, 24);
    for (const std::size_t split : {std::size_t{5}, std::size_t{64}, std::size_t{512}}) {
      for (const bool causal : {true, false}) {
        Call c;
        c.kv_split = split;
        c.mask.causal = causal;
        c.logits.sinks = {0.5, -kInf, 2.0, -1.0};
        const Result dense = st.attend(c);
        const Lists l = make_lists(lay, c.mask, widest(lay, c.mask) + 3, -1, 3, 30 + static_cast<std::uint32_t>(split));
        c.mask = l.mask(c.mask);
        const Result sparse = st.attend(c);
        EXPECT_TRUE(sparse.same_bytes(dense)) << element_name<E>() << ", split " << split << ", causal " << causal;
      }
    }
  });
}

TEST(GqaSparse, SameBytesForAnyThreadCountAndExecutor) {
  const Layout lay = gqa_layout(25);
  rope_test::ThreadPool pool(3);
  rope_test::ReverseExecutor reverse;
  for_each_element([&](auto e) {
    using E = decltype(e);
    const GqaStore<E> st(lay, 26);
    Call c = gqa_calls()[1].second;
    const Lists l = make_lists(lay, c.mask, 30, 22, 4, 27);
    c.mask = l.mask(c.mask);
    const Result one = st.attend(c);
    for (const rope::Threads& t :
         {rope::Threads(2), rope::Threads(3), rope::Threads(pool.executor(3)), rope::Threads(reverse.executor(5))}) {
      c.threads = t;
      EXPECT_TRUE(st.attend(c).same_bytes(one)) << element_name<E>();
    }
  });
}

TEST(GqaSparse, TokensThatSeeNothing) {
  const Layout lay = gqa_layout(28);
  const GqaStore<float> st(lay, 29);
  const std::size_t H = st.g.q_heads, dv = st.g.dv;
  Call c;
  c.logits.sinks = {0.5, -kInf, 2.0, -1.0};
  const Lists l = make_lists(lay, c.mask, 6, 4, 2, 31, /*empty_token=*/9);
  for (const bool none : {false, true}) {
    c.mask = l.mask(ra::Mask{});
    if (none) c.mask.topk = 0;
    const Result r = st.attend(c);
    for (std::size_t t = 0; t < lay.tokens(); ++t) {
      if (!none && t != 9) continue;
      for (std::size_t h = 0; h < H; ++h) {
        for (std::size_t x = 0; x < dv; ++x) ASSERT_EQ(r.out[(t * H + h) * dv + x], 0.0f) << "token " << t;
        EXPECT_EQ(r.lse[t * H + h], static_cast<float>(c.logits.sinks[h])) << "token " << t;
      }
    }
    EXPECT_LE(gqa_expect_near(st, c, r, none ? "topk 0" : "token 9 all -1"), 1.0);
  }
}

// ---- refusals ----

// A call of either kind with a list as `change` leaves it, the message,
// and whether any byte of the cache, out or lse changed.
struct Refusal {
  std::string message;
  bool wrote = false;
};

Refusal refused_mla(const std::function<void(Lists&, ra::Mask&)>& change) {
  static const Model m = mla_model(8);
  Store<std::int8_t> st(m.lay, m.d);
  const std::vector<float> q_pe = write(m, st);
  Call c;
  c.logits.scale = m.scale;
  Lists l = make_lists(m.lay, c.mask, 12, 6, 2, 41);
  change(l, c.mask);
  c.mask.indices = l.idx.data();
  c.mask.topk = l.topk;
  if (c.mask.index_stride == 0) c.mask.index_stride = l.stride;
  const Store<std::int8_t> before(st);
  Refusal r;
  Result out{std::vector<float>(m.lay.tokens() * m.d.heads * m.d.latent, -777.0f),
             std::vector<float>(m.lay.tokens() * m.d.heads, -555.0f)};
  const Result out_before = out;
  ra::Plan p;
  ra::plan(p, m.shape(), m.lay.batch());
  r.message = rope_test::thrown_message([&] {
    ra::attend(p, st.cache, View<const float>::token_major(m.q_lat.data(), m.lay.tokens(), m.d.heads, m.d.latent),
               View<const float>::token_major(q_pe.data(), m.lay.tokens(), m.d.heads, m.d.rope),
               View<float>::token_major(out.out.data(), m.lay.tokens(), m.d.heads, m.d.latent), c.logits, c.mask,
               out.lse.data());
  });
  r.wrote = !st.same_bytes(before) || !out.same_bytes(out_before);
  return r;
}

Refusal refused_gqa(const std::function<void(Lists&, ra::Mask&)>& change) {
  static const Layout lay = mla_model(8).lay;  // the same batch as the MLA refusals
  GqaStore<std::int8_t> st(lay, 43);
  const auto bytes = [&] {
    std::vector<unsigned char> b;
    auto add = [&](const void* p, std::size_t n) {
      const auto* c = static_cast<const unsigned char*>(p);
      if (n > 0) b.insert(b.end(), c, c + n);
    };
    add(st.kd.data(), st.kd.size() * sizeof(std::int8_t));
    add(st.vd.data(), st.vd.size() * sizeof(std::int8_t));
    add(st.ks.data(), st.ks.size() * sizeof(float));
    add(st.vs.data(), st.vs.size() * sizeof(float));
    return b;
  };
  Call c;
  Lists l = make_lists(lay, c.mask, 12, 6, 2, 41);
  change(l, c.mask);
  c.mask.indices = l.idx.data();
  c.mask.topk = l.topk;
  if (c.mask.index_stride == 0) c.mask.index_stride = l.stride;
  const std::vector<unsigned char> before = bytes();
  Refusal r;
  Result out{std::vector<float>(lay.tokens() * st.g.q_heads * st.g.dv, -777.0f),
             std::vector<float>(lay.tokens() * st.g.q_heads, -555.0f)};
  const Result out_before = out;
  ra::Plan p;
  ra::plan(p, st.shape(512), lay.batch());
  r.message = rope_test::thrown_message([&] {
    ra::attend(p, st.cache, View<const float>::token_major(st.q.data(), lay.tokens(), st.g.q_heads, st.g.d),
               View<float>::token_major(out.out.data(), lay.tokens(), st.g.q_heads, st.g.dv), c.logits, c.mask,
               out.lse.data());
  });
  r.wrote = bytes() != before || !out.same_bytes(out_before);
  return r;
}

struct ListRefusal {
  const char* what;
  std::function<void(Lists&, ra::Mask&)> change;
  std::string argument;  // after "rope::attention::attend: "
  std::string also;      // somewhere in the message
};

// The batch of mla_model: token 0 a decode token at position 289 (290
// keys), tokens 1 .. 40 a prompt at 0 .. 39, token 41 .. 49 a chunk at 291
// .. 299, token 50 at 0 of a one-key sequence.
std::vector<ListRefusal> list_refusals() {
  const auto at = [](Lists& l, std::size_t t, std::size_t i) -> std::int32_t& { return l.idx[t * l.stride + i]; };
  return {
      {"the token's own position + 1", [=](Lists& l, ra::Mask&) { at(l, 5, 2) = 5; }, "mask.indices[5][2]",
       "new token 5 sees (in [0, 5)"},
      {"past the cache, not causal",
       [=](Lists& l, ra::Mask& m) {
         m.causal = false;
         at(l, 0, 7) = 290;
       },
       "mask.indices[0][7]", "290"},
      {"before the window",
       [=](Lists& l, ra::Mask& m) {
         m.window = 10;
         l = make_lists(mla_model(8).lay, m, 12, 6, 2, 41);
         at(l, 43, 1) = 283;  // token 43 is at 293: it sees [284, 294)
       },
       "mask.indices[43][1]", "[284, 294)"},
      {"negative other than -1", [=](Lists& l, ra::Mask&) { at(l, 45, 0) = -2; }, "mask.indices[45][0]", "-2"},
      {"the largest int32", [=](Lists& l, ra::Mask&) { at(l, 50, 11) = std::numeric_limits<std::int32_t>::max(); },
       "mask.indices[50][11]", "2147483647"},
      {"listed twice",
       [=](Lists& l, ra::Mask&) {
         for (std::size_t i = 0; i < 12; ++i) at(l, 0, i) = -1;
         at(l, 0, 3) = 17;
         at(l, 0, 9) = 17;
       },
       "mask.indices[0][9]", "not listed before"},
      {"index_stride below topk", [=](Lists& l, ra::Mask& m) { m.index_stride = l.topk - 1; }, "mask.index_stride",
       "at least mask.topk"},
  };
}

TEST(SparseRefusals, MlaAndGqaNameTheEntryAndWriteNothing) {
  for (const ListRefusal& e : list_refusals()) {
    for (const bool mla : {true, false}) {
      SCOPED_TRACE(std::string(mla ? "MLA: " : "GQA: ") + e.what);
      const Refusal r = mla ? refused_mla(e.change) : refused_gqa(e.change);
      const std::string head = "rope::attention::attend: " + e.argument + " must be ";
      EXPECT_TRUE(r.message.rfind(head, 0) == 0 || r.message.rfind("out_of_range: " + head, 0) == 0)
          << "want " << head << "\n got " << r.message;
      EXPECT_NE(r.message.find(e.also), std::string::npos) << r.message;
      EXPECT_FALSE(r.wrote);
    }
  }
  // The same lists unchanged are taken.
  EXPECT_EQ(refused_mla([](Lists&, ra::Mask&) {}).message, "no exception");
  EXPECT_EQ(refused_gqa([](Lists&, ra::Mask&) {}).message, "no exception");
}

// The tensor calls have no lists: a mask with indices is refused by name.
TEST(SparseRefusals, TensorCallsHaveNoLists) {
  const std::vector<float> q(3 * 2 * 8, 0.5f), k(4 * 2 * 8, 0.25f), v(4 * 2 * 8, 1.0f);
  std::vector<float> out(3 * 2 * 8, -1.0f);
  const std::vector<float> before = out;
  const std::int32_t idx[2] = {0, 1};
  ra::SoftmaxOptions o;
  o.mask.indices = idx;
  o.mask.topk = 2;
  const std::string m = rope_test::thrown_message([&] {
    ra::softmax<float>(
        View<const float>::token_major(q.data(), 3, 2, 8), View<const float>::token_major(k.data(), 4, 2, 8),
        View<const float>::token_major(v.data(), 4, 2, 8), View<float>::token_major(out.data(), 3, 2, 8), {}, o);
  });
  EXPECT_EQ(m.rfind("rope::attention::softmax: options.mask.indices must be ", 0), 0u) << m;
  EXPECT_EQ(out, before);
}

}  // namespace
