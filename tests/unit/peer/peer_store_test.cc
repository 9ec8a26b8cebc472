// PeerStore against a scripted peer (the daemon's HTTP server with a handler that answers
// as told): every way a peer can fail leaves the reader with exact bytes from the backing
// store, and only the failures that say the peer is unwell mark it down.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include <xxhash.h>

#include "node/peer_http.h"
#include "sluice/peer/peer_store.h"
#include "sluice/store/serving_peer.h"
#include "sluice/store/store.h"

namespace sluice::peer {
namespace {

constexpr uint64_t kChunk = 64 << 10;
constexpr char kSecret[] = "peer-store-test-secret";

enum class Mode {
  kGood,
  kNotFound,
  kChanged,
  kMisdirected,
  kShort,
  kBadSum,
  kForged,
  kSlow,
  kFail
};

std::vector<std::byte> pattern(size_t n) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::byte(static_cast<uint8_t>(i * 131 + i / 977));
  return v;
}

class ScriptedPeer {
 public:
  explicit ScriptedPeer(const std::vector<std::byte>& object) : object_(object) {
    node::PeerHttpOptions o;
    o.chunk = [this](const ChunkRequest& r, std::string_view sig) { return answer(r, sig); };
    server_ = node::PeerHttpServer::start(std::move(o)).value();
  }
  uint16_t port() const { return server_->port(); }
  std::atomic<Mode> mode{Mode::kGood};
  std::atomic<int> asked{0}, verified{0};

 private:
  Result<node::ChunkBody> answer(const ChunkRequest& r, std::string_view sig) {
    ++asked;
    if (r.verify) ++verified;
    SLUICE_RETURN_IF_ERROR(verify_chunk_request(r, sig, kSecret, std::time(nullptr)));
    Mode m = mode.load();
    switch (m) {
      case Mode::kNotFound:
        return fail(Code::kNotFound, "gone");
      case Mode::kChanged:
        return fail(Code::kConflict, "changed");
      case Mode::kMisdirected:
        return fail(Code::kUnsupported, "not mine");
      case Mode::kFail:
        return fail(Code::kUnavailable, "backing store down");
      case Mode::kSlow:
        std::this_thread::sleep_for(std::chrono::milliseconds(1500));
        break;
      default:
        break;
    }
    node::ChunkBody b;
    b.etag = r.etag;
    uint64_t at = r.index * kChunk + r.offset;
    b.bytes.resize(r.length);
    std::copy_n(object_.begin() + static_cast<ptrdiff_t>(at), r.length, b.bytes.begin());
    b.length = r.length;
    b.xxh3 = XXH3_64bits(b.bytes.data(), b.bytes.size());
    if (m == Mode::kShort) b.bytes.resize(b.bytes.size() - 1), b.length -= 1;
    if (m == Mode::kBadSum && !r.verify) b.bytes.data()[0] ^= std::byte{1};
    b.reply_signature = sign_chunk_reply(sig, b.etag, b.length, b.xxh3,
                                         m == Mode::kForged ? "not the secret at all" : kSecret);
    return b;
  }

  const std::vector<std::byte>& object_;
  std::unique_ptr<node::PeerHttpServer> server_;
};

struct Fixture {
  std::vector<std::byte> object = pattern(5 * kChunk + 123);
  ScriptedPeer peer{object};
  std::unique_ptr<PeerStore> store;
  std::string etag;

  Fixture() {
    static int n = 0;
    auto backing = store::open_store("mem://peer-store-test-" + std::to_string(n++)).value();
    EXPECT_TRUE(backing->put("r00t/obj", object));
    etag = backing->stat("r00t/obj").value().etag;
    // This node fetches only: the scripted peer owns every chunk.
    std::vector<Member> members = {Member{"me", "127.0.0.1", 1, false},
                                   Member{"peer", "127.0.0.1", peer.port(), true}};
    PeerOptions o;
    o.membership = std::make_shared<const Membership>(Membership::make(members, "me").value());
    o.secret = kSecret;
    o.chunk_size = kChunk;
    o.timeout = std::chrono::milliseconds(500);
    o.retry_after = std::chrono::milliseconds(1000);  // long enough for a loaded CI machine
    o.root_of = [](std::string_view id) -> std::optional<std::string> {
      if (id == "r00t") return std::string("mem://root");
      return std::nullopt;
    };
    store = std::make_unique<PeerStore>(std::move(backing), std::move(o));
  }

  // Reads the whole object pinned to its etag; true when the bytes are exact.
  bool read_exact() {
    std::vector<std::byte> out(object.size());
    store::ReadOptions ro;
    ro.if_match = etag;
    auto n = store->read_full("r00t/obj", 0, out, ro);
    return n && *n == object.size() && out == object;
  }
  PeerState state() { return store->peers()[1]; }
};

TEST(PeerStore, ChunksComeFromTheirOwner) {
  Fixture f;
  ASSERT_TRUE(f.read_exact());
  EXPECT_EQ(f.store->peer_bytes(), f.object.size());
  EXPECT_EQ(f.store->backing_bytes(), 0u);
  EXPECT_EQ(f.state().fetched_chunks, 6u);
  EXPECT_TRUE(f.state().up);
  EXPECT_EQ(f.state().errors, 0u);
}

// A read answered by one peer's reply says its bytes' XXH3 (the caller need not hash them
// again); a read of several chunks, or one the backing store answered, says none.
TEST(PeerStore, AReadOfOnePeerReplyGivesItsChecksum) {
  Fixture f;
  store::ReadOptions ro;
  ro.if_match = f.etag;
  std::optional<uint64_t> sum;
  ro.hooks.xxh3 = &sum;
  std::vector<std::byte> out(kChunk);
  ASSERT_EQ(f.store->read_full("r00t/obj", kChunk, out, ro).value(), kChunk);
  ASSERT_TRUE(sum);
  EXPECT_EQ(*sum, XXH3_64bits(f.object.data() + kChunk, kChunk));
  sum.reset();
  std::vector<std::byte> two(2 * kChunk);
  ASSERT_EQ(f.store->read_full("r00t/obj", 0, two, ro).value(), two.size());
  EXPECT_FALSE(sum);
  f.peer.mode = Mode::kNotFound;
  ASSERT_EQ(f.store->read_full("r00t/obj", kChunk, out, ro).value(), kChunk);
  EXPECT_FALSE(sum);
  EXPECT_TRUE(std::equal(out.begin(), out.end(), f.object.begin() + kChunk));
}

TEST(PeerStore, AnswersAboutTheObjectFallBackWithoutBlamingThePeer) {
  for (Mode m : {Mode::kNotFound, Mode::kChanged, Mode::kMisdirected}) {
    Fixture f;
    f.peer.mode = m;
    ASSERT_TRUE(f.read_exact()) << static_cast<int>(m);
    EXPECT_EQ(f.store->backing_bytes(), f.object.size());
    EXPECT_TRUE(f.state().up) << static_cast<int>(m);
    EXPECT_GT(f.state().errors, 0u);
  }
}

TEST(PeerStore, AnUnwellPeerIsSkippedAndTheReaderStillGetsExactBytes) {
  for (Mode m : {Mode::kShort, Mode::kForged, Mode::kSlow, Mode::kFail}) {
    Fixture f;
    f.peer.mode = m;
    ASSERT_TRUE(f.read_exact()) << static_cast<int>(m);
    EXPECT_FALSE(f.state().up) << static_cast<int>(m);
    EXPECT_FALSE(f.state().last_error.empty());
    // While it is down, reads go straight to the backing store: the peer is not asked.
    int asked = f.peer.asked.load();
    ASSERT_TRUE(f.read_exact());
    EXPECT_EQ(f.peer.asked.load(), asked) << static_cast<int>(m);
    // After retry_after it is asked again.
    f.peer.mode = Mode::kGood;
    std::this_thread::sleep_for(std::chrono::milliseconds(1200));
    ASSERT_TRUE(f.read_exact());
    EXPECT_GT(f.peer.asked.load(), asked);
    EXPECT_TRUE(f.state().up);
  }
}

TEST(PeerStore, ABadChecksumIsAskedForAgainThroughTheOwnersChecks) {
  Fixture f;
  f.peer.mode = Mode::kBadSum;
  ASSERT_TRUE(f.read_exact());
  EXPECT_EQ(f.peer.verified.load(), 6);  // every chunk asked again with verify
  EXPECT_EQ(f.store->backing_bytes(), 0u);
  EXPECT_TRUE(f.state().up);
}

TEST(PeerStore, UnpinnedReadsAndUnknownRootsUseTheBackingStore) {
  Fixture f;
  std::vector<std::byte> out(f.object.size());
  ASSERT_TRUE(f.store->read_full("r00t/obj", 0, out));  // no if_match: not asked
  EXPECT_EQ(f.peer.asked.load(), 0);
  EXPECT_EQ(out, f.object);
  {
    store::ServingPeer serving;  // a thread serving a peer never asks another
    store::ReadOptions ro;
    ro.if_match = f.etag;
    ASSERT_TRUE(f.store->read_full("r00t/obj", 0, out, ro));
    EXPECT_EQ(f.peer.asked.load(), 0);
  }
}

}  // namespace
}  // namespace sluice::peer
