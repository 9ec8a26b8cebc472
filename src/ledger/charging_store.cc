// The charging decorator: reservations around every Writer, uncharges on
// remove.
#include "sluice/ledger/charging_store.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <thread>

#include "ledger/project_index.h"
#include "sluice/core/thread_annotations.h"
#include "sluice/store/wrapper.h"

namespace sluice::ledger {
namespace {

using Clock = std::chrono::steady_clock;

class ChargingWriter;

// Shared by a ChargingWriter and the on_publish hook it gave the inner store's
// writer (made before the ChargingWriter itself).
struct PublishState {
  ChargingWriter* self = nullptr;
  bool charged = false;  // the hook charged the commit
};

// The folder of a key: everything up to its last '/', with it ("a/b/" for
// "a/b/k"; "" for a key at the top).
std::string_view folder_of(std::string_view key) {
  size_t slash = key.rfind('/');
  return slash == std::string_view::npos ? std::string_view{} : key.substr(0, slash + 1);
}

// The size of the object at `key`, or nullopt when there is none.
Result<std::optional<int64_t>> size_in(store::Store& store, std::string_view key) {
  auto old = store.stat(key);
  if (old) return static_cast<int64_t>(old->size);
  if (old.error().code() == Code::kNotFound) return std::optional<int64_t>{};
  return std::unexpected(old.error());
}

// For a store that cannot say what a publish replaced (object stores): the
// locks in the ledger (Ledger::lock_key) that publishes and removals hold, one
// per folder, kept as a lease across the consecutive publishes and removals of
// this store into that folder (a copy of many small objects takes the lock
// once, not once per object).
//
// A lease starts when a publish finds none: it takes the folder's lock (waiting
// for another holder, up to `wait`) and lists the folder once (its first 1000
// keys; a larger folder is not listed), so the publishes under it learn what
// each replaces from that listing, kept up to date by their own publishes and
// removals, instead of a stat each: while the lease stands no other sluice
// writer publishes into the folder. Publishes of this store into the folder
// then share it, one at a time per key. It ends, once the publishes in flight
// are done, when no publish has come for kLinger, `lease` after it began (a
// later publish takes a new one), or soon after another writer starts waiting
// for the lock (Ledger::key_wanted; this store then waits kYield before it asks
// again, so the waiter gets its turn). A keeper thread renews the lock every
// third of `hold` while a publish runs long.
class PublishLeases {
 public:
  struct Options {
    std::chrono::seconds hold, wait;
    std::chrono::milliseconds lease;  // 0: a lease per publish, with a stat and no listing
  };

 private:
  using Sizes = std::map<std::string, int64_t, std::less<>>;
  enum class State { kFree, kTaking, kHeld, kLeaving };

  struct Lease {
    Lease(std::string f, std::string l) : folder(std::move(f)), location(std::move(l)) {}
    const std::string folder;    // the keys' prefix: "a/b/", or "" at the top
    const std::string location;  // the lock's name in the ledger: the folder's location
    Mutex mu;
    CondVar cv;  // any change below
    State state SLUICE_GUARDED_BY(mu) = State::kFree;
    std::string holder SLUICE_GUARDED_BY(mu);
    int users SLUICE_GUARDED_BY(mu) = 0;
    std::set<std::string, std::less<>> busy SLUICE_GUARDED_BY(mu);  // keys pinned now
    // No publish joins any more: past its time, lost, or another writer waits
    // (`yield`).
    bool closing SLUICE_GUARDED_BY(mu) = false;
    bool yield SLUICE_GUARDED_BY(mu) = false;
    Clock::time_point taken SLUICE_GUARDED_BY(mu), used SLUICE_GUARDED_BY(mu),
        renewed SLUICE_GUARDED_BY(mu), asked SLUICE_GUARDED_BY(mu),
        not_before SLUICE_GUARDED_BY(mu);
    // The folder's objects (name in the folder -> size) while held; none: not
    // listed.
    std::optional<Sizes> sizes SLUICE_GUARDED_BY(mu);
    uint64_t failures SLUICE_GUARDED_BY(mu) = 0;  // takes that failed, and the last error
    Error failure SLUICE_GUARDED_BY(mu){Code::kInternal, ""};
  };

 public:
  // One publish's or removal's hold on its key: the folder's lease is kept
  // while it lives, and no other publish of this store touches the key.
  class Pin {
   public:
    Pin(Pin&& o) noexcept
        : owner_(o.owner_), lease_(std::move(o.lease_)), key_(std::move(o.key_)) {}
    Pin& operator=(Pin&&) = delete;
    ~Pin() {
      if (!lease_) return;
      Lease& l = *lease_;
      UniqueLock lock(l.mu);
      l.busy.erase(key_);
      --l.users;
      l.used = Clock::now();
      if (l.users == 0 && l.closing && l.state == State::kHeld) owner_->leave(l, lock);
      l.cv.notify_all();
    }

    // The size of the object at the key before this publish (nullopt: none):
    // from the lease's listing, else a stat.
    Result<std::optional<int64_t>> size() {
      {
        Lease& l = *lease_;
        MutexLock lock(l.mu);
        if (l.sizes) {
          auto it = l.sizes->find(name());
          return it == l.sizes->end() ? std::nullopt : std::optional<int64_t>(it->second);
        }
      }
      return size_in(*owner_->store_, key_);
    }
    // The key holds an object of `size` bytes now (nullopt: none).
    void holds(std::optional<int64_t> size) {
      Lease& l = *lease_;
      MutexLock lock(l.mu);
      if (!l.sizes) return;
      if (size)
        l.sizes->insert_or_assign(std::string(name()), *size);
      else
        l.sizes->erase(std::string(name()));
    }
    const std::string& key() const { return key_; }
    // What the key holds is not known (a publish or removal failed midway): the
    // rest of the lease stats each key.
    void unsure() {
      Lease& l = *lease_;
      MutexLock lock(l.mu);
      l.sizes.reset();
    }

   private:
    friend class PublishLeases;
    Pin(PublishLeases* owner, std::shared_ptr<Lease> lease, std::string key)
        : owner_(owner), lease_(std::move(lease)), key_(std::move(key)) {}
    std::string_view name() const { return std::string_view(key_).substr(lease_->folder.size()); }

    PublishLeases* owner_;
    std::shared_ptr<Lease> lease_;
    std::string key_;
  };

  PublishLeases(std::shared_ptr<Ledger> ledger, std::shared_ptr<store::Store> store,
                std::string root, Options options)
      : ledger_(std::move(ledger)), store_(std::move(store)), root_(std::move(root)), o_(options) {}

  ~PublishLeases() {
    std::thread keeper;
    {
      MutexLock lock(stop_mu_);
      stopping_ = true;
      keeper = std::move(keeper_);
    }
    stop_cv_.notify_all();
    if (keeper.joinable()) keeper.join();
    MutexLock map(map_mu_);
    for (auto& [folder, lease] : leases_) {
      Lease& l = *lease;
      MutexLock lock(l.mu);
      if (l.state == State::kHeld) (void)ledger_->unlock_key(l.location, l.holder);
    }
  }

  // Waits for the key's folder's lease (taking the lock when no lease stands)
  // and for other publishes of the key in this store. Unavailable when the lock
  // stayed held elsewhere for `wait`.
  Result<Pin> pin(std::string_view key) {
    std::shared_ptr<Lease> lease = lease_of(folder_of(key));
    Lease& l = *lease;
    UniqueLock lock(l.mu);
    const uint64_t failures = l.failures;
    for (;;) {
      if (l.state == State::kHeld && !l.closing) {
        if (!l.busy.contains(key)) {
          l.busy.emplace(key);
          ++l.users;
          l.used = Clock::now();
          return Pin(this, std::move(lease), std::string(key));
        }
        l.cv.wait(lock);
      } else if (l.state == State::kFree && l.failures != failures) {
        return std::unexpected(l.failure);  // the take this caller waited for failed
      } else if (l.state == State::kFree && Clock::now() < l.not_before) {
        l.cv.wait_until(lock, l.not_before);
      } else if (l.state == State::kFree) {
        l.state = State::kTaking;
        lock.unlock();
        auto holder = ledger_->lock_key(l.location, o_.hold, o_.wait);
        std::optional<Sizes> sizes;
        if (holder && o_.lease.count() > 0) sizes = listed(l.folder);
        lock.lock();
        l.cv.notify_all();  // a free lease again, or held: the waiters look
                            // again
        if (!holder) {
          l.state = State::kFree;
          ++l.failures;
          l.failure = holder.error();
          return std::unexpected(holder.error());
        }
        const auto now = Clock::now();
        l.state = State::kHeld;
        l.holder = std::move(*holder);
        l.taken = l.renewed = l.asked = l.used = now;
        l.closing = o_.lease.count() == 0;
        l.yield = false;
        l.sizes = std::move(sizes);
        l.busy.emplace(key);  // a lease that was free has no key pinned
        ++l.users;
        start_keeper();
        return Pin(this, std::move(lease), std::string(key));
      } else {
        l.cv.wait(lock);  // being taken or let go, or closing with publishes in flight
      }
    }
  }

  // Pins every key, folder by folder in order (so two callers pinning several
  // folders never wait for each other in a circle), each key once.
  Result<std::vector<Pin>> pin_all(std::vector<std::string> keys) {
    auto by_folder = [](const std::string& a, const std::string& b) {
      return std::pair(folder_of(a), std::string_view(a)) <
             std::pair(folder_of(b), std::string_view(b));
    };
    std::sort(keys.begin(), keys.end(), by_folder);
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
    std::vector<Pin> pins;
    pins.reserve(keys.size());
    for (const std::string& key : keys) {
      SLUICE_ASSIGN_OR_RETURN(Pin p, pin(key));
      pins.push_back(std::move(p));
    }
    return pins;
  }

  // The size of the object at `key` as a lease standing now lists it (the inner
  // nullopt: none); nullopt when no lease knows. For a reservation's first
  // guess only: the publish looks again under its pin.
  std::optional<std::optional<int64_t>> known_size(std::string_view key) {
    const std::string_view folder = folder_of(key);
    std::shared_ptr<Lease> lease;
    {
      MutexLock lock(map_mu_);
      auto it = leases_.find(folder);
      if (it == leases_.end()) return std::nullopt;
      lease = it->second;
    }
    Lease& l = *lease;
    MutexLock lock(l.mu);
    if (l.state != State::kHeld || !l.sizes) return std::nullopt;
    auto it = l.sizes->find(key.substr(folder.size()));
    return it == l.sizes->end() ? std::optional<int64_t>() : std::optional<int64_t>(it->second);
  }

  std::string location_of(std::string_view key) const { return root_ + "/" + std::string(key); }

 private:
  // A publish waits this long for a lease before it ends one that no publish
  // uses.
  static constexpr auto kLinger = std::chrono::milliseconds(50);
  // Longer than a waiter's pause between asks (Ledger::kLockPoll): it gets its
  // turn.
  static constexpr auto kYield = Ledger::kLockPoll + std::chrono::milliseconds(50);
  // How often the keeper looks at the leases, and asks whether a writer waits
  // for one.
  static constexpr auto kTick = std::chrono::milliseconds(10);
  static constexpr auto kAsk = Ledger::kLockPoll;
  static constexpr size_t kListedAtMost = 1000;

  std::shared_ptr<Lease> lease_of(std::string_view folder) {
    MutexLock lock(map_mu_);
    auto it = leases_.find(folder);
    if (it == leases_.end()) {
      std::string f(folder);
      // The folder's location: the root for keys at the top; with its '/', so
      // no folder's lock is ever named like a key.
      std::string location = root_ + "/" + f;
      it = leases_.emplace(f, std::make_shared<Lease>(f, std::move(location))).first;
    }
    return it->second;
  }

  // The folder's objects, when one page of a listing holds them all.
  std::optional<Sizes> listed(const std::string& folder) {
    auto page = store_->list(store::ListOptions{.prefix = folder, .max_keys = kListedAtMost});
    if (!page || !page->next_token.empty() || !page->skipped.empty()) return std::nullopt;
    Sizes sizes;
    for (const store::ObjectInfo& o : page->objects) {
      std::string_view name = std::string_view(o.key).substr(folder.size());
      if (name.find('/') == std::string_view::npos)
        sizes.emplace(std::string(name), static_cast<int64_t>(o.size));
    }
    return sizes;
  }

  // Lets the lock go (the lease's last publish is done); a later publish takes
  // it anew. `lock` holds l.mu and is let go around the ledger's call: the
  // analysis cannot follow a scoped lock passed by reference, so it is off here
  // (callers still must hold l.mu).
  void leave(Lease& l, UniqueLock& lock) SLUICE_REQUIRES(l.mu) SLUICE_NO_THREAD_SAFETY_ANALYSIS {
    l.state = State::kLeaving;
    const std::string holder = std::move(l.holder);
    lock.unlock();
    // NotFound: held past its time and taken over (this process stalled for
    // longer than the hold); the charges made stand, and reconcile repairs what
    // they missed.
    (void)ledger_->unlock_key(l.location, holder);
    lock.lock();
    l.state = State::kFree;
    l.sizes.reset();
    l.not_before = l.yield ? Clock::now() + kYield : Clock::time_point{};
    l.cv.notify_all();
  }

  void start_keeper() {
    MutexLock lock(stop_mu_);
    if (!keeper_.joinable() && !stopping_) keeper_ = std::thread([this] { keep(); });
  }

  void keep() {
    UniqueLock lock(stop_mu_);
    while (!stop_cv_.wait_for(lock, kTick, [&]() SLUICE_REQUIRES(stop_mu_) { return stopping_; })) {
      lock.unlock();
      tend();
      lock.lock();
    }
  }

  // Renews the leases whose publishes run long, ends those past their time,
  // idle, or wanted by another writer, and forgets the folders no lease stands
  // for.
  void tend() {
    std::vector<std::shared_ptr<Lease>> all;
    {
      MutexLock lock(map_mu_);
      for (auto it = leases_.begin(); it != leases_.end();) {
        // Only the map holds it (every copy is made under map_mu_): nobody
        // waits for it.
        bool unused = it->second.use_count() == 1;
        if (unused) {
          Lease& l = *it->second;
          MutexLock held(l.mu);
          unused = l.state == State::kFree && Clock::now() >= l.not_before;
        }
        if (unused) {
          it = leases_.erase(it);
        } else {
          all.push_back(it->second);
          ++it;
        }
      }
    }
    for (const std::shared_ptr<Lease>& lease : all) {
      Lease& l = *lease;
      UniqueLock lock(l.mu);
      if (l.state != State::kHeld) continue;
      const std::string holder = l.holder;
      auto now = Clock::now();
      if (now - l.renewed >= o_.hold / 3) {
        lock.unlock();
        Status s = ledger_->renew_key(l.location, holder, o_.hold);
        lock.lock();
        if (l.state != State::kHeld || l.holder != holder) continue;
        if (s) {
          l.renewed = now;
        } else if (s.error().code() == Code::kNotFound) {
          l.closing = true;  // lost: what another writer published is not in the listing
          l.sizes.reset();
        }
      }
      if (!l.closing && now - l.asked >= kAsk) {
        l.asked = now;
        lock.unlock();
        Result<bool> wanted = ledger_->key_wanted(l.location);
        lock.lock();
        if (l.state != State::kHeld || l.holder != holder) continue;
        if (wanted && *wanted) l.closing = l.yield = true;
      }
      now = Clock::now();
      if (now - l.taken >= o_.lease) l.closing = true;
      if (l.users == 0 && (l.closing || now - l.used >= kLinger)) leave(l, lock);
      l.cv.notify_all();
    }
  }

  std::shared_ptr<Ledger> ledger_;
  std::shared_ptr<store::Store> store_;  // the store the charging store wraps
  const std::string root_;
  const Options o_;
  Mutex map_mu_;  // taken before any lease's mu
  std::map<std::string, std::shared_ptr<Lease>, std::less<>> leases_ SLUICE_GUARDED_BY(map_mu_);
  Mutex stop_mu_;
  CondVar stop_cv_;
  bool stopping_ SLUICE_GUARDED_BY(stop_mu_) = false;
  std::thread keeper_ SLUICE_GUARDED_BY(stop_mu_);
};

class ChargingWriter final : public store::Writer {
 public:
  ChargingWriter(std::unique_ptr<store::Writer> inner, std::shared_ptr<Ledger> ledger,
                 ChargeTarget target, std::string reservation, int64_t reserved,
                 std::optional<int64_t> old_size, uint64_t min_growth,
                 std::shared_ptr<PublishState> published, std::shared_ptr<PublishLeases> leases,
                 std::string key)
      : leases_(std::move(leases)),
        key_(std::move(key)),
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

  // The hook for the inner store's writer (WriteOptions::on_publish): once it
  // has published, it charges against exactly what the publish replaced, in
  // publish order, so writers of one key racing each other leave usage equal to
  // the object left, with no reconcile. A hook the caller set already (another
  // decorator above) still runs, after this one.
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
      MutexLock lock(mu_);
      if (done_) return fail(Code::kInvalidArgument, "commit of a finished writer");
      done_ = true;
    }
    // Some writers forget their size once committed.
    bytes_ = static_cast<int64_t>(inner_->size());
    // A store that cannot say what its publish replaced (object stores): the
    // lock of the key's folder in the ledger is held (a lease: PublishLeases)
    // across a fresh look at the old object, the publish and the charge, so
    // writers racing on one key charge against what each really replaced.
    std::optional<PublishLeases::Pin> pin;
    if (leases_) {
      Status ready = look_again(pin);
      if (!ready) {
        pin.reset();
        inner_->abort();
        (void)ledger_->release(reservation_);
        return std::unexpected(
            ready.error().with_context("publishing " + leases_->location_of(key_)));
      }
    }
    Status s = inner_->commit();
    if (!s) {
      if (pin) pin->unsure();                // published or not: the next look asks the store
      (void)ledger_->release(reservation_);  // expires on its own if this fails too
      return s;
    }
    // Where the store knows what its publish replaced (file://, mem://), the
    // charge was made in its on_publish callback, in publish order: see
    // settle(). Else by the look above.
    if (!published_->charged) settle(old_size_);
    if (pin) pin->holds(bytes_);
    return {};
  }

  void abort() override {
    {
      MutexLock lock(mu_);
      if (done_) return;
      done_ = true;
    }
    inner_->abort();
    (void)ledger_->release(reservation_);
  }

 private:
  // Charges the published object: what was written less the object it replaced
  // (`old`, charged already), and no new object when it replaced one. The
  // object is published: a ledger that fails now leaves the usage short
  // (reconcile recounts it) rather than reporting a write that happened as
  // failed.
  void settle(std::optional<int64_t> old) {
    int64_t bytes = bytes_, objects = 1;
    if (old) {
      bytes -= *old;
      objects = 0;
    }
    (void)ledger_->commit(reservation_, target_, bytes, objects);
  }

  // Pins the key under its folder's lease and looks at the object again: the
  // charge is made against what is there now, and the reservation grows when
  // that leaves more to charge than create saw (the old object shrank or went).
  Status look_again(std::optional<PublishLeases::Pin>& pin) {
    SLUICE_ASSIGN_OR_RETURN(PublishLeases::Pin held, leases_->pin(key_));
    pin.emplace(std::move(held));
    SLUICE_ASSIGN_OR_RETURN(std::optional<int64_t> old, pin->size());
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
    MutexLock lock(mu_);
    if (done_) return fail(Code::kInvalidArgument, "write to a finished writer");
    // An overwrite's first old_size bytes are charged already.
    int64_t need = static_cast<int64_t>(end) - old_size_.value_or(0);
    Status s;
    if (need > reserved_) {
      // Ahead of the bytes, doubling up to a cap; only what is needed when that
      // is all that still fits.
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
      // A long write keeps its reservation alive (growing by nothing renews
      // it).
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

  // The reservation expired (the writer stalled past its time to live): take a
  // new one.
  Status reserve_again(int64_t bytes) {
    SLUICE_ASSIGN_OR_RETURN(reservation_, ledger_->reserve(target_, bytes, old_size_ ? 0 : 1));
    return {};
  }

  static constexpr int64_t kMaxStep = int64_t{1} << 30;
  std::shared_ptr<PublishLeases> leases_;  // null where the store reports what it replaced
  std::string key_;
  std::shared_ptr<PublishState> published_;
  int64_t bytes_ = 0;  // what commit publishes
  std::chrono::steady_clock::time_point renewed_ = std::chrono::steady_clock::now();
  std::unique_ptr<store::Writer> inner_;
  std::shared_ptr<Ledger> ledger_;
  ChargeTarget target_;
  std::string reservation_;
  // The reservation (reservation_, reserved_, renewed_) is grown under mu_
  // while writes go on, and is the finishing thread's alone once done_ is set
  // (under mu_).
  Mutex mu_;
  int64_t reserved_;
  std::optional<int64_t> old_size_;
  int64_t min_growth_;
  bool done_ SLUICE_GUARDED_BY(mu_) = false;
};

class ChargingStore final : public store::StoreWrapper {
 public:
  ChargingStore(std::shared_ptr<store::Store> target, std::shared_ptr<Ledger> ledger,
                ChargingOptions options)
      : StoreWrapper(std::move(target)), ledger_(std::move(ledger)), options_(options) {
    // The projects' spelling: a relative, dotted or symlinked file:// root
    // resolves to the directory the projects name.
    std::string uri = StoreWrapper::uri();
    if (uri.starts_with("file://") && (uri.size() == 7 || uri[7] != '/')) {
      std::error_code ec;
      auto abs = std::filesystem::absolute(uri.substr(7), ec);
      if (!ec) uri = "file://" + abs.string();
    }
    root_ = normalise_location(uri);
    // Every charged publish to such a store takes the lock, overwrite or not:
    // an exclusive create racing an overwrite would otherwise be charged as a
    // second object.
    if (!reports_replaced())
      leases_ = std::make_shared<PublishLeases>(
          ledger_, shared_target(), root_,
          PublishLeases::Options{options_.publish_hold, options_.publish_wait,
                                 options_.publish_lease});
  }

  Status load_projects() { return projects_.load(); }

  Result<std::unique_ptr<store::Writer>> create(std::string_view key,
                                                const store::WriteOptions& options) override {
    SLUICE_RETURN_IF_ERROR(store::validate_key(key));
    SLUICE_ASSIGN_OR_RETURN(auto target, target_of(key));
    if (!target) return StoreWrapper::create(key, options);
    std::optional<int64_t> old_size;
    if (options.overwrite) {
      // A lease standing on the key's folder lists it already: no stat (the
      // publish looks again under its pin; this is the reservation's first
      // guess).
      auto known = leases_ ? leases_->known_size(key) : std::nullopt;
      if (known) {
        old_size = *known;
      } else {
        SLUICE_ASSIGN_OR_RETURN(old_size, size_of(key));
      }
    }
    // An overwrite adds no object, and only the bytes beyond the old object's
    // size: the old bytes are charged already and become the new object's.
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
    return std::make_unique<ChargingWriter>(
        std::move(*inner), ledger_, std::move(*target), std::move(*reservation), bytes, old_size,
        options_.min_growth, std::move(published), leases_, std::string(key));
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

  // Where publishes cannot say what they replaced, removals cannot say what
  // they took either (removing a missing key succeeds on an object store): the
  // lock of the key's folder is held across the look and the removal, as a
  // publish holds it, so two removals of one object, or a removal racing a
  // publish, uncharge exactly what went.
  Status remove(std::string_view key) override {
    SLUICE_ASSIGN_OR_RETURN(auto target, target_of(key));
    if (!target) return StoreWrapper::remove(key);
    std::optional<PublishLeases::Pin> pin;
    if (leases_) {
      auto held = leases_->pin(key);
      if (!held) return std::unexpected(held.error().with_context("removing " + location_of(key)));
      pin.emplace(std::move(*held));
    }
    SLUICE_ASSIGN_OR_RETURN(std::optional<int64_t> size, pin ? pin->size() : size_of(key));
    if (Status s = StoreWrapper::remove(key); !s) {
      if (pin) pin->unsure();
      return s;
    }
    if (pin) pin->holds(std::nullopt);
    if (size) (void)ledger_->charge(*target, -*size, -1);
    return {};
  }

  // gc's batches: the locks of the keys' folders are held as remove holds its
  // key's, all of them across the looks, the batch's removal and the charges.
  Status remove_many(std::span<const std::string> keys) override {
    std::vector<std::pair<std::string, ChargeTarget>> charged;
    for (const auto& key : keys) {
      SLUICE_ASSIGN_OR_RETURN(auto target, target_of(key));
      if (target) charged.emplace_back(key, std::move(*target));
    }
    std::vector<PublishLeases::Pin> pins;
    if (leases_ && !charged.empty()) {
      std::vector<std::string> pinned;
      for (const auto& [key, target] : charged) pinned.push_back(key);
      auto held = leases_->pin_all(std::move(pinned));
      if (!held)
        return std::unexpected(held.error().with_context("removing " + std::to_string(keys.size()) +
                                                         " objects from " + root_));
      pins = std::move(*held);
    }
    std::map<std::string_view, PublishLeases::Pin*> pin_of;
    for (PublishLeases::Pin& p : pins) pin_of.emplace(p.key(), &p);
    std::map<std::string, std::pair<ChargeTarget, std::pair<int64_t, int64_t>>> freed;
    std::set<std::string_view> seen;  // a key given twice goes once
    for (const auto& [key, target] : charged) {
      if (!seen.insert(key).second) continue;
      auto pin = pin_of.find(key);
      SLUICE_ASSIGN_OR_RETURN(std::optional<int64_t> size,
                              pin != pin_of.end() ? pin->second->size() : size_of(key));
      if (!size) continue;
      std::string id = target.project + "\n" + std::string(tier_name(target.tier)) + "\n" +
                       std::string(kind_name(target.kind));
      auto& f = freed.try_emplace(id, target, std::pair<int64_t, int64_t>{}).first->second;
      f.second.first += *size;
      f.second.second += 1;
    }
    if (Status s = StoreWrapper::remove_many(keys); !s) {
      for (PublishLeases::Pin& p : pins) p.unsure();
      return s;
    }
    for (PublishLeases::Pin& p : pins) p.holds(std::nullopt);
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

  Result<std::optional<int64_t>> size_of(std::string_view key) { return size_in(*this, key); }

  // The charge target of a key, or nullopt when no project owns it (and that is
  // allowed).
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
  std::shared_ptr<PublishLeases> leases_;  // null where the store reports what it replaced
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
