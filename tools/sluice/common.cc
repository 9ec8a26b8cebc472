#include "common.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <span>

#include "sluice/core/fd.h"
#include "sluice/core/sizes.h"

namespace sluice::cli {

int report_error(const Error& e) {
  // The program's own name: sluiced's errors say "sluiced: error".
  std::fprintf(stderr, "%s: error: %s\n", program_invocation_short_name, e.to_string().c_str());
  return e.code() == Code::kInvalidArgument ? 2 : 1;
}

// The node secret: the file's first line, at least 16 bytes, in a file only its owner reads.
Result<std::string> read_secret(const std::string& path) {
  struct stat sb;
  if (::stat(path.c_str(), &sb) != 0) return fail_errno(errno, "node secret file " + path);
  if (sb.st_mode & 077)
    return fail(Code::kPermissionDenied,
                "node secret file " + path + " is readable by others: chmod 600 it");
  SLUICE_ASSIGN_OR_RETURN(std::string text, read_small_file(path, "node secret file"));
  std::string secret = text.substr(0, text.find('\n'));
  while (!secret.empty() && (secret.back() == '\r' || secret.back() == ' ')) secret.pop_back();
  if (secret.size() < 16)
    return fail(Code::kInvalidArgument, "node secret in " + path + " is under 16 bytes");
  return secret;
}

std::string short_host_name() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  std::string s = host;
  return s.substr(0, s.find('.'));
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
