// Files and directories as checkpoints (sluice/ckpt/files.h), called as a library: a tree
// saved and restored byte for byte with its modes, all or nothing, and what is refused.
#include "sluice/ckpt/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "sluice/ckpt/live.h"
#include "sluice/core/fd.h"
#include "test_util.h"

namespace sluice::ckpt {
namespace {

using sluice::testing::TempDir;
namespace fs = std::filesystem;

void write(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::unique_ptr<Checkpointer> checkpointer(const std::string& tier) {
  CheckpointerOptions o;
  o.series = "files";
  o.tiers.push_back(open_tier(tier).value());
  o.staging_bytes = 4 << 20;
  o.chunk_size = 1 << 20;
  return Checkpointer::open(std::move(o)).value();
}

TEST(CheckpointFiles, ATreeComesBackByteForByteWithItsModes) {
  TempDir dir;
  const std::string big(3 << 20, 'x');
  write(dir.file("in/model/a.bin"), big);
  write(dir.file("in/model/sub/b.txt"), "bee");
  write(dir.file("in/model/empty"), "");
  ::chmod(dir.file("in/model/sub/b.txt").c_str(), 0640);
  auto views = file_tensors({dir.file("in/model")});
  ASSERT_TRUE(views) << views.error().to_string();
  ASSERT_EQ(views->size(), 3u);
  EXPECT_EQ((*views)[0].name, "a.bin");
  EXPECT_EQ((*views)[2].name, "sub/b.txt");
  EXPECT_EQ((*views)[2].mode, 0640u);

  auto cp = checkpointer(dir.file("tier"));
  ASSERT_TRUE(cp->save(7, *views).value()->wait());
  RestoreFilesOptions o;
  o.directory = dir.file("out");
  std::vector<std::pair<uint64_t, uint64_t>> told;
  o.on_progress = [&](uint64_t done, uint64_t total) { told.emplace_back(done, total); };
  auto r = restore_files(*cp, 7, o);
  ASSERT_TRUE(r) << r.error().to_string();
  ASSERT_FALSE(told.empty());  // progress ends with every byte done
  EXPECT_EQ(told.back(), std::make_pair(uint64_t{big.size() + 3}, uint64_t{big.size() + 3}));
  o.on_progress = nullptr;
  EXPECT_EQ(r->files, 3u);
  EXPECT_EQ(r->bytes, big.size() + 3);
  EXPECT_EQ(read(dir.file("out/a.bin")), big);
  EXPECT_EQ(read(dir.file("out/sub/b.txt")), "bee");
  EXPECT_TRUE(fs::exists(dir.file("out/empty")));
  struct stat st;
  ASSERT_EQ(::stat(dir.file("out/sub/b.txt").c_str(), &st), 0);
  const mode_t mask = ::umask(0);
  ::umask(mask);
  EXPECT_EQ(st.st_mode & 0777, 0640u & ~mask);

  // A second restore replaces nothing unless asked, and writes nothing when it refuses.
  write(dir.file("out/sub/b.txt"), "changed");
  EXPECT_EQ(restore_files(*cp, 7, o).error().code(), Code::kAlreadyExists);
  EXPECT_EQ(read(dir.file("out/sub/b.txt")), "changed");
  o.replace = true;
  ASSERT_TRUE(restore_files(*cp, 7, o));
  EXPECT_EQ(read(dir.file("out/sub/b.txt")), "bee");
}

TEST(CheckpointFiles, WhatCannotBeSavedIsRefusedUpFront) {
  TempDir dir;
  write(dir.file("one/x"), "1");
  write(dir.file("two/x"), "2");
  EXPECT_EQ(file_tensors({dir.file("one/x"), dir.file("two/x")}).error().code(),
            Code::kInvalidArgument);  // two inputs under one name
  fs::create_directories(dir.file("empty"));
  EXPECT_EQ(file_tensors({dir.file("empty")}).error().code(), Code::kInvalidArgument);
  EXPECT_EQ(file_tensors({dir.file("missing")}).error().code(), Code::kNotFound);
  write(dir.file("secret"), "s");
  fs::create_symlink(dir.file("secret"), dir.file("one/link"));
  EXPECT_EQ(file_tensors({dir.file("one")}).error().code(), Code::kInvalidArgument);

  EXPECT_EQ(check_tiers_outside_inputs({dir.file("one/ckpt")}, {dir.file("one")}).error().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(check_tiers_outside_inputs({"file://" + dir.path()}, {dir.file("one")}).error().code(),
            Code::kInvalidArgument);
  EXPECT_TRUE(check_tiers_outside_inputs({dir.file("ckpt"), "s3://b/p"}, {dir.file("one")}));
}

TEST(CheckpointFiles, AFileChangedDuringTheSaveFailsIt) {
  TempDir dir;
  write(dir.file("in/f"), std::string(1 << 20, 'a'));
  auto views = file_tensors({dir.file("in")});
  ASSERT_TRUE(views);
  write(dir.file("in/f"), std::string(1 << 20, 'b'));  // rewritten after it was pinned
  auto cp = checkpointer(dir.file("tier"));
  auto h = cp->save(1, *views);
  Status st = h ? (*h)->wait() : Status(std::unexpected(h.error()));
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code(), Code::kConflict);
}

// What a restore staged beside its target left in `parent`.
std::vector<std::string> staging_leftovers(const std::string& parent) {
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(parent))
    if (e.path().filename().string().starts_with(".sluice-restore-"))
      left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  return left;
}

// A tree restored by `restore --force` over `out`, saved as step 2; step 1 was restored there.
struct Replacing {
  TempDir dir;
  std::unique_ptr<Checkpointer> cp;
  std::string out = dir.file("out");

  Replacing() {
    write(dir.file("in1/a.bin"), "old a");
    write(dir.file("in1/sub/b.txt"), "old b");
    write(dir.file("in1/z.txt"), "old z");
    write(dir.file("in2/a.bin"), std::string(2 << 20, 'n'));
    write(dir.file("in2/sub/b.txt"), "new b");
    write(dir.file("in2/z.txt"), "new z");
    cp = checkpointer(dir.file("tier"));
    EXPECT_TRUE(cp->save(1, file_tensors({dir.file("in1")}).value()).value()->wait());
    EXPECT_TRUE(cp->save(2, file_tensors({dir.file("in2")}).value()).value()->wait());
    RestoreFilesOptions o;
    o.directory = out;
    EXPECT_TRUE(restore_files(*cp, 1, o));
  }
  Result<RestoreFilesReport> replace(uint64_t step = 2) {
    RestoreFilesOptions o;
    o.directory = out;
    o.replace = true;
    return restore_files(*cp, step, o);
  }
  void expect_old() {
    EXPECT_TRUE(read(out + "/a.bin") == "old a") << "a.bin was replaced";
    EXPECT_EQ(read(out + "/sub/b.txt"), "old b");
    EXPECT_EQ(read(out + "/z.txt"), "old z");
  }
};

// Issue 48: `restore --force` published file by file, so a failure part-way (here a
// directory where the step has a file, met after a.bin was published) left a mix of old
// and new files. It now builds the tree beside the target and swaps it in at once: the
// failure leaves the old tree whole, and no staging directory.
TEST(CheckpointFiles, AReplaceThatFailsPartWayLeavesTheOldTree) {
  Replacing r;
  fs::remove(r.out + "/sub/b.txt");
  write(r.out + "/sub/b.txt/keep", "a directory where step 2 has a file");
  auto got = r.replace();
  ASSERT_FALSE(got);
  EXPECT_EQ(got.error().code(), Code::kAlreadyExists) << got.error().message();
  EXPECT_TRUE(read(r.out + "/a.bin") == "old a") << "a.bin was replaced";
  EXPECT_EQ(read(r.out + "/z.txt"), "old z");
  EXPECT_EQ(read(r.out + "/sub/b.txt/keep"), "a directory where step 2 has a file");
  EXPECT_EQ(staging_leftovers(r.dir.path()), std::vector<std::string>{});
}

// A replace whose bytes fail to verify (a chunk corrupt on every tier) leaves the old tree
// and no staging directory either.
TEST(CheckpointFiles, AReplaceWithACorruptChunkLeavesTheOldTree) {
  Replacing r;
  const std::string step_dir = r.dir.file("tier/files/step-000000000002");
  for (const auto& e : fs::directory_iterator(step_dir))
    if (e.path().extension() == ".shard") {
      std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(100);
      f.put('X');
    }
  auto got = r.replace();
  ASSERT_FALSE(got);
  EXPECT_EQ(got.error().code(), Code::kCorruption) << got.error().message();
  r.expect_old();
  EXPECT_EQ(staging_leftovers(r.dir.path()), std::vector<std::string>{});
}

// What the step does not hold stays (the same file, linked into the new tree), with the
// directory's and its subdirectories' modes; a reader holding the old directory open reads
// the old tree whole, and one that opens it after reads the new tree whole.
TEST(CheckpointFiles, AReplaceKeepsWhatTheStepDoesNotHold) {
  Replacing r;
  write(r.out + "/notes.txt", "mine");
  write(r.out + "/extra/deep/x", "kept");
  ::chmod((r.out + "/extra").c_str(), 0710);
  ::chmod(r.out.c_str(), 0750);
  struct stat before;
  ASSERT_EQ(::stat((r.out + "/notes.txt").c_str(), &before), 0);
  UniqueFd old_dir(::open(r.out.c_str(), O_RDONLY | O_DIRECTORY));
  ASSERT_TRUE(old_dir.valid());
  auto got = r.replace();
  ASSERT_TRUE(got) << got.error().message();
  EXPECT_EQ(got->files, 3u);
  EXPECT_TRUE(read(r.out + "/a.bin") == std::string(2 << 20, 'n')) << "a.bin was not restored";
  EXPECT_EQ(read(r.out + "/sub/b.txt"), "new b");
  EXPECT_EQ(read(r.out + "/z.txt"), "new z");
  EXPECT_EQ(read(r.out + "/extra/deep/x"), "kept");
  struct stat after, mode;
  ASSERT_EQ(::stat((r.out + "/notes.txt").c_str(), &after), 0);
  EXPECT_EQ(after.st_ino, before.st_ino);
  ASSERT_EQ(::stat(r.out.c_str(), &mode), 0);
  EXPECT_EQ(mode.st_mode & 0777, 0750u);
  ASSERT_EQ(::stat((r.out + "/extra").c_str(), &mode), 0);
  EXPECT_EQ(mode.st_mode & 0777, 0710u);
  EXPECT_FALSE(fs::exists(r.out + "/.sluice-tmp"));
  EXPECT_EQ(staging_leftovers(r.dir.path()), std::vector<std::string>{});
  // The old tree went as a whole: the descriptor opened before sees none of the new files.
  struct stat gone;
  EXPECT_NE(::fstatat(old_dir.get(), "z.txt", &gone, 0), 0);
  // A directory that did not exist is made, in one step too.
  RestoreFilesOptions o;
  o.directory = r.dir.file("fresh/out");
  o.replace = true;
  ASSERT_TRUE(restore_files(*r.cp, 2, o));
  EXPECT_EQ(read(r.dir.file("fresh/out/z.txt")), "new z");
  EXPECT_EQ(staging_leftovers(r.dir.file("fresh")), std::vector<std::string>{});
}

// A restore killed with kill -9 leaves its staging tree and lock beside the target; the
// next replace there removes them once its lock shows the restore dead, puts back an old
// tree a swap without RENAME_EXCHANGE had set aside, and leaves a live restore's alone.
TEST(CheckpointFiles, TheNextReplaceRemovesWhatADeadOneLeft) {
  Replacing r;
  std::istringstream in(live_text());
  std::string magic, version, host, pid, ticks, boot, ns;
  ASSERT_TRUE(in >> magic >> version >> host >> pid >> ticks >> boot >> ns);
  const std::string dead =
      "sluice-live 2 " + host + " 2147483647 " + ticks + " " + boot + " " + ns + "\n";
  auto leave = [&](const std::string& stem, const std::string& target_hex) {
    write(r.dir.file(stem + "/half-written"), "x");
    write(r.dir.file(stem + ".lock"), dead + target_hex + "\n");
  };
  leave(".sluice-restore-00000000deadbeef", "6f7574");  // "out"
  // Killed between setting "gone" aside and renaming its new tree in.
  leave(".sluice-restore-00000000feedf00d", "676f6e65");  // "gone"
  write(r.dir.file(".sluice-restore-00000000feedf00d.old/precious"), "the old tree");
  // A restore still running (its lock held, here by this process).
  leave(".sluice-restore-00000000a11ce000", "6f7574");
  UniqueFd held(::open(r.dir.file(".sluice-restore-00000000a11ce000.lock").c_str(), O_RDWR));
  struct flock fl = {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  ASSERT_EQ(::fcntl(held.get(), F_OFD_SETLK, &fl), 0);

  auto got = r.replace();
  ASSERT_TRUE(got) << got.error().message();
  EXPECT_EQ(read(r.dir.file("gone/precious")), "the old tree");
  EXPECT_EQ(staging_leftovers(r.dir.path()),
            (std::vector<std::string>{".sluice-restore-00000000a11ce000",
                                      ".sluice-restore-00000000a11ce000.lock"}));
}

}  // namespace
}  // namespace sluice::ckpt
