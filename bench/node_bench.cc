// sluice_node_bench: small-object reads through sluiced from another process, for
// bench/sluiced_compare.py's small-object case. T threads read random keys of N objects
// (whole, size bytes each) for D seconds through one node::NodeStore, or with pread on the
// files themselves (--local DIR, the page-cache reference), and print one JSON line: ops/s
// and latency percentiles.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "sluice/node/client.h"

int main(int argc, char** argv) {
  std::string socket, root, local, prefix = "obj-";
  unsigned keys = 1000, threads = 1;
  size_t size = 4096;
  double seconds = 3;
  CLI::App app{"Small-object reads through sluiced (or pread on the files), as JSON"};
  app.add_option("--socket", socket, "sluiced's socket");
  app.add_option("--root", root, "root URI the objects are under (file:///dir)");
  app.add_option("--local", local, "read DIR/<key> with pread instead (reference)");
  app.add_option("--prefix", prefix, "keys are <prefix><6-digit index>");
  app.add_option("--keys", keys, "number of objects");
  app.add_option("--size", size, "bytes read per object");
  app.add_option("--threads", threads, "reader threads");
  app.add_option("--seconds", seconds, "how long to read");
  CLI11_PARSE(app, argc, argv);
  if (threads == 0 || keys == 0) return 2;

  std::unique_ptr<sluice::node::NodeStore> store;
  if (local.empty()) {
    sluice::node::NodeOptions o;
    o.socket = socket;
    auto s = sluice::node::NodeStore::open(root, o);
    if (!s) {
      std::fprintf(stderr, "node_bench: %s\n", s.error().to_string().c_str());
      return 1;
    }
    store = std::move(*s);
  }
  auto key_of = [&](unsigned i) {
    char k[32];
    std::snprintf(k, sizeof k, "%06u", i);
    return prefix + k;
  };
  std::atomic<bool> stop{false}, failed{false};
  std::vector<std::vector<uint32_t>> lat_ns(threads);
  std::vector<std::thread> pool;
  auto t0 = std::chrono::steady_clock::now();
  for (unsigned t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      std::mt19937 rng(t + 1);
      std::vector<std::byte> buf(size);
      auto& lat = lat_ns[t];
      lat.reserve(1 << 20);
      while (!stop.load(std::memory_order_relaxed)) {
        std::string key = key_of(static_cast<unsigned>(rng() % keys));
        auto a = std::chrono::steady_clock::now();
        size_t got = 0;
        if (store) {
          auto n = store->read(key, 0, buf);
          if (!n) {
            std::fprintf(stderr, "node_bench: %s\n", n.error().to_string().c_str());
            failed = true;
            return;
          }
          got = *n;
        } else {
          int fd = ::open((local + "/" + key).c_str(), O_RDONLY | O_CLOEXEC);
          ssize_t n = fd < 0 ? -1 : ::pread(fd, buf.data(), buf.size(), 0);
          if (fd >= 0) ::close(fd);
          if (n < 0) {
            std::perror("node_bench: pread");
            failed = true;
            return;
          }
          got = static_cast<size_t>(n);
        }
        if (got != size) {
          std::fprintf(stderr, "node_bench: %s: %zu bytes, not %zu\n", key.c_str(), got, size);
          failed = true;
          return;
        }
        auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now() - a)
                      .count();
        lat.push_back(static_cast<uint32_t>(std::min<int64_t>(ns, UINT32_MAX)));
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& th : pool) th.join();
  double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (failed) return 1;
  std::vector<uint32_t> all;
  for (auto& l : lat_ns) all.insert(all.end(), l.begin(), l.end());
  std::sort(all.begin(), all.end());
  auto pct = [&](double q) {
    return all.empty() ? 0.0
                       : all[std::min(all.size() - 1, static_cast<size_t>(q * all.size()))] / 1e3;
  };
  std::printf("%s\n", nlohmann::json({{"threads", threads},
                                      {"ops", all.size()},
                                      {"ops_per_s", all.size() / wall},
                                      {"p50_us", pct(0.5)},
                                      {"p99_us", pct(0.99)}})
                          .dump()
                          .c_str());
  return 0;
}
