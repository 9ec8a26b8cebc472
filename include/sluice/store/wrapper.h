// sluice/store/wrapper.h: forwarding base for Store decorators.
//
// A decorator (fault injection, telemetry, quota charging, rate limiting) derives from
// StoreWrapper and overrides only the calls it changes; every other call goes straight to
// the wrapped store. The wrapper owns the store it wraps (or shares it, when it is given a
// shared_ptr: a checkpoint tier's store, say).
#pragma once

#include <memory>

#include "sluice/store/store.h"

namespace sluice::store {

class StoreWrapper : public Store {
 public:
  explicit StoreWrapper(std::shared_ptr<Store> target) : target_(std::move(target)) {}

  Result<ObjectInfo> stat(std::string_view key) override { return target_->stat(key); }
  Result<size_t> read(std::string_view key, uint64_t offset, std::span<std::byte> dst,
                      const ReadOptions& options = {}) override {
    return target_->read(key, offset, dst, options);
  }
  Result<std::unique_ptr<Writer>> create(std::string_view key,
                                         const WriteOptions& options) override {
    return target_->create(key, options);
  }
  Result<ListPage> list(const ListOptions& options) override { return target_->list(options); }
  Status remove(std::string_view key) override { return target_->remove(key); }
  Status remove_many(std::span<const std::string> keys) override {
    return target_->remove_many(keys);
  }
  std::string uri() const override { return target_->uri(); }
  std::string identity() const override { return target_->identity(); }
  bool reports_replaced() const override { return target_->reports_replaced(); }
  bool cheap_requests() const override { return target_->cheap_requests(); }
  void* find_capability(const std::type_info& type) override {
    return target_->find_capability(type);
  }
  Status can_write(std::string_view key, uint64_t bytes, uint64_t objects) override {
    return target_->can_write(key, bytes, objects);
  }

  Store& target() { return *target_; }
  // The wrapped store, shared: for what must outlive this wrapper (a writer's callbacks).
  std::shared_ptr<Store> shared_target() const { return target_; }

 private:
  std::shared_ptr<Store> target_;
};

// A decorator that records requests, bytes, errors and latency per operation into a
// telemetry registry, labelled with the store's scheme.
std::unique_ptr<Store> with_telemetry(std::unique_ptr<Store> store, telemetry::Registry& registry);

}  // namespace sluice::store
