// `sluice demo`: a synthetic training job on the embedded default; see demo.h.
#include "demo.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <thread>

#include <xxhash.h>

#include <CLI/CLI.hpp>

#include "command.h"
#include "common.h"
#include "size_flag.h"
#include "sluice/cache/tiered_cache.h"
#include "sluice/ckpt/checkpointer.h"
#include "sluice/core/sizes.h"
#include "sluice/mem/target.h"
#include "sluice/stream/dataset.h"
#include "sluice/stream/pack.h"

extern char** environ;

namespace sluice::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

std::string objects_dir(const DemoOptions& o) {
  return o.dir + "/objects";
}
std::string cache_dir(const DemoOptions& o) {
  return o.dir + "/cache";
}
std::string tier_dir(const DemoOptions& o, const char* name) {
  return o.dir + "/ckpt-" + name;
}
constexpr const char* kPrefix = "train/";
constexpr uint64_t kRamBytes = 64 << 20, kDiskBytes = uint64_t{2} << 30;
constexpr size_t kTokenBytes = 256;

uint64_t splitmix(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

std::string sample_name(uint64_t i) {
  char b[24];
  std::snprintf(b, sizeof b, "%06llu", static_cast<unsigned long long>(i));
  return b;
}

// The dataset: samples of an "input" field (random bytes, mean sample_bytes) and a "label".
Result<double> generate(const DemoOptions& o) {
  auto t0 = Clock::now();
  auto store = store::make_posix_store(objects_dir(o));
  stream::ShardPacker packer(*store, kPrefix, {.shard_bytes = 8 << 20});
  std::vector<std::byte> input;
  uint64_t seed = 42;
  for (uint64_t i = 0; i < o.samples; ++i) {
    std::string key = sample_name(i);
    input.resize(o.sample_bytes / 2 + splitmix(seed) % o.sample_bytes);
    for (size_t j = 0; j + 8 <= input.size(); j += 8) {
      uint64_t v = splitmix(seed);
      std::memcpy(input.data() + j, &v, 8);
    }
    uint32_t label = static_cast<uint32_t>(i % 1000);
    std::string in_name = key + ".input", label_name = key + ".label";
    stream::PackFile files[] = {{in_name, input},
                                {label_name, std::as_bytes(std::span(&label, 1))}};
    SLUICE_RETURN_IF_ERROR(packer.add(key, files));
  }
  SLUICE_RETURN_IF_ERROR(packer.finish());
  return seconds_since(t0);
}

// ---- the child: one run of the job ------------------------------------------------------

class EventLog {
 public:
  explicit EventLog(const std::string& path)
      : fd_(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644)) {}
  ~EventLog() {
    if (fd_ >= 0) ::close(fd_);
  }
  // One line per event, one write each: a SIGKILL loses nothing already logged.
  void write(const json& j) {
    std::string line = j.dump() + "\n";
    if (fd_ >= 0 && ::write(fd_, line.data(), line.size()) < 0) {
      // The report misses the event; the run itself is unaffected.
    }
  }

 private:
  int fd_;
};

struct EpochMeter {
  uint64_t epoch = 0, samples = 0, bytes = 0, first_step = 0;
  bool first_of_run = false;  // its stall includes the wait for the run's first batch
  Clock::time_point start = Clock::now();
  double stall0 = 0;
  cache::CacheStats cache0;
};

json epoch_event(const EpochMeter& m, const stream::LoaderStats& ls, const cache::CacheStats& cs,
                 bool complete, uint64_t last_step) {
  return json{
      {"event", "epoch"},
      {"epoch", m.epoch},
      {"samples", m.samples},
      {"bytes", m.bytes},
      {"seconds", seconds_since(m.start)},
      {"stall_s", ls.stall_seconds - m.stall0 + (m.first_of_run ? ls.first_batch_seconds : 0)},
      {"ram_hit_bytes", cs.ram.hit_bytes - m.cache0.ram.hit_bytes},
      {"nvme_hit_bytes", cs.disk.hit_bytes - m.cache0.disk.hit_bytes},
      {"miss_bytes", cs.miss_bytes - m.cache0.miss_bytes},
      {"first_step", m.first_step},
      {"last_step", last_step},
      {"complete", complete}};
}

Result<std::unique_ptr<ckpt::Checkpointer>> open_checkpointer(const DemoOptions& o) {
  ckpt::CheckpointerOptions co;
  co.series = "demo";
  for (const char* name : {"nvme", "durable"}) {
    SLUICE_ASSIGN_OR_RETURN(ckpt::Tier t, ckpt::open_tier(tier_dir(o, name)));
    t.name = name;
    t.retention = {.keep_last = 2};
    co.tiers.push_back(std::move(t));
  }
  co.staging_bytes = o.model_bytes + (16 << 20);
  return ckpt::Checkpointer::open(std::move(co));
}

// One run of the training job: the dataset through the cache, the model, the loader and
// asynchronous checkpoints of all three.
class TrainingRun {
 public:
  TrainingRun(const DemoOptions& o, EventLog& log, FILE* keys)
      : o_(o), log_(log), keys_(keys), model_(o.model_bytes / 8, 0x5eed) {}

  Status open(bool resume) {
    cache::CacheOptions cop;
    cop.directory = cache_dir(o_);
    cop.ram_bytes = kRamBytes;
    cop.disk_bytes = kDiskBytes;
    SLUICE_ASSIGN_OR_RETURN(
        auto cache_store, cache::TieredCache::open(store::make_posix_store(objects_dir(o_)), cop));
    cache_ = cache_store.get();
    auto t_open = Clock::now();
    SLUICE_ASSIGN_OR_RETURN(ds_, stream::Dataset::open(std::move(cache_store), kPrefix,
                                                       {.catalog_dir = o_.dir + "/catalogs"}));
    log_.write({{"event", "open"},
                {"seconds", seconds_since(t_open)},
                {"from_catalog", ds_->from_catalog()}});
    SLUICE_ASSIGN_OR_RETURN(cp_, open_checkpointer(o_));
    if (resume) SLUICE_RETURN_IF_ERROR(restore());
    cache0_ = cache_->stats();
    loader_.emplace(ds_, stream::LoaderOptions{.seed = 42,
                                               .epochs = 2,
                                               .resume = std::string(token_),
                                               .memory_bytes = 256 << 20,
                                               .inflight = 8});
    return ok();
  }

  Status run(uint64_t crash_at_step) {
    auto device = mem::make_emulated_device(64 << 20);
    meter_.cache0 = cache0_;
    uint64_t step_count = 0;
    while (true) {
      SLUICE_ASSIGN_OR_RETURN(auto batch, loader_->next_batch(o_.batch));
      if (batch.empty()) break;
      if (step_count++ == 0)
        log_.write({{"event", "first_batch"}, {"seconds", loader_->stats().first_batch_seconds}});
      SLUICE_RETURN_IF_ERROR(train_step(batch, *device));
      if (step_ % o_.ckpt_every == 0) {
        auto t_wait = Clock::now();
        SLUICE_RETURN_IF_ERROR(check_pending(true));  // one save in flight at a time
        SLUICE_RETURN_IF_ERROR(save_now(seconds_since(t_wait)));
      } else {
        SLUICE_RETURN_IF_ERROR(check_pending(false));
      }
      if (crash_at_step && step_ == crash_at_step) {
        log_.write(epoch_event(meter_, loader_->stats(), cache_->stats(), false, step_));
        log_.write({{"event", "kill"}, {"step", step_}});
        ::raise(SIGKILL);  // abrupt: no destructor runs, a save may be half-written
      }
    }
    if (have_epoch_)
      log_.write(epoch_event(meter_, loader_->stats(), cache_->stats(), true, step_));
    SLUICE_RETURN_IF_ERROR(check_pending(true));
    // The final state is checkpointed too, as a job does when it ends.
    if (step_ % o_.ckpt_every != 0) {
      SLUICE_RETURN_IF_ERROR(save_now(0));
      SLUICE_RETURN_IF_ERROR(check_pending(true));
    }
    log_.write({{"event", "end"},
                {"steps", step_},
                {"first_batch_s", loader_->stats().first_batch_seconds}});
    return ok();
  }

 private:
  // The model, the loader's token and the step from the latest checkpoint.
  Status restore() {
    SLUICE_ASSIGN_OR_RETURN(uint64_t latest, cp_->latest());
    ckpt::TensorDest dests[] = {{.name = "model", .data = model_.data(), .bytes = o_.model_bytes},
                                {.name = "loader", .data = token_, .bytes = kTokenBytes},
                                {.name = "step", .data = &step_, .bytes = sizeof step_}};
    SLUICE_ASSIGN_OR_RETURN(auto report, cp_->restore(latest, dests));
    json from = json::object();
    for (size_t i = 0; i < report.bytes_by_tier.size(); ++i)
      if (report.bytes_by_tier[i]) from[cp_->options().tiers[i].name] = report.bytes_by_tier[i];
    token_[kTokenBytes - 1] = '\0';
    log_.write({{"event", "restore"},
                {"step", step_},
                {"seconds", report.seconds},
                {"bytes", report.bytes},
                {"from", from},
                {"token", std::string(token_)}});
    return ok();
  }

  // The step: samples to the device (the emulated GPU), a pass over their bytes, and an
  // update of the model; each sample's key goes to the keys file.
  Status train_step(const std::vector<stream::Sample>& batch, mem::Target& device) {
    ++step_;
    auto compute_start = Clock::now();
    SLUICE_ASSIGN_OR_RETURN(auto on_device, stream::copy_batch(batch, device));
    uint64_t h = 0;
    for (const auto& s : batch) {
      if (!have_epoch_) {
        // The first epoch of a run counts from the loader's start: its first reads too.
        meter_.epoch = s.epoch;
        meter_.first_step = step_;
        meter_.first_of_run = true;
        have_epoch_ = true;
      } else if (s.epoch != meter_.epoch) {
        log_.write(epoch_event(meter_, loader_->stats(), cache_->stats(), true, step_ - 1));
        meter_ = EpochMeter{.epoch = s.epoch, .first_step = step_};
        meter_.stall0 = loader_->stats().stall_seconds;
        meter_.cache0 = cache_->stats();
      }
      ++meter_.samples;
      meter_.bytes += s.bytes();
      for (const auto& f : s.fields) h ^= XXH3_64bits(f.data.data(), f.data.size());
      std::fprintf(keys_, "%llu %llu %.*s\n", static_cast<unsigned long long>(step_),
                   static_cast<unsigned long long>(s.epoch), static_cast<int>(s.key.size()),
                   s.key.data());
    }
    std::fflush(keys_);
    model_[step_ % model_.size()] ^= h;
    for (size_t i = step_ % 4096; i < model_.size(); i += 4096) model_[i] += step_;
    std::this_thread::sleep_until(compute_start +
                                  std::chrono::duration<double, std::milli>(o_.compute_ms));
    return ok();
  }

  // The save in flight, when it has finished (or `wait`): logged, and its error returned.
  Status check_pending(bool wait) {
    if (!pending_) return ok();
    if (!wait && !pending_->progress().finished) return ok();
    auto st = pending_->wait();
    json tiers = json::array();
    for (const auto& t : pending_->progress().tiers)
      tiers.push_back({{"tier", t.tier}, {"state", ckpt::to_string(t.state)}});
    log_.write({{"event", "ckpt"},
                {"step", pending_step_},
                {"stall_s", pending_stall_},
                {"waited_s", pending_waited_},
                {"persist_s", seconds_since(pending_start_)},
                {"tiers", tiers},
                {"ok", bool(st)}});
    pending_.reset();
    return st;
  }

  // Saves the model, the loader's token and the step; returns once they are staged.
  Status save_now(double waited) {
    auto t0 = Clock::now();
    std::string tok = loader_->state();
    std::memset(token_, 0, sizeof token_);
    std::memcpy(token_, tok.data(), std::min(tok.size(), kTokenBytes - 1));
    ckpt::TensorView views[] = {
        {.name = "model",
         .dtype = "uint64",
         .shape = {static_cast<int64_t>(model_.size())},
         .data = model_.data(),
         .bytes = o_.model_bytes},
        {.name = "loader", .data = token_, .bytes = kTokenBytes},
        {.name = "step", .dtype = "uint64", .data = &step_, .bytes = sizeof step_}};
    SLUICE_ASSIGN_OR_RETURN(pending_, cp_->save(step_, views));
    pending_step_ = step_;
    pending_start_ = t0;
    pending_stall_ = seconds_since(t0);
    pending_waited_ = waited;
    return ok();
  }

  const DemoOptions& o_;
  EventLog& log_;
  FILE* keys_;
  cache::TieredCache* cache_ = nullptr;  // owned by the dataset's store
  std::shared_ptr<stream::Dataset> ds_;
  std::unique_ptr<ckpt::Checkpointer> cp_;
  // The model: its bytes change every step, so a checkpoint is of real, changing state.
  std::vector<uint64_t> model_;
  char token_[kTokenBytes] = {};
  uint64_t step_ = 0;
  cache::CacheStats cache0_;
  std::optional<stream::Loader> loader_;
  std::shared_ptr<ckpt::SaveHandle> pending_;
  uint64_t pending_step_ = 0;
  Clock::time_point pending_start_;
  double pending_stall_ = 0, pending_waited_ = 0;
  EpochMeter meter_;  // started with the loader
  bool have_epoch_ = false;
};

Status train(const DemoOptions& o, uint64_t crash_at_step, bool resume, EventLog& log, FILE* keys) {
  TrainingRun run(o, log, keys);
  SLUICE_RETURN_IF_ERROR(run.open(resume));
  return run.run(crash_at_step);
}

// ---- the parent: the report ---------------------------------------------------------------

std::vector<json> read_events(const std::string& path) {
  std::vector<json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    json j = json::parse(line, nullptr, false);
    if (j.is_object()) out.push_back(std::move(j));
  }
  return out;
}

// Runs this binary as `sluice demo --child ...`; returns the wait status.
Result<int> spawn_child(const std::string& exe, std::vector<std::string> args) {
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(exe.c_str()));
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (int e = ::posix_spawn(&pid, exe.c_str(), nullptr, nullptr, argv.data(), environ); e != 0)
    return fail_errno(e, "start " + exe);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return fail_errno(errno, "wait for the demo's training run");
  return status;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void print_epoch(const json& e, bool cold) {
  double secs = e.value("seconds", 0.0), samples = e.value("samples", 0.0);
  double ram = e.value("ram_hit_bytes", 0.0), nvme = e.value("nvme_hit_bytes", 0.0),
         miss = e.value("miss_bytes", 0.0), all = std::max(ram + nvme + miss, 1.0);
  std::printf(
      "  epoch %llu %-6s %6.0f samples %6.2f s %8.0f samples/s %10s/s  stall %4.1f%%  "
      "cache RAM %3.0f%% NVMe %3.0f%% source %3.0f%%%s\n",
      static_cast<unsigned long long>(e.value("epoch", 0)), cold ? "(cold)" : "(warm)", samples,
      secs, secs > 0 ? samples / secs : 0,
      format_size(secs > 0 ? e.value("bytes", 0.0) / secs : 0).c_str(),
      secs > 0 ? 100 * e.value("stall_s", 0.0) / secs : 0, 100 * ram / all, 100 * nvme / all,
      100 * miss / all, e.value("complete", true) ? "" : "  (until the kill)");
}

void print_first_batch(const std::vector<json>& events) {
  for (const auto& e : events)
    if (e.value("event", "") == "open")
      std::printf("  dataset open  %.1f ms (%s)\n", 1e3 * e.value("seconds", 0.0),
                  e.value("from_catalog", false) ? "from the node's catalog: no listing"
                                                 : "listed, indexes read, catalog written");
  for (const auto& e : events)
    if (e.value("event", "") == "first_batch")
      std::printf("  first batch   %.1f ms after the loader was opened\n",
                  1e3 * e.value("seconds", 0.0));
}

void print_ckpts(const std::vector<json>& events) {
  std::vector<double> stall, persist, waited;
  std::vector<uint64_t> steps;
  bool all_ok = true;
  for (const auto& e : events)
    if (e.value("event", "") == "ckpt") {
      stall.push_back(e.value("stall_s", 0.0));
      persist.push_back(e.value("persist_s", 0.0));
      waited.push_back(e.value("waited_s", 0.0));
      steps.push_back(e.value("step", uint64_t{0}));
      all_ok = all_ok && e.value("ok", false);
    }
  if (steps.empty()) {
    std::printf("  checkpoints: none completed\n");
    return;
  }
  std::string list;
  for (uint64_t s : steps) list += (list.empty() ? "" : " ") + std::to_string(s);
  std::printf(
      "  checkpoints   steps %s: save() stalled training %.1f ms (median, max %.1f ms); "
      "committed on both tiers %.2f s after (median)%s\n",
      list.c_str(), 1e3 * median(stall), 1e3 * *std::max_element(stall.begin(), stall.end()),
      median(persist), all_ok ? "" : "; SOME FAILED");
  double max_wait = *std::max_element(waited.begin(), waited.end());
  if (max_wait > 0.001)
    std::printf("                waiting for the previous save to commit first: %.1f ms at most\n",
                1e3 * max_wait);
}

// A save can commit in the instant before the kill, before the job logged it: the tiers
// hold the truth, and run 2 restores from them.
void print_unlogged_ckpts(const DemoOptions& o, const std::vector<json>& events) {
  auto cp = open_checkpointer(o);
  if (!cp) return;
  auto steps = (*cp)->list();
  if (!steps) return;
  std::set<uint64_t> logged;
  for (const auto& e : events)
    if (e.value("event", "") == "ckpt") logged.insert(e.value("step", uint64_t{0}));
  for (const ckpt::StepInfo& s : *steps) {
    if (logged.contains(s.step) || s.tiers.empty()) continue;
    std::string on;
    for (const auto& t : s.tiers) on += (on.empty() ? "" : " and ") + t;
    std::printf(
        "                step %llu committed too (on %s), just before the kill: the job "
        "died before it saw so\n",
        static_cast<unsigned long long>(s.step), on.c_str());
  }
}

}  // namespace

int run_training_child(const DemoOptions& o, uint64_t crash_at_step, bool resume,
                       const std::string& events_file) {
  EventLog log(events_file);
  log.write({{"event", "start"}, {"resume", resume}});
  FILE* keys = std::fopen((events_file + ".keys").c_str(), "w");
  if (!keys) return report_error(error_from_errno(errno, "open " + events_file + ".keys"));
  auto st = train(o, crash_at_step, resume, log, keys);
  std::fclose(keys);
  if (!st) {
    log.write({{"event", "error"}, {"message", st.error().to_string()}});
    return report_error(st.error());
  }
  return 0;
}

// The demo's directories, emptied: every run starts from nothing, so it shows a cold
// first epoch.
Status fresh_directories(const DemoOptions& o) {
  std::error_code ec;
  for (const char* d : {"objects", "cache", "ckpt-nvme", "ckpt-durable", "runs", "catalogs"})
    fs::remove_all(o.dir + "/" + d, ec);
  for (const char* d : {"runs", "objects"}) {
    fs::create_directories(o.dir + "/" + d, ec);
    if (ec) return fail_errno(ec.value(), "create " + o.dir + "/" + d);
  }
  return ok();
}

// Generates the dataset and says what the job will do.
Status introduce(const DemoOptions& o) {
  std::printf(
      "sluice demo: a training job on the embedded default (local directories, no daemon)\n");
  SLUICE_ASSIGN_OR_RETURN(double gen, generate(o));
  auto ds = stream::Dataset::open(store::make_posix_store(objects_dir(o)), kPrefix, {});
  if (!ds) return std::unexpected(ds.error());
  std::printf(
      "  dataset      %s/%s: %llu samples in %zu WebDataset shards with indexes (%s), "
      "made in %.1f s\n",
      objects_dir(o).c_str(), kPrefix, static_cast<unsigned long long>((*ds)->samples()),
      (*ds)->shards().size(), format_size(static_cast<double>((*ds)->bytes())).c_str(), gen);
  std::printf("  cache        %s (RAM tier %s, NVMe tier %s)\n", cache_dir(o).c_str(),
              format_size(kRamBytes).c_str(), format_size(static_cast<double>(kDiskBytes)).c_str());
  std::printf("  checkpoints  nvme: %s, durable: %s (a directory standing in for object storage)\n",
              tier_dir(o, "nvme").c_str(), tier_dir(o, "durable").c_str());
  std::printf(
      "  job          2 epochs, batch %u, %.0f ms of compute a step, a %s model, a "
      "checkpoint every %u steps\n\n",
      o.batch, o.compute_ms, format_size(static_cast<double>(o.model_bytes)).c_str(), o.ckpt_every);

  return ok();
}

// Run 2's events: what it restored (returns the step), its epochs and checkpoints.
uint64_t print_resumed_run(const std::vector<json>& ev2) {
  uint64_t restored = 0;
  std::printf("run 2: restarted from the latest checkpoint and the loader's resume token\n");
  for (const auto& e : ev2) {
    std::string kind = e.value("event", "");
    if (kind == "restore") {
      restored = e.value("step", uint64_t{0});
      std::string from;
      for (const auto& [tier, bytes] : e["from"].items())
        from += (from.empty() ? "" : ", ") + tier + " " + format_size(bytes.get<double>());
      std::printf(
          "  restored step %llu in %.3f s, read from %s (checksums verified); "
          "loader token %s\n",
          static_cast<unsigned long long>(restored), e.value("seconds", 0.0), from.c_str(),
          e.value("token", "").c_str());
    } else if (kind == "first_batch" || kind == "open") {
      print_first_batch({e});
    } else if (kind == "epoch") {
      print_epoch(e, false);
    } else if (kind == "error") {
      std::printf("  FAILED: %s\n", e.value("message", "").c_str());
    }
  }
  print_ckpts(ev2);
  return restored;
}

// Exactly once: the steps the final model trained on are run 1's up to the restored step
// and run 2's after it. Each epoch must hold every sample once.
bool exactly_once(const DemoOptions& o, uint64_t restored) {
  std::map<uint64_t, std::map<std::string, int>> seen;
  uint64_t redone = 0;
  for (auto [name, keep_after] : {std::pair{"run1", false}, std::pair{"run2", true}}) {
    std::ifstream in(o.dir + "/runs/" + name + ".keys");
    unsigned long long step = 0, epoch = 0;
    std::string line;
    while (std::getline(in, line)) {
      char key[64];
      if (std::sscanf(line.c_str(), "%llu %llu %63s", &step, &epoch, key) != 3) continue;
      if (!keep_after && step > restored) {
        ++redone;
        continue;
      }
      ++seen[epoch][key];
    }
  }
  bool once = seen.size() == 2;
  std::string verdict;
  for (const auto& [epoch, keys] : seen) {
    uint64_t single = 0;
    for (const auto& [k, n] : keys) single += n == 1;
    once = once && keys.size() == o.samples && single == o.samples;
    verdict += (verdict.empty() ? "" : "; ") + std::string("epoch ") + std::to_string(epoch) +
               ": " + std::to_string(single) + " of " + std::to_string(o.samples) + " samples once";
  }
  std::printf(
      "\nexactly once across the kill: %s (%llu samples after step %llu were trained "
      "again, as the model had lost them) %s\n",
      verdict.c_str(), static_cast<unsigned long long>(redone),
      static_cast<unsigned long long>(restored), once ? "OK" : "FAILED");
  return once;
}

int run_training_demo(const DemoOptions& o, const std::string& self_exe) {
  auto t0 = Clock::now();
  if (Status st = fresh_directories(o); !st) return report_error(st.error());
  const uint64_t steps_per_epoch = (o.samples + o.batch - 1) / o.batch;
  const uint64_t crash_at = steps_per_epoch + steps_per_epoch / 2 + o.ckpt_every / 3;
  if (Status st = introduce(o); !st) return report_error(st.error());
  auto child = [&](const char* name, std::vector<std::string> extra) {
    std::vector<std::string> args = {"demo",      "--child",
                                     "--events",  o.dir + "/runs/" + name,
                                     "--samples", std::to_string(o.samples)};
    args.insert(args.end(), extra.begin(), extra.end());
    return spawn_child(self_exe, args);
  };
  std::fflush(stdout);
  auto st1 = child("run1", {"--crash-at-step", std::to_string(crash_at)});
  if (!st1) return report_error(st1.error());
  auto ev1 = read_events(o.dir + "/runs/run1");
  std::printf("run 1: from scratch; killed with SIGKILL at step %llu, mid-way through epoch 1\n",
              static_cast<unsigned long long>(crash_at));
  if (!WIFSIGNALED(*st1) || WTERMSIG(*st1) != SIGKILL) {
    std::printf("  the run did not die as planned (status %d)\n", *st1);
    return 1;
  }
  print_first_batch(ev1);
  for (const auto& e : ev1)
    if (e.value("event", "") == "epoch") print_epoch(e, e.value("epoch", 0) == 0);
  print_ckpts(ev1);
  print_unlogged_ckpts(o, ev1);

  auto st2 = child("run2", {"--resume"});
  if (!st2) return report_error(st2.error());
  const uint64_t restored = print_resumed_run(read_events(o.dir + "/runs/run2"));
  if (!WIFEXITED(*st2) || WEXITSTATUS(*st2) != 0) {
    std::printf("run 2 failed (status %d)\n", *st2);
    return 1;
  }
  const bool once = exactly_once(o, restored);
  std::printf("sluice demo: %s in %.1f s (the data-path comparison is `sluice demo --bench`)\n",
              once ? "done" : "FAILED", seconds_since(t0));
  return once ? 0 : 1;
}

// The embedded default's main job (demo.h), or with --bench the data-path comparison.
void add_demo_command(CLI::App& app, const CommandContext& ctx) {
  static DemoOptions o;
  static uint64_t demo_size = 256ull << 20;
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
  cmd->callback([home = ctx.home, &rc = *ctx.rc] {
    o.dir = home + "/demo";
    // About two checkpoints an epoch, at most one per 100 steps (the parent and the
    // child compute the same from --samples).
    uint64_t steps_per_epoch = (o.samples + o.batch - 1) / o.batch;
    o.ckpt_every = static_cast<unsigned>(std::clamp<uint64_t>(steps_per_epoch / 2, 5, 100));
    if (bench) {
      rc = run_bench_demo(home, demo_size);
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

}  // namespace sluice::cli
