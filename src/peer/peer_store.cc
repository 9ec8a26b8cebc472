// PeerStore: chunks from their owner over HTTP, else from the backing store; see
// peer_store.h and docs/formats/peer-protocol.md.
#include "sluice/peer/peer_store.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <atomic>
#include <charconv>
#include <cstring>
#include <ctime>
#include <future>
#include <semaphore>
#include <system_error>

#include "http/client.h"
#include "signing.h"
#include "sluice/core/hash.h"
#include "sluice/core/thread_annotations.h"
#include "sluice/store/serving_peer.h"
#include "sluice/telemetry/registry.h"

namespace sluice::peer {

namespace {

// Fields joined by newlines: verify_chunk_request refuses control characters in them
// first, so the boundaries between fields are fixed.
std::string canonical(const ChunkRequest& r) {
  return "sluice-peer-v1\n" + r.node + "\n" + r.target + "\n" + std::to_string(r.time) + "\n" +
         r.root + "\n" + r.key + "\n" + r.etag + "\n" + std::to_string(r.index) + "\n" +
         std::to_string(r.offset) + "\n" + std::to_string(r.length) + "\n" +
         (r.verify ? "verify" : "plain");
}

}  // namespace

std::string sign_chunk_request(const ChunkRequest& r, std::string_view secret) {
  return hmac_hex(secret, canonical(r));
}

std::string sign_chunk_reply(std::string_view request_signature, std::string_view etag,
                             uint64_t length, uint64_t xxh3, std::string_view secret) {
  return hmac_hex(secret, "sluice-peer-v1-reply\n" + std::string(request_signature) + "\n" +
                              std::string(etag) + "\n" + std::to_string(length) + "\n" +
                              std::to_string(xxh3));
}

Status verify_chunk_request(const ChunkRequest& r, std::string_view signature,
                            std::string_view secret, int64_t now, int64_t max_skew_s) {
  for (std::string_view f :
       {std::string_view(r.node), std::string_view(r.target), std::string_view(r.root),
        std::string_view(r.key), std::string_view(r.etag)}) {
    if (has_control(f))
      return fail(Code::kInvalidArgument, "a request field holds a control character");
  }
  if (r.time < now - max_skew_s || r.time > now + max_skew_s)
    return fail(Code::kPermissionDenied,
                "request from '" + r.node + "' signed at " + std::to_string(r.time) + ", over " +
                    std::to_string(max_skew_s) + " s from this node's clock");
  if (!equal_in_constant_time(sign_chunk_request(r, secret), signature))
    return fail(Code::kPermissionDenied,
                "request from '" + r.node + "': bad signature (another node secret?)");
  return ok();
}

struct PeerStore::Impl {
  struct Peer {
    explicit Peer(const Member& m, unsigned slots_n) : member(&m), slots(slots_n) {}
    const Member* member;
    // Relaxed: a stale read only delays marking a peer down or up by one fetch.
    std::atomic<int64_t> down_until_ns{0};
    std::atomic<uint64_t> chunks{0}, bytes{0}, errors{0};  // relaxed: reported only
    std::counting_semaphore<1024> slots;                   // fetches from this peer at once
    Mutex mu;
    std::string last_error SLUICE_GUARDED_BY(mu);
    std::unique_ptr<http::HttpClient> http;  // kept-alive connections to it
  };

  PeerOptions o;
  std::vector<std::unique_ptr<Peer>> peers;      // one per member, in membership order
  std::atomic<uint64_t> backing{0}, fetched{0};  // relaxed: reported only
  telemetry::Counter* m_peer_bytes = nullptr;
  telemetry::Counter* m_backing_bytes = nullptr;
  telemetry::Counter* m_peer_errors = nullptr;
  telemetry::Gauge* m_in_flight = nullptr;

  explicit Impl(PeerOptions opts) : o(std::move(opts)) {
    o.per_peer = std::clamp(o.per_peer, 1u, 1024u);
    http::HttpOptions ho;
    ho.max_in_flight = o.per_peer;
    ho.connect_timeout_ms = static_cast<long>(o.connect_timeout.count());
    ho.timeout_ms = static_cast<long>(o.timeout.count());
    ho.http_only = true;
    ho.max_body_bytes = 64 << 10;  // an error reply's text; a chunk goes to the caller's buffer
    for (const Member& m : o.membership->members()) {
      peers.push_back(std::make_unique<Peer>(m, o.per_peer));
      peers.back()->http = std::make_unique<http::HttpClient>(ho);
    }
    if (o.registry) {
      m_peer_bytes = &o.registry->counter("sluice_bytes_total", {{"source", "peer"}},
                                          "Bytes fetched for the cache, by where they came from");
      m_backing_bytes = &o.registry->counter("sluice_bytes_total", {{"source", "backing"}});
      m_peer_errors = &o.registry->counter("sluice_peer_errors_total", {},
                                           "Chunk fetches from a peer that failed");
      m_in_flight = &o.registry->gauge("sluice_fetches_in_flight", {},
                                       "Chunk fetches running (peers and backing store)");
    }
  }

  static int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  Peer& peer_of(const Member& m) {
    return *peers[static_cast<size_t>(&m - o.membership->members().data())];
  }

  void note_error(Peer& p, const Error& e, bool blame) {
    p.errors.fetch_add(1, std::memory_order_relaxed);
    if (blame)
      p.down_until_ns.store(now_ns() + std::chrono::nanoseconds(o.retry_after).count(),
                            std::memory_order_relaxed);
    if (m_peer_errors) m_peer_errors->add();
    MutexLock lock(p.mu);
    p.last_error = e.message();
  }

  // Whether a failed fetch says the peer is unwell (skip it a while) rather than something
  // about the object (it changed, is gone, or the range is past its end) or the membership.
  static bool blames_peer(const Error& e) {
    switch (e.code()) {
      case Code::kConflict:
      case Code::kNotFound:
      case Code::kInvalidArgument:
      case Code::kUnsupported:  // 421: the owner's membership differs from ours
      case Code::kCancelled:    // this node is saturated: all slots for the peer taken
        return false;
      default:
        return true;
    }
  }

  static Code code_of_status(long status) {
    switch (status) {
      case 400:
        return Code::kInvalidArgument;
      case 403:
        return Code::kPermissionDenied;
      case 404:
        return Code::kNotFound;
      case 412:
        return Code::kConflict;
      case 421:
        return Code::kUnsupported;
      default:
        return Code::kUnavailable;
    }
  }

  // One GET of bytes [r.offset, r.offset + out.size()) of a chunk from `p`, checked;
  // returns their XXH3-64 (computed here, equal to the owner's).
  Result<uint64_t> get(Peer& p, ChunkRequest r, std::span<std::byte> out) {
    const Member& peer = *p.member;
    r.time = std::time(nullptr);
    const std::string signature = sign_chunk_request(r, o.secret);
    using http::HttpClient;
    http::HttpRequest req;
    req.url = "http://" + peer.address() + "/v1/chunk?root=" + HttpClient::escape(r.root) +
              "&key=" + HttpClient::escape(r.key) + "&etag=" + HttpClient::escape(r.etag) +
              "&index=" + std::to_string(r.index) + "&offset=" + std::to_string(r.offset) +
              "&length=" + std::to_string(r.length) + (r.verify ? "&verify=1" : "");
    req.headers = {{"X-Sluice-Node", r.node},
                   {"X-Sluice-Target", r.target},
                   {"X-Sluice-Time", std::to_string(r.time)},
                   {"X-Sluice-Signature", signature}};
    req.sink = out;
    auto resp = p.http->perform(req);
    std::string where = "peer " + peer.name + " (" + peer.address() + ")";
    if (!resp) return fail(Code::kUnavailable, where + ": " + resp.error().message());
    if (resp->sink_overflow)
      return fail(Code::kCorruption, where + ": answered more bytes than asked");
    if (resp->status != 200)
      return fail(code_of_status(resp->status), where + ": HTTP " + std::to_string(resp->status));
    if (resp->sink_bytes != out.size())
      return fail(Code::kCorruption, where + ": " + std::to_string(resp->sink_bytes) +
                                         " bytes, not " + std::to_string(out.size()));
    const std::string xxh3 = resp->header("x-sluice-xxh3");
    const std::string etag = resp->header("x-sluice-etag");
    const std::string reply_signature = resp->header("x-sluice-reply-signature");
    uint64_t said = 0;
    auto [end, ec] = std::from_chars(xxh3.data(), xxh3.data() + xxh3.size(), said, 16);
    if (ec != std::errc() || end != xxh3.data() + xxh3.size())
      return fail(Code::kCorruption, where + ": a reply without its XXH3");
    // The reply is the owner's (it knows the secret) and answers this request.
    if (!equal_in_constant_time(sign_chunk_reply(signature, etag, out.size(), said, o.secret),
                                reply_signature))
      return fail(Code::kPermissionDenied, where + ": the reply's signature does not verify");
    if (etag != r.etag) return fail(Code::kConflict, where + ": etag " + etag + ", not " + r.etag);
    if (xxh3_64(out.data(), out.size()) != said)
      return fail(Code::kCorruption, where + ": the chunk failed its XXH3 check");
    return said;
  }

  // A chunk's bytes [within, within + out.size()) from `p`, within the per-peer limit; a
  // reply that fails its XXH3 is asked for once more through the owner's checks.
  Result<uint64_t> fetch(Peer& p, const std::string& root, std::string_view key,
                         const std::string& etag, uint64_t index, uint64_t within,
                         std::span<std::byte> out) {
    if (!p.slots.try_acquire_for(o.timeout))
      return fail(Code::kCancelled, "peer " + p.member->name + ": every fetch slot busy");
    ChunkRequest r{o.membership->self().name,
                   p.member->name,
                   root,
                   std::string(key),
                   etag,
                   index,
                   within,
                   out.size()};
    if (m_in_flight) m_in_flight->add(1);
    Result<uint64_t> s = get(p, r, out);
    if (!s && s.error().code() == Code::kCorruption) {
      r.verify = true;
      s = get(p, r, out);
    }
    if (m_in_flight) m_in_flight->add(-1);
    p.slots.release();
    return s;
  }

  Result<size_t> from_backing(std::string_view key, uint64_t offset, std::span<std::byte> dst,
                              const store::ReadOptions& ro, store::Store& backing_store) {
    if (m_in_flight) m_in_flight->add(1);
    Result<size_t> n = backing_store.read(key, offset, dst, ro);
    if (m_in_flight) m_in_flight->add(-1);
    if (n) {
      backing.fetch_add(*n, std::memory_order_relaxed);
      if (m_backing_bytes) m_backing_bytes->add(*n);
    }
    return n;
  }

  // A part of the read: bytes [offset, offset + out.size()) within chunks that `owner`
  // owns (null: the backing store).
  struct Segment {
    uint64_t offset = 0;
    std::span<std::byte> out;
    Peer* owner = nullptr;
  };

  // Cuts [offset, offset + dst.size()) at chunk bounds; chunks this node reads from the
  // backing store (its own, and those of peers marked down) merge into one segment.
  std::vector<Segment> plan(std::string_view key, uint64_t offset, std::span<std::byte> dst) {
    std::vector<Segment> segs;
    const int64_t now = now_ns();
    const uint64_t cs = o.chunk_size;
    for (uint64_t pos = offset; pos < offset + dst.size();) {
      uint64_t index = pos / cs;
      uint64_t end = std::min(offset + dst.size(), (index + 1) * cs);
      const Member& m = o.membership->owner(std::string(key) + "#" + std::to_string(index));
      Peer* owner = &peer_of(m);
      if (o.membership->is_self(m) || owner->down_until_ns.load(std::memory_order_relaxed) > now)
        owner = nullptr;
      if (!owner && !segs.empty() && !segs.back().owner) {
        segs.back().out = dst.subspan(segs.back().offset - offset, end - segs.back().offset);
      } else {
        segs.push_back(Segment{pos, dst.subspan(pos - offset, end - pos), owner});
      }
      pos = end;
    }
    return segs;
  }
};

PeerStore::PeerStore(std::unique_ptr<store::Store> backing, PeerOptions options)
    : StoreWrapper(std::move(backing)), impl_(std::make_unique<Impl>(std::move(options))) {}
PeerStore::~PeerStore() = default;

Result<size_t> PeerStore::read(std::string_view key, uint64_t offset, std::span<std::byte> dst,
                               const store::ReadOptions& options) {
  Impl& i = *impl_;
  size_t slash = key.find('/');
  std::optional<std::string> root;
  if (!store::ServingPeer::active() && i.peers.size() > 1 && !options.if_match.empty() &&
      slash != std::string_view::npos && i.o.root_of && i.o.chunk_size > 0)
    root = i.o.root_of(key.substr(0, slash));
  if (!root) return i.from_backing(key, offset, dst, options, target());
  // Split across peers: what a segment's read tells (progress, a hash) is not the read's.
  store::ReadOptions sub = options;
  sub.hooks = {};

  std::vector<Impl::Segment> segs = i.plan(key, offset, dst);
  const std::string_view key_in_root = key.substr(slash + 1);
  // Peer segments run on up to `parallel` threads while this one reads the backing
  // store's. Fetches are waited for in segment order, so launched - waited are running.
  std::vector<std::future<Result<uint64_t>>> asked(segs.size());
  std::vector<size_t> order;
  for (size_t s = 0; s < segs.size(); ++s) {
    if (segs[s].owner) order.push_back(s);
  }
  size_t launched = 0, waited = 0;
  auto launch = [&] {
    while (launched < order.size() && launched - waited < std::max(1u, i.o.parallel)) {
      const Impl::Segment sg = segs[order[launched]];
      const uint64_t index = sg.offset / i.o.chunk_size;
      auto job = [&i, sg, index, &root, key_in_root, &options] {
        return i.fetch(*sg.owner, *root, key_in_root, options.if_match, index,
                       sg.offset - index * i.o.chunk_size, sg.out);
      };
      try {
        asked[order[launched]] = std::async(std::launch::async, job);
      } catch (const std::system_error&) {  // no thread to be had: fetch on this one
        asked[order[launched]] = std::async(std::launch::deferred, job);
      }
      ++launched;
    }
  };
  launch();
  // Every started fetch writes into dst: all are waited for before this returns.
  uint64_t done = 0;
  bool short_read = false;
  Status first_error = ok();
  for (size_t s = 0; s < segs.size(); ++s) {
    Impl::Segment& sg = segs[s];
    if (sg.owner) {
      Result<uint64_t> got = asked[s].get();
      ++waited;
      launch();
      if (got) {
        // The whole read came from one peer: its bytes' hash is known (ReadHooks::xxh3).
        if (options.hooks.xxh3 && segs.size() == 1) *options.hooks.xxh3 = *got;
        sg.owner->chunks.fetch_add(1, std::memory_order_relaxed);
        sg.owner->bytes.fetch_add(sg.out.size(), std::memory_order_relaxed);
        i.fetched.fetch_add(sg.out.size(), std::memory_order_relaxed);
        if (i.m_peer_bytes) i.m_peer_bytes->add(sg.out.size());
        if (!short_read) done += sg.out.size();
        continue;
      }
      i.note_error(*sg.owner, got.error(), Impl::blames_peer(got.error()));
    }
    if (short_read || !first_error) continue;  // only waiting for fetches still running
    Result<size_t> n = i.from_backing(key, sg.offset, sg.out, sub, target());
    if (!n) {
      first_error = Status(std::unexpected(n.error()));
      continue;
    }
    done += *n;
    if (*n < sg.out.size()) short_read = true;  // the object ends here
  }
  SLUICE_RETURN_IF_ERROR(first_error);
  return static_cast<size_t>(done);
}

uint64_t PeerStore::owner_index(std::string_view key, uint64_t index) const {
  const Membership& m = *impl_->o.membership;
  const Member& owner = m.owner(std::string(key) + "#" + std::to_string(index));
  return static_cast<uint64_t>(&owner - m.members().data());
}

std::vector<PeerState> PeerStore::peers() const {
  std::vector<PeerState> out;
  const int64_t now = Impl::now_ns();
  for (const auto& p : impl_->peers) {
    PeerState s;
    s.name = p->member->name;
    s.address = p->member->address();
    s.self = impl_->o.membership->is_self(*p->member);
    s.up = p->down_until_ns.load(std::memory_order_relaxed) <= now;
    s.fetched_chunks = p->chunks.load(std::memory_order_relaxed);
    s.fetched_bytes = p->bytes.load(std::memory_order_relaxed);
    s.errors = p->errors.load(std::memory_order_relaxed);
    MutexLock lock(p->mu);
    s.last_error = p->last_error;
    out.push_back(std::move(s));
  }
  return out;
}

uint64_t PeerStore::backing_bytes() const {
  return impl_->backing.load(std::memory_order_relaxed);
}
uint64_t PeerStore::peer_bytes() const {
  return impl_->fetched.load(std::memory_order_relaxed);
}

}  // namespace sluice::peer
