#include "s3/xml.h"

#include <gtest/gtest.h>

#include <string>

namespace sluice::s3 {
namespace {

TEST(S3Xml, ReadsAListingUnderItsPrefix) {
  auto page = parse_list_reply(
      "<ListBucketResult><IsTruncated>true</IsTruncated>"
      "<NextContinuationToken>tok</NextContinuationToken>"
      "<Contents><Key>data/train/1</Key><Size>42</Size><ETag>\"e\"</ETag>"
      "<LastModified>2024-05-01T12:00:00.000Z</LastModified></Contents></ListBucketResult>",
      "s3://b/data/", "data/", "train/");
  ASSERT_TRUE(page) << page.error().to_string();
  ASSERT_EQ(page->objects.size(), 1u);
  EXPECT_EQ(page->objects[0].key, "train/1");
  EXPECT_EQ(page->objects[0].size, 42u);
  EXPECT_EQ(page->objects[0].mtime_ns, 1714564800LL * 1'000'000'000);
  EXPECT_EQ(page->next_token, "tok");
}

TEST(S3Xml, RefusesABrokenListing) {
  for (const char* body :
       {"not xml <", "<Other/>",
        "<ListBucketResult><Contents><Key>elsewhere/x</Key></Contents></ListBucketResult>",
        "<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>"}) {
    auto page = parse_list_reply(body, "s3://b/data/", "data/", "");
    ASSERT_FALSE(page) << body;
    EXPECT_EQ(page.error().code(), Code::kCorruption) << body;
  }
}

// Found by fuzz/s3_xml_fuzz: a LastModified past 2262 overflowed int64 nanoseconds (UB).
TEST(S3Xml, ADateOutsideInt64NanosecondsIsUnknown) {
  EXPECT_EQ(parse_iso_date("2815-05-01T12:00:00.000Z"), 0);
  EXPECT_EQ(parse_iso_date("1500-01-01T00:00:00Z"), 0);
  EXPECT_EQ(parse_http_date("Tue, 01 Jan 9999 00:00:00 GMT"), 0);
  EXPECT_EQ(parse_http_date("Wed, 01 May 2024 12:00:00 GMT"), 1714564800LL * 1'000'000'000);
  auto page = parse_list_reply(
      "<ListBucketResult><Contents><Key>k</Key><LastModified>2815-05-01T12:00:00Z"
      "</LastModified></Contents></ListBucketResult>",
      "s3://b/", "", "");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->objects.at(0).mtime_ns, 0);
}

TEST(S3Xml, ReadsErrorsAndMultipartReplies) {
  auto e = parse_error_reply("<Error><Code>SlowDown</Code><Message>slow</Message></Error>");
  EXPECT_EQ(e.code, "SlowDown");
  EXPECT_EQ(e.message, "slow");
  EXPECT_EQ(parse_error_reply("").code, "");
  EXPECT_EQ(parse_error_reply("<Error><Code>").code, "");

  auto d = parse_delete_reply(
      "<DeleteResult><Error><Key>a</Key><Code>AccessDenied</Code><Message>no</Message>"
      "</Error></DeleteResult>");
  ASSERT_TRUE(d);
  EXPECT_EQ(d->key, "a");
  EXPECT_EQ(d->code, "AccessDenied");
  EXPECT_FALSE(parse_delete_reply("<DeleteResult><Deleted><Key>a</Key></Deleted></DeleteResult>"));

  EXPECT_EQ(parse_upload_id("<InitiateMultipartUploadResult><UploadId>u1</UploadId>"
                            "</InitiateMultipartUploadResult>"),
            "u1");
  EXPECT_EQ(parse_upload_id("garbage"), "");
  EXPECT_EQ(parse_complete_error("<Error><Code>InternalError</Code></Error>").value(),
            "InternalError");
  EXPECT_FALSE(parse_complete_error("<CompleteMultipartUploadResult/>"));
}

}  // namespace
}  // namespace sluice::s3
