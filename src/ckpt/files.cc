// Files and directories as checkpoints (sluice/ckpt/files.h).
#include "sluice/ckpt/files.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

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
// be absent: before anything is written.
Result<std::vector<RestoreItem>> restore_items(const Manifest& m, const RestoreFilesOptions& o,
                                               store::Store& out) {
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
      if (!o.replace && (fs::symlink_status(fs::path(o.directory) / key, lec).type() !=
                             fs::file_type::not_found ||
                         out.stat(key)))
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

// Publishes every written file (renamed into place) with the mode it was saved with.
Status publish(const std::vector<RestoreItem>& items,
               std::map<size_t, std::unique_ptr<store::Writer>>& writers,
               const RestoreFilesOptions& o) {
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
      return std::unexpected(
          st.error().with_context(std::to_string(i) + " of " + std::to_string(items.size()) +
                                  " files were published before this one failed"));
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
  std::error_code ec;
  fs::create_directories(o.directory, ec);
  if (ec) return fail(Code::kIoError, "create " + o.directory + ": " + ec.message());
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<store::Store> out, store::open_store(o.directory));
  SLUICE_ASSIGN_OR_RETURN(std::vector<RestoreItem> items, restore_items(m, o, *out));
  SLUICE_RETURN_IF_ERROR(enough_descriptors(items.size()));
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
        wo.overwrite = o.replace;
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
  SLUICE_RETURN_IF_ERROR(publish(items, writers, o));
  return report;
}

}  // namespace sluice::ckpt
