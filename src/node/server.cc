// NodeServer: the daemon's Unix-socket service. One thread per connection (bounded), each
// reading whole frames with deadlines; see server.h for the contract and
// docs/formats/node-protocol.md for the frames.
#include "sluice/node/server.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <list>
#include <map>
#include <optional>
#include <random>
#include <semaphore>
#include <span>
#include <thread>

#include "node/frame.h"
#include "node/peer_http.h"
#include "node/router_store.h"
#include "node/wire.h"
#include "sluice/cache/json.h"
#include "sluice/core/hash.h"
#include "sluice/core/thread_annotations.h"
#include "sluice/ledger/cache_charger.h"
#include "sluice/store/serving_peer.h"
#include "sluice/telemetry/registry.h"

namespace sluice::node {

namespace {

bool scheme_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '+' || c == '-' || c == '.';
}

struct Reply {
  Json body = Json::object();
  FrameBytes data;
  std::vector<UniqueFd> fds;
};

// The name a daemon's cache charges under in the ledger (CacheChargerOptions::source): an
// ID made once and kept in the cache directory (file `charge-id`), so a restart, a new host
// name (a container) or a moved directory keep it, and no two caches share one.
Result<std::string> cache_source(const std::string& directory) {
  const std::string path = directory + "/charge-id";
  auto valid = [](const std::string& id) {
    return id.size() == 32 && std::all_of(id.begin(), id.end(), [](char c) {
             return std::isdigit(static_cast<unsigned char>(c)) || (c >= 'a' && c <= 'f');
           });
  };
  for (int attempt = 0; attempt < 3; ++attempt) {
    if (std::ifstream in(path); in) {
      std::string id;
      std::getline(in, id);
      if (!valid(id))
        return fail(Code::kCorruption, path + " does not hold a cache ID (32 hex digits)");
      return "cache:" + id;
    }
    // Made in a file of its own and linked into place: two daemons starting at once agree.
    std::error_code ec;
    std::filesystem::create_directories(directory, ec);
    std::random_device rd;
    char id[33];
    std::snprintf(id, sizeof id, "%08x%08x%08x%08x", rd(), rd(), rd(), rd());
    const std::string tmp = path + ".tmp." + std::to_string(::getpid());
    {
      // Durable before it is linked: a power cut must not leave an empty charge-id.
      UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
      if (!fd.valid()) return fail_errno(errno, "create " + tmp);
      const std::string line = std::string(id) + "\n";
      Status written = write_full(fd.get(), std::as_bytes(std::span(line)), tmp);
      if (written && ::fsync(fd.get()) != 0) written = fail_errno(errno, "fsync " + tmp);
      if (!written) {
        ::unlink(tmp.c_str());
        return std::unexpected(written.error());
      }
    }
    int rc = ::link(tmp.c_str(), path.c_str());
    int err = errno;
    ::unlink(tmp.c_str());
    if (rc != 0 && err != EEXIST) return fail_errno(err, "make " + path);
    if (rc == 0) {
      UniqueFd dir(::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
      if (dir.valid()) (void)sync_directory(dir.get(), directory);
    }
  }
  return fail(Code::kUnavailable, "cannot read or make " + path);
}

std::string dump(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

struct Caller {
  const TeamGrant* team = nullptr;
  uid_t uid = 0;
  pid_t pid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;  // supplementary groups at connect (SO_PEERGROUPS)
  std::string describe() const {
    return "uid " + std::to_string(uid) + " pid " + std::to_string(pid) +
           (team ? " (team " + team->name + ")" : "");
  }
};

Status check_prefix(std::string_view prefix) {
  std::string_view p = prefix;
  while (p.ends_with('/')) p.remove_suffix(1);
  if (p.empty())
    return prefix.empty() ? ok() : fail(Code::kInvalidArgument, "prefix '/' is not relative");
  return store::validate_key(p);
}

// A thread's capability sets, 64 bits each. capget(2) and capset(2) as raw system calls:
// they read and change the calling thread only (async-signal-safe: drop_privileges calls
// them from a signal handler).
struct CapSets {
  uint64_t effective = 0, permitted = 0, inheritable = 0;
};

std::optional<CapSets> get_caps() {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct d[2] = {};
  if (::syscall(SYS_capget, &header, d) != 0) return std::nullopt;
  auto join = [](uint32_t lo, uint32_t hi) { return lo | (static_cast<uint64_t>(hi) << 32); };
  return CapSets{join(d[0].effective, d[1].effective), join(d[0].permitted, d[1].permitted),
                 join(d[0].inheritable, d[1].inheritable)};
}

bool set_caps(const CapSets& c) {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct d[2] = {};
  for (int i = 0; i < 2; ++i) {
    d[i].effective = static_cast<uint32_t>(c.effective >> (32 * i));
    d[i].permitted = static_cast<uint32_t>(c.permitted >> (32 * i));
    d[i].inheritable = static_cast<uint32_t>(c.inheritable >> (32 * i));
  }
  return ::syscall(SYS_capset, &header, d) == 0;
}

constexpr uint64_t cap_bit(int cap) {
  return uint64_t{1} << cap;
}

// The capabilities that override file permissions: the kernel lowers them when a root
// thread's fsuid leaves 0, but not when the fsuid of a daemon that is not root changes.
constexpr uint64_t kFileCaps = cap_bit(CAP_CHOWN) | cap_bit(CAP_DAC_OVERRIDE) |
                               cap_bit(CAP_DAC_READ_SEARCH) | cap_bit(CAP_FOWNER) |
                               cap_bit(CAP_FSETID) | cap_bit(CAP_LINUX_IMMUTABLE) |
                               cap_bit(CAP_MKNOD) | cap_bit(CAP_MAC_OVERRIDE);

// Acts as a caller on this thread, for opening local files: the thread's fsuid, fsgid and
// supplementary groups become the caller's, and are the daemon's again when it ends. Raw
// system calls, which change the calling thread only (glibc's setgroups and setfsuid
// wrappers may change every thread of the process). `acting()` is false when the daemon
// may not take the caller's identity (it runs unprivileged as another uid): then no file
// is opened for that caller.
class AsCaller {
 public:
  explicit AsCaller(const Caller& c) {
    saved_groups_.resize(static_cast<size_t>(std::max(0, ::getgroups(0, nullptr))));
    if (!saved_groups_.empty() &&
        ::getgroups(static_cast<int>(saved_groups_.size()), saved_groups_.data()) < 0)
      saved_groups_.clear();
    // A daemon that is not root but holds CAP_DAC_OVERRIDE or CAP_DAC_READ_SEARCH (file
    // capabilities) keeps them across setfsuid: lowered here for the caller's open, else it
    // would open any file. A caller of uid 0 keeps them, as the kernel gives fsuid 0.
    bool lowered = true;
    if (std::optional<CapSets> caps = get_caps();
        c.uid != 0 && caps && (caps->effective & kFileCaps) != 0) {
      CapSets low = *caps;
      low.effective &= ~kFileCaps;
      lowered = set_caps(low);
      if (lowered) saved_caps_ = caps;
    }
    // Groups that cannot be taken (a user namespace that denies setgroups) would leave the
    // daemon's own: then the thread does not act as the caller at all.
    const bool grouped = ::syscall(SYS_setgroups, c.groups.size(), c.groups.data()) == 0;
    ::syscall(SYS_setfsgid, c.gid);
    ::syscall(SYS_setfsuid, c.uid);
    // setfsuid(-1) fails and returns the current fsuid: the way to read it back.
    acting_ = lowered && grouped && static_cast<uid_t>(::syscall(SYS_setfsuid, -1)) == c.uid &&
              static_cast<gid_t>(::syscall(SYS_setfsgid, -1)) == c.gid;
  }
  ~AsCaller() {
    ::syscall(SYS_setfsuid, ::geteuid());
    ::syscall(SYS_setfsgid, ::getegid());
    ::syscall(SYS_setgroups, saved_groups_.size(), saved_groups_.data());
    if (saved_caps_) (void)set_caps(*saved_caps_);
  }
  AsCaller(const AsCaller&) = delete;
  AsCaller& operator=(const AsCaller&) = delete;
  bool acting() const { return acting_; }

 private:
  std::vector<gid_t> saved_groups_;
  std::optional<CapSets> saved_caps_;  // the thread's sets before they were lowered
  bool acting_ = false;
};

// The local file a request's access check opened as its caller, held open while the
// request is served (so its inode cannot be reused): what is served must be this file,
// whatever its path leads to by then.
struct CheckedFile {
  UniqueFd fd;
  dev_t dev = 0;
  ino_t ino = 0;
};

// A key of a request, as the cache names it ("<root id>/<key>"), and for a local file the
// file its access check opened.
struct RoutedKey {
  std::string key;
  std::optional<CheckedFile> file;
};

// Whether the version `etag` of a local file is the file `f` (the file store's etag begins
// "<dev>-<inode>-" in hex: docs/stores.md).
bool same_file(const CheckedFile& f, std::string_view etag) {
  char prefix[48];
  std::snprintf(prefix, sizeof prefix, "%lx-%lx-", static_cast<unsigned long>(f.dev),
                static_cast<unsigned long>(f.ino));
  return etag.starts_with(prefix);
}

}  // namespace

Result<std::string> normalize_root(std::string_view uri) {
  size_t sep = uri.find("://");
  if (sep == std::string_view::npos || sep == 0)
    return fail(Code::kInvalidArgument, "root '" + std::string(uri) + "' is not a URI");
  std::string_view scheme = uri.substr(0, sep);
  for (char c : scheme) {
    if (!scheme_char(c))
      return fail(Code::kInvalidArgument, "root '" + std::string(uri) + "': bad scheme");
  }
  if (scheme.starts_with("cache+") || scheme.starts_with("node+"))
    return fail(Code::kInvalidArgument,
                "root '" + std::string(uri) + "': name the backing store, not a cache of it");
  std::string_view rest = uri.substr(sep + 3);
  bool absolute = scheme == "file";
  if (absolute) {
    if (!rest.starts_with('/'))
      return fail(Code::kInvalidArgument,
                  "root '" + std::string(uri) + "': a file root must be absolute (file:///dir)");
    rest.remove_prefix(1);
  }
  while (rest.ends_with('/')) rest.remove_suffix(1);
  if (rest.empty() && !absolute)
    return fail(Code::kInvalidArgument, "root '" + std::string(uri) + "' names no bucket");
  for (size_t pos = 0; pos <= rest.size() && !rest.empty();) {
    size_t end = rest.find('/', pos);
    if (end == std::string_view::npos) end = rest.size();
    std::string_view part = rest.substr(pos, end - pos);
    if (part.empty() || part == "." || part == "..")
      return fail(Code::kInvalidArgument,
                  "root '" + std::string(uri) + "': empty, '.' or '..' component");
    for (char c : part) {
      if (static_cast<unsigned char>(c) < 0x20)
        return fail(Code::kInvalidArgument, "root '" + std::string(uri) + "': control character");
    }
    pos = end + 1;
  }
  return std::string(scheme) + "://" + (absolute ? "/" : "") + std::string(rest);
}

// "file://" and the absolute path a file root's directory resolves to (no symlink, no "."
// or ".."); nullopt when it does not resolve (missing, unreadable).
std::optional<std::string> real_file_root(std::string_view root) {
  std::string path(root.substr(7));
  char* real = ::realpath(path.c_str(), nullptr);
  if (!real) return std::nullopt;
  std::string r = std::string("file://") + real;
  std::free(real);
  return r;
}

// Where a local path resolves to when its end may not exist yet: the longest leading part
// that exists, resolved ("file://" and a real path, as real_file_root), and the rest, which
// cannot be a link. nullopt when no part of it resolves.
struct ResolvedPath {
  std::string real;  // "file:///..."
  std::string tail;  // "" or "/missing/parts"
};
std::optional<ResolvedPath> resolve_existing(std::string path) {
  std::string tail;
  std::optional<std::string> real;
  while (!(real = real_file_root("file://" + path))) {
    const size_t slash = path.rfind('/');
    if (slash == 0 || slash == std::string::npos) return std::nullopt;
    tail = path.substr(slash) + tail;
    path.resize(slash);
  }
  return ResolvedPath{std::move(*real), std::move(tail)};
}

bool root_granted(std::string_view root, std::string_view grant) {
  if (grant == "*") return true;
  while (grant.ends_with('/') && !grant.ends_with(":///")) grant.remove_suffix(1);
  if (grant.ends_with('/')) return root.starts_with(grant);  // "file:///": every file root
  return root == grant || (root.starts_with(grant) && root[grant.size()] == '/');
}

struct NodeServer::Impl {
  struct Conn {
    std::thread thread;
    int fd = -1;  // for stop(); valid while !done
    // Guarded by Impl::mu, which an annotation here cannot name (it would read as c.mu).
    bool done = false;  // the fd is closed under mu once set
    uid_t uid = 0;
  };

  ServerOptions o;
  telemetry::Registry registry;      // the cache's, the peers' and the server's metrics
  RouterStore* router = nullptr;     // owned by `peers`
  peer::PeerStore* peers = nullptr;  // owned by `cache`, its backing store
  // Before `cache`, whose NVMe writes it charges: destroyed after it (and flushed then).
  std::shared_ptr<ledger::CacheCharger> charger;
  std::unique_ptr<cache::TieredCache> cache;
  std::map<const TeamGrant*, telemetry::Counter*> team_bytes;  // made at open, read-only after
  std::vector<std::string> own_dirs;         // file:// URIs of the cache's (and objects') directory
  const TeamGrant* implicit_team = nullptr;  // the team made when none was configured
  telemetry::Counter* served_to_peers = nullptr;
  telemetry::Counter* peer_refused = nullptr;
  std::atomic<int64_t> last_peer_log_ns{0};  // relaxed: only spaces out log lines
  UniqueFd listen_fd, stop_fd;
  std::counting_semaphore<4096> inline_slots;

  struct WindowPool;
  std::unique_ptr<WindowPool> windows = std::make_unique<WindowPool>();  // reply windows
  Mutex mu;
  std::list<Conn> conns SLUICE_GUARDED_BY(mu);
  std::map<uid_t, unsigned> per_uid SLUICE_GUARDED_BY(mu);  // live connections by uid

  // Counters: relaxed, they are only reported.
  std::atomic<uint64_t> connections{0}, refused{0}, requests{0}, errors{0};
  std::atomic<uint64_t> handoff_chunks{0}, handoff_bytes{0}, inline_bytes{0}, window_bytes{0};

  // Teams with their own credentials: each root opened with them, for prove_access.
  std::map<const TeamGrant*, std::unique_ptr<RouterStore>> team_routers;  // made at open
  struct AccessVerdict {
    Status verdict;
    std::chrono::steady_clock::time_point until;
  };
  Mutex access_mu;
  std::map<std::string, AccessVerdict> access SLUICE_GUARDED_BY(access_mu);

  // Last member: destroyed first, so no peer request runs while the rest goes away.
  std::unique_ptr<ObjectSpace> objects;  // before http, which calls into it until stopped
  std::unique_ptr<PeerHttpServer> http;

  explicit Impl(ServerOptions opts)
      : o(std::move(opts)), inline_slots(std::clamp<unsigned>(o.max_inline_reads, 1, 4096)) {}

  void log(const std::string& line) const {
    if (o.log) o.log(clipped(line));
  }

  // Charges the NVMe tier's chunks to the teams owning their objects (ServerOptions::ledger):
  // a cache key is "<root id>/<key>", its location the root's URI and the key.
  Status charge_cache() {
    ledger::CacheChargerOptions co;
    SLUICE_ASSIGN_OR_RETURN(co.source, cache_source(o.cache.directory));
    co.log = o.log;
    co.registry = &registry;
    auto location_of = [r = router](std::string_view key) -> std::string {
      size_t slash = key.find('/');
      if (slash == std::string_view::npos) return {};
      std::optional<std::string> root = r->root_of(key.substr(0, slash));
      if (!root) return {};
      if (!root->ends_with('/')) *root += '/';
      return *root + std::string(key.substr(slash + 1));
    };
    auto c = ledger::CacheCharger::open(o.ledger, std::move(location_of), std::move(co));
    if (!c) return std::unexpected(c.error().with_context("sluiced: charging the cache"));
    charger = std::move(*c);
    // Chunks of other stores sharing the directory are not this daemon's to charge.
    o.cache.admit_chunk = [c = charger, id = o.cache.store_id](
                              std::string_view store, std::string_view key,
                              uint64_t bytes) -> std::optional<uint32_t> {
      if (store != id) return 0;
      return c->admit(key, bytes);
    };
    o.cache.chunk_adopted = [c = charger, id = o.cache.store_id](
                                std::string_view store, std::string_view key, uint64_t bytes) {
      return store != id ? 0 : c->adopt(key, bytes);
    };
    o.cache.chunk_freed = [c = charger](uint32_t tag, uint64_t bytes) { c->freed(tag, bytes); };
    return ok();
  }

  const TeamGrant* team_of(uid_t uid) const {
    for (const TeamGrant& t : o.teams) {
      for (uint32_t u : t.uids) {
        if (u == uid) return &t;
      }
    }
    return nullptr;
  }

  // Accepts one connection: authenticates it and starts its thread, or refuses it.
  void admit(UniqueFd fd) {
    ucred cred{};
    socklen_t len = sizeof cred;
    Caller caller;
    if (::getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
      caller.uid = cred.uid;
      caller.pid = cred.pid;
      caller.gid = cred.gid;
      caller.team = team_of(cred.uid);
      // The caller's supplementary groups as they were at connect; none if unknown (local
      // files are then opened with fewer rights, never more).
      std::vector<gid_t> groups(64);
      for (int tries = 0; tries < 4; ++tries) {
        socklen_t glen = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
        if (::getsockopt(fd.get(), SOL_SOCKET, SO_PEERGROUPS, groups.data(), &glen) == 0) {
          groups.resize(glen / sizeof(gid_t));
          caller.groups = std::move(groups);
          break;
        }
        if (errno != ERANGE) break;
        groups.resize(glen / sizeof(gid_t) + 1);
      }
    }
    std::optional<Error> refusal;
    MutexLock lock(mu);
    reap_locked();
    if (!caller.team) {
      refusal = Error(Code::kPermissionDenied,
                      "uid " + std::to_string(caller.uid) + " is in no team of this daemon");
    } else if (conns.size() >= o.max_connections) {
      refusal = Error(Code::kUnavailable, "too many connections (" +
                                              std::to_string(o.max_connections) + "); retry later");
    } else if (per_uid[caller.uid] >= o.max_connections_per_uid) {
      refusal = Error(Code::kUnavailable, "too many connections from uid " +
                                              std::to_string(caller.uid) + "; retry later");
    }
    if (refusal) {
      refused.fetch_add(1, std::memory_order_relaxed);
      log("refused " + caller.describe() + ": " + refusal->message());
      FrameChannel ch(std::move(fd));
      (void)ch.send(error_frame(0, *refusal), std::chrono::milliseconds(100));
      return;
    }
    connections.fetch_add(1, std::memory_order_relaxed);
    ++per_uid[caller.uid];
    Conn& c = conns.emplace_back();
    c.fd = fd.get();
    c.uid = caller.uid;
    c.thread = std::thread([this, &c, caller, f = fd.release()]() mutable {
      serve_connection(c, caller, UniqueFd(f));
    });
  }

  // Joins the threads of finished connections.
  void reap_locked() SLUICE_REQUIRES(mu) {
    for (auto it = conns.begin(); it != conns.end();) {
      if (it->done) {
        it->thread.join();
        it = conns.erase(it);
      } else {
        ++it;
      }
    }
  }

  // Reply windows (WINDOW), one size (a header page and max_inline_bytes). A window is
  // never freed: a client may keep its descriptor after the connection ends, so freeing it
  // would not give the memory back, and windows made anew for each connection would grow
  // without bound. When a connection ends its window goes back to its uid's idle list, for
  // that uid's next connection (the same uid, so the same team: what a kept descriptor
  // shows of it later is bytes that uid may read), with a new generation. Windows made, all
  // uids together, stay within max_window_bytes, and one uid's within half of it.
  struct WindowPool {
    Mutex mu;
    std::map<uid_t, std::vector<std::unique_ptr<Window>>> idle SLUICE_GUARDED_BY(mu);
    std::map<uid_t, uint64_t> made_by_uid SLUICE_GUARDED_BY(mu);  // bytes
    // No "= 0" here: `windows` is made with make_unique (value-initialised, so zero) in a
    // default member initialiser above, which clang refuses while these are still unparsed.
    uint64_t made SLUICE_GUARDED_BY(mu);         // bytes
    uint64_t generations SLUICE_GUARDED_BY(mu);  // the last generation given to a window
  };

  uint64_t windows_made() {
    MutexLock lock(windows->mu);
    return windows->made;
  }

  // The header page and max_inline_bytes in whole pages (at least one).
  uint64_t window_size() const {
    return Window::kHeaderBytes +
           std::clamp<uint64_t>(o.max_inline_bytes, 4096, kMaxDataBytes) / 4096 * 4096;
  }

  // A connection's window while it lives; back to the pool when the connection ends.
  class WindowLease {
   public:
    WindowLease(Impl& server, uid_t uid) : server_(server), uid_(uid) {}
    ~WindowLease() {
      if (!w_) return;
      MutexLock lock(server_.windows->mu);
      server_.windows->idle[uid_].push_back(std::move(w_));
    }
    WindowLease(const WindowLease&) = delete;
    WindowLease& operator=(const WindowLease&) = delete;
    Window* get() { return w_.get(); }
    // The connection's window: the one it has, an idle one of its uid, or a new one.
    Result<Window*> take() {
      if (w_) return w_.get();
      const uint64_t size = server_.window_size();
      {
        MutexLock lock(server_.windows->mu);
        auto& idle = server_.windows->idle[uid_];
        if (!idle.empty()) {
          w_ = std::move(idle.back());
          idle.pop_back();
          w_->set_generation(++server_.windows->generations);  // before any byte of ours
          return w_.get();
        }
        const uint64_t limit = server_.o.max_window_bytes;
        if (server_.windows->made + size > limit ||
            server_.windows->made_by_uid[uid_] + size > limit / 2)
          return fail(Code::kUnavailable, "every reply window's memory is taken; read without one");
        server_.windows->made += size;  // made, whether or not the memfd comes: never freed
        server_.windows->made_by_uid[uid_] += size;
      }
      SLUICE_ASSIGN_OR_RETURN(Window w, Window::create(size));
      w_ = std::make_unique<Window>(std::move(w));
      MutexLock lock(server_.windows->mu);
      w_->set_generation(++server_.windows->generations);
      return w_.get();
    }

   private:
    Impl& server_;
    const uid_t uid_;
    std::unique_ptr<Window> w_;
  };

  void serve_connection(Conn& c, Caller caller, UniqueFd fd) {
    std::optional<FrameChannel> ch(std::in_place, std::move(fd));
    WindowLease window(*this, caller.uid);
    for (;;) {
      auto fr = ch->receive(o.idle_timeout, o.frame_timeout, /*max_data=*/0);
      if (!fr) {
        Code code = fr.error().code();
        if (code == Code::kInvalidArgument || code == Code::kCorruption) {
          errors.fetch_add(1, std::memory_order_relaxed);
          log("closed " + caller.describe() + ": " + fr.error().message());
          (void)ch->send(error_frame(0, fr.error()), std::chrono::milliseconds(100));
        }
        break;
      }
      if (!*fr) break;  // closed between frames
      requests.fetch_add(1, std::memory_order_relaxed);
      const Frame& req = **fr;
      Frame resp;
      Result<Reply> r = dispatch(caller, req, window);
      if (r) {
        resp.type = static_cast<uint16_t>(req.type | static_cast<uint16_t>(FrameType::kResponse));
        resp.request_id = req.request_id;
        resp.json = dump(r->body);
        resp.data = std::move(r->data);
        resp.fds = std::move(r->fds);
        if (resp.json.size() > kMaxJsonBytes) {
          r = fail(Code::kInvalidArgument, "the reply would be over the frame limit; ask for less");
        }
      }
      if (!r) {
        errors.fetch_add(1, std::memory_order_relaxed);
        log("request " + std::to_string(req.type) + " from " + caller.describe() + ": " +
            r.error().message());
        resp = error_frame(req.request_id, r.error());
      }
      if (!ch->send(resp, o.frame_timeout)) break;
    }
    MutexLock lock(mu);
    ch.reset();  // closes the socket under mu, so stop() never shuts down a reused number
    c.done = true;
    if (--per_uid[caller.uid] == 0) per_uid.erase(caller.uid);
  }

  Result<Reply> dispatch(const Caller& caller, const Frame& req, WindowLease& window) {
    SLUICE_ASSIGN_OR_RETURN(Json j, parse_body(req.json));
    if (!req.fds.empty()) return fail(Code::kInvalidArgument, "requests carry no descriptors");
    try {
      switch (static_cast<FrameType>(req.type)) {
        case FrameType::kHello:
          return hello(caller);
        case FrameType::kStat:
          return stat(caller, j);
        case FrameType::kRead:
          return read(caller, j, window.get());
        case FrameType::kWindow:
          return map_window(j, window);
        case FrameType::kWarm:
          return warm(caller, j);
        case FrameType::kList:
          return list(caller, j);
        case FrameType::kCacheStat:
          return cache_stat();
        case FrameType::kEvict:
        case FrameType::kPin:
          return evict_or_pin(caller, j, static_cast<FrameType>(req.type));
        case FrameType::kChunks:
          return chunks(caller, j);
        case FrameType::kDeclare:
          return declare(caller, j);
        default:
          return fail(Code::kInvalidArgument, "unknown request type " + std::to_string(req.type));
      }
    } catch (const Json::exception& e) {
      return fail(Code::kInvalidArgument, std::string("request body: ") + e.what());
    }
  }

  // The root a request names, checked against the caller's team; returns its id.
  // A file root is checked, and opened, as the directory its path resolves to: a symlink
  // in it (one the caller made) would otherwise lead a granted path anywhere the daemon may
  // read. The daemon's own directories are never roots.
  Result<std::string> root_id(const Caller& caller, const Json& j) {
    SLUICE_ASSIGN_OR_RETURN(std::string raw, get_string(j, "root"));
    SLUICE_ASSIGN_OR_RETURN(std::string root, normalize_root(raw));
    if (root.starts_with("file://")) {
      std::optional<std::string> real = real_file_root(root);
      if (!real) {
        const int err = errno;
        if (err == ENOENT || err == ENOTDIR)
          return fail(Code::kNotFound, "root '" + root + "': no such directory");
        return fail_errno(err, "root '" + root + "'");
      }
      root = std::move(*real);
      for (const std::string& own : own_dirs) {
        if (root_granted(root, own))
          return fail(Code::kPermissionDenied,
                      "root '" + root + "' is inside the daemon's own directory");
      }
    }
    // A root granted whole, or one above a granted root (a client names the bucket or
    // file:///): then each key must lie in a grant (granted_key).
    if (!may_read(*caller.team, root) && !grant_below(*caller.team, root))
      return fail(Code::kPermissionDenied,
                  "team " + caller.team->name + " may not read root '" + root + "'");
    return router->attach(root);
  }

  // Whether one of the team's grants lies below `root` ("s3://datasets/vision/" below
  // "s3://datasets").
  bool grant_below(const TeamGrant& team, std::string_view root) const {
    std::string base(root);
    if (!base.ends_with('/')) base += '/';
    return std::any_of(team.roots.begin(), team.roots.end(), [&](const std::string& g) {
      return g != "*" && g.starts_with(base) && g.size() > base.size();
    });
  }

  // A key (listing: a prefix) of a root the team was not granted whole is served only when
  // it lies in a granted root: for a file root, as the path it resolves to (a symlink in a
  // granted folder leads nowhere else).
  Status granted_key(const Caller& caller, const std::string& id, std::string_view key,
                     bool listing = false) const {
    std::optional<std::string> root = router->root_of(id);
    if (!root) return fail(Code::kInternal, "root id " + id + " is not attached");
    const TeamGrant& team = *caller.team;
    if (may_read(team, *root)) return ok();
    std::string full = *root;
    if (!full.ends_with('/')) full += '/';
    full += key;
    // A listing's prefix must lie inside a grant, not end at a grant's name: "teamA" also
    // lists (evicts, pins) "teamAB/...". So its every continuation must be granted: checked
    // with one that is not '/'.
    if (listing && !key.empty() && !key.ends_with('/')) full += '~';
    if (root->starts_with("file://"))
      if (auto resolved = resolve_existing(full.substr(7))) full = resolved->real + resolved->tail;
    while (full.ends_with('/') && !full.ends_with(":///")) full.pop_back();
    if (!key.empty() && may_read(team, full)) return ok();
    return fail(Code::kPermissionDenied, "team " + team.name + " may not read '" +
                                             std::string(key) + "' of root '" + *root +
                                             "': it lies outside the team's roots");
  }

  // A key (or prefix) of a file root that holds one of the daemon's directories must not
  // lead into it: checked on the path it resolves to (the part that exists).
  Status outside_own_dirs(const std::string& id, std::string_view key) const {
    std::optional<std::string> root = router->root_of(id);
    if (!root || !root->starts_with("file://")) return ok();
    for (const std::string& own : own_dirs) {
      if (!root_granted(own, *root)) continue;  // not inside this root
      std::string path = root->substr(7);
      if (!path.ends_with('/')) path += '/';
      path += key;
      // Where the longest leading part of the path that exists resolves to (what does not
      // exist cannot be read).
      auto resolved = resolve_existing(std::move(path));
      if (resolved && root_granted(resolved->real, own))
        return fail(Code::kPermissionDenied,
                    "'" + std::string(key) + "' is inside the daemon's own directory");
    }
    return ok();
  }

  // "*" is every object-store root; a file root is granted by its path ("file:///": all),
  // but for the team made when none is configured (the daemon's own uid, to which "*" gives
  // every file root the daemon may read: no more than that uid may read itself).
  bool may_read(const TeamGrant& team, std::string_view root) const {
    const bool file = root.starts_with("file://");
    return std::any_of(team.roots.begin(), team.roots.end(), [&](const std::string& g) {
      return (g != "*" || !file || &team == implicit_team) && root_granted(root, g);
    });
  }

  // "<root id>/<prefix>" of a request's root and optional prefix.
  Result<std::string> routed_prefix(const Caller& caller, const Json& j) {
    SLUICE_ASSIGN_OR_RETURN(std::string id, root_id(caller, j));
    SLUICE_ASSIGN_OR_RETURN(std::string prefix, get_string_or(j, "prefix", ""));
    SLUICE_RETURN_IF_ERROR(check_prefix(prefix));
    SLUICE_RETURN_IF_ERROR(outside_own_dirs(id, prefix));
    SLUICE_RETURN_IF_ERROR(granted_key(caller, id, prefix, /*listing=*/true));
    SLUICE_RETURN_IF_ERROR(prove_access(caller, id, prefix, /*listing=*/true));
    SLUICE_RETURN_IF_ERROR(prove_file_access(caller, id, prefix, /*listing=*/true));
    return id + "/" + prefix;
  }

  Result<RoutedKey> routed_key(const Caller& caller, const Json& j) {
    SLUICE_ASSIGN_OR_RETURN(std::string id, root_id(caller, j));
    SLUICE_ASSIGN_OR_RETURN(std::string key, get_string(j, "key"));
    return routed(caller, id, key);
  }

  // `key` of the root `id` (already checked against the team), as the cache names it, once
  // the key is valid and the team may read it; with the local file its check opened.
  Result<RoutedKey> routed(const Caller& caller, const std::string& id, const std::string& key) {
    SLUICE_RETURN_IF_ERROR(store::validate_key(key));
    SLUICE_RETURN_IF_ERROR(outside_own_dirs(id, key));
    SLUICE_RETURN_IF_ERROR(granted_key(caller, id, key));
    SLUICE_RETURN_IF_ERROR(prove_access(caller, id, key, /*listing=*/false));
    SLUICE_ASSIGN_OR_RETURN(std::optional<CheckedFile> file,
                            open_as_caller(caller, id, key, /*listing=*/false));
    return RoutedKey{id + "/" + key, std::move(file)};
  }

  // A local file is served only to a caller who may open it: on every request (a cached
  // chunk included), the file (listing: the folder of the prefix) is opened as the caller,
  // with the caller's uid, gid and groups, so its modes and every folder above it decide,
  // never the daemon's own rights. A missing file is left to the request to report.
  Status prove_file_access(const Caller& caller, const std::string& id, std::string_view key,
                           bool listing) const {
    auto file = open_as_caller(caller, id, key, listing);
    if (!file) return std::unexpected(file.error());
    return ok();
  }

  // prove_file_access, keeping the file it opened (none for a listing, another store's root,
  // or a file gone): a request serves only that file (same_file), so one swapped for
  // another between the check and the read is not read with the daemon's rights.
  Result<std::optional<CheckedFile>> open_as_caller(const Caller& caller, const std::string& id,
                                                    std::string_view key, bool listing) const {
    std::optional<std::string> root = router->root_of(id);
    if (!root || !root->starts_with("file://")) return std::nullopt;
    std::string path = root->substr(7);
    if (!path.ends_with('/')) path += '/';
    int flags = O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK;
    if (listing) {
      key = key.substr(0, key.rfind('/') == std::string_view::npos ? 0 : key.rfind('/'));
      flags |= O_DIRECTORY;
    }
    path += key;
    int err = 0;
    UniqueFd fd;
    {
      AsCaller as(caller);
      if (!as.acting() && caller.uid != ::geteuid())
        return fail(Code::kPermissionDenied,
                    "sluiced cannot act as uid " + std::to_string(caller.uid) +
                        " to check its access to '" + path +
                        "' (run it as root to serve local files to other users)");
      // Not acting as the daemon's own uid: its own rights are the caller's.
      fd.reset(::open(path.c_str(), flags));
      if (!fd.valid()) err = errno;
    }
    // A file gone is NotFound, even where the cache still holds it (its owner may have
    // read it before removing it); a listing of a missing folder is empty.
    if (listing && (err == 0 || err == ENOENT || err == ENOTDIR)) return std::nullopt;
    if (err == 0) {
      struct stat st;
      if (::fstat(fd.get(), &st) != 0) return fail_errno(errno, "stat '" + path + "'");
      if (o.file_checked) o.file_checked(path);
      return CheckedFile{std::move(fd), st.st_dev, st.st_ino};
    }
    if (err == ENOENT || err == ENOTDIR)
      return fail(Code::kNotFound, "'" + std::string(key) + "' of " + *root + ": no such file");
    if (err == EACCES || err == EPERM) {
      Error e(Code::kPermissionDenied,
              caller.describe() + " may not " + (listing ? "list '" : "read '") + path + "'");
      log("refused " + caller.describe() + ": " + e.message());
      return std::unexpected(e);
    }
    return fail_errno(err, "'" + path + "' as " + caller.describe());
  }

  // The version about to be served of a routed key is the file its check opened: else the
  // file was replaced between the two (a rename, a symlink swapped in) and the request is
  // refused, Conflict naming the key (the client asks again, and is checked again).
  Status serving_checked(const Caller& caller, const RoutedKey& r,
                         const store::ObjectInfo& info) const {
    if (!r.file || same_file(*r.file, info.etag)) return ok();
    Error e(Code::kConflict, "'" + unrouted(r.key) +
                                 "' was replaced after its access check (another file has its "
                                 "name now); ask again");
    log("refused " + caller.describe() + ": " + e.message());
    return std::unexpected(e);
  }

  // A team with credentials of its own proves with them that it may read `key` (listing:
  // list under the prefix `key`) of root `id`, before the daemon serves it anything of it,
  // cached or not. Verdicts (access, PermissionDenied, NotFound) are remembered for
  // access_ttl; other failures (the store unreachable) are not, so the next call asks again.
  Status prove_access(const Caller& caller, const std::string& id, const std::string& key,
                      bool listing) {
    const TeamGrant& team = *caller.team;
    if (!team.credentials) return ok();
    const std::string memo = team.name + '\n' + id + (listing ? "\nlist\n" : "\nkey\n") + key;
    const auto now = std::chrono::steady_clock::now();
    {
      MutexLock lock(access_mu);
      auto it = access.find(memo);
      if (it != access.end() && it->second.until > now) return it->second.verdict;
    }
    std::optional<std::string> root = router->root_of(id);
    if (!root) return fail(Code::kInternal, "root id " + id + " is not attached");
    RouterStore& as_team = *team_routers.at(&team);
    SLUICE_ASSIGN_OR_RETURN(std::string tid, as_team.attach(*root));
    Status verdict = ok();
    if (listing) {
      store::ListOptions lo;
      lo.prefix = tid + "/" + key;
      lo.max_keys = 1;
      auto page = as_team.list(lo);
      if (!page) verdict = Status(std::unexpected(page.error()));
    } else {
      auto info = as_team.stat(tid + "/" + key);
      if (!info) verdict = Status(std::unexpected(info.error()));
    }
    if (!verdict) {
      Code code = verdict.error().code();
      if (code != Code::kPermissionDenied && code != Code::kNotFound) return verdict;
      if (code == Code::kPermissionDenied) {
        verdict =
            fail(Code::kPermissionDenied, "team " + team.name + "'s credentials may not " +
                                              (listing ? "list '" : "read '") + key + "' of " +
                                              *root + ": " + verdict.error().message());
        log("refused " + caller.describe() + ": " + verdict.error().message());
      }
    }
    MutexLock lock(access_mu);
    if (access.size() >= 65536) access.clear();  // bounded: at worst a verdict is asked again
    access[memo] = AccessVerdict{verdict, now + o.access_ttl};
    return verdict;
  }

  static std::string unrouted(std::string_view key) {
    size_t slash = key.find('/');
    return slash == std::string_view::npos ? std::string(key) : std::string(key.substr(slash + 1));
  }

  static Json info_json(const store::ObjectInfo& i) {
    return Json{
        {"key", unrouted(i.key)}, {"size", i.size}, {"mtime_ns", i.mtime_ns}, {"etag", i.etag}};
  }

  Result<Reply> hello(const Caller& caller) {
    Reply r;
    r.body = {{"version", kProtocolVersion},
              {"team", caller.team->name},
              {"uid", caller.uid},
              {"pid", ::getpid()},
              {"chunk_size", cache->options().chunk_size},
              {"directory", cache->options().directory},
              {"windows", true}};
    if (!o.s3_endpoint.empty()) r.body["s3_endpoint"] = o.s3_endpoint;
    return r;
  }

  Result<Reply> stat(const Caller& caller, const Json& j) {
    SLUICE_ASSIGN_OR_RETURN(RoutedKey asked, routed_key(caller, j));
    SLUICE_ASSIGN_OR_RETURN(store::ObjectInfo info, cache->stat(asked.key));
    SLUICE_RETURN_IF_ERROR(serving_checked(caller, asked, info));
    Reply r;
    r.body = info_json(info);
    return r;
  }

  // Makes a range of an object resident in the cache, at most max_inline_bytes of it a
  // request (the client asks again from "end"); no byte goes to the client. A warm holds
  // an inline read slot (its run is read into memory of about that size).
  Result<Reply> warm(const Caller& caller, const Json& j) {
    SLUICE_ASSIGN_OR_RETURN(RoutedKey asked, routed_key(caller, j));
    const std::string& key = asked.key;
    // A local file is warmed only as the file checked (its size and etag are answered).
    if (asked.file) {
      SLUICE_ASSIGN_OR_RETURN(store::ObjectInfo info, cache->stat(key));
      SLUICE_RETURN_IF_ERROR(serving_checked(caller, asked, info));
    }
    const uint64_t most = std::clamp<uint64_t>(o.max_inline_bytes, 1, kMaxDataBytes);
    SLUICE_ASSIGN_OR_RETURN(uint64_t offset, get_u64_or(j, "offset", 0));
    SLUICE_ASSIGN_OR_RETURN(uint64_t length, get_u64_or(j, "length", most));
    SlotLease slot(inline_slots);
    if (!slot.held(o.frame_timeout))
      return fail(Code::kUnavailable, "daemon busy: every inline read slot is taken");
    SLUICE_ASSIGN_OR_RETURN(cache::TieredCache::Warmed w,
                            cache->warm(key, offset, std::min(length, most)));
    SLUICE_RETURN_IF_ERROR(serving_checked(caller, asked, w.info));
    Reply r;
    r.body = {{"size", w.info.size},
              {"etag", w.info.etag},
              {"end", w.end},
              {"fetched", w.fetched},
              {"not_kept", w.not_kept}};
    return r;
  }

  // The connection's reply window (see WindowPool; the size asked for is advice: every
  // window is window_size()); its descriptor is the reply's one.
  Result<Reply> map_window(const Json& j, WindowLease& lease) {
    SLUICE_ASSIGN_OR_RETURN(uint64_t want, get_u64(j, "bytes"));
    (void)want;
    SLUICE_ASSIGN_OR_RETURN(Window * w, lease.take());
    UniqueFd copy(::fcntl(w->fd().get(), F_DUPFD_CLOEXEC, 0));
    if (!copy.valid()) return fail_errno(errno, "passing a reply window");
    Reply r;
    r.body = {{"bytes", w->size()}};
    r.fds.push_back(std::move(copy));
    return r;
  }

  // A read answers a prefix of the range asked for: whole chunks that lie on NVMe as
  // descriptors, the rest inline up to max_inline_bytes, in the reply's data or (with
  // "window": true) in the connection's reply window. The client asks again for the rest.
  Result<Reply> read(const Caller& caller, const Json& j, Window* window) {
    SLUICE_ASSIGN_OR_RETURN(RoutedKey asked, routed_key(caller, j));
    const std::string& key = asked.key;
    SLUICE_ASSIGN_OR_RETURN(uint64_t offset, get_u64(j, "offset"));
    SLUICE_ASSIGN_OR_RETURN(uint64_t length, get_u64(j, "length"));
    SLUICE_ASSIGN_OR_RETURN(std::string if_match, get_string_or(j, "if_match", ""));
    SLUICE_ASSIGN_OR_RETURN(bool inline_only, get_bool_or(j, "inline_only", false));
    SLUICE_ASSIGN_OR_RETURN(bool to_window, get_bool_or(j, "window", false));
    if (to_window && !window)
      return fail(Code::kInvalidArgument, "a read into a window on a connection that mapped none");
    SLUICE_ASSIGN_OR_RETURN(store::ObjectInfo info, cache->stat(key));
    // Every byte below is of this version (handed-off chunks of it, reads pinned to it).
    SLUICE_RETURN_IF_ERROR(serving_checked(caller, asked, info));
    if (!if_match.empty() && if_match != info.etag)
      return fail(Code::kConflict,
                  "'" + unrouted(key) + "' changed: etag " + info.etag + ", not " + if_match);
    Reply r;
    r.body = {{"size", info.size}, {"etag", info.etag}, {"pieces", Json::array()}};
    uint64_t end = offset >= info.size ? offset : offset + std::min(length, info.size - offset);
    const uint64_t chunk = cache->options().chunk_size;
    const uint64_t max_inline = to_window ? window->size() - Window::kHeaderBytes
                                          : std::min<uint64_t>(o.max_inline_bytes, kMaxDataBytes);
    if (to_window) r.body["window_generation"] = window->generation();
    uint64_t inline_used = 0;  // bytes of r.data or of the window
    std::optional<SlotLease> slot;
    bool reserved = false;
    for (uint64_t pos = offset; pos < end && r.fds.size() < kMaxFds;) {
      uint64_t start = pos / chunk * chunk;
      uint64_t chunk_end = std::min(info.size, start + chunk);
      bool whole = pos == start && end >= chunk_end;
      if (whole && !inline_only && chunk_end - start >= o.handoff_min_bytes) {
        SLUICE_ASSIGN_OR_RETURN(std::optional<cache::ChunkExtent> x,
                                cache->locate(key, pos, info.etag));
        if (x) {  // of this version, and whole
          r.body["pieces"].push_back({{"offset", pos},
                                      {"length", x->length},
                                      {"fd", r.fds.size()},
                                      {"file_offset", x->file_offset},
                                      {"xxh3", x->xxh3}});
          r.fds.push_back(std::move(x->fd));
          team_bytes.at(caller.team)->add(x->length);
          handoff_chunks.fetch_add(1, std::memory_order_relaxed);
          handoff_bytes.fetch_add(x->length, std::memory_order_relaxed);
          pos = chunk_end;
          continue;
        }
      }
      uint64_t take = std::min(chunk_end, end) - pos;
      if (inline_used + take > max_inline) {
        if (inline_used > 0 || !r.fds.empty()) break;  // the client asks for the rest
        take = max_inline;
      }
      if (!slot) {
        slot.emplace(inline_slots);
        if (!slot->held(o.frame_timeout))
          return fail(Code::kUnavailable, "daemon busy: every inline read slot is taken");
      }
      if (!reserved && !to_window) {  // the inline bytes this reply can carry, allocated once
        r.data.reserve(std::min<uint64_t>(max_inline, end - pos));
        reserved = true;
      }
      const uint64_t at = inline_used;
      std::span<std::byte> into;
      if (to_window) {
        into = window->writable().subspan(Window::kHeaderBytes + at, take);
      } else {
        r.data.resize(at + take);
        into = std::span(r.data).subspan(at);
      }
      store::ReadOptions ro;
      ro.if_match = info.etag;
      SLUICE_ASSIGN_OR_RETURN(size_t n, cache->read_full(key, pos, into, ro));
      if (n != take)
        return fail(Code::kCorruption, "'" + unrouted(key) + "': " + std::to_string(n) +
                                           " bytes at offset " + std::to_string(pos) +
                                           " where the object holds " + std::to_string(take));
      inline_used += take;
      if (to_window) window_bytes.fetch_add(take, std::memory_order_relaxed);
      r.body["pieces"].push_back({{"offset", pos},
                                  {"length", take},
                                  {to_window ? "window_offset" : "data_offset",
                                   to_window ? Window::kHeaderBytes + at : at}});
      team_bytes.at(caller.team)->add(take);
      inline_bytes.fetch_add(take, std::memory_order_relaxed);
      pos += take;
    }
    return r;
  }

  // Holds one of the inline read slots (memory for one reply's bytes) while it lives.
  class SlotLease {
   public:
    explicit SlotLease(std::counting_semaphore<4096>& s) : s_(s) {}
    ~SlotLease() {
      if (held_) s_.release();
    }
    bool held(std::chrono::milliseconds wait) {
      if (!held_) held_ = s_.try_acquire_for(wait);
      return held_;
    }

   private:
    std::counting_semaphore<4096>& s_;
    bool held_ = false;
  };

  Result<Reply> list(const Caller& caller, const Json& j) {
    store::ListOptions lo;
    SLUICE_ASSIGN_OR_RETURN(lo.prefix, routed_prefix(caller, j));
    SLUICE_ASSIGN_OR_RETURN(lo.continuation, get_string_or(j, "continuation", ""));
    SLUICE_ASSIGN_OR_RETURN(uint64_t max_keys, get_u64_or(j, "max_keys", 500));
    lo.max_keys = static_cast<size_t>(std::clamp<uint64_t>(max_keys, 1, 500));  // fits a frame
    SLUICE_ASSIGN_OR_RETURN(store::ListPage page, cache->list(lo));
    const std::string id = lo.prefix.substr(0, lo.prefix.find('/'));
    Reply r;
    r.body = {{"objects", Json::array()}, {"next", page.next_token}};
    for (const store::ObjectInfo& i : page.objects) {
      // Local files the caller may not open (in a folder closed to it) are not named, nor
      // one that another file replaced since it was listed.
      auto file = open_as_caller(caller, id, unrouted(i.key), /*listing=*/false);
      if (!file || (*file && !same_file(**file, i.etag))) continue;
      r.body["objects"].push_back(info_json(i));
    }
    // Links the listing left out (store.h), named where the caller may list their folder.
    for (const store::SkippedKey& s : page.skipped) {
      if (!prove_file_access(caller, id, unrouted(s.key), /*listing=*/true)) continue;
      if (!r.body.contains("skipped")) r.body["skipped"] = Json::array();
      r.body["skipped"].push_back(Json{{"key", unrouted(s.key)}, {"reason", s.reason}});
    }
    return r;
  }

  Result<Reply> cache_stat() {
    Reply r;
    r.body = daemon_stats();  // node/stats.h
    return r;
  }

  ServerStats server_stats() {
    // Counters read one by one: each is exact, the set is not a snapshot (statistics).
    auto n = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
    return ServerStats{.connections = n(connections),
                       .connections_refused = n(refused),
                       .requests = n(requests),
                       .request_errors = n(errors),
                       .handoff_chunks = n(handoff_chunks),
                       .handoff_bytes = n(handoff_bytes),
                       .inline_bytes = n(inline_bytes),
                       .window_bytes = n(window_bytes),
                       .windows_bytes = windows_made()};
  }

  DaemonStats daemon_stats() {
    DaemonStats s;
    s.cache = cache->stats();
    s.chunk_size = cache->options().chunk_size;
    s.server = server_stats();
    if (charger) {
      const ledger::CacheChargerStats c = charger->stats();
      s.charging = ChargingStats{.ledger = o.ledger->describe(),
                                 .admitted_chunks = c.admitted_chunks,
                                 .admitted_bytes = c.admitted_bytes,
                                 .refused_chunks = c.refused_chunks,
                                 .refused_bytes = c.refused_bytes,
                                 .freed_bytes = c.freed_bytes,
                                 .uncharged_chunks = c.uncharged_chunks,
                                 .flush_errors = c.flush_errors};
    }
    if (o.peer.membership)
      for (const peer::PeerState& p : peers->peers())
        s.peers.push_back(PeerStatus{.name = p.name,
                                     .address = p.address,
                                     .self = p.self,
                                     .up = p.up,
                                     .state = std::string(p.state()),
                                     .fetched_chunks = p.fetched_chunks,
                                     .fetched_bytes = p.fetched_bytes,
                                     .errors = p.errors,
                                     .last_error = p.last_error});
    s.backing_bytes = peers->backing_bytes();
    s.peer_bytes = peers->peer_bytes();
    return s;
  }

  // A chunk (or part of one) for another daemon of the job; refusals are logged (at most
  // one line a second, the rest counted).
  Result<ChunkBody> peer_chunk(const peer::ChunkRequest& req, std::string_view signature) {
    Result<ChunkBody> r = serve_peer_chunk(req, signature);
    if (!r && r.error().code() != Code::kConflict && r.error().code() != Code::kNotFound) {
      peer_refused->add();
      int64_t now = telemetry::now_ns(), last = last_peer_log_ns.load(std::memory_order_relaxed);
      if (now - last > 1'000'000'000 &&
          last_peer_log_ns.compare_exchange_strong(last, now, std::memory_order_relaxed))
        log("peer request from '" + req.node + "' for '" + req.key +
            "' refused: " + r.error().message());
    }
    return r;
  }

  // The capabilities serving needs (drop_privileges), and why, from the grants and the
  // daemon's directories.
  uint64_t serving_capabilities(std::string& why) const {
    uint64_t need = 0;
    std::vector<std::string> reasons;
    const uid_t me = ::geteuid();
    std::string as_users, as_root;  // a team of each kind, named in the reasons
    for (const TeamGrant& t : o.teams) {
      const bool files = std::any_of(t.roots.begin(), t.roots.end(), [&](const std::string& g) {
        return g.starts_with("file://") || (g == "*" && &t == implicit_team);
      });
      if (!files) continue;
      auto holds = [&](auto pred) { return std::any_of(t.uids.begin(), t.uids.end(), pred); };
      if (as_users.empty() && holds([&](uint32_t u) { return u != me; })) as_users = t.name;
      if (as_root.empty() && holds([](uint32_t u) { return u == 0; })) as_root = t.name;
    }
    // A local file is opened as its caller (setfsuid, setfsgid, setgroups), then read by the
    // daemon: any file some caller may read, and uid 0 may read them all.
    if (!as_users.empty()) {
      need |= cap_bit(CAP_SETUID) | cap_bit(CAP_SETGID) | cap_bit(CAP_DAC_READ_SEARCH);
      reasons.push_back("local files are opened as the callers of team " + as_users);
    }
    if (!as_root.empty()) {
      need |= cap_bit(CAP_DAC_READ_SEARCH);
      reasons.push_back("team " + as_root + " holds uid 0, which may read every local file");
    }
    for (const std::string& dir : {o.cache.directory, o.peer.objects_directory}) {
      struct stat st;
      if (dir.empty() || ::stat(dir.c_str(), &st) != 0 || st.st_uid == me) continue;
      need |= cap_bit(CAP_DAC_OVERRIDE);
      reasons.push_back(dir + " belongs to uid " + std::to_string(st.st_uid) +
                        ", not the daemon's (chown it to drop cap_dac_override)");
    }
    why.clear();
    for (const std::string& r : reasons) why += (why.empty() ? "" : "; ") + r;
    return need;
  }

  // Whether peers may ask for a root: an object store's when a team's grant covers it ("*"
  // included); a local one only within PeerConfig::file_roots, whatever the teams' grants
  // (they say which callers may read, whose rights are checked; no peer's can be).
  bool peers_may_read(std::string_view root) const {
    if (root.starts_with("file://"))
      return std::any_of(o.peer.file_roots.begin(), o.peer.file_roots.end(),
                         [&](const std::string& g) { return root_granted(root, g); });
    return std::any_of(o.teams.begin(), o.teams.end(), [&](const TeamGrant& t) {
      return std::any_of(t.roots.begin(), t.roots.end(),
                         [&](const std::string& g) { return root_granted(root, g); });
    });
  }

  // Checked (signature, asker and target in the membership, root granted, key, this
  // daemon the owner), then read through this daemon's cache, never forwarded to a third
  // daemon. Whole chunks on NVMe are sent from their file unless the asker wants them
  // checked (verify); the rest from the bytes read.
  Result<ChunkBody> serve_peer_chunk(const peer::ChunkRequest& req, std::string_view signature) {
    SLUICE_RETURN_IF_ERROR(
        peer::verify_chunk_request(req, signature, o.peer.secret, std::time(nullptr)));
    const peer::Membership& members = *o.peer.membership;
    if (req.target != members.self().name)
      return fail(Code::kPermissionDenied,
                  "the request is for '" + req.target + "', not this node");
    if (std::none_of(members.members().begin(), members.members().end(),
                     [&](const peer::Member& m) { return m.name == req.node; }))
      return fail(Code::kPermissionDenied, "'" + req.node + "' is not a member of this job");
    SLUICE_ASSIGN_OR_RETURN(std::string root, normalize_root(req.root));
    // A local root as the directory it resolves to, as a caller's is (the asker names it so).
    const std::optional<std::string> real =
        root.starts_with("file://") ? real_file_root(root) : std::nullopt;
    if (!peers_may_read(real.value_or(root)) || (real && *real != root))
      return fail(Code::kPermissionDenied,
                  "root '" + root + "' is not served to peers here" +
                      (root.starts_with("file://") ? " (local files: --peer-file-root)" : ""));
    for (const std::string& own : own_dirs) {
      if (root_granted(root, own))
        return fail(Code::kPermissionDenied,
                    "root '" + root + "' is inside the daemon's own directory");
    }
    SLUICE_RETURN_IF_ERROR(store::validate_key(req.key));
    const std::string id = RouterStore::root_id(root);
    if (!members.is_self(members.owner(id + "/" + req.key + "#" + std::to_string(req.index))))
      return fail(Code::kUnsupported, "chunk " + std::to_string(req.index) + " of '" + req.key +
                                          "' is not this node's: do the peer lists differ?");
    SLUICE_ASSIGN_OR_RETURN(std::string attached, router->attach(root));
    SLUICE_RETURN_IF_ERROR(outside_own_dirs(attached, req.key));
    const std::string key = attached + "/" + req.key;
    store::ServingPeer serving;  // not sent on to a peer, not this node's declared order
    SLUICE_ASSIGN_OR_RETURN(store::ObjectInfo info, cache->stat(key));
    if (info.etag != req.etag)
      return fail(Code::kConflict,
                  "'" + req.key + "' is etag " + info.etag + " here, not " + req.etag);
    const uint64_t chunk = cache->options().chunk_size;
    if (req.index >= (info.size + chunk - 1) / chunk)
      return fail(Code::kInvalidArgument,
                  "'" + req.key + "' has no chunk " + std::to_string(req.index));
    const uint64_t start = req.index * chunk, length = std::min(chunk, info.size - start);
    if (req.length == 0 || req.offset >= length || req.length > length - req.offset)
      return fail(Code::kInvalidArgument, "bytes " + std::to_string(req.offset) + "+" +
                                              std::to_string(req.length) +
                                              " are not within chunk " + std::to_string(req.index) +
                                              " of '" + req.key + "'");
    ChunkBody body;
    body.etag = info.etag;
    body.length = req.length;
    std::optional<cache::ChunkExtent> x;
    if (!req.verify && req.offset == 0 && req.length == length) {
      SLUICE_ASSIGN_OR_RETURN(x, cache->locate(key, start, info.etag));
    }
    if (x) {  // of this version, and whole
      body.fd = std::move(x->fd);
      body.file_offset = x->file_offset;
      body.xxh3 = x->xxh3;
    } else {
      body.bytes.resize(req.length);
      store::ReadOptions ro;
      ro.if_match = info.etag;
      SLUICE_ASSIGN_OR_RETURN(size_t n, cache->read_full(key, start + req.offset, body.bytes, ro));
      if (n != req.length)
        return fail(Code::kCorruption,
                    "'" + req.key + "' ended within chunk " + std::to_string(req.index));
      body.xxh3 = xxh3_64(body.bytes.data(), body.bytes.size());
    }
    body.reply_signature =
        peer::sign_chunk_reply(signature, body.etag, body.length, body.xxh3, o.peer.secret);
    served_to_peers->add(req.length);
    return body;
  }

  std::string metrics() {
    cache::CacheStats s = cache->stats();
    registry.gauge("sluice_cache_bytes", {{"tier", "ram"}}, "Bytes a tier holds")
        .set(static_cast<int64_t>(s.ram.bytes));
    registry.gauge("sluice_cache_bytes", {{"tier", "nvme"}})
        .set(static_cast<int64_t>(s.disk.bytes));
    registry.gauge("sluice_cache_capacity_bytes", {{"tier", "ram"}}, "A tier's byte limit")
        .set(static_cast<int64_t>(s.ram.capacity));
    registry.gauge("sluice_cache_capacity_bytes", {{"tier", "nvme"}})
        .set(static_cast<int64_t>(s.disk.capacity));
    registry.gauge("sluice_connections", {}, "Local client connections open")
        .set(static_cast<int64_t>(connections.load(std::memory_order_relaxed)));
    return registry.prometheus_text();
  }

  Result<Reply> evict_or_pin(const Caller& caller, const Json& j, FrameType type) {
    SLUICE_ASSIGN_OR_RETURN(std::string prefix, routed_prefix(caller, j));
    Result<uint64_t> n = 0;
    if (type == FrameType::kEvict) {
      n = cache->evict(prefix);
    } else {
      SLUICE_ASSIGN_OR_RETURN(bool pinned, get_bool_or(j, "pinned", true));
      n = cache->pin(prefix, pinned);
    }
    if (!n) return std::unexpected(n.error());
    Reply r;
    r.body = {{"chunks", *n}};
    return r;
  }

  // The reads a client will make, for the cache to fetch ahead: each key checked as a read
  // of it would be (the team's roots, its own credentials), then declared in one go.
  Result<Reply> declare(const Caller& caller, const Json& j) {
    SLUICE_ASSIGN_OR_RETURN(std::string id, root_id(caller, j));
    auto reads = j.find("reads");
    if (reads == j.end() || !reads->is_array() || reads->size() > kMaxDeclareReads)
      return fail(Code::kInvalidArgument, "field 'reads' must be an array of at most " +
                                              std::to_string(kMaxDeclareReads) +
                                              " [key, offset, length]");
    std::vector<cache::PlannedRead> order;
    order.reserve(reads->size());
    for (const Json& r : *reads) {
      if (!r.is_array() || r.size() != 3 || !r[0].is_string() || !r[1].is_number_unsigned() ||
          !r[2].is_number_unsigned())
        return fail(Code::kInvalidArgument, "a read must be [key, offset, length]");
      SLUICE_ASSIGN_OR_RETURN(RoutedKey key, routed(caller, id, r[0].get<std::string>()));
      order.push_back({std::move(key.key), r[1].get<uint64_t>(), r[2].get<uint64_t>()});
    }
    SLUICE_RETURN_IF_ERROR(cache->declare(order));
    Reply reply;
    reply.body = {{"declared", order.size()}};
    return reply;
  }

  // Cached chunks of one root under a prefix, or of every root the team may read.
  Result<Reply> chunks(const Caller& caller, const Json& j) {
    std::string prefix;
    std::string want;  // without a root: the prefix every root's keys must start with
    if (j.contains("root")) {
      SLUICE_ASSIGN_OR_RETURN(prefix, routed_prefix(caller, j));
    } else {
      SLUICE_ASSIGN_OR_RETURN(want, get_string_or(j, "prefix", ""));
      SLUICE_RETURN_IF_ERROR(check_prefix(want));
    }
    constexpr size_t kMaxEntries = 4000;  // keeps the reply within a frame
    Reply r;
    r.body = {{"chunks", Json::array()}, {"truncated", false}};
    std::map<std::string, bool> openable;
    for (const cache::CachedChunk& c : cache->chunks(prefix)) {
      size_t slash = c.key.find('/');
      std::optional<std::string> root = router->root_of(std::string_view(c.key).substr(0, slash));
      if (!root) continue;
      if (!may_read(*caller.team, *root) &&
          !granted_key(caller, c.key.substr(0, slash), unrouted(c.key)))
        continue;
      if (!unrouted(c.key).starts_with(want)) continue;
      auto [seen, fresh] = openable.try_emplace(c.key, false);
      if (fresh)  // one open per file, however many of its chunks are cached
        seen->second =
            prove_file_access(caller, c.key.substr(0, slash), unrouted(c.key), false).has_value();
      if (!seen->second) continue;
      if (r.body["chunks"].size() == kMaxEntries) {
        r.body["truncated"] = true;
        break;
      }
      r.body["chunks"].push_back({{"root", *root},
                                  {"key", unrouted(c.key)},
                                  {"etag", c.etag},
                                  {"index", c.index},
                                  {"length", c.length},
                                  {"in_ram", c.in_ram},
                                  {"on_disk", c.on_disk},
                                  {"pinned", c.pinned}});
    }
    return r;
  }
};

namespace {

// Refuses a socket path another daemon answers on; removes one a dead daemon left.
Status claim_socket_path(const std::string& path) {
  // Its directory is made as the cache's is (a --config naming /run/sluice/ on a fresh node).
  if (auto dir = std::filesystem::path(path).parent_path(); !dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return fail_errno(ec.value(), "create the socket's directory " + dir.string());
  }
  struct stat sb;
  if (::lstat(path.c_str(), &sb) != 0) return ok();
  if (!S_ISSOCK(sb.st_mode))
    return fail(Code::kAlreadyExists, "socket path " + path + " exists and is not a socket");
  UniqueFd probe(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  if (::connect(probe.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0)
    return fail(Code::kUnavailable, "another sluiced answers on " + path);
  if (::unlink(path.c_str()) != 0 && errno != ENOENT)
    return fail_errno(errno, "remove stale socket " + path);
  return ok();
}

}  // namespace

Result<std::unique_ptr<NodeServer>> NodeServer::open(ServerOptions options) {
  if (options.cache.directory.empty())
    return fail(Code::kInvalidArgument, "sluiced: a cache directory is required");
  if (options.socket_path.empty() || options.socket_path.size() >= sizeof(sockaddr_un::sun_path))
    return fail(Code::kInvalidArgument,
                "sluiced: socket path '" + options.socket_path + "' is empty or longer than " +
                    std::to_string(sizeof(sockaddr_un::sun_path) - 1) + " bytes");
  const bool implicit_team = options.teams.empty();
  if (implicit_team) {  // the daemon's own uid: everything it may read itself
    options.teams.push_back(TeamGrant{"default", {static_cast<uint32_t>(::getuid())}, {"*"}});
  }
  // A file grant names the directory its path resolves to now, as requests' roots do.
  auto resolve_grant = [](std::string& g) -> Status {
    SLUICE_ASSIGN_OR_RETURN(std::string n, normalize_root(g));
    std::optional<std::string> real = n.starts_with("file://") ? real_file_root(n) : std::nullopt;
    g = real.value_or(n) + (g.ends_with('/') && !real.value_or(n).ends_with('/') ? "/" : "");
    return ok();
  };
  for (TeamGrant& t : options.teams) {
    for (std::string& g : t.roots) {
      if (g == "*") continue;
      if (Status s = resolve_grant(g); !s)
        return std::unexpected(s.error().with_context("team " + t.name));
    }
    if (t.credentials) t.credentials->no_symlinked_root = true;
  }
  for (std::string& g : options.peer.file_roots) {
    if (!g.starts_with("file://"))
      return fail(Code::kInvalidArgument, "sluiced: peer file root '" + g +
                                              "' is not a file:// root (object stores are "
                                              "served to peers by the teams' grants)");
    if (Status s = resolve_grant(g); !s)
      return std::unexpected(s.error().with_context("peer file roots"));
  }
  // File roots are opened at the path their grant was checked against, which holds no
  // symlink: one swapped in later cannot lead the store elsewhere.
  options.stores.no_symlinked_root = true;
  SLUICE_RETURN_IF_ERROR(claim_socket_path(options.socket_path));

  auto impl = std::make_unique<Impl>(std::move(options));
  ServerOptions& o = impl->o;
  if (implicit_team) impl->implicit_team = &o.teams.front();
  if (o.cache.store_id.empty()) o.cache.store_id = "sluiced";
  o.cache.registry = &impl->registry;
  for (const TeamGrant& t : o.teams) {
    impl->team_bytes[&t] = &impl->registry.counter("sluice_team_bytes_total", {{"team", t.name}},
                                                   "Bytes served to a team's processes");
  }
  for (const TeamGrant& t : o.teams) {
    if (t.credentials) impl->team_routers[&t] = std::make_unique<RouterStore>(*t.credentials, "");
  }
  impl->served_to_peers = &impl->registry.counter("sluice_peer_served_bytes_total", {},
                                                  "Bytes of chunks served to other daemons");
  impl->peer_refused = &impl->registry.counter(
      "sluice_peer_refused_total", {}, "Peer chunk requests refused (signature, root, range)");
  auto router = std::make_unique<RouterStore>(o.stores, o.cache.directory + "/roots");
  impl->router = router.get();
  peer::PeerOptions po;
  if (o.peer.membership) {
    if (o.peer.secret.size() < 16)
      return fail(Code::kInvalidArgument,
                  "sluiced: peers need a node secret of at least 16 bytes (--node-secret-file)");
    if (!o.peer.listen)
      return fail(Code::kInvalidArgument, "sluiced: peers need the HTTP port (--peer-listen)");
    po.membership = o.peer.membership;
  } else {
    auto alone = peer::Membership::make({peer::Member{"local", "127.0.0.1", 1}}, "local");
    if (!alone) return std::unexpected(alone.error());
    po.membership = std::make_shared<const peer::Membership>(std::move(*alone));
  }
  po.secret = o.peer.secret;
  SLUICE_ASSIGN_OR_RETURN(o.cache.chunk_size, cache::chunk_size_for(o.cache));
  po.chunk_size = o.cache.chunk_size;
  po.timeout = o.peer.timeout;
  po.retry_after = o.peer.retry_after;
  po.registry = &impl->registry;
  // Peers are asked only for roots they serve (the same settings on every member): a local
  // root outside PeerConfig::file_roots is read here.
  po.root_of = [i = impl.get(), r = router.get()](std::string_view id) {
    std::optional<std::string> root = r->root_of(id);
    if (root && root->starts_with("file://") && !i->peers_may_read(*root))
      return std::optional<std::string>();
    return root;
  };
  auto peers = std::make_unique<peer::PeerStore>(std::move(router), std::move(po));
  impl->peers = peers.get();
  if (o.peer.membership) {
    o.cache.fill_group = [p = peers.get()](std::string_view key, uint64_t index) {
      return p->owner_index(key, index);
    };
  }
  if (o.ledger) SLUICE_RETURN_IF_ERROR(impl->charge_cache());
  SLUICE_ASSIGN_OR_RETURN(impl->cache, cache::TieredCache::open(std::move(peers), o.cache));
  // Chunks an embedded cache cut in this directory are keyed by their store, not by
  // sluiced's roots: the daemon could never serve them (docs/sluiced.md).
  if (uint64_t foreign = impl->cache->drop_other_stores())
    impl->log("dropped " + std::to_string(foreign) + " chunks in " + o.cache.directory +
              " kept for another store (an embedded cache, or sluiced on another endpoint): "
              "this daemon keys chunks by its roots and could not serve them");
  // The cache adopted what it found: the charger may now tell the ledger.
  if (impl->charger) SLUICE_RETURN_IF_ERROR(impl->charger->start());
  // The cache holds its own copies; these would keep the charger alive past `registry`.
  o.cache.admit_chunk = nullptr;
  o.cache.chunk_adopted = nullptr;
  o.cache.chunk_freed = nullptr;
  // Chunk files are reached only through descriptors the daemon hands out: no other user
  // may walk the directory.
  if (::chmod(o.cache.directory.c_str(), 0700) != 0)
    return fail_errno(errno, "chmod 0700 " + o.cache.directory);

  impl->listen_fd.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!impl->listen_fd.valid()) return fail_errno(errno, "socket");
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, o.socket_path.c_str(), o.socket_path.size() + 1);
  if (::bind(impl->listen_fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
    return fail_errno(errno, "bind " + o.socket_path);
  // Anyone may connect; SO_PEERCRED and the team grants decide what they may do.
  if (::chmod(o.socket_path.c_str(), 0666) != 0) return fail_errno(errno, "chmod " + o.socket_path);
  if (::listen(impl->listen_fd.get(), 128) != 0)
    return fail_errno(errno, "listen " + o.socket_path);
  impl->stop_fd.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!impl->stop_fd.valid()) return fail_errno(errno, "eventfd");
  if (o.peer.listen) {
    PeerHttpOptions ho;
    ho.host = o.peer.host;
    ho.port = o.peer.port;
    ho.max_connections = o.peer.max_connections;
    ho.max_per_ip = o.peer.max_per_ip;
    Impl* i = impl.get();
    if (o.peer.membership) {
      ho.chunk = [i](const peer::ChunkRequest& r, std::string_view sig) {
        return i->peer_chunk(r, sig);
      };
    }
    ho.metrics = [i] { return i->metrics(); };
    ho.log = o.log;
    if (o.peer.membership && !o.peer.objects_directory.empty()) {
      ObjectSpaceOptions so;
      so.directory = o.peer.objects_directory;
      so.secret = o.peer.secret;
      so.membership = o.peer.membership;
      SLUICE_ASSIGN_OR_RETURN(impl->objects, ObjectSpace::open(std::move(so)));
      ho.object = [i](const peer::ObjectRequest& r, std::string_view sig,
                      std::span<const std::byte> body) { return i->objects->handle(r, sig, body); };
      ho.secret = o.peer.secret;
    }
    SLUICE_ASSIGN_OR_RETURN(impl->http, PeerHttpServer::start(std::move(ho)));
  }
  for (const std::string& dir : {o.cache.directory, o.peer.objects_directory}) {
    auto real = dir.empty() ? std::nullopt : real_file_root("file://" + dir);
    if (real) impl->own_dirs.push_back(*real);
  }
  return std::unique_ptr<NodeServer>(new NodeServer(std::move(impl)));
}

NodeServer::NodeServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

NodeServer::~NodeServer() {
  stop();
  MutexLock lock(impl_->mu);
  for (Impl::Conn& c : impl_->conns) {
    if (c.thread.joinable()) c.thread.join();
  }
  ::unlink(impl_->o.socket_path.c_str());
}

Status NodeServer::serve() {
  Impl& i = *impl_;
  for (;;) {
    pollfd p[2] = {{i.listen_fd.get(), POLLIN, 0}, {i.stop_fd.get(), POLLIN, 0}};
    int n = ::poll(p, 2, -1);
    if (n < 0 && errno != EINTR) return fail_errno(errno, "poll " + i.o.socket_path);
    if (p[1].revents) break;
    if (n <= 0 || !(p[0].revents & POLLIN)) continue;
    UniqueFd c(::accept4(i.listen_fd.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!c.valid()) {
      if (errno == EMFILE || errno == ENFILE) {
        i.log("accept: out of descriptors; pausing");
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      continue;
    }
    i.admit(std::move(c));
  }
  // Stopping: wake every connection (a blocked receive sees the shutdown), then join them.
  std::list<Impl::Conn> conns;
  {
    MutexLock lock(i.mu);
    for (Impl::Conn& c : i.conns) {
      if (!c.done) ::shutdown(c.fd, SHUT_RDWR);
    }
    conns.splice(conns.end(), i.conns);
  }
  for (Impl::Conn& c : conns) c.thread.join();
  return ok();
}

void NodeServer::stop() {
  uint64_t one = 1;
  (void)!::write(impl_->stop_fd.get(), &one, sizeof one);
}

ServerStats NodeServer::stats() const {
  return impl_->server_stats();
}

DaemonStats NodeServer::daemon_stats() const {
  return impl_->daemon_stats();
}

cache::TieredCache& NodeServer::cache() {
  return *impl_->cache;
}

uint16_t NodeServer::peer_port() const {
  return impl_->http ? impl_->http->port() : 0;
}

std::vector<peer::PeerState> NodeServer::peers() const {
  return impl_->o.peer.membership ? impl_->peers->peers() : std::vector<peer::PeerState>();
}

std::string NodeServer::metrics_text() const {
  return impl_->metrics();
}

namespace {

// capabilities(7)'s names, by number, for the log.
// clang-format off
constexpr const char* kCapNames[] = {
    "cap_chown", "cap_dac_override", "cap_dac_read_search", "cap_fowner", "cap_fsetid",
    "cap_kill", "cap_setgid", "cap_setuid", "cap_setpcap", "cap_linux_immutable",
    "cap_net_bind_service", "cap_net_broadcast", "cap_net_admin", "cap_net_raw",
    "cap_ipc_lock", "cap_ipc_owner", "cap_sys_module", "cap_sys_rawio", "cap_sys_chroot",
    "cap_sys_ptrace", "cap_sys_pacct", "cap_sys_admin", "cap_sys_boot", "cap_sys_nice",
    "cap_sys_resource", "cap_sys_time", "cap_sys_tty_config", "cap_mknod", "cap_lease",
    "cap_audit_write", "cap_audit_control", "cap_setfcap", "cap_mac_override", "cap_mac_admin",
    "cap_syslog", "cap_wake_alarm", "cap_block_suspend", "cap_audit_read", "cap_perfmon",
    "cap_bpf", "cap_checkpoint_restore"};
// clang-format on

std::vector<std::string> cap_names(uint64_t set) {
  std::vector<std::string> out;
  for (int cap = 0; cap < 64; ++cap) {
    if (!(set & cap_bit(cap))) continue;
    out.push_back(cap < static_cast<int>(std::size(kCapNames)) ? kCapNames[cap]
                                                               : "cap_" + std::to_string(cap));
  }
  return out;
}

// What every thread keeps, and the first error a thread met, for the signal handler below
// (lock-free atomics: async-signal-safe). Set before any thread is signalled.
std::atomic<uint64_t> g_keep_caps{0};
std::atomic<int> g_drop_errno{0};

// Drops, in the calling thread, every capability outside `keep`: from the bounding set
// (where CAP_SETPCAP allows; done first, while it may still be effective), the ambient,
// inheritable, permitted and effective sets; and sets no_new_privs. System calls only
// (async-signal-safe). Returns 0 or an errno.
int drop_in_this_thread(uint64_t keep) {
  for (int cap = 0; cap < 64; ++cap) {
    if (keep & cap_bit(cap)) continue;
    const int held = ::prctl(PR_CAPBSET_READ, cap, 0, 0, 0);
    if (held < 0) break;  // past the kernel's last capability
    if (held == 1) (void)::prctl(PR_CAPBSET_DROP, cap, 0, 0, 0);  // EPERM without CAP_SETPCAP
  }
  (void)::prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);  // EINVAL before Linux 4.3
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return errno;
  std::optional<CapSets> c = get_caps();
  if (!c) return errno;
  c->effective &= keep;
  c->permitted &= keep;
  c->inheritable = 0;
  return set_caps(*c) ? 0 : errno;
}

void drop_on_signal(int) {
  const int saved = errno;
  if (int err = drop_in_this_thread(g_keep_caps.load()); err != 0) {
    int none = 0;
    g_drop_errno.compare_exchange_strong(none, err);
  }
  errno = saved;
}

// A thread's sets as /proc/self/task/TID/status shows them; nullopt when it is gone.
struct ThreadCaps {
  std::string name;
  uint64_t inheritable = 0, permitted = 0, effective = 0, ambient = 0;
  bool no_new_privs = true;  // a kernel without the line (before 4.10) is not held to it
};

std::optional<ThreadCaps> thread_caps(pid_t tid) {
  std::ifstream in("/proc/self/task/" + std::to_string(tid) + "/status");
  if (!in) return std::nullopt;
  ThreadCaps t;
  std::string line;
  auto hex = [&](size_t at) { return std::strtoull(line.c_str() + at, nullptr, 16); };
  while (std::getline(in, line)) {
    if (line.starts_with("Name:")) t.name = line.substr(line.find_first_not_of(" \t", 5));
    if (line.starts_with("CapInh:")) t.inheritable = hex(7);
    if (line.starts_with("CapPrm:")) t.permitted = hex(7);
    if (line.starts_with("CapEff:")) t.effective = hex(7);
    if (line.starts_with("CapAmb:")) t.ambient = hex(7);
    if (line.starts_with("NoNewPrivs:")) t.no_new_privs = hex(11) == 1;
  }
  return t;
}

std::vector<pid_t> task_ids() {
  std::vector<pid_t> out;
  std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir("/proc/self/task"), ::closedir);
  if (!d) return out;
  while (dirent* e = ::readdir(d.get())) {
    if (e->d_name[0] >= '0' && e->d_name[0] <= '9')
      out.push_back(static_cast<pid_t>(std::strtol(e->d_name, nullptr, 10)));
  }
  return out;
}

}  // namespace

std::string Privileges::describe() const {
  std::string line = "capabilities: ";
  auto join = [](const std::vector<std::string>& v) {
    std::string s;
    for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
    return s;
  };
  line += kept.empty() ? "kept none" : "kept " + join(kept) + (why.empty() ? "" : " (" + why + ")");
  if (!dropped.empty())
    line += "; dropped " + (dropped.size() <= 8 ? join(dropped) : std::to_string(dropped.size()));
  line += "; inheritable and ambient sets empty";
  if (no_new_privs) line += ", no_new_privs";
  return line + " (" + std::to_string(threads) + " threads)";
}

// Capabilities belong to each thread, and threads already run (the cache's writer, the HTTP
// server's): each is sent a signal whose handler drops them (what libcap's psx does), and
// /proc/self/task says when every thread has, threads started meanwhile included.
Result<Privileges> NodeServer::drop_privileges() {
  std::optional<CapSets> start = get_caps();
  if (!start) return fail_errno(errno, "capget");
  Privileges p;
  const uint64_t keep = impl_->serving_capabilities(p.why) & start->permitted;
  if (keep == 0) p.why.clear();
  int sig = -1;  // a real-time signal nobody handles
  for (int s = SIGRTMIN + 4; s <= SIGRTMAX && sig < 0; ++s) {
    struct sigaction old = {};
    if (::sigaction(s, nullptr, &old) == 0 && !(old.sa_flags & SA_SIGINFO) &&
        old.sa_handler == SIG_DFL)
      sig = s;
  }
  if (sig < 0) return fail(Code::kInternal, "no free signal to make every thread drop privileges");
  g_keep_caps.store(keep);
  g_drop_errno.store(0);
  struct sigaction sa = {};
  sa.sa_handler = drop_on_signal;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  // Left in place: a late signal only drops again what is gone.
  if (::sigaction(sig, &sa, nullptr) != 0) return fail_errno(errno, "sigaction");
  // This thread first: the threads it starts from now on inherit its sets.
  if (int err = drop_in_this_thread(keep); err != 0)
    return fail_errno(err, "dropping capabilities");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  std::map<pid_t, std::chrono::steady_clock::time_point> signalled;
  for (;;) {
    std::string holding;
    unsigned threads = 0;
    const auto now = std::chrono::steady_clock::now();
    for (pid_t tid : task_ids()) {
      std::optional<ThreadCaps> t = thread_caps(tid);
      if (!t) continue;  // ended
      // io_uring's workers take no signal; each serves one thread's reads and writes of
      // descriptors already open (the permission checks were made at open), and is gone
      // after a few idle seconds; those started from now on have the dropped sets.
      if (t->name.starts_with("iou-")) continue;
      ++threads;
      if ((t->permitted & ~keep) == 0 && (t->effective & ~keep) == 0 && t->inheritable == 0 &&
          t->ambient == 0 && t->no_new_privs)
        continue;
      holding += (holding.empty() ? "" : ", ") + t->name + " (" + std::to_string(tid) + ")";
      auto [at, fresh] = signalled.try_emplace(tid, now);
      // Once, and again after a while (real-time signals queue: not at every pass).
      if (fresh || now - at->second > std::chrono::milliseconds(200)) {
        at->second = now;
        if (::syscall(SYS_tgkill, ::getpid(), tid, sig) != 0 && errno != ESRCH)
          return fail_errno(errno, "signalling thread " + std::to_string(tid));
      }
    }
    if (int err = g_drop_errno.load(); err != 0)
      return fail_errno(err, "a thread dropping its capabilities");
    if (holding.empty()) {
      p.threads = threads;
      break;
    }
    if (now > deadline)
      return fail(Code::kInternal,
                  "threads still hold capabilities after 10 s (do they block signal " +
                      std::to_string(sig) + "?): " + holding);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  p.kept = cap_names(keep);
  p.dropped = cap_names((start->permitted | start->effective | start->inheritable) & ~keep);
  p.no_new_privs = true;
  return p;
}

}  // namespace sluice::node
