// `sluice demo`: the main job on the embedded default, a synthetic training run that
// streams a dataset through the cache, checkpoints asynchronously, is killed mid-run and
// resumes exactly (docs/demo.md). `sluice demo --bench` is the data-path comparison.
#pragma once

#include <cstdint>
#include <string>

namespace sluice::cli {

struct DemoOptions {
  std::string dir;                   // $SLUICE_HOME/demo
  uint64_t samples = 12000;          // in the generated dataset
  uint64_t sample_bytes = 16 << 10;  // mean size of a sample's input field
  unsigned batch = 64;
  unsigned ckpt_every = 100;  // steps
  uint64_t model_bytes = 64 << 20;
  double compute_ms = 5;  // a training step's simulated compute
};

// The parent: generates the dataset, runs the job in a child process that is killed with
// SIGKILL mid-way through the second epoch, runs it again from the latest checkpoint and
// the loader's token, checks every sample was trained on exactly once per epoch, and
// prints the report. Returns the exit code.
int run_training_demo(const DemoOptions& o, const std::string& self_exe);

// `sluice demo --bench`: every data path on a file of `demo_size` bytes in HOME/demo, side by
// side (bench_cmd.cc). Returns the exit code.
int run_bench_demo(const std::string& home, uint64_t demo_size);

// The child: one run of the training job. `crash_at_step` > 0 kills itself there.
int run_training_child(const DemoOptions& o, uint64_t crash_at_step, bool resume,
                       const std::string& events_file);

}  // namespace sluice::cli
