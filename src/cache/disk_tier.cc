#include "cache/disk_tier.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>
#include <unordered_set>

#include "sluice/io/file_handle.h"
#include "sluice/store/store.h"

namespace sluice::cache {

namespace {

constexpr char kMagic[8] = {'S', 'L', 'U', 'C', 'I', 'D', 'X', '1'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderSize = 24;    // magic, version, reserved, xxh3 of the first 16
constexpr size_t kMaxPayload = 8192;  // store ids 2048 bytes, keys and etags 1024 at most
constexpr uint64_t kMaxChunk = 1ULL << 30;
constexpr uint32_t kAdd = 1, kRemove = 2;
constexpr uint64_t kPage = 4096;
constexpr unsigned kPageBits = 16;                            // a file id: segment << 16 | page
constexpr uint64_t kSegmentPages = uint64_t{1} << kPageBits;  // 256 MiB of pages a segment
// Segment numbers a record or a file name may carry: below half of what a file id holds, so
// new segments, numbered above every one the log and the directory name, never run out of
// numbers (segment << 16 wrapping to 0, then to the numbers of live segments).
constexpr uint64_t kMaxSegment = uint64_t{1} << (63 - kPageBits);

uint64_t segment_of(uint64_t file_id) {
  return file_id >> kPageBits;
}

// Names the object version a chunk belongs to (and the lane it is written in): the chunks
// of one version written in one lane share segments.
std::string object_of(const ChunkKey& k, uint64_t lane) {
  // Length-prefixed: keys and etags may hold any byte, and two objects must never share.
  std::string s;
  for (const std::string* f : {&k.store, &k.key, &k.etag})
    s += std::to_string(f->size()) + ':' + *f;
  return s + std::to_string(lane);
}

uint64_t on_disk(uint64_t length) {
  return (length + 4095) & ~uint64_t{4095};
}

// Little-endian encoding, whatever the host.
void put(std::vector<std::byte>& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<std::byte>(v >> (8 * i)));
}
void put_str(std::vector<std::byte>& out, const std::string& s) {
  put(out, s.size(), 2);
  for (char c : s) out.push_back(static_cast<std::byte>(c));
}

class Reader {
 public:
  explicit Reader(std::span<const std::byte> b) : b_(b) {}
  bool get(uint64_t& v, int bytes) {
    if (b_.size() - pos_ < static_cast<size_t>(bytes)) return false;
    v = 0;
    for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(b_[pos_ + i]) << (8 * i);
    pos_ += bytes;
    return true;
  }
  bool get_str(std::string& s, size_t max) {
    uint64_t n;
    if (!get(n, 2) || n > max || b_.size() - pos_ < n) return false;
    s.assign(reinterpret_cast<const char*>(b_.data() + pos_), n);
    pos_ += n;
    return true;
  }
  bool done() const { return pos_ == b_.size(); }

 private:
  std::span<const std::byte> b_;
  size_t pos_ = 0;
};

// The chunk size is part of the header: chunk N of an object means different bytes at
// another size, and a record's length alone cannot always tell.
std::vector<std::byte> header(uint64_t chunk_size) {
  std::vector<std::byte> h;
  for (char c : kMagic) h.push_back(static_cast<std::byte>(c));
  put(h, kVersion, 4);
  put(h, chunk_size, 4);
  put(h, checksum(h), 8);
  return h;
}

// A record: u32 payload length, u32 type, payload, u64 XXH3 of everything before it.
std::vector<std::byte> record(uint32_t type, const std::vector<std::byte>& payload) {
  std::vector<std::byte> r;
  put(r, payload.size(), 4);
  put(r, type, 4);
  r.insert(r.end(), payload.begin(), payload.end());
  put(r, checksum(r), 8);
  return r;
}

std::vector<std::byte> add_payload(const DiskTier::Entry& e) {
  std::vector<std::byte> p;
  put(p, e.file_id, 8);
  put(p, e.key.index, 8);
  put(p, e.length, 8);
  put(p, e.xxh3, 8);
  put(p, e.object_size, 8);
  put(p, static_cast<uint64_t>(e.object_mtime_ns), 8);
  put_str(p, e.key.store);
  put_str(p, e.key.key);
  put_str(p, e.key.etag);
  return p;
}

// The longest store id, key and etag a record may name: replay refuses longer ones (and
// keys that break store::validate_key), so a chunk naming one is never written to NVMe: it
// would be dropped at the next start.
constexpr size_t kMaxStoreId = 2048, kMaxKey = 1024, kMaxEtag = 1024;

bool parse_add(std::span<const std::byte> payload, DiskTier::Entry& e) {
  Reader r(payload);
  uint64_t mtime = 0;
  bool ok = r.get(e.file_id, 8) && r.get(e.key.index, 8) && r.get(e.length, 8) &&
            r.get(e.xxh3, 8) && r.get(e.object_size, 8) && r.get(mtime, 8) &&
            r.get_str(e.key.store, kMaxStoreId) && r.get_str(e.key.key, kMaxKey) &&
            r.get_str(e.key.etag, kMaxEtag) && r.done();
  e.object_mtime_ns = static_cast<int64_t>(mtime);
  // Every field is untrusted: a record that parses but names nonsense is dropped too.
  return ok && segment_of(e.file_id) != 0 && segment_of(e.file_id) < kMaxSegment && e.length > 0 &&
         e.length <= kMaxChunk && store::validate_key(e.key.key).has_value() &&
         !e.key.etag.empty() && e.key.index <= e.object_size / e.length;
}

}  // namespace

DiskTier::DiskTier(Options options)
    : options_(std::move(options)), policy_(make_policy(options_.policy, options_.capacity)) {}

DiskTier::~DiskTier() = default;

std::string DiskTier::path_of(uint64_t file_id) const {
  const uint64_t seg = segment_of(file_id);
  char name[48];
  // Consecutive segments share a fan-out directory: a fresh cache makes one per 256.
  std::snprintf(name, sizeof name, "/chunks/%02" PRIx64 "/%016" PRIx64 ".seg", (seg >> 8) & 0xff,
                seg);
  return options_.directory + name;
}

uint64_t DiskTier::offset_of(uint64_t file_id) {
  return (file_id & (kSegmentPages - 1)) * kPage;
}

// Whether the file system under `dir` frees a punched range (ext4, xfs, btrfs and tmpfs do).
static bool can_punch_holes(const std::string& dir) {
  std::string probe = dir + "/.punch-probe-" + std::to_string(::getpid());
  UniqueFd fd(::open(probe.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  if (!fd.valid()) return false;
  bool ok = ::ftruncate(fd.get(), 2 * kPage) == 0 &&
            ::fallocate(fd.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, kPage) == 0;
  ::unlink(probe.c_str());
  return ok;
}

void DiskTier::free_pages(const std::string& path, uint64_t offset, uint64_t length) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
  // Best effort: the bytes are unreachable either way; a failure only delays their space
  // until the segment goes.
  if (fd.valid()) {
    (void)::fallocate(fd.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                      static_cast<off_t>(offset), static_cast<off_t>(length));
  }
}

Result<std::unique_ptr<DiskTier>> DiskTier::open(Options options) {
  if (!options.io) return fail(Code::kInvalidArgument, "cache: no I/O context for the NVMe tier");
  std::error_code ec;
  std::filesystem::create_directories(options.directory + "/chunks", ec);
  if (ec) {
    return fail_errno(ec.value(), "create cache directory " + options.directory);
  }
  std::unique_ptr<DiskTier> t(new DiskTier(std::move(options)));
  SLUICE_RETURN_IF_ERROR(t->lock_directory());
  t->punch_holes_ = can_punch_holes(t->options_.directory + "/chunks");
  SLUICE_RETURN_IF_ERROR(t->replay());
  SLUICE_RETURN_IF_ERROR(t->open_log_for_append());
  return t;
}

Status DiskTier::lock_directory() {
  std::string path = options_.directory + "/LOCK";
  lock_fd_.reset(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (!lock_fd_.valid()) return fail_errno(errno, "open " + path);
  struct flock fl {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  if (::fcntl(lock_fd_.get(), F_OFD_SETLK, &fl) != 0) {
    int err = errno;
    if (err != EAGAIN && err != EACCES) return fail_errno(err, "lock " + path);
    char buf[32] = {};
    (void)pread_full(lock_fd_.get(), std::as_writable_bytes(std::span(buf, sizeof buf - 1)), 0,
                     path);
    return fail(Code::kUnavailable,
                "cache directory " + options_.directory + " is in use by another process (pid " +
                    std::string(buf, strnlen(buf, sizeof buf)) +
                    "): share it through sluiced, or give this process its own cache directory");
  }
  std::string pid = std::to_string(::getpid());
  if (::ftruncate(lock_fd_.get(), 0) != 0) return fail_errno(errno, "truncate " + path);
  return pwrite_full(lock_fd_.get(), std::as_bytes(std::span(pid)), 0, path);
}

// Why a header is not this cache's: another chunk size (InvalidArgument, which size), or
// not an index of this version at all (Corruption).
Status DiskTier::explain_header(std::span<const std::byte> head, const std::string& path) const {
  Reader r{head.subspan(8, 8)};
  uint64_t version = 0, size = 0;
  (void)r.get(version, 4);
  (void)r.get(size, 4);
  std::vector<std::byte> theirs = header(size);
  if (version == kVersion && std::equal(theirs.begin(), theirs.end(), head.begin())) {
    return fail(Code::kInvalidArgument,
                options_.directory + " holds chunks of " + std::to_string(size) + " bytes, not " +
                    std::to_string(options_.chunk_size) +
                    ": give that chunk size (--chunk-size), or use another cache directory");
  }
  return fail(Code::kCorruption, path + ": not a sluice cache index of version " +
                                     std::to_string(kVersion) +
                                     " (bad header); move the cache directory away");
}

Result<std::optional<uint64_t>> DiskTier::recorded_chunk_size(const std::string& directory) {
  const std::string path = directory + "/index.log";
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) {
    if (errno == ENOENT) return std::optional<uint64_t>();
    return fail_errno(errno, "open " + path);
  }
  std::vector<std::byte> head(kHeaderSize);
  SLUICE_ASSIGN_OR_RETURN(size_t got, pread_full(fd.get(), head, 0, path));
  if (got < kHeaderSize) return std::optional<uint64_t>();  // a first write cut short
  Reader r{std::span<const std::byte>(head).subspan(12, 4)};
  uint64_t size = 0;
  (void)r.get(size, 4);
  // A header that is not this version's says so when the tier opens.
  if (head != header(size)) return std::optional<uint64_t>();
  return std::optional<uint64_t>(size);
}

Result<DiskTier::LogReplay> DiskTier::read_log() {
  std::string path = options_.directory + "/index.log";
  std::vector<std::byte> log;
  {
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid() && errno != ENOENT) return fail_errno(errno, "open " + path);
    if (fd.valid()) {
      struct stat st;
      if (::fstat(fd.get(), &st) != 0) return fail_errno(errno, "stat " + path);
      // Read whole, so checked first: the header, then a bound (a compacted index of 10
      // million chunks is about 1.5 GiB). Anything else is not an index.
      constexpr uint64_t kMaxLog = 4ULL << 30;
      std::vector<std::byte> head(kHeaderSize);
      SLUICE_ASSIGN_OR_RETURN(size_t got, pread_full(fd.get(), head, 0, path));
      if (got == kHeaderSize && head != header(options_.chunk_size)) {
        SLUICE_RETURN_IF_ERROR(explain_header(head, path));
      }
      if (static_cast<uint64_t>(st.st_size) > kMaxLog) {
        return fail(Code::kCorruption, path + " is " + std::to_string(st.st_size) +
                                           " bytes, larger than any cache index; move the "
                                           "cache directory away");
      }
      log.resize(static_cast<size_t>(st.st_size));
      SLUICE_ASSIGN_OR_RETURN(size_t n, pread_full(fd.get(), log, 0, path));
      log.resize(n);
    }
  }
  LogReplay out;
  auto& live = out.live;
  auto& order = out.order;
  uint64_t& log_max_id = out.max_id;  // no new segment may take a number the log named
  size_t good_end = 0;
  uint64_t records = 0;
  std::vector<std::byte> want = header(options_.chunk_size);
  // Shorter than a header: a first write cut short is a prefix of one; anything else is
  // someone else's file, and is not overwritten.
  bool torn_header = log.size() < kHeaderSize && std::equal(log.begin(), log.end(), want.begin());
  if (!log.empty() && !torn_header) {
    if (log.size() < kHeaderSize || !std::equal(want.begin(), want.end(), log.begin())) {
      return fail(Code::kCorruption, path + ": not a sluice cache index of version " +
                                         std::to_string(kVersion) +
                                         " (bad header); move the cache directory away");
    }
    size_t pos = kHeaderSize;
    good_end = pos;
    while (log.size() - pos >= 16) {
      Reader r{std::span<const std::byte>(log).subspan(pos, 8)};
      uint64_t len = 0, type = 0, sum = 0;
      (void)r.get(len, 4);
      (void)r.get(type, 4);
      if (len > kMaxPayload || log.size() - pos < 16 + len) break;
      Reader s{std::span<const std::byte>(log).subspan(pos + 8 + len, 8)};
      (void)s.get(sum, 8);
      if (checksum(std::span<const std::byte>(log).subspan(pos, 8 + len)) != sum) break;
      auto payload = std::span<const std::byte>(log).subspan(pos + 8, len);
      Entry e;
      if (type == kAdd && parse_add(payload, e)) {
        order.push_back(e.file_id);  // an id added again after a remove comes twice
        e.ready = true;
        live[e.file_id] = e;
        log_max_id = std::max(log_max_id, e.file_id);
      } else if (type == kRemove) {
        Reader p(payload);
        uint64_t id = 0;
        if (p.get(id, 8)) live.erase(id);
      }
      ++records;
      pos += 16 + len;
      good_end = pos;
    }
  }
  {
    MutexLock lock(log_mu_);
    log_records_ += records;
  }
  open_report_.truncated_tail = log.size() > good_end && good_end > 0;
  return out;
}

// Segment files on disk: those a live record names stay (with their sizes); the rest go.
std::unordered_map<uint64_t, uint64_t> DiskTier::scan_segments(const LogReplay& log) {
  const auto& live = log.live;
  std::unordered_set<uint64_t> named;
  for (const auto& [id, e] : live) named.insert(segment_of(id));
  std::unordered_map<uint64_t, uint64_t> kept;  // segment -> file size
  // No new segment takes a number the log named, even in a record removed since.
  uint64_t next_segment = segment_of(log.max_id) + 1;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(options_.directory + "/chunks", ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    std::error_code entry_ec;  // one entry's trouble must not end the walk
    const auto type = it->symlink_status(entry_ec).type();
    if (type == std::filesystem::file_type::directory) continue;  // fan-out directories
    std::string name = it->path().filename().string();
    char* end = nullptr;
    uint64_t seg = std::strtoull(name.c_str(), &end, 16);
    bool segment_name = name.size() == 20 && end == name.c_str() + 16 &&
                        std::strcmp(end, ".seg") == 0 && seg != 0 && seg < kMaxSegment &&
                        path_of(seg << kPageBits) == it->path().string();
    // Whatever lies under a segment's name, no new segment takes that name.
    if (segment_name) next_segment = std::max(next_segment, seg + 1);
    if (segment_name && type == std::filesystem::file_type::regular && named.contains(seg)) {
      uint64_t size = it->file_size(entry_ec);
      if (!entry_ec) {
        kept[seg] = size;
        continue;
      }
    }
    // A segment no record names, a file of an older layout, debris; a FIFO, socket or
    // symlink is never opened (it could block a write or send it elsewhere).
    ++open_report_.orphans;
    std::filesystem::remove(it->path(), entry_ec);
  }
  MutexLock lock(mu_);
  next_segment_ = std::max(next_segment_, next_segment);
  return kept;
}

// Restores the live records whose bytes are there to the policy and the index, then frees
// every page of a kept segment that no restored chunk covers.
void DiskTier::restore(const LogReplay& log, const std::unordered_map<uint64_t, uint64_t>& kept) {
  const auto& live = log.live;
  const auto& order = log.order;
  std::error_code ec;
  // Two live records for one chunk (a removal that could not be recorded, a full disk):
  // the later add wins, since the earlier copy's pages may have been freed.
  std::unordered_map<uint64_t, size_t> last_add;  // file id -> its last place in `order`
  for (size_t i = 0; i < order.size(); ++i) last_add[order[i]] = i;
  std::unordered_map<ChunkId, uint64_t> newest;  // chunk -> the file id that wins
  for (const auto& [id, e] : live) {
    auto [w, fresh] = newest.try_emplace(e.key.id(), id);
    if (!fresh && last_add[id] > last_add[w->second]) w->second = id;
  }
  // Pages are freed below with everything else no entry covers. Nothing is charged yet:
  // the chunks kept are adopted at the end.
  std::vector<Gone> dropped;
  {
    MutexLock lock(mu_);
    std::unordered_set<uint64_t> done;
    auto drop = [&](const Entry& e) {
      ++open_report_.dropped;
      dropped.push_back(Gone{e.file_id, e.length, false, 0});
    };
    for (uint64_t id : order) {
      auto e = live.find(id);
      if (e == live.end() || !done.insert(id).second) continue;
      auto k = kept.find(segment_of(id));
      if (k == kept.end() || offset_of(id) + e->second.length > k->second) {
        drop(e->second);  // its segment is gone or too short
        continue;
      }
      ChunkId cid = e->second.key.id();
      if (newest[cid] != id || entries_.contains(cid)) {  // an older copy of one chunk
        drop(e->second);
        continue;
      }
      Admission a = policy_->restore(cid, on_disk(e->second.length));
      for (ChunkId v : a.evicted) forget_locked(v, dropped);
      if (!a.admitted) {
        drop(e->second);
        continue;
      }
      entries_[cid] = e->second;
      ++open_report_.restored;
    }
    segments_.clear();
    for (const auto& [cid, e] : entries_) ++segments_[segment_of(e.file_id)].chunks;
    // What no entry covers is freed: chunks dropped above, fills cut short by a crash.
    std::unordered_map<uint64_t, std::vector<std::pair<uint64_t, uint64_t>>> ranges;
    for (const auto& [cid, e] : entries_)
      ranges[segment_of(e.file_id)].emplace_back(offset_of(e.file_id), on_disk(e.length));
    for (const auto& [seg, size] : kept) {
      std::string segment = path_of(seg << kPageBits);
      auto r = ranges.find(seg);
      if (r == ranges.end()) {
        std::filesystem::remove(segment, ec);
        continue;
      }
      if (!punch_holes_) continue;
      std::sort(r->second.begin(), r->second.end());
      uint64_t pos = 0;
      for (const auto& [off, len] : r->second) {
        if (off > pos) free_pages(segment, pos, off - pos);
        pos = std::max(pos, off + len);
      }
      if (size > pos) free_pages(segment, pos, size - pos);
    }
  }
  // Each chunk kept is charged again (a restart recounts what the cache holds), outside
  // mu_: the charger may ask the ledger. Nothing else runs yet.
  if (options_.adopt) {
    std::vector<std::pair<ChunkId, Entry>> kept_entries;
    {
      MutexLock lock(mu_);
      for (const auto& [cid, e] : entries_) kept_entries.emplace_back(cid, e);
    }
    for (auto& [cid, e] : kept_entries) e.charge = options_.adopt(e.key, on_disk(e.length));
    MutexLock lock(mu_);
    for (const auto& [cid, e] : kept_entries) {
      auto it = entries_.find(cid);
      if (it != entries_.end()) it->second.charge = e.charge;
    }
  }
}

Status DiskTier::replay() {
  SLUICE_ASSIGN_OR_RETURN(LogReplay log, read_log());
  restore(log, scan_segments(log));
  // Start the log afresh from what survived: it drops dead records and a torn tail.
  MutexLock llock(log_mu_);
  return compact_locked();
}

Status DiskTier::open_log_for_append() {
  MutexLock lock(log_mu_);
  if (log_fd_.valid()) return ok();
  std::string path = options_.directory + "/index.log";
  log_fd_.reset(::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC));
  if (!log_fd_.valid()) return fail_errno(errno, "open " + path);
  return ok();
}

// Writes a new log holding one add record per ready entry, then renames it over the old
// one. log_mu_ is held; takes mu_ briefly to copy the entries.
Status DiskTier::compact_locked() {
  std::vector<std::byte> out = header(options_.chunk_size);
  size_t records = 0;
  {
    MutexLock lock(mu_);
    for (const auto& [id, e] : entries_) {
      if (!e.ready) continue;
      std::vector<std::byte> r = record(kAdd, add_payload(e));
      out.insert(out.end(), r.begin(), r.end());
      ++records;
    }
  }
  std::string path = options_.directory + "/index.log", tmp = path + ".new";
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd.valid()) return fail_errno(errno, "create " + tmp);
  SLUICE_RETURN_IF_ERROR(write_full(fd.get(), out, tmp));
  if (::fsync(fd.get()) != 0) return fail_errno(errno, "fsync " + tmp);
  if (::rename(tmp.c_str(), path.c_str()) != 0) return fail_errno(errno, "rename " + tmp);
  UniqueFd dir(::open(options_.directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir.valid()) SLUICE_RETURN_IF_ERROR(sync_directory(dir.get(), options_.directory));
  log_fd_.reset(::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC));
  if (!log_fd_.valid()) return fail_errno(errno, "open " + path);
  log_records_ = records;
  return ok();
}

Status DiskTier::append_locked(std::span<const std::byte> rec) {
  std::string path = options_.directory + "/index.log";
  struct stat st;
  if (::fstat(log_fd_.get(), &st) != 0) return fail_errno(errno, "stat " + path);
  if (Status w = write_full(log_fd_.get(), rec, path); !w) {
    // A part of a record (a full disk) would end the log there at the next open, and every
    // record after it with it: cut it off, so that later appends follow a whole record.
    if (::ftruncate(log_fd_.get(), st.st_size) != 0) {
      return fail(w.error().code(), w.error().message() + "; cutting the torn record off " + path +
                                        " failed too: " + std::strerror(errno));
    }
    return w;
  }
  ++log_records_;
  uint64_t live = chunk_count();
  if (log_records_ > 2 * live + 4096) return compact_locked();
  return ok();
}

Status DiskTier::append_remove(uint64_t file_id) {
  std::vector<std::byte> p;
  put(p, file_id, 8);
  std::vector<std::byte> r = record(kRemove, p);
  MutexLock lock(log_mu_);
  return append_locked(r);
}

void DiskTier::forget_locked(ChunkId id, std::vector<Gone>& gone) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  policy_->erase(id);
  Entry& e = it->second;
  const uint64_t seg = segment_of(e.file_id);
  bool last = false;
  auto n = segments_.find(seg);
  if (n != segments_.end() && --n->second.chunks == 0) {
    last = true;  // no chunk lies there now and none will: its number is never placed again
    auto a = appending_.find(n->second.appending);
    if (a != appending_.end() && a->second.segment == seg) appending_.erase(a);
    segments_.erase(n);
  }
  gone.push_back(Gone{e.file_id, e.length, last, e.charge});
  entries_.erase(it);
}

// Records evicted chunks' removal, then frees their pages (unlinks a segment left empty).
// The record goes first: a crash between the two leaves bytes no record names, freed at
// open, never a record whose pages are gone. Pages are never placed twice, so freeing them
// outside mu_ races with no later write. A reader that already holds the segment open
// reads zeros there, which fail its checksum.
void DiskTier::discard(const std::vector<Gone>& gone) {
  for (const Gone& g : gone) {
    if (options_.freed && g.charge != 0) options_.freed(g.charge, on_disk(g.length));
    // Best effort (a full disk): the space is freed anyway; the record left behind then
    // fails its checksum when read, and is dropped.
    (void)append_remove(g.file_id);
    std::string path = path_of(g.file_id);
    if (g.last) {
      ::unlink(path.c_str());
    } else {
      free_pages(path, offset_of(g.file_id), on_disk(g.length));
    }
  }
}

uint64_t DiskTier::place_locked(const Entry& e, uint64_t lane) {
  const uint64_t pages = on_disk(e.length) / kPage;
  // Chunks of a multi-chunk object append to its segment; anything else gets its own.
  if (!punch_holes_ || e.object_size <= options_.chunk_size) return next_segment_++ << kPageBits;
  std::string name = object_of(e.key, lane);
  Appending& a = appending_[name];
  if (a.segment == 0 || (a.next_page > 0 && a.next_page + pages > kSegmentPages)) {
    a.segment = next_segment_++;
    a.next_page = 0;
    segments_[a.segment].appending = std::move(name);
  }
  const uint64_t id = a.segment << kPageBits | a.next_page;
  a.next_page += pages;
  return id;
}

std::optional<DiskTier::Entry> DiskTier::find(const ChunkKey& key) {
  ChunkId id = key.id();
  MutexLock lock(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end() || !it->second.ready || it->second.key != key) return std::nullopt;
  policy_->on_hit(id);
  return it->second;
}

bool DiskTier::contains(const ChunkKey& key) const {
  MutexLock lock(mu_);
  auto it = entries_.find(key.id());
  return it != entries_.end() && it->second.key == key;
}

Status DiskTier::read(const Entry& e, std::span<std::byte> dst) {
  std::string path = path_of(e.file_id);
  io::OpenOptions oo;
  oo.compat = io::CompatMode::kOn;  // host memory: no cuFile
  auto fh = io::FileHandle::open(options_.io, path, oo);
  if (!fh) {
    if (fh.error().code() == Code::kNotFound) {
      // Evicted meanwhile (then the entry is gone already), or removed behind the cache's
      // back: forget it, or every read would miss it and nothing would cache it again.
      std::vector<Gone> gone;
      {
        MutexLock lock(mu_);
        auto it = entries_.find(e.key.id());
        if (it != entries_.end() && it->second.file_id == e.file_id) forget_locked(it->first, gone);
      }
      discard(gone);
      return std::unexpected(fh.error());
    }
    return std::unexpected(fh.error().with_context("cache chunk of '" + e.key.key + "'"));
  }
  auto n = fh->read(io::Buffer::host(dst.data(), e.length), e.length, offset_of(e.file_id));
  std::string why;
  if (!n) {
    why = n.error().message();
  } else if (*n != e.length) {
    why = "file holds " + std::to_string(*n) + " of " + std::to_string(e.length) + " bytes";
  } else if (checksum(dst.first(e.length)) != e.xxh3) {
    why = "checksum mismatch";
  }
  if (why.empty()) return ok();
  std::vector<Gone> gone;
  {
    MutexLock lock(mu_);
    auto it = entries_.find(e.key.id());
    if (it != entries_.end() && it->second.file_id == e.file_id) forget_locked(it->first, gone);
  }
  discard(gone);
  return fail(Code::kCorruption, "cache chunk " + std::to_string(e.key.index) + " of '" +
                                     e.key.key + "' (" + path + "): " + why + "; dropped");
}

Result<bool> DiskTier::write(const ChunkView& chunk, bool pinned, uint64_t lane) {
  SLUICE_ASSIGN_OR_RETURN(std::optional<Pending> p, begin(chunk, pinned, lane));
  if (!p) return false;
  Status written = put_bytes(*p, chunk.bytes, chunk.xxh3);
  return finish(std::move(*p), std::move(written));
}

Result<std::optional<DiskTier::Pending>> DiskTier::begin(const ChunkView& chunk, bool pinned,
                                                         uint64_t lane) {
  const uint64_t length = chunk.bytes.size();
  if (chunk.key.store.size() > kMaxStoreId || chunk.key.key.size() > kMaxKey ||
      chunk.key.etag.size() > kMaxEtag || chunk.key.etag.empty() ||
      !store::validate_key(chunk.key.key))
    return std::nullopt;  // its record could not be read back: kept in RAM only
  ChunkId id = chunk.key.id();
  Entry e;
  e.key = chunk.key;
  e.length = length;
  e.object_size = chunk.object_size;
  e.object_mtime_ns = chunk.object_mtime_ns;
  e.pinned = pinned;
  // Charged first (the ledger may be slow: not under mu_); a chunk not kept after all is
  // uncharged below.
  if (options_.admit) {
    if (contains(chunk.key)) return std::nullopt;
    std::optional<uint32_t> tag = options_.admit(chunk.key, on_disk(length));
    if (!tag) return std::nullopt;
    e.charge = *tag;
  }
  std::vector<Gone> gone;
  {
    MutexLock lock(mu_);
    Admission a;
    if (!entries_.contains(id)) a = policy_->admit(id, on_disk(length));
    for (ChunkId v : a.evicted) {
      forget_locked(v, gone);
      if (options_.evictions) options_.evictions->add();
    }
    if (a.admitted) {
      if (pinned) policy_->set_pinned(id, true);
      e.file_id = place_locked(e, lane);
      ++segments_[segment_of(e.file_id)].chunks;
      entries_[id] = e;  // not ready: invisible to find() until written and recorded
    }
  }
  discard(gone);
  if (e.file_id == 0) {
    if (e.charge != 0 && options_.freed) options_.freed(e.charge, on_disk(length));
    return std::nullopt;
  }
  return Pending(std::move(e));
}

Status DiskTier::put_bytes(Pending& p, std::span<const std::byte> bytes,
                           std::optional<uint64_t> xxh3) {
  const uint64_t length = p.entry.length;
  if (bytes.size() != length)
    return fail(Code::kInternal, "cache chunk " + std::to_string(p.entry.key.index) + " of '" +
                                     p.entry.key.key + "': " + std::to_string(bytes.size()) +
                                     " bytes to write into a place for " + std::to_string(length));
  p.entry.xxh3 = xxh3 ? *xxh3 : checksum(bytes);
  const std::string path = path_of(p.entry.file_id);
  io::OpenOptions oo;
  oo.write = oo.create = true;  // a segment is appended to, never truncated
  oo.compat = io::CompatMode::kOn;
  auto fh = io::FileHandle::open(options_.io, path, oo);
  if (!fh && fh.error().code() == Code::kNotFound) {  // its fan-out directory is missing
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
    fh = io::FileHandle::open(options_.io, path, oo);
  }
  if (!fh) return std::unexpected(fh.error());
  SLUICE_ASSIGN_OR_RETURN(size_t n, fh->write(io::Buffer::host(bytes.data(), length), length,
                                              offset_of(p.entry.file_id)));
  if (n != length) return fail(Code::kIoError, "short write of " + path);
  return ok();
}

Result<bool> DiskTier::finish(Pending&& p, Status written) {
  Entry e = std::move(p.entry);
  const uint64_t xxh3 = e.xxh3;
  const ChunkId id = e.key.id();
  const std::string path = path_of(e.file_id);
  const uint64_t at = offset_of(e.file_id);
  const uint64_t length = e.length;
  std::vector<Gone> gone;
  bool still_ours = false, segment_dead = false;
  // The log's lock first (the documented order), held until the add record is appended: a
  // thread that evicts the chunk once it is ready records its removal after this add, so
  // the log never says remove-then-add for bytes already freed.
  UniqueLock log_lock(log_mu_);
  {
    MutexLock lock(mu_);
    auto it = entries_.find(id);
    still_ours = it != entries_.end() && it->second.file_id == e.file_id;
    if (still_ours && written) {
      it->second.xxh3 = xxh3;
      it->second.ready = true;
    } else if (still_ours) {
      forget_locked(id, gone);  // freed below, with a remove record for an id never added
    } else {
      // Dropped while being written: whoever dropped it freed its pages, perhaps before
      // these bytes landed (or unlinked the segment, which this write may have recreated).
      segment_dead = !segments_.contains(segment_of(e.file_id));
    }
  }
  if (!written || !still_ours) {
    log_lock.unlock();
    discard(gone);
    if (segment_dead) {
      ::unlink(path.c_str());
    } else if (!still_ours) {
      free_pages(path, at, on_disk(length));
    }
    if (!written)
      return std::unexpected(written.error().with_context("caching '" + e.key.key + "'"));
    return false;
  }
  e.ready = true;
  // The record goes last: a crash before it leaves bytes no record names, freed at open.
  SLUICE_RETURN_IF_ERROR(append_locked(record(kAdd, add_payload(e))));
  return true;
}

size_t DiskTier::drop_if(const std::function<bool(const ChunkKey&)>& match) {
  std::vector<Gone> gone;
  {
    MutexLock lock(mu_);
    std::vector<ChunkId> ids;
    for (const auto& [id, e] : entries_) {
      if (match(e.key)) ids.push_back(id);
    }
    for (ChunkId id : ids) forget_locked(id, gone);
  }
  discard(gone);
  return gone.size();
}

size_t DiskTier::pin_if(const std::function<bool(const ChunkKey&)>& match, bool pinned) {
  MutexLock lock(mu_);
  size_t n = 0;
  for (auto& [id, e] : entries_) {
    if (!match(e.key)) continue;
    policy_->set_pinned(id, pinned);
    e.pinned = pinned;
    ++n;
  }
  return n;
}

void DiskTier::declare(std::span<const ChunkId> order) {
  MutexLock lock(mu_);
  policy_->declare(order);
}

std::vector<DiskTier::Entry> DiskTier::entries() const {
  MutexLock lock(mu_);
  std::vector<Entry> out;
  for (const auto& [id, e] : entries_) {
    if (e.ready) out.push_back(e);
  }
  return out;
}

uint64_t DiskTier::bytes() const {
  MutexLock lock(mu_);
  return policy_->resident_bytes();
}

uint64_t DiskTier::chunk_count() const {
  MutexLock lock(mu_);
  return entries_.size();
}

std::string DiskTier::io_path() const {
  // Opened on the index: the directory's file system decides O_DIRECT for every chunk.
  io::OpenOptions oo;
  oo.compat = io::CompatMode::kOn;
  auto fh = io::FileHandle::open(options_.io, options_.directory + "/index.log", oo);
  return fh ? fh->path_report().describe() : "unknown (" + fh.error().message() + ")";
}

}  // namespace sluice::cache
