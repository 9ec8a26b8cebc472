// The ledger's side of bench/ledger_compare.py: reserve/commit pairs per second, with W
// writers charging one team (the worst case: every pair updates the same account row).
// One measurement per run, printed as one JSON line; the script interleaves runs with
// pgbench and takes medians.
//
//   sluice_ledger_bench --ledger URI --writers 16 --seconds 5 [--separate]
//
// Writers are threads sharing one Ledger (its connection pool, or SQLite's one
// connection), or with --separate each its own Ledger (own connections: what separate
// processes do).
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "sluice/ledger/ledger.h"

namespace {

using namespace sluice;
using namespace sluice::ledger;

[[noreturn]] void die(const std::string& what, const Error& e) {
  std::fprintf(stderr, "ledger_bench: %s: %s\n", what.c_str(), e.to_string().c_str());
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"reserve/commit pairs per second against a ledger"};
  std::string uri;
  unsigned writers = 1;
  double seconds = 5;
  bool separate = false;
  app.add_option("--ledger", uri, "SQLite path or postgresql:// URI")->required();
  app.add_option("--writers", writers, "Concurrent writers")->check(CLI::Range(1u, 256u));
  app.add_option("--seconds", seconds, "How long to run")->check(CLI::Range(0.1, 3600.0));
  app.add_flag("--separate", separate, "One Ledger (own connections) per writer");
  CLI11_PARSE(app, argc, argv);

  LedgerOptions lo;
  lo.max_connections = writers;
  auto first = Ledger::open(uri, lo);
  if (!first) die("open " + uri, first.error());
  std::shared_ptr<Ledger> shared(std::move(*first));
  // Set up once per ledger; a second run finds it there.
  (void)shared->add_team("bench");
  (void)shared->add_project(
      Project{.id = "bench-p", .team = "bench", .location = "s3://bench/p", .tier = Tier::kObject});
  if (auto s = shared->set_limits(
          "bench", Tier::kObject,
          Limits{.hard_bytes = int64_t{1} << 60, .hard_objects = int64_t{1} << 60});
      !s)
    die("set limits", s.error());
  ChargeTarget t{"bench-p", "bench", Tier::kObject, Kind::kScratch};

  std::vector<std::shared_ptr<Ledger>> ledgers(writers, shared);
  if (separate) {
    LedgerOptions one;
    one.max_connections = 1;
    for (auto& l : ledgers) {
      auto o = Ledger::open(uri, one);
      if (!o) die("open " + uri, o.error());
      l = std::move(*o);
    }
  }
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> pairs{0}, errors{0};
  std::vector<std::thread> threads;
  auto t0 = std::chrono::steady_clock::now();
  for (unsigned w = 0; w < writers; ++w) {
    threads.emplace_back([&, w] {
      Ledger& l = *ledgers[w];
      uint64_t mine = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        auto r = l.reserve(t, 1024, 1);
        if (!r || !l.commit(*r, t, 1024, 1)) {
          ++errors;
          continue;
        }
        ++mine;
      }
      pairs += mine;
    });
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& th : threads) th.join();
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  nlohmann::json out{
      {"writers", writers},      {"separate", separate},
      {"seconds", elapsed},      {"pairs", pairs.load()},
      {"errors", errors.load()}, {"pairs_per_s", static_cast<double>(pairs.load()) / elapsed}};
  std::printf("%s\n", out.dump().c_str());
  return errors.load() ? 1 : 0;
}
