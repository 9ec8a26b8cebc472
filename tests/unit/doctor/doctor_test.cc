// The doctor's parsers on fixture text and trees, and each rule on made-up figures. The real
// degraded setups (loop devices, cgroup throttles, noisy neighbours) are in
// tests/integration/doctor_test.py.
#include <fcntl.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "sluice/core/fd.h"
#include "sluice/doctor/diagnose.h"
#include "sluice/doctor/object_store.h"
#include "sluice/doctor/observe.h"
#include "test_util.h"

namespace sluice::doctor {
namespace {

namespace fs = std::filesystem;
using sluice::testing::TempDir;

void write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

TEST(Parse, DiskStat) {
  auto c = parse_disk_stat(
      "  120000      500  9600000    60000     3000       10    48000     2000        2    55000   "
      "  62000        0        0        0        0      100      300\n");
  ASSERT_TRUE(c) << c.error().message();
  EXPECT_EQ(c->reads, 120000u);
  EXPECT_EQ(c->read_sectors, 9600000u);
  EXPECT_EQ(c->in_flight, 2u);
  EXPECT_EQ(c->queue_ms, 62000u);
  EXPECT_FALSE(parse_disk_stat("1 2 3"));
  EXPECT_FALSE(parse_disk_stat("1 2 3 4 5 6 7 8 9 10 x"));
}

TEST(Parse, ProcIo) {
  auto io = parse_proc_io(
      "rchar: 1000\nwchar: 20\nsyscr: 10\nsyscw: 2\nread_bytes: 4096\nwrite_bytes: 0\n"
      "cancelled_write_bytes: 0\n");
  ASSERT_TRUE(io);
  EXPECT_EQ(io->rchar, 1000u);
  EXPECT_EQ(io->syscr, 10u);
  EXPECT_EQ(io->read_bytes, 4096u);
  EXPECT_FALSE(parse_proc_io("rchar: 1\n"));
  EXPECT_FALSE(
      parse_proc_io("rchar: x\nwchar: 1\nsyscr: 1\nsyscw: 1\nread_bytes: 1\nwrite_bytes: 1\n"));
}

TEST(Parse, TaskStatWithParenthesesInTheName) {
  auto t = parse_task_stat(
      "4242 (my (odd) name) R 1 4242 4242 0 -1 4194304 100 0 0 0 250 75 0 0 20 0 1 0 100 0 0\n");
  ASSERT_TRUE(t) << t.error().message();
  EXPECT_EQ(t->tid, 4242);
  EXPECT_EQ(t->name, "my (odd) name");
  EXPECT_EQ(t->state, 'R');
  EXPECT_EQ(t->user, 250u);
  EXPECT_EQ(t->sys, 75u);
  EXPECT_FALSE(parse_task_stat("4242 no comm here"));
  EXPECT_FALSE(parse_task_stat("4242 (x) R 1"));
}

TEST(Sys, BlockDeviceOfAPartitionTakesItsDisksQueue) {
  TempDir dir;
  fs::path sys = dir.path();
  fs::path disk = sys / "devices/virtual/block/vda";
  write(disk / "queue/max_sectors_kb", "1280\n");
  write(disk / "queue/read_ahead_kb", "128\n");
  write(disk / "queue/scheduler", "none [mq-deadline] kyber\n");
  write(disk / "queue/rotational", "0\n");
  write(disk / "vda1/partition", "1\n");
  write(disk / "vda1/stat", "1 0 8 1 0 0 0 0 0 1 1\n");
  fs::create_directories(sys / "dev/block");
  fs::create_symlink(disk / "vda1", sys / "dev/block/254:1");
  ObserveOptions o;
  o.sys_root = sys.string();
  auto b = block_device(makedev(254, 1), o);
  ASSERT_TRUE(b) << b.error().message();
  EXPECT_EQ(b->name, "vda1");
  EXPECT_EQ(b->disk, "vda");
  EXPECT_EQ(b->max_sectors_kb, 1280u);
  EXPECT_EQ(b->read_ahead_kb, 128u);
  EXPECT_EQ(b->scheduler, "mq-deadline");
  auto none = block_device(makedev(0, 35), o);
  ASSERT_FALSE(none);
  EXPECT_EQ(none.error().code(), Code::kNotFound);
  EXPECT_FALSE(block_device(makedev(8, 0), o));
}

TEST(Sys, ReadLimitOfTheCgroupOrAnAncestor) {
  TempDir dir;
  fs::path proc = fs::path(dir.path()) / "proc", cg = fs::path(dir.path()) / "cgroup";
  write(proc / "77/cgroup", "9:name=systemd:/\n7:blkio:/jobs/job1\n1:cpu:/\n0::/jobs/job1\n");
  write(cg / "blkio/jobs/blkio.throttle.read_bps_device", "7:0 20971520\n8:0 1\n");
  write(cg / "blkio/jobs/job1/blkio.throttle.read_bps_device", "");
  ObserveOptions o;
  o.proc_root = proc.string();
  o.cgroup_root = cg.string();
  auto l = read_limit(77, 7, 0, o);
  ASSERT_TRUE(l);
  EXPECT_EQ(l->bytes_per_s, 20971520u);
  EXPECT_EQ(l->cgroup, "/jobs");
  EXPECT_FALSE(read_limit(77, 7, 1, o));
  // cgroup v2 io.max, tighter than the v1 limit.
  write(cg / "unified/jobs/job1/io.max", "7:0 rbps=1048576 wbps=max riops=max wiops=max\n");
  l = read_limit(77, 7, 0, o);
  ASSERT_TRUE(l);
  EXPECT_EQ(l->bytes_per_s, 1048576u);
  EXPECT_EQ(l->file, "io.max");
  EXPECT_FALSE(read_limit(78, 7, 0, o));  // no such process
}

TEST(Observe, ThisProcessReadingAFile) {
  TempDir dir;
  const std::string path = dir.path() + "/data";
  {
    std::ofstream f(path);
    std::string block(1 << 20, 'x');
    for (int i = 0; i < 8; ++i) f << block;
  }
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(fd.valid());
  auto files = open_files(::getpid());
  ASSERT_TRUE(files) << files.error().message();
  bool seen = false;
  for (const auto& f : *files)
    if (f.path == path) {
      seen = true;
      EXPECT_EQ(f.size, 8u << 20);
      EXPECT_FALSE(f.direct);
      EXPECT_FALSE(f.block_device);
    }
  EXPECT_TRUE(seen);
  auto a = snapshot(::getpid(), {});
  ASSERT_TRUE(a);
  std::vector<char> buf(1 << 20);
  for (int i = 0; i < 8; ++i)
    ASSERT_EQ(::pread(fd.get(), buf.data(), buf.size(), i << 20), 1 << 20);
  auto b = snapshot(::getpid(), {});
  ASSERT_TRUE(b);
  auto j = job_activity(*a, *b, ::sysconf(_SC_CLK_TCK));
  EXPECT_GE(j.rchar_s * j.seconds, 8.0 * (1 << 20));
  EXPECT_GE(j.avg_call_bytes, 64 << 10);  // our own reads of /proc count too
  EXPECT_FALSE(j.threads.empty());
  auto gone = observe(999999999, 0.1);
  ASSERT_FALSE(gone);
  EXPECT_EQ(gone.error().code(), Code::kNotFound);
}

TEST(Rates, DeviceActivityIsIostat) {
  DiskCounters a, b;
  b.reads = 1000;
  b.read_sectors = 1000 * 8;  // 4 KiB each
  b.read_ms = 500;
  b.io_ms = 1000;
  b.queue_ms = 1000;
  b.read_merges = 1000;
  auto d = device_activity(BlockDevice{}, a, b, 2.0);
  EXPECT_DOUBLE_EQ(d.read_iops, 500);
  EXPECT_DOUBLE_EQ(d.avg_read_bytes, 4096);
  EXPECT_DOUBLE_EQ(d.read_await_ms, 0.5);
  EXPECT_DOUBLE_EQ(d.in_flight, 0.5);
  EXPECT_DOUBLE_EQ(d.utilisation, 0.5);
  EXPECT_DOUBLE_EQ(d.read_merged, 0.5);
}

// A ceiling like a fast NVMe: 4 KiB at QD1 is latency-bound, 1 MiB at QD16 the best.
Ceiling nvme() {
  Ceiling c;
  c.target = "/dev/nvme0n1";
  const double MiB = 1 << 20;
  struct {
    uint64_t bs;
    unsigned qd;
    double mib_s;
  } grid[] = {{4096, 1, 80},      {4096, 4, 300},     {4096, 16, 900},     {4096, 64, 1500},
              {65536, 1, 600},    {65536, 4, 1800},   {65536, 16, 2900},   {65536, 64, 3000},
              {1 << 20, 1, 1500}, {1 << 20, 4, 2800}, {1 << 20, 16, 3100}, {1 << 20, 64, 3100}};
  for (auto g : grid) c.points.push_back({"uring", g.bs, g.qd, g.mib_s * MiB, 0, 0});
  c.points.push_back({"buffered", 1 << 20, 1, 700 * MiB, 0, 0});
  return c;
}

Observation reader(double read_mib_s, double req_bytes, double in_flight) {
  Observation ob;
  ob.pid = 1234;
  ob.command = "reader";
  ob.job.seconds = 5;
  ob.job.read_bytes_s = read_mib_s * (1 << 20);
  ob.job.rchar_s = ob.job.read_bytes_s;
  ob.job.avg_call_bytes = req_bytes;
  ob.job.read_calls_s = ob.job.read_bytes_s / req_bytes;
  ob.job.threads.push_back({1234, "reader", 0.3, 0.05, 0.25});
  DeviceActivity d;
  d.device.name = d.device.disk = "nvme0n1";
  d.device.major = 259;
  d.device.max_sectors_kb = 1280;
  d.read_bytes_s = ob.job.read_bytes_s;
  d.avg_read_bytes = req_bytes;
  d.read_iops = d.read_bytes_s / req_bytes;
  d.in_flight = in_flight;
  d.utilisation = std::min(1.0, in_flight);
  ob.device = d;
  OpenFile f;
  f.path = "/data/shard";
  f.dev = makedev(259, 0);
  f.size = uint64_t{4} << 30;
  f.direct = true;
  f.extents = 3;
  ob.files.push_back(f);
  return ob;
}

std::string top(const Diagnosis& d) {
  return d.causes.empty() ? "" : d.causes.front().id;
}

bool has(const Diagnosis& d, const std::string& id) {
  for (const auto& c : d.causes)
    if (c.id == id) return true;
  return false;
}

TEST(Rules, OneSmallReadAtATime) {
  auto d = diagnose(reader(80, 4096, 1.0), nvme());
  EXPECT_TRUE(top(d) == "request-size" || top(d) == "queue-depth") << top(d);
  EXPECT_TRUE(has(d, "request-size"));
  EXPECT_TRUE(has(d, "queue-depth"));
  EXPECT_GT(d.causes.front().gain, 10);
}

TEST(Rules, LargeRequestsOneAtATimeNameTheQueueDepth) {
  auto d = diagnose(reader(1500, 1 << 20, 1.0), nvme());
  EXPECT_EQ(top(d), "queue-depth");
  EXPECT_FALSE(has(d, "request-size"));
}

TEST(Rules, AtTheCeilingNothingToFix) {
  auto d = diagnose(reader(3000, 1 << 20, 16), nvme());
  ASSERT_EQ(d.causes.size(), 1u);
  EXPECT_EQ(top(d), "healthy");
}

TEST(Rules, BufferedColdReads) {
  auto ob = reader(600, 128 << 10, 1.5);
  ob.files[0].direct = false;
  ob.job.avg_call_bytes = 1 << 20;
  auto d = diagnose(ob, nvme());
  EXPECT_EQ(top(d), "buffered");
  ob.files[0].direct_ok = false;  // tmpfs-like: O_DIRECT is refused
  EXPECT_EQ(top(diagnose(ob, nvme())), "no-direct");
}

TEST(Rules, ReadaheadThrownAway) {
  auto ob = reader(600, 128 << 10, 1.5);
  ob.files[0].direct = false;
  ob.job.rchar_s = 100 << 20;
  ob.job.avg_call_bytes = 4096;
  EXPECT_TRUE(has(diagnose(ob, nvme()), "page-cache-thrash"));
}

TEST(Rules, ASpinningThreadComesBeforeItsQueueDepth) {
  auto ob = reader(300, 1 << 20, 0.2);
  ob.job.threads[0] = {1234, "reader", 0.99, 0.9, 0.09};
  EXPECT_EQ(top(diagnose(ob, nvme())), "cpu-bound");
  // Busy in the kernel, not in its own code: not cpu-bound.
  ob.job.threads[0] = {1234, "reader", 0.99, 0.1, 0.89};
  EXPECT_NE(top(diagnose(ob, nvme())), "cpu-bound");
}

TEST(Rules, ThrottledByTheCgroup) {
  auto ob = reader(20, 1 << 20, 0.3);
  ob.limit = ReadLimit{"/jobs/a", "blkio.throttle.read_bps_device", 20 << 20, 0};
  auto d = diagnose(ob, nvme());
  EXPECT_EQ(top(d), "throttled");
  EXPECT_NE(d.causes.front().evidence.find("/jobs/a"), std::string::npos);
}

TEST(Rules, ANoisyNeighbour) {
  auto ob = reader(200, 1 << 20, 30);
  ob.device->read_bytes_s = 3000.0 * (1 << 20);
  ob.device->utilisation = 1.0;
  auto d = diagnose(ob, nvme());
  EXPECT_EQ(top(d), "shared-device");
  EXPECT_FALSE(has(d, "queue-depth"));  // the device's queue is the neighbour's, not ours
}

TEST(Rules, AFragmentedFileCutsLargeReads) {
  auto ob = reader(200, 4096, 8);
  ob.job.avg_call_bytes = 1 << 20;  // the job asks for 1 MiB, the device sees 4 KiB
  ob.files[0].extents = 100000;
  ob.files[0].size = uint64_t{400} << 20;
  auto d = diagnose(ob, nvme());
  EXPECT_EQ(top(d), "fragmented");
  ob.files[0].extents = 3;  // not fragmented: the requests are split somewhere else
  EXPECT_EQ(top(diagnose(ob, nvme())), "split-requests");
}

TEST(Rules, IdleAndNoCeiling) {
  auto ob = reader(0, 4096, 0);
  ob.job.rchar_s = 0;
  EXPECT_EQ(top(diagnose(ob, nvme())), "idle");
  auto d = diagnose(reader(80, 4096, 1.0), std::nullopt);
  EXPECT_TRUE(has(d, "queue-depth"));
}

TEST(CeilingJson, RoundTripsAndRejectsNonsense) {
  auto c = nvme();
  auto back = Ceiling::from_json(c.json());
  ASSERT_TRUE(back) << back.error().message();
  EXPECT_EQ(back->points.size(), c.points.size());
  EXPECT_EQ(back->best()->bytes_s, c.best()->bytes_s);
  EXPECT_EQ(back->knee()->qd, 4u);  // 2.8 of 3.1 GiB/s: within 10% of the best
  auto wrapped = Ceiling::from_json("{\"ceiling\": " + c.json() + ", \"gpu\": {}}");
  ASSERT_TRUE(wrapped);
  for (const char* bad :
       {"", "[]", "{}", "{\"points\": []}", "{\"points\": [{\"engine\": 1}]}",
        "{\"points\": [{\"engine\":\"uring\",\"bs\":0,\"qd\":1,\"bytes_s\":1}]}",
        // Found by fuzzing (fuzz/doctor_fuzz): a float too large for the integer it is read
        // into was converted anyway (undefined behaviour), and a qd over 32 bits wrapped.
        "{\"points\": [{\"engine\":\"uring\",\"bs\":1e30,\"qd\":1,\"bytes_s\":1}]}",
        "{\"points\": [{\"engine\":\"uring\",\"bs\":4096,\"qd\":-1.5,\"bytes_s\":1}]}",
        "{\"points\": [{\"engine\":\"uring\",\"bs\":4096,\"qd\":4294967297,\"bytes_s\":1}]}"}) {
    auto r = Ceiling::from_json(bad);
    EXPECT_FALSE(r) << bad;
  }
  auto text = ceiling_text(c);
  EXPECT_NE(text.find("QD16"), std::string::npos);
  EXPECT_NE(text.find("latency-bound"), std::string::npos);
}

StoreProbe probe(std::vector<StoreLevel> levels, uint64_t throttled = 0) {
  StoreProbe p;
  p.uri = "s3://b/p/";
  p.small_size = 4096;
  p.big_size = 64 << 20;
  p.latency_p50_ms = 20;
  p.latency_p90_ms = 40;
  p.levels = std::move(levels);
  p.requests = 1000;
  p.throttled = throttled;
  return p;
}

std::vector<std::string> ids(const std::vector<Cause>& cs) {
  std::vector<std::string> out;
  for (const auto& c : cs) out.push_back(c.id);
  return out;
}

TEST(StoreRules, LatencyBoundSmallReadsAndTheConcurrencyTheyNeed) {
  const double MiB = 1 << 20;
  auto cs = diagnose_store(
      probe({{1, 50, 80 * MiB}, {4, 190, 300 * MiB}, {16, 700, 900 * MiB}, {32, 1300, 1500 * MiB}}),
      4000 * MiB);
  auto got = ids(cs);
  ASSERT_FALSE(got.empty());
  EXPECT_EQ(got.front(), "latency-bound");  // 26x at 32 in flight
  EXPECT_NE(std::find(got.begin(), got.end(), "queue-depth"), got.end());
  // Little's law: 1,300 GETs/s x 20 ms = 26 in flight.
  EXPECT_NE(cs.front().advice.find("26"), std::string::npos) << cs.front().advice;
  auto target = std::find_if(cs.begin(), cs.end(), [](const Cause& c) { return c.id == "target"; });
  ASSERT_NE(target, cs.end());
  EXPECT_NE(target->advice.find("beyond"), std::string::npos);  // 4,000 MiB/s was never reached
}

TEST(StoreRules, SlowDownComesFirstAndAFlatCurveIsTheStore) {
  const double MiB = 1 << 20;
  auto cs = diagnose_store(probe({{1, 500, 300 * MiB}, {4, 520, 310 * MiB}}, 12));
  auto got = ids(cs);
  ASSERT_GE(got.size(), 2u);
  EXPECT_EQ(got[0], "throttled");
  EXPECT_EQ(got[1], "store-ceiling");
  EXPECT_EQ(ids(diagnose_store(probe({{1, 500, 300 * MiB}}))), std::vector<std::string>{"healthy"});
}

TEST(StoreProbeTest, ReadsAMemoryStoreAndRefusesAnEmptyOne) {
  auto st = store::open_store("mem://doctor-probe").value();
  for (int i = 0; i < 4; ++i) {
    auto w = st->create("s" + std::to_string(i)).value();
    std::vector<std::byte> b(1000, std::byte{1});
    ASSERT_TRUE(w->append(b));
    ASSERT_TRUE(w->commit());
  }
  auto w = st->create("big").value();
  std::vector<std::byte> big(3 << 20, std::byte{2});
  ASSERT_TRUE(w->append(big));
  ASSERT_TRUE(w->commit());
  StoreProbeOptions o;
  o.seconds = 0.5;
  o.concurrency = {1, 2};
  o.range_bytes = 1 << 20;
  auto p = probe_store(*st, o);
  ASSERT_TRUE(p) << p.error().message();
  EXPECT_EQ(p->small_size, 1000u);
  EXPECT_EQ(p->big_key, "big");
  ASSERT_EQ(p->levels.size(), 2u);
  EXPECT_GT(p->levels[0].small_gets_s, 0);
  EXPECT_GT(p->levels[1].bytes_s, 0);
  EXPECT_EQ(p->errors, 0u);
  auto empty = store::open_store("mem://doctor-empty").value();
  auto none = probe_store(*empty, o);
  ASSERT_FALSE(none);
  EXPECT_EQ(none.error().code(), Code::kNotFound);
  std::atomic<bool> stop{true};
  o.cancel = &stop;
  auto cancelled = probe_store(*st, o);
  ASSERT_FALSE(cancelled);
  EXPECT_EQ(cancelled.error().code(), Code::kCancelled);
}

}  // namespace
}  // namespace sluice::doctor
