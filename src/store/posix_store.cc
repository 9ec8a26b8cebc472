// file:// — objects as files under a root directory, for local and shared file systems.
//
// Every path is resolved relative to an open descriptor of the root with
// openat2(RESOLVE_BENEATH), so neither ".." nor a symlink can reach outside the root (on a
// kernel without openat2, each component is opened with O_NOFOLLOW instead). A Writer
// writes to a temporary file under <root>/.sluice-tmp/, fdatasyncs it on commit, renames
// it into place (renameat2 RENAME_NOREPLACE when overwrite is off) and fsyncs the
// directory, so a crash leaves either the old object or the new one, and at worst a
// temporary file that listings never show.
#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <random>

#include "sluice/store.h"

namespace sluice::store {
namespace {

constexpr const char* kTempDir = ".sluice-tmp";

// An owned file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  ~Fd() { reset(); }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  int get() const { return fd_; }

 private:
  int fd_ = -1;
};

std::atomic<bool> g_no_openat2{false};  // set once if the kernel lacks openat2

// Opens `path` (relative, validated) beneath `dirfd`. Returns an fd or -errno.
int open_beneath(int dirfd, const std::string& path, int flags, mode_t mode = 0) {
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

std::string etag_of(const struct stat& st) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%lx-%lx-%lx", static_cast<unsigned long>(st.st_ino),
                static_cast<unsigned long>(st.st_size),
                static_cast<unsigned long>(st.st_mtim.tv_sec * 1000000000L + st.st_mtim.tv_nsec));
  return buf;
}

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
  uint64_t size() const override { return size_; }

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
  uint64_t size_ = 0;
  bool done_ = false;
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
    int fd = open_beneath(root_fd_.get(), k, O_RDONLY);
    if (fd < 0) return errno_error(-fd, "open", k);
    Fd guard(fd);
    if (!options.if_match.empty()) {
      struct stat st;
      if (::fstat(fd, &st) != 0) return errno_error(errno, "stat", k);
      if (etag_of(st) != options.if_match)
        return fail(Code::kConflict, "object '" + k + "' in " + uri() +
                                         " changed: etag is no longer " + options.if_match);
    }
    size_t done = 0;
    while (done < dst.size()) {
      ssize_t n =
          ::pread(fd, dst.data() + done, dst.size() - done, static_cast<off_t>(offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0)
        return errno_error(errno, "read at offset " + std::to_string(offset + done) + " of", k);
      if (n == 0) break;
      done += static_cast<size_t>(n);
    }
    return done;
  }

  Result<std::unique_ptr<Writer>> create(std::string_view key,
                                         const WriteOptions& options) override {
    SLUICE_RETURN_IF_ERROR(validate_key(key));
    std::string k(key);
    if (k == kTempDir || k.starts_with(std::string(kTempDir) + "/"))
      return fail(Code::kInvalidArgument, "key '" + k + "' is reserved for temporary files");
    if (::mkdirat(root_fd_.get(), kTempDir, 0755) != 0 && errno != EEXIST)
      return errno_error(errno, "create temporary directory for", k);
    static std::atomic<uint64_t> counter{0};
    thread_local std::mt19937_64 rng{std::random_device{}()};
    char name[96];
    std::snprintf(name, sizeof name, "%s/%d-%lu-%016lx", kTempDir, static_cast<int>(::getpid()),
                  static_cast<unsigned long>(counter.fetch_add(1, std::memory_order_relaxed)),
                  static_cast<unsigned long>(rng()));
    int fd = open_beneath(root_fd_.get(), name, O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd < 0) return errno_error(-fd, "create temporary file for", k);
    return std::make_unique<PosixWriter>(this, k, options, Fd(fd), name);
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
      if (page.objects.size() == options.max_keys) {
        page.next_token = page.objects.back().key;
        break;
      }
      auto info = stat(*it);
      if (!info) {
        if (info.error().code() == Code::kNotFound) continue;  // removed while listing
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

  // Opens the directory that holds `key` (creating it if asked) and returns it with the
  // key's last component.
  Result<std::pair<Fd, std::string>> open_parent(const std::string& key, bool create) {
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
                      ? ::dup(root_fd_.get())
                      : open_beneath(root_fd_.get(), sub.substr(0, up), O_PATH | O_DIRECTORY);
        if (pfd < 0) return errno_error(pfd == -1 ? errno : -pfd, "open directory for", key);
        Fd pguard(pfd);
        std::string leaf = up == std::string::npos ? sub : sub.substr(up + 1);
        if (::mkdirat(pfd, leaf.c_str(), 0755) != 0) {
          if (errno == EEXIST) continue;  // another writer made it
          return errno_error(errno, "create directory '" + sub + "' for", key);
        }
        // A new directory's entry must be durable too, or a committed object below it can
        // vanish in a crash. (pfd is O_PATH; fsync needs a readable descriptor.)
        int d = ::openat(pfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (d < 0 || ::fsync(d) != 0) {
          int err = errno;
          if (d >= 0) ::close(d);
          return errno_error(err, "sync directory holding '" + sub + "' for", key);
        }
        ::close(d);
      }
    }
    int fd = open_beneath(root_fd_.get(), dir, O_PATH | O_DIRECTORY);
    if (fd < 0) return errno_error(-fd, "open directory of", key);
    return std::pair{Fd(fd), key.substr(slash + 1)};
  }

  std::unexpected<Error> errno_error(int err, std::string_view op, std::string_view key) const {
    return std::unexpected(
        error_from_errno(err, std::string(op) + " object '" + std::string(key) + "' in " + uri()));
  }

  int root_fd() const { return root_fd_.get(); }

 private:
  Status walk(const std::string& dir, const ListOptions& options, std::vector<std::string>& keys) {
    int fd = dir.empty() ? ::dup(root_fd_.get())
                         : open_beneath(root_fd_.get(), dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0) {
      int err = fd == -1 ? errno : -fd;
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
      if (dir.empty() && name == kTempDir) continue;
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
};

Status PosixWriter::append(std::span<const std::byte> data) {
  if (done_) return fail(Code::kInvalidArgument, "append to finished writer for '" + key_ + "'");
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::write(fd_.get(), data.data() + off, data.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      return failed(error_from_errno(errno, "write " + std::to_string(data.size() - off) +
                                                " bytes at offset " + std::to_string(size_ + off) +
                                                " of object '" + key_ + "' in " + store_->uri()));
    off += static_cast<size_t>(n);
  }
  size_ += data.size();
  return ok();
}

Status PosixWriter::commit() {
  if (done_) return fail(Code::kInvalidArgument, "commit of finished writer for '" + key_ + "'");
  auto where = [&](std::string_view op) {
    return std::string(op) + " object '" + key_ + "' in " + store_->uri();
  };
  if (::fdatasync(fd_.get()) != 0) return failed(error_from_errno(errno, where("sync")));
  auto parent = store_->open_parent(key_, true);
  if (!parent) return failed(parent.error());
  auto& [dirfd, leaf] = *parent;
  int rc = ::renameat2(store_->root_fd(), tmp_.c_str(), dirfd.get(), leaf.c_str(),
                       options_.overwrite ? 0 : RENAME_NOREPLACE);
  if (rc != 0) {
    int err = errno;
    if (err == EEXIST) return failed(Error(Code::kAlreadyExists, where("publish") + ": exists"));
    return failed(error_from_errno(err, where("publish")));
  }
  tmp_.clear();
  done_ = true;
  fd_.reset();
  int d = ::openat(dirfd.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (d < 0) return std::unexpected(error_from_errno(errno, where("sync directory of")));
  Fd dguard(d);
  if (::fsync(d) != 0) return std::unexpected(error_from_errno(errno, where("sync directory of")));
  return ok();
}

void PosixWriter::abort() {
  done_ = true;
  fd_.reset();
  if (!tmp_.empty()) {
    ::unlinkat(store_->root_fd(), tmp_.c_str(), 0);
    tmp_.clear();
  }
}

}  // namespace

std::unique_ptr<Store> make_posix_store(std::string root) {
  int fd = ::open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  // open_store checked the directory; if it vanished since, every call reports it.
  return std::make_unique<PosixStore>(std::move(root), Fd(fd));
}

}  // namespace sluice::store
