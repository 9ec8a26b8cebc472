// sluice/peer/object_store.h: a peer daemon's object space, for copies that must survive
// the loss of this node (a checkpoint's peer tier).
//
// Every sluiced with a peer port keeps an object space: a directory of objects that the
// job's other daemons and their clients write, read, list and remove over HTTP, with every
// request signed by the node secret (docs/formats/peer-protocol.md, "Object space"). On the
// client side it is an ordinary store:
//
//   store::StoreOptions so;
//   so.backend.set(peer::ObjectStoreOptions{"node-3", secret});
//   auto s = store::open_store("sluiced://node-7@10.0.0.7:7470/ckpt/", so);
//
// names the object space of member node-7 at that address, folder ckpt/. Writes go in
// parts of at most `part_size` bytes (positional: parts may be sent in any order) into an
// upload the owner keeps until commit, which publishes the object atomically and durably
// (the owner's file:// store: fdatasync, rename, directory fsync); an upload never
// committed is dropped by the owner after it sits idle. Every reply body carries its XXH3
// and the owner's HMAC over it, bound to the request, and is checked.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "sluice/core/status.h"
#include "sluice/store/store.h"

namespace sluice::peer {

struct ObjectStoreOptions {
  std::string node;                        // this member's name (the asker)
  std::string secret;                      // the node secret the job's daemons share (>= 16 bytes)
  uint64_t part_size = uint64_t{8} << 20;  // bytes per upload request, at most 16 MiB
  std::chrono::milliseconds connect_timeout{1000};
  std::chrono::milliseconds timeout{60000};  // one request, all included
};

// Registers the sluiced:// scheme with open_store. Thread-safe; idempotent.
void register_object_scheme();

// One request of the object protocol, as signed (the fields the signature covers).
struct ObjectRequest {
  std::string method;  // GET, PUT, POST, DELETE
  std::string op;      // stat, read, list, begin, part, commit, abort, remove
  std::string node, target;
  int64_t time = 0;
  std::string key;        // the object key, the list prefix, or the upload id
  std::string a, b, c;    // op-specific (see the protocol page)
  std::string body_xxh3;  // 16 hex digits of a part's body; empty without a body
};

std::string sign_object_request(const ObjectRequest& r, std::string_view secret);
// Control characters in any field: InvalidArgument; a stale time or a bad signature:
// PermissionDenied.
Status verify_object_request(const ObjectRequest& r, std::string_view signature,
                             std::string_view secret, int64_t now, int64_t max_skew_s = 300);

inline constexpr uint64_t kMaxObjectPart = uint64_t{16} << 20;

}  // namespace sluice::peer
