// `sluice dataset`: list and describe datasets, pack a directory into WebDataset shards
// with their indexes, and read a dataset the way a training job would (docs/dataset.md).
#include "command.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "cache_flags.h"
#include "common.h"
#include "ledger_cmd.h"
#include "size_flag.h"
#include "sluice/cache/tiered_cache.h"
#include "sluice/client/datasets.h"
#include "sluice/client/location.h"
#include "sluice/core/fd.h"
#include "sluice/core/sizes.h"
#include "sluice/s3/store.h"
#include "sluice/stream/dataset.h"
#include "sluice/stream/pack.h"
#include "sluice/stream/tar.h"
#include "sluice/telemetry/registry.h"
#include "sluice/telemetry/textfile.h"

namespace sluice::cli {

using client::Location;
using client::parse_location;
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

struct DatasetArgs {
  std::string uri;  // the dataset (ls, stat, read) or the destination (pack)
  std::string src;  // pack: the directory
  std::string shard_size = "256M";
  std::string name = "shard";  // pack: shard names
  std::string format = "auto";
  client::AwsSettings aws;
  std::string ledger;  // pack --ledger
  CacheFlags cache;
  bool no_cache = false;
  stream::LoaderOptions lo;
  std::string memory = "256M";
  uint64_t limit = 0;
  size_t batch = 256;
  bool keys = false, json = false, no_progress = false, skip_corrupt = false;
  std::string catalog_dir;  // read: default $SLUICE_HOME/datasets
  bool refresh = false;
  const std::atomic<bool>* cancel = nullptr;
  std::string metrics_file;  // read: the loader's, cache's and store's metrics, as Prometheus text
  double metrics_interval = 10;
  telemetry::Registry* registry = nullptr;  // where the stores opened for it record
};

bool cancelled(const DatasetArgs& a) {
  return a.cancel && a.cancel->load();
}

// A whole number that fits 64 bits: CLI11 would wrap "-1" and saturate 2^64 into one.
CLI::Validator whole_number() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        uint64_t v = 0;
        auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
        if (text.empty() || ec != std::errc{} || p != text.data() + text.size())
          return "'" + text + "' is not a whole number from 0 to 18446744073709551615";
        return {};
      },
      "UINT");
}

CLI::Validator at_least_one(unsigned max) {
  return CLI::Validator(
      [max](std::string& text) -> std::string {
        unsigned v = 0;
        auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
        if (text.empty() || ec != std::errc{} || p != text.data() + text.size() || v < 1 || v > max)
          return "must be a whole number from 1 to " + std::to_string(max) + ", not '" + text + "'";
        return {};
      },
      "1.." + std::to_string(max));
}

// A key as a line of output: control bytes and invalid UTF-8 escaped (as ls does), so a
// key holding a newline stays one line.
void append_key_line(std::string& out, std::string_view key) {
  bool plain = std::all_of(key.begin(), key.end(), [](char c) {
    auto u = static_cast<unsigned char>(c);
    return u >= 0x20 && u < 0x7f;
  });
  if (plain)
    out.append(key);
  else
    out.append(printable(std::string(key)));
  out.push_back('\n');
}

Result<stream::Format> parse_format(const std::string& f) {
  if (f == "auto") return stream::Format::kAuto;
  if (f == "tar") return stream::Format::kTar;
  if (f == "objects") return stream::Format::kObjects;
  return fail(Code::kInvalidArgument, "--format '" + f + "': auto, tar or objects");
}

// `catalog`: a reader, listing through the node's catalog.
Result<std::shared_ptr<stream::Dataset>> open_dataset(const DatasetArgs& a, bool through_cache,
                                                      bool catalog = false) {
  SLUICE_ASSIGN_OR_RETURN(client::Session session, open_session(a.aws, {}, a.cache));
  client::DatasetSpec spec;
  spec.uri = a.uri;
  spec.through_cache = through_cache;
  spec.catalog = catalog;
  spec.catalog_dir = a.catalog_dir;
  spec.refresh = a.refresh;
  SLUICE_ASSIGN_OR_RETURN(spec.format, parse_format(a.format));
  spec.skip_corrupt = a.skip_corrupt;
  spec.registry = a.registry;
  auto ds = client::open_dataset(session, spec);
  if (ds)
    for (const store::SkippedKey& s : (*ds)->left_out())
      std::fprintf(stderr, "sluice: dataset: skipped %s\n", printable(s.reason).c_str());
  return ds;
}

const char* format_name(stream::Format f) {
  return f == stream::Format::kTar ? "tar" : "objects";
}

int run_stat(const DatasetArgs& a) {
  auto ds = open_dataset(a, false);
  if (!ds) return report_error(ds.error());
  const auto& d = **ds;
  uint64_t indexed = 0;
  for (const auto& s : d.shards()) indexed += s.indexed;
  uint64_t units = d.format() == stream::Format::kTar ? d.shards().size() : 0;
  if (a.json) {
    char fp[17];
    std::snprintf(fp, sizeof fp, "%016llx", static_cast<unsigned long long>(d.fingerprint()));
    std::printf("%s\n",
                json{{"uri", a.uri},
                     {"format", format_name(d.format())},
                     {"shards", units},
                     {"indexed_shards", indexed},
                     {"skipped_shards", d.skipped_shards()},
                     {"objects", d.format() == stream::Format::kObjects ? d.shards().size() : 0},
                     {"samples", d.samples()},
                     {"bytes", d.bytes()},
                     {"fingerprint", fp}}
                    .dump()
                    .c_str());
    return 0;
  }
  std::printf("dataset %s\n", printable(a.uri).c_str());
  if (d.format() == stream::Format::kTar)
    std::printf("format:  WebDataset tar shards: %lu (%lu with an index, %lu scanned)\n",
                static_cast<unsigned long>(units), static_cast<unsigned long>(indexed),
                static_cast<unsigned long>(units - indexed));
  else
    std::printf("format:  plain objects: %lu\n", static_cast<unsigned long>(d.shards().size()));
  std::printf(
      "samples: %lu (mean %s)\n", static_cast<unsigned long>(d.samples()),
      format_size(static_cast<double>(d.bytes()) / static_cast<double>(d.samples())).c_str());
  std::printf("bytes:   %s\n", format_size(static_cast<double>(d.bytes())).c_str());
  if (d.skipped_shards())
    std::printf("skipped: %lu corrupt shards\n", static_cast<unsigned long>(d.skipped_shards()));
  return 0;
}

int run_ls(const DatasetArgs& a) {
  auto ds = open_dataset(a, false);
  if (!ds) return report_error(ds.error());
  const auto& d = **ds;
  json out = json::array();
  if (!a.json) std::printf("%12s %10s %-8s %s\n", "BYTES", "SAMPLES", "TABLE", "KEY");
  for (const auto& s : d.shards()) {
    const char* table = d.format() == stream::Format::kObjects ? "object"
                        : s.indexed                            ? "index"
                                                               : "scanned";
    if (a.json)
      out.push_back({{"key", s.key}, {"bytes", s.size}, {"samples", s.samples}, {"table", table}});
    else
      std::printf("%12lu %10lu %-8s %s\n", static_cast<unsigned long>(s.size),
                  static_cast<unsigned long>(s.samples), table, printable(s.key).c_str());
  }
  if (a.json) std::printf("%s\n", out.dump().c_str());
  return 0;
}

// ---- pack ------------------------------------------------------------------------------

int run_pack(const DatasetArgs& a) {
  auto t0 = Clock::now();
  auto target = parse_size(a.shard_size);
  if (!target || *target < (4u << 10))
    return report_error(Error(Code::kInvalidArgument,
                              "--shard-size '" + a.shard_size +
                                  "': " + (target ? "at least 4K" : target.error().message())));
  if (a.name.empty() || a.name.find('/') != std::string::npos)
    return report_error(Error(Code::kInvalidArgument, "--name must be a plain word"));
  // The source first: a missing one is its own error, and nothing is made for it.
  auto files = stream::find_sample_files(a.src);
  if (!files) return report_error(files.error());
  auto w = client::dataset_location(a.uri);
  if (!w) return report_error(w.error());
  auto session = open_session(a.aws, a.ledger, a.cache);
  if (!session) return report_error(session.error());
  auto opened = session->open_store(w->store_uri);
  if (!opened) return report_error(opened.error());
  // Shards and indexes are charged to the project owning the destination, as datasets.
  auto st = session->charged(std::move(*opened), ledger::Kind::kDataset);
  if (!st) return report_error(st.error());
  StatusLine line(!a.no_progress && !a.json);
  stream::PackDirectoryOptions po;
  po.pack = {.shard_bytes = *target, .name = a.name};
  po.destination = a.uri;
  po.cancel = a.cancel;
  if (line.on())
    po.on_progress = [&line](uint64_t done, uint64_t samples, uint64_t bytes) {
      if (done % 1000 == 0)
        line.show("packed " + std::to_string(done) + " of " + std::to_string(samples) +
                  " samples (" + format_size(static_cast<double>(bytes)) + ")");
    };
  auto r = stream::pack_directory(*files, **st, w->prefix, po);
  line.clear();
  if (!r) return report_error(r.error());
  double secs = seconds_since(t0);
  if (a.json) {
    std::printf("%s\n", json{{"uri", a.uri},
                             {"shards", r->shards},
                             {"samples", r->samples},
                             {"files", r->files},
                             {"file_bytes", r->file_bytes},
                             {"shard_bytes", r->shard_bytes},
                             {"skipped_files", r->skipped_files},
                             {"seconds", secs}}
                            .dump()
                            .c_str());
  } else {
    std::printf(
        "packed %lu samples (%lu files, %s) into %lu shard%s with indexes at %s in %.1f s\n",
        static_cast<unsigned long>(r->samples), static_cast<unsigned long>(r->files),
        format_size(static_cast<double>(r->file_bytes)).c_str(),
        static_cast<unsigned long>(r->shards), r->shards == 1 ? "" : "s", printable(a.uri).c_str(),
        secs);
    if (r->skipped_files)
      std::printf("skipped %lu files that are not sample files (NAME.EXT, not __*)\n",
                  static_cast<unsigned long>(r->skipped_files));
  }
  return 0;
}

// ---- read ------------------------------------------------------------------------------

// Reads up to --limit samples in batches, printing keys (--keys) or progress; returns how
// many were read.
Result<uint64_t> read_samples(const DatasetArgs& a, stream::Loader& loader) {
  const bool progress = !a.keys && !a.no_progress && !a.json && ::isatty(STDERR_FILENO);
  const size_t batch_size = std::max<size_t>(a.batch, 1);
  auto last_progress = Clock::now();
  uint64_t n = 0;
  std::string out;
  Status status = ok();
  while (!a.limit || n < a.limit) {
    if (cancelled(a)) break;
    size_t want = a.limit ? std::min<uint64_t>(batch_size, a.limit - n) : batch_size;
    auto batch = loader.next_batch(want);
    if (!batch) {
      status = std::unexpected(batch.error());
      break;
    }
    if (batch->empty()) break;
    n += batch->size();
    if (a.keys) {
      for (const auto& s : *batch) append_key_line(out, s.key);
      std::fwrite(out.data(), 1, out.size(), stdout);
      out.clear();
    }
    if (progress && seconds_since(last_progress) > 1) {
      auto s = loader.stats();
      std::fprintf(stderr, "\r%lu samples, %s, %.0f samples/s", static_cast<unsigned long>(n),
                   format_size(static_cast<double>(s.bytes)).c_str(),
                   static_cast<double>(s.samples) / s.elapsed_seconds);
      last_progress = Clock::now();
    }
  }
  if (progress) std::fprintf(stderr, "\r%-70s\r", "");
  if (!status) return std::unexpected(status.error());
  return n;
}

// What the read did, and what the cache served of it (`cache`: the counters before).
void print_read_report(const DatasetArgs& a, const stream::Dataset& ds, stream::Loader& loader,
                       bool stopped, cache::TieredCache* cache, const cache::CacheStats& before) {
  auto s = loader.stats();
  double rate = s.elapsed_seconds > 0 ? static_cast<double>(s.samples) / s.elapsed_seconds : 0;
  double bps = s.elapsed_seconds > 0 ? static_cast<double>(s.bytes) / s.elapsed_seconds : 0;
  cache::CacheStats after = cache ? cache->stats() : cache::CacheStats{};
  const uint64_t ram = after.ram.hit_bytes - before.ram.hit_bytes;
  const uint64_t nvme = after.disk.hit_bytes - before.disk.hit_bytes;
  const uint64_t source = after.miss_bytes - before.miss_bytes;
  if (a.json) {
    json j{{"samples", s.samples},
           {"bytes", s.bytes},
           {"seconds", s.elapsed_seconds},
           {"samples_per_s", rate},
           {"bytes_per_s", bps},
           {"first_batch_s", s.first_batch_seconds},
           {"stall_s", s.stall_seconds},
           {"requests", s.requests},
           {"read_bytes", s.read_bytes},
           {"throttled", s.throttled},
           {"skipped_samples", s.skipped_samples},
           {"window_parts", s.window_parts}};
    // The whole process's CPU (start, listing and reading): what a benchmark puts per GiB.
    struct rusage ru {};
    if (::getrusage(RUSAGE_SELF, &ru) == 0) {
      auto secs = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec / 1e6; };
      j["cpu_user_s"] = secs(ru.ru_utime);
      j["cpu_system_s"] = secs(ru.ru_stime);
    }
    if (cache)
      j["cache"] = {{"ram_hit_bytes", ram}, {"nvme_hit_bytes", nvme}, {"miss_bytes", source}};
    if (stopped) j["resume"] = loader.state();
    std::printf("%s\n", j.dump().c_str());
    return;
  }
  std::printf("read %lu samples (%s) in %.2f s: %.0f samples/s, %s/s\n",
              static_cast<unsigned long>(s.samples),
              format_size(static_cast<double>(s.bytes)).c_str(), s.elapsed_seconds, rate,
              format_size(bps).c_str());
  std::printf("first sample after %.1f ms; waited on data %.1f%% of the time\n",
              s.first_batch_seconds * 1e3,
              s.elapsed_seconds > 0 ? 100 * s.stall_seconds / s.elapsed_seconds : 0.0);
  std::printf("%lu requests (%s read)%s\n", static_cast<unsigned long>(s.requests),
              format_size(static_cast<double>(s.read_bytes)).c_str(),
              s.throttled ? (", " + std::to_string(s.throttled) + " throttled").c_str() : "");
  if (cache)
    std::printf("cache: RAM %s, NVMe %s, source %s\n",
                format_size(static_cast<double>(ram)).c_str(),
                format_size(static_cast<double>(nvme)).c_str(),
                format_size(static_cast<double>(source)).c_str());
  if (s.skipped_samples)
    std::printf("skipped %lu corrupt samples\n", static_cast<unsigned long>(s.skipped_samples));
  if (s.window_parts) {
    const uint64_t enough = stream::Loader::memory_for_whole_windows(ds);
    std::printf(
        "%lu slices were parts of shuffle windows larger than a quarter of --memory (%s): each "
        "part read its window's chunks again; --memory %s (4x the largest shard) with the "
        "automatic window reads each once\n",
        static_cast<unsigned long>(s.window_parts), a.memory.c_str(),
        (std::to_string((enough + (1 << 20) - 1) >> 20) + "M").c_str());
  }
}

int run_read(DatasetArgs& a) {
  auto memory = parse_size(a.memory);
  if (!memory)
    return report_error(
        Error(Code::kInvalidArgument, "--memory '" + a.memory + "': " + memory.error().message()));
  a.lo.memory_bytes = *memory;
  a.lo.skip_corrupt = a.skip_corrupt;
  // Declared before the dataset, whose stores record into it until they close.
  telemetry::Registry registry;
  if (!a.metrics_file.empty()) a.registry = a.lo.registry = &registry;
  auto ds = open_dataset(a, !a.no_cache, true);
  if (!ds) return report_error(ds.error());
  // A catalog hides objects added since it was made: say it was used, and the way out.
  if ((*ds)->from_catalog())
    std::fprintf(stderr,
                 "sluice: note: the dataset's listing came from this node's catalog (at most "
                 "10 minutes old): objects added since are not in it; --refresh lists again\n");
  auto* cache = (*ds)->store().capability<cache::TieredCache>();
  cache::CacheStats before;
  if (cache) before = cache->stats();
  std::unique_ptr<telemetry::TextfileExporter> exporter;
  if (!a.metrics_file.empty()) {
    auto e = telemetry::TextfileExporter::start(
        registry, a.metrics_file,
        std::chrono::milliseconds(static_cast<int64_t>(a.metrics_interval * 1000)));
    if (!e) return report_error(e.error());
    exporter = std::move(*e);
  }
  stream::Loader loader(*ds, a.lo);
  auto n = read_samples(a, loader);
  if (!n) return report_error(n.error());
  // The resume token is the last line whenever the read was cut short or limited: with
  // --limit a script always finds one, also when this rank's share ended first.
  const bool token = cancelled(a) || a.limit;
  if (!a.keys) print_read_report(a, **ds, loader, token, cache, before);
  if (a.limit && *n < a.limit && !cancelled(a))
    std::fprintf(stderr,
                 "sluice: this rank's share of the epochs ended after %llu samples, before "
                 "--limit %llu; the token resumes after them\n",
                 static_cast<unsigned long long>(*n), static_cast<unsigned long long>(a.limit));
  if (token && !a.json) std::printf("%s\n", loader.state().c_str());
  std::fflush(stdout);
  if (exporter)
    if (auto st = exporter->stop(); !st) return report_error(st.error());
  return cancelled(a) ? 130 : 0;
}

// S3 settings and --json, which every dataset command takes.
void add_common(CLI::App* c, DatasetArgs& a) {
  c->add_option("--endpoint-url", a.aws.endpoint_url, "S3 endpoint for s3:// datasets");
  c->add_option("--profile", a.aws.profile, "AWS profile for s3:// datasets");
  c->add_option("--region", a.aws.region, "Region for s3:// datasets");
  c->add_flag("--json", a.json, "Print the result as JSON");
}

void add_formats(CLI::App* c, DatasetArgs& a) {
  c->add_option("--format", a.format,
                "tar (WebDataset shards), objects (one sample per object), or auto (tar when "
                "the folder holds only .tar shards and their .idx indexes)")
      ->default_str("auto");
  c->add_flag("--skip-corrupt", a.skip_corrupt,
              "Skip (and count) shards and samples that are not valid tar, instead of failing");
}

constexpr const char* kUriHelp =
    "The dataset: a directory, file:///dir, s3://bucket/prefix (a folder)";

void add_read(CLI::App* ds, DatasetArgs& a, CancelHook cancel, int& rc) {
  auto* rd = ds->add_subcommand(
      "read",
      "Read a dataset as one rank of a training job: keys in order (--keys) or a throughput "
      "summary; with --limit, the resume token is the last line");
  rd->add_option("URI", a.uri, kUriHelp)->required();
  rd->add_option("--seed", a.lo.seed, "Shuffle seed")->default_val(0)->check(whole_number());
  rd->add_option("--epoch", a.lo.epoch, "First epoch")->default_val(0)->check(whole_number());
  rd->add_option("--epochs", a.lo.epochs, "Epochs to read (0: without end)")
      ->default_val(1)
      ->check(whole_number());
  rd->add_option("--rank", a.lo.rank, "This rank")->default_val(0)->check(whole_number());
  rd->add_option("--world", a.lo.world, "Ranks in the job")
      ->default_val(1)
      ->check(at_least_one(1u << 20));
  rd->add_option("--worker", a.lo.worker, "This loader worker of the rank")
      ->default_val(0)
      ->check(whole_number());
  rd->add_option("--workers", a.lo.workers, "Loader workers per rank")
      ->default_val(1)
      ->check(at_least_one(1u << 16));
  rd->add_option("--resume", a.lo.resume, "Continue from a resume token");
  rd->add_option("--shuffle-window", a.lo.shuffle_window,
                 "Samples mixed at once (whole shards at least); 0: what a quarter of --memory "
                 "holds, so each window is read once (a larger one, or a shard larger than a "
                 "quarter of --memory, is read in parts, each reading its chunks again)")
      ->default_val(0);
  rd->add_flag("!--no-shuffle", a.lo.shuffle, "Read in stored order");
  rd->add_option("--limit", a.limit, "Stop after N samples (at least 1) and print the resume token")
      ->check(whole_number())
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            return text.find_first_not_of('0') == std::string::npos
                       ? "must be at least 1 (leave --limit out to read every sample)"
                       : "";
          },
          "N>=1"));
  rd->add_option("--batch", a.batch, "Samples per batch")
      ->default_val(256)
      ->check(at_least_one(1u << 24));
  rd->add_option("--memory", a.memory, "Read-ahead memory at most")->default_str("256M");
  rd->add_option("--inflight", a.lo.inflight, "Requests in flight at most")
      ->default_val(32)
      ->check(CLI::Range(1u, 1024u));
  rd->add_flag("--keys", a.keys, "Print each sample's key, in order");
  rd->add_flag("--no-cache", a.no_cache, "Read the store directly, not through the cache");
  rd->add_option("--catalog-dir", a.catalog_dir,
                 "Where the node keeps dataset catalogs (default $SLUICE_HOME/datasets)");
  rd->add_flag("--refresh", a.refresh, "List the dataset again instead of using the catalog");
  rd->add_flag("--no-progress", a.no_progress, "No progress line, even on a terminal");
  rd->add_option("--metrics-file", a.metrics_file,
                 "Write the loader's, the cache's and the store's metrics to this file as "
                 "Prometheus text (for node_exporter's textfile collector), every "
                 "--metrics-interval seconds and at the end");
  rd->add_option("--metrics-interval", a.metrics_interval, "Seconds between metrics file writes")
      ->default_val(10)
      ->transform(seconds_validator(0.1, 86400));
  add_common(rd, a);
  add_formats(rd, a);
  add_cache_flags(rd, a.cache, client::Profile::kCommand);
  rd->callback([&rc, &a, cancel] {
    a.cancel = cancel.flag;
    if (cancel.install) cancel.install();
    rc = run_read(a);
    if (cancelled(a)) rc = cancel.exit_code();
  });
}

}  // namespace

void add_dataset_commands(CLI::App& app, const CommandContext& ctx) {
  const CancelHook cancel = ctx.cancel;
  int& rc = *ctx.rc;
  static DatasetArgs a;  // CLI11 binds to it; one command runs per process
  auto* ds = app.add_subcommand(
      "dataset", "Datasets: list, describe, pack a directory into WebDataset shards, read");
  ds->require_subcommand(1);
  auto* ls = ds->add_subcommand("ls", "List a dataset's shards (or objects) and sample counts");
  ls->add_option("URI", a.uri, kUriHelp)->required();
  add_common(ls, a);
  add_formats(ls, a);
  ls->callback([&rc] { rc = run_ls(a); });

  auto* st = ds->add_subcommand("stat", "Describe a dataset: format, shards, samples, bytes");
  st->add_option("URI", a.uri, kUriHelp)->required();
  add_common(st, a);
  add_formats(st, a);
  st->callback([&rc] { rc = run_stat(a); });

  auto* pack = ds->add_subcommand(
      "pack",
      "Pack a directory of files into WebDataset tar shards of a target size, each with its "
      "index, under an empty destination folder");
  pack->add_option("SRC_DIR", a.src, "The directory (files NAME.EXT; one sample per NAME)")
      ->required();
  pack->add_option("DST_URI", a.uri, "Where the shards go: a directory, s3://bucket/prefix")
      ->required();
  pack->add_option("--shard-size", a.shard_size, "Target shard size (a larger sample gets its own)")
      ->default_str("256M");
  pack->add_option("--name", a.name, "Shard names: NAME-000000.tar")->default_str("shard");
  pack->add_option("--ledger", a.ledger,
                   "The ledger to charge the shards to, under a project (default: "
                   "$SLUICE_LEDGER, else $SLUICE_HOME/ledger.db when it exists)");
  pack->add_flag("--no-progress", a.no_progress, "No progress line, even on a terminal");
  add_common(pack, a);
  pack->callback([&rc, cancel] {
    a.cancel = cancel.flag;
    if (cancel.install) cancel.install();
    rc = run_pack(a);
    if (cancelled(a)) rc = cancel.exit_code();
  });
  add_read(ds, a, cancel, rc);
}

}  // namespace sluice::cli
