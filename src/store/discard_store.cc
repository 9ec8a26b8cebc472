// A store whose writes vanish: the destination of a copy whose only point is its reads
// (sluice cache warm, benchmarks).
#include <algorithm>

#include "sluice/core/thread_annotations.h"
#include "sluice/store/store.h"

namespace sluice::store {
namespace {

class DiscardWriter final : public Writer {
 public:
  Status append(std::span<const std::byte> data) override {
    MutexLock lock(mu_);
    size_ += data.size();
    return ok();
  }
  Status commit() override { return ok(); }
  void abort() override {}
  uint64_t size() const override {
    MutexLock lock(mu_);
    return size_;
  }
  bool positional() const override { return true; }
  Status write_at(uint64_t offset, std::span<const std::byte> data) override {
    MutexLock lock(mu_);
    size_ = std::max<uint64_t>(size_, offset + data.size());
    return ok();
  }

 private:
  mutable Mutex mu_;
  uint64_t size_ SLUICE_GUARDED_BY(mu_) = 0;
};

class DiscardStore final : public Store {
 public:
  Result<ObjectInfo> stat(std::string_view key) override { return missing(key); }
  Result<size_t> read(std::string_view key, uint64_t, std::span<std::byte>,
                      const ReadOptions&) override {
    return missing(key);
  }
  Result<std::unique_ptr<Writer>> create(std::string_view key, const WriteOptions&) override {
    SLUICE_RETURN_IF_ERROR(validate_key(key));
    return std::unique_ptr<Writer>(std::make_unique<DiscardWriter>());
  }
  Result<ListPage> list(const ListOptions&) override { return ListPage{}; }
  Status remove(std::string_view key) override { return validate_key(key); }
  std::string uri() const override { return "discard://"; }

 private:
  static std::unexpected<Error> missing(std::string_view key) {
    return fail(Code::kNotFound, "'" + std::string(key) + "': a discard store keeps nothing");
  }
};

}  // namespace

std::unique_ptr<Store> make_discard_store() {
  return std::make_unique<DiscardStore>();
}

}  // namespace sluice::store
