// What every sluice command shares: how an error is reported, times, progress lines.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>

#include "sluice/core/status.h"

namespace sluice::cli {

// Prints "sluice: error: ..." to stderr; returns the exit code (2 for a usage error).
int report_error(const Error& e);
// A flag's size ("4M"), or InvalidArgument naming the flag and the text.
Result<uint64_t> size_flag(const std::string& flag, const std::string& text);
// A policy's duration flag (a quota's grace, a rule's age, a forecast's window): a whole
// number with its unit (90s, 30m, 12h, 7d, 2w), or 0. A bare number is refused, since
// "--max-age 30" meant as days would be read as seconds and remove everything.
Result<std::chrono::seconds> duration_flag(const std::string& flag, const std::string& text);
// Seconds since `t0` on the steady clock.
double seconds_since(std::chrono::steady_clock::time_point t0);
// "1 object", "3 objects": a count with its noun, singular or plural.
inline std::string count_of(uint64_t n, const std::string& noun) {
  return std::to_string(n) + " " + noun + (n == 1 ? "" : "s");
}

// A progress line on stderr, redrawn in place at most every 200 ms; only when `wanted` and
// stderr is a terminal. The line is wiped by clear() or when it goes out of scope.
class StatusLine {
 public:
  explicit StatusLine(bool wanted);
  ~StatusLine() { clear(); }
  StatusLine(const StatusLine&) = delete;
  StatusLine& operator=(const StatusLine&) = delete;
  bool on() const { return on_; }
  void show(const std::string& text);
  void clear();

 private:
  bool on_ = false, drawn_ = false;
  std::chrono::steady_clock::time_point last_{};
};

// Progress of laying out a bench file (io::BenchOptions::on_lay_out, by std::ref): "laying
// out PATH: N% of SIZE" on stderr at every 10%; the line ends when the file is whole, or at
// end() for one cut short.
class LayOutProgress {
 public:
  explicit LayOutProgress(std::string path) : path_(std::move(path)) {}
  void operator()(uint64_t done, uint64_t total);
  void end();

 private:
  std::string path_;
  int last_pct_ = -1;
  bool open_ = false;
};

}  // namespace sluice::cli
