// sluiced: the node daemon. Owns the node's cache directory and serves it to every local
// process over a Unix socket (docs/operations/sluiced.md).
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <fstream>
#include <mutex>
#include <thread>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "aws_config.h"
#include "cache_flags.h"
#include "common.h"
#include "sluice/node/server.h"
#include "sluice/s3/store.h"

namespace {

using namespace sluice;
using Json = nlohmann::json;

struct Args {
  cli::CacheFlags cache;
  cli::AwsFlags aws;
  std::string socket, config;
  unsigned max_connections = 256, max_per_uid = 64;
  unsigned idle_s = 300;
};

void log_line(std::string_view line) {
  static std::mutex mu;
  std::time_t now = std::time(nullptr);
  char when[32];
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  std::lock_guard lock(mu);
  std::fprintf(stderr, "%s sluiced: %.*s\n", when, static_cast<int>(line.size()), line.data());
}

// Teams from the config file: [{"name": "vision", "uids": [1001], "roots": ["s3://b/"]}].
Result<std::vector<node::TeamGrant>> parse_teams(const Json& teams, const std::string& file) {
  std::vector<node::TeamGrant> out;
  auto bad = [&](const std::string& why) {
    return fail(Code::kInvalidArgument, file + ": teams: " + why);
  };
  if (!teams.is_array()) return bad("must be a list");
  for (const Json& t : teams) {
    if (!t.is_object() || !t.contains("name") || !t["name"].is_string())
      return bad("each team needs a \"name\"");
    node::TeamGrant g;
    g.name = t["name"].get<std::string>();
    if (!t.contains("uids") || !t["uids"].is_array())
      return bad(g.name + ": \"uids\" must be a list");
    for (const Json& u : t["uids"]) {
      if (!u.is_number_unsigned() || u.get<uint64_t>() > UINT32_MAX)
        return bad(g.name + ": uids are unsigned integers");
      g.uids.push_back(u.get<uint32_t>());
    }
    if (!t.contains("roots") || !t["roots"].is_array())
      return bad(g.name + ": \"roots\" must be a list");
    for (const Json& r : t["roots"]) {
      if (!r.is_string()) return bad(g.name + ": roots are URI strings");
      g.roots.push_back(r.get<std::string>());
    }
    out.push_back(std::move(g));
  }
  return out;
}

// Fills settings not given as flags from the JSON config file.
Result<std::vector<node::TeamGrant>> apply_config(Args& a, const CLI::App& app) {
  if (a.config.empty()) return std::vector<node::TeamGrant>();
  std::ifstream in(a.config);
  if (!in) return fail_errno(errno, "open config " + a.config);
  Json j = Json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return fail(Code::kInvalidArgument, a.config + ": not a JSON object");
  auto str = [&](const char* name, const char* flag, std::string& into) -> Status {
    if (!j.contains(name) || app.count(flag) > 0) return ok();
    if (!j[name].is_string())
      return fail(Code::kInvalidArgument, a.config + ": \"" + name + "\" must be a string");
    into = j[name].get<std::string>();
    return ok();
  };
  auto num = [&](const char* name, const char* flag, unsigned& into) -> Status {
    if (!j.contains(name) || app.count(flag) > 0) return ok();
    if (!j[name].is_number_unsigned() || j[name].get<uint64_t>() > UINT32_MAX)
      return fail(Code::kInvalidArgument, a.config + ": \"" + name + "\" must be a count");
    into = j[name].get<unsigned>();
    return ok();
  };
  SLUICE_RETURN_IF_ERROR(str("socket", "--socket", a.socket));
  SLUICE_RETURN_IF_ERROR(str("cache_dir", "--cache-dir", a.cache.dir));
  SLUICE_RETURN_IF_ERROR(str("cache_ram", "--cache-ram", a.cache.ram));
  SLUICE_RETURN_IF_ERROR(str("cache_size", "--cache-size", a.cache.disk));
  SLUICE_RETURN_IF_ERROR(str("chunk_size", "--chunk-size", a.cache.chunk));
  SLUICE_RETURN_IF_ERROR(str("policy", "--policy", a.cache.policy));
  SLUICE_RETURN_IF_ERROR(str("endpoint_url", "--endpoint-url", a.aws.endpoint_url));
  SLUICE_RETURN_IF_ERROR(str("region", "--region", a.aws.region));
  SLUICE_RETURN_IF_ERROR(str("profile", "--profile", a.aws.profile));
  SLUICE_RETURN_IF_ERROR(num("revalidate_ms", "--revalidate-ms", a.cache.revalidate_ms));
  SLUICE_RETURN_IF_ERROR(num("max_connections", "--max-connections", a.max_connections));
  SLUICE_RETURN_IF_ERROR(
      num("max_connections_per_uid", "--max-connections-per-uid", a.max_per_uid));
  SLUICE_RETURN_IF_ERROR(num("idle_timeout_s", "--idle-timeout", a.idle_s));
  if (!j.contains("teams")) return std::vector<node::TeamGrant>();
  return parse_teams(j["teams"], a.config);
}

int run(Args& a, const CLI::App& app) {
  auto teams = apply_config(a, app);
  if (!teams) return cli::report_error(teams.error());
  const std::string home = cli::sluice_home();
  node::ServerOptions o;
  o.socket_path = a.socket.empty() ? home + "/sluiced.sock" : a.socket;
  auto co = cli::cache_options(a.cache, home);
  if (!co) return cli::report_error(co.error());
  o.cache = *co;
  s3::register_scheme();
  auto s3o = cli::load_s3_options(a.aws);
  if (!s3o) return cli::report_error(s3o.error());
  o.stores.backend.set(*s3o);
  o.teams = std::move(*teams);
  o.max_connections = a.max_connections;
  o.max_connections_per_uid = a.max_per_uid;
  o.idle_timeout = std::chrono::seconds(a.idle_s);
  o.log = log_line;

  // SIGTERM and SIGINT are taken by one thread (sigwait), so no handler runs inside the
  // server's threads; every thread started below inherits the mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  const std::string dir = o.cache.directory, socket = o.socket_path;
  auto server = node::NodeServer::open(std::move(o));
  if (!server) return cli::report_error(server.error());
  log_line("serving " + dir + " on " + socket + " (pid " + std::to_string(::getpid()) + ", " +
           (*server)->cache().stats().io_path + ")");
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
  a.cache.ram = "1G";  // a daemon lives long: a RAM tier pays off
  CLI::App app{
      "sluiced: the node daemon. Owns the node's cache directory (RAM and NVMe tiers) "
      "and serves it to every process on the node over a Unix socket; sluice and the "
      "library use it for --cache and node+ URIs."};
  app.add_option("--socket", a.socket,
                 "Unix socket to serve on (default $SLUICE_HOME/sluiced.sock)");
  app.add_option("--config", a.config,
                 "JSON config file: any of the flags' settings, and the teams "
                 "(docs/operations/sluiced.md); flags given win")
      ->check(CLI::ExistingFile);
  cli::add_cache_flags(&app, a.cache);
  app.get_option("--cache-ram")->description("RAM tier limit")->default_str("1G");
  app.add_option("--max-connections", a.max_connections, "Connections served at once")
      ->default_val(256);
  app.add_option("--max-connections-per-uid", a.max_per_uid, "Connections one uid may hold")
      ->default_val(64);
  app.add_option("--idle-timeout", a.idle_s, "Seconds before an idle connection is closed")
      ->default_val(300);
  app.add_option("--endpoint-url", a.aws.endpoint_url, "S3 endpoint for s3:// roots");
  app.add_option("--region", a.aws.region, "S3 region");
  app.add_option("--profile", a.aws.profile, "AWS profile for S3 credentials");
  CLI11_PARSE(app, argc, argv);
  return run(a, app);
}
