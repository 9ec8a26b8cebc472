// sluice/client/datasets.h: a dataset opened the way sluice does, from its URI (an s3://
// prefix, a store URI, a local directory), through the node's cache or not, and listed once
// per node through the catalog.
//
//   client::DatasetSpec spec{.uri = "s3://datasets/vision/", .catalog = true};
//   auto ds = client::open_dataset(session, spec).value();
//   stream::Loader loader(*ds, {});
#pragma once

#include <memory>
#include <string>

#include "sluice/client/session.h"
#include "sluice/core/status.h"
#include "sluice/stream/dataset.h"

namespace sluice::client {

// The store and prefix a dataset URI names: a local directory is a file:// store of its
// own (absolute); a URI's key part is a folder (a '/' is added).
struct DatasetLocation {
  std::string store_uri, prefix;
};
Result<DatasetLocation> dataset_location(const std::string& text);

struct DatasetSpec {
  std::string uri;
  bool through_cache = true;  // the node's cache (sluiced, else the embedded cache)
  // A reader: the listing and every shard's sample table come from the node's catalog
  // (catalog_dir, default HOME/datasets), built by the first open within its lifetime.
  bool catalog = false;
  std::string catalog_dir;
  bool refresh = false;  // list again, whatever the catalog holds
  stream::Format format = stream::Format::kAuto;
  bool skip_corrupt = false;
  telemetry::Registry* registry = nullptr;  // where the stores opened for it record
};

// Opens the dataset; a missing local directory is NotFound (readers never make one). With
// the catalog, a dataset replaced in place within the catalog's lifetime (its first or
// last shard is another version now) is listed again before any read fails on it.
Result<std::shared_ptr<stream::Dataset>> open_dataset(const Session& session,
                                                      const DatasetSpec& spec);

}  // namespace sluice::client
