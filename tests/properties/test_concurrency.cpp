// Many threads sharing one const rope::Table (and one Frequencies), each
// rotating its own tensors with the SIMD kernels, rope::apply and
// rope::apply_qk (themselves split over worker threads), computing rows
// with rope::angles and building tables of their own, or handing their
// token chunks to the caller's executor: every result is bit for bit the
// single-threaded one. The tsan preset runs this file under
// ThreadSanitizer, which fails the run on any data race.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <rope/angles.hpp>
#include <rope/apply.hpp>
#include <rope/detail/parallel.hpp>
#include <rope/frequencies.hpp>
#include <rope/half.hpp>
#include <rope/kernels.hpp>
#include <rope/table.hpp>

#include "executors.hpp"
#include "support.hpp"

namespace {

using rope::Direction;
using rope::Style;

constexpr std::size_t kThreads = 8;
constexpr std::size_t kRotaryDim = 96;  // 48 pairs: a SIMD body and a tail
constexpr std::size_t kHeadDim = 100;
constexpr std::size_t kTokens = 64;
constexpr std::size_t kHeads = 4;
constexpr std::size_t kPositions = 2048;

// Thread i's positions: its own pattern, so threads read different rows of
// the shared table at the same time (and some the same rows).
std::size_t position_of(std::size_t thread, std::size_t token) {
  return (thread * 997 + token * 31 + (token % 3 == 0 ? kPositions - 1 : 0)) % kPositions;
}

template <class T>
std::vector<T> rotate_tensor(const rope::Table<T>& table, std::size_t thread, Direction dir) {
  auto x = rope_test::random_vector<T>(kTokens * kHeads * kHeadDim, static_cast<std::uint32_t>(thread + 1));
  for (std::size_t t = 0; t < kTokens; ++t) {
    const std::size_t m = position_of(thread, t);
    for (std::size_t h = 0; h < kHeads; ++h) {
      T* row = x.data() + (t * kHeads + h) * kHeadDim;
      if (h % 2 == 0) {
        rope::rotate<Style::rotate_half>(row, row, table.cos(m), table.sin(m), kRotaryDim, dir);
      } else {
        rope::rotate<Style::block_diagonal>(row, row, table.cos(m), table.sin(m), kRotaryDim, dir);
      }
    }
  }
  return x;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

template <class T>
void run_shared_table_test() {
  const rope::Table<T> table(rope::frequencies(kRotaryDim, 500000.0), kPositions);
  std::vector<std::vector<T>> expected(kThreads);
  for (std::size_t i = 0; i < kThreads; ++i) {
    expected[i] = rotate_tensor(table, i, i % 2 ? Direction::inverse : Direction::forward);
  }

  std::vector<std::vector<T>> got(kThreads);
  std::atomic<std::size_t> ready{0};
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      // Start together, so the reads of the shared table overlap.
      ready.fetch_add(1);
      while (ready.load() < kThreads) std::this_thread::yield();
      got[i] = rotate_tensor(table, i, i % 2 ? Direction::inverse : Direction::forward);
    });
  }
  for (auto& t : threads) t.join();
  for (std::size_t i = 0; i < kThreads; ++i) EXPECT_TRUE(same_bits(got[i], expected[i])) << "thread " << i;
}

TEST(Concurrency, ThreadsRotatingWithOneSharedFloatTable) { run_shared_table_test<float>(); }
TEST(Concurrency, ThreadsRotatingWithOneSharedDoubleTable) { run_shared_table_test<double>(); }

// Building tables, computing frequencies and on-the-fly rows read only the
// shared const Frequencies: equal to the single-threaded results.
TEST(Concurrency, ThreadsBuildingTablesAndAnglesFromSharedFrequencies) {
  const auto freqs = rope::frequencies(kRotaryDim, 10000.0, rope::scaling::Linear{4.0});
  const rope::Table<float> reference(freqs, 256);
  std::vector<int> ok(kThreads, 0);
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      const rope::Table<float> mine(freqs, 256);
      bool same = true;
      std::vector<float> cos(kRotaryDim / 2), sin(kRotaryDim / 2);
      for (std::size_t m = i; m < 256; m += 3) {
        same = same && std::memcmp(mine.cos(m), reference.cos(m), kRotaryDim * sizeof(float)) == 0;
        rope::angles<float>(freqs, m, cos.data(), sin.data());
        same = same && std::memcmp(cos.data(), reference.cos(m), cos.size() * sizeof(float)) == 0 &&
               std::memcmp(sin.data(), reference.sin(m), sin.size() * sizeof(float)) == 0;
      }
      const auto again = rope::frequencies(kRotaryDim, 10000.0, rope::scaling::Linear{4.0});
      same = same && again.inv_freq == freqs.inv_freq;
      ok[i] = same ? 1 : 0;
    });
  }
  for (auto& t : threads) t.join();
  for (std::size_t i = 0; i < kThreads; ++i) EXPECT_EQ(ok[i], 1) << "thread " << i;
}

// rope::apply_qk from many threads at once on one shared table, each call
// also splitting its tokens over options.threads workers, and rope::apply
// out of place reading one shared const input: equal to the same calls made
// one at a time with one thread.
TEST(Concurrency, ApplyFromManyThreadsWithOneSharedTable) {
  const rope::Table<float> table(rope::frequencies(kRotaryDim, 10000.0), kPositions);
  constexpr std::size_t kKvHeads = 2;
  const auto shared_input = rope_test::random_vector<float>(kTokens * kHeads * kHeadDim, 4242u);
  struct Work {
    std::vector<float> q, k, out;
    std::vector<std::int64_t> positions;
  };
  const auto make_work = [&](std::size_t i) {
    Work w;
    w.q = rope_test::random_vector<float>(kTokens * kHeads * kHeadDim, static_cast<std::uint32_t>(100 + i));
    w.k = rope_test::random_vector<float>(kTokens * kKvHeads * kHeadDim, static_cast<std::uint32_t>(200 + i));
    w.out.assign(kTokens * kHeads * kHeadDim, 0.0f);
    for (std::size_t t = 0; t < kTokens; ++t) w.positions.push_back(static_cast<std::int64_t>(position_of(i, t)));
    return w;
  };
  const auto run = [&](Work& w, std::size_t i, std::size_t threads) {
    rope::Options o;
    o.threads = threads;
    o.direction = i % 2 ? Direction::inverse : Direction::forward;
    const Style style = i % 3 ? Style::rotate_half : Style::block_diagonal;
    rope::apply_qk(rope::View<float>::token_major(w.q.data(), kTokens, kHeads, kHeadDim),
                   rope::View<float>::token_major(w.k.data(), kTokens, kKvHeads, kHeadDim), table, style,
                   w.positions.data(), o);
    rope::apply<float>(rope::View<const float>::token_major(shared_input.data(), kTokens, kHeads, kHeadDim),
                       rope::View<float>::token_major(w.out.data(), kTokens, kHeads, kHeadDim), table, style,
                       w.positions.data(), o);
  };

  std::vector<Work> expected, got;
  for (std::size_t i = 0; i < kThreads; ++i) {
    expected.push_back(make_work(i));
    run(expected.back(), i, 1);
    got.push_back(make_work(i));
  }
  std::atomic<std::size_t> ready{0};
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      ready.fetch_add(1);
      while (ready.load() < kThreads) std::this_thread::yield();
      run(got[i], i, 1 + i % 3);
    });
  }
  for (auto& t : threads) t.join();
  for (std::size_t i = 0; i < kThreads; ++i) {
    EXPECT_TRUE(same_bits(got[i].q, expected[i].q)) << "q of thread " << i;
    EXPECT_TRUE(same_bits(got[i].k, expected[i].k)) << "k of thread " << i;
    EXPECT_TRUE(same_bits(got[i].out, expected[i].out)) << "out of thread " << i;
  }
}

// rope::apply (in place and out of place, 16-bit too) and rope::apply_qk
// with the caller's executor: a pool's threads or the chunks run backwards
// on the caller give the bytes of threads = 1 and of threads = workers.
template <class T>
void run_executor_test() {
  const rope::Table<float> table(rope::frequencies(kRotaryDim, 10000.0), kPositions);
  constexpr std::size_t kKvHeads = 2;
  const auto input = rope_test::random_vector<T>(kTokens * kHeads * kHeadDim, 77u);
  const auto k_input = rope_test::random_vector<T>(kTokens * kKvHeads * kHeadDim, 78u);
  std::vector<std::int64_t> positions;
  for (std::size_t t = 0; t < kTokens; ++t) positions.push_back(static_cast<std::int64_t>(position_of(3, t)));
  struct Out {
    std::vector<T> q, k, out;
  };
  const auto run = [&](std::size_t threads, const rope::Executor& e) {
    rope::Options o;
    o.threads = threads;
    o.executor = e;
    Out r{input, k_input, std::vector<T>(input.size())};
    rope::apply_qk(rope::View<T>::token_major(r.q.data(), kTokens, kHeads, kHeadDim),
                   rope::View<T>::token_major(r.k.data(), kTokens, kKvHeads, kHeadDim), table, Style::rotate_half,
                   positions.data(), o);
    o.stores = rope::Stores::streaming;
    rope::apply<T>(rope::View<const T>::token_major(input.data(), kTokens, kHeads, kHeadDim),
                   rope::View<T>::token_major(r.out.data(), kTokens, kHeads, kHeadDim), table, Style::block_diagonal,
                   17, o);
    return r;
  };
  const Out one = run(1, {});
  rope_test::ThreadPool pool(3);
  for (const std::size_t workers : {2, 3, 5, 200}) {
    rope_test::ReverseExecutor backwards;
    const std::size_t before = pool.tasks_run();
    const Out outs[] = {run(workers, {}), run(1, pool.executor(workers)), run(1, backwards.executor(workers))};
    for (const Out& r : outs) {
      EXPECT_TRUE(same_bits(r.q, one.q)) << "q, workers " << workers;
      EXPECT_TRUE(same_bits(r.k, one.k)) << "k, workers " << workers;
      EXPECT_TRUE(same_bits(r.out, one.out)) << "out, workers " << workers;
    }
    EXPECT_GT(pool.tasks_run(), before);
    EXPECT_GT(backwards.tasks_run, 0u);
  }
}

TEST(Concurrency, ExecutorGivesTheBytesOfThreadsFloat) { run_executor_test<float>(); }
TEST(Concurrency, ExecutorGivesTheBytesOfThreadsBFloat16) { run_executor_test<rope::BFloat16>(); }

// An executor set with no workers is refused by name, and nothing is written.
TEST(Concurrency, ExecutorWithoutWorkersIsRefused) {
  const rope::Table<float> table(rope::frequencies(kRotaryDim, 10000.0), kPositions);
  auto x = rope_test::random_vector<float>(kTokens * kHeads * kHeadDim, 79u);
  const auto before = x;
  rope_test::ReverseExecutor backwards;
  rope::Options o;
  o.executor = backwards.executor(0);
  const std::string tail =
      "options.executor.workers must be at least 1 when options.executor.parallel_for is set, got 0";
  EXPECT_EQ(rope_test::thrown_message([&] {
              rope::apply<float>(rope::View<float>::token_major(x.data(), kTokens, kHeads, kHeadDim), table,
                                 Style::rotate_half, 0, o);
            }),
            "rope::apply: " + tail);
  EXPECT_EQ(rope_test::thrown_message([&] {
              rope::apply_qk(rope::View<float>::token_major(x.data(), kTokens, kHeads / 2, kHeadDim),
                             rope::View<float>::token_major(x.data() + kTokens * kHeads / 2 * kHeadDim, kTokens,
                                                            kHeads / 2, kHeadDim),
                             table, Style::rotate_half, 0, o);
            }),
            "rope::apply_qk: " + tail);
  EXPECT_TRUE(same_bits(x, before));
  EXPECT_EQ(backwards.tasks_run, 0u);
}

// detail::parallel_for: an exception thrown by a work item on one worker (a
// started thread, not the caller) is rethrown by the call only after every
// thread has joined: when the caller catches it, every item of the other
// workers has run exactly once, although they were still sleeping when the
// item threw. The throwing worker's share stops at the throwing item (the
// items before it ran, none after it).
TEST(Concurrency, ParallelForRethrowsAWorkersExceptionAfterAllJoined) {
  constexpr std::size_t kCount = 40, kThreads = 4;  // shares of 10 items
  constexpr std::size_t kThrowing = 23;             // worker 2's fourth item
  std::vector<std::atomic<int>> runs(kCount);
  for (auto& r : runs) r = 0;
  std::vector<std::size_t> worker_of(kCount, kThreads);
  std::size_t caught = 0;
  try {
    rope::detail::parallel_for(kCount, kThreads, [&](std::size_t i, std::size_t w) {
      worker_of[i] = w;
      if (i == kThrowing) throw std::runtime_error("item 23");
      if (w != 2) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      runs[i].fetch_add(1);
    });
    ADD_FAILURE() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "item 23");
    ++caught;
    // Read here, in the handler: the joins must already have happened.
    for (std::size_t i = 0; i < kCount; ++i) {
      const std::size_t w = i / (kCount / kThreads);
      const int expected = (w != 2 || i < kThrowing) ? 1 : 0;
      EXPECT_EQ(runs[i].load(), expected) << "item " << i;
      if (i <= kThrowing || w != 2) {
        EXPECT_EQ(worker_of[i], w) << "item " << i;
      }
    }
  }
  EXPECT_EQ(caught, 1u);
}

// ---- The executor contract of rope/executor.hpp, clause by clause, with
// rope::apply as the caller.

// An executor that runs the shares on the calling thread, in order or
// backwards, and records what it was asked: how many calls, and the share
// count n of each. after(i) runs once share i is done.
struct RecordingExecutor {
  std::size_t calls = 0;
  std::vector<std::size_t> shares;  // n of each call
  bool backwards = false;
  std::function<void(std::size_t)> after;

  rope::Executor executor(std::size_t workers) {
    rope::Executor e;
    e.parallel_for = [](void* self, std::size_t n, void (*task)(void*, std::size_t), void* context) {
      auto& me = *static_cast<RecordingExecutor*>(self);
      ++me.calls;
      me.shares.push_back(n);
      for (std::size_t k = 0; k < n; ++k) {
        const std::size_t i = me.backwards ? n - 1 - k : k;
        task(context, i);
        if (me.after) me.after(i);
      }
    };
    e.context = this;
    e.workers = workers;
    return e;
  }
};

// A 16-bit storage type of the caller's own (half.hpp converts it with its
// conversions, one value at a time, inside each share) that notes the
// thread of every conversion: where the shares of a call ran.
struct Traced16 {
  std::uint16_t bits;
  Traced16() = default;
  explicit Traced16(float f) noexcept : bits(rope::detail::float_to_bfloat16_bits(f)) { note(); }
  explicit operator float() const noexcept {
    note();
    return rope::detail::bfloat16_bits_to_float(bits);
  }
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static std::set<std::thread::id>& threads() {
    static std::set<std::thread::id> seen;
    return seen;
  }
  static void note() noexcept {
    const std::lock_guard<std::mutex> lock(mutex());
    threads().insert(std::this_thread::get_id());
  }
  // The threads that converted a value since the last call.
  static std::set<std::thread::id> take() {
    const std::lock_guard<std::mutex> lock(mutex());
    std::set<std::thread::id> seen;
    seen.swap(threads());
    return seen;
  }
};
static_assert(rope::detail::is_foreign_16bit<Traced16>::value, "rope converts Traced16 with its own conversions");

// A call of rope::apply with an executor of `workers` over `tokens` tokens
// hands the executor exactly n = min(workers, tokens) shares in one call
// (none when n is 1); share i writes a run of whole tokens of its own, the
// runs in the order of i, none empty, together every token once; and the
// result is the bytes of threads = 1. Out of place, into an output that
// holds a sentinel, so that what each share wrote shows after it ran.
TEST(ExecutorContract, ACallHandsTheExecutorOneShareAWorkerAtMostEachItsOwnTokens) {
  constexpr std::size_t kDim = 16;
  const rope::Table<float> table(rope::frequencies(kDim, 10000.0), kPositions);
  for (const std::size_t tokens : {1, 2, 3, 7, 64}) {
    const auto x = rope_test::random_vector<float>(tokens * kHeads * kDim, static_cast<std::uint32_t>(tokens));
    const rope::View<const float> in = rope::View<const float>::token_major(x.data(), tokens, kHeads, kDim);
    std::vector<float> one(x.size());
    rope::apply<float>(in, rope::View<float>::token_major(one.data(), tokens, kHeads, kDim), table, Style::rotate_half,
                       5);
    const std::uint32_t sentinel_bits = 0x7fc0beefu;  // a NaN the rotation of finite values never writes
    float sentinel;
    std::memcpy(&sentinel, &sentinel_bits, sizeof(float));
    const std::size_t token_size = kHeads * kDim;
    for (const std::size_t workers : {1, 2, 3, 5, 64, 200}) {
      for (const bool backwards : {false, true}) {
        const std::string where = "tokens " + std::to_string(tokens) + " workers " + std::to_string(workers) +
                                  (backwards ? " backwards" : "");
        std::vector<float> out(x.size(), sentinel);
        const auto written = [&](std::size_t t) {
          return std::memcmp(&out[t * token_size], &one[t * token_size], token_size * sizeof(float)) == 0;
        };
        // Which share first wrote each token (tokens not yet written: none).
        constexpr std::size_t kNone = std::numeric_limits<std::size_t>::max();
        std::vector<std::size_t> writer(tokens, kNone);
        RecordingExecutor recorder;
        recorder.backwards = backwards;
        recorder.after = [&](std::size_t i) {
          for (std::size_t t = 0; t < tokens; ++t) {
            if (writer[t] == kNone && written(t)) writer[t] = i;
          }
        };
        rope::Options o;
        o.executor = recorder.executor(workers);
        rope::apply<float>(in, rope::View<float>::token_major(out.data(), tokens, kHeads, kDim), table,
                           Style::rotate_half, 5, o);
        EXPECT_TRUE(same_bits(out, one)) << where << ": not the bytes of threads = 1";
        const std::size_t n = std::min(workers, tokens);
        if (n == 1) {
          EXPECT_EQ(recorder.calls, 0u) << where << ": one share, yet the executor was called";
          continue;
        }
        ASSERT_EQ(recorder.calls, 1u) << where;
        EXPECT_EQ(recorder.shares[0], n) << where << ": the share count is min(workers, tokens)";
        std::vector<std::size_t> share_tokens(n, 0);
        for (std::size_t t = 0; t < tokens; ++t) {
          ASSERT_LT(writer[t], n) << where << ": token " << t << " written by no share";
          if (t > 0) {
            EXPECT_LE(writer[t - 1], writer[t]) << where << ": share runs out of order at token " << t;
          }
          ++share_tokens[writer[t]];
        }
        for (std::size_t i = 0; i < n; ++i)
          EXPECT_GT(share_tokens[i], 0u) << where << ": share " << i << " wrote nothing";
      }
    }
  }
}

// One share runs on the calling thread, without the executor: an executor
// of one worker, or one token whatever the workers. With two shares or
// more, on a pool that runs them on its own threads, no value is converted
// on the calling thread: the trace tells the two apart.
TEST(ExecutorContract, OneShareRunsOnTheCallingThreadWithoutTheExecutor) {
  constexpr std::size_t kDim = 16;
  const rope::Table<float> table(rope::frequencies(kDim, 10000.0), kPositions);
  rope_test::ThreadPool pool(3);
  for (const std::size_t tokens : {1, 9}) {
    const auto values =
        rope_test::random_vector<float>(tokens * kHeads * kDim, static_cast<std::uint32_t>(30 + tokens));
    std::vector<Traced16> x(values.size());
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = Traced16(values[i]);
    std::vector<Traced16> one = x;
    rope::apply(rope::View<Traced16>::token_major(one.data(), tokens, kHeads, kDim), table, Style::block_diagonal, 2);
    for (const std::size_t workers : {1, 4}) {
      const std::string where = "tokens " + std::to_string(tokens) + " workers " + std::to_string(workers);
      std::vector<Traced16> y = x;
      rope::Options o;
      o.executor = pool.executor(workers);
      const std::size_t tasks_before = pool.tasks_run();
      Traced16::take();
      rope::apply(rope::View<Traced16>::token_major(y.data(), tokens, kHeads, kDim), table, Style::block_diagonal, 2,
                  o);
      const std::set<std::thread::id> seen = Traced16::take();
      EXPECT_EQ(std::memcmp(y.data(), one.data(), y.size() * sizeof(Traced16)), 0) << where;
      ASSERT_FALSE(seen.empty()) << where << ": no conversion traced";
      const bool on_caller = seen.count(std::this_thread::get_id()) != 0;
      if (std::min(workers, tokens) == 1) {
        EXPECT_EQ(pool.tasks_run(), tasks_before) << where << ": one share, yet the executor ran tasks";
        EXPECT_TRUE(on_caller && seen.size() == 1) << where << ": one share ran off the calling thread";
      } else {
        EXPECT_EQ(pool.tasks_run(), tasks_before + std::min(workers, tokens)) << where;
        EXPECT_FALSE(on_caller) << where << ": the pool's shares converted on the calling thread";
      }
    }
  }
}

// An exception thrown in one share reaches the caller only after every
// share has run: through the executor, share 0 throws on its first item,
// before the others have started (on the calling thread, in order) or while
// they sleep (on a pool); when the caller catches it, every other share has
// run every item, counted once each. rope::apply's own shares cannot throw
// (they are noexcept: every allocation is made before the first), so the
// clause is held on detail::parallel_for and parallel_for_costs, through
// which rope::apply hands its shares to the executor.
TEST(ExecutorContract, AnExceptionInOneShareIsRethrownAfterEveryShareRan) {
  constexpr std::size_t kCount = 40, kWorkers = 4;  // shares of 10 items
  rope_test::ThreadPool pool(3);
  RecordingExecutor in_order;
  for (const bool costs : {false, true}) {
    for (const rope::Executor& executor : {in_order.executor(kWorkers), pool.executor(kWorkers)}) {
      const std::string where = std::string(costs ? "parallel_for_costs" : "parallel_for") +
                                (executor.context == &pool ? " on a pool" : " on the calling thread");
      std::vector<std::atomic<int>> runs(kCount);
      for (auto& r : runs) r = 0;
      std::vector<std::size_t> share_of(kCount, kWorkers);
      const auto work = [&](std::size_t i, std::size_t w) {
        share_of[i] = w;
        if (i == 0) throw std::runtime_error("share 0");
        if (w != 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        runs[i].fetch_add(1);
      };
      std::size_t caught = 0;
      try {
        if (costs) {
          rope::detail::parallel_for_costs(
              kCount, kWorkers, executor, [](std::size_t) { return std::uint64_t{1}; }, work);
        } else {
          rope::detail::parallel_for(kCount, kWorkers, executor, work);
        }
        ADD_FAILURE() << where << ": no exception";
      } catch (const std::runtime_error& e) {
        ++caught;
        EXPECT_STREQ(e.what(), "share 0") << where;
        // Read in the handler: every share must have finished already.
        // Share w holds items 10 w .. 10 w + 9 (parallel_for_costs gives
        // items of equal cost the same split); share 0 stopped at item 0.
        std::size_t ran = 0;
        for (std::size_t i = 0; i < kCount; ++i) {
          const std::size_t w = i / (kCount / kWorkers);
          EXPECT_EQ(runs[i].load(), w == 0 ? 0 : 1) << where << " item " << i;
          ran += static_cast<std::size_t>(runs[i].load());
          if (w != 0 || i == 0) {
            EXPECT_EQ(share_of[i], w) << where << " item " << i;
          }
        }
        EXPECT_EQ(ran, kCount - kCount / kWorkers) << where << ": items of the other shares run";
      }
      EXPECT_EQ(caught, 1u) << where;
    }
  }
}

}  // namespace
