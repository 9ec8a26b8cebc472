// sluice's side of bench/ckpt_compare.py: one save or one restore of a model state of N
// float32 tensors through ckpt::Checkpointer, timed from inside, printed as one JSON line.
//
//   sluice_ckpt_bench save --dir D --bytes 2G --tensors 128 --step S
//     memcpy_s   the same bytes memcpy'd into already-touched memory (the stall's anchor)
//     stall_s    save() until it returned (bytes staged; training may go on)
//     durable_s  save() until the local tier committed (fdatasync'd, renamed, manifest)
//     total_s    save() until every tier committed
//     save_cpu_s the process's CPU seconds (user + system, every thread) over total_s
//   sluice_ckpt_bench restore --dir D --step S
//     restore_s  restore() into already-allocated, touched buffers, every chunk verified
//     restore_cpu_s  the process's CPU seconds over restore_s
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cpu_seconds.h"
#include "sluice/ckpt/checkpointer.h"

namespace {

using namespace sluice;
using bench::cpu_seconds;
using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

int die(const Error& e) {
  std::fprintf(stderr, "sluice_ckpt_bench: %s\n", e.message().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"sluice checkpoint benchmark (see bench/ckpt_compare.py)"};
  std::string mode, dir;
  uint64_t bytes = uint64_t{2} << 30, step = 1;
  unsigned tensors = 128;
  app.add_option("MODE", mode, "save or restore")
      ->required()
      ->check(CLI::IsMember({"save", "restore"}));
  app.add_option("--dir", dir, "The local tier's directory")->required();
  app.add_option("--bytes", bytes, "State size in bytes");
  app.add_option("--tensors", tensors, "Tensors in the state")->check(CLI::Range(1u, 100000u));
  app.add_option("--step", step, "The step to save or restore");
  CLI11_PARSE(app, argc, argv);

  ckpt::CheckpointerOptions o;
  o.series = "bench";
  auto tier = ckpt::open_tier(dir);
  if (!tier) return die(tier.error());
  o.tiers.push_back(*tier);
  const uint64_t per = bytes / tensors / 4 * 4;
  // The budget holds the whole state, so save() costs one copy into memory touched at open.
  o.staging_bytes = mode == "save" ? per * tensors + (uint64_t{64} << 20) : 0;
  auto cp = ckpt::Checkpointer::open(o);
  if (!cp) return die(cp.error());

  // The state: touched once, as a model's parameters are.
  std::vector<std::vector<float>> state(tensors);
  std::mt19937 rng(static_cast<unsigned>(step));
  for (auto& t : state) {
    t.resize(per / 4);
    for (size_t i = 0; i < t.size(); i += 1024) t[i] = static_cast<float>(rng());
  }
  nlohmann::json out = {{"mode", mode}, {"bytes", per * tensors}, {"tensors", tensors}};
  if (mode == "save") {
    // The anchor: the same bytes into memory already touched.
    std::vector<std::byte> copy(per * tensors);
    std::memset(copy.data(), 1, copy.size());
    auto t0 = Clock::now();
    for (unsigned i = 0; i < tensors; ++i) std::memcpy(copy.data() + i * per, state[i].data(), per);
    out["memcpy_s"] = since(t0);

    std::vector<ckpt::TensorView> views;
    for (unsigned i = 0; i < tensors; ++i)
      views.push_back({"layer." + std::to_string(i) + ".weight",
                       "float32",
                       {static_cast<int64_t>(per / 4)},
                       state[i].data(),
                       per,
                       nullptr,
                       {}});
    const double c0 = cpu_seconds();
    t0 = Clock::now();
    auto h = (*cp)->save(step, views);
    if (!h) return die(h.error());
    out["stall_s"] = since(t0);
    if (auto st = (*h)->wait_tier(0); !st) return die(st.error());
    out["durable_s"] = since(t0);
    if (auto st = (*h)->wait(); !st) return die(st.error());
    out["total_s"] = since(t0);
    out["save_cpu_s"] = cpu_seconds() - c0;
  } else {
    std::vector<ckpt::TensorDest> dests;
    for (unsigned i = 0; i < tensors; ++i)
      dests.push_back(
          {"layer." + std::to_string(i) + ".weight", -1, state[i].data(), per, nullptr});
    const double c0 = cpu_seconds();
    auto t0 = Clock::now();
    auto r = (*cp)->restore(step, dests);
    if (!r) return die(r.error());
    out["restore_s"] = since(t0);
    out["restore_cpu_s"] = cpu_seconds() - c0;
  }
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
