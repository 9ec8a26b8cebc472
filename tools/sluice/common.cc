#include "common.h"

#include <cstdio>
#include <cstdlib>

namespace sluice::cli {

std::string sluice_home() {
  if (const char* h = std::getenv("SLUICE_HOME"); h && *h) return h;
  if (const char* home = std::getenv("HOME"); home && *home) return std::string(home) + "/.sluice";
  return ".sluice";
}

int report_error(const Error& e) {
  std::fprintf(stderr, "sluice: error: %s\n", e.to_string().c_str());
  return e.code() == Code::kInvalidArgument ? 2 : 1;
}

}  // namespace sluice::cli
