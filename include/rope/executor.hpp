// rope/executor.hpp — the caller's threads: an Executor hands a threaded
// call's work to a pool the caller already runs, instead of rope starting
// and joining threads of its own; Threads says either in one value.
//
// A call that splits its work into `w` shares (Options::threads, or
// MaskOptions::threads in attention) splits it into exactly the same shares
// with an executor, w = executor.workers, and asks the executor to run them:
//
//   executor.parallel_for(executor.context, w, task, task_context)
//
// must call task(task_context, i) once for each i in 0 .. w-1, from any
// threads, in any order, at once or not, and return when all are done. Each
// share is computed the same way whoever runs it, so the results are the
// same bytes with or without an executor, for any worker count. A call with
// one share runs it on the calling thread. A plain C function pointer and a
// context, so the type crosses library boundaries. No exception crosses
// `task`: rope catches inside and rethrows the first after parallel_for
// returns; parallel_for itself must not throw. A task may block on nothing
// but the work of its own share, so any pool that runs w tasks eventually,
// even one at a time, completes the call.
#pragma once

#include <cstddef>

namespace rope {

struct Executor {
  // Runs task(task_context, i) for i = 0 .. n-1, each exactly once, possibly
  // in parallel, and returns when all are done. Null: rope starts threads.
  void (*parallel_for)(void* executor_context, std::size_t n, void (*task)(void* task_context, std::size_t i),
                       void* task_context) = nullptr;
  void* context = nullptr;  // passed to parallel_for as executor_context
  // How many shares a call splits its work into (what `threads` is without
  // an executor); at least 1 when parallel_for is set.
  std::size_t workers = 0;

  bool set() const noexcept { return parallel_for != nullptr; }
};

// The threads of a call, said once: a count of rope's own threads, or the
// caller's Executor (then executor.workers shares). Either converts:
//   plan(p, shape, batch, 16);          plan(p, shape, batch, engine_executor);
// The same bytes for any count and any executor.
struct Threads {
  std::size_t count = 1;  // rope's threads (1 starts none); not used with an executor
  Executor executor;      // set: the shares run on the caller's pool

  Threads() = default;
  Threads(std::size_t threads) noexcept : count(threads) {}  // NOLINT: implicit on purpose
  Threads(const Executor& e) noexcept : executor(e) {}       // NOLINT: implicit on purpose

  // How many shares a call splits its work into.
  std::size_t shares() const noexcept { return executor.set() ? executor.workers : count; }
};

}  // namespace rope
