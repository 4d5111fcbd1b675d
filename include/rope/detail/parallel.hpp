// rope/detail/parallel.hpp — the threads of one call.
//
// rope starts the threads a call asks for (Options::threads,
// SoftmaxOptions::threads, ...) and joins them before it returns: no pool
// lives between calls, so a library user never meets a thread they did not
// ask for. The tensor API's token loop and the attention module share this.
#pragma once

#include <algorithm>
#include <cstddef>
#include <exception>
#include <thread>
#include <vector>

namespace rope::detail {

// Runs work(item, worker) for items 0 .. count-1 on `threads` threads (the
// caller is one of them). Item i always goes to the same contiguous share
// whatever the thread count, and each item is computed the same way, so the
// results do not depend on it. A thread that cannot start has its share run
// by the caller; an exception in a worker (memory exhausted) is rethrown
// here after every thread has joined.
template <class Work>
void parallel_for(std::size_t count, std::size_t threads, Work&& work) {
  const std::size_t workers = std::max<std::size_t>(1, std::min(threads, count));
  const auto share = [&](std::size_t w) {
    for (std::size_t i = count * w / workers; i < count * (w + 1) / workers; ++i) work(i, w);
  };
  if (workers == 1) {
    share(0);
    return;
  }
  std::vector<std::exception_ptr> errors(workers);
  const auto guarded = [&](std::size_t w) noexcept {
    try {
      share(w);
    } catch (...) {
      errors[w] = std::current_exception();
    }
  };
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
  for (const auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace rope::detail
