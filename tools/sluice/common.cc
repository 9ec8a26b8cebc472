#include "common.h"

#include <cerrno>
#include <cstdio>

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

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
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
