// sluice/ckpt/live.h: markers that say a save is under way, so no gc removes its step.
//
// A save that is writing or committing a step keeps one marker per rank and tier under the
// step, "<series>/step-<N>/rank-<R>-<save id>.live", and rewrites it every kLiveRefresh. Its
// text names the owner: "sluice-live 2 <host> <pid> <process start ticks> <boot id> <pid
// namespace>\n" (version 1, of older releases, lacks the last two). A marker holds its step
// (gc leaves every object of the step alone) while it is younger than kLiveLease and, when
// its owner ran on this machine and PID namespace, while that process still runs; a save
// killed with kill -9 thus frees its step at once for a gc on its own machine and after the
// lease elsewhere. Markers are removed when the save ends, whatever its outcome.
//
// A machine is its host name together with its boot id, never the host name alone:
// containers on several machines may share one host name, and a local pid says nothing
// about a process of another machine. A version 1 marker names only the host, so it is
// judged by its lease alone, as another machine's would be.
//
// A marker that does not hold is not yet proof that its save is gone (a clock behind, a
// refresh that stalled): gc waits for its grace before removing such a step. Only
// live_owner_gone, a version 2 marker of this machine (host name and boot id) and PID
// namespace whose process no longer runs, lets gc remove that save's own shard at once.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "sluice/store/store.h"

namespace sluice::ckpt {

inline constexpr std::chrono::seconds kLiveRefresh{5};
inline constexpr std::chrono::seconds kLiveLease{30};

std::string live_key(std::string_view series, uint64_t step, unsigned rank,
                     std::string_view save_id);
bool is_live_leaf(std::string_view leaf);  // "rank-…-….live"
// This process's marker text.
std::string live_text();
// Whether a marker with this text, last written at `mtime_ns`, still holds its step at
// `now_ns`. Text that does not parse holds only by its age.
bool live_marker_holds(std::string_view text, int64_t mtime_ns, int64_t now_ns);
// Whether the marker's text proves its save gone: version 2, written on this machine (host
// name and boot id) and PID namespace by a process that no longer runs. Anything else
// (another machine of the same host name, an older marker, text that does not parse) is no
// proof.
bool live_owner_gone(std::string_view text);
// Both answers for a marker object of a listing of `tier`, from one read of its text (a
// marker over 512 bytes, or one that cannot be read, holds by its age alone and proves
// nothing).
struct LiveMarker {
  bool holds = true;
  bool owner_gone = false;
};
LiveMarker judge_live_marker(store::Store& tier, const store::ObjectInfo& marker, int64_t now_ns);
// A save's shard or marker key without its extension, "<series>/step-<N>/rank-<R>-<save
// id>": the same for both, so a marker names its save's shard.
std::string_view save_stem(std::string_view key);

}  // namespace sluice::ckpt
