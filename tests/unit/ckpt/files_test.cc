// Files and directories as checkpoints (sluice/ckpt/files.h), called as a library: a tree
// saved and restored byte for byte with its modes, all or nothing, and what is refused.
#include "sluice/ckpt/files.h"

#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace sluice::ckpt
