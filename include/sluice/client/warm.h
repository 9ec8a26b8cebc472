// sluice/client/warm.h: reading objects into a node's cache ahead of use (`sluice cache
// warm`), through any cache::Control: the daemon's cache fills without a byte crossing to
// this process, or the embedded cache does.
//
//   auto cache = session.cache_control().value();
//   auto r = client::warm(*cache, {.store_uri = "s3://datasets", .prefix = "vision/"}, {});
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "sluice/cache/control.h"
#include "sluice/core/status.h"
#include "sluice/xfer/copy.h"

namespace sluice::client {

struct WarmRequest {
  std::string store_uri;                         // the source store ("s3://bucket", "file:///")
  std::string prefix;                            // every object under it, unless `keys` is set
  std::optional<std::vector<std::string>> keys;  // exactly these (none: nothing to do)
};

struct WarmOptions {
  unsigned jobs = 16;                         // objects warmed at once
  const std::atomic<bool>* cancel = nullptr;  // set: objects not started are left
  std::function<void(const xfer::CopyProgress&)> on_progress;
};

struct WarmReport {
  xfer::CopyReport copy;                   // objects and bytes warmed, failures, cancelled
  std::vector<xfer::CopyFailure> skipped;  // listed under the prefix but not warmable
  uint64_t fetched = 0;                    // bytes read from the source for it
  uint64_t not_kept = 0;                   // bytes the cache could not keep (a warm undone)
  uint64_t already_cached() const { return copy.bytes > fetched ? copy.bytes - fetched : 0; }
};

// NotFound when a prefix holds nothing at all (a typo must not look like a warm cache).
Result<WarmReport> warm(cache::Control& cache, const WarmRequest& what, const WarmOptions& how);

}  // namespace sluice::client
