// A server step's plan (attention/plan.hpp), against an independent reading
// of its header:
//   - every check of the shape, the threads and the batch names its
//     argument, and leaves the Plan holding no plan (attend refuses it and
//     writes nothing), also a Plan that held a good one before;
//   - each new token's position (lengths[b] - n_b + i) and slot (its page
//     id times page_size plus its offset) against a computation from the
//     batch, over random batches;
//   - the work items: one per prefill token over [0, length), a decode
//     token's in parts aligned at multiples of kv_split covering [0, length)
//     exactly, partial states numbered once each;
//   - a sequence without new tokens is neither checked nor read;
//   - the one-sequence plan over a contiguous cache = the batch of one;
//   - the plan copies what it reads: the caller's arrays may change after.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <rope/attention.hpp>

#include "executors.hpp"
#include "support.hpp"

namespace {

namespace ra = rope::attention;
using ra::Batch;
using ra::PagedCache;
using ra::PagePool;
using ra::Plan;
using ra::WorkItem;
using rope::View;

// A batch as a scheduler holds it, with a float cache of its pool.
struct Step {
  ra::Shape shape;
  std::vector<std::int64_t> q_starts, lengths;
  std::vector<std::int32_t> table;
  std::size_t stride = 0;
  std::vector<float> kd, vd;

  Batch batch() const { return {q_starts.data(), lengths.data(), table.data(), stride, lengths.size()}; }
  PagedCache<float> cache() {
    return {PagePool<float>::nhd(kd.data(), shape.pages, shape.page_size, shape.kv_heads, shape.head_dim),
            PagePool<float>::nhd(vd.data(), shape.pages, shape.page_size, shape.kv_heads, shape.dv())};
  }
  std::size_t tokens() const { return static_cast<std::size_t>(q_starts.back()); }
};

// Sequences of (new tokens, length); pages from a shuffled pool, unused
// table entries -7 (never read: a sequence reads only its first pages).
Step make_step(const std::vector<std::pair<std::int64_t, std::int64_t>>& seqs, std::size_t page_size,
               std::uint32_t seed, std::size_t kv_split = 512) {
  Step s;
  s.shape.q_heads = 4;
  s.shape.kv_heads = 2;
  s.shape.head_dim = 8;
  s.shape.v_head_dim = 6;
  s.shape.page_size = page_size;
  s.shape.kv_split = kv_split;
  std::size_t pages = 2;
  s.q_starts.push_back(0);
  for (const auto& [n, len] : seqs) {
    s.q_starts.push_back(s.q_starts.back() + n);
    s.lengths.push_back(len);
    const std::size_t need = (static_cast<std::size_t>(len) + page_size - 1) / page_size;
    pages += need;
    s.stride = std::max(s.stride, need + 2);
  }
  s.shape.pages = pages;
  std::vector<std::int32_t> ids(pages);
  std::iota(ids.begin(), ids.end(), 0);
  std::mt19937 gen(seed);
  std::shuffle(ids.begin(), ids.end(), gen);
  s.table.assign(seqs.size() * s.stride, -7);
  std::size_t next = 0;
  for (std::size_t b = 0; b < seqs.size(); ++b) {
    const std::size_t need = (static_cast<std::size_t>(seqs[b].second) + page_size - 1) / page_size;
    for (std::size_t i = 0; i < need; ++i) s.table[b * s.stride + i] = ids[next++];
  }
  s.kd = rope_test::random_vector<float>(pages * page_size * 2 * 8, seed + 1);
  s.vd = rope_test::random_vector<float>(pages * page_size * 2 * 6, seed + 2);
  return s;
}

// attend of a step's plan, out filled with a pattern first.
std::vector<float> attend(const Plan& p, Step& s, const std::vector<float>& q) {
  std::vector<float> out(s.tokens() * 4 * 6, -777.0f);
  ra::attend(p, s.cache(), View<const float>::token_major(q.data(), s.tokens(), 4, 8),
             View<float>::token_major(out.data(), s.tokens(), 4, 6));
  return out;
}

const char* kNoPlan = "rope::attention::attend: plan must be made by a rope::attention::plan() that succeeded";

// A refused plan(): the message names `argument` and shows `value`; the
// caller's arrays are as they were; the Plan holds no plan: attend refuses
// it and writes nothing.
template <class F>
void expect_refused(const std::string& what, Plan& p, Step& s, const std::string& argument, const std::string& value,
                    F&& call) {
  SCOPED_TRACE(what);
  const Step before = s;
  const std::string msg = rope_test::thrown_message(call);
  EXPECT_EQ(msg.rfind("rope::attention::plan: " + argument + " must be ", 0), 0u) << msg;
  rope_test::expect_names(msg, argument, value);
  EXPECT_EQ(s.q_starts, before.q_starts);
  EXPECT_EQ(s.lengths, before.lengths);
  EXPECT_EQ(s.table, before.table);
  const std::vector<float> q(std::max<std::size_t>(s.tokens(), 1) * 4 * 8, 1.0f);
  std::vector<float> out(std::max<std::size_t>(s.tokens(), 1) * 4 * 6, -5.0f);
  const std::vector<float> out_before = out;
  const std::string refused = rope_test::thrown_message([&] {
    ra::attend(p, s.cache(), View<const float>::token_major(q.data(), s.tokens(), 4, 8),
               View<float>::token_major(out.data(), s.tokens(), 4, 6));
  });
  EXPECT_EQ(refused.rfind(kNoPlan, 0), 0u) << refused;
  EXPECT_EQ(out, out_before) << "attend wrote out from a refused plan";
}

TEST(AttentionPlan, ShapeAndThreadsRefusalsNameTheArgumentAndLeaveNoPlan) {
  Step s = make_step({{1, 9}, {3, 5}, {2, 6}}, 4, 1);
  Plan p;
  auto refused = [&](const std::string& what, ra::Shape shape, const std::string& argument, const std::string& value,
                     const rope::Threads& threads = {}) {
    ra::plan(p, s.shape, s.batch());  // a good plan first: the refusal takes it away
    ASSERT_EQ(rope_test::thrown_message([&] { attend(p, s, std::vector<float>(s.tokens() * 32, 1.0f)); }),
              "no exception");
    expect_refused(what, p, s, argument, value, [&] { ra::plan(p, shape, s.batch(), threads); });
  };
  ra::Shape bad = s.shape;
  bad.q_heads = 0;
  refused("q_heads 0", bad, "shape.q_heads", "got 0");
  bad = s.shape;
  bad.kv_heads = 0;
  refused("kv_heads 0", bad, "shape.kv_heads", "got 0");
  bad = s.shape;
  bad.kv_heads = 3;
  refused("kv_heads 3 of 4", bad, "shape.kv_heads", "a divisor of shape.q_heads = 4");
  bad = s.shape;
  bad.head_dim = 0;
  refused("head_dim 0", bad, "shape.head_dim", "got 0");
  bad = s.shape;
  bad.page_size = 0;
  refused("page_size 0", bad, "shape.page_size", "got 0");
  bad = s.shape;
  bad.pages = 0;
  refused("pages 0", bad, "shape.pages", "got 0");
  bad = s.shape;
  bad.kv_split = 0;
  refused("kv_split 0", bad, "shape.kv_split", "got 0");
  refused("threads 0", s.shape, "threads.count", "at least 1", std::size_t{0});
  rope_test::ReverseExecutor reverse;
  refused("executor of no workers", s.shape, "threads.executor.workers", "got 0", reverse.executor(0));
  EXPECT_EQ(reverse.tasks_run, 0u);
}

TEST(AttentionPlan, BatchRefusalsNameTheArgumentAndLeaveNoPlan) {
  const Step good = make_step({{1, 9}, {3, 5}, {2, 6}}, 4, 2);
  Plan p;
  // Each case: a fresh good plan, a change to the batch, the refusal.
  auto refused = [&](const std::string& what, const std::string& argument, const std::string& value, auto change) {
    Step s = good;
    ra::plan(p, s.shape, s.batch());
    Batch b = s.batch();
    change(s, b);
    expect_refused(what, p, s, argument, value, [&] { ra::plan(p, s.shape, b); });
  };
  refused("q_starts null", "batch.q_starts", "non-null", [](Step&, Batch& b) { b.q_starts = nullptr; });
  refused("q_starts[0] 1", "batch.q_starts[0]", "got 1", [](Step& s, Batch&) { s.q_starts[0] = 1; });
  refused("lengths null", "batch.lengths", "non-null", [](Step&, Batch& b) { b.lengths = nullptr; });
  refused("block_table null", "batch.block_table", "non-null", [](Step&, Batch& b) { b.block_table = nullptr; });
  refused("starts decrease", "batch.q_starts[2]", ">= batch.q_starts[1] = 3", [](Step& s, Batch&) {
    s.q_starts = {0, 3, 2, 6};
  });
  refused("fewer keys than new tokens", "batch.lengths[1]", ">= its new tokens 3",
          [](Step& s, Batch&) { s.lengths[1] = 2; });
  refused("negative length", "batch.lengths[0]", "got -1", [](Step& s, Batch&) { s.lengths[0] = -1; });
  refused("longer than its pages", "batch.lengths[2]", "<= its pages' slots",
          [](Step& s, Batch&) { s.lengths[2] = static_cast<std::int64_t>(s.stride * 4 + 1); });
  refused("page id = pages", "batch.block_table[1][1]",
          "a page id below shape.pages = " + std::to_string(good.shape.pages),
          [](Step& s, Batch&) { s.table[1 * s.stride + 1] = static_cast<std::int32_t>(s.shape.pages); });
  refused("page id -1", "batch.block_table[1][1]", "got -1", [](Step& s, Batch&) { s.table[1 * s.stride + 1] = -1; });
  // A page twice in one sequence would hold two of its keys in one slot.
  refused("page twice", "batch.block_table[0][2]", "a page this sequence does not already list",
          [](Step& s, Batch&) { s.table[0 * s.stride + 2] = s.table[0]; });
  // Also when an earlier sequence lists that page too (a shared page).
  refused("a shared page twice", "batch.block_table[1][1]", "a page this sequence does not already list",
          [](Step& s, Batch&) {
            s.table[1 * s.stride + 0] = s.table[0];
            s.table[1 * s.stride + 1] = s.table[0];
          });
  // Accepted: a page two sequences read (a shared prefix), a length that
  // fills its pages exactly, no sequence at all.
  Step s = good;
  s.table[1 * s.stride + 0] = s.table[0];
  EXPECT_EQ(rope_test::thrown_message([&] { ra::plan(p, s.shape, s.batch()); }), "no exception");
  s = good;
  s.lengths[0] = 12;  // its three pages of 4, full
  EXPECT_EQ(rope_test::thrown_message([&] { ra::plan(p, s.shape, s.batch()); }), "no exception");
  refused("one key into a page it does not list", "batch.block_table[0][3]", "got -7",
          [](Step& s, Batch&) { s.lengths[0] = 13; });
  const std::int64_t zero = 0;
  EXPECT_EQ(rope_test::thrown_message([&] {
              ra::plan(p, s.shape, Batch{&zero, nullptr, nullptr, 0, 0});
            }),
            "no exception");
  EXPECT_EQ(p.tokens(), 0u);
  EXPECT_TRUE(p.items().empty());
}

// Positions and slots from the batch, computed here from the header's
// rule; the items against the header's layout; both over random batches.
TEST(AttentionPlan, PositionsSlotsAndItemsFollowTheBatch) {
  std::mt19937 gen(17);
  for (int round = 0; round < 40; ++round) {
    const std::size_t page_size = 1 + gen() % 9, split = 1 + gen() % 70, sequences = 1 + gen() % 7;
    std::vector<std::pair<std::int64_t, std::int64_t>> seqs;
    for (std::size_t b = 0; b < sequences; ++b) {
      const std::int64_t kind = gen() % 4;  // decode, prefill, chunked prefill, none
      const std::int64_t len = 1 + gen() % 200;
      const std::int64_t n = kind == 0 ? 1 : kind == 1 ? len : kind == 2 ? 1 + gen() % len : 0;
      seqs.emplace_back(n, len);
    }
    Step s = make_step(seqs, page_size, 100 + round, split);
    Plan p;
    const std::size_t threads = 1 + round % 4;
    ra::plan(p, s.shape, s.batch(), threads);
    const std::string what = "round " + std::to_string(round);
    ASSERT_EQ(p.tokens(), s.tokens()) << what;
    ASSERT_EQ(p.sequences(), sequences) << what;
    EXPECT_EQ(p.threads().count, threads) << what;
    EXPECT_EQ(p.shape().v_head_dim, 6u) << what;
    EXPECT_EQ(p.shape().kv_split, split) << what;
    std::size_t item = 0, partials = 0;
    for (std::size_t b = 0; b < sequences; ++b) {
      const auto [n, len] = seqs[b];
      for (std::int64_t i = 0; i < n; ++i) {
        const auto t = static_cast<std::size_t>(s.q_starts[b] + i);
        const std::int64_t pos = len - n + i;
        const std::int64_t page = s.table[b * s.stride + static_cast<std::size_t>(pos) / page_size];
        ASSERT_EQ(p.position(t), pos) << what << " token " << t;
        ASSERT_EQ(p.positions()[t], pos) << what << " token " << t;
        ASSERT_EQ(p.slot(t), page * static_cast<std::int64_t>(page_size) + pos % static_cast<std::int64_t>(page_size))
            << what << " token " << t;
        // Its items: consecutive, in token order, covering [0, len).
        std::int64_t covered = 0;
        const std::size_t first = item;
        while (item < p.items().size() && p.items()[item].token == t) {
          const WorkItem& it = p.items()[item];
          ASSERT_EQ(it.sequence, b) << what;
          ASSERT_EQ(static_cast<std::int64_t>(it.first_key), covered) << what << " token " << t;
          ASSERT_GT(it.keys, 0u) << what;
          covered += static_cast<std::int64_t>(it.keys);
          ++item;
        }
        ASSERT_EQ(covered, len) << what << " token " << t;
        const std::size_t count = item - first;
        const std::size_t parts = n == 1 ? (static_cast<std::size_t>(len) + split - 1) / split : 1;
        ASSERT_EQ(count, parts) << what << " token " << t << (n == 1 ? " (decode)" : " (prefill)");
        for (std::size_t k = first; k < item; ++k) {
          if (count == 1) {
            EXPECT_EQ(p.items()[k].partial, WorkItem::kDirect) << what;
          } else {
            EXPECT_EQ(p.items()[k].partial, partials++) << what << ": partial states numbered once each";
          }
        }
      }
    }
    EXPECT_EQ(item, p.items().size()) << what << ": items of no token";
  }
}

// A decode token's keys split into parts that start at 0 or at a multiple
// of kv_split and end at the next multiple or at the length: [0, S), [S, 2S),
// ..., [kS, len) — for kv_split that divides the length and that does not.
TEST(AttentionPlan, DecodePartsAreAlignedAtMultiplesOfKvSplit) {
  for (const std::size_t split : {1, 3, 7, 16, 64, 100, 512}) {
    for (const std::int64_t len : {1, 2, 7, 16, 63, 64, 65, 100, 129, 300, 512, 513}) {
      Step s = make_step({{4, 20}, {1, len}, {2, 9}}, 8, 7, split);
      Plan p;
      ra::plan(p, s.shape, s.batch());
      std::vector<std::pair<std::size_t, std::size_t>> parts;
      for (const WorkItem& it : p.items()) {
        if (it.sequence == 1) parts.emplace_back(it.first_key, it.keys);
        if (it.sequence != 1) {
          EXPECT_EQ(it.first_key, 0u);  // prefill tokens: one item each, over every key
          EXPECT_EQ(it.keys, static_cast<std::size_t>(s.lengths[it.sequence]));
        }
      }
      const std::string what = "split " + std::to_string(split) + " length " + std::to_string(len);
      ASSERT_EQ(parts.size(), (static_cast<std::size_t>(len) + split - 1) / split) << what;
      for (std::size_t k = 0; k < parts.size(); ++k) {
        EXPECT_EQ(parts[k].first, k * split) << what << " part " << k;
        EXPECT_EQ(parts[k].first + parts[k].second,
                  std::min<std::size_t>(static_cast<std::size_t>(len), (k + 1) * split))
            << what << " part " << k;
      }
    }
  }
}

// A sequence with no new tokens: its block-table row is neither checked
// nor read (ids past the pool, -1, a page twice; its length past its
// pages), and a last such row need not exist at all: the plan is that of
// the batch without it, and it has no token and no item.
TEST(AttentionPlan, SequenceWithoutNewTokensIsNeitherCheckedNorRead) {
  const Step with = make_step({{1, 9}, {0, 12}, {3, 5}, {0, 30}}, 4, 3);
  std::vector<std::int32_t> table(with.table.begin(),
                                  with.table.begin() + static_cast<std::ptrdiff_t>(3 * with.stride));
  table[1 * with.stride + 0] = -1;
  table[1 * with.stride + 1] = std::numeric_limits<std::int32_t>::max();
  table[1 * with.stride + 2] = table[0];
  std::vector<std::int64_t> lengths = with.lengths;
  lengths[3] = static_cast<std::int64_t>(with.stride * 4 * 10);  // past its pages
  Batch b = with.batch();
  b.block_table = table.data();  // three rows: the fourth would be past the end
  b.lengths = lengths.data();
  Plan p;
  ASSERT_EQ(rope_test::thrown_message([&] { ra::plan(p, with.shape, b); }), "no exception");
  // The batch without sequences 1 and 3.
  Step without = with;
  without.q_starts = {0, 1, 4};
  without.lengths = {9, 5};
  without.table.assign(2 * with.stride, -7);
  std::copy_n(with.table.begin(), with.stride, without.table.begin());
  std::copy_n(with.table.begin() + static_cast<std::ptrdiff_t>(2 * with.stride), with.stride,
              without.table.begin() + static_cast<std::ptrdiff_t>(with.stride));
  Plan q;
  ra::plan(q, without.shape, without.batch());
  ASSERT_EQ(p.tokens(), q.tokens());
  for (std::size_t t = 0; t < p.tokens(); ++t) {
    EXPECT_EQ(p.position(t), q.position(t));
    EXPECT_EQ(p.slot(t), q.slot(t));
  }
  ASSERT_EQ(p.items().size(), q.items().size());
  for (std::size_t i = 0; i < p.items().size(); ++i) {
    const WorkItem &a = p.items()[i], &c = q.items()[i];
    EXPECT_EQ(a.sequence, c.sequence == 0 ? 0u : 2u);
    EXPECT_EQ(a.token, c.token);
    EXPECT_EQ(a.first_key, c.first_key);
    EXPECT_EQ(a.keys, c.keys);
  }
  // Its lengths are still checked against its (zero) new tokens.
  lengths[1] = -1;
  Step s = with;
  expect_refused("negative length without new tokens", p, s, "batch.lengths[1]", "got -1",
                 [&] { ra::plan(p, with.shape, b); });
}

// plan(p, shape, cached, new_tokens): the batch of one sequence over page
// 0 of a pool of one page (PagedCache::contiguous); more than its capacity
// is refused by name.
TEST(AttentionPlan, OneSequencePlanOverAContiguousCache) {
  const std::size_t capacity = 40, kv_heads = 2, d = 8, dv = 6;
  std::vector<float> k = rope_test::random_vector<float>(capacity * kv_heads * d, 5);
  std::vector<float> v = rope_test::random_vector<float>(capacity * kv_heads * dv, 6);
  const auto cache = PagedCache<float>::contiguous(View<float>::token_major(k.data(), capacity, kv_heads, d),
                                                   View<float>::token_major(v.data(), capacity, kv_heads, dv));
  ra::Shape shape = ra::Shape::of(cache, 4);
  EXPECT_EQ(shape.pages, 1u);
  EXPECT_EQ(shape.page_size, capacity);
  EXPECT_EQ(shape.v_head_dim, dv);
  shape.kv_split = 8;
  for (const auto& [cached, n] :
       std::vector<std::pair<std::size_t, std::size_t>>{{0, 12}, {12, 1}, {39, 1}, {30, 10}}) {
    Plan one, batch;
    ra::plan(one, shape, cached, n, 2);
    const std::int64_t starts[2] = {0, static_cast<std::int64_t>(n)}, length = static_cast<std::int64_t>(cached + n);
    const std::int32_t page = 0;
    ra::plan(batch, shape, Batch{starts, &length, &page, 1, 1}, 2);
    ASSERT_EQ(one.tokens(), n);
    for (std::size_t t = 0; t < n; ++t) {
      EXPECT_EQ(one.position(t), static_cast<std::int64_t>(cached + t));
      EXPECT_EQ(one.slot(t), static_cast<std::int64_t>(cached + t));  // page 0 of page_size capacity
    }
    ASSERT_EQ(one.items().size(), batch.items().size());
    for (std::size_t i = 0; i < one.items().size(); ++i) {
      EXPECT_EQ(one.items()[i].first_key, batch.items()[i].first_key);
      EXPECT_EQ(one.items()[i].keys, batch.items()[i].keys);
      EXPECT_EQ(one.items()[i].partial, batch.items()[i].partial);
    }
    const std::vector<float> q = rope_test::random_vector<float>(n * 4 * d, 7);
    std::vector<float> out_one(n * 4 * dv), out_batch(n * 4 * dv);
    ra::attend(one, cache, View<const float>::token_major(q.data(), n, 4, d),
               View<float>::token_major(out_one.data(), n, 4, dv));
    ra::attend(batch, cache, View<const float>::token_major(q.data(), n, 4, d),
               View<float>::token_major(out_batch.data(), n, 4, dv));
    EXPECT_EQ(std::memcmp(out_one.data(), out_batch.data(), out_one.size() * sizeof(float)), 0);
  }
}

// More than the contiguous cache holds is refused by name, and like every
// refused plan() it leaves the Plan holding no plan (plan.hpp: "A refused
// call leaves p holding no plan"), also one that held a good plan before.
// It failed until the one-sequence overload marked the Plan empty before
// its capacity check: attend ran the previous step's plan (its positions,
// slots and items) after the refusal.
TEST(AttentionPlan, RefusedOneSequencePlanLeavesNoPlan) {
  const std::size_t capacity = 40, kv_heads = 2, d = 8, dv = 6;
  std::vector<float> k = rope_test::random_vector<float>(capacity * kv_heads * d, 5);
  std::vector<float> v = rope_test::random_vector<float>(capacity * kv_heads * dv, 6);
  const auto cache = PagedCache<float>::contiguous(View<float>::token_major(k.data(), capacity, kv_heads, d),
                                                   View<float>::token_major(v.data(), capacity, kv_heads, dv));
  const ra::Shape shape = ra::Shape::of(cache, 4);
  for (const auto& case_ : std::vector<std::pair<std::size_t, std::size_t>>{
           {40, 1}, {0, 41}, {30, 11}, {static_cast<std::size_t>(-1), 2}}) {
    // Named copies, not a structured binding: a lambda captures them (C++17).
    const std::size_t cached = case_.first, n = case_.second;
    Plan p;
    ra::plan(p, shape, 0, 1);
    const std::string msg = rope_test::thrown_message([&] { ra::plan(p, shape, cached, n); });
    EXPECT_EQ(msg.rfind("rope::attention::plan: cached + new_tokens must be <= the contiguous cache's capacity "
                        "shape.page_size = 40",
                        0),
              0u)
        << msg;
    std::vector<float> out(4 * dv, -3.0f);
    const std::vector<float> q(4 * d, 1.0f);
    EXPECT_EQ(rope_test::thrown_message([&] {
                ra::attend(p, cache, View<const float>::token_major(q.data(), 1, 4, d),
                           View<float>::token_major(out.data(), 1, 4, dv));
              }).rfind(kNoPlan, 0),
              0u)
        << "cached " << cached << " new " << n << ": the refused plan() left the previous plan usable";
    EXPECT_EQ(out, std::vector<float>(4 * dv, -3.0f)) << "attend wrote out after a refused plan()";
  }
}

// The plan copies what it reads: the caller's starts, lengths and block
// table may change once plan() returns (a scheduler reuses its arrays) and
// the plan, and what attend reads through it, stay. A Plan refilled by a
// smaller step after a larger one is that step's plan.
TEST(AttentionPlan, PlanCopiesItsInputs) {
  Step s = make_step({{1, 37}, {5, 12}, {1, 80}, {2, 2}}, 8, 9, 16);
  const Step original = s;
  const std::vector<float> q = rope_test::random_vector<float>(s.tokens() * 4 * 8, 10);
  Plan p;
  ra::plan(p, s.shape, s.batch(), 3);
  const std::vector<std::int64_t> positions(p.positions(), p.positions() + p.tokens());
  std::vector<std::int64_t> slots;
  for (std::size_t t = 0; t < p.tokens(); ++t) slots.push_back(p.slot(t));
  const std::vector<WorkItem> items = p.items();
  const std::vector<float> want = attend(p, s, q);
  // The scheduler's next step in the same arrays.
  std::fill(s.q_starts.begin() + 1, s.q_starts.end(), 1);
  std::fill(s.lengths.begin(), s.lengths.end(), 3);
  std::reverse(s.table.begin(), s.table.end());
  ASSERT_EQ(p.tokens(), positions.size());
  for (std::size_t t = 0; t < p.tokens(); ++t) {
    EXPECT_EQ(p.position(t), positions[t]);
    EXPECT_EQ(p.slot(t), slots[t]);
  }
  ASSERT_EQ(p.items().size(), items.size());
  for (std::size_t i = 0; i < items.size(); ++i) {
    EXPECT_EQ(p.items()[i].sequence, items[i].sequence);
    EXPECT_EQ(p.items()[i].token, items[i].token);
    EXPECT_EQ(p.items()[i].first_key, items[i].first_key);
    EXPECT_EQ(p.items()[i].keys, items[i].keys);
    EXPECT_EQ(p.items()[i].partial, items[i].partial);
  }
  s.q_starts = original.q_starts;  // attend's sizes; the table stays reversed
  const std::vector<float> got = attend(p, s, q);
  EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0);
  // Refilled by a smaller step, then by the first again.
  Step small = make_step({{1, 3}}, 8, 11, 16);
  small.shape = original.shape;
  ra::plan(p, small.shape, small.batch());
  EXPECT_EQ(p.tokens(), 1u);
  EXPECT_EQ(p.sequences(), 1u);
  ASSERT_EQ(p.items().size(), 1u);
  EXPECT_EQ(p.items()[0].keys, 3u);
  EXPECT_EQ(p.position(0), 2);
  EXPECT_EQ(p.slot(0), small.table[0] * 8 + 2);
  Step again = original;
  ra::plan(p, again.shape, again.batch(), 3);
  const std::vector<float> out = attend(p, again, q);
  EXPECT_EQ(std::memcmp(out.data(), want.data(), want.size() * sizeof(float)), 0);
}

}  // namespace
