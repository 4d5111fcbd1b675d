// The refusals of MLA's append and attend (attention/mla_append.hpp,
// mla_attend.hpp) and of the latent cache's checks (cache.hpp): each names
// its argument as the caller spells it ("<function>: <argument> must be"),
// and leaves every buffer as it was (the cache's rows and scales, c_kv,
// k_pe, q_pe, q_pe_out, q_lat, out and lse, compared whole), over every
// cache type. One table per call holds the refusals: a missing
// logits.scale, views of the wrong shape or overlapping what they must
// not, a plan made for another shape, a latent cache of bad geometry,
// options MLA's append has no use for; then a new token's page that
// another sequence reads, and the one-sequence plan past its capacity.
// Sparse lists: test_attention_sparse.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include <rope/attention.hpp>
#include <rope/pair_axes.hpp>

#include "kv_elements.hpp"
#include "mla_oracle.hpp"
#include "support.hpp"

namespace {

using namespace mla_test;  // NOLINT: the suite's own fixture
using rope::View;
using rope_test::element_name;
using rope_test::for_each_element;

// A decode token after 12 keys, a chunk of 5 after 3, a sequence without
// new tokens; 4 heads over 24 + 8.
const Model& model() {
  static const Model m({4, 24, 8, 6, 5}, {{1, 13}, {5, 8}, {0, 6}}, 8, 3);
  return m;
}

// Every buffer a call could write, each with room for views larger than
// the call's (twice its size), and the cache.
template <class E>
struct World {
  const Model& m = model();
  Store<E> st{m.lay, m.d};
  std::vector<float> c_kv, k_pe, q_pe, q_pe_out, q_lat, out, lse;

  World() {
    const std::size_t T = m.lay.tokens(), H = m.d.heads, L = m.d.latent, R = m.d.rope;
    c_kv = rope_test::random_vector<float>(2 * T * L, 1);
    k_pe = rope_test::random_vector<float>(2 * T * R, 2);
    q_pe = rope_test::random_vector<float>(2 * T * H * R, 3);
    q_pe_out.assign(2 * T * H * R, -7.5f);
    q_lat = rope_test::random_vector<float>(2 * T * H * L, 4);
    out.assign(2 * T * H * L, -777.0f);
    lse.assign(2 * T * H, -555.0f);
  }
  std::vector<unsigned char> bytes() const {
    std::vector<unsigned char> b;
    auto add = [&](const void* p, std::size_t n) {
      const auto* c = static_cast<const unsigned char*>(p);
      if (n > 0) b.insert(b.end(), c, c + n);
    };
    add(st.data.data(), st.data.size() * sizeof(E));
    add(st.scales.data(), st.scales.size() * sizeof(float));
    for (const auto* v : {&c_kv, &k_pe, &q_pe, &q_pe_out, &q_lat, &out, &lse})
      add(v->data(), v->size() * sizeof(float));
    return b;
  }
};

// One call's arguments, as an entry of a table leaves them.
template <class E>
struct Args {
  ra::Shape shape;
  bool break_plan = false;  // a plan() into the plan fails after one succeeded
  ra::LatentCache<E> cache;
  View<const float> c_kv, k_pe, q_lat;
  View<float> q_pe, q_pe_out, out;
  float* lse = nullptr;
  ra::AppendOptions o;
  ra::Logits logits;
  ra::Mask mask;
};

template <class E>
Args<E> args_of(World<E>& w) {
  const Model& m = w.m;
  const std::size_t T = m.lay.tokens(), H = m.d.heads, L = m.d.latent, R = m.d.rope;
  Args<E> a;
  a.shape = m.shape();
  a.cache = w.st.cache;
  a.c_kv = View<const float>::token_major(w.c_kv.data(), T, 1, L);
  a.k_pe = View<const float>::token_major(w.k_pe.data(), T, 1, R);
  a.q_pe = View<float>::token_major(w.q_pe.data(), T, H, R);
  a.q_pe_out = View<float>::token_major(w.q_pe_out.data(), T, H, R);
  a.q_lat = View<const float>::token_major(w.q_lat.data(), T, H, L);
  a.out = View<float>::token_major(w.out.data(), T, H, L);
  a.lse = w.lse.data();
  a.o = m.append_options();
  a.logits.scale = m.scale;
  return a;
}

template <class E>
struct Entry {
  const char* what;
  std::function<void(Args<E>&, World<E>&)> change;
  std::string argument;  // opens the message after the function's name
  std::string also;      // somewhere in the message ("": nothing more)
};

enum class Fn { append, attend };

// The message of the call with the arguments as `change` leaves them; every
// byte of the world as it was.
template <class E>
std::string refused(Fn fn, const std::function<void(Args<E>&, World<E>&)>& change) {
  World<E> w;
  Args<E> a = args_of(w);
  change(a, w);
  ra::Plan p;
  EXPECT_EQ(rope_test::thrown_message([&] { ra::plan(p, a.shape, w.m.lay.batch()); }), "no exception")
      << "the plan is not what is refused";
  if (a.break_plan) {
    ra::Shape bad = a.shape;
    bad.q_heads = 0;
    EXPECT_NE(rope_test::thrown_message([&] { ra::plan(p, bad, w.m.lay.batch()); }), "no exception");
  }
  const std::vector<unsigned char> before = w.bytes();
  const std::string msg = rope_test::thrown_message([&] {
    if (fn == Fn::append) {
      ra::append(p, a.cache, a.c_kv, a.k_pe, a.q_pe, a.q_pe_out, a.o);
    } else {
      ra::attend(p, a.cache, a.q_lat, View<const float>(a.q_pe), a.out, a.logits, a.mask, a.lse);
    }
  });
  EXPECT_TRUE(w.bytes() == before) << "a refused call wrote: " << msg;
  return msg;
}

template <class E>
void expect_refusals(Fn fn, const std::vector<Entry<E>>& entries) {
  const std::string head = fn == Fn::append ? "rope::attention::append: " : "rope::attention::attend: ";
  for (const Entry<E>& e : entries) {
    SCOPED_TRACE(std::string(element_name<E>()) + ": " + e.what);
    const std::string m = refused<E>(fn, e.change);
    const std::string want = head + e.argument + " must be ";
    EXPECT_TRUE(m.rfind(want, 0) == 0 || m.rfind("out_of_range: " + want, 0) == 0) << "want " << want << "\n got " << m;
    if (!e.also.empty()) {
      EXPECT_NE(m.find(e.also), std::string::npos) << m;
    }
  }
}

template <class T>
View<T> reshaped(const View<T>& v, std::size_t tokens, std::size_t heads, std::size_t dim) {
  return View<T>(v.data, tokens, heads, dim, heads * dim, dim);
}

// What every MLA call refuses alike: a plan that is not one, or made for
// another shape; a latent cache of bad geometry.
template <class E>
std::vector<Entry<E>> plan_and_cache_entries() {
  using A = Args<E>&;
  using W = World<E>&;
  std::vector<Entry<E>> v = {
      {"a failed plan", [](A a, W) { a.break_plan = true; }, "plan", "no plan"},
      {"kv_heads 2", [](A a, W) { a.shape.kv_heads = 2; }, "the plan's shape.kv_heads", "1 (MLA"},
      {"head_dim not latent + rope", [](A a, W) { a.shape.head_dim += 2; }, "the plan's shape.head_dim", "32"},
      {"v_head_dim not latent", [](A a, W) { a.shape.v_head_dim = 16; }, "the plan's shape.v_head_dim", "24"},
      {"v_head_dim 0 (head_dim)", [](A a, W) { a.shape.v_head_dim = 0; }, "the plan's shape.v_head_dim", ""},
      {"page_size", [](A a, W) { a.shape.page_size = 16; }, "the plan's shape.page_size", ""},
      {"pages", [](A a, W) { a.shape.pages += 1; }, "the plan's shape.pages", ""},
      {"rope_dim odd", [](A a, W) { a.cache.rope_dim = 7; }, "cache.rope_dim", "even"},
      {"rope_dim 0", [](A a, W) { a.cache.rope_dim = 0; }, "cache.rope_dim", ""},
      {"latent_dim 0", [](A a, W) { a.cache.latent_dim = 0; }, "cache.latent_dim", ""},
      {"pages 0", [](A a, W) { a.cache.pages = 0; }, "cache.pages", ""},
      {"page_size 0", [](A a, W) { a.cache.page_size = 0; }, "cache.page_size", ""},
      {"data null", [](A a, W) { a.cache.data = nullptr; }, "cache.data", ""},
      {"token_stride below the width", [](A a, W) { a.cache.token_stride = 31; }, "cache.token_stride", "31"},
      {"pages overlapping", [](A a, W) { a.cache.page_stride -= 1; }, "cache.page_stride", ""},
  };
  if constexpr (rope::KvElement<E>::kScaled) {
    v.push_back({"int8 without scales", [](A a, W) { a.cache.scales = nullptr; }, "cache.scales", "non-null"});
  } else {
    v.push_back({"scales for a float cache", [](A a, W w) { a.cache.scales = w.lse.data(); }, "cache.scales", "null"});
  }
  return v;
}

template <class E>
std::vector<Entry<E>> append_entries() {
  using A = Args<E>&;
  using W = World<E>&;
  std::vector<Entry<E>> v = plan_and_cache_entries<E>();
  const std::size_t T = model().lay.tokens(), H = model().d.heads, L = model().d.latent, R = model().d.rope;
  std::vector<Entry<E>> more = {
      {"c_kv tokens", [=](A a, W) { a.c_kv = reshaped(a.c_kv, T - 1, 1, L); }, "c_kv.tokens", ""},
      {"c_kv heads", [=](A a, W) { a.c_kv = reshaped(a.c_kv, T, 2, L); }, "c_kv.heads", ""},
      {"c_kv head_dim", [=](A a, W) { a.c_kv = reshaped(a.c_kv, T, 1, L + R); }, "c_kv.head_dim", ""},
      {"k_pe head_dim", [=](A a, W) { a.k_pe = reshaped(a.k_pe, T, 1, R + 2); }, "k_pe.head_dim", ""},
      {"k_pe tokens", [=](A a, W) { a.k_pe = reshaped(a.k_pe, T + 1, 1, R); }, "k_pe.tokens", ""},
      {"q_pe heads", [=](A a, W) { a.q_pe = reshaped(a.q_pe, T, H - 1, R); }, "q_pe.heads", ""},
      {"q_pe head_dim", [=](A a, W) { a.q_pe = reshaped(a.q_pe, T, H, R - 2); }, "q_pe.head_dim", ""},
      {"q_pe_out tokens", [=](A a, W) { a.q_pe_out = reshaped(a.q_pe_out, T - 1, H, R); }, "q_pe_out.tokens", ""},
      {"q_pe_out head_dim", [=](A a, W) { a.q_pe_out = reshaped(a.q_pe_out, T, H, R + 2); }, "q_pe_out.head_dim", ""},
      {"q_pe_out over c_kv", [=](A a, W w) { a.q_pe_out = View<float>::token_major(w.c_kv.data() + 3, T, H, R); },
       "q_pe_out", "c_kv"},
      {"q_pe_out over k_pe", [=](A a, W w) { a.q_pe_out = View<float>::token_major(w.k_pe.data(), T, H, R); },
       "q_pe_out", "k_pe"},
      {"q_pe_out one value past q_pe",
       [=](A a, W w) { a.q_pe_out = View<float>::token_major(w.q_pe.data() + 1, T, H, R); }, "q_pe_out", "q_pe"},
      {"q_pe_out in the cache",
       [=](A a, W w) {
         a.q_pe_out = View<float>::token_major(reinterpret_cast<float*>(w.st.data.data()) + 2, T, H, R);
       },
       "q_pe_out", "cache"},
      {"c_kv in the cache",
       [=](A a, W w) {
         a.c_kv = View<const float>::token_major(reinterpret_cast<const float*>(w.st.data.data()), T, 1, L);
       },
       "c_kv", "cache"},
      {"q_norm set",
       [](A a, W w) {
         a.o.q_norm = {w.q_lat.data(), 8};
       },
       "options.q_norm.data", "null"},
      {"write_back_k", [](A a, W) { a.o.write_back_k = true; }, "options.write_back_k", "false"},
      {"pair_axes set",
       [](A a, W) {
         static const rope::PairAxes axes{std::vector<std::uint8_t>(4, 0), 1};
         static const std::vector<std::int64_t> positions(64, 0);
         a.o.pair_axes = &axes;
         a.o.axis_positions = positions.data();
       },
       "options.pair_axes", "null"},
      {"k_norm of the wrong size", [=](A a, W) { a.o.k_norm.size = L - 1; }, "options.k_norm.size", ""},
      {"k_norm null with a size", [=](A a, W) { a.o.k_norm.data = nullptr; }, "options.k_norm.data", ""},
      {"eps 0", [](A a, W) { a.o.eps = 0; }, "options.eps", ""},
      {"eps past float", [](A a, W) { a.o.eps = 1e300; }, "options.eps", ""},
      {"a table without its pairing",
       [](A a, W) {
         const rope::Table<float>* t = a.o.rotation.table;
         a.o.rotation = {};
         a.o.rotation.table = t;
       },
       "options.rotation.style", ""},
      {"rotary_dim past rope_dim", [=](A a, W) { a.o.rotation.rotary_dim = R + 2; }, "options.rotation.rotary_dim", ""},
  };
  if constexpr (rope::KvElement<E>::kScaled) {
    more.push_back({"k_pe over the scales",
                    [=](A a, W w) { a.k_pe = View<const float>::token_major(w.st.scales.data(), T, 1, R); }, "k_pe",
                    "scales"});
  }
  v.insert(v.end(), more.begin(), more.end());
  return v;
}

template <class E>
std::vector<Entry<E>> attend_entries() {
  using A = Args<E>&;
  using W = World<E>&;
  std::vector<Entry<E>> v = plan_and_cache_entries<E>();
  const std::size_t T = model().lay.tokens(), H = model().d.heads, L = model().d.latent, R = model().d.rope;
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  std::vector<Entry<E>> more = {
      {"no scale", [](A a, W) { a.logits.scale.reset(); }, "logits.scale", "set for MLA"},
      {"scale inf", [=](A a, W) { a.logits.scale = inf; }, "logits.scale", "finite"},
      {"scale past float", [=](A a, W) { a.logits.scale = 1e300; }, "logits.scale", "finite"},
      {"softcap 0", [](A a, W) { a.logits.softcap = 0.0; }, "logits.softcap", ""},
      {"sinks of the wrong count", [=](A a, W) { a.logits.sinks.assign(H - 1, 0.0); }, "logits.sinks.size()", ""},
      {"a NaN sink",
       [=](A a, W) {
         a.logits.sinks.assign(H, 0.0);
         a.logits.sinks[2] = nan;
       },
       "logits.sinks[2]", ""},
      {"q_lat tokens", [=](A a, W) { a.q_lat = reshaped(a.q_lat, T + 1, H, L); }, "q_lat.tokens", ""},
      {"q_lat heads", [=](A a, W) { a.q_lat = reshaped(a.q_lat, T, H + 1, L); }, "q_lat.heads", ""},
      {"q_lat head_dim the row's width", [=](A a, W) { a.q_lat = reshaped(a.q_lat, T, H, L + R); }, "q_lat.head_dim",
       ""},
      {"q_pe head_dim", [=](A a, W) { a.q_pe = reshaped(a.q_pe, T, H, R + 2); }, "q_pe.head_dim", ""},
      {"q_pe tokens", [=](A a, W) { a.q_pe = reshaped(a.q_pe, T - 1, H, R); }, "q_pe.tokens", ""},
      {"out head_dim the row's width", [=](A a, W) { a.out = reshaped(a.out, T, H, L + R); }, "out.head_dim", ""},
      {"out heads", [=](A a, W) { a.out = reshaped(a.out, T, 1, L); }, "out.heads", ""},
      {"out over q_lat", [=](A a, W w) { a.out = View<float>::token_major(w.q_lat.data() + 5, T, H, L); }, "out",
       "q_lat"},
      {"out over q_pe", [=](A a, W w) { a.out = View<float>::token_major(w.q_pe.data(), T, H, L); }, "out", "q_pe"},
      {"out in the cache",
       [=](A a, W w) { a.out = View<float>::token_major(reinterpret_cast<float*>(w.st.data.data()), T, H, L); }, "out",
       "cache"},
      {"lse over out", [](A a, W w) { a.lse = w.out.data() + 7; }, "lse", ""},
      {"lse over q_lat", [](A a, W w) { a.lse = w.q_lat.data(); }, "lse", ""},
      {"lse over q_pe", [](A a, W w) { a.lse = w.q_pe.data() + 1; }, "lse", ""},
      {"lse in the cache", [](A a, W w) { a.lse = reinterpret_cast<float*>(w.st.data.data()) + 1; }, "lse", ""},
  };
  if constexpr (rope::KvElement<E>::kScaled) {
    more.push_back({"q_lat over the scales",
                    [=](A a, W w) { a.q_lat = View<const float>::token_major(w.st.scales.data(), T, H, L); }, "q_lat",
                    "scales"});
  }
  v.insert(v.end(), more.begin(), more.end());
  return v;
}

TEST(MlaRefusals, Append) {
  for_each_element([](auto e) { expect_refusals(Fn::append, append_entries<decltype(e)>()); });
}

TEST(MlaRefusals, Attend) {
  for_each_element([](auto e) { expect_refusals(Fn::attend, attend_entries<decltype(e)>()); });
}

// The product modes a latent cache takes: Products::bf16 over a bf16 one
// (test_attention_mla.cpp holds its bound); int8 products over any, and
// bf16 products over another type, refused by name, nothing written.
TEST(MlaRefusals, ProductModesTheCacheHasNot) {
  for_each_element([](auto e) {
    using E = decltype(e);
    SCOPED_TRACE(element_name<E>());
    const std::string int8 =
        refused<E>(Fn::attend, [](Args<E>& a, World<E>&) { a.shape.products = rope::Products::int8; });
    EXPECT_EQ(int8.rfind("rope::attention::attend: shape.products must be ", 0), 0u) << int8;
    EXPECT_NE(int8.find("got Products::int8"), std::string::npos) << int8;
    if constexpr (!std::is_same<E, rope::BFloat16>::value) {
      const std::string bf16 =
          refused<E>(Fn::attend, [](Args<E>& a, World<E>&) { a.shape.products = rope::Products::bf16; });
      EXPECT_EQ(bf16.rfind("rope::attention::attend: shape.products must be ", 0), 0u) << bf16;
      EXPECT_NE(bf16.find(ra::detail::kv_type_name<E>()), std::string::npos) << bf16;
    }
  });
}

// An lse that lies in an int8 cache's scales would have its log-sum-exps
// written over them, which every later read of those rows dequantizes
// with: refused as GQA attend refuses it. (It was taken until attend
// checked lse against the scales too.)
TEST(MlaRefusals, LseInTheInt8ScalesIsRefused) {
  const std::string m = refused<std::int8_t>(
      Fn::attend, [](Args<std::int8_t>& a, World<std::int8_t>& w) { a.lse = w.st.scales.data() + 2; });
  EXPECT_EQ(m.rfind("rope::attention::attend: lse must be ", 0), 0u) << m;
}

// A new token written into a page another sequence of the batch reads (a
// shared prefix): the append refuses the step, naming the entry of the
// block table, and writes nothing; attend takes the same plan.
TEST(MlaRefusals, AppendIntoAPageAnotherSequenceReads) {
  for_each_element([](auto e) {
    using E = decltype(e);
    const Model& m = model();
    Store<E> st(m.lay, m.d);
    // Sequence 0 reads pages {0, 1} (13 keys), sequence 1 page {0}: its new
    // token at position 4 would be written into page 0.
    const std::vector<std::int64_t> q_starts = {0, 1, 2}, lengths = {13, 5};
    const std::vector<std::int32_t> table = {0, 1, 0, 9};
    ra::Plan p;
    ra::plan(p, m.shape(), ra::Batch{q_starts.data(), lengths.data(), table.data(), 2, 2});
    std::vector<float> c(2 * m.d.latent, 1.0f), k(2 * m.d.rope, 1.0f), q(2 * m.d.heads * m.d.rope, 1.0f);
    const Store<E> before(st);
    const std::vector<float> q_before = q;
    const std::string msg = rope_test::thrown_message([&] {
      ra::append(p, st.cache, View<const float>::token_major(c.data(), 2, 1, m.d.latent),
                 View<const float>::token_major(k.data(), 2, 1, m.d.rope),
                 View<float>::token_major(q.data(), 2, m.d.heads, m.d.rope),
                 View<float>::token_major(q.data(), 2, m.d.heads, m.d.rope), m.append_options());
    });
    EXPECT_EQ(msg.rfind("rope::attention::append: batch.block_table[1][0] must be ", 0), 0u) << msg;
    EXPECT_NE(msg.find("new token 1"), std::string::npos) << msg;
    EXPECT_TRUE(st.same_bytes(before)) << element_name<E>();
    EXPECT_EQ(q, q_before);
    std::vector<float> q_lat(2 * m.d.heads * m.d.latent, 0.5f), out(2 * m.d.heads * m.d.latent);
    ra::Logits logits;
    logits.scale = m.scale;
    EXPECT_EQ(rope_test::thrown_message([&] {
                ra::attend(p, st.cache, View<const float>::token_major(q_lat.data(), 2, m.d.heads, m.d.latent),
                           View<const float>::token_major(q.data(), 2, m.d.heads, m.d.rope),
                           View<float>::token_major(out.data(), 2, m.d.heads, m.d.latent), logits);
              }),
              "no exception");
  });
}

// The one-sequence plan over a contiguous latent cache: cached + new
// tokens past its capacity is refused by name; a Plan that never held one
// is refused by append and attend.
TEST(MlaRefusals, OneSequencePlanPastTheCapacity) {
  std::vector<float> data(10 * 12);
  const auto cache = ra::LatentCache<float>::contiguous(data.data(), 10, 8, 4);
  const ra::Shape shape = ra::Shape::of(cache, 2);
  for (const auto& step : {std::pair<std::size_t, std::size_t>{10, 1}, {0, 11}, {5, 6}}) {
    const std::size_t cached = step.first, fresh = step.second;
    ra::Plan p;
    const std::string m = rope_test::thrown_message([&] { ra::plan(p, shape, cached, fresh); });
    EXPECT_EQ(m.rfind("rope::attention::plan: cached + new_tokens must be ", 0), 0u) << m;
    EXPECT_NE(m.find(std::to_string(cached + fresh)), std::string::npos) << m;
    std::vector<float> c(8), k(4), q(2 * 4);
    EXPECT_EQ(rope_test::thrown_message([&] {
                ra::append(p, cache, View<const float>::token_major(c.data(), 1, 1, 8),
                           View<const float>::token_major(k.data(), 1, 1, 4),
                           View<float>::token_major(q.data(), 1, 2, 4), View<float>::token_major(q.data(), 1, 2, 4));
              }).rfind("rope::attention::append: plan must be ", 0),
              0u);
  }
}

// plan.hpp: a refused plan() leaves p holding no plan, so that append and
// attend refuse it until a plan() succeeds; the one-sequence overload too.
// (Found failing at 270f85a: the overload checked the capacity before the
// plan it forwards to cleared p, so a Plan that held a step (cached 9, 1
// new) still held it after plan(p, shape, 10, 1) was refused, and the next
// append wrote the stale step's slot.)
TEST(MlaRefusals, ARefusedOneSequencePlanLeavesNoPlan) {
  std::vector<float> data(10 * 12, -1.0f);
  const auto cache = ra::LatentCache<float>::contiguous(data.data(), 10, 8, 4);
  const ra::Shape shape = ra::Shape::of(cache, 2);
  ra::Plan p;
  ra::plan(p, shape, 9, 1);
  EXPECT_NE(rope_test::thrown_message([&] { ra::plan(p, shape, 10, 1); }), "no exception");
  const std::vector<float> before = data;
  std::vector<float> c(8, 1.0f), k(4, 1.0f), q(2 * 4, 1.0f);
  const std::string m = rope_test::thrown_message([&] {
    ra::append(p, cache, View<const float>::token_major(c.data(), 1, 1, 8),
               View<const float>::token_major(k.data(), 1, 1, 4), View<float>::token_major(q.data(), 1, 2, 4),
               View<float>::token_major(q.data(), 1, 2, 4));
  });
  EXPECT_EQ(m.rfind("rope::attention::append: plan must be ", 0), 0u) << m;
  EXPECT_EQ(data, before) << "the refused plan's stale step was written";
}

}  // namespace
