// `sluice doctor --path` sweeps block size x queue depth x engine with the bench engine,
// reading only (a directory gets a scratch file of our own, removed afterwards); `--pid`
// watches a job through /proc and /sys and ranks the causes of its shortfall
// (sluice/doctor/diagnose.h).
#include "command.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common.h"
#include "size_flag.h"
#include "sluice/client/environment.h"
#include "sluice/core/fd.h"
#include "sluice/core/sizes.h"
#include "sluice/doctor/diagnose.h"
#include "sluice/doctor/object_store.h"
#include "sluice/doctor/observe.h"
#include "sluice/doctor/sweep.h"
#include "sluice/s3/store.h"
#include "sluice/telemetry/registry.h"

namespace sluice::cli {

namespace {

namespace fs = std::filesystem;

struct DoctorArgs {
  std::string path;
  std::string url;  // an object store prefix (s3://bucket/prefix, or any store URI)
  client::AwsSettings aws;
  uint64_t target_rate = 0;  // --url: bytes/s to size the concurrency for
  int pid = 0;
  double seconds = 0;  // --pid: the watch window; --path: the sweep budget
  double sweep_seconds = 10;
  std::string ceiling_file;
  bool no_sweep = false;
  bool json = false;
  uint64_t scratch_size = 0;  // 0: chosen from the free space
};

// The ceiling sweep, with a line on stderr naming each point while it runs.
Result<doctor::Ceiling> sweep(const std::string& file, double budget, bool with_buffered,
                              const CancelHook& cancel, bool progress) {
  doctor::SweepOptions o;
  o.budget = budget;
  o.with_buffered = with_buffered;
  o.cancel = cancel.flag;
  if (progress)
    o.on_point = [&file](size_t i, size_t n, std::string_view engine, uint64_t bs, unsigned qd) {
      std::fprintf(stderr, "\rsweeping %s: %zu/%zu (%s %s QD%u)   ", printable(file).c_str(), i, n,
                   std::string(engine).c_str(), format_size(static_cast<double>(bs)).c_str(), qd);
    };
  auto c = doctor::sweep(file, o);
  if (progress) std::fprintf(stderr, "\r%*s\r", 70, "");
  return c;
}

int run_path(const DoctorArgs& a, const CancelHook& cancel) {
  // Pseudo-files measure nothing, and some (kcore) are large: refused before any open.
  std::error_code ec;
  const std::string real = std::filesystem::weakly_canonical(a.path, ec).string();
  for (const char* pseudo : {"/proc", "/sys"})
    if (!ec && (real == pseudo || real.starts_with(std::string(pseudo) + "/")))
      return report_error(Error(Code::kInvalidArgument,
                                "--path " + a.path + " is under " + pseudo +
                                    ", a kernel interface, not storage: nothing to measure"));
  struct stat sb;
  if (::stat(a.path.c_str(), &sb) != 0)
    return report_error(Error(Code::kNotFound, "--path " + a.path + ": " + std::strerror(errno)));
  if (!S_ISDIR(sb.st_mode) && !S_ISREG(sb.st_mode) && !S_ISBLK(sb.st_mode))
    return report_error(
        Error(Code::kInvalidArgument,
              "--path " + a.path + " is not a directory, a regular file or a block device"));
  const bool progress = ::isatty(STDERR_FILENO);
  auto interrupted = [&cancel] {
    std::fprintf(stderr, "sluice doctor: interrupted; nothing was left behind\n");
    return cancel.exit_code();
  };
  if (cancel.install) cancel.install();
  // A directory is measured through a scratch file of our own, always removed.
  std::unique_ptr<doctor::ScratchFile> scratch;
  if (S_ISDIR(sb.st_mode)) {
    LayOutProgress shown("a scratch file in " + a.path);
    doctor::ScratchOptions so{.size = a.scratch_size, .cancel = cancel.flag};
    if (progress) so.on_lay_out = std::ref(shown);
    auto made = doctor::ScratchFile::create(a.path, so);
    shown.end();
    if (!made) return cancel.stopped() ? interrupted() : report_error(made.error());
    scratch = std::move(*made);
  }
  const std::string target = scratch ? scratch->path() : a.path;
  auto c = sweep(target, a.seconds > 0 ? a.seconds : 20, true, cancel, progress);
  if (!c) return cancel.stopped() ? interrupted() : report_error(c.error());
  if (scratch)
    c->target =
        a.path + " (a scratch file of " + format_size(static_cast<double>(scratch->size())) + ")";
  const doctor::GpuProbe gpu = doctor::probe_gpu(target);
  if (a.json) {
    nlohmann::json j = {{"ceiling", nlohmann::json::parse(c->json())},
                        {"gpu", nlohmann::json::parse(gpu.json())}};
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    std::printf("sluice doctor: %s\n%s%s", printable(a.path).c_str(),
                doctor::ceiling_text(*c).c_str(), gpu.text().c_str());
  }
  return 0;
}

// What the sweep of a watched job reads: the device node itself where we may read it (so the
// file's own layout does not lower the ceiling), else the biggest file the job reads there.
std::string ceiling_target(const doctor::Observation& ob) {
  if (!ob.device) return "";
  const auto& d = ob.device->device;
  std::string node = "/dev/" + d.name;
  struct stat sb;
  if (::stat(node.c_str(), &sb) == 0 && S_ISBLK(sb.st_mode) && ::major(sb.st_rdev) == d.major &&
      ::minor(sb.st_rdev) == d.minor &&
      UniqueFd(::open(node.c_str(), O_RDONLY | O_CLOEXEC)).valid())
    return node;  // opened, not access()ed: a container may refuse the open (EPERM) to root
  const doctor::OpenFile* big = nullptr;
  for (const auto& f : ob.files)
    if (::major(f.dev) == d.major && ::minor(f.dev) == d.minor && (!big || f.size > big->size))
      big = &f;
  return big ? big->path : "";
}

int run_pid(const DoctorArgs& a, const CancelHook& cancel) {
  std::optional<doctor::Ceiling> ceiling;
  if (!a.ceiling_file.empty()) {
    // A ceiling is a few KiB: the shared reader refuses FIFOs, devices and anything over 1 MiB.
    auto text = read_small_file(a.ceiling_file, "--ceiling");
    if (!text) return report_error(text.error());
    auto c = doctor::Ceiling::from_json(*text);
    if (!c) return report_error(c.error().with_context("--ceiling " + a.ceiling_file));
    ceiling = std::move(*c);
  }
  const double window = a.seconds > 0 ? a.seconds : 5;
  if (::kill(a.pid, 0) != 0 && errno == ESRCH)  // said before a watch that cannot start
    return report_error(Error(Code::kNotFound, "no process " + std::to_string(a.pid)));
  // Always: a script (or a test) learns when the watch starts.
  std::fprintf(stderr, "watching process %d for %.0f s...\n", a.pid, window);
  auto ob = doctor::observe(a.pid, window);
  if (!ob) return report_error(ob.error());
  if (!ceiling && !a.no_sweep) {
    std::string target = ceiling_target(*ob);
    if (target.empty()) {
      ob->notes.push_back(
          "no ceiling measured: the job reads nothing on a block device we can read");
    } else {
      if (cancel.install) cancel.install();
      // The job keeps running: no buffered point (dropping the file's pages would slow it).
      auto c = sweep(target, a.sweep_seconds, false, cancel, ::isatty(STDERR_FILENO));
      if (!c) {
        if (cancel.stopped()) return cancel.exit_code();
        ob->notes.push_back("no ceiling measured: " + c.error().message());
      } else {
        ceiling = std::move(*c);
      }
    }
  }
  if (ceiling && ob->device && !ceiling->device.empty() &&
      ceiling->device != ob->device->device.name)
    ob->notes.push_back("the ceiling was measured on " + ceiling->device +
                        ", but the job reads from " + ob->device->device.name +
                        ": gains compare different devices");
  auto d = doctor::diagnose(*ob, ceiling);
  std::printf("%s\n", a.json ? doctor::report_json(*ob, ceiling, d).c_str()
                             : doctor::report_text(*ob, ceiling, d).c_str());
  return 0;
}

int run_url(const DoctorArgs& a, const CancelHook& cancel) {
  s3::register_scheme();
  auto s3o = client::s3_options_from_environment(a.aws);
  if (!s3o) return report_error(s3o.error());
  telemetry::Registry registry;
  s3o->registry = &registry;
  s3o->max_in_flight = 64;  // the probe's own concurrency levels decide what is in flight
  store::StoreOptions so{.registry = nullptr};
  so.create = false;  // only reads: a mistyped directory is NotFound, never created
  so.backend.set(*s3o);
  // The URL names a prefix: keys under it are listed relative to it, so it ends with '/'.
  std::string uri = a.url;
  if (uri.find("://") != std::string::npos &&
      uri.find('/', uri.find("://") + 3) != std::string::npos && !uri.ends_with('/'))
    uri += '/';
  auto st = store::open_store(uri, so);
  if (!st) return report_error(st.error().with_context("--url " + a.url));
  doctor::StoreProbeOptions po;
  po.seconds = a.seconds > 0 ? a.seconds : 12;
  po.cancel = cancel.flag;
  po.throttled = [&registry] { return registry.counter("sluice_s3_throttled_total").value(); };
  if (cancel.install) cancel.install();
  if (::isatty(STDERR_FILENO))
    std::fprintf(stderr, "probing %s for %.0f s...\n", a.url.c_str(), po.seconds);
  auto p = doctor::probe_store(**st, po);
  if (!p) {
    if (cancel.stopped()) return cancel.exit_code();
    return report_error(p.error().with_context("doctor --url " + a.url));
  }
  auto causes = doctor::diagnose_store(*p, static_cast<double>(a.target_rate));
  std::printf("%s\n", a.json ? doctor::store_json(*p, causes).c_str()
                             : doctor::store_text(*p, causes).c_str());
  return 0;
}

}  // namespace

void add_doctor_command(CLI::App& app, const CommandContext& ctx) {
  const CancelHook cancel = ctx.cancel;
  int& rc = *ctx.rc;
  static DoctorArgs a;
  auto* cmd = app.add_subcommand(
      "doctor",
      "Measure what storage can do (--path), say why a running job gets less (--pid), or "
      "what an object store serves (--url)");
  cmd->footer(
      "--path DIR|FILE|DEVICE sweeps block size x queue depth x engine, reading only (a\n"
      "directory gets a scratch file of sluice's own, removed afterwards), within --seconds\n"
      "(default 20). --pid PID watches the job for --seconds (default 5) through /proc and\n"
      "/sys without touching it, measures the ceiling of the device it reads (read-only,\n"
      "--sweep-seconds, default 10) unless --ceiling or --no-sweep, and ranks the causes of\n"
      "its shortfall. --url s3://BUCKET/PREFIX probes an object store, reading only: one\n"
      "small GET at a time for the latency, then small GETs and large ranged reads at 1, 4,\n"
      "16 and 32 in flight within --seconds (default 12), and counts slow-down answers.\n"
      "See docs/doctor.md.");
  auto* path = cmd->add_option("--path", a.path, "A directory, file or block device to measure");
  auto* pid =
      cmd->add_option("--pid", a.pid, "A running process to watch")
          ->check(CLI::Validator(
              [](std::string& text) -> std::string {
                long v = 0;
                auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
                if (text.empty() || ec != std::errc{} || p != text.data() + text.size() || v < 1)
                  return "'" + text + "' is not a process id (a whole number, 1 or more)";
                return {};
              },
              "PID"));
  auto* url = cmd->add_option(
      "--url", a.url, "An object store prefix to probe (s3://bucket/prefix; any store URI)");
  path->excludes(pid);
  url->excludes(path);
  url->excludes(pid);
  cmd->add_option("--endpoint-url", a.aws.endpoint_url, "--url: the S3 endpoint");
  cmd->add_option("--profile", a.aws.profile, "--url: the AWS profile");
  cmd->add_option("--region", a.aws.region, "--url: the S3 region");
  cmd->add_option("--target-rate", a.target_rate,
                  "--url: a rate to reach (per second, e.g. 2G): how many reads in flight it needs")
      ->transform(size_validator());
  cmd->add_option("--seconds", a.seconds,
                  "--path: the sweep's time budget (default 20); --pid: how long to watch (default "
                  "5); --url: the probe's budget (default 12)")
      ->transform(seconds_validator(0.5, 3600));
  cmd->add_option("--sweep-seconds", a.sweep_seconds, "--pid: the ceiling sweep's budget")
      ->transform(seconds_validator(0.5, 3600))
      ->default_val(10);
  cmd->add_option("--ceiling", a.ceiling_file,
                  "--pid: a ceiling saved from `doctor --path ... --json` instead of a sweep");
  cmd->add_flag("--no-sweep", a.no_sweep, "--pid: measure no ceiling (gains are then guesses)");
  cmd->add_option(
         "--scratch-size", a.scratch_size,
         "--path DIR: the scratch file's size (default: 1 GiB or a quarter of the free space)")
      ->transform(size_validator());
  cmd->add_flag("--json", a.json, "Print one JSON object");
  cmd->callback([&rc, cancel] {
    if (a.path.empty() && a.pid == 0 && a.url.empty()) {
      rc =
          report_error(Error(Code::kInvalidArgument,
                             "give --path DIR|FILE|DEVICE, --pid PID or --url s3://BUCKET/PREFIX"));
      return;
    }
    if (!a.url.empty()) {
      rc = run_url(a, cancel);
      return;
    }
    if (!a.path.empty() && (!a.ceiling_file.empty() || a.no_sweep)) {
      rc = report_error(Error(Code::kInvalidArgument, "--ceiling and --no-sweep go with --pid"));
      return;
    }
    rc = a.pid ? run_pid(a, cancel) : run_path(a, cancel);
  });
}

}  // namespace sluice::cli
