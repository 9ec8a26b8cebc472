// sluice/ckpt/files.h: files and directories as checkpoints (`sluice ckpt save PATH...`,
// `sluice ckpt restore --to DIR`). Every file is one tensor of dtype uint8 named by its path
// relative to the argument it came from, with its permission bits; a restore writes them
// back under a directory, byte for byte, all or nothing.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "sluice/ckpt/checkpointer.h"
#include "sluice/core/status.h"

namespace sluice::ckpt {

// The files `paths` name, as tensors to save: a regular file under its own name; the files
// of a directory under their paths below it, in order; a link to a file inside the tree
// under the link's name. Each is pinned to what it is now (device, inode, size, times): one
// rewritten while the save reads it fails the save with Conflict instead of committing a
// mix. InvalidArgument for a name a restore would refuse, two inputs under one name, a link
// out of its tree or to a directory, special files, or nothing to save.
Result<std::vector<TensorView>> file_tensors(const std::vector<std::string>& paths);

// A local tier (a path or file://) inside a saved directory would have every save take in
// the earlier ones, and one holding an input would save its own shards: InvalidArgument,
// as `cp -r` refuses a destination inside its source.
Status check_tiers_outside_inputs(const std::vector<std::string>& tiers,
                                  const std::vector<std::string>& paths);

struct RestoreFilesOptions {
  std::string directory;  // where the files go; made if missing
  int only_rank = -1;     // -1: every rank's files (of a multi-rank step, each under rank-N/)
  // false: a file there already is AlreadyExists, before any write. true: the directory is
  // replaced in one step (see restore_files), keeping what the step does not hold.
  bool replace = false;
  std::function<void(const std::string&)> on_problem;  // a chunk read from a later tier
  // After each window is read, checked and written: the step's bytes done and in all.
  std::function<void(uint64_t done, uint64_t total)> on_progress;
};

struct RestoreFilesReport {
  size_t files = 0;
  uint64_t bytes = 0;
  uint64_t chunks_failed_over = 0;  // chunks read again from a later tier
};

// Writes a step's tensors as files under options.directory, through a file:// store: each
// name checked as a key (relative, no "..", no reserved component) and resolved beneath the
// directory (a link cannot lead out). Every file is written to a temporary file and
// published only once every byte of the step was read and checked, so a failure leaves the
// directory as it was. A file gets back the mode it was saved with, never setuid, setgid or
// sticky, narrowed by the umask. Memory stays within one 256 MiB window whatever the step
// holds; one descriptor per file is held until the end (a restore past RLIMIT_NOFILE is
// refused up front: raise it first).
//
// Replacing (options.replace), the whole tree is published at once: the files are restored
// into a staging directory beside the directory ("<parent>/.sluice-restore-<random>"), every
// other file of the directory is hard-linked into it and its subdirectories made with their
// modes, and it is swapped with the directory by one renameat2(RENAME_EXCHANGE) (where the
// file system lacks it: set aside, then renamed in); the old tree is removed after. A reader
// sees the old tree or the new one, never a mix; a failure leaves the directory as it was
// and removes the staging directory. A process killed meanwhile leaves it, with its lock
// ("<staging>.lock", an open-file-description lock and the live marker text of live.h): the
// next replace beside that directory removes both (and puts back an old tree set aside). The
// parent must be writable; a directory that is a mount point, or holds one, is
// InvalidArgument; a directory where the step has a file, or a file where it has a
// directory, AlreadyExists: all before any byte is written.
Result<RestoreFilesReport> restore_files(Checkpointer& checkpointer, uint64_t step,
                                         const RestoreFilesOptions& options);

}  // namespace sluice::ckpt
