// sluice/testing/fault_store.h: a Store decorator that injects faults, for tests.
//
// Wrap any store, then script what goes wrong:
//   auto faults = std::make_unique<FaultInjectionStore>(make_memory_store());
//   faults->fail_nth(FaultOp::kRead, 3, Code::kIoError);  // the 3rd read from now fails
//   faults->set_short_reads(100);                       // reads return at most 100 bytes
//   faults->set_space_limit(1 << 20);                    // appends past 1 MiB: NoSpace
//   faults->crash();                                     // lose every unsynced byte
//
// Crash model (after leveldb's fault-injection test): a byte is synced once the Writer
// holding it has committed. Until then the fault store keeps appended bytes to itself, so
// crash() can drop them: every open Writer loses its bytes, its later calls fail with
// Cancelled, and nothing of it reaches the wrapped store. While crashed every call fails
// with Unavailable; restart() brings the store back with exactly the committed objects.
//
// All methods may be called from any thread; the fault script is guarded by one mutex.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <set>

#include "sluice/core/thread_annotations.h"
#include "sluice/store/wrapper.h"

namespace sluice::store {

enum class FaultOp { kStat, kRead, kCreate, kAppend, kCommit, kList, kRemove, kAny };

class FaultInjectionStore : public StoreWrapper {
 public:
  explicit FaultInjectionStore(std::unique_ptr<Store> target);
  ~FaultInjectionStore() override;

  // The n-th call (1-based, counted from now) of `op` fails with `code` and is not passed
  // on. kAny counts every call.
  void fail_nth(FaultOp op, uint64_t n, Code code);
  // Every call of `op` fails with `code` until clear().
  void fail_always(FaultOp op, Code code);
  // Reads return at most `max_bytes` (0: no limit), as a server that truncates would.
  void set_short_reads(size_t max_bytes);
  // Appends fail with NoSpace once the bytes appended through this store pass `bytes`.
  void set_space_limit(uint64_t bytes);
  // Every call sleeps this long first.
  void set_latency(std::chrono::microseconds latency);
  // Removes every scripted fault (not a crash).
  void clear();

  void crash();
  void restart();

  // Calls of `op` seen so far, failed ones included.
  uint64_t calls(FaultOp op) const;

  Result<ObjectInfo> stat(std::string_view key) override;
  Result<size_t> read(std::string_view key, uint64_t offset, std::span<std::byte> dst,
                      const ReadOptions& options = {}) override;
  Result<std::unique_ptr<Writer>> create(std::string_view key,
                                         const WriteOptions& options) override;
  Result<ListPage> list(const ListOptions& options) override;
  Status remove(std::string_view key) override;

 private:
  class FaultWriter;
  friend class FaultWriter;

  // Counts the call and returns the injected error for it, if any.
  Status before(FaultOp op, std::string_view key);
  Status charge_space(uint64_t bytes, std::string_view key);

  mutable Mutex mu_;
  std::map<FaultOp, uint64_t> calls_ SLUICE_GUARDED_BY(mu_);
  // op -> (absolute call no, code)
  std::multimap<FaultOp, std::pair<uint64_t, Code>> nth_ SLUICE_GUARDED_BY(mu_);
  std::map<FaultOp, Code> always_ SLUICE_GUARDED_BY(mu_);
  size_t short_reads_ SLUICE_GUARDED_BY(mu_) = 0;
  uint64_t space_limit_ SLUICE_GUARDED_BY(mu_) = UINT64_MAX;
  uint64_t space_used_ SLUICE_GUARDED_BY(mu_) = 0;
  std::chrono::microseconds latency_ SLUICE_GUARDED_BY(mu_){0};
  bool crashed_ SLUICE_GUARDED_BY(mu_) = false;
  uint64_t epoch_ = 0;  // bumped by crash(); writers from an older epoch are dead
};

}  // namespace sluice::store
