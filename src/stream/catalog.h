// The dataset catalog: what Dataset::open learned (the listing and each shard's sample
// table), kept in a node-local file so the other workers and ranks of the node open the
// dataset without listing it again. Format: docs/formats/dataset-catalog.md. Internal.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "sluice/core/status.h"
#include "sluice/store/store.h"
#include "sluice/stream/tar.h"

namespace sluice::stream {

struct Catalog {
  bool tar = true;                         // the resolved format
  std::vector<store::ObjectInfo> objects;  // tar: the shards; objects: every object
  struct Table {
    bool skipped = false, indexed = false;
    std::vector<ShardIndex::Entry> samples;
  };
  std::vector<Table> tables;  // tar: one per shard
  // What the listing left out (a local symlink leading out of the folder: store.h's
  // ListPage), for the opening that listed to report. Not kept in a catalog file.
  std::vector<store::SkippedKey> left_out;
};

// `identity` names what the catalog describes (store URI, prefix, options); a file whose
// identity differs is refused like a damaged one.
std::vector<std::byte> encode_catalog(const Catalog& c, std::string_view identity);
Result<Catalog> decode_catalog(std::span<const std::byte> bytes, std::string_view identity,
                               std::string_view what);

}  // namespace sluice::stream
