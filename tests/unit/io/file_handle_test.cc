// The cuFile-shaped data path: correctness at every alignment, on every engine, with and
// without O_DIRECT, into host memory and through the bounce pipeline, and every failure.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <random>
#include <thread>

#include <gtest/gtest.h>

#include "sluice/io/file_handle.h"
#include "test_util.h"

namespace sluice::io {
namespace {

using sluice::testing::random_bytes;
using sluice::testing::ScratchMount;
using sluice::testing::TempDir;
using namespace std::chrono_literals;

void write_file(const std::string& path, const std::vector<std::byte>& data) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
}

std::vector<std::byte> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::vector<char> v((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(v.size());
  std::memcpy(out.data(), v.data(), v.size());
  return out;
}

std::shared_ptr<Context> small_context(EngineKind kind = EngineKind::kAuto) {
  ContextOptions o;
  o.engine.kind = kind;
  o.engine.queue_depth = 16;
  o.chunk_size = 256 << 10;  // small chunks: requests split, and big ones outgrow the pool
  o.staging_buffers = 3;
  auto c = Context::open(o);
  EXPECT_TRUE(c) << c.error().to_string();
  return *c;
}

struct Variant {
  EngineKind engine;
  DirectMode direct;
};

class FileHandleTest : public ::testing::TestWithParam<Variant> {
 protected:
  void SetUp() override {
    std::string why;
    if (GetParam().engine == EngineKind::kUring && !uring_available(&why))
      SKIP_BECAUSE("io_uring unavailable here: " + why);
    ctx_ = small_context(GetParam().engine);
    data_ = random_bytes(kSize, 42);
    path_ = dir_.file("data.bin");
    write_file(path_, data_);
  }
  OpenOptions opts(bool write = false) const {
    OpenOptions o;
    o.write = write;
    o.direct = GetParam().direct;
    return o;
  }
  // Reads [off, off+len) into a buffer misaligned by `skew` and checks every byte.
  void check_read(FileHandle& fh, uint64_t off, size_t len, size_t skew) {
    std::vector<std::byte> mem(len + skew + 4096 + 16, std::byte{0xEE});
    // Start from a page-aligned address, then add the skew.
    auto base = reinterpret_cast<uintptr_t>(mem.data());
    size_t pad = (4096 - base % 4096) % 4096;
    std::byte* buf = mem.data() + pad + skew;
    auto n = fh.read(Buffer::host(buf, len), len, off);
    ASSERT_TRUE(n) << n.error().to_string() << " off=" << off << " len=" << len;
    size_t expect = off >= data_.size() ? 0 : std::min<size_t>(len, data_.size() - off);
    ASSERT_EQ(*n, expect) << "off=" << off << " len=" << len << " skew=" << skew;
    ASSERT_EQ(std::memcmp(buf, data_.data() + std::min<size_t>(off, data_.size()), expect), 0)
        << "off=" << off << " len=" << len << " skew=" << skew;
    // Nothing written past what was read.
    for (size_t i = expect; i < std::min<size_t>(len, expect + 64); ++i)
      ASSERT_EQ(buf[i], std::byte{0xEE}) << "byte past the end was overwritten";
  }

  static constexpr size_t kSize = 5 * (1 << 20) + 123;  // not block aligned
  TempDir dir_;
  std::shared_ptr<Context> ctx_;
  std::vector<std::byte> data_;
  std::string path_;
};

TEST_P(FileHandleTest, EdgeCaseRangesReadExactly) {
  auto fh = FileHandle::open(ctx_, path_, opts()).value();
  EXPECT_EQ(fh.size().value(), kSize);
  const uint64_t chunk = 256 << 10;
  struct Case {
    uint64_t off;
    size_t len;
  } cases[] = {
      {0, 1},
      {0, 4096},
      {1, 4095},
      {4095, 2},
      {4096, 4096},
      {4097, 8191},
      {100, 1 << 20},
      {0, kSize},
      {chunk - 1, 2},
      {chunk, chunk},
      {chunk - 4096, chunk + 8192},
      {kSize - 10, 100},
      {kSize - 123, 123},
      {kSize - 4096, 8192},
      {kSize, 10},
      {kSize + 4096, 10},
      {3 * chunk + 17, 5 * chunk + 999},
  };
  for (auto c : cases)
    for (size_t skew : {0, 1, 8, 512, 4095}) check_read(fh, c.off, c.len, skew);
}

TEST_P(FileHandleTest, RandomRangesReadExactly) {
  auto fh = FileHandle::open(ctx_, path_, opts()).value();
  std::mt19937_64 rng(7);
  for (int i = 0; i < 300; ++i) {
    uint64_t off = rng() % (kSize + 8192);
    size_t len = 1 + rng() % (i % 10 == 0 ? (2 << 20) : 20000);
    check_read(fh, off, len, rng() % 4096);
  }
}

TEST_P(FileHandleTest, UnalignedWritesReadBackByteForByte) {
  auto fh = FileHandle::open(ctx_, path_, opts(true)).value();
  std::vector<std::byte> shadow = data_;
  std::mt19937_64 rng(11);
  for (int i = 0; i < 60; ++i) {
    uint64_t off = rng() % (kSize + 10000);
    size_t len = 1 + rng() % (i % 6 == 0 ? (1 << 20) : 9000);
    auto src = random_bytes(len + 4096, 100 + i);
    size_t skew = rng() % 4096;
    auto n = fh.write(Buffer::host(src.data() + skew, len), len, off);
    ASSERT_TRUE(n) << n.error().to_string();
    ASSERT_EQ(*n, len);
    if (shadow.size() < off + len) shadow.resize(off + len, std::byte{0});
    std::memcpy(shadow.data() + off, src.data() + skew, len);
  }
  ASSERT_TRUE(fh.sync());
  EXPECT_EQ(fh.size().value(), shadow.size());
  EXPECT_EQ(read_file(path_), shadow);
  data_ = shadow;
  check_read(fh, 0, shadow.size(), 3);
}

TEST_P(FileHandleTest, ManyHandlesAndThreadsAtOnce) {
  auto shared = FileHandle::open(ctx_, path_, opts()).value();
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 6; ++t)
    threads.emplace_back([&, t] {
      auto own = FileHandle::open(ctx_, path_, opts());
      if (!own) {
        ++failures;
        return;
      }
      std::mt19937_64 rng(t);
      for (int i = 0; i < 40; ++i) {
        FileHandle& fh = i % 2 ? shared : *own;
        uint64_t off = rng() % kSize;
        size_t len = 1 + rng() % 300000;
        std::vector<std::byte> buf(len);
        auto n = fh.read(Buffer::host(buf.data(), len), len, off);
        size_t expect = std::min<size_t>(len, kSize - off);
        if (!n || *n != expect || std::memcmp(buf.data(), data_.data() + off, expect) != 0)
          ++failures;
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST_P(FileHandleTest, AsyncReadsAndWrites) {
  auto fh = FileHandle::open(ctx_, path_, opts(true)).value();
  std::vector<std::vector<std::byte>> bufs(8, std::vector<std::byte>(70000));
  std::vector<std::future<Result<size_t>>> futs;
  for (int i = 0; i < 8; ++i)
    futs.push_back(fh.read_async(Buffer::host(bufs[i].data(), 70000), 70000, i * 333333u));
  for (int i = 0; i < 8; ++i) {
    auto r = futs[i].get();
    ASSERT_TRUE(r);
    EXPECT_EQ(*r, 70000u);
    EXPECT_EQ(std::memcmp(bufs[i].data(), data_.data() + i * 333333u, 70000), 0);
  }
  auto src = random_bytes(12345, 5);
  auto w = fh.write_async(Buffer::host(src.data(), src.size()), src.size(), 777);
  ASSERT_EQ(w.get().value(), src.size());
  std::vector<std::byte> back(src.size());
  ASSERT_EQ(fh.read(Buffer::host(back.data(), back.size()), back.size(), 777).value(), src.size());
  EXPECT_EQ(back, src);
}

TEST_P(FileHandleTest, BatchOfManySmallReads) {
  auto fh = FileHandle::open(ctx_, path_, opts()).value();
  auto batch = Batch::create(ctx_, 64).value();
  std::vector<std::byte> mem(64 * 5000);
  std::vector<BatchIO> ios;
  std::mt19937_64 rng(3);
  std::vector<uint64_t> offs(64);
  for (unsigned i = 0; i < 64; ++i) {
    offs[i] = rng() % (kSize - 5000);
    ios.push_back(BatchIO{OpCode::kRead, &fh, Buffer::host(mem.data(), mem.size()), 5000, offs[i],
                          i * 5000, i});
  }
  ASSERT_TRUE(batch.submit(ios));
  EXPECT_EQ(batch.in_flight(), 64u);
  auto over = batch.submit(ios);  // over capacity
  ASSERT_FALSE(over);
  EXPECT_EQ(over.error().code(), Code::kInvalidArgument);
  std::vector<BatchResult> results;
  while (results.size() < 64) {
    auto n = batch.wait(results, 1, 5s);
    ASSERT_TRUE(n);
    ASSERT_GT(*n, 0u);
  }
  EXPECT_EQ(batch.in_flight(), 0u);
  std::vector<bool> seen(64);
  for (auto& r : results) {
    ASSERT_TRUE(r.result);
    EXPECT_EQ(*r.result, 5000u);
    seen[r.cookie] = true;
    EXPECT_EQ(std::memcmp(mem.data() + r.cookie * 5000, data_.data() + offs[r.cookie], 5000), 0);
  }
  EXPECT_EQ(std::count(seen.begin(), seen.end(), true), 64);
}

TEST_P(FileHandleTest, ReportsThePathItTook) {
  auto fh = FileHandle::open(ctx_, path_, opts()).value();
  PathReport r = fh.path_report();
  EXPECT_EQ(r.direct, GetParam().direct != DirectMode::kOff);
  EXPECT_EQ(r.engine, GetParam().engine == EngineKind::kUring ? "io_uring" : "thread-pool");
  EXPECT_FALSE(r.why.empty());
  if (GetParam().direct == DirectMode::kOff) {
    EXPECT_NE(r.why.find("turned off by option"), std::string::npos);
  }
  EXPECT_EQ(r.describe(), std::string(r.direct ? "direct+" : "buffered+") + r.engine);
}

TEST_P(FileHandleTest, BounceThroughEmulatedDevice) {
  auto dev = mem::make_emulated_device(16 << 20);
  auto fh = FileHandle::open(ctx_, path_, opts(true)).value();
  auto alloc = dev->allocate(kSize + 5000).value();
  Buffer d = Buffer::on(alloc);
  EXPECT_NE(fh.path_report().describe(dev.get()).find("+bounce(emulated-device)"),
            std::string::npos);

  // Device memory is not host memory: the kernel refuses to read into it.
  int fd = ::open(path_.c_str(), O_RDONLY);
  errno = 0;
  EXPECT_EQ(::pread(fd, d.ptr, 16, 0), -1);
  EXPECT_EQ(errno, EFAULT);
  ::close(fd);

  // Whole file, then odd ranges at odd device offsets.
  for (auto [off, len, boff] : std::vector<std::tuple<uint64_t, size_t, size_t>>{
           {0, kSize, 0}, {1, 4095, 3}, {4097, (1 << 20) + 17, 1000}, {kSize - 100, 4096, 7}}) {
    auto n = fh.read(d, len, off, boff);
    ASSERT_TRUE(n) << n.error().to_string();
    size_t expect = std::min<size_t>(len, kSize - off);
    ASSERT_EQ(*n, expect);
    std::vector<std::byte> back(expect);
    auto t = dev->copy_to_host(back.data(), static_cast<std::byte*>(d.ptr) + boff, expect);
    ASSERT_TRUE(t);
    ASSERT_TRUE(dev->wait(*t));
    ASSERT_EQ(std::memcmp(back.data(), data_.data() + off, expect), 0) << off;
  }

  // Device -> file: fill device memory, write it at an unaligned offset, read it back.
  auto src = random_bytes(700001, 9);
  auto t = dev->copy_to_target(d.ptr, src.data(), src.size());
  ASSERT_TRUE(t && dev->wait(*t));
  ASSERT_EQ(fh.write(d, src.size(), 12345).value(), src.size());
  auto file = read_file(path_);
  EXPECT_EQ(std::memcmp(file.data() + 12345, src.data(), src.size()), 0);
}

INSTANTIATE_TEST_SUITE_P(Paths, FileHandleTest,
                         ::testing::Values(Variant{EngineKind::kUring, DirectMode::kAuto},
                                           Variant{EngineKind::kUring, DirectMode::kOff},
                                           Variant{EngineKind::kThreadPool, DirectMode::kAuto},
                                           Variant{EngineKind::kThreadPool, DirectMode::kOff}),
                         [](const auto& p) {
                           return std::string(p.param.engine == EngineKind::kUring ? "uring"
                                                                                   : "threadpool") +
                                  (p.param.direct == DirectMode::kOff ? "_buffered" : "_direct");
                         });

// --- failure paths ---------------------------------------------------------------------

TEST(FileHandleErrors, MissingFileIsNotFoundAndNamed) {
  TempDir dir;
  auto r = FileHandle::open(small_context(), dir.file("missing.bin"));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), Code::kNotFound);
  EXPECT_NE(r.error().message().find("missing.bin"), std::string::npos);
}

TEST(FileHandleErrors, DirectoryIsRejected) {
  TempDir dir;
  auto r = FileHandle::open(small_context(), dir.path());
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), Code::kInvalidArgument);
}

TEST(FileHandleErrors, AFifoIsRefusedNotWaitedOn) {
  // Opening a FIFO waits for its other end: a FIFO where a file was expected must fail.
  TempDir dir;
  ASSERT_EQ(::mkfifo(dir.file("fifo").c_str(), 0600), 0);
  auto r = FileHandle::open(small_context(), dir.file("fifo"));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), Code::kInvalidArgument);
  EXPECT_NE(r.error().message().find("FIFO"), std::string::npos) << r.error().message();
  OpenOptions w;
  w.write = w.create = true;
  EXPECT_FALSE(FileHandle::open(small_context(), dir.file("fifo"), w));  // no reader: ENXIO
}

TEST(FileHandleErrors, WriteThroughReadOnlyHandle) {
  TempDir dir;
  write_file(dir.file("f"), random_bytes(100));
  auto fh = FileHandle::open(small_context(), dir.file("f")).value();
  char buf[10] = {};
  auto r = fh.write(Buffer::host(buf, 10), 10, 0);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), Code::kPermissionDenied);
}

TEST(FileHandleErrors, BufferTooSmall) {
  TempDir dir;
  write_file(dir.file("f"), random_bytes(100));
  auto fh = FileHandle::open(small_context(), dir.file("f")).value();
  char buf[10];
  auto r = fh.read(Buffer::host(buf, 10), 20, 0);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), Code::kInvalidArgument);
  EXPECT_EQ(fh.read(Buffer::host(buf, 10), 5, 0, 6).error().code(), Code::kInvalidArgument);
}

TEST(FileHandleErrors, PermissionDenied) {
  TempDir dir;
  write_file(dir.file("secret"), random_bytes(100));
  ::chmod(dir.file("secret").c_str(), 0600);
  if (::geteuid() != 0) {
    ::chmod(dir.file("secret").c_str(), 0);
    auto r = FileHandle::open(small_context(), dir.file("secret"));
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code(), Code::kPermissionDenied);
    return;
  }
  // Root reads anything: check as an unprivileged user in a child process.
  ::chmod(dir.path().c_str(), 0755);
  pid_t pid = ::fork();
  if (pid == 0) {
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(3);
    ContextOptions o;
    o.engine.kind = EngineKind::kThreadPool;
    auto ctx = Context::open(o);
    if (!ctx) ::_exit(4);
    auto r = FileHandle::open(*ctx, dir.file("secret"));
    bool good = !r && r.error().code() == Code::kPermissionDenied &&
                r.error().message().find("secret") != std::string::npos;
    ::_exit(good ? 0 : 1);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(FileHandleErrors, NoSpaceOnASmallTmpfs) {
  ScratchMount tmpfs("tmpfs", "size=1m");
  if (!tmpfs.ok()) SKIP_BECAUSE("cannot mount a small tmpfs: " + tmpfs.why());
  OpenOptions o;
  o.write = true;
  o.create = true;
  auto fh = FileHandle::open(small_context(), tmpfs.file("big.bin"), o).value();
  auto data = random_bytes(3 << 20);
  auto r = fh.write(Buffer::host(data.data(), data.size()), data.size(), 0);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), Code::kNoSpace) << r.error().to_string();
  EXPECT_NE(r.error().message().find("big.bin"), std::string::npos);
  EXPECT_NE(r.error().message().find("offset"), std::string::npos);
}

TEST(FileHandleErrors, RamfsHasNoODirectSoItFallsBackAndSaysWhy) {
  ScratchMount ramfs("ramfs", nullptr);
  if (!ramfs.ok()) SKIP_BECAUSE("cannot mount ramfs: " + ramfs.why());
  auto data = random_bytes(300000, 4);
  write_file(ramfs.file("f"), data);
  auto ctx = small_context();
  auto fh = FileHandle::open(ctx, ramfs.file("f")).value();
  PathReport r = fh.path_report();
  EXPECT_FALSE(r.direct);
  EXPECT_NE(r.why.find("does not support direct I/O"), std::string::npos) << r.why;
  std::vector<std::byte> back(data.size());
  EXPECT_EQ(fh.read(Buffer::host(back.data(), back.size()), back.size(), 0).value(), data.size());
  EXPECT_EQ(back, data);

  OpenOptions must;
  must.direct = DirectMode::kOn;
  auto strict = FileHandle::open(ctx, ramfs.file("f"), must);
  ASSERT_FALSE(strict);
  EXPECT_EQ(strict.error().code(), Code::kUnsupported);
}

TEST(FileHandleErrors, GdsRequiredButMissing) {
  TempDir dir;
  write_file(dir.file("f"), random_bytes(100));
  OpenOptions o;
  o.compat = CompatMode::kOff;
  ContextOptions co;
  co.cufile_library = "libcufile-that-does-not-exist.so";
  auto r = FileHandle::open(Context::open(co).value(), dir.file("f"), o);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), Code::kUnsupported);
  EXPECT_NE(r.error().message().find("GPUDirect Storage"), std::string::npos);
}

TEST(FileHandleErrors, ThreadPoolWhenIoUringIsTurnedOff) {
  TempDir dir;
  write_file(dir.file("f"), random_bytes(5000));
  auto fh = FileHandle::open(small_context(EngineKind::kThreadPool), dir.file("f")).value();
  EXPECT_EQ(fh.path_report().engine, "thread-pool");
  EXPECT_NE(fh.path_report().why.find("thread pool requested"), std::string::npos);
}

TEST(FileHandleAsync, DroppingEverythingRightAfterAnAsyncReadIsSafe) {
  // The executor thread must never hold the last reference to the context it runs in.
  TempDir dir;
  write_file(dir.file("f"), random_bytes(10000));
  for (int i = 0; i < 50; ++i) {
    std::vector<std::byte> buf(10000);
    std::future<Result<size_t>> f;
    {
      auto fh = FileHandle::open(small_context(), dir.file("f")).value();
      f = fh.read_async(Buffer::host(buf.data(), buf.size()), buf.size(), 0);
      ASSERT_EQ(f.get().value(), 10000u);
    }
  }
}

TEST(FileHandleErrors, ContextRejectsBadChunkSizes) {
  ContextOptions o;
  o.chunk_size = 1000;
  EXPECT_EQ(Context::open(o).error().code(), Code::kInvalidArgument);
}

TEST(Cuda, AbsentOrUnusableCudaIsUnsupported) {
  auto t = mem::open_cuda_target();
  if (t) SKIP_BECAUSE("a CUDA device is present; this test covers machines without one");
  EXPECT_EQ(t.error().code(), Code::kUnsupported) << t.error().to_string();
  auto missing = mem::open_cuda_target(mem::CudaOptions{.device = 0, .library = "libnope.so"});
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.error().message().find("libnope.so"), std::string::npos);
}

}  // namespace
}  // namespace sluice::io
