// mem:// — objects in process memory. Fast unit tests use it; so does the fault store's
// crash model. Readers hold a shared_ptr to an immutable object, so a concurrent overwrite
// never changes bytes under a reader.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>

#include "sluice/core/thread_annotations.h"
#include "sluice/store/store.h"

namespace sluice::store {
namespace {

struct Object {
  std::vector<std::byte> data;
  int64_t mtime_ns = 0;
  uint64_t generation = 0;
};

struct MemoryState {
  Mutex mu;
  std::map<std::string, std::shared_ptr<const Object>, std::less<>> objects SLUICE_GUARDED_BY(mu);
  uint64_t next_generation SLUICE_GUARDED_BY(mu) = 1;
};

int64_t wall_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

ObjectInfo info_of(const std::string& key, const Object& o) {
  return ObjectInfo{key, o.data.size(), o.mtime_ns, "g" + std::to_string(o.generation)};
}

class MemoryWriter : public Writer {
 public:
  MemoryWriter(std::shared_ptr<MemoryState> state, std::string key, WriteOptions options)
      : state_(std::move(state)), key_(std::move(key)), options_(options) {}

  Status append(std::span<const std::byte> data) override {
    if (done_) return fail(Code::kInvalidArgument, "append to finished writer for '" + key_ + "'");
    data_.insert(data_.end(), data.begin(), data.end());
    return ok();
  }
  Status commit() override {
    if (done_) return fail(Code::kInvalidArgument, "commit of finished writer for '" + key_ + "'");
    done_ = true;
    auto obj = std::make_shared<Object>();
    obj->data = std::move(data_);
    obj->mtime_ns = options_.mtime_ns.value_or(wall_ns());
    MutexLock lock(state_->mu);
    if (!options_.overwrite && state_->objects.contains(key_))
      return fail(Code::kAlreadyExists, "object '" + key_ + "' already exists");
    obj->generation = state_->next_generation++;
    auto& slot = state_->objects[key_];
    const Replaced replaced = slot ? Replaced{true, slot->data.size()} : Replaced{};
    slot = std::move(obj);
    if (options_.on_publish) options_.on_publish(replaced);
    return ok();
  }
  void abort() override {
    done_ = true;
    data_.clear();
  }
  uint64_t size() const override { return data_.size(); }

 private:
  std::shared_ptr<MemoryState> state_;
  std::string key_;
  WriteOptions options_;
  std::vector<std::byte> data_;
  bool done_ = false;
};

class MemoryStore : public Store {
 public:
  MemoryStore(std::string name, std::shared_ptr<MemoryState> state)
      : name_(std::move(name)), state_(std::move(state)) {}

  Result<ObjectInfo> stat(std::string_view key) override {
    SLUICE_RETURN_IF_ERROR(validate_key(key));
    auto obj = find(key);
    if (!obj) return not_found(key);
    return info_of(std::string(key), *obj);
  }

  Result<size_t> read(std::string_view key, uint64_t offset, std::span<std::byte> dst,
                      const ReadOptions& options) override {
    SLUICE_RETURN_IF_ERROR(validate_key(key));
    auto obj = find(key);
    if (!obj) return not_found(key);
    if (!options.if_match.empty() && options.if_match != info_of("", *obj).etag)
      return fail(Code::kConflict, "object '" + std::string(key) + "' in " + uri() +
                                       " changed: etag is no longer " + options.if_match);
    if (offset >= obj->data.size()) return size_t{0};
    size_t n = std::min<uint64_t>(dst.size(), obj->data.size() - offset);
    std::memcpy(dst.data(), obj->data.data() + offset, n);
    return n;
  }

  Result<std::unique_ptr<Writer>> create(std::string_view key,
                                         const WriteOptions& options) override {
    SLUICE_RETURN_IF_ERROR(validate_key(key));
    return std::make_unique<MemoryWriter>(state_, std::string(key), options);
  }

  Result<ListPage> list(const ListOptions& options) override {
    if (options.max_keys == 0 || options.max_keys > 10000)
      return fail(Code::kInvalidArgument, "list max_keys must be 1..10000");
    ListPage page;
    MutexLock lock(state_->mu);
    auto it = options.continuation.empty() ? state_->objects.lower_bound(options.prefix)
                                           : state_->objects.upper_bound(options.continuation);
    for (; it != state_->objects.end(); ++it) {
      if (!it->first.starts_with(options.prefix)) break;
      if (page.objects.size() == options.max_keys) {
        page.next_token = page.objects.back().key;
        break;
      }
      page.objects.push_back(info_of(it->first, *it->second));
    }
    return page;
  }

  Status remove(std::string_view key) override {
    SLUICE_RETURN_IF_ERROR(validate_key(key));
    MutexLock lock(state_->mu);
    auto it = state_->objects.find(key);
    if (it == state_->objects.end()) return not_found(key);
    state_->objects.erase(it);
    return ok();
  }

  std::string uri() const override { return "mem://" + name_; }
  bool reports_replaced() const override { return true; }
  bool cheap_requests() const override { return true; }

 private:
  std::shared_ptr<const Object> find(std::string_view key) {
    MutexLock lock(state_->mu);
    auto it = state_->objects.find(key);
    return it == state_->objects.end() ? nullptr : it->second;
  }
  std::unexpected<Error> not_found(std::string_view key) const {
    return fail(Code::kNotFound, "object '" + std::string(key) + "' not found in " + uri());
  }

  std::string name_;
  std::shared_ptr<MemoryState> state_;
};

}  // namespace

std::unique_ptr<Store> make_memory_store(std::string name) {
  return std::make_unique<MemoryStore>(std::move(name), std::make_shared<MemoryState>());
}

std::unique_ptr<Store> open_named_memory_store(const std::string& name) {
  // mem://NAME means the same objects wherever it is opened in this process; the table of
  // names lives as long as the process, like a tmpfs mount would.
  static Mutex mu;
  static std::map<std::string, std::shared_ptr<MemoryState>> named SLUICE_GUARDED_BY(mu);
  MutexLock lock(mu);
  auto& state = named[name];
  if (!state) state = std::make_shared<MemoryState>();
  return std::make_unique<MemoryStore>(name, state);
}

}  // namespace sluice::store
