// The sluice command line. Only this layer reads the environment and prints.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <CLI/CLI.hpp>

#include "cache_cmd.h"
#include "ckpt_cmd.h"
#include "common.h"
#include "cp.h"
#include "dataset_cmd.h"
#include "demo.h"
#include "doctor_cmd.h"
#include "gc_cmd.h"
#include "ledger_cmd.h"
#include "size_flag.h"
#include "sluice/client/copy.h"
#include "sluice/client/environment.h"
#include "sluice/core/sizes.h"
#include "sluice/io/bench.h"
#include "sluice/io/engine.h"

namespace {

using namespace sluice;
using namespace sluice::cli;
using io::BenchMode;
using io::BenchOptions;
using io::BenchRw;

std::string bench_text(const io::BenchResult& r) {
  char buf[1024];
  std::snprintf(buf, sizeof buf,
                "sluice bench: %s %s, bs %s, qd %u, threads %u, %s\n"
                "  path        %s\n"
                "  why         %s\n"
                "  throughput  %.3f GiB/s   (%s in %.2f s)\n"
                "  IOPS        %.0f\n"
                "  latency us  avg %.1f   p50 %.1f   p99 %.1f   p99.9 %.1f   max %.1f\n"
                "  CPU         %.1f%% (user %.1f%%, sys %.1f%%)%s\n",
                r.mode.c_str(), r.rw.c_str(), format_size(static_cast<double>(r.bs)).c_str(), r.qd,
                r.threads, format_size(static_cast<double>(r.size)).c_str(), r.path.c_str(),
                r.path_why.c_str(), r.throughput_gib_s,
                format_size(static_cast<double>(r.bytes)).c_str(), r.seconds, r.iops, r.lat_avg_us,
                r.lat_p50_us, r.lat_p99_us, r.lat_p999_us, r.lat_max_us, r.cpu_pct, r.cpu_user_pct,
                r.cpu_sys_pct, r.verified ? "\n  verify      every byte checked: OK" : "");
  return buf;
}

// Runs the bench engine, showing the lay-out of the file on a terminal.
Result<io::BenchResult> bench_showing_lay_out(BenchOptions o) {
  LayOutProgress shown(o.file);
  if (::isatty(STDERR_FILENO)) o.on_lay_out = std::ref(shown);
  auto r = io::run_bench(o);
  shown.end();
  return r;
}

void add_bench(CLI::App& app, BenchOptions& o, std::string& mode, std::string& rw, bool& json,
               int& rc) {
  auto* cmd = app.add_subcommand(
      "bench", "Measure a data path like gdsio: qd requests of bs bytes in flight per thread");
  cmd->add_option("--file", o.file, "File to read or write (created and laid out if missing)")
      ->required();
  cmd->add_option("--mode", mode,
                  "buffered (page cache), direct (O_DIRECT, thread pool), uring (O_DIRECT, "
                  "io_uring), bounce (emulated device through staging buffers), gpu (CUDA "
                  "through pinned staging buffers), gds (GPUDirect Storage via cuFile)")
      ->default_val("uring");
  cmd->add_option("--rw", rw, "read, write, randread or randwrite")->default_val("read");
  cmd->add_option("--bs", o.bs, "Block size per request (4K, 1M, ...)")
      ->transform(size_validator())
      ->default_str("1M");
  cmd->add_option("--qd", o.qd, "Requests in flight per thread")->default_val(32);
  cmd->add_option("--threads", o.threads, "Submitting threads")->default_val(1);
  cmd->add_option("--size", o.size, "Bytes of the file to work over (default: the file's size)")
      ->transform(size_validator());
  cmd->add_option("--runtime", o.runtime, "How long to run (10, 10s, 2m); 0 = one pass over --size")
      ->transform(seconds_validator(0, 7 * 86400))
      ->default_val(0);
  cmd->add_flag("--verify", o.verify, "Check every byte read (or read back what was written)");
  cmd->add_flag("--json", json, "Print the result as one JSON object");
  cmd->add_option("--cuda-library", o.cuda_library,
                  "libcudart to load for gpu/gds (default: the first of libcudart.so, .so.13, "
                  ".so.12, .so.11.0)")
      ->envname("SLUICE_CUDART");
  cmd->add_option("--cufile-library", o.cufile_library,
                  "libcufile to load for gds (default: libcufile.so.0)")
      ->envname("SLUICE_CUFILE");
  cmd->callback([&] {
    auto m = io::parse_bench_mode(mode);
    if (!m) {
      rc = report_error(m.error());
      return;
    }
    auto r = io::parse_bench_rw(rw);
    if (!r) {
      rc = report_error(r.error());
      return;
    }
    o.mode = *m;
    o.rw = *r;
    auto res = bench_showing_lay_out(o);
    if (!res) {
      rc = report_error(res.error());
      return;
    }
    std::printf("%s\n", json ? res->json().c_str() : bench_text(*res).c_str());
    rc = 0;
  });
}

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

// SIGINT and SIGTERM during a copy: the first asks the copy to stop (writers are aborted,
// so no temporary file or open multipart upload is left) and sluice exits 128+signal; a
// second one exits at once.
std::atomic<bool> g_cancel{false};
std::atomic<int> g_signal{0};
static_assert(std::atomic<bool>::is_always_lock_free && std::atomic<int>::is_always_lock_free,
              "set from a signal handler");

void on_stop_signal(int sig) {
  if (g_cancel.load()) ::_exit(128 + sig);
  g_signal.store(sig);
  g_cancel.store(true);
}

void catch_stop_signals() {
  struct sigaction sa = {};
  sa.sa_handler = on_stop_signal;
  // SA_RESTART: system calls the signal interrupts carry on; the copy stops at its next
  // part boundary instead.
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
}

// `cp`'s flags to a request and a session; copies, prints the summary, gives the exit code.
int run_cp_command(CpArgs& a) {
  auto options = session_options(a.aws, a.ledger, a.cache);  // bad flags refused up front
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
  a.cp.cancel = &g_cancel;
  catch_stop_signals();
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
  return sum->cancelled           ? CancelHook{&g_cancel, catch_stop_signals, &g_signal}.exit_code()
         : !sum->failures.empty() ? 1
                                  : 0;
}

void add_cp(CLI::App& app, CpArgs& a, int& rc) {
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
  add_cache_flags(cmd, a.cache);
  cmd->callback([&] { rc = run_cp_command(a); });
}

// `sluice demo --bench`: every data path on one file, side by side.
int run_bench_demo(uint64_t demo_size);

// The embedded default's main job (demo.h), or with --bench the data-path comparison.
void add_demo(CLI::App& app, uint64_t& demo_size, int& rc) {
  static DemoOptions o;
  static bool bench = false, child = false, resume = false;
  static uint64_t crash_at = 0;
  static std::string events;
  auto* cmd = app.add_subcommand(
      "demo",
      "Run a synthetic training job on the embedded default: stream a generated dataset "
      "through the cache for 2 epochs with asynchronous checkpoints, kill it mid-run, resume "
      "it exactly, and report (--bench: compare every data path instead)");
  cmd->add_flag("--bench", bench, "Run sluice bench across every mode on a file and compare");
  cmd->add_option("--size", demo_size, "With --bench: size of the demo file")
      ->transform(size_validator())
      ->default_str("256M");
  cmd->add_option("--samples", o.samples, "Samples in the generated dataset")
      ->default_val(12000)
      ->check(CLI::Range(uint64_t{1000}, uint64_t{10'000'000}));
  // The training run the demo starts twice; not for people.
  cmd->add_flag("--child", child)->group("");
  cmd->add_flag("--resume", resume)->group("");
  cmd->add_option("--crash-at-step", crash_at)->group("");
  cmd->add_option("--events", events)->group("");
  cmd->callback([&] {
    o.dir = client::home_from_environment() + "/demo";
    // About two checkpoints an epoch, at most one per 100 steps (the parent and the
    // child compute the same from --samples).
    uint64_t steps_per_epoch = (o.samples + o.batch - 1) / o.batch;
    o.ckpt_every = static_cast<unsigned>(std::clamp<uint64_t>(steps_per_epoch / 2, 5, 100));
    if (bench) {
      rc = run_bench_demo(demo_size);
      return;
    }
    if (child) {
      rc = run_training_child(o, crash_at, resume, events);
      return;
    }
    std::error_code ec;
    auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
    if (ec) {
      rc = report_error(error_from_errno(ec.value(), "find this program (/proc/self/exe)"));
      return;
    }
    rc = run_training_demo(o, exe.string());
  });
}

int run_bench_demo(uint64_t demo_size) {
  int rc = 0;
  {
    std::string dir = client::home_from_environment() + "/demo";
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) {
      rc = report_error(error_from_errno(ec.value(), "create " + dir));
      return rc;
    }
    // The demo owns these files: start from a fresh layout every run, so a file left by an
    // older run (or changed by hand) never fails the verification.
    std::filesystem::remove(dir + "/bench.dat", ec);
    std::filesystem::remove(dir + "/bench-write.dat", ec);
    std::string why;
    bool uring = io::uring_available(&why);
    std::printf("sluice demo: every data path on %s/bench.dat (%s)\n", dir.c_str(),
                format_size(static_cast<double>(demo_size)).c_str());
    std::printf("io_uring: %s\n\n", uring ? "available" : ("unavailable: " + why).c_str());
    std::printf("%-9s %-9s %-8s %4s %10s %10s %9s %9s %7s  %s\n", "mode", "rw", "bs", "qd", "GiB/s",
                "IOPS", "p50 us", "p99 us", "CPU%", "path");
    struct Row {
      BenchMode mode;
      BenchRw rw;
      uint64_t bs;
    };
    const Row rows[] = {
        {BenchMode::kBuffered, BenchRw::kRead, 1 << 20},
        {BenchMode::kDirect, BenchRw::kRead, 1 << 20},
        {BenchMode::kUring, BenchRw::kRead, 1 << 20},
        {BenchMode::kBounce, BenchRw::kRead, 1 << 20},
        {BenchMode::kGpu, BenchRw::kRead, 1 << 20},
        {BenchMode::kGds, BenchRw::kRead, 1 << 20},
        {BenchMode::kUring, BenchRw::kWrite, 1 << 20},
        {BenchMode::kUring, BenchRw::kRandRead, 4096},
    };
    int failures = 0;
    for (const Row& row : rows) {
      BenchOptions o;
      // Writes go to their own file: the reads verify the pattern, which a plain write run
      // does not lay down.
      o.file = dir + (row.rw == BenchRw::kWrite ? "/bench-write.dat" : "/bench.dat");
      o.mode = row.mode;
      o.rw = row.rw;
      o.bs = row.bs;
      o.qd = 32;
      o.size = demo_size;
      o.runtime = row.bs < (1 << 20) ? 3 : 0;
      o.verify = row.rw == BenchRw::kRead;
      auto r = bench_showing_lay_out(o);
      std::string bs = format_size(static_cast<double>(row.bs));
      if (!r) {
        bool skip = r.error().code() == Code::kUnsupported;
        if (!skip) ++failures;
        std::printf("%-9s %-9s %-8s %4u %10s  %s: %s\n",
                    std::string(io::bench_mode_name(row.mode)).c_str(),
                    std::string(io::bench_rw_name(row.rw)).c_str(), bs.c_str(), o.qd, "-",
                    skip ? "not on this machine" : "FAILED", r.error().message().c_str());
        continue;
      }
      std::printf("%-9s %-9s %-8s %4u %10.3f %10.0f %9.1f %9.1f %7.1f  %s%s\n", r->mode.c_str(),
                  r->rw.c_str(), bs.c_str(), r->qd, r->throughput_gib_s, r->iops, r->lat_p50_us,
                  r->lat_p99_us, r->cpu_pct, r->path.c_str(), r->verified ? " (verified)" : "");
    }
    std::filesystem::remove(dir + "/bench.dat", ec);
    std::filesystem::remove(dir + "/bench-write.dat", ec);
    std::printf(
        "\nOne run each on a shared machine: compare modes side by side, not with "
        "yesterday's numbers.\nbench/fio_compare.py measures against fio properly.\n");
    rc = failures ? 1 : 0;
  }
  return rc;
}

}  // namespace

// CLI11 only says "A subcommand is required" for a word it does not know, at any depth
// ("sluice ckpt rm"): name the word and the commands there are.
int refuse_unknown_command(CLI::App& app, int argc, char** argv) {
  CLI::App* at = &app;
  std::string path = "sluice";
  auto names = [](CLI::App* a) {
    std::string known;
    for (CLI::App* s : a->get_subcommands([](const CLI::App*) { return true; }))
      known += (known.empty() ? "" : ", ") + s->get_name();
    return known;
  };
  int i = 1;
  for (; i < argc && argv[i][0] != '-'; ++i) {
    auto subs = at->get_subcommands([](const CLI::App*) { return true; });
    if (subs.empty()) return 0;  // a command's own arguments
    CLI::App* next = nullptr;
    for (CLI::App* s : subs)
      if (s->get_name() == argv[i]) next = s;
    if (!next) {
      std::fprintf(
          stderr, "sluice: error: unknown command '%s %s' (commands of %s: %s; see %s --help)\n",
          path.c_str(), printable(argv[i]).c_str(), path.c_str(), names(at).c_str(), path.c_str());
      return 2;
    }
    at = next;
    path += " " + next->get_name();
  }
  // "sluice capacity" alone: say which commands it has.
  if (i == argc && at != &app && at->get_require_subcommand_min() > 0) {
    std::fprintf(stderr, "sluice: error: %s needs a command: %s (see %s --help)\n", path.c_str(),
                 names(at).c_str(), path.c_str());
    return 2;
  }
  return 0;
}

int main(int argc, char** argv) {
  CLI::App app{"sluice: the data layer for GPU fleets"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "sluice 0.1.0");
  int rc = 0;
  BenchOptions bench;
  std::string mode, rw;
  bool json = false;
  uint64_t demo_size = 256ull << 20;
  add_bench(app, bench, mode, rw, json, rc);
  add_demo(app, demo_size, rc);
  CpArgs cp;
  add_cp(app, cp, rc);
  CacheArgs cache_args;
  add_cache_commands(app, cache_args, CancelHook{&g_cancel, catch_stop_signals, &g_signal}, rc);
  add_ckpt_commands(app, client::home_from_environment(),
                    CancelHook{&g_cancel, catch_stop_signals, &g_signal}, rc);
  add_dataset_commands(app, CancelHook{&g_cancel, catch_stop_signals, &g_signal}, rc);
  add_ledger_commands(app, client::home_from_environment(), rc);
  add_gc_commands(app, client::home_from_environment(), rc);
  add_doctor_command(app, CancelHook{&g_cancel, catch_stop_signals, &g_signal}, rc);
  if (int bad = refuse_unknown_command(app, argc, argv)) return bad;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    // A usage error reads like every other error, and exits 2 like other Unix tools.
    std::fprintf(stderr, "sluice: error: %s (see --help)\n", printable(e.what()).c_str());
    return 2;
  }
  return rc;
}
