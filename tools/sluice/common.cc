#include "common.h"

#include <cerrno>
#include <cstdio>
#include <ctime>

#include "sluice/core/sizes.h"

namespace sluice::cli {

int report_error(const Error& e) {
  // The program's own name: sluiced's errors say "sluiced: error".
  std::fprintf(stderr, "%s: error: %s\n", program_invocation_short_name, e.to_string().c_str());
  return e.code() == Code::kInvalidArgument ? 2 : 1;
}

std::string format_utc(int64_t ns, const char* format) {
  time_t t = static_cast<time_t>(ns / 1'000'000'000);
  struct tm tm;
  gmtime_r(&t, &tm);
  char buf[64];
  if (std::strftime(buf, sizeof buf, format, &tm) == 0) return {};
  return buf;
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
