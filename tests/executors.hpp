// Executors of the tests (rope/executor.hpp): a small pool of std::threads
// that the caller waits on, as an engine's pool would run rope's shares, and
// one that runs the shares in reverse order on the calling thread. Both
// count the tasks they run, so a test can tell that the work went through
// them.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <thread>
#include <vector>

#include <rope/executor.hpp>

namespace rope_test {

class ThreadPool {
 public:
  explicit ThreadPool(std::size_t threads) {
    for (std::size_t i = 0; i < threads; ++i) threads_.emplace_back([this] { serve(); });
  }
  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : threads_) t.join();
  }
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  rope::Executor executor(std::size_t workers) {
    rope::Executor e;
    e.parallel_for = &ThreadPool::parallel_for;
    e.context = this;
    e.workers = workers;
    return e;
  }
  std::size_t tasks_run() const noexcept { return tasks_run_.load(); }

 private:
  // One job at a time: the calling thread posts it and waits for its tasks,
  // which the pool's threads claim one index at a time.
  static void parallel_for(void* self, std::size_t n, void (*task)(void*, std::size_t), void* context) {
    auto& pool = *static_cast<ThreadPool*>(self);
    std::lock_guard<std::mutex> one_job(pool.job_mutex_);
    std::unique_lock<std::mutex> lock(pool.mutex_);
    pool.task_ = task;
    pool.context_ = context;
    pool.n_ = n;
    pool.next_ = 0;
    pool.remaining_ = n;
    pool.wake_.notify_all();
    pool.done_.wait(lock, [&] { return pool.remaining_ == 0; });
    pool.task_ = nullptr;
  }

  void serve() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return stop_ || (task_ != nullptr && next_ < n_); });
      if (stop_) return;
      const std::size_t i = next_++;
      void (*const task)(void*, std::size_t) = task_;
      void* const context = context_;
      lock.unlock();
      task(context, i);
      tasks_run_.fetch_add(1);
      lock.lock();
      if (--remaining_ == 0) done_.notify_all();
    }
  }

  std::mutex job_mutex_, mutex_;
  std::condition_variable wake_, done_;
  void (*task_)(void*, std::size_t) = nullptr;
  void* context_ = nullptr;
  std::size_t n_ = 0, next_ = 0, remaining_ = 0;
  bool stop_ = false;
  std::atomic<std::size_t> tasks_run_{0};
  std::vector<std::thread> threads_;
};

// Runs task(context, n-1), ..., task(context, 0) on the calling thread.
struct ReverseExecutor {
  std::size_t tasks_run = 0;

  rope::Executor executor(std::size_t workers) {
    rope::Executor e;
    e.parallel_for = [](void* self, std::size_t n, void (*task)(void*, std::size_t), void* context) {
      for (std::size_t i = n; i-- > 0;) {
        task(context, i);
        ++static_cast<ReverseExecutor*>(self)->tasks_run;
      }
    };
    e.context = this;
    e.workers = workers;
    return e;
  }
};

}  // namespace rope_test
