// `sluice cp`: its flags, the summary and the progress bar (the copy is client::copy).
#include "cp.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cache_flags.h"
#include "command.h"
#include "common.h"
#include "size_flag.h"
#include "sluice/client/environment.h"
#include "sluice/core/sizes.h"
#include "sluice/s3/store.h"

namespace sluice::cli {

std::string copy_text(const client::CopySummary& s) {
  const double mib_s = s.seconds > 0 ? static_cast<double>(s.bytes) / s.seconds / (1 << 20) : 0;
  char buf[512];
  std::snprintf(
      buf, sizeof buf, "copied %lu object%s, %s in %.2f s (%.1f MiB/s), %lu retr%s%s%s",
      static_cast<unsigned long>(s.objects), s.objects == 1 ? "" : "s",
      format_size(static_cast<double>(s.bytes)).c_str(), s.seconds, mib_s,
      static_cast<unsigned long>(s.retries), s.retries == 1 ? "y" : "ies",
      s.failures.empty() ? "" : (", " + std::to_string(s.failures.size()) + " FAILED").c_str(),
      s.cancelled ? ", INTERRUPTED (nothing partial was left behind)" : "");
  std::string out = buf;
  if (s.via_daemon) {
    out += "\ncache: through sluiced, " + format_size(static_cast<double>(s.handoff_bytes)) +
           " read from its NVMe directly, " + format_size(static_cast<double>(s.inline_bytes)) +
           " sent by it";
  } else if (s.cached) {
    out += "\ncache: " + format_size(static_cast<double>(s.cache_hit_bytes)) + " from the cache, " +
           format_size(static_cast<double>(s.cache_miss_bytes)) + " from the source";
    if (s.cache_not_kept > 0)
      out += "; " + count_of(s.cache_not_kept, "chunk") +
             " could not be kept on NVMe (past its size limit, its disk full or failing, or its "
             "write queue full)";
  }
  return out;
}

std::string copy_json(const client::CopySummary& s) {
  nlohmann::json j = {{"objects", s.objects},
                      {"bytes", s.bytes},
                      {"seconds", s.seconds},
                      {"throughput_mib_s",
                       s.seconds > 0 ? static_cast<double>(s.bytes) / s.seconds / (1 << 20) : 0},
                      {"retries", s.retries},
                      {"failed", s.failures.size()},
                      {"cancelled", s.cancelled}};
  if (!s.failures.empty()) j["error"] = s.failures.front().error.to_string();
  if (!s.skipped.empty()) {
    j["skipped"] = nlohmann::json::array();
    for (const store::SkippedKey& k : s.skipped)
      j["skipped"].push_back({{"key", k.key}, {"reason", k.reason}});
  }
  if (s.via_daemon) {
    j["cache"] = {
        {"daemon", true}, {"handoff_bytes", s.handoff_bytes}, {"inline_bytes", s.inline_bytes}};
  } else if (s.cached) {
    j["cache"] = {{"hit_bytes", s.cache_hit_bytes},
                  {"miss_bytes", s.cache_miss_bytes},
                  {"chunks_not_kept", s.cache_not_kept}};
  }
  return j.dump();
}

void draw_progress(const xfer::CopyProgress& p, double seconds, bool final) {
  double frac = p.bytes_total
                    ? static_cast<double>(p.bytes_done) / static_cast<double>(p.bytes_total)
                    : (final ? 1.0 : 0.0);
  frac = std::min(frac, 1.0);
  int width = 30, filled = static_cast<int>(frac * width);
  std::string bar(static_cast<size_t>(filled), '=');
  bar.resize(static_cast<size_t>(width), ' ');
  std::fprintf(stderr, "\r[%s] %3.0f%% %s / %s  %.1f MiB/s  %lu/%lu objects%s", bar.c_str(),
               frac * 100, format_size(static_cast<double>(p.bytes_done)).c_str(),
               format_size(static_cast<double>(p.bytes_total)).c_str(),
               seconds > 0 ? static_cast<double>(p.bytes_done) / seconds / (1 << 20) : 0.0,
               static_cast<unsigned long>(p.objects_done),
               static_cast<unsigned long>(p.objects_total), final ? "\n" : "");
}

namespace {

struct CpArgs {
  client::CopyRequest cp;
  CacheFlags cache;
  client::AwsSettings aws;
  std::string ledger;  // --ledger
  std::string part_size = "auto";
  unsigned max_in_flight = 16;
  unsigned stall_timeout_s = 30;
  bool json = false;
  bool no_progress = false;
};

// `cp`'s flags to a request and a session; copies, prints the summary, gives the exit code.
int run_cp_command(CpArgs& a, const CancelHook& cancel) {
  auto options = command_session_options(a.aws, a.ledger, a.cache);  // bad flags refused up front
  if (!options) return report_error(options.error());
  if (a.part_size != "auto") {
    auto size = parse_size(a.part_size);
    if (!size || *size == 0 || *size > s3::kMaxPartSize) {
      return report_error(Error(Code::kInvalidArgument,
                                "--part-size '" + a.part_size + "': " +
                                    (size ? "must be 1 byte to 5G" : size.error().message())));
    }
    a.cp.part_size = *size;
    options->s3.part_size = *size;
  }
  options->s3.max_in_flight = a.max_in_flight;
  options->s3.stall_timeout_s = a.stall_timeout_s;
  auto t0 = std::chrono::steady_clock::now();
  const bool progress = !a.no_progress && !a.json && ::isatty(STDERR_FILENO);
  if (progress)
    a.cp.on_progress = [t0](const xfer::CopyProgress& p) {
      draw_progress(p, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                    false);
    };
  a.cp.cancel = cancel.flag;
  if (cancel.install) cancel.install();
  auto sum = client::copy(client::Session(std::move(*options)), a.cp);
  if (progress) std::fputc('\n', stderr);
  if (!sum) {
    // The library says what to do ("copy it recursively"); the command names its flag.
    const Error& e = sum.error();
    if (!a.cp.recursive && e.message().ends_with("copy it recursively"))
      return report_error(Error(e.code(), e.message() + " (--recursive)"));
    return report_error(e);
  }
  for (const client::CopyFailure& f : sum->failures)
    std::fprintf(stderr, "sluice: cp %s: %s\n", printable(f.source).c_str(),
                 f.error.to_string().c_str());
  for (const store::SkippedKey& s : sum->skipped)
    std::fprintf(stderr, "sluice: cp: skipped %s\n", printable(s.reason).c_str());
  std::printf("%s\n", a.json ? copy_json(*sum).c_str() : copy_text(*sum).c_str());
  return sum->cancelled ? cancel.exit_code() : !sum->failures.empty() ? 1 : 0;
}

}  // namespace

void add_cp_command(CLI::App& app, const CommandContext& ctx) {
  static CpArgs a;  // CLI11 binds to it; one command runs per process
  auto* cmd = app.add_subcommand(
      "cp",
      "Copy between local paths, s3:// and mem:// (one object, or a prefix with --recursive). "
      "Nothing partial is ever left at the destination; Ctrl-C stops and cleans up. Writes "
      "under a project are charged to its team and refused past its quota ($SLUICE_LEDGER, "
      "else $SLUICE_HOME/ledger.db; docs/ledger.md).");
  cmd->add_option("SRC", a.cp.src, "Source: a local path, s3://bucket/key or mem://name/key")
      ->required();
  cmd->add_option("DST", a.cp.dst, "Destination: a local path, s3://bucket/key or mem://name/key")
      ->required();
  cmd->add_flag("-r,--recursive", a.cp.recursive,
                "Copy every object under a prefix / file under a directory");
  cmd->add_option("-j,--jobs", a.cp.jobs, "Objects copied at once with --recursive")
      ->default_val(16)
      ->check(CLI::Range(1u, 1024u));
  cmd->add_option("--endpoint-url", a.aws.endpoint_url,
                  "S3 endpoint, e.g. http://127.0.0.1:4568 (else AWS_ENDPOINT_URL, ~/.aws/config)");
  cmd->add_option("--profile", a.aws.profile, "Profile in ~/.aws/credentials and ~/.aws/config");
  cmd->add_option("--region", a.aws.region, "Region (else AWS_REGION, the profile, us-east-1)");
  cmd->add_option("--part-size", a.part_size,
                  "Bytes per part read and multipart part (at most 5G); auto: one part per "
                  "stream, 8M to 32M, for reads, 8M for uploads")
      ->default_str("auto");
  cmd->add_option("--max-in-flight", a.max_in_flight,
                  "Part reads and HTTP requests in flight at most, across all objects")
      ->default_val(16)
      ->check(CLI::Range(1u, 1024u));
  cmd->add_option("--streams", a.cp.streams,
                  "Parts of one object in flight at once (within --max-in-flight)")
      ->default_val(4)
      ->check(CLI::Range(1u, 1024u));
  cmd->add_option("--stall-timeout", a.stall_timeout_s,
                  "How long a request to S3 may make no progress before it is abandoned (30s, 2m)")
      ->transform(seconds_validator(1, 86400))
      ->default_str("30s");
  cmd->add_flag("--json", a.json, "Print the summary as JSON");
  cmd->add_option("--ledger", a.ledger,
                  "The ledger to charge writes under a project to (default: $SLUICE_LEDGER, "
                  "else $SLUICE_HOME/ledger.db when it exists)");
  cmd->add_flag("--no-progress", a.no_progress, "No progress bar, even on a terminal");
  cmd->add_flag("--fsync", a.cp.durable,
                "Make each downloaded file durable (fsync) before renaming it into place");
  cmd->add_flag("--cache", a.cp.cache,
                "Read the source through the tiered cache (as a cache+ source URI does)");
  add_cache_flags(cmd, a.cache, client::Profile::kCommand);
  cmd->callback([cancel = ctx.cancel, rc = ctx.rc] { *rc = run_cp_command(a, cancel); });
}

}  // namespace sluice::cli
