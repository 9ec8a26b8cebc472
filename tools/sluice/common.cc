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

namespace sluice::cli {

int report_error(const Error& e) {
  // The program's own name: sluiced's errors say "sluiced: error".
  std::fprintf(stderr, "%s: error: %s\n", program_invocation_short_name, e.to_string().c_str());
  return e.code() == Code::kInvalidArgument ? 2 : 1;
}

// A settings file (config, peers, node secret): a regular file of at most 1 MiB. A FIFO or
// a device is refused before it is read (it would block start-up, or never end).
Result<std::string> read_small_file(const std::string& path, const char* what) {
  const std::string named = std::string(what) + " " + path;
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (!fd.valid()) return fail_errno(errno, "open " + named);
  struct stat sb;
  if (::fstat(fd.get(), &sb) != 0) return fail_errno(errno, "stat " + named);
  if (!S_ISREG(sb.st_mode)) return fail(Code::kInvalidArgument, named + " is not a regular file");
  if (sb.st_size > (1 << 20)) return fail(Code::kInvalidArgument, named + " is over 1 MiB");
  std::string text(static_cast<size_t>(sb.st_size), '\0');
  SLUICE_ASSIGN_OR_RETURN(size_t n,
                          pread_full(fd.get(), std::as_writable_bytes(std::span(text)), 0, named));
  text.resize(n);
  return text;
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

Result<std::vector<peer::Member>> load_members(const std::string& spec, uint16_t slurm_port) {
  if (spec != "slurm") {
    SLUICE_ASSIGN_OR_RETURN(std::string text, read_small_file(spec, "peers file"));
    return peer::parse_host_list(text, spec);
  }
  const char* list = std::getenv("SLURM_JOB_NODELIST");
  if (!list || !*list)
    return fail(Code::kInvalidArgument, "--peers slurm: SLURM_JOB_NODELIST is not set");
  if (slurm_port == 0)
    return fail(Code::kInvalidArgument, "--peers slurm: no port for the members (--peer-port)");
  SLUICE_ASSIGN_OR_RETURN(std::vector<std::string> names, peer::expand_hostlist(list));
  std::vector<peer::Member> members;
  for (std::string& n : names) members.push_back(peer::Member{n, n, slurm_port});
  return members;
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

}  // namespace sluice::cli
