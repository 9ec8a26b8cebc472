// The cache charger: per-project allowances carved into chunks (see cache_charger.h).
#include "sluice/ledger/cache_charger.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "ledger/project_index.h"
#include "sluice/telemetry/registry.h"

namespace sluice::ledger {

namespace {
using Clock = std::chrono::steady_clock;
constexpr auto kLogEvery = std::chrono::minutes(1);
}  // namespace

struct CacheCharger::Impl {
  // One project's charges. `reservation` (when not empty) holds `left` bytes not admitted
  // yet; `admitted` and `freed` wait for the next flush.
  struct Allowance {
    std::mutex mu;
    ChargeTarget target;
    std::string reservation;
    int64_t left = 0, admitted = 0, freed = 0;
    Clock::time_point refused_until{}, logged{};
    telemetry::Counter* charged = nullptr;  // per team; null without a registry
    telemetry::Counter* refused = nullptr;
  };

  Impl(std::shared_ptr<Ledger> ledger, std::function<std::string(std::string_view)> where,
       CacheChargerOptions options)
      : projects(std::move(ledger)), location_of(std::move(where)), o(std::move(options)) {}

  ProjectIndex projects;
  std::function<std::string(std::string_view)> location_of;
  CacheChargerOptions o;

  std::mutex unowned_mu;  // guards unowned_logged
  Clock::time_point unowned_logged{};
  std::mutex map_mu;
  std::map<std::string, std::unique_ptr<Allowance>, std::less<>> allowances;  // by project

  std::atomic<uint64_t> admitted_chunks{0}, admitted_bytes{0}, refused_chunks{0}, refused_bytes{0},
      freed_bytes{0}, uncharged_chunks{0}, flushes{0}, flush_errors{0};

  std::mutex stop_mu;
  std::condition_variable stop_cv;
  bool stopping = false;
  std::thread flusher;

  // Logs `line` unless a line went out at `last` less than a minute ago.
  void log(Clock::time_point& last, const std::string& line) {
    if (!o.log) return;
    auto now = Clock::now();
    if (last != Clock::time_point{} && now - last < kLogEvery) return;
    last = now;
    o.log(line);
  }
  void log(Allowance& a, const std::string& line) { log(a.logged, line); }

  // The allowance of the project owning `key`; null when no project does (or the key's
  // location is unknown). An error when the ledger cannot be asked.
  Result<Allowance*> allowance_of(std::string_view key) {
    std::string location = location_of(key);
    if (location.empty()) return nullptr;
    SLUICE_ASSIGN_OR_RETURN(std::optional<Project> p, projects.owner(location));
    if (!p) return nullptr;
    std::lock_guard lock(map_mu);
    auto it = allowances.find(p->id);
    if (it == allowances.end()) {
      auto a = std::make_unique<Allowance>();
      a->target = ChargeTarget{p->id, p->team, o.tier, o.kind};
      if (o.registry) {
        a->charged = &o.registry->counter("sluice_cache_charged_bytes_total", {{"team", p->team}},
                                          "Bytes of chunks kept on NVMe, charged to a team");
        a->refused = &o.registry->counter(
            "sluice_cache_charge_refused_chunks_total", {{"team", p->team}},
            "Chunks not kept on NVMe: the team's quota (or the ledger) refused them");
      }
      it = allowances.emplace(p->id, std::move(a)).first;
    }
    return it->second.get();
  }

  // Commits what `a` admitted since the last flush (less what was freed) and releases the
  // rest of its reservation; with no reservation, uncharges what was freed.
  Status settle_locked(Allowance& a) {
    Ledger& l = projects.ledger();
    if (!a.reservation.empty()) {
      SLUICE_RETURN_IF_ERROR(l.commit(a.reservation, a.target, a.admitted - a.freed, 0));
      a.reservation.clear();
      a.left = a.admitted = a.freed = 0;
    } else if (a.freed != 0) {
      SLUICE_RETURN_IF_ERROR(l.charge(a.target, -a.freed, 0));
      a.freed = 0;
    }
    return {};
  }

  bool admit(std::string_view key, int64_t bytes) {
    auto found = allowance_of(key);
    if (!found) {
      refuse(bytes);
      std::lock_guard lock(unowned_mu);
      log(unowned_logged,
          "cache: not keeping a chunk of '" + std::string(key) +
              "' on NVMe: the ledger cannot say whose it is: " + found.error().message());
      return false;
    }
    if (!*found) {
      uncharged_chunks.fetch_add(1, std::memory_order_relaxed);
      return true;
    }
    Allowance& a = **found;
    std::lock_guard lock(a.mu);
    const auto now = Clock::now();
    if (now < a.refused_until) {
      refuse(bytes, &a);
      return false;
    }
    if (a.reservation.empty() || a.left < bytes) {
      if (Status s = settle_locked(a); !s) {
        a.refused_until = now + o.refusal_memory;  // a ledger down is not asked per chunk
        refuse(bytes, &a);
        log(a, "cache: not keeping chunks of project '" + a.target.project +
                   "' on NVMe: " + s.error().message());
        return false;
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
        return false;
      }
      a.reservation = std::move(*r);
      a.left = size;
    }
    a.left -= bytes;
    a.admitted += bytes;
    if (a.charged) a.charged->add(static_cast<uint64_t>(bytes));
    admitted_chunks.fetch_add(1, std::memory_order_relaxed);
    admitted_bytes.fetch_add(static_cast<uint64_t>(bytes), std::memory_order_relaxed);
    return true;
  }

  void refuse(int64_t bytes, Allowance* a = nullptr) {
    if (a && a->refused) a->refused->add();
    refused_chunks.fetch_add(1, std::memory_order_relaxed);
    refused_bytes.fetch_add(static_cast<uint64_t>(bytes), std::memory_order_relaxed);
  }

  Status flush() {
    std::vector<Allowance*> all;
    {
      std::lock_guard lock(map_mu);
      for (auto& [id, a] : allowances) all.push_back(a.get());
    }
    Status first;
    for (Allowance* a : all) {
      std::lock_guard lock(a->mu);
      Status s = settle_locked(*a);
      if (!s) {
        flush_errors.fetch_add(1, std::memory_order_relaxed);
        log(*a, "cache: charging project '" + a->target.project +
                    "' failed (kept, tried again): " + s.error().message());
        if (first) first = s;
      }
    }
    flushes.fetch_add(1, std::memory_order_relaxed);
    return first;
  }

  void run_flusher() {
    std::unique_lock lock(stop_mu);
    while (!stopping) {
      if (stop_cv.wait_for(lock, o.flush_interval, [&] { return stopping; })) break;
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
  if (options.flush_interval.count() <= 0)
    return fail(Code::kInvalidArgument, "cache charger: flush_interval must be positive");
  auto impl = std::make_unique<Impl>(std::move(ledger), std::move(location_of), std::move(options));
  SLUICE_RETURN_IF_ERROR(impl->projects.load());
  Impl* p = impl.get();
  impl->flusher = std::thread([p] { p->run_flusher(); });
  return std::unique_ptr<CacheCharger>(new CacheCharger(std::move(impl)));
}

CacheCharger::CacheCharger(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

CacheCharger::~CacheCharger() {
  {
    std::lock_guard lock(impl_->stop_mu);
    impl_->stopping = true;
  }
  impl_->stop_cv.notify_all();
  impl_->flusher.join();
  (void)impl_->flush();
}

bool CacheCharger::admit(std::string_view key, uint64_t bytes) {
  return impl_->admit(key, static_cast<int64_t>(bytes));
}

void CacheCharger::freed(std::string_view key, uint64_t bytes) {
  auto found = impl_->allowance_of(key);
  if (!found || !*found) return;  // a ledger error: that usage stays high (reconcile)
  Impl::Allowance& a = **found;
  std::lock_guard lock(a.mu);
  a.freed += static_cast<int64_t>(bytes);
  impl_->freed_bytes.fetch_add(bytes, std::memory_order_relaxed);
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
                           .uncharged_chunks = get(i.uncharged_chunks),
                           .flushes = get(i.flushes),
                           .flush_errors = get(i.flush_errors)};
}

}  // namespace sluice::ledger
