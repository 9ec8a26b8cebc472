// The sluice command line. Only this layer reads the environment and prints; each group of
// commands lives in its own file and is added here from one table (command.h).
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>

#include "command.h"
#include "common.h"
#include "sluice/client/environment.h"
#include "sluice/core/sizes.h"

namespace {

using namespace sluice;
using namespace sluice::cli;

// SIGINT and SIGTERM during a long command (a copy, a save): the first asks it to stop
// (writers are aborted, so no temporary file or open multipart upload is left) and sluice
// exits 128+signal; a second one exits at once.
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
  const CommandContext ctx{client::home_from_environment(),
                           CancelHook{&g_cancel, catch_stop_signals, &g_signal}, &rc};
  for (AddCommands add :
       {add_bench_command, add_demo_command, add_cp_command, add_cache_commands, add_ckpt_commands,
        add_dataset_commands, add_ledger_commands, add_gc_commands, add_doctor_command})
    add(app, ctx);
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
