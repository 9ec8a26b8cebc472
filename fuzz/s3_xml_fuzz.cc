// S3's XML replies (src/s3/xml.h): listings (ListObjectsV2), error bodies, DeleteObjects
// results, and the multipart replies (InitiateMultipartUpload, CompleteMultipartUpload's
// 200-with-an-error), and the dates of listings and Last-Modified headers. Every parser gets
// the same untrusted body; a listing is read under a store prefix and a list prefix, and
// every key it returns must lie under them.
#include <cstddef>
#include <cstdint>

#include "fuzz_util.h"
#include "s3/xml.h"

using namespace sluice;

namespace {

void list(std::string_view body, std::string_view store_prefix, std::string_view prefix) {
  auto page = s3::parse_list_reply(body, "s3://fuzz-bucket/" + std::string(store_prefix),
                                   store_prefix, prefix);
  if (!page) return;
  for (const auto& o : page->objects)
    SLUICE_FUZZ_CHECK(o.key.starts_with(prefix), "a listed key lies under the prefix asked for");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body = fuzz::text_of(data, size);
  list(body, "", "");
  list(body, "data/", "train/");
  (void)s3::parse_error_reply(body);
  (void)s3::parse_delete_reply(body);
  (void)s3::parse_upload_id(body);
  (void)s3::parse_complete_error(body);
  (void)s3::parse_iso_date(std::string(body));
  (void)s3::parse_http_date(std::string(body));
  return 0;
}
