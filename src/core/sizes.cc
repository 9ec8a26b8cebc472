#include "sluice/core/sizes.h"

#include <cctype>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <utility>

namespace sluice {

Result<uint64_t> parse_size(std::string_view text) {
  auto bad = [&](std::string_view why) {
    return fail(Code::kInvalidArgument,
                "invalid size '" + std::string(text) + "': " + std::string(why) +
                    " (use a number with an optional K, M, G or T suffix, like 4K or 1G)");
  };
  std::string_view t = text;
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back()))) t.remove_suffix(1);
  if (t.empty()) return bad("empty");
  double value = 0;
  auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), value);
  if (ec != std::errc() || value < 0 || !std::isfinite(value)) return bad("not a number");
  std::string unit(end, t.data() + t.size());
  for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (unit.ends_with("IB"))
    unit.resize(unit.size() - 2);
  else if (unit.size() > 1 && unit.ends_with("B"))
    unit.resize(unit.size() - 1);
  double mult;
  if (unit.empty() || unit == "B")
    mult = 1;
  else if (unit == "K")
    mult = 1024.0;
  else if (unit == "M")
    mult = 1024.0 * 1024;
  else if (unit == "G")
    mult = 1024.0 * 1024 * 1024;
  else if (unit == "T")
    mult = 1024.0 * 1024 * 1024 * 1024;
  else
    return bad("unknown unit");
  double bytes = value * mult;
  if (bytes > 9.0e18) return bad("too large");
  if (bytes != std::floor(bytes)) return bad("not a whole number of bytes");
  return static_cast<uint64_t>(bytes);
}

std::string format_size(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  char buf[32];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%.0f B", bytes);
  else
    std::snprintf(buf, sizeof buf, "%.2f %s", bytes, units[u]);
  return buf;
}

// "7d", "12h", "30m", "90s" or plain seconds.
Result<std::chrono::seconds> parse_duration(std::string_view what, std::string_view text) {
  int64_t n = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  std::string_view unit(p, text.data() + text.size() - p);
  int64_t mult = unit.empty() || unit == "s" ? 1
                 : unit == "m"               ? 60
                 : unit == "h"               ? 3600
                 : unit == "d"               ? 86400
                 : unit == "w"               ? 604800
                                             : 0;
  if (ec != std::errc() || n < 0 || mult == 0 || n > INT64_MAX / 1'000'000'000 / mult)
    return fail(Code::kInvalidArgument,
                std::string(what) + " '" + std::string(text) +
                    "': expected a duration such as 90s, 30m, 12h, 7d or 2w");
  return std::chrono::seconds(n * mult);
}

std::string format_duration(std::chrono::seconds d) {
  const int64_t s = d.count();
  for (auto [unit, secs] :
       {std::pair{'d', int64_t{86400}}, std::pair{'h', int64_t{3600}}, std::pair{'m', int64_t{60}}})
    if (s != 0 && s % secs == 0) return std::to_string(s / secs) + unit;
  return std::to_string(s) + "s";
}

std::string format_utc(int64_t ns) {
  if (ns <= 0) return "-";
  time_t t = static_cast<time_t>(ns / 1'000'000'000);
  struct tm tm;
  gmtime_r(&t, &tm);
  char buf[64];
  if (std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%SZ", &tm) == 0) return "-";
  return buf;
}

}  // namespace sluice
