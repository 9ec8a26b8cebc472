// sluice/doctor/diagnose.h: a storage ceiling (a measured sweep) and the rules that name why
// a job gets less than it (docs/doctor.md gives the reasoning behind each rule).
//
// `diagnose` is a pure function of what was observed and what was measured, so every rule is
// tested on made-up figures as well as on the real degraded setups of the integration test.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "sluice/core/status.h"
#include "sluice/doctor/observe.h"

namespace sluice::doctor {

// One measured point of a sweep: sequential O_DIRECT reads through io_uring ("uring"), the
// thread pool ("direct"), or the page cache from a cold start ("buffered").
struct SweepPoint {
  std::string engine;
  uint64_t bs = 0;
  unsigned qd = 0;
  double bytes_s = 0;
  double lat_us = 0;  // mean latency of one request
  double cpu = 0;     // cores used by sluice while measuring
};

// What a path can do, from a sweep.
struct Ceiling {
  std::string target;  // the file or device measured
  std::string device;  // "loop0", or empty
  std::vector<SweepPoint> points;
  bool direct = true;      // O_DIRECT works there
  std::string direct_why;  // why not, when it does not

  // The fastest point (of `engine` when given); nullopt when nothing was measured.
  std::optional<SweepPoint> best(const std::string& engine = "") const;
  // The fastest point with this block size (the nearest measured one) and at most `max_qd`
  // in flight, over the O_DIRECT engines.
  std::optional<SweepPoint> best_at(uint64_t bs, unsigned max_qd = ~0u) const;
  // The smallest queue depth reaching 90% of the best at the best point's block size: the
  // knee of the curve.
  std::optional<SweepPoint> knee() const;

  std::string json() const;
  static Result<Ceiling> from_json(const std::string& text);
};

// One cause, with the evidence that points at it and what to change.
struct Cause {
  std::string id;  // stable: "queue-depth", "request-size", "split-requests",
                   // "buffered", "page-cache-thrash", "cpu-bound", "throttled",
                   // "shared-device", "fragmented", "no-direct", "healthy"
  std::string title;
  std::string evidence;
  std::string advice;
  double gain = 1;  // the estimated speed-up if it were fixed (ranked by it)
};

struct Diagnosis {
  double job_bytes_s = 0;      // what the job reads from storage
  double ceiling_bytes_s = 0;  // the best of the sweep (0 when none)
  std::vector<Cause> causes;   // most likely first; "healthy" alone when nothing is wrong
};

Diagnosis diagnose(const Observation& ob, const std::optional<Ceiling>& ceiling);

// The report, for a terminal and as one JSON object.
std::string report_text(const Observation& ob, const std::optional<Ceiling>& ceiling,
                        const Diagnosis& d);
std::string report_json(const Observation& ob, const std::optional<Ceiling>& ceiling,
                        const Diagnosis& d);
// Ranked causes as the reports print them: numbered text, and a JSON array.
std::string causes_text(const std::vector<Cause>& causes);
std::string causes_json(const std::vector<Cause>& causes);
// The sweep alone: the curve and the knee, in words.
std::string ceiling_text(const Ceiling& c);

// "1.2 GiB/s", "840 MiB/s"
std::string format_rate(double bytes_s);
// "1.2 GiB", "64 KiB"
std::string format_bytes(double bytes);

}  // namespace sluice::doctor
