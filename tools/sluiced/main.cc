// sluiced: the node daemon. Owns the node's cache directory and serves it to every local
// process over a Unix socket, and to the job's other daemons over HTTP (docs/sluiced.md).
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>

#include <cstdio>
#include <ctime>
#include <mutex>
#include <thread>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "aws_config.h"
#include "cache_flags.h"
#include "common.h"
#include "sizes.h"
#include "sluice/node/server.h"
#include "sluice/s3/store.h"

namespace {

using namespace sluice;
using Json = nlohmann::json;

struct Args {
  cli::CacheFlags cache;
  cli::AwsFlags aws;
  std::string socket, config;
  std::string peer_listen, peers, node_name, secret_file, objects_dir;
  std::string ledger;
  unsigned peer_timeout_ms = 10000;
  unsigned access_ttl_s = 60;
  unsigned max_connections = 256, max_per_uid = 64;
  unsigned idle_s = 300;
  std::string window_memory = "512M";
};

void log_line(std::string_view line) {
  static std::mutex mu;
  std::time_t now = std::time(nullptr);
  char when[32];
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  std::lock_guard lock(mu);
  std::fprintf(stderr, "%s sluiced: %.*s\n", when, static_cast<int>(line.size()), line.data());
}

// A team's own S3 credentials: "aws_profile" (from ~/.aws, as the CLI reads it), or
// "aws_access_key_id" and "aws_secret_access_key" (and "aws_session_token"); the daemon's
// endpoint and region. nullopt when the team names none.
Result<std::optional<store::StoreOptions>> team_credentials(const Json& t, const std::string& where,
                                                            const cli::AwsFlags& daemon_aws,
                                                            const s3::S3Options& daemon_s3) {
  auto str = [&](const char* k) -> Result<std::string> {
    if (!t.contains(k)) return std::string();
    if (!t[k].is_string())
      return fail(Code::kInvalidArgument, where + ": \"" + k + "\" must be a string");
    return t[k].get<std::string>();
  };
  SLUICE_ASSIGN_OR_RETURN(std::string profile, str("aws_profile"));
  SLUICE_ASSIGN_OR_RETURN(std::string key_id, str("aws_access_key_id"));
  SLUICE_ASSIGN_OR_RETURN(std::string secret, str("aws_secret_access_key"));
  SLUICE_ASSIGN_OR_RETURN(std::string token, str("aws_session_token"));
  if (profile.empty() && key_id.empty() && secret.empty()) return std::nullopt;
  s3::S3Options so = daemon_s3;
  if (!profile.empty()) {
    if (!key_id.empty() || !secret.empty())
      return fail(Code::kInvalidArgument, where + ": give aws_profile or the keys, not both");
    cli::AwsFlags f = daemon_aws;
    f.profile = profile;
    SLUICE_ASSIGN_OR_RETURN(so, cli::load_s3_options(f));
  } else {
    if (key_id.empty() || secret.empty())
      return fail(Code::kInvalidArgument,
                  where + ": aws_access_key_id and aws_secret_access_key go together");
    so.access_key = key_id;
    so.secret_key = secret;
    so.session_token = token;
  }
  store::StoreOptions out;
  out.backend.set(so);
  return std::optional<store::StoreOptions>(std::move(out));
}

// Teams from the config file: [{"name": "vision", "uids": [1001], "roots": ["s3://b/"]}],
// each optionally with its own credentials (team_credentials).
Result<std::vector<node::TeamGrant>> parse_teams(const Json& teams, const std::string& file,
                                                 const cli::AwsFlags& daemon_aws,
                                                 const s3::S3Options& daemon_s3) {
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
    SLUICE_ASSIGN_OR_RETURN(g.credentials,
                            team_credentials(t, file + ": team " + g.name, daemon_aws, daemon_s3));
    out.push_back(std::move(g));
  }
  return out;
}

// Fills settings not given as flags from the JSON config file.
Result<Json> apply_config(Args& a, const CLI::App& app) {
  if (a.config.empty()) return Json();
  SLUICE_ASSIGN_OR_RETURN(std::string text, cli::read_small_file(a.config, "config"));
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
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
  SLUICE_RETURN_IF_ERROR(str("window_memory", "--window-memory", a.window_memory));
  SLUICE_RETURN_IF_ERROR(str("ledger", "--ledger", a.ledger));
  SLUICE_RETURN_IF_ERROR(str("peer_listen", "--peer-listen", a.peer_listen));
  SLUICE_RETURN_IF_ERROR(str("peers", "--peers", a.peers));
  SLUICE_RETURN_IF_ERROR(str("node_name", "--node-name", a.node_name));
  SLUICE_RETURN_IF_ERROR(str("node_secret_file", "--node-secret-file", a.secret_file));
  SLUICE_RETURN_IF_ERROR(str("objects_dir", "--objects-dir", a.objects_dir));
  SLUICE_RETURN_IF_ERROR(num("peer_timeout_ms", "--peer-timeout-ms", a.peer_timeout_ms));
  SLUICE_RETURN_IF_ERROR(num("access_ttl_s", "--access-ttl", a.access_ttl_s));
  return j.contains("teams") ? j["teams"] : Json();
}

// The HTTP port and the membership from --peer-listen, --peers, --node-name and the secret.
Status configure_peers(const Args& a, node::PeerConfig& p) {
  if (a.peer_listen.empty()) {
    if (!a.peers.empty())
      return fail(Code::kInvalidArgument, "--peers needs --peer-listen HOST:PORT");
    return ok();
  }
  size_t colon = a.peer_listen.rfind(':');
  unsigned port = 0;
  if (colon == std::string::npos ||
      std::sscanf(a.peer_listen.c_str() + colon + 1, "%u", &port) != 1 || port > 65535)
    return fail(Code::kInvalidArgument,
                "--peer-listen '" + a.peer_listen + "': expected HOST:PORT (an IPv4 address)");
  p.listen = true;
  p.host = a.peer_listen.substr(0, colon);
  p.port = static_cast<uint16_t>(port);
  p.timeout = std::chrono::milliseconds(a.peer_timeout_ms);
  if (a.peers.empty()) return ok();  // /metrics only
  SLUICE_ASSIGN_OR_RETURN(std::vector<peer::Member> members, cli::load_members(a.peers, p.port));
  std::string self = a.node_name.empty() ? cli::short_host_name() : a.node_name;
  SLUICE_ASSIGN_OR_RETURN(peer::Membership m, peer::Membership::make(std::move(members), self));
  p.membership = std::make_shared<const peer::Membership>(std::move(m));
  if (a.secret_file.empty())
    return fail(Code::kInvalidArgument, "--peers needs --node-secret-file FILE");
  SLUICE_ASSIGN_OR_RETURN(p.secret, cli::read_secret(a.secret_file));
  return ok();
}

int run(Args& a, const CLI::App& app) {
  auto teams_json = apply_config(a, app);
  if (!teams_json) return cli::report_error(teams_json.error());
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
  o.cache.store_id = "sluiced at " + s3::endpoint_url(*s3o);
  if (!teams_json->is_null()) {
    auto teams = parse_teams(*teams_json, a.config, a.aws, *s3o);
    if (!teams) return cli::report_error(teams.error());
    o.teams = std::move(*teams);
  }
  o.access_ttl = std::chrono::seconds(a.access_ttl_s);
  o.max_connections = a.max_connections;
  o.max_connections_per_uid = a.max_per_uid;
  o.idle_timeout = std::chrono::seconds(a.idle_s);
  auto windows = cli::parse_size(a.window_memory);
  if (!windows) return cli::report_error(windows.error().with_context("--window-memory"));
  o.max_window_bytes = *windows;
  o.log = log_line;
  if (a.ledger.empty()) {
    const char* env = std::getenv("SLUICE_LEDGER");
    if (env) a.ledger = env;
  }
  if (!a.ledger.empty()) {
    auto l = ledger::Ledger::open(a.ledger);
    if (!l) return cli::report_error(l.error().with_context("--ledger"));
    o.ledger = std::move(*l);
  }
  if (Status p = configure_peers(a, o.peer); !p) return cli::report_error(p.error());
  if (o.peer.membership)
    o.peer.objects_directory = a.objects_dir.empty() ? home + "/peer-objects" : a.objects_dir;
  const bool has_peers = o.peer.membership != nullptr;
  const size_t members = has_peers ? o.peer.membership->members().size() : 0;

  // SIGTERM and SIGINT are taken by one thread (sigwait), so no handler runs inside the
  // server's threads; every thread started below inherits the mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  const std::string dir = o.cache.directory, socket = o.socket_path;
  const std::string ledger_where = o.ledger ? o.ledger->describe() : "";
  auto server = node::NodeServer::open(std::move(o));
  if (!server) return cli::report_error(server.error());
  log_line("serving " + dir + " on " + socket + " (pid " + std::to_string(::getpid()) + ", " +
           (*server)->cache().stats().io_path + ")");
  if (!ledger_where.empty())
    log_line("charging chunks kept on NVMe to their teams in the ledger " + ledger_where);
  if ((*server)->peer_port() != 0)
    log_line("HTTP on port " + std::to_string((*server)->peer_port()) + ": /metrics" +
             (has_peers ? ", chunks for " + std::to_string(members - 1) + " peers" : ""));
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
      "and serves it to every process on the node over a Unix socket (sluice and the "
      "library use it for --cache and node+ URIs), and to the job's other daemons over HTTP "
      "(--peers)."};
  app.add_option("--socket", a.socket,
                 "Unix socket to serve on (default $SLUICE_HOME/sluiced.sock)");
  app.add_option("--config", a.config,
                 "JSON config file: any of the flags' settings, and the teams "
                 "(docs/sluiced.md); flags given win")
      ->check(CLI::ExistingFile);
  cli::add_cache_flags(&app, a.cache, /*client=*/false);
  app.get_option("--cache-ram")->description("RAM tier limit")->default_str("1G");
  app.add_option("--max-connections", a.max_connections, "Connections served at once")
      ->default_val(256);
  app.add_option("--max-connections-per-uid", a.max_per_uid, "Connections one uid may hold")
      ->default_val(64);
  app.add_option("--idle-timeout", a.idle_s, "Seconds before an idle connection is closed")
      ->default_val(300);
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
  app.add_option("--peer-timeout-ms", a.peer_timeout_ms,
                 "A chunk from a peer slower than this comes from the backing store")
      ->default_val(10000);
  app.add_option("--access-ttl", a.access_ttl_s,
                 "Seconds a team's proven access to an object (teams with their own "
                 "credentials in --config) is remembered")
      ->default_val(60);
  app.add_option("--endpoint-url", a.aws.endpoint_url, "S3 endpoint for s3:// roots");
  app.add_option("--region", a.aws.region, "S3 region");
  app.add_option("--profile", a.aws.profile, "AWS profile for S3 credentials");
  CLI11_PARSE(app, argc, argv);
  return run(a, app);
}
