// PeerStore: chunks from their owner over HTTP, else from the backing store; see
// peer_store.h and docs/formats/peer-protocol.md.
#include "sluice/peer/peer_store.h"

#include <curl/curl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <atomic>
#include <charconv>
#include <cstring>
#include <ctime>
#include <future>
#include <mutex>

#include <xxhash.h>

#include "sluice/telemetry/registry.h"

namespace sluice::peer {

namespace {

thread_local bool t_serving_peer = false;

std::string hex(const unsigned char* p, size_t n) {
  static const char* d = "0123456789abcdef";
  std::string s(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    s[2 * i] = d[p[i] >> 4];
    s[2 * i + 1] = d[p[i] & 15];
  }
  return s;
}

std::string canonical(const ChunkRequest& r) {
  return "sluice-peer-v1\n" + r.node + "\n" + std::to_string(r.time) + "\n" + r.root + "\n" +
         r.key + "\n" + r.etag + "\n" + std::to_string(r.index) + "\n" + std::to_string(r.offset) +
         "\n" + std::to_string(r.length);
}

}  // namespace

ServingPeer::ServingPeer() : previous_(t_serving_peer) {
  t_serving_peer = true;
}
ServingPeer::~ServingPeer() {
  t_serving_peer = previous_;
}
bool ServingPeer::active() {
  return t_serving_peer;
}

std::string sign_chunk_request(const ChunkRequest& r, std::string_view secret) {
  std::string msg = canonical(r);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  if (!HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
            reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), mac, &len))
    return {};
  return hex(mac, len);
}

Status verify_chunk_request(const ChunkRequest& r, std::string_view signature,
                            std::string_view secret, int64_t now, int64_t max_skew_s) {
  if (r.time < now - max_skew_s || r.time > now + max_skew_s)
    return fail(Code::kPermissionDenied,
                "request from '" + r.node + "' signed at " + std::to_string(r.time) + ", over " +
                    std::to_string(max_skew_s) + " s from this node's clock");
  std::string want = sign_chunk_request(r, secret);
  if (want.empty() || signature.size() != want.size() ||
      CRYPTO_memcmp(want.data(), signature.data(), want.size()) != 0)
    return fail(Code::kPermissionDenied,
                "request from '" + r.node + "': bad signature (another node secret?)");
  return ok();
}

struct PeerStore::Impl {
  struct Peer {
    const Member* member = nullptr;
    std::atomic<int64_t> down_until_ns{0};
    std::atomic<uint64_t> chunks{0}, bytes{0}, errors{0};
    std::mutex mu;
    std::string last_error;  // guarded by mu
  };

  PeerOptions o;
  std::vector<std::unique_ptr<Peer>> peers;  // one per member, in membership order
  std::mutex curl_mu;
  std::vector<CURL*> idle_curl;  // guarded by curl_mu
  std::atomic<uint64_t> backing{0}, fetched{0};
  telemetry::Counter* m_peer_bytes = nullptr;
  telemetry::Counter* m_backing_bytes = nullptr;
  telemetry::Counter* m_peer_errors = nullptr;
  telemetry::Gauge* m_in_flight = nullptr;

  explicit Impl(PeerOptions opts) : o(std::move(opts)) {
    for (const Member& m : o.membership->members()) {
      auto p = std::make_unique<Peer>();
      p->member = &m;
      peers.push_back(std::move(p));
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
  ~Impl() {
    for (CURL* c : idle_curl) curl_easy_cleanup(c);
  }

  static int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  Peer& peer_of(const Member& m) {
    for (auto& p : peers) {
      if (p->member == &m) return *p;
    }
    return *peers.front();  // unreachable: owner() returns one of the members
  }

  void mark_failed(Peer& p, const std::string& why) {
    p.errors.fetch_add(1, std::memory_order_relaxed);
    p.down_until_ns.store(now_ns() + std::chrono::nanoseconds(o.retry_after).count(),
                          std::memory_order_relaxed);
    if (m_peer_errors) m_peer_errors->add();
    std::lock_guard lock(p.mu);
    p.last_error = why;
  }

  CURL* lease_curl() {
    {
      std::lock_guard lock(curl_mu);
      if (!idle_curl.empty()) {
        CURL* c = idle_curl.back();
        idle_curl.pop_back();
        return c;
      }
    }
    return curl_easy_init();
  }
  void return_curl(CURL* c) {
    std::lock_guard lock(curl_mu);
    if (idle_curl.size() < 16) {
      idle_curl.push_back(c);
    } else {
      curl_easy_cleanup(c);
    }
  }

  struct Sink {
    std::span<std::byte> out;
    size_t got = 0;
    bool overflow = false;
    std::string etag, xxh3;
  };

  static size_t on_body(char* p, size_t size, size_t n, void* cls) {
    auto* s = static_cast<Sink*>(cls);
    size_t len = size * n;
    if (len > s->out.size() - s->got) {
      s->overflow = true;
      return 0;  // aborts the transfer
    }
    std::memcpy(s->out.data() + s->got, p, len);
    s->got += len;
    return len;
  }

  static size_t on_header(char* p, size_t size, size_t n, void* cls) {
    auto* s = static_cast<Sink*>(cls);
    std::string_view line(p, size * n);
    auto value = [&](std::string_view name) -> std::optional<std::string> {
      if (line.size() <= name.size() || strncasecmp(line.data(), name.data(), name.size()) != 0)
        return std::nullopt;
      std::string_view v = line.substr(name.size());
      while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
      while (!v.empty() && (v.back() == '\r' || v.back() == '\n' || v.back() == ' '))
        v.remove_suffix(1);
      return std::string(v);
    };
    if (auto v = value("X-Sluice-Etag:")) s->etag = *v;
    if (auto v = value("X-Sluice-Xxh3:")) s->xxh3 = *v;
    return size * n;
  }

  // One chunk's bytes [within, within + out.size()) from `peer`; an error says why.
  Status fetch(const Member& peer, const std::string& root, std::string_view key,
               const std::string& etag, uint64_t index, uint64_t within, std::span<std::byte> out) {
    ChunkRequest r{
        o.membership->self().name, root, std::string(key), etag, index, within, out.size(),
        std::time(nullptr)};
    CURL* c = lease_curl();
    if (!c) return fail(Code::kUnavailable, "curl_easy_init failed");
    auto esc = [&](const std::string& s) {
      char* e = curl_easy_escape(c, s.data(), static_cast<int>(s.size()));
      std::string v = e ? e : "";
      curl_free(e);
      return v;
    };
    std::string url = "http://" + peer.address() + "/v1/chunk?root=" + esc(root) +
                      "&key=" + esc(r.key) + "&etag=" + esc(etag) +
                      "&index=" + std::to_string(index) + "&offset=" + std::to_string(within) +
                      "&length=" + std::to_string(out.size());
    curl_slist* headers = nullptr;
    headers = curl_slist_append(headers, ("X-Sluice-Node: " + r.node).c_str());
    headers = curl_slist_append(headers, ("X-Sluice-Time: " + std::to_string(r.time)).c_str());
    headers = curl_slist_append(headers,
                                ("X-Sluice-Signature: " + sign_chunk_request(r, o.secret)).c_str());
    Sink sink{out};
    curl_easy_reset(c);
    curl_easy_setopt(c, CURLOPT_URL, url.c_str());
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(o.connect_timeout.count()));
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, static_cast<long>(o.timeout.count()));
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, &Impl::on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &sink);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, &Impl::on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, &sink);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http");
    CURLcode rc = curl_easy_perform(c);
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(headers);
    return_curl(c);
    std::string where = "peer " + peer.name + " (" + peer.address() + ")";
    if (sink.overflow) return fail(Code::kCorruption, where + ": answered more bytes than asked");
    if (rc != CURLE_OK) return fail(Code::kUnavailable, where + ": " + curl_easy_strerror(rc));
    if (status != 200)
      return fail(status == 412 ? Code::kConflict : Code::kUnavailable,
                  where + ": HTTP " + std::to_string(status));
    if (sink.got != out.size())
      return fail(Code::kCorruption, where + ": " + std::to_string(sink.got) + " bytes, not " +
                                         std::to_string(out.size()));
    if (sink.etag != etag)
      return fail(Code::kConflict, where + ": etag " + sink.etag + ", not " + etag);
    uint64_t sum = XXH3_64bits(out.data(), out.size());
    uint64_t said = 0;
    auto [end, ec] =
        std::from_chars(sink.xxh3.data(), sink.xxh3.data() + sink.xxh3.size(), said, 16);
    if (ec != std::errc() || end != sink.xxh3.data() + sink.xxh3.size() || said != sum)
      return fail(Code::kCorruption, where + ": the chunk failed its XXH3 check");
    return ok();
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
    const Member* owner = nullptr;
  };
};

PeerStore::PeerStore(std::unique_ptr<store::Store> backing, PeerOptions options)
    : StoreWrapper(std::move(backing)), impl_(std::make_unique<Impl>(std::move(options))) {}
PeerStore::~PeerStore() = default;

Result<size_t> PeerStore::read(std::string_view key, uint64_t offset, std::span<std::byte> dst,
                               const store::ReadOptions& options) {
  Impl& i = *impl_;
  size_t slash = key.find('/');
  std::optional<std::string> root;
  if (!ServingPeer::active() && i.peers.size() > 1 && !options.if_match.empty() &&
      slash != std::string_view::npos && i.o.root_of && i.o.chunk_size > 0)
    root = i.o.root_of(key.substr(0, slash));
  if (!root) return i.from_backing(key, offset, dst, options, target());

  // Cut at chunk bounds; consecutive chunks the backing store serves form one segment.
  std::vector<Impl::Segment> segs;
  const int64_t now = Impl::now_ns();
  const uint64_t cs = i.o.chunk_size;
  std::string_view key_in_root = key.substr(slash + 1);
  for (uint64_t pos = offset; pos < offset + dst.size();) {
    uint64_t index = pos / cs;
    uint64_t end = std::min(offset + dst.size(), (index + 1) * cs);
    std::string id = std::string(key) + "#" + std::to_string(index);
    const Member* owner = &i.o.membership->owner(id);
    if (i.o.membership->is_self(*owner) ||
        i.peer_of(*owner).down_until_ns.load(std::memory_order_relaxed) > now)
      owner = nullptr;
    std::span<std::byte> out = dst.subspan(pos - offset, end - pos);
    if (!owner && !segs.empty() && !segs.back().owner) {
      segs.back().out = dst.subspan(segs.back().offset - offset, end - segs.back().offset);
    } else {
      segs.push_back(Impl::Segment{pos, out, owner});
    }
    pos = end;
  }

  // Peer segments run on up to `parallel` threads while this one reads the backing store's.
  std::vector<std::future<Status>> asked(segs.size());
  std::vector<size_t> order;
  for (size_t s = 0; s < segs.size(); ++s) {
    if (segs[s].owner) order.push_back(s);
  }
  // Fetches are waited for in segment order, so launched - waited is the number running.
  size_t launched = 0, waited = 0;
  auto launch = [&] {
    while (launched < order.size() && launched - waited < std::max(1u, i.o.parallel)) {
      const Impl::Segment& sg = segs[order[launched]];
      uint64_t index = sg.offset / cs;
      asked[order[launched]] = std::async(std::launch::async, [&, sg, index] {
        if (i.m_in_flight) i.m_in_flight->add(1);
        Status s = i.fetch(*sg.owner, *root, key_in_root, options.if_match, index,
                           sg.offset - index * cs, sg.out);
        if (i.m_in_flight) i.m_in_flight->add(-1);
        return s;
      });
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
      Status got = asked[s].get();
      ++waited;
      launch();
      if (got) {
        Impl::Peer& p = i.peer_of(*sg.owner);
        p.chunks.fetch_add(1, std::memory_order_relaxed);
        p.bytes.fetch_add(sg.out.size(), std::memory_order_relaxed);
        i.fetched.fetch_add(sg.out.size(), std::memory_order_relaxed);
        if (i.m_peer_bytes) i.m_peer_bytes->add(sg.out.size());
        if (!short_read) done += sg.out.size();
        continue;
      }
      // The object changed (412) is the reader's business, not the peer's fault.
      if (got.error().code() != Code::kConflict)
        i.mark_failed(i.peer_of(*sg.owner), got.error().message());
    }
    if (short_read || !first_error) continue;  // only waiting for fetches still running
    Result<size_t> n = i.from_backing(key, sg.offset, sg.out, options, target());
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
    std::lock_guard lock(p->mu);
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
