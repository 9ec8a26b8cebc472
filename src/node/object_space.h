// The daemon's object space: objects the job's other daemons and their clients keep on this
// node (a checkpoint's peer tier), behind signed HTTP requests on the peer port
// (docs/formats/peer-protocol.md, "Object space"; the client is peer/object_store.h).
//
// Requests are checked before anything is touched: signature and time (the node secret),
// the asker a member of the job, this daemon the member asked. Objects live in a file://
// store on `directory`, so keys are checked and resolved beneath it and every commit is
// atomic and durable. Uploads are sessions: begin (a writer on the store), parts at any
// offset, commit or abort; at most `max_uploads` at once, and one idle for `upload_idle`
// is aborted. Thread-safe: each connection's thread calls handle().
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>

#include "sluice/core/status.h"
#include "sluice/core/thread_annotations.h"
#include "sluice/peer/membership.h"
#include "sluice/peer/object_store.h"
#include "sluice/store/store.h"

namespace sluice::node {

struct ObjectSpaceOptions {
  std::string directory;
  std::string secret;
  std::shared_ptr<const peer::Membership> membership;
  unsigned max_uploads = 64;
  std::chrono::seconds upload_idle{600};
};

struct ObjectReply {
  unsigned status = 200;
  std::string body;  // JSON or text, or a read's bytes
  std::string etag;  // a read's object etag
  std::string content_type = "application/json";
};

class ObjectSpace {
 public:
  static Result<std::unique_ptr<ObjectSpace>> open(ObjectSpaceOptions options);
  ~ObjectSpace();

  // One request, its body (a part's bytes) complete. Errors come back as replies with
  // their HTTP status; the reply to a good request is signed by the HTTP layer.
  ObjectReply handle(const peer::ObjectRequest& r, std::string_view signature,
                     std::span<const std::byte> body);

 private:
  struct Upload {
    std::string key, node;
    std::unique_ptr<store::Writer> writer;
    std::chrono::steady_clock::time_point last_used;
    unsigned busy = 0;  // parts being written now
  };
  explicit ObjectSpace(ObjectSpaceOptions o, std::unique_ptr<store::Store> s);
  Result<ObjectReply> dispatch(const peer::ObjectRequest& r, std::span<const std::byte> body);
  Result<ObjectReply> begin(const peer::ObjectRequest& r);
  Result<ObjectReply> part(const peer::ObjectRequest& r, std::span<const std::byte> body);
  Result<ObjectReply> finish(const peer::ObjectRequest& r, bool commit);
  void drop_idle() SLUICE_REQUIRES(mu_);

  ObjectSpaceOptions o_;
  std::unique_ptr<store::Store> store_;
  Mutex mu_;
  std::map<std::string, std::shared_ptr<Upload>> uploads_ SLUICE_GUARDED_BY(mu_);  // by id
};

}  // namespace sluice::node
