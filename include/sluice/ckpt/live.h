// sluice/ckpt/live.h: markers that say a save is under way, so no gc removes its step.
//
// A save that is writing or committing a step keeps one marker per rank and tier under the
// step, "<series>/step-<N>/rank-<R>-<save id>.live", and rewrites it every kLiveRefresh. Its
// text names the owner: "sluice-live 1 <host> <pid> <process start ticks>\n". A marker
// holds its step (gc leaves every object of the step alone) while it is younger than
// kLiveLease and, when its owner ran on this host, while that process still runs; a save
// killed with kill -9 thus frees its step at once for a gc on its own host and after the
// lease elsewhere. Markers are removed when the save ends, whatever its outcome.
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
// The same for a marker object of a listing of `tier`: reads its text (a marker over 512
// bytes, or one that cannot be read, holds by its age alone).
bool live_marker_holds(store::Store& tier, const store::ObjectInfo& marker, int64_t now_ns);

}  // namespace sluice::ckpt
