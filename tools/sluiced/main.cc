// sluiced: the node daemon. Owns the node's cache directory and serves it to every local
// process over a Unix socket, and to the job's other daemons over HTTP (docs/sluiced.md).
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <mutex>
#include <thread>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cache_flags.h"
#include "common.h"
#include "config.h"
#include "size_flag.h"
#include "sluice/client/daemon.h"
#include "sluice/client/environment.h"
#include "sluice/core/sizes.h"
#include "sluice/node/server.h"

namespace {

using namespace sluice;
using Json = nlohmann::json;
using sluiced::Args;

void log_line(std::string_view line) {
  static std::mutex mu;
  std::time_t now = std::time(nullptr);
  std::tm utc{};
  char when[32];
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", ::gmtime_r(&now, &utc));
  std::lock_guard lock(mu);
  std::fprintf(stderr, "%s sluiced: %.*s\n", when, static_cast<int>(line.size()), line.data());
}

// Fills settings not given as flags from the JSON config file.
Result<Json> apply_config(Args& a, const CLI::App& app) {
  if (a.config.empty()) return Json();
  SLUICE_ASSIGN_OR_RETURN(std::string text, read_small_file(a.config, "config"));
  return sluiced::apply_config(a, text, a.config,
                               [&](const char* flag) { return app.count(flag) > 0; });
}

// SIGTERM and SIGINT are taken by one thread (sigwait), so no handler runs inside the
// server's threads; every thread started after this inherits the mask.
sigset_t block_stop_signals() {
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  return stop_signals;
}

// The cache's word that the RAM tier's buffers are allocated and touched (--prefault-ram).
void log_prefaulted(uint64_t bytes, double seconds, const Status& outcome) {
  if (!outcome) {
    log_line("RAM tier: " + outcome.error().to_string() +
             "; the rest is allocated as chunks arrive");
    return;
  }
  char took[32];
  std::snprintf(took, sizeof took, "%.2f s", seconds);
  log_line("RAM tier ready: " + format_size(static_cast<double>(bytes)) +
           " allocated and touched in " + took + " (--no-prefault-ram: as chunks arrive)");
}

int run(Args& a, const CLI::App& app) {
  auto teams_json = apply_config(a, app);
  if (!teams_json) return cli::report_error(teams_json.error());
  client::SessionOverrides given;
  given.aws = a.aws;
  given.ledger = a.ledger;
  if (Status s = cli::apply_cache_flags(a.cache, given); !s) return cli::report_error(s.error());
  given.daemon_socket = a.socket;  // the socket it serves on (the flags' --daemon is a client's)
  auto so = client::session_options_from_environment(given, client::Profile::kDaemon);
  if (!so) return cli::report_error(so.error());
  so->cache.prefault_ram = a.prefault_ram;
  so->cache.prefaulted = log_prefaulted;
  const client::Session session(std::move(*so));
  const std::string& home = session.options().home;
  auto server_options = client::daemon_options(session);
  if (!server_options) return cli::report_error(server_options.error());
  node::ServerOptions o = std::move(*server_options);
  if (!teams_json->is_null()) {
    auto teams = sluiced::parse_teams(*teams_json, a.config, a.aws, session.options().s3);
    if (!teams) return cli::report_error(teams.error());
    o.teams = std::move(*teams);
  }
  o.access_ttl = std::chrono::seconds(a.access_ttl_s);
  o.max_connections = a.max_connections;
  o.max_connections_per_uid = a.max_per_uid;
  o.idle_timeout = std::chrono::seconds(a.idle_s);
  auto windows = parse_size(a.window_memory);
  if (!windows) return cli::report_error(windows.error().with_context("--window-memory"));
  o.max_window_bytes = *windows;
  o.log = log_line;
  if (Status p = sluiced::configure_peers(a, o.peer); !p) return cli::report_error(p.error());
  if (o.peer.membership)
    o.peer.objects_directory = a.objects_dir.empty() ? home + "/peer-objects" : a.objects_dir;
  const bool has_peers = o.peer.membership != nullptr;
  const size_t members = has_peers ? o.peer.membership->members().size() : 0;

  sigset_t stop_signals = block_stop_signals();

  const std::string dir = o.cache.directory, socket = o.socket_path, s3 = o.s3_endpoint;
  const std::string ledger_where = o.ledger ? o.ledger->describe() : "";
  auto server = node::NodeServer::open(std::move(o));
  if (!server) return cli::report_error(server.error());
  log_line("serving " + dir + " on " + socket + " (pid " + std::to_string(::getpid()) + ", " +
           (*server)->cache().stats().io_path + "); s3:// from " + s3);
  if (!ledger_where.empty())
    log_line("charging chunks kept on NVMe to their teams in the ledger " + ledger_where);
  if ((*server)->peer_port() != 0)
    log_line("HTTP on port " + std::to_string((*server)->peer_port()) + ": /metrics" +
             (has_peers ? ", chunks for " + cli::count_of(members - 1, "peer") : ""));
  // Socket bound and cache open: what start-up needed is not kept for serving.
  auto privileges = (*server)->drop_privileges();
  if (!privileges) return cli::report_error(privileges.error().with_context("sluiced"));
  log_line(privileges->describe());
  std::thread signals([&] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    log_line(std::string("stopping on ") + (sig == SIGTERM ? "SIGTERM" : "SIGINT"));
    (*server)->stop();
  });
  Status s = (*server)->serve();
  if (!s) {
    log_line("serve: " + s.error().to_string());
    pthread_kill(signals.native_handle(), SIGTERM);
  }
  signals.join();
  node::ServerStats st = (*server)->stats();
  server->reset();  // finishes queued NVMe writes, removes the socket
  log_line("stopped after " + std::to_string(st.connections) + " connections, " +
           std::to_string(st.requests) + " requests");
  return s ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{
      "sluiced: the node daemon. Owns the node's cache directory (RAM and NVMe tiers) "
      "and serves it to every process on the node over a Unix socket (sluice and the "
      "library use it for --cache and node+ URIs), and to the job's other daemons over HTTP "
      "(--peers)."};
  app.add_option("--socket", a.socket,
                 "Unix socket to serve on (default $SLUICE_HOME/sluiced.sock)");
  app.add_option("--config", a.config,
                 "JSON config file: any of the flags' settings, and the teams "
                 "(docs/sluiced.md); flags given win")
      ->check(CLI::ExistingFile);
  cli::add_cache_flags(&app, a.cache, client::Profile::kDaemon);
  app.add_flag("--prefault-ram,!--no-prefault-ram", a.prefault_ram,
               "Allocate and touch the RAM tier's memory from the start, in the background "
               "(default), not as chunks first arrive: memory is slow to touch the first "
               "time");
  app.add_option("--max-connections", a.max_connections, "Connections served at once")
      ->default_val(256);
  app.add_option("--max-connections-per-uid", a.max_per_uid, "Connections one uid may hold")
      ->default_val(64);
  app.add_option("--idle-timeout", a.idle_s, "How long an idle connection is kept (300s, 5m)")
      ->transform(sluice::cli::seconds_validator(1, 86400))
      ->default_str("5m");
  app.add_option("--window-memory", a.window_memory,
                 "Shared-memory reply windows of all connections together (one per reading "
                 "connection, 8 MiB; bytes not handed off as descriptors go there instead of "
                 "through the socket); past it, replies carry the bytes")
      ->default_val("512M");
  app.add_option("--ledger", a.ledger,
                 "Charge chunks kept on NVMe to the teams owning their objects' projects, "
                 "within their nvme quotas (sqlite:///PATH or postgresql://...; docs/ledger.md). "
                 "Default: $SLUICE_LEDGER when set, else nothing is charged");
  app.add_option("--peer-listen", a.peer_listen,
                 "HOST:PORT (IPv4) of the HTTP port: /metrics, and chunks for peer daemons");
  app.add_option("--peers", a.peers,
                 "The job's daemons: a host list file ('NAME HOST:PORT [fetch-only]' a line), "
                 "or 'slurm' (SLURM_JOB_NODELIST, each on the --peer-listen port)");
  app.add_option("--node-name", a.node_name,
                 "This daemon's name in --peers (default: the short host name)");
  app.add_option("--node-secret-file", a.secret_file,
                 "File whose first line is the secret the job's daemons share (mode 600, "
                 ">= 16 bytes); required with --peers");
  app.add_option(
      "--objects-dir", a.objects_dir,
      "Where the job's members keep objects on this node (checkpoints' peer tier, "
      "sluiced://NAME@HOST:PORT/ URIs); with --peers. Default: $SLUICE_HOME/peer-objects");
  app.add_option("--peer-file-root", a.peer_file_roots,
                 "A file:// root whose files peers may fetch from this daemon (and it from "
                 "them), read with the daemon's rights; repeat for more. Default: none");
  app.add_option("--peer-timeout-ms", a.peer_timeout_ms,
                 "A chunk from a peer slower than this comes from the backing store")
      ->default_val(10000);
  app.add_option("--access-ttl", a.access_ttl_s,
                 "How long a team's proven access to an object (teams with their own "
                 "credentials in --config) is remembered (60s, 5m)")
      ->transform(sluice::cli::seconds_validator(0, 86400))
      ->default_str("60s");
  app.add_option("--endpoint-url", a.aws.endpoint_url, "S3 endpoint for s3:// roots");
  app.add_option("--region", a.aws.region, "S3 region");
  app.add_option("--profile", a.aws.profile, "AWS profile for S3 credentials");
  CLI11_PARSE(app, argc, argv);
  return run(a, app);
}
