// file:// — objects as files under a root directory, for local and shared file systems.
//
// Every path is resolved relative to an open descriptor of the root with
// openat2(RESOLVE_BENEATH), so neither ".." nor a symlink can reach outside the root (on a
// kernel without openat2, each component is opened with O_NOFOLLOW instead). A Writer
// writes to a temporary file under <root>/.sluice-tmp/, fdatasyncs it on commit, renames
// it into place (renameat2 RENAME_NOREPLACE when overwrite is off) and fsyncs the
// directory, so a crash leaves either the old object or the new one, and at worst a
// temporary file that listings never show. Temporary files name their host and process;
// opening the store (or listing past a .sluice-tmp directory) removes those whose process
// is gone.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#if SLUICE_HAVE_OPENAT2
#include <linux/openat2.h>
#endif
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <iterator>
#include <random>

#include "sluice/core/fd.h"
#include "sluice/store/store.h"

namespace sluice::store {
namespace {

constexpr const char* kTempDir = ".sluice-tmp";

using Fd = UniqueFd;

// Set once if the kernel lacks openat2. Relaxed: a hint; a thread that misses it only
// tries openat2 once more and gets ENOSYS again.
std::atomic<bool> g_no_openat2{false};

// Opens `path` (relative, validated) beneath `dirfd`. Returns an fd or -errno.
int open_beneath(int dirfd, const std::string& path, int flags, mode_t mode = 0) {
#if SLUICE_HAVE_OPENAT2
  if (!g_no_openat2.load(std::memory_order_relaxed)) {
    struct open_how how = {};
    how.flags = static_cast<uint64_t>(flags | O_CLOEXEC);
    how.mode = (flags & O_CREAT) ? mode : 0;
    how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
    long fd;
    do {
      fd = ::syscall(SYS_openat2, dirfd, path.c_str(), &how, sizeof how);
    } while (fd < 0 && errno == EINTR);
    if (fd >= 0) return static_cast<int>(fd);
    if (errno != ENOSYS && errno != EPERM) return -errno;
    // Relaxed: a benign race; every thread that sees ENOSYS sets the same value.
    g_no_openat2.store(true, std::memory_order_relaxed);
  }
#endif
  // Fallback: walk the components without following any symlink.
  int cur = ::dup(dirfd);
  if (cur < 0) return -errno;
  size_t start = 0;
  while (true) {
    size_t slash = path.find('/', start);
    bool last = slash == std::string::npos;
    std::string part = path.substr(start, last ? std::string::npos : slash - start);
    int f =
        last ? (flags | O_CLOEXEC | O_NOFOLLOW) : (O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    int next = ::openat(cur, part.c_str(), f, mode);
    int err = errno;
    ::close(cur);
    if (next < 0) return -err;
    if (last) return next;
    cur = next;
    start = slash + 1;
  }
}

// dup(2) returning -errno on failure, like open_beneath.
int dup_fd(int fd) {
  int d = ::dup(fd);
  return d >= 0 ? d : -errno;
}

// Changes whenever the file's bytes may have: a rewrite in place of the same size, even with
// its mtime set back (rsync --inplace -t, touch -r), still moves ctime.
std::string etag_of(const struct stat& st) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "%lx-%lx-%lx-%lx-%lx", static_cast<unsigned long>(st.st_dev),
                static_cast<unsigned long>(st.st_ino), static_cast<unsigned long>(st.st_size),
                static_cast<unsigned long>(st.st_mtim.tv_sec * 1000000000L + st.st_mtim.tv_nsec),
                static_cast<unsigned long>(st.st_ctim.tv_sec * 1000000000L + st.st_ctim.tv_nsec));
  return buf;
}

// Temporary files are named "h<host>-p<pid>-<counter>-<random>" under .sluice-tmp/: short
// enough for any legal key (no part of the key is in the name), and saying which process
// on which host owns them, so a later process can remove those whose owner died.
uint32_t host_id() {
  static const uint32_t id = [] {
    char name[256] = {};
    ::gethostname(name, sizeof name - 1);
    uint32_t h = 2166136261u;  // FNV-1a: a short, stable tag, not a security boundary
    for (const char* c = name; *c; ++c) h = (h ^ static_cast<unsigned char>(*c)) * 16777619u;
    return h;
  }();
  return id;
}

std::string temp_name() {
  static std::atomic<uint64_t> counter{0};  // relaxed: only has to be unique in this process
  thread_local std::mt19937_64 rng{std::random_device{}()};
  char name[96];
  std::snprintf(name, sizeof name, "%s/h%08x-p%d-%lu-%016lx", kTempDir, host_id(),
                static_cast<int>(::getpid()),
                static_cast<unsigned long>(counter.fetch_add(1, std::memory_order_relaxed)),
                static_cast<unsigned long>(rng()));
  return name;
}

// A writer holds an open-file-description lock on its temporary file for as long as it
// lives; the kernel drops it when the process dies. Taking the lock therefore proves the
// owner is gone, across PID namespaces that share the directory (containers) and, on NFSv4,
// across hosts, where a PID alone proves nothing.
bool lock_whole_file(int fd) {
  struct flock fl = {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;  // l_start = l_len = 0: the whole file
  return ::fcntl(fd, F_OFD_SETLK, &fl) == 0;
}

// True for a temporary file of this host whose owning process is gone: its PID does not
// exist here and nobody holds its lock.
bool is_stale_temp(int dirfd, const char* name) {
  unsigned host = 0;
  int pid = 0;
  if (std::sscanf(name, "h%8x-p%d-", &host, &pid) != 2 || host != host_id() || pid <= 0)
    return false;
  if (::kill(pid, 0) == 0 || errno != ESRCH) return false;
  UniqueFd fd(::openat(dirfd, name, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!fd.valid()) return false;
  if (lock_whole_file(fd.get())) return true;
  // Held (EAGAIN, EACCES): a live owner elsewhere. No locks on this file system: the PID
  // is all there is to go by.
  return errno == ENOLCK || errno == EOPNOTSUPP || errno == EINVAL;
}

// Removes the stale temporary files in the .sluice-tmp directory `tmpfd` (opened for
// reading), and the directory itself once empty. Best effort: a failure only leaves debris.
void reap_stale_temps(int parentfd, int tmpfd) {
  DIR* dp = ::fdopendir(tmpfd);
  if (!dp) {
    ::close(tmpfd);
    return;
  }
  while (struct dirent* e = ::readdir(dp))
    if (is_stale_temp(::dirfd(dp), e->d_name)) (void)::unlinkat(::dirfd(dp), e->d_name, 0);
  ::closedir(dp);
  (void)::unlinkat(parentfd, kTempDir, AT_REMOVEDIR);  // fails while others write: fine
}

// Names an older sluice cp left beside a download (".name.sluice-<pid>-<n>"): never objects.
bool is_legacy_temp(const std::string& name) {
  size_t at = name.rfind(".sluice-");
  if (name.empty() || name[0] != '.' || at == std::string::npos || at == 0) return false;
  std::string_view tail = std::string_view(name).substr(at + 8);
  size_t dash = tail.find('-');
  auto digits = [](std::string_view v) {
    return !v.empty() && v.find_first_not_of("0123456789") == std::string_view::npos;
  };
  return dash != std::string_view::npos && digits(tail.substr(0, dash)) &&
         digits(tail.substr(dash + 1));
}

// Keys with a .sluice-tmp component would mix with temporary files, which listings skip.

class PosixStore;

class PosixWriter : public Writer {
 public:
  PosixWriter(PosixStore* store, std::string key, WriteOptions options, Fd fd, std::string tmp)
      : store_(store),
        key_(std::move(key)),
        options_(options),
        fd_(std::move(fd)),
        tmp_(std::move(tmp)) {}
  ~PosixWriter() override { abort(); }

  Status append(std::span<const std::byte> data) override;
  Status commit() override;
  void abort() override;
  uint64_t size() const override { return size_.load(std::memory_order_relaxed); }
  bool positional() const override { return true; }
  Status write_at(uint64_t offset, std::span<const std::byte> data) override;
  std::string local_path() const override;
  Status extend_to(uint64_t size) override {
    if (done_)
      return fail(Code::kInvalidArgument, "extend_to on finished writer for '" + key_ + "'");
    uint64_t cur = size_.load(std::memory_order_relaxed);
    while (size > cur && !size_.compare_exchange_weak(cur, size, std::memory_order_relaxed)) {
    }
    return ok();
  }

 private:
  Status failed(Error e) {
    abort();
    return std::unexpected(std::move(e));
  }

  PosixStore* store_;
  std::string key_;
  WriteOptions options_;
  Fd fd_;
  std::string tmp_;  // name under .sluice-tmp/, empty once published or removed
  // The end of the furthest byte written. Atomic: write_at may run on several threads.
  // Relaxed: a high-water mark that publishes no bytes; size() and commit() read it once the
  // writes they depend on returned (the Writer contract orders them), append after its own.
  std::atomic<uint64_t> size_{0};
  std::atomic<bool> done_{false};
};

class PosixStore : public Store {
 public:
  PosixStore(std::string root, Fd root_fd) : root_(std::move(root)), root_fd_(std::move(root_fd)) {
    while (root_.size() > 1 && root_.back() == '/') root_.pop_back();
  }

  Result<ObjectInfo> stat(std::string_view key) override {
    SLUICE_RETURN_IF_ERROR(validate_key(key));
    std::string k(key);
    int fd = open_beneath(root_fd_.get(), k, O_PATH);
    if (fd < 0) return errno_error(-fd, "stat", k);
    Fd guard(fd);
    struct stat st;
    if (::fstat(fd, &st) != 0) return errno_error(errno, "stat", k);
    if (!S_ISREG(st.st_mode))
      return fail(Code::kNotFound, "object '" + k + "' in " + uri() + " is not a regular file");
    return ObjectInfo{k, static_cast<uint64_t>(st.st_size),
                      st.st_mtim.tv_sec * 1000000000L + st.st_mtim.tv_nsec, etag_of(st)};
  }

  Result<size_t> read(std::string_view key, uint64_t offset, std::span<std::byte> dst,
                      const ReadOptions& options) override {
    SLUICE_RETURN_IF_ERROR(validate_key(key));
    std::string k(key);
    // O_NONBLOCK: opening a FIFO (or a device) must not hang; it is refused just below.
    int fd = open_beneath(root_fd_.get(), k, O_RDONLY | O_NONBLOCK);
    if (fd < 0) return errno_error(-fd, "open", k);
    Fd guard(fd);
    struct stat st;
    if (::fstat(fd, &st) != 0) return errno_error(errno, "stat", k);
    if (!S_ISREG(st.st_mode))
      return fail(Code::kNotFound, "object '" + k + "' in " + uri() + " is not a regular file");
    auto changed = [&] {
      return fail(Code::kConflict, "object '" + k + "' in " + uri() +
                                       " changed: etag is no longer " + options.if_match);
    };
    if (!options.if_match.empty() && etag_of(st) != options.if_match) return changed();
    SLUICE_ASSIGN_OR_RETURN(size_t n,
                            pread_full(fd, dst, offset, "object '" + k + "' in " + uri()));
    // A write during the read would make a blend: a pinned read checks again after it.
    if (!options.if_match.empty()) {
      if (::fstat(fd, &st) != 0) return errno_error(errno, "stat", k);
      if (etag_of(st) != options.if_match) return changed();
    }
    return n;
  }

  Result<std::unique_ptr<Writer>> create(std::string_view key,
                                         const WriteOptions& options) override {
    SLUICE_RETURN_IF_ERROR(validate_key(key));
    std::string k(key);
    if (is_reserved_key(k))
      return fail(Code::kInvalidArgument,
                  "key '" + k + "' is reserved: " + kTempDir + " holds temporary files");
    if (auto parent = open_parent(k, false); parent)  // no parent yet: nothing to replace
      SLUICE_RETURN_IF_ERROR(check_replaceable(parent->first.get(), parent->second, k));
    std::string name = temp_name();
    // The temporary directory is made only when missing: a mkdir that finds it still locks
    // the root directory, against every rename into it. The last writer's commit may remove
    // it between our mkdir and open: try again.
    const mode_t mode = static_cast<mode_t>(options.mode & 07777);
    int fd = open_beneath(root_fd_.get(), name, O_WRONLY | O_CREAT | O_EXCL, mode);
    for (int attempt = 0; attempt < 5 && fd == -ENOENT; ++attempt) {
      if (::mkdirat(root_fd_.get(), kTempDir, 0755) != 0 && errno != EEXIST)
        return errno_error(errno, "create temporary directory for", k);
      fd = open_beneath(root_fd_.get(), name, O_WRONLY | O_CREAT | O_EXCL, mode);
    }
    if (fd < 0) return errno_error(-fd, "create temporary file for", k);
    auto writer = std::make_unique<PosixWriter>(this, k, options, Fd(fd), name);
    // Given back by its commit or abort. Relaxed: taking a count publishes nothing (the
    // release is acq_rel, as for a reference count).
    writers_.fetch_add(1, std::memory_order_relaxed);
    if (!lock_whole_file(fd)) {  // a file system without locks: reaping goes by PIDs alone
      int err = errno;
      if (err != ENOLCK && err != EOPNOTSUPP && err != EINVAL) {
        writer->abort();
        return errno_error(err, "lock temporary file for", k);
      }
    }
    if (options.size_hint && *options.size_hint > 0) {
      // Reserve the blocks first: a full disk is a clear NoSpace before any byte moves.
      // fallocate(2), not posix_fallocate: where the file system cannot reserve (NFSv3,
      // some FUSE), glibc's emulation writes every block, doubling the I/O.
      if (::fallocate(fd, 0, 0, static_cast<off_t>(*options.size_hint)) != 0 &&
          errno != EOPNOTSUPP && errno != ENOSYS) {
        int err = errno;
        writer->abort();
        return errno_error(err, "reserve " + std::to_string(*options.size_hint) + " bytes for", k);
      }
    }
    return writer;
  }

  Result<ListPage> list(const ListOptions& options) override {
    if (options.max_keys == 0 || options.max_keys > 10000)
      return fail(Code::kInvalidArgument, "list max_keys must be 1..10000");
    // Start the walk at the deepest directory the prefix names.
    std::string dir = options.prefix.substr(
        0, options.prefix.rfind('/') == std::string::npos ? 0 : options.prefix.rfind('/'));
    std::vector<std::string> keys;
    SLUICE_RETURN_IF_ERROR(walk(dir, options, keys));
    std::sort(keys.begin(), keys.end());
    ListPage page;
    auto it = options.continuation.empty()
                  ? keys.begin()
                  : std::upper_bound(keys.begin(), keys.end(), options.continuation);
    for (; it != keys.end(); ++it) {
      // What a page names, left out or not, counts towards max_keys: a folder of many
      // links cannot make one page (one sluiced reply frame) unbounded.
      if (page.objects.size() + page.skipped.size() == options.max_keys) {
        page.next_token = *std::prev(it);
        break;
      }
      auto info = stat(*it);
      if (!info) {
        if (info.error().code() == Code::kNotFound) {
          // Removed while listing: nothing to say. Still there (a dangling symlink, a FIFO,
          // a device: no regular file): left out and named.
          struct stat st;
          if (::fstatat(root_fd_.get(), it->c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0)
            page.skipped.push_back({*it, info.error().message()});
          continue;
        }
        // A symlink out of the root (EXDEV from RESOLVE_BENEATH) or a loop (ELOOP; any
        // symlink without openat2) is no object here: left out and named (store.h).
        const int err = info.error().sys_errno();
        if (options.skip_unreadable || err == EXDEV || err == ELOOP) {
          page.skipped.push_back({*it, info.error().message()});
          continue;
        }
        return std::unexpected(info.error());
      }
      page.objects.push_back(std::move(*info));
    }
    return page;
  }

  Status remove(std::string_view key) override {
    SLUICE_RETURN_IF_ERROR(validate_key(key));
    std::string k(key);
    SLUICE_ASSIGN_OR_RETURN(auto parent, open_parent(k, false));
    if (::unlinkat(parent.first.get(), parent.second.c_str(), 0) != 0)
      return errno_error(errno, "remove", k);
    // Drop directories the removal emptied; a failure (not empty, raced) is fine.
    std::string d = k;
    while (true) {
      size_t slash = d.rfind('/');
      if (slash == std::string::npos) break;
      d.resize(slash);
      if (::unlinkat(root_fd_.get(), d.c_str(), AT_REMOVEDIR) != 0) break;
    }
    return ok();
  }

  std::string uri() const override { return "file://" + root_; }
  bool reports_replaced() const override { return true; }
  bool cheap_requests() const override { return true; }
  const std::string& root() const { return root_; }

  // Opens the directory that holds `key` (creating it if asked) and returns it with the
  // key's last component.
  // New directories are made durable when `durable` is set.
  Result<std::pair<Fd, std::string>> open_parent(const std::string& key, bool create,
                                                 bool durable = true) {
    size_t slash = key.rfind('/');
    if (slash == std::string::npos) {
      int fd = ::dup(root_fd_.get());
      if (fd < 0) return errno_error(errno, "open directory of", key);
      return std::pair{Fd(fd), key};
    }
    std::string dir = key.substr(0, slash);
    if (create) {
      size_t pos = 0;
      while (pos != std::string::npos) {
        pos = dir.find('/', pos + 1);
        std::string sub = dir.substr(0, pos);
        int fd = open_beneath(root_fd_.get(), sub, O_PATH | O_DIRECTORY);
        if (fd >= 0) {
          ::close(fd);
          continue;
        }
        if (fd != -ENOENT) return errno_error(-fd, "open directory '" + sub + "' for", key);
        size_t up = sub.rfind('/');
        int pfd = up == std::string::npos
                      ? dup_fd(root_fd_.get())
                      : open_beneath(root_fd_.get(), sub.substr(0, up), O_PATH | O_DIRECTORY);
        if (pfd < 0) return errno_error(-pfd, "open directory for", key);
        Fd pguard(pfd);
        std::string leaf = up == std::string::npos ? sub : sub.substr(up + 1);
        if (::mkdirat(pfd, leaf.c_str(), 0755) != 0) {
          if (errno == EEXIST) continue;  // another writer made it
          return errno_error(errno, "create directory '" + sub + "' for", key);
        }
        // A new directory's entry must be durable too, or a committed object below it can
        // vanish in a crash.
        if (durable)
          SLUICE_RETURN_IF_ERROR(
              sync_directory(pfd, "directory '" + sub + "' for object '" + key + "' in " + uri()));
      }
    }
    int fd = open_beneath(root_fd_.get(), dir, O_PATH | O_DIRECTORY);
    if (fd < 0) return errno_error(-fd, "open directory of", key);
    return std::pair{Fd(fd), key.substr(slash + 1)};
  }

  std::unexpected<Error> errno_error(int err, std::string_view op, std::string_view key) const {
    if (err == EXDEV || err == ELOOP)  // openat2 RESOLVE_BENEATH refused the path
      return std::unexpected(Error(Code::kInvalidArgument,
                                   std::string(op) + " object '" + std::string(key) + "' in " +
                                       uri() +
                                       ": a symlink on its path leads outside the store "
                                       "(or loops)",
                                   err));
    return std::unexpected(
        error_from_errno(err, std::string(op) + " object '" + std::string(key) + "' in " + uri()));
  }

  int root_fd() const { return root_fd_.get(); }

  // A commit replaces an object (a regular file, or a symlink to one), never a FIFO, a
  // device or a socket that happens to sit at the key: renaming over /dev/null or a named
  // pipe would destroy something that is not the store's.
  Status check_replaceable(int dirfd, const std::string& leaf, const std::string& key) const {
    struct stat st;
    if (::fstatat(dirfd, leaf.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return ok();
    if (S_ISREG(st.st_mode) || S_ISLNK(st.st_mode) || S_ISDIR(st.st_mode)) return ok();
    return fail(Code::kInvalidArgument, "object '" + key + "' in " + uri() +
                                            " would replace a FIFO, device or socket; refusing");
  }

  // A writer's temporary file is gone (published or removed). The last open writer removes
  // the temporary directory, so a one-off download leaves nothing beside the file; while
  // others write, nothing is tried (an rmdir locks the root against their renames, and
  // the next writer would make the directory again: a new inode each time). Fails
  // harmlessly (ENOTEMPTY) while writers of another process use it.
  void writer_closed() {
    if (writers_.fetch_sub(1, std::memory_order_acq_rel) == 1)
      (void)::unlinkat(root_fd_.get(), kTempDir, AT_REMOVEDIR);
  }

  // Removes temporary files left by dead processes of this host (kill -9, a crash).
  void reap() {
    int t = open_beneath(root_fd_.get(), kTempDir, O_RDONLY | O_DIRECTORY);
    if (t >= 0) reap_stale_temps(root_fd_.get(), t);
  }

 private:
  Status walk(const std::string& dir, const ListOptions& options, std::vector<std::string>& keys) {
    int fd = dir.empty() ? dup_fd(root_fd_.get())
                         : open_beneath(root_fd_.get(), dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0) {
      int err = -fd;
      if (err == ENOENT || err == ENOTDIR) return ok();  // nothing under this prefix
      return errno_error(err, "list", dir);
    }
    if (dir.empty()) {  // dup shares the offset; reopen to read the directory from start
      int d = ::openat(fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      ::close(fd);
      if (d < 0) return errno_error(errno, "list", ".");
      fd = d;
    }
    DIR* dp = ::fdopendir(fd);
    if (!dp) {
      ::close(fd);
      return errno_error(errno, "list", dir);
    }
    std::vector<std::pair<std::string, bool>> entries;
    while (struct dirent* e = ::readdir(dp)) {
      std::string name = e->d_name;
      if (name == "." || name == "..") continue;
      if (name == kTempDir) {
        int t = ::openat(::dirfd(dp), kTempDir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (t >= 0) reap_stale_temps(::dirfd(dp), t);
        continue;
      }
      if (is_legacy_temp(name)) continue;
      bool is_dir = e->d_type == DT_DIR;
      if (e->d_type == DT_UNKNOWN) {
        struct stat st;
        if (::fstatat(::dirfd(dp), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
        is_dir = S_ISDIR(st.st_mode);
      }
      entries.emplace_back(std::move(name), is_dir);
    }
    ::closedir(dp);
    for (auto& [name, is_dir] : entries) {
      std::string key = dir.empty() ? name : dir + "/" + name;
      if (is_dir) {
        // Descend only where keys under this directory can still match the prefix.
        std::string as_prefix = key + "/";
        if (as_prefix.starts_with(options.prefix) || options.prefix.starts_with(as_prefix))
          SLUICE_RETURN_IF_ERROR(walk(key, options, keys));
      } else if (key.starts_with(options.prefix) &&
                 (options.continuation.empty() || key > options.continuation)) {
        keys.push_back(std::move(key));
      }
    }
    return ok();
  }

  std::string root_;
  Fd root_fd_;
  std::atomic<int> writers_{0};  // writers whose temporary file is still there
};

Status PosixWriter::append(std::span<const std::byte> data) {
  auto st = write_at(size_.load(std::memory_order_relaxed), data);
  if (!st) abort();  // appends run on one thread: nothing else writes to fd_
  return st;
}

Status PosixWriter::write_at(uint64_t offset, std::span<const std::byte> data) {
  if (done_) return fail(Code::kInvalidArgument, "write to finished writer for '" + key_ + "'");
  // In pieces of 1 MiB: a 32 MiB pwrite makes the page cache allocate large folios, and on
  // these VMs memory not touched lately is slow to touch (the host backs it then); a 1 GiB
  // download from s3rver wrote at 314-508 MiB/s as whole parts, 638-755 MiB/s as 1 MiB
  // pieces, in alternating runs. 1 MiB still leaves the kernel large folios to make.
  constexpr size_t kPiece = 1 << 20;
  const std::string what = "object '" + key_ + "' in " + store_->uri();
  Status st = ok();
  for (size_t at = 0; st && at < data.size(); at += kPiece) {
    size_t n = std::min(kPiece, data.size() - at);
    st = pwrite_full(fd_.get(), data.subspan(at, n), offset + at, what);
  }
  if (!st) return std::unexpected(st.error());  // the caller aborts; other threads may write
  uint64_t end = offset + data.size();
  // Relaxed: commit (after every write_at returned, by the contract) reads the final value.
  for (uint64_t cur = size_.load(std::memory_order_relaxed);
       end > cur && !size_.compare_exchange_weak(cur, end, std::memory_order_relaxed);) {
  }
  return ok();
}

std::string PosixWriter::local_path() const {
  return done_ || tmp_.empty() ? std::string() : store_->root() + "/" + tmp_;
}

Status PosixWriter::commit() {
  if (done_) return fail(Code::kInvalidArgument, "commit of finished writer for '" + key_ + "'");
  auto where = [&](std::string_view op) {
    return std::string(op) + " object '" + key_ + "' in " + store_->uri();
  };
  // Blocks reserved for a size hint that was not reached are given back.
  const uint64_t size = size_.load(std::memory_order_relaxed);
  if (options_.size_hint && *options_.size_hint != size &&
      ::ftruncate(fd_.get(), static_cast<off_t>(size)) != 0)
    return failed(error_from_errno(errno, where("truncate")));
  if (options_.mtime_ns) {
    const timespec times[2] = {{0, UTIME_OMIT},
                               {static_cast<time_t>(*options_.mtime_ns / 1'000'000'000),
                                static_cast<long>(*options_.mtime_ns % 1'000'000'000)}};
    if (::futimens(fd_.get(), times) != 0)
      return failed(error_from_errno(errno, where("set the modification time of")));
  }
  if (options_.durable && ::fdatasync(fd_.get()) != 0)
    return failed(error_from_errno(errno, where("sync")));
  auto parent = store_->open_parent(key_, true, options_.durable);
  if (!parent) return failed(parent.error());
  auto& [dirfd, leaf] = *parent;
  if (auto st = store_->check_replaceable(dirfd.get(), leaf, key_); !st) return failed(st.error());
  // With an on_publish callback, publishes into this folder take turns (an flock on it),
  // so callbacks for one key run in publish order, across processes too.
  std::optional<Replaced> replaced;
  const bool hooked = static_cast<bool>(options_.on_publish);
  UniqueFd folder;  // the folder opened for its lock (dirfd may be an O_PATH descriptor)
  if (hooked) {
    folder = UniqueFd(::openat(dirfd.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    // A folder this process may write but not read (a drop box): publishes go unordered.
    if (!folder.valid() && errno != EACCES)
      return failed(error_from_errno(errno, where("open the folder to publish")));
    while (folder.valid() && ::flock(folder.get(), LOCK_EX) != 0) {
      if (errno == EINTR) continue;
      // A file system without flock (NFS emulating it on a read-only descriptor, Lustre
      // without -o flock): publishes go unordered there, as a drop box's do.
      if (errno == EBADF || errno == ENOLCK || errno == EOPNOTSUPP || errno == ENOSYS ||
          errno == EINVAL) {
        folder.reset();
        break;
      }
      return failed(error_from_errno(errno, where("lock the folder to publish")));
    }
  }
#if SLUICE_HAVE_RENAMEAT2
  // An overwrite learns exactly what it replaced, even with other writers racing it: a new
  // name is taken with RENAME_NOREPLACE, an existing one swapped with RENAME_EXCHANGE,
  // which leaves the replaced object at the temporary name to be measured and removed.
  int rc =
      ::renameat2(store_->root_fd(), tmp_.c_str(), dirfd.get(), leaf.c_str(), RENAME_NOREPLACE);
  if (rc == 0) replaced = Replaced{};
  if (rc != 0 && errno == EINVAL && options_.overwrite)  // no RENAME_NOREPLACE here
    rc = ::renameat(store_->root_fd(), tmp_.c_str(), dirfd.get(), leaf.c_str());
  for (int attempt = 0; rc != 0 && errno == EEXIST && options_.overwrite && attempt < 100;
       ++attempt) {
    rc = ::renameat2(store_->root_fd(), tmp_.c_str(), dirfd.get(), leaf.c_str(), RENAME_EXCHANGE);
    if (rc != 0) {
      if (errno == ENOENT) {  // removed meanwhile: take the name again
        rc = ::renameat2(store_->root_fd(), tmp_.c_str(), dirfd.get(), leaf.c_str(),
                         RENAME_NOREPLACE);
        if (rc == 0) replaced = Replaced{};
        continue;
      }
      if (errno == EINVAL)  // a file system without RENAME_EXCHANGE: a plain rename
        rc = ::renameat(store_->root_fd(), tmp_.c_str(), dirfd.get(), leaf.c_str());
      break;
    }
    struct stat old {};
    const bool seen = ::fstatat(store_->root_fd(), tmp_.c_str(), &old, AT_SYMLINK_NOFOLLOW) == 0;
    if (seen && S_ISLNK(old.st_mode)) {  // a link replaced, as a plain rename would: no object
      replaced = Replaced{};
      (void)::unlinkat(store_->root_fd(), tmp_.c_str(), 0);
      break;
    }
    if (seen && !S_ISREG(old.st_mode)) {
      // A directory (or anything else) made at the name meanwhile: put it back.
      (void)::renameat2(store_->root_fd(), tmp_.c_str(), dirfd.get(), leaf.c_str(),
                        RENAME_EXCHANGE);
      errno = EISDIR;
      rc = -1;
      break;
    }
    replaced = Replaced{true, static_cast<uint64_t>(old.st_size)};
    (void)::unlinkat(store_->root_fd(), tmp_.c_str(), 0);
  }
#else
  // Without renameat2, an exclusive publish is a hard link (which fails if the name exists)
  // followed by removing the temporary name.
  int rc = options_.overwrite
               ? ::renameat(store_->root_fd(), tmp_.c_str(), dirfd.get(), leaf.c_str())
               : ::linkat(store_->root_fd(), tmp_.c_str(), dirfd.get(), leaf.c_str(), 0);
  if (rc == 0 && !options_.overwrite) (void)::unlinkat(store_->root_fd(), tmp_.c_str(), 0);
#endif
  if (rc != 0) {
    int err = errno;
    folder.reset();  // unlocks
    if (err == EEXIST) return failed(Error(Code::kAlreadyExists, where("publish") + ": exists"));
    return failed(error_from_errno(err, where("publish")));
  }
  if (hooked && replaced) options_.on_publish(*replaced);
  folder.reset();  // unlocks: the next publish into the folder may go
  tmp_.clear();
  done_ = true;
  fd_.reset();
  store_->writer_closed();
  if (options_.durable) SLUICE_RETURN_IF_ERROR(sync_directory(dirfd.get(), where("publish")));
  return ok();
}

void PosixWriter::abort() {
  done_ = true;
  fd_.reset();
  if (!tmp_.empty()) {
    (void)::unlinkat(store_->root_fd(), tmp_.c_str(), 0);  // best effort: it is debris only
    tmp_.clear();
    store_->writer_closed();
  }
}

}  // namespace

bool is_reserved_key(std::string_view key) {
  const std::string t = kTempDir;
  return key == t || key.starts_with(t + "/") || key.ends_with("/" + t) ||
         key.find("/" + t + "/") != std::string_view::npos;
}

Result<std::unique_ptr<Store>> make_posix_store_without_symlinks(std::string root) {
  if (!root.starts_with('/'))
    return fail(Code::kInvalidArgument, "store directory '" + root + "' is not an absolute path");
  long fd = -1;
#if SLUICE_HAVE_OPENAT2
  struct open_how how = {};
  how.flags = O_PATH | O_DIRECTORY | O_CLOEXEC;
  how.resolve = RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
  do {
    fd = ::syscall(SYS_openat2, AT_FDCWD, root.c_str(), &how, sizeof how);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0 && errno != ENOSYS && errno != EPERM) {
    if (errno == ELOOP)
      return fail(Code::kPermissionDenied,
                  "store directory '" + root + "': a component of its path is a symlink");
    return fail_errno(errno, "open store directory '" + root + "'");
  }
#endif
  if (fd < 0) {  // no openat2: each component opened without following a symlink
    UniqueFd slash(::open("/", O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!slash.valid()) return fail_errno(errno, "open /");
    std::string rest = root.substr(1);
    while (rest.ends_with('/')) rest.pop_back();
    fd = rest.empty() ? ::dup(slash.get()) : open_beneath(slash.get(), rest, O_PATH | O_DIRECTORY);
    if (fd < 0) {
      if (-fd == ELOOP)
        return fail(Code::kPermissionDenied,
                    "store directory '" + root + "': a component of its path is a symlink");
      return fail_errno(static_cast<int>(-fd), "open store directory '" + root + "'");
    }
  }
  auto store = std::make_unique<PosixStore>(std::move(root), Fd(static_cast<int>(fd)));
  store->reap();
  return std::unique_ptr<Store>(std::move(store));
}

std::unique_ptr<Store> make_posix_store(std::string root) {
  int fd = ::open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  // open_store checked the directory; if it vanished since, every call reports it.
  auto store = std::make_unique<PosixStore>(std::move(root), Fd(fd));
  store->reap();
  return store;
}

}  // namespace sluice::store
