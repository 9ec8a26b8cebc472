#include "xml.h"

#include <cstdlib>
#include <ctime>
#include <limits>

#include <pugixml.hpp>

namespace sluice::s3 {

namespace {

bool load(pugi::xml_document& doc, std::string_view body) {
  return static_cast<bool>(doc.load_buffer(body.data(), body.size()));
}

}  // namespace

ErrorReply parse_error_reply(std::string_view body) {
  ErrorReply e;
  if (body.empty()) return e;
  pugi::xml_document doc;
  if (load(doc, body)) {
    e.code = doc.child("Error").child_value("Code");
    e.message = doc.child("Error").child_value("Message");
  }
  return e;
}

Result<store::ListPage> parse_list_reply(std::string_view body, std::string_view uri,
                                         std::string_view store_prefix, std::string_view prefix) {
  const std::string u(uri);
  pugi::xml_document doc;
  if (!load(doc, body)) return fail(Code::kCorruption, "list " + u + ": response is not XML");
  auto root = doc.child("ListBucketResult");
  if (!root) return fail(Code::kCorruption, "list " + u + ": no ListBucketResult in response");
  const std::string want = std::string(store_prefix) + std::string(prefix);
  store::ListPage page;
  for (auto c : root.children("Contents")) {
    std::string k = c.child_value("Key");
    // The listing is untrusted: a key outside the prefix asked for is a broken server.
    if (!k.starts_with(want))
      return fail(Code::kCorruption, "list " + u + std::string(prefix) + ": server returned key '" +
                                         k + "', which is outside the prefix asked for");
    store::ObjectInfo info;
    info.key = k.substr(store_prefix.size());
    info.size = std::strtoull(c.child_value("Size"), nullptr, 10);
    info.etag = c.child_value("ETag");
    info.mtime_ns = parse_iso_date(c.child_value("LastModified"));
    page.objects.push_back(std::move(info));
  }
  if (std::string_view(root.child_value("IsTruncated")) == "true") {
    page.next_token = root.child_value("NextContinuationToken");
    if (page.next_token.empty())
      return fail(Code::kCorruption, "list " + u + ": truncated without a continuation token");
  }
  return page;
}

std::optional<DeleteError> parse_delete_reply(std::string_view body) {
  pugi::xml_document doc;
  if (!load(doc, body)) return std::nullopt;
  auto e = doc.child("DeleteResult").child("Error");
  if (!e) return std::nullopt;
  return DeleteError{e.child_value("Key"), e.child_value("Code"), e.child_value("Message")};
}

std::string parse_upload_id(std::string_view body) {
  pugi::xml_document doc;
  load(doc, body);
  return doc.child("InitiateMultipartUploadResult").child_value("UploadId");
}

std::optional<std::string> parse_complete_error(std::string_view body) {
  pugi::xml_document doc;
  if (!load(doc, body) || !doc.child("Error")) return std::nullopt;
  return std::string(doc.child("Error").child_value("Code"));
}

namespace {

// `text` in `format` as nanoseconds since the Unix epoch; 0 when it does not parse or lies
// outside what 64-bit nanoseconds hold (1677 to 2262): the server's text is untrusted, and
// "year 9999" must not overflow.
int64_t parse_date(const std::string& text, const char* format) {
  struct tm tm = {};
  if (!::strptime(text.c_str(), format, &tm)) return 0;
  const std::time_t s = ::timegm(&tm);
  constexpr int64_t kMaxSeconds = std::numeric_limits<int64_t>::max() / 1'000'000'000;
  if (s > kMaxSeconds || s < -kMaxSeconds) return 0;
  return static_cast<int64_t>(s) * 1'000'000'000;
}

}  // namespace

int64_t parse_iso_date(const std::string& s) {
  return parse_date(s, "%Y-%m-%dT%H:%M:%S");
}

int64_t parse_http_date(const std::string& s) {
  return parse_date(s, "%a, %d %b %Y %H:%M:%S");
}

}  // namespace sluice::s3
