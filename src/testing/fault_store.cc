#include "sluice/testing/fault_store.h"

#include <optional>
#include <thread>

namespace sluice::store {

// Holds appended bytes until commit, so a crash can drop them before the wrapped store
// ever sees them: they were never synced.
class FaultInjectionStore::FaultWriter : public Writer {
 public:
  FaultWriter(FaultInjectionStore* owner, std::string key, WriteOptions options, uint64_t epoch)
      : owner_(owner), key_(std::move(key)), options_(options), epoch_(epoch) {}

  Status append(std::span<const std::byte> data) override {
    if (done_) return fail(Code::kInvalidArgument, "append to finished writer for '" + key_ + "'");
    SLUICE_RETURN_IF_ERROR(alive());
    SLUICE_RETURN_IF_ERROR(owner_->before(FaultOp::kAppend, key_));
    SLUICE_RETURN_IF_ERROR(owner_->charge_space(data.size(), key_));
    pending_.insert(pending_.end(), data.begin(), data.end());
    return ok();
  }

  Status commit() override {
    if (done_) return fail(Code::kInvalidArgument, "commit of finished writer for '" + key_ + "'");
    SLUICE_RETURN_IF_ERROR(alive());
    SLUICE_RETURN_IF_ERROR(owner_->before(FaultOp::kCommit, key_));
    done_ = true;
    SLUICE_ASSIGN_OR_RETURN(auto inner, owner_->target().create(key_, options_));
    if (auto st = inner->append(pending_); !st) {
      inner->abort();
      return st;
    }
    pending_.clear();
    return inner->commit();
  }

  void abort() override {
    pending_.clear();
    done_ = true;
  }
  uint64_t size() const override { return pending_.size(); }

 private:
  Status alive() {
    MutexLock lock(owner_->mu_);
    if (owner_->epoch_ != epoch_) {
      pending_.clear();
      return fail(Code::kCancelled,
                  "writer for '" + key_ + "' lost its unsynced bytes in a simulated crash");
    }
    return ok();
  }

  FaultInjectionStore* owner_;
  std::string key_;
  WriteOptions options_;
  uint64_t epoch_;
  std::vector<std::byte> pending_;
  bool done_ = false;  // committed (or its commit was tried) or aborted: a writer publishes once
};

FaultInjectionStore::FaultInjectionStore(std::unique_ptr<Store> target)
    : StoreWrapper(std::move(target)) {}

FaultInjectionStore::~FaultInjectionStore() = default;

void FaultInjectionStore::fail_nth(FaultOp op, uint64_t n, Code code) {
  MutexLock lock(mu_);
  nth_.emplace(op, std::pair{calls_[op] + n, code});
}

void FaultInjectionStore::fail_always(FaultOp op, Code code) {
  MutexLock lock(mu_);
  always_[op] = code;
}

void FaultInjectionStore::set_short_reads(size_t max_bytes) {
  MutexLock lock(mu_);
  short_reads_ = max_bytes;
}

void FaultInjectionStore::set_space_limit(uint64_t bytes) {
  MutexLock lock(mu_);
  space_limit_ = bytes;
}

void FaultInjectionStore::set_latency(std::chrono::microseconds latency) {
  MutexLock lock(mu_);
  latency_ = latency;
}

void FaultInjectionStore::clear() {
  MutexLock lock(mu_);
  nth_.clear();
  always_.clear();
  short_reads_ = 0;
  space_limit_ = UINT64_MAX;
  latency_ = std::chrono::microseconds{0};
}

void FaultInjectionStore::crash() {
  MutexLock lock(mu_);
  crashed_ = true;
  ++epoch_;
}

void FaultInjectionStore::restart() {
  MutexLock lock(mu_);
  crashed_ = false;
}

uint64_t FaultInjectionStore::calls(FaultOp op) const {
  MutexLock lock(mu_);
  auto it = calls_.find(op);
  return it == calls_.end() ? 0 : it->second;
}

Status FaultInjectionStore::before(FaultOp op, std::string_view key) {
  std::chrono::microseconds latency;
  std::optional<Code> injected;
  {
    MutexLock lock(mu_);
    latency = latency_;
    uint64_t n = ++calls_[op];
    uint64_t any = ++calls_[FaultOp::kAny];
    if (crashed_) return fail(Code::kUnavailable, "store " + uri() + " is down (simulated crash)");
    for (auto [o, count] : {std::pair{op, n}, std::pair{FaultOp::kAny, any}}) {
      auto range = nth_.equal_range(o);
      for (auto it = range.first; it != range.second; ++it) {
        if (it->second.first == count) {
          injected = it->second.second;
          nth_.erase(it);
          break;
        }
      }
      if (injected) break;
      if (auto it = always_.find(o); it != always_.end()) {
        injected = it->second;
        break;
      }
    }
  }
  if (latency.count() > 0) std::this_thread::sleep_for(latency);
  if (injected) return fail(*injected, "injected fault on '" + std::string(key) + "' in " + uri());
  return ok();
}

Status FaultInjectionStore::charge_space(uint64_t bytes, std::string_view key) {
  MutexLock lock(mu_);
  if (space_used_ + bytes > space_limit_)
    return std::unexpected(Error(
        Code::kNoSpace,
        "no space left writing '" + std::string(key) + "' in " + uri() + " (injected)", ENOSPC));
  space_used_ += bytes;
  return ok();
}

Result<ObjectInfo> FaultInjectionStore::stat(std::string_view key) {
  SLUICE_RETURN_IF_ERROR(before(FaultOp::kStat, key));
  return StoreWrapper::stat(key);
}

Result<size_t> FaultInjectionStore::read(std::string_view key, uint64_t offset,
                                         std::span<std::byte> dst, const ReadOptions& options) {
  SLUICE_RETURN_IF_ERROR(before(FaultOp::kRead, key));
  size_t cap;
  {
    MutexLock lock(mu_);
    cap = short_reads_;
  }
  if (cap > 0 && dst.size() > cap) dst = dst.first(cap);
  return StoreWrapper::read(key, offset, dst, options);
}

Result<std::unique_ptr<Writer>> FaultInjectionStore::create(std::string_view key,
                                                            const WriteOptions& options) {
  SLUICE_RETURN_IF_ERROR(before(FaultOp::kCreate, key));
  SLUICE_RETURN_IF_ERROR(validate_key(key));
  uint64_t epoch;
  {
    MutexLock lock(mu_);
    epoch = epoch_;
  }
  return std::make_unique<FaultWriter>(this, std::string(key), options, epoch);
}

Result<ListPage> FaultInjectionStore::list(const ListOptions& options) {
  SLUICE_RETURN_IF_ERROR(before(FaultOp::kList, options.prefix));
  return StoreWrapper::list(options);
}

Status FaultInjectionStore::remove(std::string_view key) {
  SLUICE_RETURN_IF_ERROR(before(FaultOp::kRemove, key));
  return StoreWrapper::remove(key);
}

}  // namespace sluice::store
