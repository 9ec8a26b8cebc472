// sluice/telemetry/textfile.h: a registry exported as a Prometheus text file.
//
// For processes that serve no /metrics of their own (a training job's loader, a one-off
// CLI command): the registry is written to `path` in the text exposition format, now, every
// `interval`, and when the exporter stops, each time whole (a temporary file beside it,
// renamed over it), so node_exporter's textfile collector, or anything else, never reads
// half a file.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "sluice/core/status.h"
#include "sluice/core/thread_annotations.h"

namespace sluice::telemetry {

class Registry;

class TextfileExporter {
 public:
  // Writes once before returning, so a path that cannot be written is an error here.
  // `registry` must outlive the exporter. A process killed with -9 may leave PATH.tmp-PID.
  static Result<std::unique_ptr<TextfileExporter>> start(const Registry& registry, std::string path,
                                                         std::chrono::milliseconds interval);
  // Stops the periodic writes and writes a last time (its error is lost: call stop() to
  // see it).
  ~TextfileExporter();
  TextfileExporter(const TextfileExporter&) = delete;
  TextfileExporter& operator=(const TextfileExporter&) = delete;

  // Stops the periodic writes and writes the final figures.
  Status stop();

 private:
  TextfileExporter(const Registry& registry, std::string path, std::chrono::milliseconds interval);
  Status write_now();

  const Registry& registry_;
  const std::string path_;
  const std::chrono::milliseconds interval_;
  Mutex mu_;
  CondVar cv_;
  bool stopping_ SLUICE_GUARDED_BY(mu_) = false;
  bool stopped_ = false;  // stop() ran
  std::thread thread_;
};

}  // namespace sluice::telemetry
