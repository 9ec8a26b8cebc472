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
