// The cache charger: per-project allowances carved into chunks (see cache_charger.h).
#include "sluice/ledger/cache_charger.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <thread>
#include <vector>

#include "ledger/project_index.h"
#include "sluice/core/thread_annotations.h"
#include "sluice/telemetry/registry.h"

namespace sluice::ledger {

namespace {
using Clock = std::chrono::steady_clock;
constexpr auto kLogEvery = std::chrono::minutes(1);
// Tags of chunks adopted while the ledger could not say whose they were: this bit and the
// index of their object's entry in `deferred`. Allowances' tags never reach it.
constexpr uint32_t kDeferredBit = 0x8000'0000u;
}  // namespace

struct CacheCharger::Impl {
  // One project's charges. `held` is what its chunks charged here take on NVMe now (the
  // tally); `reservation` (when not empty) holds `left` bytes not admitted yet; `dirty`:
  // the ledger has not been told `held` yet.
  struct Allowance {
    Mutex mu;
    ChargeTarget target;  // target, tag and the counters: set once, when it is made
    uint32_t tag = 0;
    std::string reservation SLUICE_GUARDED_BY(mu);
    int64_t left SLUICE_GUARDED_BY(mu) = 0;
    int64_t held SLUICE_GUARDED_BY(mu) = 0;
    bool dirty SLUICE_GUARDED_BY(mu) = false;
    // Its project was removed: nothing is charged to it any more.
    bool retired SLUICE_GUARDED_BY(mu) = false;
    Clock::time_point refused_until SLUICE_GUARDED_BY(mu){};
    Clock::time_point logged SLUICE_GUARDED_BY(mu){};
    telemetry::Counter* charged = nullptr;  // per team; null without a registry
    telemetry::Counter* refused = nullptr;
  };

  Impl(std::shared_ptr<Ledger> ledger, std::function<std::string(std::string_view)> where,
       CacheChargerOptions options)
      : projects(std::move(ledger)), location_of(std::move(where)), o(std::move(options)) {}

  ProjectIndex projects;
  std::function<std::string(std::string_view)> location_of;
  CacheChargerOptions o;

  Mutex unowned_mu;
  Clock::time_point unowned_logged SLUICE_GUARDED_BY(unowned_mu){};
  Mutex map_mu;  // guards both maps (not the allowances)
  std::map<std::string, Allowance*, std::less<>> by_project SLUICE_GUARDED_BY(map_mu);
  // Tag t at t - 1; never shrinks.
  std::vector<std::unique_ptr<Allowance>> by_tag SLUICE_GUARDED_BY(map_mu);

  // The chunks of one object found on NVMe at open while the ledger could not be asked
  // whose they are: charged to its project (`to`) at the first flush that can ask, or found
  // to be no project's (`unowned`). Until then `bytes` counts what of them is still there.
  struct Deferred {
    std::string key;
    int64_t chunks = 0, bytes = 0;
    Allowance* to = nullptr;
    bool unowned = false;
  };
  Mutex deferred_mu;  // taken before any allowance's mu
  std::vector<std::unique_ptr<Deferred>> deferred SLUICE_GUARDED_BY(deferred_mu);
  std::map<std::string, uint32_t, std::less<>> deferred_of SLUICE_GUARDED_BY(deferred_mu);
  size_t unresolved SLUICE_GUARDED_BY(deferred_mu) = 0;
  // This source's figures from before (load_tallies) are read back: at start(), or at the
  // first flush after when the ledger could not be reached then.
  std::atomic<bool> tallies_loaded{false};

  // Relaxed: statistics, only reported (stats()); the charges themselves are under the locks.
  std::atomic<uint64_t> admitted_chunks{0}, admitted_bytes{0}, refused_chunks{0}, refused_bytes{0},
      freed_bytes{0}, adopted_chunks{0}, adopted_bytes{0}, uncharged_chunks{0}, flushes{0},
      flush_errors{0}, deferred_chunks{0};

  Mutex stop_mu;
  CondVar stop_cv;
  bool stopping SLUICE_GUARDED_BY(stop_mu) = false;
  std::thread flusher;  // runs once started

  // Logs `line` unless a line went out at `last` less than a minute ago.
  void log(Clock::time_point& last, const std::string& line) {
    if (!o.log) return;
    auto now = Clock::now();
    if (last != Clock::time_point{} && now - last < kLogEvery) return;
    last = now;
    o.log(line);
  }
  void log(Allowance& a, const std::string& line) SLUICE_REQUIRES(a.mu) { log(a.logged, line); }
  void log_down(const Error& e) {
    MutexLock lock(unowned_mu);
    log(unowned_logged, "cache: the ledger cannot be reached (" + e.message() +
                            "): chunks found on NVMe are charged once it answers, and none are "
                            "kept meanwhile");
  }

  // The allowance of `target`'s project, made on first use.
  Allowance* allowance_for(const ChargeTarget& target) {
    MutexLock lock(map_mu);
    auto it = by_project.find(target.project);
    if (it != by_project.end()) return it->second;
    auto a = std::make_unique<Allowance>();
    a->target = target;
    a->tag = static_cast<uint32_t>(by_tag.size() + 1);
    if (o.registry) {
      a->charged = &o.registry->counter("sluice_cache_charged_bytes_total", {{"team", target.team}},
                                        "Bytes of chunks kept on NVMe, charged to a team");
      a->refused = &o.registry->counter(
          "sluice_cache_charge_refused_chunks_total", {{"team", target.team}},
          "Chunks not kept on NVMe: the team's quota (or the ledger) refused them");
    }
    Allowance* raw = a.get();
    by_tag.push_back(std::move(a));
    by_project.emplace(target.project, raw);
    return raw;
  }

  // The allowance of the project owning `key`; null when no project does (or the key's
  // location is unknown). An error when the ledger cannot be asked.
  Result<Allowance*> allowance_of(std::string_view key) {
    std::string location = location_of(key);
    if (location.empty()) return nullptr;
    SLUICE_ASSIGN_OR_RETURN(std::optional<Project> p, projects.owner(location));
    if (!p) return nullptr;
    return allowance_for(ChargeTarget{p->id, p->team, o.tier, o.kind});
  }

  Allowance* allowance_of(uint32_t tag) {
    MutexLock lock(map_mu);
    return tag == 0 || tag > by_tag.size() ? nullptr : by_tag[tag - 1].get();
  }

  // Tells the ledger `a`'s count and ends its reservation, in one transaction. Sent again
  // after a failure (a lost reply included): the count is absolute, and a reservation
  // already ended is not ended twice.
  Status settle_locked(Allowance& a) SLUICE_REQUIRES(a.mu) {
    if (a.retired || (!a.dirty && a.reservation.empty())) return {};
    Status s = projects.ledger().set_tally(o.source, a.target, a.held, a.reservation);
    if (!s && s.error().code() == Code::kNotFound) {
      retire_locked(a);  // its project was removed meanwhile
      return {};
    }
    SLUICE_RETURN_IF_ERROR(s);
    a.reservation.clear();
    a.left = 0;
    a.dirty = false;
    return {};
  }

  // The project of `a` is gone from the ledger: its reservation is released, its chunks
  // are no longer counted (the tag stays, and frees nothing), and a project of that ID
  // made later gets an allowance of its own.
  void retire_locked(Allowance& a) SLUICE_REQUIRES(a.mu) {
    if (!a.reservation.empty()) (void)projects.ledger().release(a.reservation);
    a.reservation.clear();
    a.left = a.held = 0;
    a.dirty = false;
    a.retired = true;
    {
      MutexLock lock(map_mu);
      auto it = by_project.find(a.target.project);
      if (it != by_project.end() && it->second == &a) by_project.erase(it);
    }
    (void)projects.load();
  }

  std::optional<uint32_t> admit(std::string_view key, int64_t bytes) {
    auto found = allowance_of(key);
    if (!found) {
      refuse(bytes);
      MutexLock lock(unowned_mu);
      log(unowned_logged,
          "cache: not keeping a chunk of '" + std::string(key) +
              "' on NVMe: the ledger cannot say whose it is: " + found.error().message());
      return std::nullopt;
    }
    if (!*found) {
      uncharged_chunks.fetch_add(1, std::memory_order_relaxed);
      return 0;
    }
    Allowance& a = **found;
    MutexLock lock(a.mu);
    if (a.retired) {  // removed as this chunk came: kept uncharged, as a key no project owns
      uncharged_chunks.fetch_add(1, std::memory_order_relaxed);
      return 0;
    }
    const auto now = Clock::now();
    if (now < a.refused_until) {
      refuse(bytes, &a);
      return std::nullopt;
    }
    if (a.reservation.empty() || a.left < bytes) {
      if (Status s = settle_locked(a); !s) {
        a.refused_until = now + o.refusal_memory;  // a ledger down is not asked per chunk
        refuse(bytes, &a);
        log(a, "cache: not keeping chunks of project '" + a.target.project +
                   "' on NVMe: " + s.error().message());
        return std::nullopt;
      }
      Ledger& l = projects.ledger();
      int64_t size = std::max<int64_t>(bytes, static_cast<int64_t>(o.allowance_bytes));
      auto r = l.reserve(a.target, size, 0);
      if (!r && r.error().code() == Code::kQuotaExceeded && size > bytes) {
        size = bytes;  // near the limit: only what this chunk needs
        r = l.reserve(a.target, size, 0);
      }
      if (!r) {
        a.refused_until = now + o.refusal_memory;
        refuse(bytes, &a);
        log(a, "cache: not keeping chunks of project '" + a.target.project + "' (team " +
                   a.target.team + ") on NVMe: " + r.error().message());
        return std::nullopt;
      }
      a.reservation = std::move(*r);
      a.left = size;
    }
    a.left -= bytes;
    a.held += bytes;
    a.dirty = true;
    if (a.charged) a.charged->add(static_cast<uint64_t>(bytes));
    admitted_chunks.fetch_add(1, std::memory_order_relaxed);
    admitted_bytes.fetch_add(static_cast<uint64_t>(bytes), std::memory_order_relaxed);
    return a.tag;
  }

  uint32_t adopt(std::string_view key, int64_t bytes) {
    auto found = allowance_of(key);
    if (!found) return defer(key, bytes);  // the ledger is down: charged once it answers
    if (!*found) return 0;                 // no project owns it: kept uncharged
    return adopt_into(**found, 1, bytes) ? (**found).tag : 0;
  }

  // Counts chunks found on NVMe into `a`'s allowance; false when its project is gone.
  bool adopt_into(Allowance& a, int64_t chunks, int64_t bytes) {
    MutexLock lock(a.mu);
    if (a.retired) return false;
    a.held += bytes;
    a.dirty = true;
    adopted_chunks.fetch_add(static_cast<uint64_t>(chunks), std::memory_order_relaxed);
    adopted_bytes.fetch_add(static_cast<uint64_t>(bytes), std::memory_order_relaxed);
    return true;
  }

  uint32_t defer(std::string_view key, int64_t bytes) {
    MutexLock lock(deferred_mu);
    auto it = deferred_of.find(key);
    if (it == deferred_of.end()) {
      const auto tag = static_cast<uint32_t>(deferred.size()) | kDeferredBit;
      deferred.push_back(std::make_unique<Deferred>(Deferred{.key = std::string(key)}));
      it = deferred_of.emplace(std::string(key), tag).first;
      ++unresolved;
    }
    Deferred& d = *deferred[it->second & ~kDeferredBit];
    d.chunks += 1;
    d.bytes += bytes;
    deferred_chunks.fetch_add(1, std::memory_order_relaxed);
    return it->second;
  }

  // Charges the chunks adopted while the ledger was down to their projects, now that it
  // answers (the projects load); those of no project stay uncharged. Stops at the first
  // object the ledger cannot place, for the next flush to go on with.
  Status resolve_deferred() {
    {
      MutexLock lock(deferred_mu);
      if (unresolved == 0) return {};
    }
    SLUICE_RETURN_IF_ERROR(projects.load());
    MutexLock lock(deferred_mu);
    for (const std::unique_ptr<Deferred>& d : deferred) {
      if (d->to || d->unowned) continue;
      SLUICE_ASSIGN_OR_RETURN(Allowance * a, allowance_of(d->key));
      if (a && adopt_into(*a, d->chunks, d->bytes))
        d->to = a;
      else
        d->unowned = true;  // kept uncharged, as a key no project owns
      --unresolved;
      if (d->unowned)
        uncharged_chunks.fetch_add(static_cast<uint64_t>(d->chunks), std::memory_order_relaxed);
    }
    deferred_of.clear();  // every tag resolved: no adoption names these objects again
    return {};
  }

  void freed(uint32_t tag, int64_t bytes) {
    if (tag & kDeferredBit) {
      MutexLock lock(deferred_mu);
      const uint32_t i = tag & ~kDeferredBit;
      if (i >= deferred.size()) return;
      Deferred& d = *deferred[i];
      if (!d.to) {
        if (!d.unowned) d.bytes = std::max<int64_t>(0, d.bytes - bytes);
        return;
      }
      free_from(*d.to, bytes);
      return;
    }
    Allowance* a = allowance_of(tag);
    if (a) free_from(*a, bytes);
  }

  void free_from(Allowance& a, int64_t bytes) {
    MutexLock lock(a.mu);
    if (a.retired) return;
    a.held = std::max<int64_t>(0, a.held - bytes);
    a.dirty = true;
    freed_bytes.fetch_add(static_cast<uint64_t>(bytes), std::memory_order_relaxed);
  }

  void refuse(int64_t bytes, Allowance* a = nullptr) {
    if (a && a->refused) a->refused->add();
    refused_chunks.fetch_add(1, std::memory_order_relaxed);
    refused_bytes.fetch_add(static_cast<uint64_t>(bytes), std::memory_order_relaxed);
  }

  // What this source told the ledger before (a run before a restart): each figure of its
  // tier and kind becomes an allowance to be set again at the first flush (to what the
  // cache adopts by then, or 0); a figure of another tier or kind (the options changed) is
  // set to 0 now.
  Status load_tallies() {
    SLUICE_ASSIGN_OR_RETURN(std::vector<Tally> before, projects.ledger().tallies(o.source));
    for (const Tally& t : before) {
      if (t.target.tier == o.tier && t.target.kind == o.kind) {
        Allowance* a = allowance_for(t.target);
        MutexLock lock(a->mu);
        a->dirty = true;
      } else {
        SLUICE_RETURN_IF_ERROR(projects.ledger().set_tally(o.source, t.target, 0));
      }
    }
    return {};
  }

  Status flush() {
    // What was left for the ledger to answer: this source's old figures, then the chunks
    // found at open while it was down. Their errors are the flush's, after the rest.
    Status late;
    if (!tallies_loaded.load()) {
      late = load_tallies();
      if (late) tallies_loaded = true;
    }
    if (late) late = resolve_deferred();
    if (!late) flush_errors.fetch_add(1, std::memory_order_relaxed);
    std::vector<Allowance*> all;
    {
      MutexLock lock(map_mu);
      for (auto& a : by_tag) all.push_back(a.get());
    }
    Status first;
    for (Allowance* a : all) {
      MutexLock lock(a->mu);
      Status s = settle_locked(*a);
      if (!s) {
        flush_errors.fetch_add(1, std::memory_order_relaxed);
        log(*a, "cache: charging project '" + a->target.project +
                    "' failed (kept, tried again): " + s.error().message());
        if (first) first = s;
      }
    }
    flushes.fetch_add(1, std::memory_order_relaxed);
    if (!late) return late;
    return first;
  }

  void run_flusher() {
    UniqueLock lock(stop_mu);
    while (!stopping) {
      if (stop_cv.wait_for(lock, o.flush_interval,
                           [&]() SLUICE_REQUIRES(stop_mu) { return stopping; }))
        break;
      lock.unlock();
      (void)flush();
      lock.lock();
    }
  }
};

Result<std::unique_ptr<CacheCharger>> CacheCharger::open(
    std::shared_ptr<Ledger> ledger, std::function<std::string(std::string_view key)> location_of,
    CacheChargerOptions options) {
  if (!ledger || !location_of)
    return fail(Code::kInvalidArgument, "cache charger: a ledger and location_of are required");
  if (options.source.empty())
    return fail(Code::kInvalidArgument, "cache charger: a source naming the cache is required");
  if (options.flush_interval.count() <= 0)
    return fail(Code::kInvalidArgument, "cache charger: flush_interval must be positive");
  auto impl = std::make_unique<Impl>(std::move(ledger), std::move(location_of), std::move(options));
  // A ledger that does not answer now (a server down) is asked again at each flush; until
  // then nothing is admitted, and what is adopted waits to be charged.
  if (Status s = impl->projects.load(); !s) {
    if (s.error().code() != Code::kUnavailable) return std::unexpected(s.error());
    impl->log_down(s.error());
  }
  return std::unique_ptr<CacheCharger>(new CacheCharger(std::move(impl)));
}

CacheCharger::CacheCharger(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Status CacheCharger::start() {
  if (impl_->flusher.joinable())
    return fail(Code::kInvalidArgument, "cache charger: started twice");
  if (Status s = impl_->load_tallies(); s) {
    impl_->tallies_loaded = true;
  } else if (s.error().code() == Code::kUnavailable) {
    impl_->log_down(s.error());  // read back at the first flush that reaches it
  } else {
    return s;
  }
  Impl* p = impl_.get();
  impl_->flusher = std::thread([p] { p->run_flusher(); });
  return {};
}

CacheCharger::~CacheCharger() {
  if (!impl_->flusher.joinable()) {
    // Never started (the cache did not open): it speaks for no cache, so it sets no
    // tally; its reservations expire on their own.
    return;
  }
  {
    MutexLock lock(impl_->stop_mu);
    impl_->stopping = true;
  }
  impl_->stop_cv.notify_all();
  impl_->flusher.join();
  (void)impl_->flush();
}

std::optional<uint32_t> CacheCharger::admit(std::string_view key, uint64_t bytes) {
  return impl_->admit(key, static_cast<int64_t>(bytes));
}

uint32_t CacheCharger::adopt(std::string_view key, uint64_t bytes) {
  return impl_->adopt(key, static_cast<int64_t>(bytes));
}

void CacheCharger::freed(uint32_t tag, uint64_t bytes) {
  impl_->freed(tag, static_cast<int64_t>(bytes));
}

Status CacheCharger::flush() {
  return impl_->flush();
}

CacheChargerStats CacheCharger::stats() const {
  const Impl& i = *impl_;
  auto get = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  return CacheChargerStats{.admitted_chunks = get(i.admitted_chunks),
                           .admitted_bytes = get(i.admitted_bytes),
                           .refused_chunks = get(i.refused_chunks),
                           .refused_bytes = get(i.refused_bytes),
                           .freed_bytes = get(i.freed_bytes),
                           .adopted_chunks = get(i.adopted_chunks),
                           .adopted_bytes = get(i.adopted_bytes),
                           .uncharged_chunks = get(i.uncharged_chunks),
                           .flushes = get(i.flushes),
                           .flush_errors = get(i.flush_errors),
                           .deferred_chunks = get(i.deferred_chunks)};
}

}  // namespace sluice::ledger
