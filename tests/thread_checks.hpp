// The thread checks of the attention suites (tests/properties/
// test_attention_threads*.cpp): the bytes of a call for any thread count
// and with the caller's executors, against one thread.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <rope/executor.hpp>

#include "attention_heads.hpp"
#include "executors.hpp"

namespace attention_test {

// The same bytes from rope's threads, a pool's executor and one that runs
// the shares backwards on the caller, for each worker count. call(out,
// threads) takes its threads as rope::Threads: a count or an executor.
template <class Call>
void expect_same_bytes_with_executors(std::size_t size, Call call, const std::string& what) {
  std::vector<float> one(size, -7.0f);
  call(one, rope::Threads(1));
  rope_test::ThreadPool pool(3);
  for (const std::size_t workers : {2, 3, 7}) {
    std::vector<float> threads(size, -7.0f), pooled(size, -7.0f), reversed(size, -7.0f);
    call(threads, rope::Threads(workers));
    const std::size_t before = pool.tasks_run();
    call(pooled, rope::Threads(pool.executor(workers)));
    rope_test::ReverseExecutor backwards;
    call(reversed, rope::Threads(backwards.executor(workers)));
    EXPECT_TRUE(same_bytes(one, threads)) << what << " threads " << workers;
    EXPECT_TRUE(same_bytes(one, pooled)) << what << " pool " << workers;
    EXPECT_TRUE(same_bytes(one, reversed)) << what << " reversed " << workers;
    EXPECT_GT(pool.tasks_run(), before) << what << " workers " << workers;
    EXPECT_GT(backwards.tasks_run, 0u) << what << " workers " << workers;
  }
}

// The bytes of f(threads) for threads = 1 against 2, 3, 5, 8, 9 and 64: a
// thread count that divides the heads, one that does not, more threads than
// heads, more than items.
template <class F>
void expect_same_bytes_for_any_thread_count(F&& run, const std::string& what) {
  const auto one = run(std::size_t{1});
  for (const std::size_t threads : {2, 3, 5, 8, 9, 64}) {
    EXPECT_TRUE(same_bytes(one, run(threads))) << what << ", threads " << threads;
  }
}

}  // namespace attention_test
