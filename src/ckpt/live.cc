// Markers of saves under way (see live.h).
#include "sluice/ckpt/live.h"

#include <unistd.h>

#include <charconv>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "sluice/ckpt/manifest.h"

namespace sluice::ckpt {

namespace {

std::string host_name() {
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  return name[0] ? name : "localhost";
}

// Field 22 of /proc/<pid>/stat: when the process started, in clock ticks since boot. With
// the pid it names one process, so a recycled pid is not taken for the saver. 0 if unknown.
uint64_t start_ticks(long pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(f, line)) return 0;
  // The command name (field 2) may hold spaces and parentheses: count from the last ')'.
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(line.substr(close + 1));
  std::string field;
  for (int i = 3; i <= 22 && (rest >> field); ++i)
    if (i == 22) {
      uint64_t v = 0;
      auto [p, ec] = std::from_chars(field.data(), field.data() + field.size(), v);
      return ec == std::errc() ? v : 0;
    }
  return 0;
}

}  // namespace

std::string live_key(std::string_view series, uint64_t step, unsigned rank,
                     std::string_view save_id) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "rank-%05u-", rank);
  return step_prefix(series, step) + buf + std::string(save_id) + ".live";
}

bool is_live_leaf(std::string_view leaf) {
  return leaf.starts_with("rank-") && leaf.ends_with(".live");
}

std::string live_text() {
  const long pid = ::getpid();
  return "sluice-live 1 " + host_name() + " " + std::to_string(pid) + " " +
         std::to_string(start_ticks(pid)) + "\n";
}

bool live_marker_holds(std::string_view text, int64_t mtime_ns, int64_t now_ns) {
  const int64_t lease = std::chrono::nanoseconds(kLiveLease).count();
  if (now_ns - mtime_ns > lease) return false;
  std::istringstream in{std::string(text.substr(0, 512))};
  std::string magic, host;
  int version = 0;
  long pid = 0;
  uint64_t ticks = 0;
  if (!(in >> magic >> version >> host >> pid >> ticks) || magic != "sluice-live" || version != 1 ||
      pid <= 0)
    return true;
  if (host != host_name()) return true;  // another node: only the lease can tell
  return ticks != 0 && start_ticks(pid) == ticks;
}

bool live_marker_holds(store::Store& tier, const store::ObjectInfo& marker, int64_t now_ns) {
  auto text = marker.size <= 512 ? tier.get(marker.key) : Result<std::vector<std::byte>>{};
  std::string_view view;
  if (text) view = {reinterpret_cast<const char*>(text->data()), text->size()};
  return live_marker_holds(view, marker.mtime_ns, now_ns);
}

}  // namespace sluice::ckpt
