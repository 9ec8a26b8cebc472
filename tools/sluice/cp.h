// `sluice cp`: copies between any two stores (local paths, s3://, mem://) with
// xfer::copy; this file only turns the command line's two locations into stores and keys.
#pragma once

#include <atomic>
#include <string>

#include "sluice/client/session.h"
#include "sluice/core/status.h"
#include "sluice/s3/store.h"
#include "sluice/xfer/copy.h"

namespace sluice::cli {

struct CpOptions {
  std::string src, dst;
  bool recursive = false;
  unsigned jobs = 16;      // objects copied at once (with --recursive)
  uint64_t part_size = 0;  // bytes per part; 0 chooses from each object's size
  bool progress = false;   // a progress bar on stderr
  bool fsync = false;      // make each local file durable before it is renamed into place
  const std::atomic<bool>* cancel = nullptr;  // set from a signal handler: stop and clean up
  bool cache = false;                         // read the source through the tiered cache
  // Stores, the cache (--cache and cache+ sources) and the ledger writes are charged to;
  // s3.max_in_flight is the copy's budget.
  client::SessionOptions session;
};

struct CpSummary {
  uint64_t objects = 0, bytes = 0, failed = 0, retries = 0;
  double seconds = 0;
  bool cancelled = false;
  std::string first_error;  // when failed > 0
  bool cached = false;      // read through the cache: where the bytes came from
  uint64_t cache_hit_bytes = 0, cache_miss_bytes = 0;
  uint64_t cache_not_kept = 0;  // chunks the NVMe tier could not take (full, failing)
  bool via_daemon = false;      // through sluiced: what came as descriptors, what inline
  uint64_t handoff_bytes = 0, inline_bytes = 0;

  std::string text() const;
  std::string json() const;
};

// Copies; a failed object leaves nothing at its destination. Returns the summary even
// when some objects failed (failed > 0) or the copy was cancelled; an error only when
// nothing could start (a bad location, a failed listing, a source that is a FIFO).
Result<CpSummary> run_cp(const CpOptions& options);

// A one-line progress bar on stderr (ends the line when `final`).
void draw_progress(const xfer::CopyProgress& p, double seconds, bool final);

}  // namespace sluice::cli
