// sluice/doctor/observe.h: what a running job does to its storage, read from /proc and /sys
// without touching the job (docs/doctor.md).
//
// Everything here only reads: /proc/PID/{io,cgroup,fd,fdinfo,task/*/stat}, the block
// device counters in /sys/dev/block/MAJ:MIN/stat, queue settings, cgroup throttle files,
// and FIEMAP on the job's files through descriptors of our own opened read-only. The
// roots (/proc, /sys, the cgroup mount) are options so tests can point them at a fixture
// tree. A job that exits while it is watched is an error naming it, never a crash.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/core/status.h"

namespace sluice::doctor {

// The counters of one block device since boot (Documentation/admin-guide/iostats.rst).
struct DiskCounters {
  uint64_t reads = 0, read_merges = 0, read_sectors = 0, read_ms = 0;
  uint64_t writes = 0, write_merges = 0, write_sectors = 0, write_ms = 0;
  uint64_t in_flight = 0, io_ms = 0, queue_ms = 0;
};
// Parses the text of /sys/block/X/stat (11 or more fields).
Result<DiskCounters> parse_disk_stat(std::string_view text);

// /proc/PID/io: rchar/syscr count every read syscall (page-cache hits too), read_bytes
// what the process caused to be fetched from storage.
struct ProcIo {
  uint64_t rchar = 0, wchar = 0, syscr = 0, syscw = 0, read_bytes = 0, write_bytes = 0;
};
Result<ProcIo> parse_proc_io(std::string_view text);

// One thread's line of /proc/PID/task/TID/stat: CPU ticks in user and kernel mode.
struct ThreadTicks {
  int tid = 0;
  std::string name;
  char state = '?';
  uint64_t user = 0, sys = 0;
};
Result<ThreadTicks> parse_task_stat(std::string_view text);

// A block device and the queue settings of the disk it belongs to (a partition's own
// settings are its disk's).
struct BlockDevice {
  unsigned major = 0, minor = 0;
  std::string name;  // "vda1", "loop3"
  std::string disk;  // "vda", "loop3"
  uint64_t max_sectors_kb = 0, read_ahead_kb = 0, logical_block = 512;
  bool rotational = false;
  std::string scheduler;
};

struct ObserveOptions {
  std::string proc_root = "/proc";
  std::string sys_root = "/sys";
  std::string cgroup_root = "/sys/fs/cgroup";
};

// The device behind a device number (st_dev of a file, or st_rdev of a device node).
// kNotFound for a file system on no block device (tmpfs, overlay, NFS: major 0).
Result<BlockDevice> block_device(dev_t dev, const ObserveOptions& o = {});

// A descriptor the job holds open on a regular file or a block device.
struct OpenFile {
  int fd = -1;
  std::string path;
  bool block_device = false;
  dev_t dev = 0;  // the device the bytes live on (st_dev, or st_rdev of a device node)
  uint64_t size = 0;
  bool direct = false;    // opened with O_DIRECT (fdinfo flags)
  std::string fs_type;    // "ext4", "tmpfs", ... (statfs), empty for a device node
  bool direct_ok = true;  // the file system takes O_DIRECT (probed read-only)
  int64_t extents = -1;   // FIEMAP extent count of a regular file; -1 when unknown
  uint64_t position = 0;  // the descriptor's file position (fdinfo pos)
};
// The job's descriptors on regular files and block devices, with what they sit on.
Result<std::vector<OpenFile>> open_files(pid_t pid, const ObserveOptions& o = {});

// The extent count of a regular file (FIEMAP), or kUnsupported where the file system has
// no FIEMAP.
Result<int64_t> extent_count(int fd);

// A read limit set on a device for the job's cgroup (v1 blkio.throttle.* or v2 io.max),
// the tightest of its cgroup and every ancestor.
struct ReadLimit {
  std::string cgroup;                  // the cgroup path whose file sets it
  std::string file;                    // "blkio.throttle.read_bps_device" or "io.max"
  uint64_t bytes_per_s = 0, iops = 0;  // 0: not limited
};
std::optional<ReadLimit> read_limit(pid_t pid, unsigned major, unsigned minor,
                                    const ObserveOptions& o = {});

// One look at the job and the devices it uses.
struct Snapshot {
  uint64_t t_ns = 0;
  ProcIo io;
  std::vector<ThreadTicks> threads;
  std::map<dev_t, DiskCounters> disks;
};
Result<Snapshot> snapshot(pid_t pid, const std::vector<dev_t>& devices,
                          const ObserveOptions& o = {});

// What one device did between two snapshots (iostat -x, per second).
struct DeviceActivity {
  BlockDevice device;
  double read_bytes_s = 0, read_iops = 0, avg_read_bytes = 0, read_await_ms = 0;
  double write_bytes_s = 0;
  double in_flight = 0;    // average requests queued or in service (aqu-sz)
  double utilisation = 0;  // share of the time with at least one request in flight
  double read_merged = 0;  // share of read requests merged into another
};

struct ThreadActivity {
  int tid = 0;
  std::string name;
  double cpu = 0, user = 0, sys = 0;  // share of one core, 0..1
};

// What the job did between two snapshots.
struct JobActivity {
  double seconds = 0;
  double read_bytes_s = 0;    // from storage (read_bytes)
  double rchar_s = 0;         // through read syscalls (page cache included)
  double read_calls_s = 0;    // read syscalls per second (io_uring reads are not counted)
  double avg_call_bytes = 0;  // rchar / syscr; 0 when no read syscall was made
  double write_bytes_s = 0;
  double cpu = 0;                       // all threads, in cores
  std::vector<ThreadActivity> threads;  // busiest first
};

DeviceActivity device_activity(const BlockDevice& dev, const DiskCounters& a, const DiskCounters& b,
                               double seconds);
JobActivity job_activity(const Snapshot& a, const Snapshot& b, long ticks_per_second);

// Everything `sluice doctor --pid` saw.
struct Observation {
  pid_t pid = 0;
  std::string command;  // the job's comm
  JobActivity job;
  std::vector<OpenFile> files;
  std::optional<DeviceActivity> device;    // the device the job read most from
  std::optional<ReadLimit> limit;          // a cgroup read limit on that device
  std::vector<std::string> gpu_libraries;  // CUDA / cuFile libraries mapped in the job
  std::vector<std::string> notes;          // what could not be seen, and why
};

// Watches `pid` for `seconds` (sampling /proc and /sys at the start and the end).
Result<Observation> observe(pid_t pid, double seconds, const ObserveOptions& o = {});

}  // namespace sluice::doctor
