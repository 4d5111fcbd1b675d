// rope::attention::append's refusals (attention/append.hpp), both forms:
// each names its argument as the caller spelled it, and nothing is written
// (the pools, their scales, q_out and k, compared whole before and after),
// over every element type of a cache. One table holds every refusal; the
// tests after it single out the ones an audit asked to hold: eps that is
// finite as a double but not a positive float, a new token's page another
// sequence of the batch reads (which attend accepts), and a rotation whose
// pairing was never given or whose table was destroyed.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <rope/attention.hpp>
#include <rope/frequencies.hpp>
#include <rope/table.hpp>

#include "append_fixture.hpp"
#include "kv_elements.hpp"
#include "support.hpp"

namespace {

using namespace append_test;  // NOLINT: the suite's own fixture
using rope::View;

const std::string kFn = "rope::attention::append: ";

enum Forms : unsigned { kFused = 1, kKv = 2, kBoth = 3 };

// One call's arguments, as an entry of the table leaves them.
template <class E>
struct Call {
  using Bound = typename Fixture<float, float, E>::Bound;
  Bound b;
  ra::AppendOptions o;
  Layout lay;
  ra::Shape shape;
  bool break_plan = false;   // a plan() into the plan fails after it succeeded once
  bool const_views = false;  // q, k and v passed read-only
};

template <class E>
struct Entry {
  const char* what;
  unsigned forms;
  std::function<void(Call<E>&)> change;
  std::string argument;  // opens the message after the function's name
  std::string also;      // somewhere in the message ("" : nothing more)
};

// The refused call leaves every byte as it was; the message opens with the argument.
template <class E>
struct Refusals {
  Case c = make();
  Fixture<float, float, E> s{c};
  static Case make() {
    Case c;
    c.batch = true;  // a chunk after 9 keys, a sequence without new tokens, a decode token after 30, a prefill
    c.write_back = true;
    return c;
  }

  // The message of the call in `form` with the arguments as `change` leaves
  // them; checks that no byte of any buffer changed.
  std::string message(unsigned form, const std::function<void(Call<E>&)>& change) {
    State<float, float, E> st = s.initial;
    Call<E> call{s.bind(st), s.options(), s.lay, s.shape()};
    if (form == kKv) call.o.q_norm = {};
    change(call);
    ra::Plan p;
    const std::string planned =
        rope_test::thrown_message([&] { ra::plan(p, call.shape, call.lay.batch(), s.threads()); });
    EXPECT_EQ(planned, "no exception") << "the plan is not what is refused";
    if (call.break_plan) {
      ra::Shape bad = call.shape;
      bad.q_heads = 0;
      EXPECT_NE(rope_test::thrown_message([&] { ra::plan(p, bad, call.lay.batch()); }), "no exception");
    }
    const auto& b = call.b;
    const std::string m = rope_test::thrown_message([&] {
      if (form == kFused && call.const_views) {
        ra::append(p, b.cache, View<const float>(b.q), View<const float>(b.k), View<const float>(b.v), b.q_out, call.o);
      } else if (form == kFused) {
        ra::append(p, b.cache, b.q, b.k, b.v, b.q_out, call.o);
      } else if (call.const_views) {
        ra::append(p, b.cache, View<const float>(b.k), View<const float>(b.v), call.o);
      } else {
        ra::append(p, b.cache, b.k, b.v, call.o);
      }
    });
    EXPECT_TRUE(same_state(st, s.initial)) << m;
    return m;
  }

  void expect(const Entry<E>& e) {
    for (const unsigned form : {kFused, kKv}) {
      if ((e.forms & form) == 0) continue;
      SCOPED_TRACE(std::string(rope_test::element_name<E>()) + (form == kFused ? " fused: " : " k/v: ") + e.what);
      const std::string m = message(form, e.change);
      const std::string head = kFn + e.argument + " must be ";
      EXPECT_TRUE(m.rfind(head, 0) == 0 || m.rfind("out_of_range: " + head, 0) == 0)
          << "want " << head << "\n got " << m;
      if (!e.also.empty()) {
        EXPECT_NE(m.find(e.also), std::string::npos) << m;
      }
    }
  }
};

// A view of the same rows with one size changed.
View<float> resized(const View<float>& x, std::size_t tokens, std::size_t heads, std::size_t d) {
  return View<float>(x.data, tokens, heads, d, x.token_stride, x.head_stride);
}

// Tables a rotation may name besides the fixture's.
struct Tables {
  rope::Table<float> wide{rope::frequencies(40, 10000.0), 64};     // rotary_dim 40 > head_dim 32
  rope::Table<float> short30{rope::frequencies(32, 10000.0), 30};  // sequence 2's last position is 30
  rope::Table<float> short10{rope::frequencies(32, 10000.0), 10};  // sequence 0's last position is 10
  std::optional<rope::Table<float>> gone;                          // destroyed before the call
  Tables() { gone.emplace(rope::frequencies(32, 10000.0), 64); }
};

template <class E>
std::vector<Entry<E>> refusals(Tables& tables, const Refusals<E>& r, const rope::PairAxes& good,
                               const std::vector<std::int64_t>& axis_positions) {
  using C = Call<E>;
  const bool scaled = rope::KvElement<E>::kScaled;
  const std::size_t T = r.c.tokens;
  static std::vector<float> fake_scales(4096, 1.0f);
  std::vector<Entry<E>> e = {
      // The plan and the cache.
      {"a plan that failed", kBoth, [](C& c) { c.break_plan = true; }, "plan", "no plan"},
      {"cache heads", kBoth,
       [](C& c) {
         c.b.cache.k.heads = 1;
         c.b.cache.v.heads = 1;
       },
       "cache.k.heads", "shape.kv_heads = 2"},
      {"cache k head_dim", kBoth, [](C& c) { c.b.cache.k.head_dim = 16; }, "cache.k.head_dim", "got 16"},
      {"cache v head_dim", kBoth, [](C& c) { c.b.cache.v.head_dim = 16; }, "cache.v.head_dim", "got 16"},
      {"cache page_size", kBoth,
       [](C& c) {
         c.b.cache.k.page_size = 2;
         c.b.cache.v.page_size = 2;
       },
       "cache.k.page_size", "got 2"},
      {"cache pages", kBoth,
       [](C& c) {
         c.b.cache.k.pages -= 1;
         c.b.cache.v.pages -= 1;
       },
       "cache.k.pages", ""},
      {"cache k scales", kBoth, [&](C& c) { c.b.cache.k.scales = scaled ? nullptr : fake_scales.data(); },
       "cache.k.scales", ""},
      {"cache v scales", kBoth, [&](C& c) { c.b.cache.v.scales = scaled ? nullptr : fake_scales.data(); },
       "cache.v.scales", ""},
      {"a new token's page read by another sequence", kBoth,
       [](C& c) {
         // Sequence 3 (a prefill at positions 0 .. 3) lists sequence 2's
         // first page (its keys 0 .. 3) as its own first page.
         c.lay.block_table[3 * c.lay.stride] = c.lay.block_table[2 * c.lay.stride];
       },
       "batch.block_table[3][0]", "no other sequence of the batch reads (new token 3"},
      // K and V against the plan and the cache.
      {"k tokens", kBoth, [T](C& c) { c.b.k = resized(c.b.k, T - 1, 2, 32); }, "k.tokens", "got 6"},
      {"k heads", kBoth, [T](C& c) { c.b.k = resized(c.b.k, T, 1, 32); }, "k.heads", "got 1"},
      {"k head_dim", kBoth, [T](C& c) { c.b.k = resized(c.b.k, T, 2, 16); }, "k.head_dim", "got 16"},
      {"v tokens", kBoth, [T](C& c) { c.b.v = resized(c.b.v, T + 1, 2, 32); }, "v.tokens", "got 8"},
      {"v heads", kBoth, [T](C& c) { c.b.v = View<float>::token_major(c.b.v.data, T, 4, 32); }, "v.heads", "got 4"},
      {"v head_dim", kBoth, [T](C& c) { c.b.v = resized(c.b.v, T, 2, 30); }, "v.head_dim", "got 30"},
      {"k over cache.k, not its slots' rows", kBoth,
       [](C& c) { c.b.k.data = reinterpret_cast<float*>(c.b.cache.k.data); }, "k", "apart from cache.k"},
      {"v over cache.v", kBoth, [](C& c) { c.b.v.data = reinterpret_cast<float*>(c.b.cache.v.data) + 8; }, "v",
       "apart from cache.v"},
      {"k over cache.v", kBoth, [](C& c) { c.b.k.data = reinterpret_cast<float*>(c.b.cache.v.data); }, "k",
       "memory apart from cache.v"},
      {"v over cache.k", kBoth, [](C& c) { c.b.v.data = reinterpret_cast<float*>(c.b.cache.k.data); }, "v",
       "memory apart from cache.k"},
      // Q and q_out.
      {"q tokens", kFused, [T](C& c) { c.b.q = resized(c.b.q, T - 1, 8, 32); }, "q.tokens", "got 6"},
      {"q heads", kFused, [T](C& c) { c.b.q = resized(c.b.q, T, 4, 32); }, "q.heads", "got 4"},
      {"q head_dim", kFused, [T](C& c) { c.b.q = resized(c.b.q, T, 8, 16); }, "q.head_dim", "got 16"},
      {"q_out tokens", kFused, [T](C& c) { c.b.q_out = View<float>::token_major(c.b.q_out.data, T - 2, 8, 32); },
       "q_out.tokens", "got 5"},
      {"q_out heads", kFused, [T](C& c) { c.b.q_out = View<float>::token_major(c.b.q_out.data, T, 2, 32); },
       "q_out.heads", "got 2"},
      {"q_out head_dim", kFused, [T](C& c) { c.b.q_out = View<float>::token_major(c.b.q_out.data, T, 8, 30); },
       "q_out.head_dim", "got 30"},
      {"q_out over k", kFused, [](C& c) { c.b.q_out.data = c.b.k.data; }, "q_out", "disjoint from k"},
      {"q_out over v", kFused, [](C& c) { c.b.q_out.data = c.b.v.data; }, "q_out", "disjoint from v"},
      {"q_out over q, not q", kFused, [](C& c) { c.b.q_out.data = c.b.q.data + 1; }, "q_out", "disjoint from q"},
      {"q over cache.k", kFused, [](C& c) { c.b.q.data = reinterpret_cast<float*>(c.b.cache.k.data); }, "q", "cache.k"},
      {"q over cache.v", kFused, [](C& c) { c.b.q.data = reinterpret_cast<float*>(c.b.cache.v.data) + 4; }, "q",
       "cache.v"},
      {"q_out over cache.k", kFused, [](C& c) { c.b.q_out.data = reinterpret_cast<float*>(c.b.cache.k.data); }, "q_out",
       "cache.k"},
      // K's write-back.
      {"write-back of a read-only k", kBoth, [](C& c) { c.const_views = true; }, "options.write_back_k", "read-only"},
      {"written-back k over q", kFused, [](C& c) { c.b.k.data = c.b.q.data + 64; }, "k", "disjoint from q"},
      {"written-back k over v", kBoth, [](C& c) { c.b.k.data = c.b.v.data - 32; }, "k", "disjoint from v"},
      // The norms.
      {"q_norm size", kFused, [](C& c) { c.o.q_norm.size += 1; }, "options.q_norm.size", "(head_dim)"},
      {"k_norm size", kBoth, [](C& c) { c.o.k_norm.size -= 2; }, "options.k_norm.size", "(head_dim)"},
      {"per-head q weights with whole_projection", kFused, [](C& c) { c.o.whole_projection = true; },
       "options.q_norm.size", "whole_projection"},
      {"per-head k weights with whole_projection", kBoth,
       [](C& c) {
         c.o.whole_projection = true;
         c.o.q_norm = {};
       },
       "options.k_norm.size", "whole_projection"},
      {"q_norm size without data", kFused, [](C& c) { c.o.q_norm.data = nullptr; }, "options.q_norm.data",
       "non-null for 32 weights"},
      {"k_norm size without data", kBoth, [](C& c) { c.o.k_norm.data = nullptr; }, "options.k_norm.data",
       "non-null for 32 weights"},
      {"q_norm in the K/V form", kKv,
       [&r](C& c) {
         c.o.q_norm = {r.s.qw.data(), r.s.qw.size()};
       },
       "options.q_norm.data", "this form writes no Q"},
      // The rotation.
      {"table set by hand on a default Rotation", kBoth,
       [&r](C& c) {
         c.o.rotation = ra::Rotation<float>{};
         c.o.rotation.table = &r.s.table;
       },
       "options.rotation.style", "Rotation{&table, style}"},
      {"destroyed table", kBoth,
       [&tables](C& c) {
         c.o.rotation = {&*tables.gone, Style::rotate_half};
       },
       "options.rotation.table", "destroyed"},
      {"odd rotary_dim", kBoth, [](C& c) { c.o.rotation.rotary_dim = 7; }, "options.rotation.rotary_dim", "even"},
      {"rotary_dim past the table", kBoth, [](C& c) { c.o.rotation.rotary_dim = 34; }, "options.rotation.rotary_dim",
       "<= the table's rotary_dim 32"},
      {"table wider than the heads", kBoth,
       [&tables](C& c) {
         c.o.rotation = {&tables.wide, Style::rotate_half};
       },
       "options.rotation.rotary_dim", "<= the head dimension 32"},
      {"a decode token past the table", kBoth,
       [&tables](C& c) {
         c.o.rotation = {&tables.short30, Style::block_diagonal};
       },
       "batch.lengths[2]", "positions() = 30"},
      {"a chunk past the table", kBoth,
       [&tables](C& c) {
         c.o.rotation = {&tables.short10, Style::rotate_half};
       },
       "batch.lengths[0]", "positions() = 10"},
  };
  // Multi-axis positions.
  const auto with = [&good, &axis_positions](C& c) {
    c.o.pair_axes = &good;
    c.o.axis_positions = axis_positions.data();
  };
  static rope::PairAxes short_axes, bad_axis, no_axes;
  static std::vector<std::int64_t> outside, negative;
  short_axes = good;
  short_axes.axis.pop_back();
  bad_axis = good;
  bad_axis.axis[3] = 3;
  no_axes = good;
  no_axes.axes = 0;
  outside = axis_positions;
  outside[1 * T + 4] = std::int64_t{kTablePositions};
  negative = axis_positions;
  negative[2 * T + 5] = -1;
  const std::vector<Entry<E>> axes = {
      {"pair axes short of the pairs", kBoth,
       [with](C& c) {
         with(c);
         c.o.pair_axes = &short_axes;
       },
       "options.pair_axes->axis.size()", "rotary_dim/2 = 16, got 15"},
      {"an axis that is not there", kBoth,
       [with](C& c) {
         with(c);
         c.o.pair_axes = &bad_axis;
       },
       "options.pair_axes->axis[3]", "< axes = 3, got 3"},
      {"no axes", kBoth,
       [with](C& c) {
         with(c);
         c.o.pair_axes = &no_axes;
       },
       "options.pair_axes->axes", "got 0"},
      {"no axis positions", kBoth,
       [with](C& c) {
         with(c);
         c.o.axis_positions = nullptr;
       },
       "options.axis_positions", "non-null when options.pair_axes is set, got null"},
      {"an axis position past the table", kBoth,
       [with](C& c) {
         with(c);
         c.o.axis_positions = outside.data();
       },
       "options.axis_positions[1][4]", "[0, 64), got 64"},
      {"a negative axis position", kBoth,
       [with](C& c) {
         with(c);
         c.o.axis_positions = negative.data();
       },
       "options.axis_positions[2][5]", "got -1"},
  };
  e.insert(e.end(), axes.begin(), axes.end());
  if (scaled) {  // views over an int8 pool's scales
    const std::vector<Entry<E>> over_scales = {
        {"k over cache.k's scales", kBoth, [](C& c) { c.b.k.data = c.b.cache.k.scales; }, "k", "cache.k.scales apart"},
        {"v over cache.v's scales", kBoth, [](C& c) { c.b.v.data = c.b.cache.v.scales; }, "v", "cache.v.scales apart"},
        // q_out and q span more than the scales they start in, and what
        // lies past them (the other pool's rows or scales) is the
        // allocator's choice: either pool may be named.
        {"q_out over cache.v's scales", kFused, [](C& c) { c.b.q_out.data = c.b.cache.v.scales; }, "q_out",
         "memory apart from cache."},
        {"q over cache.k's scales", kFused, [](C& c) { c.b.q.data = c.b.cache.k.scales; }, "q",
         "memory apart from cache."},
    };
    e.insert(e.end(), over_scales.begin(), over_scales.end());
  }
  // eps: not a positive finite float.
  for (const double eps :
       {0.0, -1e-6, std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(),
        -std::numeric_limits<double>::infinity(), 1e-60, 1e-50, 1e300, 3.5e38}) {
    e.push_back({"eps", kBoth, [eps](C& c) { c.o.eps = eps; }, "options.eps", "finite and > 0, also in float"});
  }
  return e;
}

template <class E>
void check_every_refusal() {
  Tables tables;
  Refusals<E> r;
  tables.gone.reset();
  const rope::PairAxes good = rope::PairAxes::sections({{8, 4, 4}, rope::SectionOrder::chunked}, 16);
  const std::vector<std::int64_t> axis_positions = mrope_positions(r.c.tokens);
  // The arguments as they are, and with the good axes, are accepted by both forms.
  for (const bool axes : {false, true}) {
    for (const unsigned form : {kFused, kKv}) {
      State<float, float, E> st = r.s.initial;
      const auto b = r.s.bind(st);
      ra::AppendOptions o = r.s.options();
      if (axes) {
        o.pair_axes = &good;
        o.axis_positions = axis_positions.data();
      }
      if (form == kKv) o.q_norm = {};
      ra::Plan p;
      r.s.plan(p);
      EXPECT_EQ(rope_test::thrown_message([&] {
                  form == kFused ? ra::append(p, b.cache, b.q, b.k, b.v, b.q_out, o)
                                 : ra::append(p, b.cache, b.k, b.v, o);
                }),
                "no exception")
          << "form " << form << " axes " << axes;
      EXPECT_FALSE(same_state(st, r.s.initial).operator bool()) << "the accepted call wrote nothing";
    }
  }
  // A table whose last row is sequence 2's last position (30) is accepted.
  const rope::Table<float> fits(rope::frequencies(32, 10000.0), 31);
  for (const unsigned form : {kFused, kKv}) {
    State<float, float, E> st = r.s.initial;
    const auto b = r.s.bind(st);
    ra::AppendOptions o = r.s.options();
    o.rotation = {&fits, Style::rotate_half};
    if (form == kKv) o.q_norm = {};
    ra::Plan p;
    r.s.plan(p);
    EXPECT_EQ(rope_test::thrown_message([&] {
                form == kFused ? ra::append(p, b.cache, b.q, b.k, b.v, b.q_out, o)
                               : ra::append(p, b.cache, b.k, b.v, o);
              }),
              "no exception")
        << "a table of 31 rows, form " << form;
  }
  for (const Entry<E>& e : refusals<E>(tables, r, good, axis_positions)) r.expect(e);
}

TEST(AppendRefuses, EveryRefusalOfBothFormsNamesItsArgumentAndWritesNothing) {
  rope_test::for_each_element([](auto e) { check_every_refusal<decltype(e)>(); });
}

// eps is added in float: one finite as a double that overflows float (1e300,
// 3.5e38) or rounds to 0 in it (1e-50) is refused by name and nothing is
// written (it once became +inf or 0 and the call wrote all-zero Q and K).
// Without a norm eps is not read.
TEST(AppendRefuses, EpsThatIsNotAPositiveFiniteFloat) {
  Refusals<I8> r;
  for (const double eps : {1e300, 3.5e38, 1e-50}) {
    for (const unsigned form : {kFused, kKv}) {
      SCOPED_TRACE("eps " + ::testing::PrintToString(eps) + (form == kFused ? " fused" : " k/v"));
      const std::string m = r.message(form, [eps](Call<I8>& c) { c.o.eps = eps; });
      EXPECT_EQ(m.rfind(kFn + "options.eps must be finite and > 0, also in float, got ", 0), 0u) << m;
      // Only the K side's norm.
      const std::string k_only = r.message(form, [eps](Call<I8>& c) {
        c.o.eps = eps;
        c.o.q_norm = {};
      });
      EXPECT_EQ(k_only.rfind(kFn + "options.eps must be", 0), 0u) << k_only;
    }
    Case c = r.c;
    c.norm = NormKind::none;
    Fixture<float, float, I8> plain(c);
    ra::AppendOptions o = plain.options();
    o.eps = eps;
    EXPECT_TRUE(same_state(plain.run_with(o), plain.expected())) << "no norm, eps " << eps;
  }
}

// A new token written into a page another sequence of the batch reads (a
// shared prefix the sequence has not copied): refused by name with the
// page, nothing written, whether the other sequence only reads the page or
// writes its own new tokens there too. attend reads shared pages: the same
// plan is accepted there, and its rows are the rows of the batch with the
// page copied for the sequence that shares it.
template <class E>
void check_shared_page() {
  Refusals<E> r;
  const Layout& lay = r.s.lay;
  const std::size_t stride = lay.stride;
  struct Share {
    std::size_t b, i, from_b, from_i, token;
  };
  // Sequence 3 (positions 0 .. 3) onto sequence 2's first page (keys 0 .. 3
  // of its 31); sequence 2's decode page (position 30: page 7) onto sequence
  // 0's chunk page (positions 9, 10: page 2), where token 0 is the first
  // written.
  for (const Share sh : {Share{3, 0, 2, 0, 3}, Share{2, 7, 0, 2, 0}}) {
    const std::int32_t page = lay.block_table[sh.from_b * stride + sh.from_i];
    const auto share = [&](Call<E>& c) { c.lay.block_table[sh.b * stride + sh.i] = page; };
    for (const unsigned form : {kFused, kKv}) {
      const std::string m = r.message(form, share);
      const std::size_t nb = sh.b == 2 ? 0 : sh.b, ni = sh.b == 2 ? 2 : sh.i;  // the first token's page
      const std::string want = kFn + "batch.block_table[" + std::to_string(nb) + "][" + std::to_string(ni) +
                               "] must be a page no other sequence of the batch reads (new token " +
                               std::to_string(sh.token) + " is written there), got " + std::to_string(page);
      EXPECT_EQ(m, want) << rope_test::element_name<E>();
    }
    // attend over the same plan: accepted; each token's rows are those of
    // the unshared batch whose copy of the page holds the same rows.
    Layout shared = lay;
    shared.block_table[sh.b * stride + sh.i] = page;
    State<float, float, E> st = r.s.initial;
    const auto b = r.s.bind(st);
    // Keys in every slot, finite: the fixture's pattern bytes are not a
    // finite value of every type.
    std::vector<float> kf = rope_test::random_vector<float>(b.cache.k.head_dim, 40);
    for (std::size_t slot = 0; slot < b.cache.k.slots(); ++slot) {
      for (std::size_t h = 0; h < b.cache.k.heads; ++h) {
        const bool scaled = rope::KvElement<E>::kScaled;
        kf[slot % kf.size()] += 0.25f;
        rope::store_kv_row(kf.data(), kf.size(), b.cache.k.row(slot, h), scaled ? b.cache.k.scale(slot, h) : nullptr);
        rope::store_kv_row(kf.data(), kf.size(), b.cache.v.row(slot, h), scaled ? b.cache.v.scale(slot, h) : nullptr);
      }
    }
    ra::Plan p;
    ra::plan(p, r.s.shape(), shared.batch());
    std::vector<float> out(r.c.tokens * r.c.q_heads * r.c.head_dim, -9.0f);
    const auto out_view = View<float>::token_major(out.data(), r.c.tokens, r.c.q_heads, r.c.head_dim);
    EXPECT_EQ(rope_test::thrown_message([&] { ra::attend(p, b.cache, b.q, out_view); }), "no exception");
    // The unshared batch: the sharing sequence given a page of its own holding a copy.
    Layout own = lay;
    const std::int32_t mine = lay.block_table[sh.b * stride + sh.i];
    for (std::size_t o = 0; o < kPageSize; ++o) {
      const std::size_t from = static_cast<std::size_t>(page) * kPageSize + o,
                        to = static_cast<std::size_t>(mine) * kPageSize + o;
      for (std::size_t h = 0; h < b.cache.k.heads; ++h) {
        std::memcpy(b.cache.k.row(to, h), b.cache.k.row(from, h), b.cache.k.head_dim * sizeof(E));
        std::memcpy(b.cache.v.row(to, h), b.cache.v.row(from, h), b.cache.v.head_dim * sizeof(E));
        if (rope::KvElement<E>::kScaled) {
          *b.cache.k.scale(to, h) = *b.cache.k.scale(from, h);
          *b.cache.v.scale(to, h) = *b.cache.v.scale(from, h);
        }
      }
    }
    ra::plan(p, r.s.shape(), own.batch());
    std::vector<float> want(out.size(), -9.0f);
    ra::attend(p, b.cache, b.q, View<float>::token_major(want.data(), r.c.tokens, r.c.q_heads, r.c.head_dim));
    EXPECT_TRUE(same_bytes(out, want, "attend over the shared page")) << rope_test::element_name<E>();
  }
}

TEST(AppendRefuses, ANewTokensPageAnotherSequenceReadsWhichAttendAccepts) {
  rope_test::for_each_element([](auto e) { check_shared_page<decltype(e)>(); });
}

// A Rotation names its pairing with its table: a table set by hand on a
// default Rotation is refused by name, a destroyed table is reported as
// destroyed (Table::alive(); the table lived in a std::optional, whose
// storage outlives it, so reading the mark is no use after free under
// AddressSanitizer), and the same rotation given its pairing is accepted.
// A Rotation of a table alone does not compile: the pairing is never defaulted.
static_assert(!std::is_constructible<ra::Rotation<float>, const rope::Table<float>*>::value,
              "Rotation{&table} without a style must not compile");
static_assert(std::is_constructible<ra::Rotation<float>, const rope::Table<float>*, Style>::value,
              "Rotation{&table, style} compiles");

TEST(AppendRefuses, ARotationWithoutItsPairingOrWithADestroyedTable) {
  Refusals<float> r;
  for (const unsigned form : {kFused, kKv}) {
    const std::string hand = r.message(form, [&r](Call<float>& c) {
      c.o.rotation = ra::Rotation<float>{};
      c.o.rotation.table = &r.s.table;
    });
    EXPECT_EQ(hand, kFn +
                        "options.rotation.style must be given with the table: Rotation{&table, style}, never "
                        "defaulted, got not given");
    std::optional<rope::Table<float>> table;
    table.emplace(rope::frequencies(32, 10000.0), 64);
    const rope::Table<float>* gone = &*table;
    EXPECT_TRUE(gone->alive());
    table.reset();
    const std::string destroyed = r.message(form, [gone](Call<float>& c) {
      c.o.rotation = {gone, Style::rotate_half};
    });
    EXPECT_EQ(destroyed, kFn + "options.rotation.table must be a live rope::Table, got a table that was destroyed");
    // The same table given with its pairing: accepted.
    State<float, float, float> st = r.s.initial;
    const auto b = r.s.bind(st);
    ra::AppendOptions o = r.s.options();
    o.rotation = ra::Rotation<float>{&r.s.table, Style::rotate_half};
    if (form == kKv) o.q_norm = {};
    ra::Plan p;
    r.s.plan(p);
    EXPECT_EQ(rope_test::thrown_message([&] {
                form == kFused ? ra::append(p, b.cache, b.q, b.k, b.v, b.q_out, o)
                               : ra::append(p, b.cache, b.k, b.v, o);
              }),
              "no exception");
  }
}

// A tree token sits at cached + depth, not at its index: a table too short
// for its position names its depth (and a table that holds the deepest
// position is enough, though the sequence's length is more).
TEST(AppendRefusals, TreeTokenPastTheTableNamesItsDepth) {
  namespace ra = rope::attention;
  std::vector<float> k(4 * 8 * 2 * 8), v(k.size());
  ra::PagedCache<float> cache{ra::PagePool<float>::nhd(k.data(), 4, 8, 2, 8),
                              ra::PagePool<float>::nhd(v.data(), 4, 8, 2, 8)};
  const std::int64_t starts[2] = {0, 4}, length = 6;  // 2 cached, then a tree of 4 at depths 0, 1, 2, 2
  const std::int32_t table_row[4] = {0, 1, 2, 3}, depths[4] = {0, 1, 2, 2};
  const std::uint64_t masks[4] = {1, 3, 7, 11};
  ra::Batch batch{starts, &length, table_row, 4, 1};
  batch.tree_depths = depths;
  batch.tree_masks = masks;
  batch.tree_mask_words = 1;
  ra::Plan plan;
  ra::plan(plan, ra::Shape::of(cache, 4), batch);
  std::vector<float> rows(4 * 2 * 8, 0.5f);
  const auto view = View<const float>::token_major(rows.data(), 4, 2, 8);
  for (const std::size_t positions : {4, 5}) {
    const rope::Table<float> angles(rope::frequencies(8, 10000.0), positions);
    ra::AppendOptions o;
    o.rotation = {&angles, rope::Style::rotate_half};
    const std::vector<float> before = k;
    const std::string got = rope_test::thrown_message([&] { ra::append(plan, cache, view, view, o); });
    if (positions == 4) {
      EXPECT_EQ(got,
                "rope::attention::append: batch.tree_depths[2] must be < options.rotation.table->positions() - 2 "
                "= 2 (its position is 2 + depth), got 2");
      EXPECT_EQ(k, before);
    } else {
      EXPECT_EQ(got, "no exception");
    }
  }
}

}  // namespace
