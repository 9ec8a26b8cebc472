// Reconciliation: list every project's location and set its usage to what is there.
#include "sluice/ledger/reconcile.h"

#include <map>

namespace sluice::ledger {

namespace {

// Lists a project's location, page by page, telling `on_page` the running totals.
Result<std::pair<int64_t, int64_t>> count(const Project& p, const store::StoreOptions& options,
                                          const std::function<void(int64_t, int64_t)>& on_page) {
  SLUICE_ASSIGN_OR_RETURN(auto st, open_location(p, options));
  int64_t bytes = 0, objects = 0;
  store::ListOptions lo;
  lo.max_keys = 1000;
  for (;;) {
    SLUICE_ASSIGN_OR_RETURN(auto page, st->list(lo));
    for (const auto& obj : page.objects) {
      bytes += static_cast<int64_t>(obj.size);
      ++objects;
    }
    on_page(objects, bytes);
    if (page.next_token.empty()) break;
    lo.continuation = page.next_token;
  }
  return std::pair{bytes, objects};
}

}  // namespace

Result<std::unique_ptr<store::Store>> open_location(const Project& p,
                                                    const store::StoreOptions& options) {
  store::StoreOptions o;
  o.registry = options.registry;
  o.backend = options.backend;
  o.create = false;
  std::string uri = p.location;
  if (!uri.starts_with("file://") && !uri.ends_with("/")) {
    size_t sep = uri.find("://");
    if (sep != std::string::npos && uri.find('/', sep + 3) != std::string::npos) uri += '/';
  }
  auto st = store::open_store(uri, o);
  if (!st) return std::unexpected(st.error().with_context("project '" + p.id + "'"));
  return st;
}

Result<ReconcileReport> reconcile(Ledger& ledger, const store::StoreOptions& store_options,
                                  const ReconcileOptions& ro) {
  const bool dry_run = ro.dry_run;
  ReconcileReport report;
  SLUICE_ASSIGN_OR_RETURN(auto projects, ledger.projects());
  SLUICE_ASSIGN_OR_RETURN(auto usage, ledger.usage());
  for (const Project& p : projects) {
    ReconcileProgress at{
        .project = p.id, .index = report.projects.size() + 1, .projects = projects.size()};
    auto tell = [&](int64_t objects, int64_t bytes) {
      at.objects = objects;
      at.bytes = bytes;
      if (ro.on_progress) ro.on_progress(at);
    };
    tell(0, 0);
    ReconcileEntry e{.project = p.id, .team = p.team, .location = p.location, .tier = p.tier};
    std::map<Kind, std::pair<int64_t, int64_t>> by_kind;  // this project, its own tier
    for (const Usage& u : usage) {
      // Cache usage counts what node caches hold (their tallies), not what the location
      // holds: a recount of the location has nothing to say about it.
      if (u.project != p.id || u.tier != p.tier || u.kind == Kind::kCache) continue;
      by_kind[u.kind] = {u.bytes, u.objects};
      e.ledger_bytes += u.bytes;
      e.ledger_objects += u.objects;
    }
    auto found = count(p, store_options, tell);
    if (!found) {
      e.error = found.error();
      report.projects.push_back(std::move(e));
      continue;
    }
    e.found_bytes = found->first;
    e.found_objects = found->second;
    e.changed = e.found_bytes != e.ledger_bytes || e.found_objects != e.ledger_objects;
    // A project whose own kind is cache: its figures are the caches' (left as they are).
    if (e.changed && !dry_run && p.kind != Kind::kCache) {
      // Other kinds keep their figures while the listing covers them; the rest is the
      // default kind's. When it does not, they are cut down in turn.
      int64_t rest_b = e.found_bytes, rest_o = e.found_objects;
      for (auto& [kind, v] : by_kind) {
        if (kind == p.kind) continue;
        int64_t b = std::min(v.first, rest_b), o = std::min(v.second, rest_o);
        rest_b -= b;
        rest_o -= o;
        if (b != v.first || o != v.second)
          SLUICE_RETURN_IF_ERROR(ledger.set_usage({p.id, p.team, p.tier, kind}, b, o));
      }
      SLUICE_RETURN_IF_ERROR(ledger.set_usage({p.id, p.team, p.tier, p.kind}, rest_b, rest_o));
    }
    report.projects.push_back(std::move(e));
  }
  if (!dry_run) {
    SLUICE_ASSIGN_OR_RETURN(report.expired_reservations, ledger.expire_reservations());
    SLUICE_ASSIGN_OR_RETURN(report.accounts_recounted, ledger.recount_accounts());
  }
  return report;
}

}  // namespace sluice::ledger
