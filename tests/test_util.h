// Helpers shared by the tests: temporary directories, random bytes, scratch mounts.
#pragma once

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/wait.h>
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

// A server started through one of the Python harnesses' `serve` mode
// (tests/integration/rgw_harness.py, pg_harness.py): the harness prints one JSON line
// describing the server (or {"skip": reason}) and stops it when its stdin closes, so the
// server never outlives the test, even a killed one.
class ServedHarness {
 public:
  ServedHarness() = default;
  ServedHarness(const ServedHarness&) = delete;
  ServedHarness& operator=(const ServedHarness&) = delete;
  ~ServedHarness() { stop(); }

  // Starts `/usr/bin/python3 script serve args...`; returns the line it printed (empty
  // if it printed none).
  std::string start(const std::string& script, const std::vector<std::string>& args) {
    int in[2], out[2];
    if (::pipe2(in, O_CLOEXEC) != 0) return {};
    if (::pipe2(out, O_CLOEXEC) != 0) {
      ::close(in[0]);
      ::close(in[1]);
      return {};
    }
    std::vector<std::string> argv_s{"python3", script, "serve"};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(in[0], 0);
      ::dup2(out[1], 1);
      ::execv("/usr/bin/python3", argv.data());
      ::_exit(127);
    }
    ::close(in[0]);
    ::close(out[1]);
    stdin_ = in[1];
    std::string line;
    char c;
    while (::read(out[0], &c, 1) == 1 && c != '\n') line += c;
    ::close(out[0]);
    return line;
  }

  void stop() {
    if (stdin_ >= 0) ::close(stdin_);  // EOF: the harness stops its server
    stdin_ = -1;
    if (pid_ > 0) ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
  int stdin_ = -1;
};

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
