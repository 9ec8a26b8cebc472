// Helpers shared by the tests: temporary directories, random bytes, scratch mounts.
#pragma once

#include <sys/mount.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace sluice::testing {

// A fresh directory under $TMPDIR (or /tmp), removed with everything in it.
class TempDir {
 public:
  TempDir() {
    std::string base = std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp";
    std::string tmpl = base + "/sluice-test-XXXXXX";
    char* p = ::mkdtemp(tmpl.data());
    if (!p) throw std::runtime_error("mkdtemp failed");
    path_ = p;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// A file system mounted on a temporary directory for one test (tmpfs with a size limit,
// ramfs without O_DIRECT). Needs root; `ok()` is false with the reason otherwise.
class ScratchMount {
 public:
  ScratchMount(const char* fstype, const char* data) {
    if (::mount(fstype, dir_.path().c_str(), fstype, 0, data) != 0) {
      why_ = std::string("mount -t ") + fstype + ": " + std::strerror(errno);
      return;
    }
    mounted_ = true;
  }
  ~ScratchMount() {
    if (mounted_) ::umount2(dir_.path().c_str(), MNT_DETACH);
  }
  bool ok() const { return mounted_; }
  const std::string& why() const { return why_; }
  std::string file(const std::string& name) const { return dir_.file(name); }

 private:
  TempDir dir_;
  bool mounted_ = false;
  std::string why_;
};

inline std::vector<std::byte> random_bytes(size_t n, uint64_t seed = 1) {
  std::vector<std::byte> v(n);
  std::mt19937_64 rng(seed);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t x = rng();
    std::memcpy(v.data() + i, &x, 8);
  }
  for (; i < n; ++i) v[i] = static_cast<std::byte>(rng());
  return v;
}

inline std::span<const std::byte> as_bytes(const std::string& s) {
  return std::as_bytes(std::span(s.data(), s.size()));
}

// RUN_ALL_TESTS, but returns 77 (ctest's SKIP_RETURN_CODE) when tests were skipped and
// none passed, so a binary that could test nothing here says SKIP rather than pass.
inline int run_all_tests_skip_aware() {
  int rc = RUN_ALL_TESTS();
  const ::testing::UnitTest* u = ::testing::UnitTest::GetInstance();
  if (rc == 0 && u->successful_test_count() == 0 && u->skipped_test_count() > 0) return 77;
  return rc;
}

}  // namespace sluice::testing

#define SKIP_BECAUSE(reason) GTEST_SKIP() << "SKIP: " << (reason)
