// `sluice bench` (one data path, gdsio-style) and `sluice demo --bench` (every data path on
// one file, side by side).
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>

#include <CLI/CLI.hpp>

#include "command.h"
#include "common.h"
#include "demo.h"
#include "size_flag.h"
#include "sluice/core/sizes.h"
#include "sluice/io/bench.h"
#include "sluice/io/engine.h"

namespace sluice::cli {

using io::BenchMode;
using io::BenchOptions;
using io::BenchRw;

namespace {

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

}  // namespace

void add_bench_command(CLI::App& app, const CommandContext& ctx) {
  static BenchOptions o;  // CLI11 binds to them; one command runs per process
  static std::string mode, rw;
  static bool json = false;
  int& rc = *ctx.rc;
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

int run_bench_demo(const std::string& home, uint64_t demo_size) {
  int rc = 0;
  {
    std::string dir = home + "/demo";
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

}  // namespace sluice::cli
