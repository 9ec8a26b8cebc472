// `sluice cp`'s output; the copy itself is client::copy (sluice/client/copy.h).
#pragma once

#include <string>

#include "sluice/client/copy.h"
#include "sluice/xfer/copy.h"

namespace sluice::cli {

// The summary: a line (and one on the cache when read through it), or JSON.
std::string copy_text(const client::CopySummary& summary);
std::string copy_json(const client::CopySummary& summary);

// A one-line progress bar on stderr (ends the line when `final`).
void draw_progress(const xfer::CopyProgress& p, double seconds, bool final);

}  // namespace sluice::cli
