// Markers of saves under way (see live.h).
#include "sluice/ckpt/live.h"

#include <unistd.h>

#include <charconv>
#include <cstdio>
#include <fstream>
#include <optional>
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

// The first line of a small /proc file, or "-" (a marker field is never empty).
std::string first_line(const char* path) {
  std::ifstream f(path);
  std::string line;
  if (!std::getline(f, line) || line.empty() || line.find(' ') != std::string::npos) return "-";
  return line;
}

// This boot ("-": unknown) and this process's PID namespace ("pid:[4026531836]"; "-").
const std::string& boot_id() {
  static const std::string id = first_line("/proc/sys/kernel/random/boot_id");
  return id;
}
std::string pid_namespace() {
  char buf[64] = {};
  ssize_t n = ::readlink("/proc/self/ns/pid", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "-";
}

// A marker's text, parsed; nullopt where it does not parse.
struct MarkerText {
  int version = 0;
  std::string host, boot = "-", pidns = "-";
  long pid = 0;
  uint64_t ticks = 0;
};
std::optional<MarkerText> parse_marker(std::string_view text) {
  std::istringstream in{std::string(text.substr(0, 512))};
  std::string magic;
  MarkerText m;
  if (!(in >> magic >> m.version >> m.host >> m.pid >> m.ticks) || magic != "sluice-live" ||
      (m.version != 1 && m.version != 2) || m.pid <= 0)
    return std::nullopt;
  if (m.version == 2 && !(in >> m.boot >> m.pidns)) return std::nullopt;
  return m;
}

// Whether the marker's owner ran on this machine. A host name alone does not say so:
// containers on several machines (or a cloned image) share one. The boot id does: the
// kernel draws it at random at each boot, and containers of one machine read the same. So
// a machine is its host name and boot id, and a version 1 marker (host name only) is
// never this machine's.
bool same_machine(const MarkerText& m) {
  return m.version >= 2 && m.host == host_name() && m.boot != "-" && m.boot == boot_id();
}

// Whether the marker's pid names a process this one can look at: this machine and this PID
// namespace (containers of one machine number their processes apart).
bool same_process_space(const MarkerText& m) {
  return same_machine(m) && m.pidns != "-" && m.pidns == pid_namespace();
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
  return "sluice-live 2 " + host_name() + " " + std::to_string(pid) + " " +
         std::to_string(start_ticks(pid)) + " " + boot_id() + " " + pid_namespace() + "\n";
}

bool live_marker_holds(std::string_view text, int64_t mtime_ns, int64_t now_ns) {
  const int64_t lease = std::chrono::nanoseconds(kLiveLease).count();
  if (now_ns - mtime_ns > lease) return false;
  auto m = parse_marker(text);
  if (!m) return true;
  // Another machine, PID namespace, or a marker that cannot say: only the lease can tell.
  if (!same_process_space(*m)) return true;
  return m->ticks != 0 && start_ticks(m->pid) == m->ticks;
}

bool live_owner_gone(std::string_view text) {
  auto m = parse_marker(text);
  if (!m || !same_process_space(*m) || m->ticks == 0) return false;
  return start_ticks(m->pid) != m->ticks;
}

LiveMarker judge_live_marker(store::Store& tier, const store::ObjectInfo& marker, int64_t now_ns) {
  auto text = marker.size <= 512 ? tier.get(marker.key) : Result<std::vector<std::byte>>{};
  std::string_view view;
  if (text) view = {reinterpret_cast<const char*>(text->data()), text->size()};
  return {.holds = live_marker_holds(view, marker.mtime_ns, now_ns),
          .owner_gone = live_owner_gone(view)};
}

std::string_view save_stem(std::string_view key) {
  return key.substr(0, key.rfind('.'));
}

}  // namespace sluice::ckpt
