// `sluice cp`'s output: the summary and the progress bar (the copy is client::copy).
#include "cp.h"

#include "common.h"

#include <algorithm>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "sluice/core/sizes.h"

namespace sluice::cli {

std::string copy_text(const client::CopySummary& s) {
  const double mib_s = s.seconds > 0 ? static_cast<double>(s.bytes) / s.seconds / (1 << 20) : 0;
  char buf[512];
  std::snprintf(
      buf, sizeof buf, "copied %lu object%s, %s in %.2f s (%.1f MiB/s), %lu retr%s%s%s",
      static_cast<unsigned long>(s.objects), s.objects == 1 ? "" : "s",
      format_size(static_cast<double>(s.bytes)).c_str(), s.seconds, mib_s,
      static_cast<unsigned long>(s.retries), s.retries == 1 ? "y" : "ies",
      s.failures.empty() ? "" : (", " + std::to_string(s.failures.size()) + " FAILED").c_str(),
      s.cancelled ? ", INTERRUPTED (nothing partial was left behind)" : "");
  std::string out = buf;
  if (s.via_daemon) {
    out += "\ncache: through sluiced, " + format_size(static_cast<double>(s.handoff_bytes)) +
           " read from its NVMe directly, " + format_size(static_cast<double>(s.inline_bytes)) +
           " sent by it";
  } else if (s.cached) {
    out += "\ncache: " + format_size(static_cast<double>(s.cache_hit_bytes)) + " from the cache, " +
           format_size(static_cast<double>(s.cache_miss_bytes)) + " from the source";
    if (s.cache_not_kept > 0)
      out += "; " + count_of(s.cache_not_kept, "chunk") +
             " could not be kept on NVMe (past its size limit, its disk full or failing, or its "
             "write queue full)";
  }
  return out;
}

std::string copy_json(const client::CopySummary& s) {
  nlohmann::json j = {{"objects", s.objects},
                      {"bytes", s.bytes},
                      {"seconds", s.seconds},
                      {"throughput_mib_s",
                       s.seconds > 0 ? static_cast<double>(s.bytes) / s.seconds / (1 << 20) : 0},
                      {"retries", s.retries},
                      {"failed", s.failures.size()},
                      {"cancelled", s.cancelled}};
  if (!s.failures.empty()) j["error"] = s.failures.front().error.to_string();
  if (!s.skipped.empty()) {
    j["skipped"] = nlohmann::json::array();
    for (const store::SkippedKey& k : s.skipped)
      j["skipped"].push_back({{"key", k.key}, {"reason", k.reason}});
  }
  if (s.via_daemon) {
    j["cache"] = {
        {"daemon", true}, {"handoff_bytes", s.handoff_bytes}, {"inline_bytes", s.inline_bytes}};
  } else if (s.cached) {
    j["cache"] = {{"hit_bytes", s.cache_hit_bytes},
                  {"miss_bytes", s.cache_miss_bytes},
                  {"chunks_not_kept", s.cache_not_kept}};
  }
  return j.dump();
}

void draw_progress(const xfer::CopyProgress& p, double seconds, bool final) {
  double frac = p.bytes_total
                    ? static_cast<double>(p.bytes_done) / static_cast<double>(p.bytes_total)
                    : (final ? 1.0 : 0.0);
  frac = std::min(frac, 1.0);
  int width = 30, filled = static_cast<int>(frac * width);
  std::string bar(static_cast<size_t>(filled), '=');
  bar.resize(static_cast<size_t>(width), ' ');
  std::fprintf(stderr, "\r[%s] %3.0f%% %s / %s  %.1f MiB/s  %lu/%lu objects%s", bar.c_str(),
               frac * 100, format_size(static_cast<double>(p.bytes_done)).c_str(),
               format_size(static_cast<double>(p.bytes_total)).c_str(),
               seconds > 0 ? static_cast<double>(p.bytes_done) / seconds / (1 << 20) : 0.0,
               static_cast<unsigned long>(p.objects_done),
               static_cast<unsigned long>(p.objects_total), final ? "\n" : "");
}

}  // namespace sluice::cli
