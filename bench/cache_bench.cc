// The tiered cache's side of bench/cache_compare.py: warm reads from the NVMe tier and from
// the RAM tier, a memcpy of the same bytes, and the hit ratios of each policy on the
// 1.5x trace. One measurement per run, printed as one JSON line; the script interleaves
// runs with fio and takes medians.
//
//   sluice_cache_bench prepare --data D --cache C --size 1G   # write D/big.bin, fill C
//   sluice_cache_bench nvme|ram|memcpy --data D --cache C --threads 4
//   sluice_cache_bench trace
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cpu_seconds.h"
#include "sluice/cache/tiered_cache.h"
#include "sluice/mem/buffer_pool.h"

namespace {

using namespace sluice;
using bench::cpu_seconds;
constexpr uint64_t kChunk = 4 << 20;

[[noreturn]] void die(const std::string& what, const Error& e) {
  std::fprintf(stderr, "cache_bench: %s: %s\n", what.c_str(), e.to_string().c_str());
  std::exit(1);
}

AlignedBuffer touched(size_t n) {
  auto b = AlignedBuffer::allocate(n);
  if (!b) die("allocate", b.error());
  std::memset(b->data(), 1, n);  // first touch outside the timed part
  return std::move(*b);
}

std::unique_ptr<cache::TieredCache> open_cache(const std::string& data, const std::string& dir,
                                               uint64_t ram) {
  auto backing = store::open_store("file://" + data);
  if (!backing) die("open " + data, backing.error());
  cache::CacheOptions o;
  o.directory = dir;
  o.ram_bytes = ram;
  o.disk_bytes = 64ULL << 30;
  o.offline = true;  // the data does not change under the benchmark
  auto c = cache::TieredCache::open(std::move(*backing), o);
  if (!c) die("open cache " + dir, c.error());
  return std::move(*c);
}

// A timed pass: its wall-clock seconds and the process's CPU seconds over it.
struct Timed {
  double seconds = 0, cpu_s = 0;
};

// Reads big.bin chunk by chunk with `threads` readers.
Timed read_all(store::Store& s, uint64_t size, unsigned threads) {
  const double c0 = cpu_seconds();
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> ts;
  std::atomic<bool> failed{false};
  for (unsigned t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      AlignedBuffer buf = touched(kChunk);
      for (uint64_t off = t * kChunk; off < size; off += threads * kChunk) {
        auto n = s.read_full("big.bin", off, std::span(buf.data(), std::min(kChunk, size - off)));
        if (!n) {
          std::fprintf(stderr, "cache_bench: %s\n", n.error().to_string().c_str());
          failed = true;
          return;
        }
      }
    });
  }
  for (auto& t : ts) t.join();
  if (failed) std::exit(1);
  return {std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
          cpu_seconds() - c0};
}

Timed memcpy_all(uint64_t size, unsigned threads) {
  AlignedBuffer src = touched(size);
  std::vector<AlignedBuffer> dst;
  for (unsigned t = 0; t < threads; ++t) dst.push_back(touched(kChunk));
  const double c0 = cpu_seconds();
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> ts;
  for (unsigned t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      for (uint64_t off = t * kChunk; off < size; off += threads * kChunk) {
        std::memcpy(dst[t].data(), src.data() + off, std::min(kChunk, size - off));
      }
    });
  }
  for (auto& t : ts) t.join();
  return {std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
          cpu_seconds() - c0};
}

void trace() {
  const size_t cache_chunks = 1000, dataset = 1500;
  std::vector<cache::ChunkId> order(dataset);
  std::iota(order.begin(), order.end(), 0);
  std::vector<std::vector<cache::ChunkId>> loop(3, order), shuffled;
  std::mt19937_64 rng(7);
  for (int e = 0; e < 3; ++e) {
    std::shuffle(order.begin(), order.end(), rng);
    shuffled.push_back(order);
  }
  nlohmann::json out = nlohmann::json::array();
  auto row = [&](const char* trace_name, const char* policy, cache::PolicyKind k,
                 const std::vector<std::vector<cache::ChunkId>>& epochs, cache::TraceDeclare d) {
    auto p = cache::make_policy(k, cache_chunks * kChunk);
    out.push_back({{"trace", trace_name},
                   {"policy", policy},
                   {"epochs", cache::replay_trace(*p, epochs, kChunk, d)}});
  };
  using cache::PolicyKind;
  using cache::TraceDeclare;
  for (auto* epochs : {&loop, &shuffled}) {
    const char* name = epochs == &loop ? "in order" : "reshuffled";
    row(name, "lru", PolicyKind::kLru, *epochs, TraceDeclare::kNothing);
    row(name, "s3fifo", PolicyKind::kS3Fifo, *epochs, TraceDeclare::kNothing);
    row(name, "declared", PolicyKind::kDeclared, *epochs, TraceDeclare::kEachEpoch);
    row(name, "optimum", PolicyKind::kDeclared, *epochs, TraceDeclare::kAll);
  }
  std::printf("%s\n", out.dump().c_str());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"sluice_cache_bench: one cache measurement, as JSON"};
  std::string mode, data, dir, size_text = "1G";
  unsigned threads = 4;
  app.add_option("MODE", mode, "prepare, nvme, ram, memcpy or trace")->required();
  app.add_option("--data", data, "Directory of big.bin (the backing store)");
  app.add_option("--cache", dir, "Cache directory");
  app.add_option("--size", size_text, "Bytes of big.bin (prepare): 1G, 512M");
  app.add_option("--threads", threads, "Readers")->default_val(4);
  CLI11_PARSE(app, argc, argv);
  if (mode == "trace") {
    trace();
    return 0;
  }
  if (data.empty() || (dir.empty() && mode != "memcpy")) {
    std::fprintf(stderr, "cache_bench: --data and --cache are needed\n");
    return 2;
  }
  std::string big = data + "/big.bin";
  if (mode == "prepare") {
    uint64_t size = std::stoull(size_text) << (size_text.ends_with('G')   ? 30
                                               : size_text.ends_with('M') ? 20
                                                                          : 0);
    std::filesystem::create_directories(data);
    std::FILE* f = std::fopen(big.c_str(), "wb");
    if (!f) return 1;
    std::vector<char> block(kChunk);
    std::mt19937_64 rng(1);
    for (uint64_t done = 0; done < size; done += kChunk) {
      for (size_t i = 0; i < block.size(); i += 8) {
        uint64_t v = rng();
        std::memcpy(&block[i], &v, 8);
      }
      std::fwrite(block.data(), 1, std::min<uint64_t>(kChunk, size - done), f);
    }
    std::fclose(f);
    // Fills the NVMe tier. Writes go behind the reads through a bounded queue, and a fill
    // that finds it full skips the NVMe tier: pass again until every chunk is there.
    for (int pass = 0; pass < 10; ++pass) {
      auto c = open_cache(data, dir, 0);
      read_all(*c, size, threads);
      if (pass > 0 && c->stats().misses == 0) return 0;
    }  // closing a cache drains its NVMe writes
    std::fprintf(stderr, "cache_bench: the NVMe tier did not fill in 10 passes\n");
    return 1;
  }
  uint64_t size = std::filesystem::file_size(big);
  Timed timed;
  if (mode == "memcpy") {
    timed = memcpy_all(size, threads);
  } else if (mode == "nvme") {
    auto c = open_cache(data, dir, 0);
    timed = read_all(*c, size, threads);
    auto s = c->stats();
    if (s.misses != 0) {
      std::fprintf(stderr, "cache_bench: %lu misses: run prepare first\n",
                   static_cast<unsigned long>(s.misses));
      return 1;
    }
  } else if (mode == "ram") {
    auto c = open_cache(data, dir, size + (64 << 20));
    read_all(*c, size, threads);  // NVMe -> RAM, not timed
    timed = read_all(*c, size, threads);
  } else {
    std::fprintf(stderr, "cache_bench: unknown mode %s\n", mode.c_str());
    return 2;
  }
  std::printf("%s\n",
              nlohmann::json({{"mode", mode},
                              {"bytes", size},
                              {"seconds", timed.seconds},
                              {"cpu_s", timed.cpu_s},
                              {"gib_s", static_cast<double>(size) / timed.seconds / (1 << 30)}})
                  .dump()
                  .c_str());
  return 0;
}
