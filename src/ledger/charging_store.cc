// The charging decorator: reservations around every Writer, uncharges on remove.
#include "sluice/ledger/charging_store.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "ledger/project_index.h"
#include "sluice/store/wrapper.h"

namespace sluice::ledger {
namespace {

class ChargingWriter;

// Shared by a ChargingWriter and the on_publish hook it gave the inner store's writer (made
// before the ChargingWriter itself).
struct PublishState {
  ChargingWriter* self = nullptr;
  bool charged = false;  // the hook charged the commit
};

// For a store that cannot say what a publish replaced (object stores): the key's location,
// a fresh look at the object the publish will replace (its size, or nullopt when there is
// none), and how the key's publish lock is held.
struct Lookup {
  std::string location;
  std::function<Result<std::optional<int64_t>>()> size;
  std::chrono::seconds hold, wait;
};

// A publish's hold on its key's lock in the ledger (Ledger::lock_key): renewed every third
// of its time while the publish runs (a large upload's last part and Complete may take a
// while), and let go when this goes.
class PublishLock {
 public:
  static Result<std::unique_ptr<PublishLock>> take(std::shared_ptr<Ledger> ledger,
                                                   std::string location, std::chrono::seconds hold,
                                                   std::chrono::seconds wait) {
    SLUICE_ASSIGN_OR_RETURN(std::string holder, ledger->lock_key(location, hold, wait));
    return std::unique_ptr<PublishLock>(
        new PublishLock(std::move(ledger), std::move(location), std::move(holder), hold));
  }

  ~PublishLock() {
    {
      std::lock_guard lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    renewer_.join();
    // NotFound: held past its time and taken over (this process stalled for longer than
    // the hold); the charge already made stands, and reconcile repairs what it missed.
    (void)ledger_->unlock_key(location_, holder_);
  }

 private:
  PublishLock(std::shared_ptr<Ledger> ledger, std::string location, std::string holder,
              std::chrono::seconds hold)
      : ledger_(std::move(ledger)),
        location_(std::move(location)),
        holder_(std::move(holder)),
        renewer_([this, hold] {
          std::unique_lock lock(mu_);
          while (!cv_.wait_for(lock, hold / 3, [&] { return done_; })) {
            lock.unlock();
            (void)ledger_->renew_key(location_, holder_, hold);
            lock.lock();
          }
        }) {}

  std::shared_ptr<Ledger> ledger_;
  std::string location_, holder_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread renewer_;  // last: starts once the members above exist
};

class ChargingWriter final : public store::Writer {
 public:
  ChargingWriter(std::unique_ptr<store::Writer> inner, std::shared_ptr<Ledger> ledger,
                 ChargeTarget target, std::string reservation, int64_t reserved,
                 std::optional<int64_t> old_size, uint64_t min_growth,
                 std::shared_ptr<PublishState> published, std::optional<Lookup> lookup)
      : lookup_(std::move(lookup)),
        published_(std::move(published)),
        inner_(std::move(inner)),
        ledger_(std::move(ledger)),
        target_(std::move(target)),
        reservation_(std::move(reservation)),
        reserved_(reserved),
        old_size_(old_size),
        min_growth_(static_cast<int64_t>(min_growth)) {
    published_->self = this;
  }

  ~ChargingWriter() override {
    abort();
    published_->self = nullptr;
  }

  // The hook for the inner store's writer (WriteOptions::on_publish): once it has published,
  // it charges against exactly what the publish replaced, in publish order, so writers of
  // one key racing each other leave usage equal to the object left, with no reconcile.
  // A hook the caller set already (another decorator above) still runs, after this one.
  static std::function<void(const store::Replaced&)> publish_hook(
      std::shared_ptr<PublishState> state, std::function<void(const store::Replaced&)> outer) {
    return [state = std::move(state), outer = std::move(outer)](const store::Replaced& r) {
      if (state->self) {
        state->self->settle(r.existed ? std::optional<int64_t>(static_cast<int64_t>(r.size))
                                      : std::nullopt);
        state->charged = true;
      }
      if (outer) outer(r);
    };
  }

  Status append(std::span<const std::byte> data) override {
    SLUICE_RETURN_IF_ERROR(cover(inner_->size() + data.size()));
    return inner_->append(data);
  }

  bool positional() const override { return inner_->positional(); }

  Status write_at(uint64_t offset, std::span<const std::byte> data) override {
    SLUICE_RETURN_IF_ERROR(cover(offset + data.size()));
    return inner_->write_at(offset, data);
  }

  std::string local_path() const override { return inner_->local_path(); }

  Status extend_to(uint64_t size) override {
    SLUICE_RETURN_IF_ERROR(cover(size));
    return inner_->extend_to(size);
  }

  uint64_t size() const override { return inner_->size(); }

  Status commit() override {
    {
      std::lock_guard lock(mu_);
      if (done_) return fail(Code::kInvalidArgument, "commit of a finished writer");
      done_ = true;
    }
    // Some writers forget their size once committed.
    bytes_ = static_cast<int64_t>(inner_->size());
    // A store that cannot say what its publish replaced (object stores): the key's lock
    // in the ledger is held across a fresh look at the old object, the publish and the
    // charge, so writers racing on one key charge against what each really replaced.
    std::unique_ptr<PublishLock> lock;
    if (lookup_) {
      Status ready = look_again(lock);
      if (!ready) {
        lock.reset();
        inner_->abort();
        (void)ledger_->release(reservation_);
        return std::unexpected(ready.error().with_context("publishing " + lookup_->location));
      }
    }
    Status s = inner_->commit();
    if (!s) {
      (void)ledger_->release(reservation_);  // expires on its own if this fails too
      return s;
    }
    // Where the store knows what its publish replaced (file://, mem://), the charge was made
    // in its on_publish callback, in publish order: see settle(). Else by the look above.
    if (!published_->charged) settle(old_size_);
    return {};
  }

  void abort() override {
    {
      std::lock_guard lock(mu_);
      if (done_) return;
      done_ = true;
    }
    inner_->abort();
    (void)ledger_->release(reservation_);
  }

 private:
  // Charges the published object: what was written less the object it replaced (`old`,
  // charged already), and no new object when it replaced one. The object is published: a
  // ledger that fails now leaves the usage short (reconcile recounts it) rather than
  // reporting a write that happened as failed.
  void settle(std::optional<int64_t> old) {
    int64_t bytes = bytes_, objects = 1;
    if (old) {
      bytes -= *old;
      objects = 0;
    }
    (void)ledger_->commit(reservation_, target_, bytes, objects);
  }

  // Takes the key's publish lock and looks at the object again: the charge is made against
  // what is there now, and the reservation grows when that leaves more to charge than
  // create saw (the old object shrank or went).
  Status look_again(std::unique_ptr<PublishLock>& lock) {
    SLUICE_ASSIGN_OR_RETURN(
        lock, PublishLock::take(ledger_, lookup_->location, lookup_->hold, lookup_->wait));
    SLUICE_ASSIGN_OR_RETURN(std::optional<int64_t> old, lookup_->size());
    const int64_t reserved_objects = old_size_ ? 0 : 1;
    old_size_ = old;
    const int64_t more_bytes = std::max<int64_t>(0, bytes_ - old.value_or(0) - reserved_);
    const int64_t more_objects = (old ? 0 : 1) - reserved_objects;
    if (more_bytes == 0 && more_objects <= 0) return {};
    Status s = ledger_->grow(reservation_, target_, more_bytes, std::max<int64_t>(0, more_objects));
    if (!s && s.error().code() == Code::kNotFound) s = reserve_again(reserved_ + more_bytes);
    SLUICE_RETURN_IF_ERROR(s);
    reserved_ += more_bytes;
    return {};
  }

  // Grows the reservation so it covers `end` bytes; a refusal aborts the write.
  Status cover(uint64_t end) {
    std::lock_guard lock(mu_);
    if (done_) return fail(Code::kInvalidArgument, "write to a finished writer");
    // An overwrite's first old_size bytes are charged already.
    int64_t need = static_cast<int64_t>(end) - old_size_.value_or(0);
    Status s;
    if (need > reserved_) {
      // Ahead of the bytes, doubling up to a cap; only what is needed when that is all
      // that still fits.
      int64_t exact = need - reserved_;
      int64_t step = std::max({exact, min_growth_, std::min(reserved_, kMaxStep)});
      s = ledger_->grow(reservation_, target_, step, 0);
      if (!s && s.error().code() == Code::kQuotaExceeded && step > exact) {
        step = exact;
        s = ledger_->grow(reservation_, target_, step, 0);
      }
      if (!s && s.error().code() == Code::kNotFound) s = reserve_again(reserved_ + step);
      if (s) {
        reserved_ += step;
        renewed_ = std::chrono::steady_clock::now();
      }
    } else if (std::chrono::steady_clock::now() - renewed_ > ledger_->reservation_ttl() / 2) {
      // A long write keeps its reservation alive (growing by nothing renews it).
      s = ledger_->grow(reservation_, target_, 0, 0);
      if (!s && s.error().code() == Code::kNotFound) s = reserve_again(reserved_);
      if (s) renewed_ = std::chrono::steady_clock::now();
    }
    if (!s) {
      done_ = true;
      inner_->abort();
      (void)ledger_->release(reservation_);
      return std::unexpected(
          s.error().with_context("writing into project '" + target_.project + "'"));
    }
    return {};
  }

  // The reservation expired (the writer stalled past its time to live): take a new one.
  Status reserve_again(int64_t bytes) {
    SLUICE_ASSIGN_OR_RETURN(reservation_, ledger_->reserve(target_, bytes, old_size_ ? 0 : 1));
    return {};
  }

  static constexpr int64_t kMaxStep = int64_t{1} << 30;
  std::optional<Lookup> lookup_;
  std::shared_ptr<PublishState> published_;
  int64_t bytes_ = 0;  // what commit publishes
  std::chrono::steady_clock::time_point renewed_ = std::chrono::steady_clock::now();
  std::unique_ptr<store::Writer> inner_;
  std::shared_ptr<Ledger> ledger_;
  ChargeTarget target_;
  std::string reservation_;
  std::mutex mu_;
  int64_t reserved_;
  std::optional<int64_t> old_size_;
  int64_t min_growth_;
  bool done_ = false;
};

class ChargingStore final : public store::StoreWrapper {
 public:
  ChargingStore(std::shared_ptr<store::Store> target, std::shared_ptr<Ledger> ledger,
                ChargingOptions options)
      : StoreWrapper(std::move(target)), ledger_(std::move(ledger)), options_(options) {
    // The projects' spelling: a relative, dotted or symlinked file:// root resolves to
    // the directory the projects name.
    std::string uri = StoreWrapper::uri();
    if (uri.starts_with("file://") && (uri.size() == 7 || uri[7] != '/')) {
      std::error_code ec;
      auto abs = std::filesystem::absolute(uri.substr(7), ec);
      if (!ec) uri = "file://" + abs.string();
    }
    root_ = normalise_location(uri);
  }

  Status load_projects() { return projects_.load(); }

  Result<std::unique_ptr<store::Writer>> create(std::string_view key,
                                                const store::WriteOptions& options) override {
    SLUICE_RETURN_IF_ERROR(store::validate_key(key));
    SLUICE_ASSIGN_OR_RETURN(auto target, target_of(key));
    if (!target) return StoreWrapper::create(key, options);
    std::optional<int64_t> old_size;
    if (options.overwrite) {
      SLUICE_ASSIGN_OR_RETURN(old_size, size_of(key));
    }
    // An overwrite adds no object, and only the bytes beyond the old object's size: the
    // old bytes are charged already and become the new object's.
    int64_t credit = old_size.value_or(0);
    int64_t bytes = options.size_hint
                        ? std::max<int64_t>(0, static_cast<int64_t>(*options.size_hint) - credit)
                        : 0;
    auto reservation = ledger_->reserve(*target, bytes, old_size ? 0 : 1);
    if (!reservation) return refused(reservation.error(), key, *target);
    auto published = std::make_shared<PublishState>();
    store::WriteOptions inner_options = options;
    inner_options.on_publish = ChargingWriter::publish_hook(published, options.on_publish);
    auto inner = StoreWrapper::create(key, inner_options);
    if (!inner) {
      (void)ledger_->release(*reservation);
      return std::unexpected(inner.error());
    }
    // Every charged publish to such a store takes the lock, overwrite or not: an exclusive
    // create racing an overwrite would otherwise be charged as a second object.
    std::optional<Lookup> lookup;
    if (!reports_replaced())
      lookup =
          Lookup{location_of(key),
                 [target = shared_target(), k = std::string(key)]() { return size_in(*target, k); },
                 options_.publish_hold, options_.publish_wait};
    return std::make_unique<ChargingWriter>(
        std::move(*inner), ledger_, std::move(*target), std::move(*reservation), bytes, old_size,
        options_.min_growth, std::move(published), std::move(lookup));
  }

  // Asks the ledger by reserving what a write would, and releasing it at once.
  Status can_write(std::string_view key, uint64_t bytes, uint64_t objects) override {
    SLUICE_RETURN_IF_ERROR(store::validate_key(key));
    SLUICE_RETURN_IF_ERROR(StoreWrapper::can_write(key, bytes, objects));
    SLUICE_ASSIGN_OR_RETURN(auto target, target_of(key));
    if (!target) return {};
    auto reservation =
        ledger_->reserve(*target, static_cast<int64_t>(bytes), static_cast<int64_t>(objects));
    if (!reservation) return refused(reservation.error(), key, *target);
    (void)ledger_->release(*reservation);  // expires on its own if this fails
    return {};
  }

  // Where publishes cannot say what they replaced, removals cannot say what they took
  // either (removing a missing key succeeds on an object store): the key's lock is held
  // across the look and the removal, as a publish holds it, so two removals of one object,
  // or a removal racing a publish, uncharge exactly what went.
  Status remove(std::string_view key) override {
    SLUICE_ASSIGN_OR_RETURN(auto target, target_of(key));
    if (!target) return StoreWrapper::remove(key);
    const std::string location = location_of(key);
    std::unique_ptr<PublishLock> lock;
    if (!reports_replaced()) {
      auto held =
          PublishLock::take(ledger_, location, options_.publish_hold, options_.publish_wait);
      if (!held) return std::unexpected(held.error().with_context("removing " + location));
      lock = std::move(*held);
    }
    SLUICE_ASSIGN_OR_RETURN(std::optional<int64_t> size, size_of(key));
    SLUICE_RETURN_IF_ERROR(StoreWrapper::remove(key));
    if (size) (void)ledger_->charge(*target, -*size, -1);
    return {};
  }

  Status remove_many(std::span<const std::string> keys) override {
    std::map<std::string, std::pair<ChargeTarget, std::pair<int64_t, int64_t>>> freed;
    for (const auto& key : keys) {
      SLUICE_ASSIGN_OR_RETURN(auto target, target_of(key));
      if (!target) continue;
      auto info = StoreWrapper::stat(key);
      if (!info) continue;
      std::string id = target->project + "\n" + std::string(tier_name(target->tier)) + "\n" +
                       std::string(kind_name(target->kind));
      auto& f =
          freed.try_emplace(id, std::move(*target), std::pair<int64_t, int64_t>{}).first->second;
      f.second.first += static_cast<int64_t>(info->size);
      f.second.second += 1;
    }
    SLUICE_RETURN_IF_ERROR(StoreWrapper::remove_many(keys));
    for (auto& [id, f] : freed) (void)ledger_->charge(f.first, -f.second.first, -f.second.second);
    return {};
  }

 private:
  std::unexpected<Error> refused(const Error& e, std::string_view key,
                                 const ChargeTarget& target) const {
    return std::unexpected(e.with_context("cannot write " + root_ + "/" + std::string(key) +
                                          " (project '" + target.project + "')"));
  }

  std::string location_of(std::string_view key) const { return root_ + "/" + std::string(key); }

  // The size of the object at `key`, or nullopt when there is none.
  static Result<std::optional<int64_t>> size_in(store::Store& store, std::string_view key) {
    auto old = store.stat(key);
    if (old) return static_cast<int64_t>(old->size);
    if (old.error().code() == Code::kNotFound) return std::optional<int64_t>{};
    return std::unexpected(old.error());
  }
  Result<std::optional<int64_t>> size_of(std::string_view key) { return size_in(*this, key); }

  // The charge target of a key, or nullopt when no project owns it (and that is allowed).
  Result<std::optional<ChargeTarget>> target_of(std::string_view key) {
    std::string location = location_of(key);
    SLUICE_ASSIGN_OR_RETURN(std::optional<Project> p, projects_.owner(location));
    if (p)
      return ChargeTarget{p->id, p->team, options_.tier.value_or(p->tier),
                          options_.kind.value_or(p->kind)};
    if (options_.require_project)
      return fail(Code::kPermissionDenied, "no project owns " + location +
                                               ": writes here must be charged to a team "
                                               "(add one with sluice project add)");
    return std::optional<ChargeTarget>{};
  }

  std::shared_ptr<Ledger> ledger_;
  ChargingOptions options_;
  std::string root_;
  ProjectIndex projects_{ledger_};
};

}  // namespace

Result<std::unique_ptr<store::Store>> with_charging(std::shared_ptr<store::Store> store,
                                                    std::shared_ptr<Ledger> ledger,
                                                    const ChargingOptions& options) {
  auto charging = std::make_unique<ChargingStore>(std::move(store), std::move(ledger), options);
  SLUICE_RETURN_IF_ERROR(charging->load_projects());
  return charging;
}

}  // namespace sluice::ledger
