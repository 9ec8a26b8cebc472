// sluice/client/session.h: opening things the way sluice does, from explicit options.
//
//   client::SessionOptions o;
//   o.home = "/var/lib/sluice";
//   o.s3 = client::s3_options_from_environment().value();   // or filled by hand
//   o.charging = client::ledger_charging();  // sluice/client/ledger.h (sluice::client)
//   client::Session session(std::move(o));
//   auto data = session.open_cached("s3://datasets").value();  // sluiced, else embedded
//   auto out = session.charged(session.open_store("s3://ckpts").value()).value();
//
// The library's composition root: the CLI, sluiced and every binding open stores, the
// node's cache and the ledger through a Session, so a URI means the same everywhere. It
// reads no environment (client/environment.h turns that into SessionOptions). What it
// opens does not depend on the Session staying alive. Thread-safe (const).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "sluice/cache/control.h"
#include "sluice/cache/tiered_cache.h"
#include "sluice/core/status.h"
#include "sluice/ledger/ledger.h"
#include "sluice/s3/store.h"
#include "sluice/store/store.h"

namespace sluice::client {

// Which ledger writes are charged through and management commands open.
struct LedgerChoice {
  // A ledger URI (sqlite:///path, a path, postgresql://..., libpq key=value). Empty: the
  // embedded one, HOME/ledger.db: writes are charged through it only when it exists.
  std::string uri;
  // Where `uri` came from, for messages ("--ledger", "$SLUICE_LEDGER").
  std::string source;
};

class Session;

// How writes are charged to the project that owns them. client::ledger_charging()
// (sluice/client/ledger.h, in sluice::client) is the ledger's; the interface keeps the ledger
// out of sluice::client_core, so a program that only reads and copies links no SQLite or
// libpq.
class Charging {
 public:
  virtual ~Charging() = default;
  // `store` with its writes charged (as `kind` when given, else each project's default), or
  // as it is when there is nothing to charge. An error when a ledger is there but cannot be
  // read: a write is never let through uncounted.
  virtual Result<std::shared_ptr<store::Store>> charged(const Session& session,
                                                        std::shared_ptr<store::Store> store,
                                                        std::optional<ledger::Kind> kind) const = 0;
};

struct SessionOptions {
  std::string home;  // where defaults live: cache/, sluiced.sock, ledger.db. Required.
  // The embedded cache, for reads through the node's cache when no daemon answers. An
  // empty directory means HOME/cache.
  cache::CacheOptions cache;
  // sluiced's socket: reads through the node's cache go there when it answers. Empty:
  // HOME/sluiced.sock; "none": never the daemon, always the embedded cache.
  std::string daemon_socket;
  // Told why a read through the node's cache uses the embedded cache (no daemon answered).
  std::function<void(const std::string&)> on_fallback;
  s3::S3Options s3;  // for s3:// URIs
  LedgerChoice ledger;
  // How writes are charged (client::ledger_charging() with sluice::client). Null: a write is
  // refused wherever a ledger is chosen or HOME/ledger.db exists (it would go uncounted),
  // and let through as it is elsewhere.
  std::shared_ptr<const Charging> charging;
};

// How a Session opens one store.
struct OpenOptions {
  bool create = true;  // file://: make a missing directory (false: NotFound)
  // Where the backends (S3) and the embedded cache record their metrics; null: nowhere.
  // (Not a telemetry wrapper around the store: that would hide the cache's seams.)
  telemetry::Registry* registry = nullptr;
};

// Where reads through the node's cache go now (Session::cache_route).
struct CacheRoute {
  bool daemon = false;    // sluiced answered on `socket`
  std::string socket;     // the daemon's socket ("" when the daemon is turned off)
  std::string directory;  // the embedded cache's directory (used when !daemon)
  std::string reason;     // why the embedded cache (no daemon answered, or turned off)
};

class Session {
 public:
  explicit Session(SessionOptions options);

  const SessionOptions& options() const { return o_; }
  // The cache directory and socket with their defaults filled in.
  std::string cache_directory() const;
  std::string daemon_socket() const;
  static std::string default_daemon_socket(const std::string& home);  // HOME/sluiced.sock
  // The embedded cache's options (directory filled in).
  cache::CacheOptions cache_options() const;

  // Options for store::open_store that carry the S3 settings (s3:// registered).
  store::StoreOptions store_options(const OpenOptions& how = {}) const;
  // The store a URI names (s3://bucket, mem://name, file:///dir), uncached.
  Result<std::unique_ptr<store::Store>> open_store(const std::string& store_uri,
                                                   const OpenOptions& how = {}) const;
  // The store read through the node's cache: through sluiced when it answers on the
  // socket, else the embedded cache (on_fallback says why).
  Result<std::unique_ptr<store::Store>> open_cached(const std::string& store_uri,
                                                    const OpenOptions& how = {}) const;

  // Asks the daemon socket now whether sluiced answers: where open_cached's reads would go.
  // (open_cached decides again at each open; a daemon may start or stop in between.)
  CacheRoute cache_route() const;

  // The node's cache to look after (what it holds, warm, pin, evict, verify): sluiced's
  // when it answers on the socket, else the cache directory itself. An error when a socket
  // was chosen and nothing answers there, or when the daemon refuses this caller.
  Result<std::unique_ptr<cache::Control>> cache_control() const;

  // The ledger's URI (the embedded one's when none was chosen); the ledger itself is opened
  // by client::open_ledger (sluice/client/ledger.h).
  std::string ledger_uri() const;
  // Whether writes have a ledger to be charged through: one was chosen, or the embedded one
  // (HOME/ledger.db) exists.
  bool has_ledger() const;
  // `store` with its writes charged through options().charging (Charging::charged), or as it
  // is when there is no ledger. Unsupported when there is one and no charging.
  Result<std::shared_ptr<store::Store>> charged(std::shared_ptr<store::Store> store,
                                                std::optional<ledger::Kind> kind = {}) const;

 private:
  SessionOptions o_;
};

}  // namespace sluice::client
