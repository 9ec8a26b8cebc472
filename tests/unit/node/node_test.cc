// The node daemon's service and client in one process: a NodeServer on a socket in a temp
// directory, a file:// root, NodeStores (each with its own connections) reading through it.
#include <grp.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>
#include <linux/capability.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "node/frame.h"
#include "sluice/cache/control.h"
#include "sluice/client/warm.h"
#include "sluice/io/file_handle.h"
#include "sluice/mem/target.h"
#include "sluice/node/client.h"
#include "sluice/node/server.h"
#include "test_util.h"

namespace sluice::node {
namespace {

using sluice::testing::TempDir;
namespace fs = std::filesystem;

constexpr uint64_t kChunk = 1 << 20;

std::vector<std::byte> random_bytes(size_t n, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; i += 8) {
    uint64_t x = rng();
    std::memcpy(v.data() + i, &x, std::min<size_t>(8, n - i));
  }
  return v;
}

// A daemon serving `root` (a directory of objects) from a cache in the temp directory.
class Daemon {
 public:
  explicit Daemon(const TempDir& dir, std::vector<TeamGrant> teams = {},
                  std::shared_ptr<ledger::Ledger> ledger = nullptr,
                  const std::function<void(ServerOptions&)>& tune = {}) {
    ServerOptions o;
    o.ledger = std::move(ledger);
    o.socket_path = dir.file("sluiced.sock");
    o.cache.directory = dir.file("cache");
    o.cache.chunk_size = kChunk;
    o.cache.ram_bytes = 0;  // every hit comes from NVMe: the hand-off path
    o.cache.disk_bytes = 256 << 20;
    o.teams = std::move(teams);
    if (tune) tune(o);
    o.log = [this](std::string_view line) {
      std::lock_guard lock(mu_);
      log_.emplace_back(line);
    };
    auto s = NodeServer::open(std::move(o));
    EXPECT_TRUE(s) << s.error().to_string();
    server_ = std::move(*s);
    thread_ = std::thread([this] { EXPECT_TRUE(server_->serve()); });
    socket_ = dir.file("sluiced.sock");
  }
  ~Daemon() {
    server_->stop();
    thread_.join();
  }
  NodeServer& server() { return *server_; }
  const std::string& socket() const { return socket_; }
  bool logged(std::string_view what) {
    std::lock_guard lock(mu_);
    for (const std::string& l : log_) {
      if (l.find(what) != std::string::npos) return true;
    }
    return false;
  }
  // Waits until the NVMe tier holds `chunks` chunks (its writes run behind the fills).
  void wait_for_disk(uint64_t chunks) {
    for (int i = 0; i < 500 && server_->cache().stats().disk.chunks < chunks; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_EQ(server_->cache().stats().disk.chunks, chunks);
  }

 private:
  std::unique_ptr<NodeServer> server_;
  std::thread thread_;
  std::string socket_;
  std::mutex mu_;
  std::vector<std::string> log_;
};

struct Fixture {
  TempDir dir;
  std::string root;
  std::vector<std::byte> data;
  Fixture(size_t bytes = 8 * kChunk + 12345) : data(random_bytes(bytes, 7)) {
    root = "file://" + dir.file("data");
    fs::create_directories(dir.file("data/set"));
    auto s = store::make_posix_store(dir.file("data"));
    EXPECT_TRUE(s->put("set/obj", data));
  }
  std::unique_ptr<NodeStore> open(const std::string& socket) {
    NodeOptions o;
    o.socket = socket;
    auto s = NodeStore::open(root, o);
    EXPECT_TRUE(s) << s.error().to_string();
    return s ? std::move(*s) : nullptr;
  }
};

std::vector<std::byte> read_all(NodeStore& s, std::string_view key, size_t n) {
  std::vector<std::byte> out(n + 100);
  auto r = s.read_full(key, 0, out);
  EXPECT_TRUE(r) << r.error().to_string();
  out.resize(r ? *r : 0);
  return out;
}

TEST(NodeRoot, NormalizesAndRefusesPathTricks) {
  EXPECT_EQ(normalize_root("s3://bucket/data/").value(), "s3://bucket/data");
  EXPECT_EQ(normalize_root("file:///srv/data").value(), "file:///srv/data");
  EXPECT_EQ(normalize_root("file:///").value(), "file:///");
  for (const char* bad : {"s3://bucket/../other", "file:///srv/./x", "file://relative", "s3://",
                          "no-scheme", "s3://b//x", "cache+s3://b", "S3://b"}) {
    EXPECT_FALSE(normalize_root(bad)) << bad;
  }
  EXPECT_TRUE(root_granted("s3://b/data", "s3://b/"));
  EXPECT_TRUE(root_granted("s3://b/data/x", "s3://b/data"));
  EXPECT_FALSE(root_granted("s3://b/database", "s3://b/data"));
  EXPECT_TRUE(root_granted("file:///srv", "file:///"));
  EXPECT_TRUE(root_granted("anything://x", "*"));
}

TEST(NodeFrame, FrameBytesGrowKeepingWhatTheyHold) {
  FrameBytes b;
  EXPECT_TRUE(b.empty());
  b.resize(3);
  std::memcpy(b.data(), "abc", 3);
  b.reserve(1 << 20);
  b.resize(5000);  // past the first growth: the first bytes move with it
  EXPECT_EQ(std::memcmp(b.data(), "abc", 3), 0);
  EXPECT_EQ(b.size(), 5000u);
  EXPECT_EQ(std::span(b).size(), 5000u);
  b.resize(2);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(b.begin()), 2), "ab");
  FrameBytes moved = std::move(b);
  EXPECT_EQ(moved.size(), 2u);
  EXPECT_TRUE(b.empty());  // NOLINT(bugprone-use-after-move): moved-from is empty
}

TEST(NodeFrame, HeadersAreCheckedBeforeAnythingIsAllocated) {
  Frame f;
  f.type = 3;
  f.request_id = 42;
  f.json = "{}";
  auto h = encode_header(f);
  auto d = decode_header(h);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->request_id, 42u);
  EXPECT_TRUE(verify(*d, h, f));
  f.json = "{ }";
  EXPECT_FALSE(verify(*d, h, f));  // the body changed: the checksum says so
  auto bad = h;
  bad[0] = std::byte{'X'};
  EXPECT_FALSE(decode_header(bad));
  bad = h;
  bad[4] = std::byte{9};  // version 9
  EXPECT_FALSE(decode_header(bad));
  bad = h;
  bad[11] = std::byte{0x7f};  // JSON length far over the limit
  EXPECT_FALSE(decode_header(bad));
}

TEST(NodeStore, ReadsAreExactAndWarmChunksAreHandedOff) {
  Fixture fx;
  Daemon d(fx.dir);
  auto s = fx.open(d.socket());
  ASSERT_TRUE(s);
  EXPECT_EQ(s->daemon().team, "default");
  EXPECT_EQ(read_all(*s, "set/obj", fx.data.size()), fx.data);  // cold: inline
  d.wait_for_disk(9);
  EXPECT_EQ(read_all(*s, "set/obj", fx.data.size()), fx.data);  // warm: descriptors
  NodeReadStats st = s->read_stats();
  EXPECT_EQ(st.handoff_chunks, 8u);  // the short last chunk is under handoff_min_bytes
  EXPECT_EQ(st.handoff_bytes, 8 * kChunk);
  EXPECT_EQ(st.checksum_retries, 0u);
  // A range inside a chunk and one across chunk ends come inline, exact.
  for (auto [off, len] : {std::pair<uint64_t, size_t>{100, 5000}, {kChunk - 7, 3 * kChunk}}) {
    std::vector<std::byte> out(len);
    ASSERT_EQ(s->read_full("set/obj", off, out).value(), len);
    EXPECT_TRUE(std::equal(out.begin(), out.end(), fx.data.begin() + off));
  }
  auto info = s->stat("set/obj");
  ASSERT_TRUE(info);
  EXPECT_EQ(info->size, fx.data.size());
  auto listed = s->list_all("set/");
  ASSERT_TRUE(listed);
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].key, "set/obj");
  EXPECT_EQ(s->stat("set/missing").error().code(), Code::kNotFound);
  EXPECT_EQ(s->create("x", {}).error().code(), Code::kUnsupported);
}

// Inline bytes come through the connection's reply window by default, as bytes in the
// reply frames where the client asks for none or the daemon's window memory is taken.
TEST(NodeStore, InlineBytesComeThroughTheReplyWindow) {
  Fixture fx;
  Daemon d(fx.dir);
  auto s = fx.open(d.socket());
  ASSERT_TRUE(s);
  EXPECT_EQ(read_all(*s, "set/obj", fx.data.size()), fx.data);  // cold: all inline
  ServerStats st = d.server().stats();
  EXPECT_EQ(st.window_bytes, fx.data.size());
  EXPECT_EQ(st.inline_bytes, fx.data.size());
  // Reads larger than the window (8 MiB) in several replies, and odd ranges, exact.
  for (auto [off, len] : {std::pair<uint64_t, size_t>{3, fx.data.size() - 3}, {kChunk + 1, 5}}) {
    std::vector<std::byte> out(len);
    ASSERT_EQ(s->read_full("set/obj", off, out).value(), len);
    EXPECT_TRUE(std::equal(out.begin(), out.end(), fx.data.begin() + off));
  }
  NodeOptions o;
  o.socket = d.socket();
  o.window_bytes = 0;
  auto plain = NodeStore::open(fx.root, o).value();
  const uint64_t before = d.server().stats().window_bytes;
  std::vector<std::byte> out(5000);
  ASSERT_EQ(plain->read_full("set/obj", 100, out).value(), out.size());
  EXPECT_TRUE(std::equal(out.begin(), out.end(), fx.data.begin() + 100));
  EXPECT_EQ(d.server().stats().window_bytes, before);
  // Windows are reused by the uid's later connections, never made anew for each: a client
  // that keeps a window's descriptor after its connection cannot make the daemon's grow.
  auto windows = [&] {
    return nlohmann::json::parse(s->client().cache_stat().value())["server"]["windows_bytes"]
        .get<uint64_t>();
  };
  // `s` keeps its own connection (and window) meanwhile. The daemon may not yet have taken
  // back the window of the connection just closed when the next one asks (a busy machine,
  // a sanitizer build): at most three windows are ever in use, never one per connection.
  const uint64_t window = (8 << 20) + 4096;
  for (int i = 0; i < 6; ++i) {
    auto again = fx.open(d.socket());
    ASSERT_EQ(again->read_full("set/obj", 100, out).value(), out.size());
  }
  EXPECT_GE(windows(), 2 * window);
  EXPECT_LE(windows(), 3 * window);
  // No window memory left: the daemon refuses WINDOW and the reads still succeed.
  TempDir other;
  Daemon tight(other, {}, nullptr, [](ServerOptions& so) { so.max_window_bytes = 0; });
  auto t = fx.open(tight.socket());
  EXPECT_EQ(read_all(*t, "set/obj", fx.data.size()), fx.data);
  EXPECT_EQ(tight.server().stats().window_bytes, 0u);
  EXPECT_EQ(tight.server().stats().inline_bytes, fx.data.size());
  // One uid holds at most half of the windows' memory (here one window of two).
  TempDir third;
  Daemon two(third, {}, nullptr,
             [](ServerOptions& so) { so.max_window_bytes = 2 * ((8 << 20) + 4096); });
  auto a = fx.open(two.socket());
  auto b = fx.open(two.socket());
  std::vector<std::byte> part(5000);
  ASSERT_EQ(a->read_full("set/obj", 0, part).value(), part.size());
  ASSERT_EQ(b->read_full("set/obj", 0, part).value(), part.size());  // without a window
  EXPECT_EQ(two.server().stats().window_bytes, part.size());
  EXPECT_EQ(two.server().stats().inline_bytes, 2 * part.size());
}

// WARM makes chunks resident without a byte going to the client: each fetched once, a
// second warm fetches nothing, and reads after it are all hits.
TEST(NodeClient, WarmFillsTheCacheAndCarriesNoBytes) {
  Fixture fx;
  Daemon d(fx.dir);
  auto s = fx.open(d.socket());
  ASSERT_TRUE(s);
  auto w = s->client().warm(fx.root, "set/obj", kChunk + 5, 2 * kChunk);
  ASSERT_TRUE(w) << w.error().to_string();
  EXPECT_EQ(w->end, 4 * kChunk);  // chunks 1, 2 and 3, whole
  EXPECT_EQ(w->fetched, 3 * kChunk);
  EXPECT_EQ(w->size, fx.data.size());
  w = s->client().warm(fx.root, "set/obj", 0, UINT64_MAX);  // in 64 MiB requests, to the end
  ASSERT_TRUE(w) << w.error().to_string();
  EXPECT_EQ(w->end, fx.data.size());
  EXPECT_EQ(w->fetched, fx.data.size() - 3 * kChunk);
  EXPECT_EQ(d.server().cache().stats().misses, 9u);
  EXPECT_EQ(s->client().warm(fx.root, "set/obj", 0, UINT64_MAX).value().fetched, 0u);
  EXPECT_EQ(s->client().warm(fx.root, "set/obj", fx.data.size() + 1, 10).value().fetched, 0u);
  ServerStats st = d.server().stats();
  EXPECT_EQ(st.inline_bytes + st.handoff_bytes, 0u);
  EXPECT_EQ(read_all(*s, "set/obj", fx.data.size()), fx.data);
  EXPECT_EQ(d.server().cache().stats().misses, 9u);
  // With a RAM tier too, a warm writes its chunks to NVMe before it answers (the write
  // queue, one chunk here, would drop most).
  TempDir other;
  Daemon ram(other, {}, nullptr, [](ServerOptions& so) {
    so.cache.ram_bytes = 64 << 20;
    so.cache.disk_write_queue_bytes = kChunk;
  });
  auto r = fx.open(ram.socket());
  ASSERT_EQ(r->client().warm(fx.root, "set/obj", 0, UINT64_MAX).value().fetched, fx.data.size());
  EXPECT_EQ(ram.server().cache().stats().disk.chunks, 9u);
  EXPECT_EQ(s->client().warm(fx.root, "set/missing", 0, 1).error().code(), Code::kNotFound);
  EXPECT_EQ(s->client().warm(fx.root, "set/../obj", 0, 1).error().code(), Code::kInvalidArgument);
}

// The client can read a window but not write, resize or remap it writable; the client's
// side refuses a window that is not sealed or smaller than said.
TEST(NodeFrame, AReplyWindowIsReadOnlyAndFixedForTheClient) {
  auto w = Window::create(1 << 20);
  if (!w && w.error().code() != Code::kInvalidArgument)  // no memfd seals on this kernel
    GTEST_SKIP() << "SKIP: no sealed memfd here: " << w.error().to_string();
  ASSERT_TRUE(w) << w.error().to_string();
  std::memset(w->writable().data(), 0x5a, 1 << 20);
  UniqueFd fd(::fcntl(w->fd().get(), F_DUPFD_CLOEXEC, 0));
  EXPECT_EQ(::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0), MAP_FAILED);
  const char x = 1;
  EXPECT_EQ(::pwrite(fd.get(), &x, 1, 0), -1);
  EXPECT_NE(::ftruncate(fd.get(), 4096), 0);
  EXPECT_NE(::ftruncate(fd.get(), 4 << 20), 0);
  EXPECT_NE(::fallocate(fd.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096), 0);
  UniqueFd too(::fcntl(w->fd().get(), F_DUPFD_CLOEXEC, 0));
  EXPECT_EQ(Window::map(std::move(too), 2 << 20).error().code(), Code::kCorruption);
  auto seen = Window::map(std::move(fd), 1 << 20);
  ASSERT_TRUE(seen) << seen.error().to_string();
  EXPECT_EQ(seen->bytes()[12345], std::byte{0x5a});
  w->writable()[12345] = std::byte{7};  // the daemon's later writes are seen
  EXPECT_EQ(seen->bytes()[12345], std::byte{7});
  EXPECT_NE(::mprotect(const_cast<std::byte*>(seen->bytes().data()), 4096, PROT_WRITE), 0);
  w->set_generation(41);  // the daemon passes the window on: the client sees it
  EXPECT_EQ(seen->generation(), 41u);
  UniqueFd unsealed(::memfd_create("plain", MFD_CLOEXEC));
  ASSERT_EQ(::ftruncate(unsealed.get(), 1 << 20), 0);
  EXPECT_EQ(Window::map(std::move(unsealed), 1 << 20).error().code(), Code::kCorruption);
  EXPECT_FALSE(Window::create(1000));
}

// Flips the byte at `within` of every whole chunk in the daemon's segments (an object's
// chunks share one, at kChunk steps). Returns how many.
int flip_every_chunk(const std::string& chunks_dir, uint64_t within) {
  int flipped = 0;
  for (const auto& e : fs::recursive_directory_iterator(chunks_dir)) {
    if (!e.is_regular_file()) continue;
    std::FILE* f = std::fopen(e.path().c_str(), "r+b");
    if (!f) continue;
    for (uint64_t at = 0; at + kChunk <= e.file_size(); at += kChunk) {
      std::fseek(f, static_cast<long>(at + within), SEEK_SET);
      int c = std::fgetc(f);
      std::fseek(f, static_cast<long>(at + within), SEEK_SET);
      std::fputc(0x5a ^ c, f);
      ++flipped;
    }
    std::fclose(f);
  }
  return flipped;
}

// Device memory (the emulated device: its addresses fault if touched, only its copies fill
// them) through the daemon: cold chunks inline, warm ones handed off and read into staging
// buffers, checked and copied; a corrupt chunk is caught before it reaches the device.
std::vector<std::byte> device_read(NodeStore& s, mem::Target& dev, uint64_t off, size_t len) {
  mem::Allocation a = dev.allocate(len).value();
  auto n = s.read_into("set/obj", off, io::Buffer::on(a));
  EXPECT_TRUE(n) << n.error().to_string();
  std::vector<std::byte> out(n ? *n : 0);
  if (!out.empty()) {
    auto ticket = dev.copy_to_host(out.data(), a.get(), out.size());
    EXPECT_TRUE(ticket && dev.wait(*ticket));
  }
  return out;
}

TEST(NodeStore, ReadsIntoDeviceMemoryAreExactAndChecked) {
  Fixture fx;
  Daemon d(fx.dir);
  auto s = fx.open(d.socket());
  ASSERT_TRUE(s);
  auto dev = mem::make_emulated_device(64 << 20);
  EXPECT_EQ(device_read(*s, *dev, 0, fx.data.size()), fx.data);  // cold: inline
  d.wait_for_disk(9);
  EXPECT_EQ(device_read(*s, *dev, 0, fx.data.size()), fx.data);  // warm: staged, checked
  EXPECT_EQ(s->read_stats().handoff_chunks, 8u);
  auto part = device_read(*s, *dev, kChunk - 7, 3 * kChunk);
  EXPECT_TRUE(std::equal(part.begin(), part.end(), fx.data.begin() + kChunk - 7));
  // Past the end: only what the object holds.
  EXPECT_EQ(device_read(*s, *dev, fx.data.size() - 10, 100).size(), 10u);
  // One byte flipped in every chunk on disk: each fails its check in the staging buffer and
  // is asked for again as bytes, which makes the daemon drop and refetch it.
  ASSERT_GT(flip_every_chunk(fx.dir.file("cache/chunks"), 100), 0);
  EXPECT_EQ(device_read(*s, *dev, 0, fx.data.size()), fx.data);
  EXPECT_GE(s->read_stats().checksum_retries, 1u);
  // Host memory through the same call is a plain read.
  std::vector<std::byte> host(fx.data.size());
  EXPECT_EQ(s->read_into("set/obj", 0, io::Buffer::host(host.data(), host.size())).value(),
            fx.data.size());
  EXPECT_EQ(host, fx.data);
  EXPECT_EQ(s->read_into("set/obj", 0, io::Buffer{nullptr, 10, nullptr}).error().code(),
            Code::kInvalidArgument);
}

TEST(NodeStore, ManyProcessesReadingOneObjectFetchEachChunkOnce) {
  Fixture fx;
  Daemon d(fx.dir);
  std::vector<std::thread> readers;
  std::atomic<int> exact{0};
  for (int i = 0; i < 8; ++i) {
    readers.emplace_back([&] {
      auto s = fx.open(d.socket());  // its own connections, as another process would have
      if (s && read_all(*s, "set/obj", fx.data.size()) == fx.data) ++exact;
    });
  }
  for (std::thread& t : readers) t.join();
  EXPECT_EQ(exact.load(), 8);
  EXPECT_EQ(d.server().cache().stats().misses, 9u);  // 9 chunks, each read from the source once
}

TEST(NodeStore, AChunkCorruptOnDiskIsDetectedAndRefetched) {
  Fixture fx;
  Daemon d(fx.dir);
  auto s = fx.open(d.socket());
  ASSERT_EQ(read_all(*s, "set/obj", fx.data.size()), fx.data);
  d.wait_for_disk(9);
  ASSERT_GT(flip_every_chunk(fx.dir.file("cache/chunks"), 4096), 0);
  EXPECT_EQ(read_all(*s, "set/obj", fx.data.size()), fx.data);
  EXPECT_GE(s->read_stats().checksum_retries, 1u);
  EXPECT_GE(d.server().cache().stats().checksum_failures, 1u);
}

// A file root is checked as the directory it resolves to: a symlink the caller planted in
// a granted directory leads nowhere else. "*" grants a configured team no file root; the
// daemon's own directory is never a root, whatever the grant.
TEST(NodeServer, FileRootsAreGrantedByTheDirectoryTheyResolveTo) {
  Fixture fx;
  fs::create_directories(fx.dir.file("granted"));
  fs::create_directories(fx.dir.file("secret"));
  std::ofstream(fx.dir.file("secret/file")) << "not for you";
  ::symlink(fx.dir.file("secret").c_str(), fx.dir.file("granted/e").c_str());
  std::ofstream(fx.dir.file("granted/mine")) << "yours";
  const uint32_t me = static_cast<uint32_t>(::getuid());
  TempDir other;
  Daemon d(other, {TeamGrant{"t", {me}, {"file://" + fx.dir.file("granted"), "*"}}});
  NodeOptions o;
  o.socket = d.socket();
  auto via_link = NodeStore::open("file://" + fx.dir.file("granted/e"), o).value();
  std::vector<std::byte> out(64);
  EXPECT_EQ(via_link->read("file", 0, out).error().code(), Code::kPermissionDenied);
  EXPECT_EQ(
      via_link->client().warm("file://" + fx.dir.file("granted/e"), "file", 0, 1).error().code(),
      Code::kPermissionDenied);
  auto granted = NodeStore::open("file://" + fx.dir.file("granted"), o).value();
  EXPECT_EQ(granted->read("mine", 0, out).value(), 5u);
  auto star = NodeStore::open(fx.root, o).value();  // "*" is no file root
  EXPECT_EQ(star->read("set/obj", 0, out).error().code(), Code::kPermissionDenied);
  // The implicit team reads every file root, but not the daemon's directory.
  Daemon plain(fx.dir);
  o.socket = plain.socket();
  auto own = NodeStore::open("file://" + fx.dir.file("cache"), o).value();
  EXPECT_EQ(own->read("index.log", 0, out).error().code(), Code::kPermissionDenied);
  auto above = NodeStore::open("file://" + fx.dir.path(), o).value();  // holds the cache
  EXPECT_EQ(above->read("cache/index.log", 0, out).error().code(), Code::kPermissionDenied);
  ::symlink(fx.dir.file("cache").c_str(), fx.dir.file("data/c").c_str());
  EXPECT_EQ(above->read("data/c/index.log", 0, out).error().code(), Code::kPermissionDenied);
  EXPECT_EQ(above->read("data/set/obj", 0, out).value(), out.size());
  EXPECT_EQ(NodeStore::open(fx.root, o).value()->read("set/obj", 0, out).value(), out.size());
}

// Defect 2 of the hostile test: a daemon run as root served local files with its own rights.
// A second uid in a team granted the whole file system reads only what it may open itself,
// though root has cached every byte first.
TEST(NodeServer, LocalFilesAreOpenedWithTheCallersRights) {
  if (::geteuid() != 0) GTEST_SKIP() << "SKIP: needs root to run a client as uid 65534";
  TempDir dir;
  fs::permissions(dir.path(), fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                                  fs::perms::others_read | fs::perms::others_exec);
  fs::create_directories(dir.file("data/closed"));
  std::ofstream(dir.file("data/open")) << "for everyone";
  std::ofstream(dir.file("data/secret")) << "root's only";
  std::ofstream(dir.file("data/closed/file")) << "behind a closed folder";
  ::chmod(dir.file("data/secret").c_str(), 0600);
  ::chmod(dir.file("data/closed").c_str(), 0700);
  TempDir state;
  fs::permissions(state.path(), fs::perms::owner_all | fs::perms::others_exec);
  Daemon d(state, {TeamGrant{"all", {0, 65534}, {"file:///"}}});
  ::chmod(d.socket().c_str(), 0666);
  const std::string root = "file://" + dir.file("data");
  NodeOptions o;
  o.socket = d.socket();
  {
    auto mine = NodeStore::open(root, o).value();
    std::vector<std::byte> out(64);
    for (const char* k : {"open", "secret", "closed/file"}) ASSERT_TRUE(mine->read(k, 0, out)) << k;
  }
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // The child: uid and gid 65534, no groups; each failed expectation is one exit bit.
    if (::setgroups(0, nullptr) != 0 || ::setresgid(65534, 65534, 65534) != 0 ||
        ::setresuid(65534, 65534, 65534) != 0)
      ::_exit(100);
    auto s = NodeStore::open(root, o);
    if (!s) ::_exit(101);
    std::vector<std::byte> out(64);
    int bad = 0;
    if (!(*s)->read("open", 0, out)) bad |= 1;
    auto r = (*s)->read("secret", 0, out);
    if (r || r.error().code() != Code::kPermissionDenied) bad |= 2;
    r = (*s)->read("closed/file", 0, out);
    if (r || r.error().code() != Code::kPermissionDenied) bad |= 4;
    auto st = (*s)->stat("secret");
    if (st || st.error().code() != Code::kPermissionDenied) bad |= 8;
    auto listed = (*s)->list_all("");
    if (!listed) bad |= 16;
    for (const auto& obj : listed.value_or(std::vector<store::ObjectInfo>{}))
      if (obj.key != "open") bad |= 32;
    auto chunks = (*s)->client().chunks("", "");
    if (!chunks) bad |= 64;
    for (const auto& c : chunks ? chunks->chunks : std::vector<cache::CachedChunk>{})
      if (c.key.find("secret") != std::string::npos || c.key.find("closed") != std::string::npos)
        bad |= 64;
    ::_exit(bad);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "bits: 1 open, 2 secret, 4 closed, 8 stat, 16 list, "
                                       "32 listed too much, 64 chunks; 100/101 set-up";
  EXPECT_TRUE(d.logged("may not read"));
}

// Issue 48, item 1: a local file is checked as its caller, then read by the daemon. A file
// swapped for another in between (here by the test hook, so every run meets the race) is
// not read: the request is refused Conflict naming the key, and asked again it is checked
// again and served the file now there.
TEST(NodeServer, AFileReplacedAfterItsAccessCheckIsNotServed) {
  TempDir dir;
  fs::create_directories(dir.file("data"));
  std::ofstream(dir.file("data/open")) << "checked";
  std::ofstream(dir.file("data/other")) << "swapped in";
  std::atomic<int> checks{0};
  TempDir state;
  Daemon d(state, {}, nullptr, [&](ServerOptions& o) {
    o.cache.revalidate_after = std::chrono::milliseconds(0);
    o.file_checked = [&](const std::string& path) {
      if (path.ends_with("/data/open") && checks.fetch_add(1) == 0)
        fs::rename(dir.file("data/other"), dir.file("data/open"));
    };
  });
  const std::string root = "file://" + dir.file("data");
  NodeOptions o;
  o.socket = d.socket();
  auto s = NodeStore::open(root, o).value();
  const nlohmann::json read = {{"root", root}, {"key", "open"}, {"offset", 0}, {"length", 64}};
  auto r = s->client().call(3, read.dump());  // READ
  ASSERT_FALSE(r) << "the file swapped in after the check was served: " << *r;
  EXPECT_EQ(r.error().code(), Code::kConflict) << r.error().to_string();
  EXPECT_NE(r.error().message().find("'open'"), std::string::npos) << r.error().to_string();
  EXPECT_TRUE(d.logged("was replaced after its access check"));
  std::vector<std::byte> out(64);
  ASSERT_EQ(s->read("open", 0, out).value(), 10u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(out.data()), 10), "swapped in");
  EXPECT_GE(checks.load(), 2);
}

// The same race as another user: uid 65534 may open "open", which is swapped for a link to
// root's 0600 "secret" right after its check. The daemon (root) could read the secret; the
// caller gets Conflict, then PermissionDenied, never a byte of it.
TEST(NodeServer, AFileSwappedForASecretAfterTheCheckIsNotReadWithTheDaemonsRights) {
  if (::geteuid() != 0) GTEST_SKIP() << "SKIP: needs root to run a client as uid 65534";
  TempDir dir;
  fs::permissions(dir.path(),
                  fs::perms::owner_all | fs::perms::others_read | fs::perms::others_exec);
  fs::create_directories(dir.file("data"));
  std::ofstream(dir.file("data/open")) << "for everyone";
  std::ofstream(dir.file("data/secret")) << "root's only";
  ::chmod(dir.file("data/secret").c_str(), 0600);
  TempDir state;
  fs::permissions(state.path(), fs::perms::owner_all | fs::perms::others_exec);
  std::atomic<int> swaps{0};
  const std::string link = dir.file("data/link"), open = dir.file("data/open");
  Daemon d(state, {TeamGrant{"all", {0, 65534}, {"file:///"}}}, nullptr, [&](ServerOptions& o) {
    o.cache.revalidate_after = std::chrono::milliseconds(0);
    o.file_checked = [&](const std::string& path) {
      if (path.ends_with("/data/open") && swaps.fetch_add(1) == 0) {
        ::symlink("secret", link.c_str());
        ::rename(link.c_str(), open.c_str());
      }
    };
  });
  const std::string root = "file://" + dir.file("data");
  NodeOptions o;
  o.socket = d.socket();
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (::setgroups(0, nullptr) != 0 || ::setresgid(65534, 65534, 65534) != 0 ||
        ::setresuid(65534, 65534, 65534) != 0)
      ::_exit(100);
    auto s = NodeStore::open(root, o);
    if (!s) ::_exit(101);
    int bad = 0;
    const nlohmann::json read = {{"root", root}, {"key", "open"}, {"offset", 0}, {"length", 64}};
    auto r = (*s)->client().call(3, read.dump());
    if (r) bad |= 1;  // served: the secret's bytes
    if (!r && r.error().code() != Code::kConflict) bad |= 2;
    std::vector<std::byte> out(64);
    auto again = (*s)->read("open", 0, out);  // checked again: a link to the secret now
    if (again || again.error().code() != Code::kPermissionDenied) bad |= 4;
    ::_exit(bad);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "bits: 1 the secret served, 2 not Conflict, 4 the "
                                       "second read not refused; 100/101 set-up";
  EXPECT_EQ(swaps.load() > 0, true);
  EXPECT_TRUE(d.logged("was replaced after its access check"));
}

// capget(2)/capset(2) of the calling thread, for the test below.
struct TestCaps {
  uint64_t effective = 0, permitted = 0;
};
bool get_test_caps(TestCaps& c) {
  __user_cap_header_struct h{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct d[2] = {};
  if (::syscall(SYS_capget, &h, d) != 0) return false;
  c.effective = d[0].effective | (uint64_t{d[1].effective} << 32);
  c.permitted = d[0].permitted | (uint64_t{d[1].permitted} << 32);
  return true;
}
bool raise_test_caps() {  // effective = permitted
  __user_cap_header_struct h{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct d[2] = {};
  if (::syscall(SYS_capget, &h, d) != 0) return false;
  for (auto& x : d) x.effective = x.permitted;
  return ::syscall(SYS_capset, &h, d) == 0;
}

// Issue 48, item 2: a daemon that is not root but holds capabilities (file capabilities,
// systemd's AmbientCapabilities) opens a caller's file without them (else the caller's
// check would pass for any file: the kernel lowers them on setfsuid only for root), and
// drop_privileges leaves it, in every thread, only what serving other users' local files
// needs: cap_dac_read_search, cap_setgid and cap_setuid; bounding, inheritable and ambient
// sets emptied, no_new_privs set. Serving goes on as before.
TEST(NodeServer, ADaemonWithCapabilitiesChecksAsItsCallersAndDropsTheRest) {
  if (::geteuid() != 0)
    GTEST_SKIP() << "SKIP: needs root to make a daemon of uid 65533 with capabilities";
  TestCaps mine;
  if (!get_test_caps(mine) || (mine.permitted & (1u << CAP_SETPCAP)) == 0)
    GTEST_SKIP() << "SKIP: this root lacks cap_setpcap (a container without it)";
  TempDir dir;
  fs::permissions(dir.path(),
                  fs::perms::owner_all | fs::perms::others_read | fs::perms::others_exec);
  fs::create_directories(dir.file("data"));
  std::ofstream(dir.file("data/open")) << "for everyone";
  std::ofstream(dir.file("data/secret")) << "root's only";
  std::ofstream(dir.file("data/theirs")) << "uid 65534's own";
  ::chmod(dir.file("data/secret").c_str(), 0600);
  ::chmod(dir.file("data/theirs").c_str(), 0600);
  ASSERT_EQ(::chown(dir.file("data/theirs").c_str(), 65534, 65534), 0);
  TempDir state;  // the daemon's: its cache directory and socket
  ASSERT_EQ(::chown(state.path().c_str(), 65533, 65533), 0);
  fs::permissions(state.path(), fs::perms::owner_all | fs::perms::others_exec);
  const std::string root = "file://" + dir.file("data");
  const pid_t daemon = ::fork();
  ASSERT_GE(daemon, 0);
  if (daemon == 0) {
    // uid 65533 keeping root's capabilities, as a daemon given them would hold them.
    if (::prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0) != 0 || ::setgroups(0, nullptr) != 0 ||
        ::setresgid(65533, 65533, 65533) != 0 || ::setresuid(65533, 65533, 65533) != 0 ||
        !raise_test_caps())
      ::_exit(100);
    int bad = 0;
    {
      Daemon d(state, {TeamGrant{"others", {65534}, {"file:///"}}});
      // A client of uid 65534 reads its files and "open", never root's secret: bit `shift`
      // and up.
      auto client_reads = [&](int shift) {
        const pid_t pid = ::fork();
        if (pid == 0) {
          if (::setgroups(0, nullptr) != 0 || ::setresgid(65534, 65534, 65534) != 0 ||
              ::setresuid(65534, 65534, 65534) != 0)
            ::_exit(7);
          NodeOptions o;
          o.socket = d.socket();
          auto s = NodeStore::open(root, o);
          if (!s) ::_exit(7);
          std::vector<std::byte> out(64);
          int b = 0;
          if (!(*s)->read("open", 0, out)) b |= 1;
          auto r = (*s)->read("secret", 0, out);
          if (r || r.error().code() != Code::kPermissionDenied) b |= 2;
          if ((*s)->read("theirs", 0, out).value_or(0) != 15) b |= 4;
          ::_exit(b);
        }
        int st = 0;
        if (pid < 0 || ::waitpid(pid, &st, 0) != pid || !WIFEXITED(st)) return 7 << shift;
        return WEXITSTATUS(st) << shift;
      };
      bad |= client_reads(0);
      auto p = d.server().drop_privileges();
      if (!p) ::_exit(101);
      const uint64_t keep = (1u << CAP_DAC_READ_SEARCH) | (1u << CAP_SETGID) | (1u << CAP_SETUID);
      if (p->kept != std::vector<std::string>{"cap_dac_read_search", "cap_setgid", "cap_setuid"})
        bad |= 8;
      for (const auto& task : fs::directory_iterator("/proc/self/task")) {
        std::ifstream in(task.path() / "status");
        std::map<std::string, uint64_t> v;
        std::string name;
        for (std::string line; std::getline(in, line);) {
          if (line.starts_with("Name:")) name = line.substr(5);
          size_t colon = line.find(':');
          if (line.starts_with("Cap") || line.starts_with("NoNewPrivs"))
            v[line.substr(0, colon)] =
                std::strtoull(line.c_str() + colon + 1, nullptr, line.starts_with("Cap") ? 16 : 10);
        }
        if (name.find("iou-") != std::string::npos) continue;  // io_uring's (drop_privileges)
        if (v["CapPrm"] != keep || v["CapEff"] != keep || v["CapInh"] != 0 || v["CapAmb"] != 0 ||
            v["NoNewPrivs"] != 1)
          bad |= 16;
        if (v["CapBnd"] != keep) bad |= 16;
      }
      bad |= client_reads(5);
    }
    ::_exit(bad);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(daemon, &status, 0), daemon);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0)
      << "bits: before the drop 1 open, 2 secret served, 4 theirs; 8 kept, 16 a thread's "
         "sets; after the drop 32 open, 64 secret served, 128 theirs; 100/101 set-up";
}

// Defect 22 of the hostile test: CHUNKS with a prefix and no root lists only keys under it.
TEST(NodeServer, ChunksWithAPrefixAndNoRootKeepToThePrefix) {
  Fixture fx;
  {
    auto st = store::make_posix_store(fx.dir.file("data"));
    ASSERT_TRUE(st->put("other/x", fx.data));
  }
  Daemon d(fx.dir);
  auto s = fx.open(d.socket());
  ASSERT_TRUE(s);
  EXPECT_EQ(read_all(*s, "set/obj", fx.data.size()).size(), fx.data.size());
  EXPECT_EQ(read_all(*s, "other/x", fx.data.size()).size(), fx.data.size());
  auto all = s->client().chunks("", "").value();
  auto some = s->client().chunks("", "set/").value();
  size_t set = 0, other = 0;
  for (const auto& c : all.chunks) (c.key == "set/obj" ? set : other) += 1;
  EXPECT_GT(set, 0u);
  EXPECT_GT(other, 0u);
  EXPECT_FALSE(all.truncated);
  EXPECT_EQ(some.chunks.size(), set);
  for (const auto& c : some.chunks) {
    EXPECT_EQ(c.key, "set/obj");
    EXPECT_EQ(c.store, fx.root);
  }
}

TEST(NodeServer, AUidInNoTeamIsRefusedAndLogged) {
  Fixture fx;
  Daemon d(fx.dir, {TeamGrant{"other", {12345}, {"*"}}});
  NodeOptions o;
  o.socket = d.socket();
  auto s = NodeStore::open(fx.root, o);
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code(), Code::kPermissionDenied);
  EXPECT_TRUE(d.logged("is in no team"));
}

TEST(NodeServer, ATeamReadsOnlyItsRoots) {
  Fixture fx;
  std::string allowed = "file://" + fx.dir.file("data/set");
  Daemon d(fx.dir, {TeamGrant{"vision", {static_cast<uint32_t>(::getuid())}, {allowed}}});
  NodeOptions o;
  o.socket = d.socket();
  std::ofstream(fx.dir.file("data/other")) << "not granted";
  ::symlink("../other", fx.dir.file("data/set/out").c_str());
  // The parent, as clients name a bucket or file:///: keys in the granted folder are served
  // (defect 7 of the hostile test), others not, nor through a link out of the grant.
  auto whole = NodeStore::open(fx.root, o).value();
  auto got = whole->stat("set/obj");
  ASSERT_TRUE(got) << got.error().to_string();
  EXPECT_EQ(got->size, fx.data.size());
  EXPECT_EQ(whole->stat("other").error().code(), Code::kPermissionDenied);
  EXPECT_EQ(whole->stat("set/out").error().code(), Code::kPermissionDenied);
  EXPECT_EQ(whole->list_all("").error().code(), Code::kPermissionDenied);
  // A prefix ending at the grant's name would also take its siblings ("set" and "settings/").
  EXPECT_EQ(whole->list_all("set").error().code(), Code::kPermissionDenied);
  auto listed = whole->list_all("set/");
  ASSERT_TRUE(listed) << listed.error().to_string();
  EXPECT_TRUE(std::any_of(listed->begin(), listed->end(),
                          [](const store::ObjectInfo& i) { return i.key == "set/obj"; }));
  EXPECT_EQ(NodeStore::open("file:///", o)
                .value()
                ->stat(fx.dir.file("data/set/obj").substr(1))
                .value()
                .size,
            fx.data.size());
  auto tricky = NodeStore::open(allowed + "/../set", o).value();
  EXPECT_EQ(tricky->stat("obj").error().code(), Code::kInvalidArgument);
  auto good = NodeStore::open(allowed, o).value();
  EXPECT_EQ(good->stat("obj").value().size, fx.data.size());
  EXPECT_EQ(good->stat("../set/obj").error().code(), Code::kInvalidArgument);
  EXPECT_TRUE(d.logged("may not read"));
}

TEST(NodeStore, DeclaredReadsAreFetchedAheadByTheDaemon) {
  Fixture fx;
  Daemon d(fx.dir);
  auto s = fx.open(d.socket());
  ASSERT_TRUE(s);
  EXPECT_EQ(s->chunk_size(), kChunk);
  // The loader finds the declaration seam on whatever store it reads through.
  store::Store& plain = *s;
  ASSERT_NE(dynamic_cast<cache::ReadAhead*>(&plain), nullptr);
  std::vector<cache::PlannedRead> order{{"set/obj", kChunk, 3 * kChunk}};
  ASSERT_TRUE(s->declare(order));
  d.wait_for_disk(3);  // fetched with no read asked for
  const uint64_t fetched = d.server().cache().stats().misses;
  std::vector<std::byte> out(3 * kChunk);
  ASSERT_EQ(s->read_full("set/obj", kChunk, out).value(), out.size());
  EXPECT_TRUE(std::equal(out.begin(), out.end(), fx.data.begin() + kChunk));
  EXPECT_EQ(d.server().cache().stats().misses, fetched);  // every chunk was there already
  // Bad keys and roots the team may not read are refused like reads.
  std::vector<cache::PlannedRead> tricky{{"../data/set/obj", 0, 0}};
  EXPECT_EQ(s->declare(tricky).error().code(), Code::kInvalidArgument);
  TempDir other;
  std::string allowed = "file://" + fx.dir.file("data/set");
  Daemon narrow(other, {TeamGrant{"vision", {static_cast<uint32_t>(::getuid())}, {allowed}}});
  NodeOptions o;
  o.socket = narrow.socket();
  auto whole = NodeStore::open(fx.root, o).value();
  std::vector<cache::PlannedRead> outside{{"elsewhere/obj", 0, 1}};
  EXPECT_EQ(whole->declare(outside).error().code(), Code::kPermissionDenied);
  // Many reads go in several frames.
  std::vector<cache::PlannedRead> many(kMaxDeclareReads + 10, {"set/obj", 0, 1});
  EXPECT_TRUE(s->declare(many));
}

// Raw bytes on a fresh connection; returns what the daemon answered (or nothing).
std::string send_raw(const std::string& socket, std::span<const std::byte> bytes) {
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strcpy(addr.sun_path, socket.c_str());
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) return "";
  (void)::send(fd.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL);
  ::shutdown(fd.get(), SHUT_WR);
  FrameChannel ch(std::move(fd));
  auto r = ch.receive(std::chrono::seconds(5), std::chrono::seconds(5));
  return r && *r ? (*r)->json : "";
}

std::vector<std::byte> frame_bytes(uint16_t type, std::string json) {
  Frame f;
  f.type = type;
  f.request_id = 9;
  f.json = std::move(json);
  auto h = encode_header(f);
  std::vector<std::byte> out(h.begin(), h.end());
  for (char c : f.json) out.push_back(std::byte(c));
  return out;
}

TEST(NodeServer, MalformedRequestsGetErrorsAndTheDaemonStaysUp) {
  Fixture fx;
  Daemon d(fx.dir);
  auto garbage = random_bytes(100, 3);
  EXPECT_NE(send_raw(d.socket(), garbage).find("bad magic"), std::string::npos);
  // A frame announcing more data than a request may carry, its data still coming: the
  // error frame stays readable after the daemon closes (a client whose send failed must
  // still read it).
  Frame big;
  big.type = 3;
  big.request_id = 9;
  big.json = "{}";
  big.data.resize(4 << 20);
  std::memset(big.data.data(), 7, big.data.size());
  std::vector<std::byte> oversize;
  for (std::byte b : encode_header(big)) oversize.push_back(b);
  for (char c : big.json) oversize.push_back(std::byte(c));
  oversize.resize(oversize.size() + big.data.size(), std::byte{7});
  EXPECT_NE(send_raw(d.socket(), oversize).find("data"), std::string::npos);
  auto header = frame_bytes(3, "{}");
  header.resize(20);  // truncated mid-header: closed without a reply to parse
  send_raw(d.socket(), header);
  EXPECT_NE(send_raw(d.socket(), frame_bytes(3, "not json")).find("not a JSON object"),
            std::string::npos);
  EXPECT_NE(send_raw(d.socket(), frame_bytes(3, R"({"root":"x"})")).find("not a URI"),
            std::string::npos);
  std::string r = fx.root;
  EXPECT_NE(send_raw(d.socket(), frame_bytes(3, R"({"root":")" + r +
                                                    R"(","key":"a/../b","offset":0,"length":1})"))
                .find("invalid"),
            std::string::npos);
  EXPECT_NE(send_raw(d.socket(), frame_bytes(3, R"({"root":")" + r +
                                                    R"(","key":"set/obj","offset":-1,"length":1})"))
                .find("unsigned"),
            std::string::npos);
  EXPECT_NE(send_raw(d.socket(), frame_bytes(777, "{}")).find("unknown request type"),
            std::string::npos);
  EXPECT_NE(
      send_raw(d.socket(),
               frame_bytes(3, R"({"root":")" + r +
                                  R"(","key":"set/obj","offset":0,"length":1,"window":true})"))
          .find("mapped none"),
      std::string::npos);
  EXPECT_NE(send_raw(d.socket(), frame_bytes(10, R"({"bytes":"big"})")).find("unsigned"),
            std::string::npos);
  // A key near the frame limit is refused with a reply (its echo clipped), not a closed
  // connection.
  EXPECT_NE(send_raw(d.socket(),
                     frame_bytes(3, R"({"root":")" + r + R"(","key":")" + std::string(900000, 'k') +
                                        R"(","offset":0,"length":1})"))
                .find("bytes shown"),
            std::string::npos);
  // A small fuzz loop: every byte of a valid request flipped in turn, some at random.
  auto valid =
      frame_bytes(3, R"({"root":")" + r + R"(","key":"set/obj","offset":0,"length":4096})");
  std::mt19937 rng(11);
  for (int i = 0; i < 300; ++i) {
    auto m = valid;
    size_t at = i < static_cast<int>(m.size()) ? static_cast<size_t>(i) : rng() % m.size();
    m[at] ^= std::byte(1 + rng() % 255);
    if (i % 7 == 0) m.resize(rng() % m.size());
    send_raw(d.socket(), m);
  }
  auto s = fx.open(d.socket());
  ASSERT_TRUE(s);
  EXPECT_EQ(read_all(*s, "set/obj", fx.data.size()), fx.data);
  EXPECT_GT(d.server().stats().request_errors, 5u);
}

// Chunks kept on NVMe are charged to the team owning the object's project, within its
// nvme quota: past it, reads still succeed but no more chunks are kept; evicted chunks are
// uncharged, across a restart.
TEST(NodeServer, CacheFillsAreChargedToTheTeamWithinItsQuota) {
  Fixture fx(8 * kChunk);
  auto opened = ledger::Ledger::open(fx.dir.file("ledger.db"));
  ASSERT_TRUE(opened) << opened.error().to_string();
  std::shared_ptr<ledger::Ledger> l(std::move(*opened));
  ASSERT_TRUE(l->add_team("vision"));
  ASSERT_TRUE(l->add_project(ledger::Project{.id = "vision-data",
                                             .team = "vision",
                                             .location = fx.root + "/set",
                                             .tier = ledger::Tier::kObject,
                                             .kind = ledger::Kind::kDataset}));
  ASSERT_TRUE(l->set_limits("vision", ledger::Tier::kNvme,
                            ledger::Limits{.hard_bytes = 3 * kChunk + 16384}));
  auto nvme = [&] {
    auto a = l->accounts("vision");
    EXPECT_TRUE(a);
    for (const ledger::Account& x : *a)
      if (x.tier == ledger::Tier::kNvme) return x;
    return ledger::Account{};
  };
  {
    Daemon d(fx.dir, {}, l);
    auto s = fx.open(d.socket());
    ASSERT_TRUE(s);
    EXPECT_EQ(read_all(*s, "set/obj", fx.data.size()), fx.data);
    d.wait_for_disk(3);
    EXPECT_EQ(read_all(*s, "set/obj", fx.data.size()), fx.data);  // refused chunks: inline
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_EQ(d.server().cache().stats().disk.chunks, 3u);
    EXPECT_TRUE(d.logged("team vision")) << "the refusal is logged";
  }  // the charger flushes as the daemon goes
  ledger::Account a = nvme();
  EXPECT_EQ(a.used_bytes, static_cast<int64_t>(3 * kChunk));
  EXPECT_EQ(a.reserved_bytes, 0);
  // Defect 11 of the hostile test: a daemon killed between two flushes lost the charges of
  // that interval for good. Here the ledger says one chunk where the cache holds three; the
  // restarted daemon charges what it finds.
  auto tallies = l->tallies();
  ASSERT_TRUE(tallies);
  ASSERT_EQ(tallies->size(), 1u);
  ASSERT_TRUE(l->set_tally((*tallies)[0].source, (*tallies)[0].target, kChunk));
  EXPECT_EQ(nvme().used_bytes, static_cast<int64_t>(kChunk));
  {
    Daemon d(fx.dir, {}, l);
    EXPECT_EQ(d.server().cache().stats().disk.chunks, 3u);
  }
  EXPECT_EQ(nvme().used_bytes, static_cast<int64_t>(3 * kChunk));
  {
    Daemon d(fx.dir, {}, l);  // restarted: its chunks are still there, still charged
    EXPECT_EQ(d.server().cache().stats().disk.chunks, 3u);
    ASSERT_EQ(d.server().cache().evict("").value(), 3u);
  }
  a = nvme();
  EXPECT_EQ(a.used_bytes, 0);
  EXPECT_EQ(a.reserved_bytes, 0);
}

TEST(NodeServer, ASecondDaemonOnTheSameSocketIsRefused) {
  Fixture fx;
  Daemon d(fx.dir);
  ServerOptions o;
  o.socket_path = d.socket();
  o.cache.directory = fx.dir.file("cache2");
  auto second = NodeServer::open(std::move(o));
  ASSERT_FALSE(second);
  EXPECT_EQ(second.error().code(), Code::kUnavailable);
}

TEST(NodeStore, WithoutADaemonTheUriFallsBackToTheEmbeddedCache) {
  Fixture fx;
  store::StoreOptions so;
  NodeOptions no;
  no.socket = fx.dir.file("nobody.sock");
  std::string note;
  no.on_fallback = [&](const std::string& why) { note = why; };
  so.backend.set(no);
  cache::CacheOptions co;
  co.directory = fx.dir.file("embedded");
  so.backend.set(co);
  register_scheme();
  auto s = store::open_store("node+" + fx.root, so);
  ASSERT_TRUE(s) << s.error().to_string();
  EXPECT_TRUE((*s)->uri().starts_with("cache+")) << (*s)->uri();
  EXPECT_NE(note.find("no sluiced answers"), std::string::npos) << note;
  EXPECT_EQ((*s)->get("set/obj").value(), fx.data);
  no.fallback = false;
  so.backend.set(no);
  EXPECT_EQ(store::open_store("node+" + fx.root, so).error().code(), Code::kUnavailable);
}

// The one cache control plane: the embedded cache (DirectoryControl) and sluiced's
// (DaemonControl) answer the same calls the same way, and client::warm runs on either.
void exercise_control(cache::Control& control, const Fixture& fx, bool daemon) {
  SCOPED_TRACE(daemon ? "through sluiced" : "embedded");
  const uint64_t chunks = (fx.data.size() + kChunk - 1) / kChunk;
  auto st = control.status();
  ASSERT_TRUE(st) << st.error().to_string();
  EXPECT_EQ(st->daemon.has_value(), daemon);
  EXPECT_FALSE(st->stats.directory.empty());

  auto warmed = client::warm(control, {.store_uri = fx.root, .prefix = "set/"}, {});
  ASSERT_TRUE(warmed) << warmed.error().to_string();
  EXPECT_EQ(warmed->copy.objects, 1u);
  EXPECT_EQ(warmed->copy.bytes, fx.data.size());
  EXPECT_EQ(warmed->fetched, fx.data.size());
  EXPECT_EQ(warmed->not_kept, 0u);
  auto again = control.warm(fx.root, "set/obj", 0, UINT64_MAX);
  ASSERT_TRUE(again) << again.error().to_string();
  EXPECT_EQ(again->fetched, 0u);
  EXPECT_EQ(again->size, fx.data.size());
  EXPECT_EQ(again->end, fx.data.size());
  EXPECT_EQ(client::warm(control, {.store_uri = fx.root, .prefix = "nothing/"}, {}).error().code(),
            Code::kNotFound);

  auto listed = control.chunks(fx.root, "set/");
  ASSERT_TRUE(listed) << listed.error().to_string();
  EXPECT_EQ(listed->chunks.size(), chunks);
  for (const cache::CachedChunk& c : listed->chunks) EXPECT_EQ(c.key, "set/obj");
  EXPECT_EQ(control.chunks("", "").value().chunks.size(), chunks);
  EXPECT_TRUE(control.chunks(fx.root, "other/").value().chunks.empty());

  EXPECT_GE(control.pin(fx.root, "set/", true).value(), chunks);
  const cache::ChunkListing pinned = control.chunks(fx.root, "set/").value();
  for (const cache::CachedChunk& c : pinned.chunks) EXPECT_TRUE(c.pinned);
  EXPECT_GE(control.pin(fx.root, "set/", false).value(), chunks);
  EXPECT_GE(control.evict(fx.root, "set/").value(), chunks);
  EXPECT_TRUE(control.chunks(fx.root, "set/").value().chunks.empty());

  auto verified = control.verify();
  if (daemon) {
    ASSERT_FALSE(verified);
    EXPECT_EQ(verified.error().code(), Code::kUnavailable);
  } else {
    ASSERT_TRUE(verified) << verified.error().to_string();
    EXPECT_TRUE(verified->corrupt.empty());
  }
}

TEST(CacheControl, TheEmbeddedCacheAndSluicedAnswerAlike) {
  Fixture fx;
  {
    cache::CacheOptions o;
    o.directory = fx.dir.file("embedded-cache");
    o.chunk_size = kChunk;
    o.ram_bytes = 64 << 20;
    o.disk_bytes = 256 << 20;
    cache::DirectoryControl embedded(
        o, [](const std::string& uri) { return store::open_store(uri, {}); });
    exercise_control(embedded, fx, false);
  }
  Daemon d(fx.dir);
  auto client = NodeClient::connect(d.socket(), std::chrono::seconds(10));
  ASSERT_TRUE(client) << client.error().to_string();
  DaemonControl daemon(std::move(*client), d.socket());
  exercise_control(daemon, fx, true);
}

}  // namespace
}  // namespace sluice::node
