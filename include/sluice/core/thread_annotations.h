// sluice/core/thread_annotations.h: lock rules the compiler checks.
//
// The SLUICE_* macros are clang's thread-safety attributes
// (https://clang.llvm.org/docs/ThreadSafetyAnalysis.html); under any other compiler they
// expand to nothing, so g++ builds the same code unchecked. The fuzz build (clang,
// scripts/fuzz.sh) compiles every layer with -Wthread-safety -Werror=thread-safety.
//
// The rule: a member that a mutex guards is declared SLUICE_GUARDED_BY(mu_); a private
// helper called with the lock held is declared SLUICE_REQUIRES(mu_); a function that takes
// the lock itself and must not be entered with it held may say SLUICE_EXCLUDES(mu_). The
// analysis only understands annotated lock types, so mutexes are sluice::Mutex (never a bare
// std::mutex), held through sluice::MutexLock (lock_guard's shape) or sluice::UniqueLock
// (unique_lock's: unlock and lock again, wait on a sluice::CondVar).
//
// What the analysis cannot see: a lambda runs in a function of its own, holding nothing.
// A wait predicate that reads guarded members says so with SLUICE_REQUIRES on the lambda:
//   cv_.wait(lock, [&]() SLUICE_REQUIRES(mu_) { return done_; });
// CondVar::wait calls it only with the lock held.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <utility>

#if defined(__clang__)
#define SLUICE_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define SLUICE_THREAD_ANNOTATION(x)
#endif

// A type that is a lock (Mutex below); the string names it in diagnostics.
#define SLUICE_CAPABILITY(name) SLUICE_THREAD_ANNOTATION(capability(name))
// A RAII type that holds a capability from construction to destruction (MutexLock).
#define SLUICE_SCOPED_CAPABILITY SLUICE_THREAD_ANNOTATION(scoped_lockable)
// A data member (or global) read and written only with `mu` held.
#define SLUICE_GUARDED_BY(mu) SLUICE_THREAD_ANNOTATION(guarded_by(mu))
// A pointer member whose pointee (not the pointer itself) is read and written with `mu` held.
#define SLUICE_PT_GUARDED_BY(mu) SLUICE_THREAD_ANNOTATION(pt_guarded_by(mu))
// Lock order: this mutex is taken after (before) the ones named, never the other way round.
#define SLUICE_ACQUIRED_AFTER(...) SLUICE_THREAD_ANNOTATION(acquired_after(__VA_ARGS__))
#define SLUICE_ACQUIRED_BEFORE(...) SLUICE_THREAD_ANNOTATION(acquired_before(__VA_ARGS__))
// The caller must hold the capabilities named (exclusively, or at least shared).
#define SLUICE_REQUIRES(...) SLUICE_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define SLUICE_REQUIRES_SHARED(...) \
  SLUICE_THREAD_ANNOTATION(requires_shared_capability(__VA_ARGS__))
// The function takes (gives up) the capability and returns holding it (not holding it).
#define SLUICE_ACQUIRE(...) SLUICE_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define SLUICE_ACQUIRE_SHARED(...) SLUICE_THREAD_ANNOTATION(acquire_shared_capability(__VA_ARGS__))
#define SLUICE_RELEASE(...) SLUICE_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define SLUICE_RELEASE_SHARED(...) SLUICE_THREAD_ANNOTATION(release_shared_capability(__VA_ARGS__))
// The function takes the capability when it returns `result` (try_lock).
#define SLUICE_TRY_ACQUIRE(...) SLUICE_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
// The caller must not hold the capabilities named (the function takes them itself).
#define SLUICE_EXCLUDES(...) SLUICE_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
// The function returns a reference to the capability named (an accessor of a mutex).
#define SLUICE_RETURN_CAPABILITY(x) SLUICE_THREAD_ANNOTATION(lock_returned(x))
// Turns the analysis off for one function: only where the rule holds for a reason the
// analysis cannot follow, said in a comment beside it.
#define SLUICE_NO_THREAD_SAFETY_ANALYSIS SLUICE_THREAD_ANNOTATION(no_thread_safety_analysis)

namespace sluice {

// std::mutex with its lock rule visible to the analysis. Not recursive; not movable.
class SLUICE_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void lock() SLUICE_ACQUIRE() { mu_.lock(); }
  void unlock() SLUICE_RELEASE() { mu_.unlock(); }
  bool try_lock() SLUICE_TRY_ACQUIRE(true) { return mu_.try_lock(); }

  // The std::mutex inside, for an API that needs one (std::condition_variable through
  // UniqueLock). Locking it directly bypasses the analysis: take the Mutex instead.
  std::mutex& native() SLUICE_RETURN_CAPABILITY(this) { return mu_; }

 private:
  std::mutex mu_;
};

// Holds `mu` from construction to the end of the scope (std::lock_guard).
class SLUICE_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) SLUICE_ACQUIRE(mu) : mu_(mu) { mu_.lock(); }
  ~MutexLock() SLUICE_RELEASE() { mu_.unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex& mu_;
};

// Holds `mu` from construction, may give it up and take it again (unlock, lock), releases it
// at the end of the scope if held (std::unique_lock), and waits on a CondVar.
class SLUICE_SCOPED_CAPABILITY UniqueLock {
 public:
  explicit UniqueLock(Mutex& mu) SLUICE_ACQUIRE(mu) : lock_(mu.native()) {}
  ~UniqueLock() SLUICE_RELEASE() = default;
  UniqueLock(const UniqueLock&) = delete;
  UniqueLock& operator=(const UniqueLock&) = delete;

  void lock() SLUICE_ACQUIRE() { lock_.lock(); }
  void unlock() SLUICE_RELEASE() { lock_.unlock(); }
  bool owns_lock() const { return lock_.owns_lock(); }

  // The std::unique_lock inside, for std::condition_variable (CondVar uses it).
  std::unique_lock<std::mutex>& native() { return lock_; }

 private:
  std::unique_lock<std::mutex> lock_;
};

// std::condition_variable for a UniqueLock. Every wait returns with the lock held, and a
// predicate is only called with it held (annotate a lambda predicate SLUICE_REQUIRES(mu)).
class CondVar {
 public:
  void notify_one() noexcept { cv_.notify_one(); }
  void notify_all() noexcept { cv_.notify_all(); }

  void wait(UniqueLock& lock) { cv_.wait(lock.native()); }
  template <class Predicate>
  void wait(UniqueLock& lock, Predicate stop_waiting) {
    cv_.wait(lock.native(), std::move(stop_waiting));
  }
  template <class Rep, class Period>
  std::cv_status wait_for(UniqueLock& lock, const std::chrono::duration<Rep, Period>& rel) {
    return cv_.wait_for(lock.native(), rel);
  }
  template <class Rep, class Period, class Predicate>
  bool wait_for(UniqueLock& lock, const std::chrono::duration<Rep, Period>& rel,
                Predicate stop_waiting) {
    return cv_.wait_for(lock.native(), rel, std::move(stop_waiting));
  }
  template <class Clock, class Duration>
  std::cv_status wait_until(UniqueLock& lock, const std::chrono::time_point<Clock, Duration>& t) {
    return cv_.wait_until(lock.native(), t);
  }
  template <class Clock, class Duration, class Predicate>
  bool wait_until(UniqueLock& lock, const std::chrono::time_point<Clock, Duration>& t,
                  Predicate stop_waiting) {
    return cv_.wait_until(lock.native(), t, std::move(stop_waiting));
  }

 private:
  std::condition_variable cv_;
};

}  // namespace sluice
