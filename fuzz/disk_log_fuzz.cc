// The NVMe tier's index log as DiskTier::open replays it (docs/formats/cache-index.md): a
// cache directory whose DIR/index.log is the input, opened, read, written to and opened
// again. The input's first byte picks what the harness makes right or adds around the log:
//   bit 0  the 24-byte header made valid (magic, version 1, chunk size 64 KiB, XXH3)
//   bit 1  each record's trailing XXH3 made right (walking the records by their lengths)
//   bit 2  the segment file of each add record made, long enough for its chunk
//   bit 3  ... one page short (the record must be dropped)
//   bit 4  with bit 1, each add record's chunk XXH3 set to that of its bytes (zeros): reads
//          succeed
//   bit 5  debris in chunks/: an unnamed segment, a file of the old layout, a symlink
// the rest is the log. Each input gets a directory of its own under /dev/shm, removed after.
// Beyond "no crash": every chunk restored is found under its key; chunks written after the
// open never take a segment number the log named or a file in chunks/ holds, and none is
// left half-placed; and opening the directory again restores the same chunks, dropping
// none and cutting no tail.
#include <sys/stat.h>
#include <unistd.h>

#include <cinttypes>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <set>

#include "cache/chunk.h"
#include "cache/disk_tier.h"
#include "fuzz_util.h"
#include "sluice/io/file_handle.h"
#include "sluice/store/store.h"

using namespace sluice;
namespace fs = std::filesystem;

namespace {

constexpr uint64_t kChunkSize = 64 << 10;
constexpr size_t kMaxInput = 64 << 10;
constexpr size_t kMaxSegments = 64;            // segment files one input may make
constexpr uint64_t kMaxReadBytes = 256 << 10;  // chunks read back (and hashed) at most this long

std::shared_ptr<io::Context> io_context() {
  static const std::shared_ptr<io::Context> ctx = [] {
    auto c = io::Context::open({});
    if (!c) {
      std::fprintf(stderr, "disk_log_fuzz: %s\n", c.error().to_string().c_str());
      std::abort();
    }
    return *c;
  }();
  return ctx;
}

uint64_t le(const std::byte* p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= uint64_t(std::to_integer<uint8_t>(p[i])) << (8 * i);
  return v;
}
void put_le(std::byte* p, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) p[i] = std::byte(v >> (8 * i));
}

std::string segment_path(const std::string& dir, uint64_t seg) {
  char name[48];
  std::snprintf(name, sizeof name, "/chunks/%02" PRIx64 "/%016" PRIx64 ".seg", (seg >> 8) & 0xff,
                seg);
  return dir + name;
}

struct AddRecord {
  uint64_t file_id = 0, length = 0;
  bool valid = false;  // what replay restores (docs/formats/cache-index.md, "Add payload")
};

// Whether an add payload is one replay takes: its fields all there, a segment, a length of
// 1 B to 1 GiB, a valid key, an etag, an index within the object.
bool valid_add(std::span<const std::byte> p) {
  if (p.size() < 48) return false;
  const uint64_t file_id = le(&p[0], 8), index = le(&p[8], 8), length = le(&p[16], 8),
                 object_size = le(&p[32], 8);
  size_t pos = 48;
  std::string strings[3];  // store id, key, etag
  const size_t most[3] = {2048, 1024, 1024};
  for (int i = 0; i < 3; ++i) {
    if (p.size() - pos < 2) return false;
    const size_t n = le(&p[pos], 2);
    if (n > most[i] || p.size() - pos - 2 < n) return false;
    strings[i].assign(reinterpret_cast<const char*>(&p[pos + 2]), n);
    pos += 2 + n;
  }
  return pos == p.size() && (file_id >> 16) != 0 && length > 0 && length <= (1ull << 30) &&
         store::validate_key(strings[1]).has_value() && !strings[2].empty() &&
         index <= object_size / length;
}

// Walks the records as replay does (length, type, payload, XXH3, up to the first that fails
// its XXH3); fixes each one's XXH3 (and with it, its chunk's XXH3) when asked, and returns
// the add records.
std::vector<AddRecord> walk(std::vector<std::byte>& log, bool fix_sums, bool fix_chunk_sums) {
  std::vector<AddRecord> adds;
  for (size_t pos = 24; pos + 16 <= log.size();) {
    const uint64_t len = le(&log[pos], 4), type = le(&log[pos + 4], 4);
    if (len > 8192 || log.size() - pos < 16 + len) break;
    if (!fix_sums && le(&log[pos + 8 + len], 8) != cache::checksum({&log[pos], 8 + len}))
      break;  // where replay stops too: a torn append
    std::span<std::byte> payload(&log[pos + 8], len);
    if (type == 1 && len >= 48) {
      AddRecord a{le(&payload[0], 8), le(&payload[16], 8), valid_add(payload)};
      if (fix_sums && fix_chunk_sums && a.length > 0 && a.length <= kMaxReadBytes) {
        std::vector<std::byte> zeros(a.length);
        put_le(&payload[24], cache::checksum(zeros), 8);
      }
      adds.push_back(a);
    }
    if (fix_sums) put_le(&log[pos + 8 + len], cache::checksum({&log[pos], 8 + len}), 8);
    pos += 16 + len;
  }
  return adds;
}

void write_file(const std::string& path, std::span<const std::byte> bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return;
  (void)std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
}

void make_segment(const std::string& dir, uint64_t seg, uint64_t size) {
  const std::string p = segment_path(dir, seg);
  std::error_code ec;
  fs::create_directories(fs::path(p).parent_path(), ec);
  write_file(p, {});
  (void)::truncate(p.c_str(), static_cast<off_t>(size));  // sparse: zeros
}

cache::DiskTier::Options options(const std::string& dir) {
  cache::DiskTier::Options o;
  o.directory = dir;
  // Records may name up to 1 GiB each: some are evicted for room as they are restored (the
  // policy's sketch grows with the capacity, and is made twice per input).
  o.capacity = uint64_t{16} << 30;
  o.chunk_size = kChunkSize;
  o.io = io_context();
  return o;
}

std::map<uint64_t, cache::ChunkKey> chunks_of(cache::DiskTier& t) {
  std::map<uint64_t, cache::ChunkKey> out;
  for (const cache::DiskTier::Entry& e : t.entries()) out.emplace(e.file_id, e.key);
  return out;
}

void run(const std::string& dir, uint8_t flags, std::span<const uint8_t> input) {
  std::vector<std::byte> log(reinterpret_cast<const std::byte*>(input.data()),
                             reinterpret_cast<const std::byte*>(input.data()) + input.size());
  if ((flags & 1) && log.size() >= 24) {
    std::memcpy(log.data(), "SLUCIDX1", 8);
    put_le(&log[8], 1, 4);
    put_le(&log[12], kChunkSize, 4);
    put_le(&log[16], cache::checksum({log.data(), 16}), 8);
  }
  const std::vector<AddRecord> adds = walk(log, flags & 2, flags & 16);
  std::error_code ec;
  fs::create_directories(dir + "/chunks", ec);
  write_file(dir + "/index.log", log);
  std::set<uint64_t> named;  // every segment a valid add record names, removed since or not
  for (const AddRecord& a : adds)
    if (a.valid) named.insert(a.file_id >> 16);
  if (flags & 4) {
    std::map<uint64_t, uint64_t> sizes;  // segment -> bytes its records need
    for (const AddRecord& a : adds) {
      const uint64_t end = (a.file_id & 0xffff) * 4096 + std::min<uint64_t>(a.length, 1ull << 30);
      uint64_t& s = sizes[a.file_id >> 16];
      s = std::max(s, end);
    }
    size_t made = 0;
    for (const auto& [seg, size] : sizes) {
      if (seg == 0 || ++made > kMaxSegments) continue;
      make_segment(dir, seg, (flags & 8) && size >= 4096 ? size - 4096 : size);
    }
  }
  if (flags & 32) {
    make_segment(dir, 0x777, 8192);                  // a segment no record names
    fs::create_directories(dir + "/chunks/ab", ec);  // a chunk file of the old layout
    write_file(dir + "/chunks/ab/00000000000000ab", {});
    fs::create_symlink("/dev/null", segment_path(dir, 0x778), ec);
  }
  // What is on disk before the open: no new segment may take any of these names either.
  std::set<uint64_t> on_disk = named;
  for (auto it = fs::recursive_directory_iterator(dir + "/chunks", ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() == 20 && name.ends_with(".seg"))
      on_disk.insert(std::strtoull(name.substr(0, 16).c_str(), nullptr, 16));
  }

  (void)cache::DiskTier::recorded_chunk_size(dir);
  auto tier = cache::DiskTier::open(options(dir));
  if (!tier) return;
  cache::DiskTier& t = **tier;
  const auto report = t.open_report();
  const std::vector<cache::DiskTier::Entry> restored = t.entries();
  SLUICE_FUZZ_CHECK(restored.size() <= report.restored,
                    "the report counts the chunks restored (some evicted for room since)");
  int reads = 0;
  for (const cache::DiskTier::Entry& e : restored) {
    auto found = t.find(e.key);
    SLUICE_FUZZ_CHECK(found && found->file_id == e.file_id, "a restored chunk is found by its key");
    SLUICE_FUZZ_CHECK(named.contains(e.file_id >> 16), "a restored chunk lies where a record said");
    if (e.length <= kMaxReadBytes && ++reads <= 8) {
      std::vector<std::byte> buf(e.length);
      (void)t.read(e, buf);  // zeros: matches only where bit 4 set the chunk's XXH3
    }
  }
  // New chunks after the open: segments of their own, never one the log or the disk named,
  // and none left half-placed in the index.
  alignas(4096) static std::byte block[4096];  // chunks are written 4 KiB-aligned
  std::memset(block, 7, sizeof block);
  const std::span<const std::byte> bytes(block, sizeof block);
  for (const char* key : {"fresh/object-1", "fresh/object-2"}) {
    cache::ChunkKey k{"fuzz://store", key, "\"etag\"", 0};
    cache::ChunkView view{k, bytes, cache::checksum(bytes), bytes.size(), 0};
    if (auto w = t.write(view, false); w && *w) {
      auto e = t.find(k);
      SLUICE_FUZZ_CHECK(e.has_value(), "a chunk written is found");
      SLUICE_FUZZ_CHECK((e->file_id >> 16) != 0 && !on_disk.contains(e->file_id >> 16),
                        "a new chunk never takes a segment the log or the disk named");
      on_disk.insert(e->file_id >> 16);
    }
  }
  SLUICE_FUZZ_CHECK(t.chunk_count() == t.entries().size(), "no chunk is left half-placed");
  const auto before = chunks_of(t);
  tier->reset();
  auto again = cache::DiskTier::open(options(dir));
  SLUICE_FUZZ_CHECK(again.has_value(), "a directory the tier opened opens again");
  SLUICE_FUZZ_CHECK((*again)->open_report().dropped == 0 && !(*again)->open_report().truncated_tail,
                    "a compacted log replays whole");
  SLUICE_FUZZ_CHECK(chunks_of(**again) == before, "a reopen restores the same chunks");
}

std::string* root_ = nullptr;  // this process's directories: /dev/shm/sluice-fuzz-disk-PID/N

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  root_ = new std::string("/dev/shm/sluice-fuzz-disk-" + std::to_string(::getpid()));
  std::error_code ec;
  fs::remove_all(*root_, ec);
  std::atexit([] {
    std::error_code ec;
    fs::remove_all(*root_, ec);
  });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1 || size > kMaxInput) return -1;
  static uint64_t n = 0;
  const std::string dir = *root_ + "/" + std::to_string(n++);
  std::error_code ec;
  fs::remove_all(dir, ec);
  run(dir, data[0], {data + 1, size - 1});
  fs::remove_all(dir, ec);
  return 0;
}
