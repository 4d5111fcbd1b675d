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
#include <exception>
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

// Runs task(context, w) for w = 0 .. workers-1 (workers >= 2), each on its
// own thread or the executor's, and rethrows the first worker's exception
// after all have finished. Not a template: the threads, the exception
// plumbing and std::thread's own templates are compiled once per
// translation unit, however many kinds of work it runs.
inline void run_workers(std::size_t workers, const Executor& executor, void (*task)(void*, std::size_t),
                        void* context) {
  std::vector<std::exception_ptr> errors(workers);
  const auto guarded = [&](std::size_t w) noexcept {
    try {
      task(context, w);
    } catch (...) {
      errors[w] = std::current_exception();
    }
  };
  if (executor.set()) {
    using Guarded = decltype(guarded);
    const auto run = [](void* guard, std::size_t w) { (*static_cast<const Guarded*>(guard))(w); };
    executor.parallel_for(executor.context, workers, run, const_cast<void*>(static_cast<const void*>(&guarded)));
  } else {
    std::vector<std::thread> pool;
    pool.reserve(workers - 1);
    std::size_t started = 1;
    for (; started < workers; ++started) {
      try {
        pool.emplace_back(guarded, started);
      } catch (...) {
        break;
      }
    }
    for (std::size_t w = started; w < workers; ++w) guarded(w);
    guarded(0);
    for (auto& t : pool) t.join();
  }
  for (const auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
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
  using Share = decltype(share);
  const auto task = [](void* context, std::size_t w) { (*static_cast<const Share*>(context))(w); };
  run_workers(workers, executor, task, const_cast<void*>(static_cast<const void*>(&share)));
}

template <class Work>
void parallel_for(std::size_t count, std::size_t threads, Work&& work) {
  parallel_for(count, threads, Executor{}, std::forward<Work>(work));
}

}  // namespace rope::detail
