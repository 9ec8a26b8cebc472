// The charging decorator: reservations around every Writer, uncharges on remove.
#include "sluice/ledger/charging_store.h"

#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>

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

// How long one publish of an object-store key holds the key's lock in the ledger (a
// crashed writer's lock is taken over after it), and how long another writer waits for it.
constexpr std::chrono::seconds kPublishHold{120}, kPublishWait{300};

// For a store that cannot say what a publish replaced: the key's location, and a fresh
// look at the object the publish will replace (its size, or nullopt when there is none).
struct Lookup {
  std::string location;
  std::function<Result<std::optional<int64_t>>()> size;
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
    std::string holder;
    if (lookup_) {
      auto held = ledger_->lock_key(lookup_->location, kPublishHold, kPublishWait);
      auto old = held ? lookup_->size() : Result<std::optional<int64_t>>(std::nullopt);
      if (!held || !old) {
        if (held) (void)ledger_->unlock_key(lookup_->location, *held);
        inner_->abort();
        (void)ledger_->release(reservation_);
        Error e = held ? old.error() : held.error();
        return std::unexpected(e.with_context("publishing " + lookup_->location));
      }
      holder = std::move(*held);
      old_size_ = *old;
    }
    Status s = inner_->commit();
    if (!s) {
      if (!holder.empty()) (void)ledger_->unlock_key(lookup_->location, holder);
      (void)ledger_->release(reservation_);  // expires on its own if this fails too
      return s;
    }
    // Where the store knows what its publish replaced (file://, mem://), the charge was made
    // in its on_publish callback, in publish order: see settle(). Else by the look above
    // (or, for a write that may not replace anything, by what create saw: nothing).
    if (!published_->charged) settle(old_size_);
    if (!holder.empty()) (void)ledger_->unlock_key(lookup_->location, holder);
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
    std::optional<Lookup> lookup;
    if (options.overwrite && !reports_replaced())
      lookup = Lookup{location_of(key), [this, k = std::string(key)] { return size_of(k); }};
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

  // A store that cannot say what a removal took (object stores, where removing a missing
  // key succeeds) holds the key's lock across the look and the removal, as a publish does:
  // two removals of one object uncharge it once.
  Status remove(std::string_view key) override {
    SLUICE_ASSIGN_OR_RETURN(auto target, target_of(key));
    if (!target) return StoreWrapper::remove(key);
    std::string location = location_of(key), holder;
    if (!reports_replaced()) {
      auto held = ledger_->lock_key(location, kPublishHold, kPublishWait);
      if (!held) return std::unexpected(held.error().with_context("removing " + location));
      holder = std::move(*held);
    }
    auto info = StoreWrapper::stat(key);
    Status removed = StoreWrapper::remove(key);
    if (removed && info) (void)ledger_->charge(*target, -static_cast<int64_t>(info->size), -1);
    if (!holder.empty()) (void)ledger_->unlock_key(location, holder);
    return removed;
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
  Result<std::optional<int64_t>> size_of(std::string_view key) {
    auto old = StoreWrapper::stat(key);
    if (old) return static_cast<int64_t>(old->size);
    if (old.error().code() == Code::kNotFound) return std::optional<int64_t>{};
    return std::unexpected(old.error());
  }

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
