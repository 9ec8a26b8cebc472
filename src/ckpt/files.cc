// Files and directories as checkpoints (sluice/ckpt/files.h).
#include "sluice/ckpt/files.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>

#include "sluice/ckpt/live.h"
#include "sluice/ckpt/manifest.h"
#include "sluice/core/fd.h"
#include "sluice/store/store.h"

namespace sluice::ckpt {

namespace {

namespace fs = std::filesystem;

// A file to save, pinned to what it was when the save began: its bytes are read only while
// the file is still that (device, inode, size, modification and change times), so one
// rewritten in place during the save fails it with Conflict instead of committing a mix.
struct InputFile {
  std::string name;  // the tensor name: the path relative to the argument
  std::string path;
  uint64_t size = 0;
  uint32_t mode = 0;  // permission bits, restored with the file
  struct stat identity {};
};

bool same_file(const struct stat& a, const struct stat& b) {
  return a.st_dev == b.st_dev && a.st_ino == b.st_ino && a.st_size == b.st_size &&
         a.st_mtim.tv_sec == b.st_mtim.tv_sec && a.st_mtim.tv_nsec == b.st_mtim.tv_nsec &&
         a.st_ctim.tv_sec == b.st_ctim.tv_sec && a.st_ctim.tv_nsec == b.st_ctim.tv_nsec;
}

// Whether `inner` is `outer` or lies below it (both canonical).
bool within(const fs::path& inner, const fs::path& outer) {
  auto [o, i] = std::mismatch(outer.begin(), outer.end(), inner.begin(), inner.end());
  return o == outer.end();
}

Result<std::vector<InputFile>> collect_files(const std::vector<std::string>& args) {
  std::vector<InputFile> files;
  std::map<std::string, std::string> seen;  // name -> path
  // `follow`: p was a link (to a file inside the tree, checked) and is pinned to its target;
  // anything else is pinned as itself, so a file swapped for a link later is a Conflict.
  auto add = [&](std::string name, const fs::path& p, bool follow) -> Status {
    // Names become paths on restore: refuse here what restore would refuse there.
    Status st = store::validate_key(name);
    if (st && store::is_reserved_key(name))
      st = fail(Code::kInvalidArgument, "a .sluice-tmp component is reserved");
    if (st && !valid_utf8(name)) st = fail(Code::kInvalidArgument, "the name is not UTF-8");
    if (!st)
      return fail(Code::kInvalidArgument, p.string() + " cannot be saved under the name '" +
                                              name.substr(0, 200) + "': " + st.error().message());
    auto [it, fresh] = seen.emplace(name, p.string());
    if (!fresh)
      return fail(Code::kInvalidArgument, "two inputs would be saved as '" + name +
                                              "': " + it->second + " and " + p.string());
    InputFile f{std::move(name), p.string(), 0, 0, {}};
    if ((follow ? ::stat(f.path.c_str(), &f.identity) : ::lstat(f.path.c_str(), &f.identity)) != 0)
      return fail_errno(errno, "stat " + f.path);
    if (!S_ISREG(f.identity.st_mode))
      return fail(Code::kInvalidArgument, f.path + " is no longer a regular file");
    f.size = static_cast<uint64_t>(f.identity.st_size);
    f.mode = static_cast<uint32_t>(f.identity.st_mode & 07777);
    files.push_back(std::move(f));
    return ok();
  };
  for (const auto& arg : args) {
    std::error_code ec;
    auto st = fs::status(arg, ec);
    if (ec) return fail(Code::kNotFound, "cannot read " + arg + ": " + ec.message());
    if (fs::is_regular_file(st)) {
      SLUICE_RETURN_IF_ERROR(add(fs::path(arg).filename().string(), arg, true));
      continue;
    }
    const fs::path top = fs::canonical(arg, ec);
    if (ec) return fail(Code::kNotFound, "cannot resolve " + arg + ": " + ec.message());
    if (!fs::is_directory(st))
      return fail(Code::kInvalidArgument, arg + " is not a regular file or a directory");
    std::vector<fs::path> found;
    for (auto it = fs::recursive_directory_iterator(arg, ec); !ec && it != fs::end(it);
         it.increment(ec)) {
      // A link to a file is saved under the link's own name; a link to a directory is
      // refused rather than skipped (it is not followed: loops, and trees saved twice).
      if (it->is_symlink(ec) && it->is_directory(ec))
        return fail(Code::kInvalidArgument, it->path().string() +
                                                " is a symbolic link to a directory: give the "
                                                "directory as an argument of its own");
      // A link to a file inside the tree is saved under its own name; one that leads out of
      // the tree (to /etc/shadow, say) is refused, as `cp -r` does.
      if (it->is_symlink(ec)) {
        std::error_code rec;
        const fs::path target = fs::canonical(it->path(), rec);
        if (rec || !within(target, top))
          return fail(Code::kInvalidArgument,
                      it->path().string() + " is a symbolic link leading out of " + arg +
                          (rec ? " (or dangling)" : " (to " + target.string() + ")") +
                          ": only what lies in the tree is saved");
      }
      if (it->is_regular_file(ec))
        found.push_back(it->path());
      else if (!it->is_directory(ec))
        return fail(Code::kInvalidArgument, it->path().string() +
                                                " is not a regular file (FIFOs, devices, sockets "
                                                "and dangling links are not saved)");
    }
    if (ec) return fail(Code::kIoError, "listing " + arg + ": " + ec.message());
    std::sort(found.begin(), found.end());
    for (const auto& p : found) {
      std::error_code lec;
      SLUICE_RETURN_IF_ERROR(
          add(p.lexically_relative(arg).generic_string(), p, fs::is_symlink(p, lec)));
    }
  }
  if (files.empty()) return fail(Code::kInvalidArgument, "nothing to save: no files in the inputs");
  return files;
}

// Reads a file's bytes as staging asks for them (opened per call, so a directory of many
// files holds no descriptors); a file that changes size while being saved fails the save.
TensorView file_tensor(const InputFile& f) {
  TensorView v;
  v.name = f.name;
  v.shape = {static_cast<int64_t>(f.size)};
  v.bytes = f.size;
  v.mode = f.mode;
  v.source = [path = f.path, size = f.size, id = f.identity](uint64_t off,
                                                             std::span<std::byte> dst) -> Status {
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
    if (!fd.valid()) return fail_errno(errno, "open " + path);
    auto changed = [&]() -> Status {
      struct stat st;
      if (::fstat(fd.get(), &st) != 0) return fail_errno(errno, "stat " + path);
      if (!S_ISREG(st.st_mode) || !same_file(st, id))
        return fail(Code::kConflict, path + " changed while being saved (it was " +
                                         std::to_string(size) +
                                         " bytes): nothing of this step was committed");
      return ok();
    };
    SLUICE_RETURN_IF_ERROR(changed());
    size_t got = 0;
    while (got < dst.size()) {
      ssize_t n =
          ::pread(fd.get(), dst.data() + got, dst.size() - got, static_cast<off_t>(off + got));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return fail_errno(errno, "read " + path);
      if (n == 0) return fail(Code::kConflict, path + " shrank while being saved");
      got += static_cast<size_t>(n);
    }
    return changed();  // a write during the read shows in the times
  };
  return v;
}

// One file of a restore: the tensor it comes from and its key under the directory.
struct RestoreItem {
  unsigned rank;
  const TensorEntry* tensor;
  std::string key;
};

// The files a restore writes, each name checked as a key and, unless replacing, checked to
// be absent from `out` (the directory's store; null when replacing): before anything is
// written.
Result<std::vector<RestoreItem>> restore_items(const Manifest& m, const RestoreFilesOptions& o,
                                               store::Store* out) {
  std::vector<RestoreItem> items;
  for (const auto& s : m.shards) {
    if (o.only_rank >= 0 && s.rank != static_cast<unsigned>(o.only_rank)) continue;
    for (const auto& t : s.tensors) {
      std::string key =
          (m.world > 1 && o.only_rank < 0 ? "rank-" + std::to_string(s.rank) + "/" : "") + t.name;
      Status st = store::validate_key(key);
      if (st && store::is_reserved_key(key))
        st = fail(Code::kInvalidArgument, "a .sluice-tmp component is reserved");
      if (!st)
        return fail(
            Code::kCorruption,
            "tensor name '" + t.name + "' is not a safe relative path: " + st.error().message());
      std::error_code lec;
      if (out && (fs::symlink_status(fs::path(o.directory) / key, lec).type() !=
                      fs::file_type::not_found ||
                  out->stat(key)))
        return fail(Code::kAlreadyExists,
                    o.directory + "/" + key + " exists (use --force to replace it)");
      items.push_back({s.rank, &t, std::move(key)});
    }
  }
  if (items.empty()) return fail(Code::kNotFound, "no tensors to restore");
  return items;
}

// All or nothing holds one descriptor per file until the end: a restore that would pass
// the limit is refused before it starts (the caller may raise it first).
Status enough_descriptors(size_t files) {
  struct rlimit nofile {};
  if (::getrlimit(RLIMIT_NOFILE, &nofile) != 0) return fail_errno(errno, "getrlimit");
  if (files + 64 > nofile.rlim_cur)
    return fail(Code::kInvalidArgument, "restoring " + std::to_string(files) +
                                            " files at once needs as many open files; " +
                                            "the limit here is " + std::to_string(nofile.rlim_cur) +
                                            " (raise ulimit -n, or restore part with --rank)");
  return ok();
}

// This process's umask, read without changing it (umask(2) can only set it, and setting it
// back races with other threads creating files): /proc/self/status says it since Linux 4.7.
mode_t current_umask() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.starts_with("Umask:"))
      return static_cast<mode_t>(std::stoul(line.substr(6), nullptr, 8));
  return 022;  // an older kernel: the common default
}

// Publishes every written file (renamed into place) with the mode it was saved with: into
// the directory itself, or into the staging tree (`staged`), which is put in place after.
Status publish(const std::vector<RestoreItem>& items,
               std::map<size_t, std::unique_ptr<store::Writer>>& writers,
               const RestoreFilesOptions& o, bool staged) {
  // A file saved without a mode (a tensor, an older checkpoint) gets 0644 less the umask, as
  // a new file would.
  const mode_t mask = current_umask();
  for (size_t i = 0; i < items.size(); ++i) {
    auto& w = writers[i];
    if (!w) continue;
    // The manifest is untrusted: no setuid, setgid or sticky bit comes back from it, and the
    // umask narrows a mode as it would a new file's.
    const mode_t mode =
        (items[i].tensor->mode ? static_cast<mode_t>(items[i].tensor->mode) : mode_t{0644}) & 0777 &
        ~mask;
    if (const std::string tmp = w->local_path(); !tmp.empty() && ::chmod(tmp.c_str(), mode) != 0)
      return fail_errno(errno, "chmod " + o.directory + "/" + items[i].key);
    if (auto st = w->commit(); !st)
      return std::unexpected(st.error().with_context(
          staged ? "in the staging tree; " + o.directory + " is as it was"
                 : std::to_string(i) + " of " + std::to_string(items.size()) +
                       " files were published before this one failed"));
  }
  return ok();
}

// ---------------------------------------------------------------------------------------
// Replacing a directory in one step (RestoreFilesOptions::replace, `restore --force`).
//
// The new tree is built in a staging directory beside the target, "<parent>/.sluice-restore-
// <random>", and swapped with the target by one renameat2(RENAME_EXCHANGE); the old tree,
// then under the staging name, is removed after. A reader sees the old tree or the new one,
// never a mix, and a failure before the swap leaves the target as it was. While it runs, a
// restore holds an open-file-description lock on "<staging name>.lock" (its text: the live
// marker of live.h, then the target's name in hex): the kernel drops it when the process
// dies, so the next restore beside that target removes what a killed one left.

constexpr std::string_view kStagingPrefix = ".sluice-restore-";

// Takes a write lock on the whole file; the kernel drops it when its owner dies.
bool lock_whole_file(int fd) {
  struct flock fl = {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  return ::fcntl(fd, F_OFD_SETLK, &fl) == 0;
}

bool no_locks_here(int err) {
  return err == ENOLCK || err == EOPNOTSUPP || err == EINVAL;
}

std::string to_hex(std::string_view s) {
  std::string out;
  char b[3];
  for (unsigned char c : s) {
    std::snprintf(b, sizeof b, "%02x", c);
    out += b;
  }
  return out;
}

std::string from_hex(std::string_view h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) {
    unsigned v = 0;
    if (std::sscanf(std::string(h.substr(i, 2)).c_str(), "%2x", &v) != 1) return "";
    out += static_cast<char>(v);
  }
  return out;
}

// A listing of the directory `dirfd` refers to, through a descriptor of its own (closed
// with the listing); null with errno set.
DIR* open_listing(int dirfd) {
  UniqueFd d(::openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  DIR* dp = d.valid() ? ::fdopendir(d.get()) : nullptr;
  if (dp) (void)d.release();
  return dp;
}

bool exists_at(int dirfd, const std::string& name) {
  struct stat st;
  return ::fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0;
}

// A name a lock file may give back as the target: one component of a directory.
bool plain_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

// Removes what restores that died left in `parent` (whose descriptor is `pfd`): a staging
// tree (a partial new tree, or after the swap the old one), and an old tree set aside by
// the swap without RENAME_EXCHANGE, which goes back in place when the target is missing.
// A restore is dead when its lock can be taken, or, on a file system without locks, when
// its marker proves its process gone (live_owner_gone). Best effort: what cannot be removed
// waits for the next run.
void reap_dead_restores(const fs::path& parent, int pfd) {
  std::vector<std::string> locks;
  if (DIR* dp = open_listing(pfd)) {
    while (const struct dirent* e = ::readdir(dp)) {
      const std::string_view n = e->d_name;
      if (n.starts_with(kStagingPrefix) && (n.ends_with(".lock") || n.ends_with(".lock.tmp")))
        locks.emplace_back(n);
    }
    ::closedir(dp);
  }
  for (const std::string& name : locks) {
    UniqueFd fd(::openat(pfd, name.c_str(), O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
    struct stat st;
    if (!fd.valid() || ::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    std::string text(4096, '\0');
    const ssize_t n = ::pread(fd.get(), text.data(), text.size(), 0);
    text.resize(n > 0 ? static_cast<size_t>(n) : 0);
    const size_t eol = text.find('\n');
    bool dead = lock_whole_file(fd.get());
    if (!dead && no_locks_here(errno))
      dead = eol != std::string::npos && live_owner_gone(text.substr(0, eol + 1));
    if (!dead) continue;
    if (name.ends_with(".tmp")) {
      // A restore that died while making its lock: nothing else of it exists. One still
      // making it (between create and lock) is left a minute.
      const auto age = std::chrono::system_clock::now().time_since_epoch() -
                       std::chrono::seconds(st.st_mtim.tv_sec);
      if (age > std::chrono::minutes(1)) (void)::unlinkat(pfd, name.c_str(), 0);
      continue;
    }
    const std::string stem = name.substr(0, name.size() - 5);  // less ".lock"
    const std::string target =
        eol == std::string::npos
            ? ""
            : from_hex(text.substr(eol + 1, text.find('\n', eol + 1) - eol - 1));
    std::error_code ec;
    if (exists_at(pfd, stem + ".old")) {
      if (plain_name(target) && !exists_at(pfd, target))
        (void)::renameat(pfd, (stem + ".old").c_str(), pfd, target.c_str());
      else
        fs::remove_all(parent / (stem + ".old"), ec);
    }
    fs::remove_all(parent / stem, ec);
    if (!exists_at(pfd, stem) && !exists_at(pfd, stem + ".old"))
      (void)::unlinkat(pfd, name.c_str(), 0);
  }
}

class StagedTree {
 public:
  // Removes what dead restores left beside `directory`, then makes the staging directory
  // (mode 0700 until it is put in place) and its lock. InvalidArgument for a target that
  // is not a directory, or a mount point (it cannot be renamed); the parent must be
  // writable.
  static Result<std::unique_ptr<StagedTree>> open(const std::string& directory);
  StagedTree(const StagedTree&) = delete;
  StagedTree& operator=(const StagedTree&) = delete;
  // Unless put in place: removes the staging tree and its lock.
  ~StagedTree();

  std::string path() const { return (parent_ / name_).string(); }
  // Hard-links what the target holds that `keys` (the restored files) do not name into
  // the staging tree, and makes its directories there with their modes: what --force does
  // not replace is kept. A directory where a file is restored, or a file where one is
  // restored below, is AlreadyExists; a mount point inside the target InvalidArgument.
  Status carry_over(const std::set<std::string>& keys);
  // Puts the staging tree in place (the target's mode on its top directory) in one step,
  // then removes the old tree.
  Status put_in_place();

 private:
  StagedTree() = default;
  Status carry_dir(int from, int to, const std::string& rel, const std::set<std::string>& keys,
                   const std::set<std::string>& dirs);
  std::string shown(const std::string& rel) const {
    return rel.empty() ? target_.string() : (target_ / rel).string();
  }

  fs::path target_, parent_;
  std::string base_, name_;  // the target's name, the staging directory's
  UniqueFd parent_fd_, lock_fd_;
  bool target_existed_ = false;
  struct stat target_st_ {};
  std::vector<std::pair<std::string, mode_t>> dir_modes_;  // carried directories, by path
  bool placed_ = false;
};

Result<std::unique_ptr<StagedTree>> StagedTree::open(const std::string& directory) {
  std::unique_ptr<StagedTree> t(new StagedTree());
  std::error_code ec;
  fs::path target = fs::weakly_canonical(fs::absolute(directory, ec), ec);
  if (ec) return fail(Code::kInvalidArgument, "resolve " + directory + ": " + ec.message());
  if (!target.has_filename()) target = target.parent_path();  // "out/"
  if (target == target.root_path())
    return fail(Code::kInvalidArgument, "cannot replace " + target.string() + " in one step");
  t->target_ = target;
  t->parent_ = target.parent_path();
  t->base_ = target.filename().string();
  fs::create_directories(t->parent_, ec);
  if (ec) return fail(Code::kIoError, "create " + t->parent_.string() + ": " + ec.message());
  t->parent_fd_ = UniqueFd(::open(t->parent_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!t->parent_fd_.valid()) return fail_errno(errno, "open " + t->parent_.string());
  const int pfd = t->parent_fd_.get();
  struct stat pst;
  if (::fstat(pfd, &pst) != 0) return fail_errno(errno, "stat " + t->parent_.string());
  if (::fstatat(pfd, t->base_.c_str(), &t->target_st_, AT_SYMLINK_NOFOLLOW) == 0) {
    t->target_existed_ = true;
    if (!S_ISDIR(t->target_st_.st_mode))
      return fail(Code::kInvalidArgument, target.string() + " is not a directory");
    if (t->target_st_.st_dev != pst.st_dev)
      return fail(Code::kInvalidArgument,
                  target.string() +
                      " is a mount point: --force replaces the directory in one step, which a "
                      "mount point cannot be (restore into a directory inside it)");
  } else if (errno != ENOENT) {
    return fail_errno(errno, "stat " + target.string());
  }
  reap_dead_restores(t->parent_, pfd);

  // The lock is made under a name no reaper takes at once, locked, then renamed: a lock
  // file is always locked or its owner gone.
  std::random_device rd;
  char id[17];
  std::snprintf(id, sizeof id, "%08x%08x", rd(), rd());
  const std::string name = std::string(kStagingPrefix) + id;
  const std::string beside = "--force replaces " + target.string() +
                             " in one step, through a directory made beside it in " +
                             t->parent_.string();
  const std::string tmp = name + ".lock.tmp";
  t->lock_fd_ = UniqueFd(
      ::openat(pfd, tmp.c_str(), O_CREAT | O_EXCL | O_RDWR | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!t->lock_fd_.valid()) return fail_errno(errno, beside + ": create " + tmp);
  if (!lock_whole_file(t->lock_fd_.get()) && !no_locks_here(errno)) {
    const int err = errno;
    (void)::unlinkat(pfd, tmp.c_str(), 0);
    return fail_errno(err, beside + ": lock " + tmp);
  }
  const std::string text = live_text() + to_hex(t->base_) + "\n";
  Status wrote = write_full(t->lock_fd_.get(), std::as_bytes(std::span(text)), beside + ": " + tmp);
  if (wrote && ::renameat(pfd, tmp.c_str(), pfd, (name + ".lock").c_str()) != 0)
    wrote = fail_errno(errno, beside + ": rename " + tmp);
  if (!wrote) {
    (void)::unlinkat(pfd, tmp.c_str(), 0);
    return std::unexpected(wrote.error());
  }
  t->name_ = name;  // from here the destructor removes what exists of it
  if (::mkdirat(pfd, name.c_str(), 0700) != 0) return fail_errno(errno, beside + ": mkdir " + name);
  return t;
}

StagedTree::~StagedTree() {
  if (name_.empty()) return;
  if (!placed_) {
    std::error_code ec;
    fs::remove_all(parent_ / name_, ec);
  }
  // What could not be removed keeps its lock: the next run beside the target removes it.
  if (!exists_at(parent_fd_.get(), name_) && !exists_at(parent_fd_.get(), name_ + ".old"))
    (void)::unlinkat(parent_fd_.get(), (name_ + ".lock").c_str(), 0);
}

Status StagedTree::carry_dir(int from, int to, const std::string& rel,
                             const std::set<std::string>& keys, const std::set<std::string>& dirs) {
  DIR* dp = open_listing(from);
  if (!dp) return fail_errno(errno, "list " + shown(rel));
  std::vector<std::string> names;
  while (const struct dirent* e = ::readdir(dp)) {
    const std::string_view n = e->d_name;
    // The file store's temporary files are no part of the tree.
    if (n != "." && n != ".." && n != ".sluice-tmp") names.emplace_back(n);
  }
  ::closedir(dp);
  for (const std::string& n : names) {
    const std::string path = rel.empty() ? n : rel + "/" + n;
    struct stat st;
    if (::fstatat(from, n.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0)
      return fail_errno(errno, "stat " + shown(path));
    if (!S_ISDIR(st.st_mode)) {
      if (keys.contains(path)) continue;  // replaced by the restored file
      if (dirs.contains(path))
        return fail(Code::kAlreadyExists, shown(path) +
                                              " is a file, and the step restores files below a "
                                              "directory of that name: remove it first");
      if (::linkat(from, n.c_str(), to, n.c_str(), 0) != 0)
        return fail_errno(errno, "link " + shown(path) + " into the new tree (to keep it)");
      continue;
    }
    if (keys.contains(path))
      return fail(Code::kAlreadyExists, shown(path) +
                                            " is a directory, and the step restores a file of "
                                            "that name: remove it first");
    if (st.st_dev != target_st_.st_dev)
      return fail(Code::kInvalidArgument, shown(path) +
                                              " is a mount point: --force cannot replace " +
                                              target_.string() + " in one step with it inside");
    if (::mkdirat(to, n.c_str(), 0700) != 0)
      return fail_errno(errno, "mkdir " + path + " in " + this->path());
    UniqueFd sub_from(::openat(from, n.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    UniqueFd sub_to(::openat(to, n.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!sub_from.valid()) return fail_errno(errno, "open " + shown(path));
    if (!sub_to.valid()) return fail_errno(errno, "open " + path + " in the new tree");
    (void)::fchown(sub_to.get(), st.st_uid, st.st_gid);  // where allowed
    dir_modes_.emplace_back(path, st.st_mode & 07777);
    SLUICE_RETURN_IF_ERROR(carry_dir(sub_from.get(), sub_to.get(), path, keys, dirs));
  }
  if (::fsync(to) != 0) return fail_errno(errno, "sync " + shown(rel) + " in the new tree");
  return ok();
}

Status StagedTree::carry_over(const std::set<std::string>& keys) {
  if (!target_existed_) return ok();
  std::set<std::string> dirs;  // every directory the keys lie below
  for (const std::string& k : keys)
    for (size_t at = k.find('/'); at != std::string::npos; at = k.find('/', at + 1))
      dirs.insert(k.substr(0, at));
  UniqueFd from(
      ::openat(parent_fd_.get(), base_.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!from.valid()) return fail_errno(errno, "open " + target_.string());
  UniqueFd to(
      ::openat(parent_fd_.get(), name_.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!to.valid()) return fail_errno(errno, "open " + path());
  return carry_dir(from.get(), to.get(), "", keys, dirs);
}

Status StagedTree::put_in_place() {
  const int pfd = parent_fd_.get();
  UniqueFd top(::openat(pfd, name_.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!top.valid()) return fail_errno(errno, "open " + path());
  // The file store's temporary directory, empty once every file is published.
  if (::unlinkat(top.get(), ".sluice-tmp", AT_REMOVEDIR) != 0 && errno != ENOENT)
    return fail_errno(errno, "remove " + path() + "/.sluice-tmp");
  for (const auto& [rel, mode] : dir_modes_)
    if (::fchmodat(top.get(), rel.c_str(), mode, 0) != 0)
      return fail_errno(errno, "chmod " + rel + " in " + path());
  if (target_existed_) {
    (void)::fchown(top.get(), target_st_.st_uid, target_st_.st_gid);
    if (::fchmod(top.get(), target_st_.st_mode & 07777) != 0)
      return fail_errno(errno, "chmod " + path());
  } else if (::fchmod(top.get(), 0777 & ~current_umask()) != 0) {
    return fail_errno(errno, "chmod " + path());
  }
  if (::fsync(top.get()) != 0) return fail_errno(errno, "sync " + path());
  const std::string what = "put " + path() + " in place of " + target_.string();
  std::string old = name_;  // where the old tree is once the new one is in place
  int rc = ::renameat2(pfd, name_.c_str(), pfd, base_.c_str(),
                       target_existed_ ? RENAME_EXCHANGE : RENAME_NOREPLACE);
  if (rc != 0 && (errno == EINVAL || errno == ENOSYS)) {
    // No RENAME_EXCHANGE (NFS, some FUSE file systems): the old tree is set aside, then the
    // new one renamed in. In between the target is missing, never a mix; a restore killed
    // there has the old tree put back by the next run (reap_dead_restores).
    if (target_existed_) {
      old = name_ + ".old";
      rc = ::renameat(pfd, base_.c_str(), pfd, old.c_str());
      if (rc == 0 && ::renameat(pfd, name_.c_str(), pfd, base_.c_str()) != 0) {
        const int err = errno;
        (void)::renameat(pfd, old.c_str(), pfd, base_.c_str());
        return fail_errno(err, what);
      }
    } else {
      rc = ::renameat(pfd, name_.c_str(), pfd, base_.c_str());
    }
  }
  if (rc != 0) return fail_errno(errno, what);
  placed_ = true;
  SLUICE_RETURN_IF_ERROR(sync_directory(pfd, target_.string()));
  if (target_existed_) {
    std::error_code ec;
    fs::remove_all(parent_ / old, ec);  // what stays keeps its lock (see the destructor)
  }
  return ok();
}

}  // namespace

Result<std::vector<TensorView>> file_tensors(const std::vector<std::string>& paths) {
  SLUICE_ASSIGN_OR_RETURN(std::vector<InputFile> files, collect_files(paths));
  std::vector<TensorView> views;
  for (const InputFile& f : files) views.push_back(file_tensor(f));
  return views;
}

Status check_tiers_outside_inputs(const std::vector<std::string>& tiers,
                                  const std::vector<std::string>& paths) {
  for (const auto& tier : tiers) {
    std::string dir = tier;
    if (dir.starts_with("file://"))
      dir = dir.substr(7);
    else if (dir.find("://") != std::string::npos)
      continue;
    std::error_code ec;
    const fs::path t = fs::weakly_canonical(dir, ec);
    if (ec) continue;  // opening the tier reports it
    for (const auto& input : paths) {
      const fs::path in = fs::weakly_canonical(input, ec);
      if (ec) continue;  // collecting the inputs reports it
      if (within(t, in) || within(in, t))
        return fail(Code::kInvalidArgument,
                    "tier " + tier + " and input " + input +
                        " overlap: a tier inside a saved directory would save every earlier "
                        "step again (put the tier elsewhere)");
    }
  }
  return ok();
}

Result<RestoreFilesReport> restore_files(Checkpointer& cp, uint64_t step,
                                         const RestoreFilesOptions& o) {
  SLUICE_ASSIGN_OR_RETURN(Manifest m, cp.manifest(step));
  // Replacing, the files go to a staging tree beside the directory, put in place at the end
  // in one step; else into the directory, where none of them may exist yet.
  std::unique_ptr<StagedTree> staged;
  std::unique_ptr<store::Store> out;
  std::vector<RestoreItem> items;
  if (o.replace) {
    SLUICE_ASSIGN_OR_RETURN(items, restore_items(m, o, nullptr));
    SLUICE_RETURN_IF_ERROR(enough_descriptors(items.size()));
    SLUICE_ASSIGN_OR_RETURN(staged, StagedTree::open(o.directory));
    std::set<std::string> keys;
    for (const RestoreItem& item : items) keys.insert(item.key);
    SLUICE_RETURN_IF_ERROR(staged->carry_over(keys));
    SLUICE_ASSIGN_OR_RETURN(out, store::open_store(staged->path()));
  } else {
    std::error_code ec;
    fs::create_directories(o.directory, ec);
    if (ec) return fail(Code::kIoError, "create " + o.directory + ": " + ec.message());
    SLUICE_ASSIGN_OR_RETURN(out, store::open_store(o.directory));
    SLUICE_ASSIGN_OR_RETURN(items, restore_items(m, o, out.get()));
    SLUICE_RETURN_IF_ERROR(enough_descriptors(items.size()));
  }
  // Pieces of at most one window (whole small files, large ones cut on chunk bounds) are
  // restored into one reused buffer and written at their offsets.
  const uint64_t cs = m.shards.empty() ? kDirectAlignment : m.shards[0].chunk_size;
  const uint64_t window = std::max(cs, (uint64_t{256} << 20) / cs * cs);
  SLUICE_ASSIGN_OR_RETURN(AlignedBuffer buf, AlignedBuffer::allocate(window));
  struct Piece {
    size_t item;
    uint64_t offset, bytes, at;  // in the tensor; in the buffer
  };
  std::vector<Piece> batch;
  std::map<size_t, std::unique_ptr<store::Writer>> writers;
  RestoreFilesReport report;
  report.files = items.size();
  uint64_t used = 0, total = 0;
  for (const RestoreItem& item : items) total += item.tensor->bytes;
  auto flush = [&]() -> Status {
    std::vector<TensorDest> dests;
    for (const Piece& p : batch)
      dests.push_back({items[p.item].tensor->name, static_cast<int>(items[p.item].rank),
                       buf.data() + p.at, p.bytes, nullptr, p.offset});
    SLUICE_ASSIGN_OR_RETURN(RestoreReport r, cp.restore(step, dests));
    report.chunks_failed_over += r.chunks_failed_over;
    if (o.on_problem)
      for (const auto& problem : r.problems) o.on_problem(problem);
    for (const Piece& p : batch) {
      auto& w = writers[p.item];
      if (!w) {
        store::WriteOptions wo;
        wo.overwrite = false;  // a name that exists was refused, or is a fresh staging tree
        wo.size_hint = items[p.item].tensor->bytes;
        wo.mode = 0600;  // until published with the mode the file was saved with
        SLUICE_ASSIGN_OR_RETURN(w, out->create(items[p.item].key, wo));
      }
      std::span<const std::byte> piece(buf.data() + p.at, p.bytes);
      SLUICE_RETURN_IF_ERROR(w->positional() ? w->write_at(p.offset, piece) : w->append(piece));
      report.bytes += p.bytes;
    }
    batch.clear();
    used = 0;
    if (o.on_progress) o.on_progress(report.bytes, total);
    return ok();
  };
  for (size_t i = 0; i < items.size(); ++i) {
    const uint64_t size = items[i].tensor->bytes;
    for (uint64_t off = 0; off < size || (size == 0 && off == 0); off += window) {
      const uint64_t n = std::min(window, size - off);
      if (used + n > window) SLUICE_RETURN_IF_ERROR(flush());
      batch.push_back({i, off, n, used});
      used = (used + n + kDirectAlignment - 1) / kDirectAlignment * kDirectAlignment;
      if (size == 0) break;
    }
  }
  if (!batch.empty()) SLUICE_RETURN_IF_ERROR(flush());
  SLUICE_RETURN_IF_ERROR(publish(items, writers, o, staged != nullptr));
  writers.clear();
  out.reset();
  if (staged) SLUICE_RETURN_IF_ERROR(staged->put_in_place());
  return report;
}

}  // namespace sluice::ckpt
