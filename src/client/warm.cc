// Warming a cache with copy_all's jobs, progress and cancellation (sluice/client/warm.h).
#include "sluice/client/warm.h"

#include <algorithm>

#include "sluice/store/wrapper.h"

namespace sluice::client {

namespace {

// A cache as a copy source whose reads make their range resident and carry no byte back
// (Control::warm): copied into the discard store, it warms. What a read leaves in its buffer
// is not the object's bytes; nothing but the discard store may receive them. Counts what
// the warms fetched and what the cache could not keep.
class WarmingSource final : public store::StoreWrapper {
 public:
  WarmingSource(std::shared_ptr<store::Store> lister, cache::Control& cache, std::string store_uri)
      : StoreWrapper(std::move(lister)), cache_(cache), store_uri_(std::move(store_uri)) {}

  Result<size_t> read(std::string_view key, uint64_t offset, std::span<std::byte> dst,
                      const store::ReadOptions& options) override {
    SLUICE_ASSIGN_OR_RETURN(cache::Warmed w, cache_.warm(store_uri_, key, offset, dst.size()));
    fetched.fetch_add(w.fetched, std::memory_order_relaxed);
    not_kept.fetch_add(w.not_kept, std::memory_order_relaxed);
    if (!options.if_match.empty() && w.etag != options.if_match)
      return fail(Code::kConflict, "'" + std::string(key) + "' changed during the warm");
    return offset >= w.size ? size_t{0}
                            : static_cast<size_t>(std::min<uint64_t>(dst.size(), w.size - offset));
  }

  std::atomic<uint64_t> fetched{0}, not_kept{0};  // relaxed: read once the copy is over

 private:
  cache::Control& cache_;
  std::string store_uri_;
};

}  // namespace

Result<WarmReport> warm(cache::Control& cache, const WarmRequest& what, const WarmOptions& how) {
  SLUICE_ASSIGN_OR_RETURN(std::shared_ptr<store::Store> lister, cache.store(what.store_uri));
  WarmingSource src(std::move(lister), cache, what.store_uri);
  WarmReport report;
  std::vector<xfer::CopyItem> items;
  if (what.keys) {
    for (const std::string& k : *what.keys) items.push_back(xfer::CopyItem{k, k, std::nullopt});
  } else {
    SLUICE_ASSIGN_OR_RETURN(xfer::CopyPlan plan, xfer::plan_prefix(src, what.prefix, what.prefix));
    if (plan.items.empty() && plan.rejected.empty())
      return fail(Code::kNotFound,
                  "cache warm: nothing under '" + what.prefix + "' in " + what.store_uri);
    items = std::move(plan.items);
    report.skipped = std::move(plan.rejected);
  }
  auto discard = store::make_discard_store();
  xfer::CopyOptions co;
  co.jobs = how.jobs;
  co.cancel = how.cancel;
  co.on_progress = how.on_progress;
  report.copy = xfer::copy_all(src, *discard, items, co);
  report.fetched = src.fetched.load(std::memory_order_relaxed);
  report.not_kept = src.not_kept.load(std::memory_order_relaxed);
  return report;
}

}  // namespace sluice::client
