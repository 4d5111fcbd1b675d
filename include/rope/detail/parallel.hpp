// rope/detail/parallel.hpp — the threads of one call.
//
// rope starts the threads a call asks for (Options::threads,
// SoftmaxOptions::threads, ...) and joins them before it returns: no pool
// lives between calls, so a library user never meets a thread they did not
// ask for. Or, with an Executor (rope/executor.hpp), the same shares run on
// the caller's pool. The tensor API's token loop and the attention module
// share this.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "../executor.hpp"

namespace rope::detail {

// How many shares a call splits its work into: the executor's workers when
// one is set (rope/executor.hpp), else the threads it asks for.
inline std::size_t thread_count(std::size_t threads, const Executor& executor) noexcept {
  return executor.set() ? executor.workers : threads;
}

// One share of run_workers: the task, and where its exception goes.
struct WorkerShares {
  void (*task)(void*, std::size_t);
  void* context;
  std::exception_ptr* errors;  // one per share
};

inline void run_share(const WorkerShares* shares, std::size_t w) noexcept {
  try {
    shares->task(shares->context, w);
  } catch (...) {
    shares->errors[w] = std::current_exception();
  }
}

// Runs task(context, w) for w = 0 .. workers-1 (workers >= 2), each on its
// own thread or the executor's, and rethrows the first worker's exception
// after all have finished. Not a template, and std::thread started on a
// plain function: the threads, the exception plumbing and std::thread's own
// templates are compiled once per translation unit, however many kinds of
// work it runs (they were a tenth of what a header-only user paid to
// compile one rope::apply).
inline void run_workers(std::size_t workers, const Executor& executor, void (*task)(void*, std::size_t),
                        void* context) {
  const std::unique_ptr<std::exception_ptr[]> errors(new std::exception_ptr[workers]);
  const WorkerShares shares{task, context, errors.get()};
  void* const shared = const_cast<void*>(static_cast<const void*>(&shares));
  if (executor.set()) {
    executor.parallel_for(
        executor.context, workers, [](void* s, std::size_t w) { run_share(static_cast<const WorkerShares*>(s), w); },
        shared);
  } else {
    const std::unique_ptr<std::thread[]> pool(new std::thread[workers - 1]);
    std::size_t started = 1;
    for (; started < workers; ++started) {
      try {
        pool[started - 1] = std::thread(run_share, &shares, started);
      } catch (...) {
        break;
      }
    }
    for (std::size_t w = started; w < workers; ++w) run_share(&shares, w);
    run_share(&shares, 0);
    for (std::size_t w = 1; w < started; ++w) pool[w - 1].join();
  }
  for (std::size_t w = 0; w < workers; ++w) {
    if (errors[w]) std::rethrow_exception(errors[w]);
  }
}

// run_workers of share(w), w = 0 .. workers-1.
template <class Share>
void run_shares(std::size_t workers, const Executor& executor, const Share& share) {
  const auto task = [](void* context, std::size_t w) { (*static_cast<const Share*>(context))(w); };
  run_workers(workers, executor, task, const_cast<void*>(static_cast<const void*>(&share)));
}

// Runs work(item, worker) for items 0 .. count-1 in min(threads, count)
// shares (at least 1): on `threads` threads (the caller is one of them), or
// handed to `executor` as one task per share when it is set. Item i always
// goes to the same contiguous share whatever the thread count, and each item
// is computed the same way, so the results depend neither on the count nor
// on who runs the shares. A thread that cannot start has its share run by
// the caller; an exception in a share (memory exhausted) is rethrown here
// after every share has finished.
template <class Work>
void parallel_for(std::size_t count, std::size_t threads, const Executor& executor, Work&& work) {
  const std::size_t workers = std::max<std::size_t>(1, std::min(threads, count));
  const auto share = [&](std::size_t w) {
    for (std::size_t i = count * w / workers; i < count * (w + 1) / workers; ++i) work(i, w);
  };
  if (workers == 1) {
    share(0);
    return;
  }
  run_shares(workers, executor, share);
}

// parallel_for in contiguous shares of about equal cost rather than equal
// counts, for items whose costs differ (cost(i), any non-negative measure):
// item i goes to share floor(workers * m_i / total), m_i the cost before it
// plus half its own, so a share's items are consecutive and the shares'
// costs differ by at most about one item's. An item is computed the same way
// whichever share runs it. The boundaries take workers + 1 indices.
template <class Cost, class Work>
void parallel_for_costs(std::size_t count, std::size_t threads, const Executor& executor, Cost&& cost, Work&& work) {
  const std::size_t workers = std::max<std::size_t>(1, std::min(threads, count));
  std::uint64_t total = 0;
  if (workers > 1) {
    for (std::size_t i = 0; i < count; ++i) total += cost(i);
  }
  if (total == 0) {
    parallel_for(count, threads, executor, std::forward<Work>(work));
    return;
  }
  std::vector<std::size_t> first(workers + 1, count);
  first[0] = 0;
  std::uint64_t before = 0;
  std::size_t share = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const std::uint64_t c = cost(i);
    const auto w = static_cast<std::size_t>(workers * (2 * before + c) / (2 * total));
    while (share < w && share < workers - 1) first[++share] = i;
    before += c;
  }
  run_shares(workers, executor, [&](std::size_t w) {
    for (std::size_t i = first[w]; i < first[w + 1]; ++i) work(i, w);
  });
}

template <class Work>
void parallel_for(std::size_t count, std::size_t threads, Work&& work) {
  parallel_for(count, threads, Executor{}, std::forward<Work>(work));
}

}  // namespace rope::detail
