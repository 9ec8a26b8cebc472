// The client session: stores and the node's cache opened from explicit options, writes
// charged through the session's Charging (see session.h).
#include "sluice/client/session.h"

#include <sys/stat.h>

#include <filesystem>

#include "sluice/node/client.h"

namespace sluice::client {

Session::Session(SessionOptions options) : o_(std::move(options)) {}

std::string Session::cache_directory() const {
  return o_.cache.directory.empty() ? o_.home + "/cache" : o_.cache.directory;
}

std::string Session::default_daemon_socket(const std::string& home) {
  return home + "/sluiced.sock";
}

std::string Session::daemon_socket() const {
  return o_.daemon_socket.empty() ? default_daemon_socket(o_.home) : o_.daemon_socket;
}

cache::CacheOptions Session::cache_options() const {
  cache::CacheOptions co = o_.cache;
  co.directory = cache_directory();
  return co;
}

store::StoreOptions Session::store_options(const OpenOptions& how) const {
  s3::register_scheme();
  store::StoreOptions so;
  so.create = how.create;
  s3::S3Options s3o = o_.s3;
  if (how.registry) s3o.registry = how.registry;
  so.backend.set(s3o);
  return so;
}

Result<std::unique_ptr<store::Store>> Session::open_store(const std::string& store_uri,
                                                          const OpenOptions& how) const {
  return store::open_store(store_uri, store_options(how));
}

Result<std::unique_ptr<store::Store>> Session::open_cached(const std::string& store_uri,
                                                           const OpenOptions& how) const {
  store::StoreOptions so = store_options(how);
  cache::CacheOptions co = cache_options();
  co.registry = how.registry;
  so.backend.set(co);
  cache::register_scheme();
  if (o_.daemon_socket == "none") return store::open_store("cache+" + store_uri, so);
  node::NodeOptions no;
  no.socket = daemon_socket();
  no.on_fallback = o_.on_fallback;
  if (!o_.s3.endpoint.empty()) no.s3_endpoint = s3::endpoint_url(o_.s3);
  so.backend.set(no);
  node::register_scheme();
  return store::open_store("node+" + store_uri, so);
}

CacheRoute Session::cache_route() const {
  CacheRoute r;
  r.directory = cache_directory();
  if (o_.daemon_socket == "none") {
    r.reason = "the daemon is turned off (daemon socket \"none\")";
    return r;
  }
  r.socket = daemon_socket();
  auto client = node::NodeClient::connect(r.socket, std::chrono::seconds(2));
  if (client) {
    r.daemon = true;
  } else {
    r.reason = "no sluiced answers on " + r.socket + " (" + client.error().message() + ")";
  }
  return r;
}

Result<std::unique_ptr<cache::Control>> Session::cache_control() const {
  auto embedded = [this]() -> std::unique_ptr<cache::Control> {
    return std::make_unique<cache::DirectoryControl>(
        cache_options(),
        // A copy: what a Session opens outlives it.
        [session = *this](const std::string& uri) { return session.open_store(uri); });
  };
  if (o_.daemon_socket == "none") return embedded();
  // A WARM request fetches up to 64 MiB from the source: the node store's request timeout.
  auto client = node::NodeClient::connect(daemon_socket(), node::NodeOptions{}.timeout);
  if (!client) {
    // The default socket with nobody on it: this node runs no daemon. (One that is there
    // and refuses, or hangs, is an error: its cache is not the directory's.)
    if (node::no_daemon_listens(client.error()) && o_.daemon_socket.empty()) return embedded();
    return std::unexpected(client.error());
  }
  return std::make_unique<node::DaemonControl>(std::move(*client), daemon_socket());
}

std::string Session::ledger_uri() const {
  return o_.ledger.uri.empty() ? o_.home + "/ledger.db" : o_.ledger.uri;
}

bool Session::has_ledger() const {
  struct stat st;
  return !o_.ledger.uri.empty() || ::stat(ledger_uri().c_str(), &st) == 0;
}

Result<std::shared_ptr<store::Store>> Session::charged(std::shared_ptr<store::Store> store,
                                                       std::optional<ledger::Kind> kind) const {
  if (o_.charging) return o_.charging->charged(*this, std::move(store), kind);
  if (!has_ledger()) return store;
  const std::string how = o_.ledger.source.empty() ? ledger_uri() : o_.ledger.source;
  return fail(Code::kUnsupported,
              "a ledger (" + how +
                  ") would charge this write, and this program charges none "
                  "(SessionOptions::charging; client::ledger_charging in sluice::client): refused "
                  "rather than let through uncounted");
}

}  // namespace sluice::client
