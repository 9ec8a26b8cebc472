// A fixed pool of threads running posted tasks in order of arrival. Internal.
//
// Destruction runs every task already posted, then joins the threads. Tasks must not
// post to the executor that runs them and then wait for that task (it may never start).
#pragma once

#include <algorithm>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "sluice/core/thread_annotations.h"

namespace sluice {

class Executor {
 public:
  explicit Executor(unsigned threads) {
    for (unsigned i = 0; i < std::max(1u, threads); ++i) threads_.emplace_back([this] { run(); });
  }
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;
  ~Executor() {
    {
      MutexLock lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  void post(std::function<void()> fn) {
    {
      MutexLock lock(mu_);
      queue_.push_back(std::move(fn));
    }
    cv_.notify_one();
  }

 private:
  void run() {
    UniqueLock lock(mu_);
    while (true) {
      cv_.wait(lock, [&]() SLUICE_REQUIRES(mu_) { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      {
        auto fn = std::move(queue_.front());
        queue_.pop_front();
        lock.unlock();
        fn();
      }  // the task (and whatever it captured) is destroyed before the lock is taken again
      lock.lock();
    }
  }
  Mutex mu_;
  CondVar cv_;
  std::deque<std::function<void()>> queue_ SLUICE_GUARDED_BY(mu_);
  bool stopping_ SLUICE_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace sluice
