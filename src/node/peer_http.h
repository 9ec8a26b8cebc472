// The daemon's HTTP/1.1 port (libmicrohttpd): chunks for peer daemons (GET /v1/chunk,
// signed with the node secret) and Prometheus metrics (GET /metrics). One thread per
// connection, at most max_connections of them (and max_per_ip from one address); a
// connection idle (or sending its headers) for timeout_s is closed; request headers are bounded by
// MHD's connection memory limit (32 KiB). Only the object space's part uploads (PUT
// /v1/object) carry a body: at most 16 MiB, with a Content-Length, and at most
// max_body_bytes of bodies held at once (503 beyond); any other body is refused. A chunk on
// NVMe is sent from its file with sendfile; others from the buffer the cache filled.
// docs/formats/peer-protocol.md describes the requests.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "node/frame.h"
#include "node/object_space.h"
#include "sluice/core/fd.h"
#include "sluice/core/status.h"
#include "sluice/peer/peer_store.h"

namespace sluice::node {

struct ChunkBody {
  UniqueFd fd;  // valid: send [file_offset, file_offset + length) of this file
  uint64_t file_offset = 0;
  FrameBytes bytes;  // otherwise: these bytes (filled whole before sending, never zeroed)
  uint64_t length = 0;
  uint64_t xxh3 = 0;  // of the bytes sent
  std::string etag;
  std::string reply_signature;  // peer::sign_chunk_reply over this reply
};

struct PeerHttpOptions {
  std::string host = "127.0.0.1";  // an IPv4 literal to listen on
  uint16_t port = 0;               // 0: any free port (see port())
  unsigned max_connections = 256;
  unsigned max_per_ip = 64;  // daemons that share an address (one host, or NAT) share this
  unsigned timeout_s = 10;
  // Serves a checked request: the signature is verified by the handler.
  std::function<Result<ChunkBody>(const peer::ChunkRequest&, std::string_view signature)> chunk;
  std::function<std::string()> metrics;  // Prometheus text
  // The object space (GET/PUT/POST/DELETE /v1/object); replies with status 200 are signed
  // here with `secret`, bound to the request's signature.
  std::function<ObjectReply(const peer::ObjectRequest&, std::string_view signature,
                            std::span<const std::byte> body)>
      object;
  std::string secret;
  uint64_t max_body_bytes = uint64_t{256} << 20;
  std::function<void(std::string_view)> log;
};

class PeerHttpServer {
 public:
  static Result<std::unique_ptr<PeerHttpServer>> start(PeerHttpOptions options);
  ~PeerHttpServer();  // stops accepting and joins every connection's thread
  uint16_t port() const;

  struct Impl;

 private:
  explicit PeerHttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice::node
