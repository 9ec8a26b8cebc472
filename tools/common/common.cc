#include "common.h"

#include <cerrno>
#include <cstdio>

#include <unistd.h>

#include "sluice/core/sizes.h"

namespace sluice::cli {

int report_error(const Error& e) {
  // The program's own name: sluiced's errors say "sluiced: error".
  std::fprintf(stderr, "%s: error: %s\n", program_invocation_short_name, e.to_string().c_str());
  return e.code() == Code::kInvalidArgument ? 2 : 1;
}

Result<uint64_t> size_flag(const std::string& flag, const std::string& text) {
  auto v = parse_size(text);
  if (!v) return fail(Code::kInvalidArgument, flag + " '" + text + "': " + v.error().message());
  return *v;
}

Result<std::chrono::seconds> duration_flag(const std::string& flag, const std::string& text) {
  const bool bare =
      !text.empty() && text != "0" && text.find_first_not_of("0123456789") == std::string::npos;
  if (bare)
    return fail(Code::kInvalidArgument, flag + " '" + text + "': give the unit (" + text + "s, " +
                                            text + "m, " + text + "h or " + text + "d)");
  return parse_duration(flag, text);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

StatusLine::StatusLine(bool wanted) : on_(wanted && ::isatty(STDERR_FILENO)) {}

void StatusLine::show(const std::string& text) {
  if (!on_) return;
  const auto now = std::chrono::steady_clock::now();
  if (drawn_ && now - last_ < std::chrono::milliseconds(200)) return;
  last_ = now;
  drawn_ = true;
  std::fprintf(stderr, "\r\033[K%s", printable(text).c_str());
  std::fflush(stderr);
}

void StatusLine::clear() {
  if (!drawn_) return;
  std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
  drawn_ = false;
}

void LayOutProgress::operator()(uint64_t done, uint64_t total) {
  const int pct = total == 0 ? 100 : static_cast<int>(done * 100 / total);
  if (pct / 10 != last_pct_ / 10) {
    std::fprintf(stderr, "\rlaying out %s: %d%% of %s", path_.c_str(), pct,
                 format_size(static_cast<double>(total)).c_str());
    last_pct_ = pct;
    open_ = true;
  }
  if (done >= total) end();
}

void LayOutProgress::end() {
  if (open_) std::fprintf(stderr, "\n");
  open_ = false;
}

}  // namespace sluice::cli
