// sluice/peer/peer_store.h: fetch chunks from the daemon that owns them before the backing
// store (docs/formats/peer-protocol.md).
//
// PeerStore is a decorator a node's TieredCache puts in front of its backing store. Its
// keys are the daemon's routed keys ("<root id>/<key>"). A read is cut at chunk bounds;
// each chunk goes to its owner (peer::Membership): chunks this node owns, and every chunk
// while the owner is marked down, are read from the backing store; the others are asked of
// the owner over HTTP, which reads them through its own cache, so a chunk is fetched from
// the backing store about once for the whole job. Every answer is checked (status, length,
// etag, XXH3 of the body, and the owner's HMAC over the reply). A chunk that fails its
// XXH3 is asked for once more with `verify` (the owner reads it through its checks, which
// drop and refetch a corrupt chunk). A peer that fails, is slow (timeout), is saturated or
// lies is skipped for retry_after and the chunk comes from the backing store, with no
// error to the reader; answers about the object (404, 412, 400) and an owner that says it
// does not own the chunk (421: the memberships differ) fall back without blaming the peer.
//
// Contract:
// - Reads without options.if_match (an unpinned version) go to the backing store: a peer
//   is only asked for a version the reader has pinned.
// - While a thread serves a peer's request (store::ServingPeer in scope), its reads never go to
//   another peer, so daemons that disagree on the membership cannot bounce a chunk around.
// - Thread-safe. Writes, lists, stats and removes go straight to the backing store.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sluice/peer/membership.h"
#include "sluice/store/wrapper.h"

namespace sluice::telemetry {
class Registry;
}

namespace sluice::peer {

struct PeerOptions {
  std::shared_ptr<const Membership> membership;
  std::string secret;  // the node secret every daemon of the job shares (>= 16 bytes)
  uint64_t chunk_size = 4 << 20;
  // The root URI of a routed key's root id; nullopt: not known (read from the backing store).
  std::function<std::optional<std::string>(std::string_view root_id)> root_of;
  std::chrono::milliseconds connect_timeout{500};
  std::chrono::milliseconds timeout{10000};     // one chunk from a peer, all included
  std::chrono::milliseconds retry_after{5000};  // a failed peer is skipped this long
  unsigned parallel = 4;                        // chunks of one read fetched from peers at once
  // Fetches from one peer at once, from all reads of this store; more wait (up to timeout),
  // then read from the backing store. Keep below the owners' per-address connection limit.
  unsigned per_peer = 8;
  telemetry::Registry* registry = nullptr;  // peer and backing bytes, errors; may be null
};

struct PeerState {
  std::string name, address;
  bool self = false, up = true;
  uint64_t fetched_chunks = 0, fetched_bytes = 0, errors = 0;
  std::string last_error;
  // "self", "down" (marked down after errors), "untried" (never asked yet: not known to be
  // up) or "up" (has answered).
  std::string_view state() const {
    return self ? "self" : !up ? "down" : fetched_chunks == 0 && errors == 0 ? "untried" : "up";
  }
};

class PeerStore final : public store::StoreWrapper {
 public:
  PeerStore(std::unique_ptr<store::Store> backing, PeerOptions options);
  ~PeerStore() override;

  Result<size_t> read(std::string_view key, uint64_t offset, std::span<std::byte> dst,
                      const store::ReadOptions& options = {}) override;

  // Which member owns chunk `index` of a routed key (its place in the membership): the
  // cache's fill_group, so one fill never waits on two owners.
  uint64_t owner_index(std::string_view key, uint64_t index) const;

  std::vector<PeerState> peers() const;
  uint64_t backing_bytes() const;  // bytes read from the backing store through this store
  uint64_t peer_bytes() const;     // bytes fetched from peers

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// What a chunk request names (the fields the signature covers).
struct ChunkRequest {
  std::string node;    // the asking member's name
  std::string target;  // the member asked (the owner, as the asker sees it)
  std::string root, key, etag;
  uint64_t index = 0, offset = 0, length = 0;  // bytes [offset, offset + length) of the chunk
  bool verify = false;  // read through the owner's checks (after a reply failed its XXH3)
  int64_t time = 0;     // unix seconds when it was signed
};

// The signature of a chunk request: lowercase hex of HMAC-SHA256 under the node secret.
std::string sign_chunk_request(const ChunkRequest& r, std::string_view secret);
// Checks a request: fields without control characters (InvalidArgument), then its age (at
// most max_skew_s from `now`) and signature (constant-time compare): PermissionDenied
// naming the cause otherwise.
Status verify_chunk_request(const ChunkRequest& r, std::string_view signature,
                            std::string_view secret, int64_t now, int64_t max_skew_s = 300);
// The owner's signature over its reply, bound to the request's signature, so a reply
// cannot be forged or moved to another request without the secret.
std::string sign_chunk_reply(std::string_view request_signature, std::string_view etag,
                             uint64_t length, uint64_t xxh3, std::string_view secret);

}  // namespace sluice::peer
