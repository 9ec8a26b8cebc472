// `sluice cp`: copies between local paths and s3:// URIs.
#pragma once

#include <string>

#include "sluice/s3/store.h"
#include "sluice/core/status.h"

namespace sluice::cli {

struct CpOptions {
  std::string src, dst;
  bool recursive = false;
  unsigned jobs = 32;     // objects copied at once (with --recursive); HTTP requests are
                          // still bounded by S3Options::max_in_flight
  bool progress = false;  // a progress bar on stderr
  bool fsync = false;     // make each downloaded file durable before it is renamed into place
  s3::S3Options s3;
};

struct CpSummary {
  uint64_t objects = 0, bytes = 0, failed = 0, retries = 0;
  double seconds = 0;
  std::string first_error;  // when failed > 0

  std::string text() const;
  std::string json() const;
};

// Copies; a failed object leaves nothing at its destination. Returns the summary even
// when some objects failed (failed > 0); an error only when nothing could start.
Result<CpSummary> run_cp(const CpOptions& options);

}  // namespace sluice::cli
