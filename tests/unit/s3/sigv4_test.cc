#include "s3/sigv4.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <span>
#include <string>
#include <string_view>

namespace sluice::s3 {
namespace {

// The example account of the AWS S3 SigV4 documentation ("Signature Calculations for the
// Authorization Header: Transferring Payload in a Single Chunk", section "Examples").
const Credentials kDocCreds{"AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", ""};
constexpr std::time_t kDocTime = 1369353600;  // 2013-05-24T00:00:00Z
constexpr std::string_view kDocHost = "examplebucket.s3.amazonaws.com";

std::string header(const SignedRequest& s, std::string_view name) {
  for (const auto& [n, v] : s.headers)
    if (n == name) return v;
  return "<absent>";
}

std::string signature_of(const SignedRequest& s) {
  const std::string auth = header(s, "Authorization");
  const auto at = auth.rfind("Signature=");
  return at == std::string::npos ? "" : auth.substr(at + 10);
}

std::span<const std::byte> bytes(std::string_view s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

TEST(SigV4, AwsDocGetObjectExample) {
  SigningRequest req;
  req.method = "GET";
  req.host = kDocHost;
  req.path = "/test.txt";
  req.headers = {{"Range", "bytes=0-9"}};
  req.payload_sha256 = kEmptyPayloadSha256;
  SignedRequest s = sign_v4(req, kDocCreds, "us-east-1", "s3", kDocTime);

  EXPECT_EQ(s.canonical_request,
            "GET\n/test.txt\n\n"
            "host:examplebucket.s3.amazonaws.com\n"
            "range:bytes=0-9\n"
            "x-amz-content-sha256:"
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\n"
            "x-amz-date:20130524T000000Z\n\n"
            "host;range;x-amz-content-sha256;x-amz-date\n"
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(s.string_to_sign,
            "AWS4-HMAC-SHA256\n20130524T000000Z\n20130524/us-east-1/s3/aws4_request\n"
            "7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972");
  EXPECT_EQ(header(s, "Authorization"),
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
            "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
            "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
  EXPECT_EQ(header(s, "x-amz-date"), "20130524T000000Z");
  EXPECT_EQ(header(s, "x-amz-content-sha256"), kEmptyPayloadSha256);
  EXPECT_EQ(header(s, "x-amz-security-token"), "<absent>");
  EXPECT_EQ(s.headers.size(), 3u);
}

TEST(SigV4, AwsDocPutObjectExample) {
  const std::string body = "Welcome to Amazon S3.";
  SigningRequest req;
  req.method = "PUT";
  req.host = kDocHost;
  req.path = "/" + uri_encode("test$file.text", false);
  req.headers = {{"Date", "Fri, 24 May 2013 00:00:00 GMT"},
                 {"x-amz-storage-class", "REDUCED_REDUNDANCY"}};
  req.payload_sha256 = sha256_hex(bytes(body));
  EXPECT_EQ(req.payload_sha256, "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072");
  SignedRequest s = sign_v4(req, kDocCreds, "us-east-1", "s3", kDocTime);

  EXPECT_EQ(s.canonical_request,
            "PUT\n/test%24file.text\n\n"
            "date:Fri, 24 May 2013 00:00:00 GMT\n"
            "host:examplebucket.s3.amazonaws.com\n"
            "x-amz-content-sha256:"
            "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072\n"
            "x-amz-date:20130524T000000Z\n"
            "x-amz-storage-class:REDUCED_REDUNDANCY\n\n"
            "date;host;x-amz-content-sha256;x-amz-date;x-amz-storage-class\n"
            "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072");
  EXPECT_EQ(s.string_to_sign,
            "AWS4-HMAC-SHA256\n20130524T000000Z\n20130524/us-east-1/s3/aws4_request\n"
            "9e0e90d9c76de8fa5b200d8c849cd5b8dc7a3be3951ddb7f6a76b4158342019d");
  EXPECT_EQ(signature_of(s), "98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd");
}

TEST(SigV4, AwsDocGetBucketLifecycleExample) {
  SigningRequest req;
  req.method = "GET";
  req.host = kDocHost;
  req.path = "/";
  req.query = {{"lifecycle", ""}};
  req.payload_sha256 = kEmptyPayloadSha256;
  SignedRequest s = sign_v4(req, kDocCreds, "us-east-1", "s3", kDocTime);
  EXPECT_TRUE(s.canonical_request.starts_with("GET\n/\nlifecycle=\nhost:"));
  EXPECT_EQ(s.string_to_sign.substr(s.string_to_sign.size() - 64),
            "9766c798316ff2757b517bc739a67f6213b4ab36dd5da2f94eaebf79c77395ca");
  EXPECT_EQ(signature_of(s), "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543");
}

TEST(SigV4, AwsDocListObjectsExample) {
  SigningRequest req;
  req.method = "GET";
  req.host = kDocHost;
  req.path = "";                                     // signed as "/"
  req.query = {{"prefix", "J"}, {"max-keys", "2"}};  // out of order on purpose
  req.payload_sha256 = kEmptyPayloadSha256;
  SignedRequest s = sign_v4(req, kDocCreds, "us-east-1", "s3", kDocTime);
  EXPECT_TRUE(s.canonical_request.starts_with("GET\n/\nmax-keys=2&prefix=J\nhost:"));
  EXPECT_EQ(signature_of(s), "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7");
}

// The GET Object example again with a session token. The expected value was produced by
// botocore 1.29 (S3SigV4Auth, time frozen at 2013-05-24T00:00:00Z); there is no AWS
// documentation vector with a token.
TEST(SigV4, SessionTokenIsSentAndSigned) {
  SigningRequest req;
  req.method = "GET";
  req.host = kDocHost;
  req.path = "/test.txt";
  req.headers = {{"Range", "bytes=0-9"}};
  req.payload_sha256 = kEmptyPayloadSha256;
  Credentials creds = kDocCreds;
  creds.session_token = "AQoDYXdzEJr//+example==";
  SignedRequest s = sign_v4(req, creds, "us-east-1", "s3", kDocTime);

  EXPECT_EQ(header(s, "x-amz-security-token"), "AQoDYXdzEJr//+example==");
  EXPECT_NE(s.canonical_request.find("\nx-amz-security-token:AQoDYXdzEJr//+example==\n"),
            std::string::npos);
  EXPECT_EQ(header(s, "Authorization"),
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
            "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date;x-amz-security-token, "
            "Signature=d5f9cab40204cf934cf69f8de063a82bd813dc050878efe810dd5a9688a79b2f");
  EXPECT_EQ(s.headers.size(), 4u);
}

TEST(SigV4, UnsignedPayloadIsSignedLiterally) {
  SigningRequest req;
  req.method = "PUT";
  req.host = "127.0.0.1:4568";
  req.path = "/bucket/key";
  req.payload_sha256 = kUnsignedPayload;
  SignedRequest s = sign_v4(req, kDocCreds, "us-east-1", "s3", kDocTime);
  EXPECT_EQ(header(s, "x-amz-content-sha256"), "UNSIGNED-PAYLOAD");
  EXPECT_TRUE(s.canonical_request.ends_with("\nUNSIGNED-PAYLOAD"));
  EXPECT_NE(s.canonical_request.find("\nx-amz-content-sha256:UNSIGNED-PAYLOAD\n"),
            std::string::npos);
}

TEST(SigV4, HeadersAreLowerCasedTrimmedSortedAndMerged) {
  SigningRequest req;
  req.method = "PUT";
  req.host = "127.0.0.1:4568";
  req.path = "/b/k";
  req.headers = {
      {"X-Amz-Meta-Zeta", "  a   b\t\tc  "},
      {" If-Match ", "\"etag\""},
      {"x-amz-meta-zeta", "second"},
      {"X-AMZ-META-EMPTY", "   "},
      {"X-Amz-Date", "19990101T000000Z"},  // produced by sign_v4: ignored
      {"Host", "evil.example"},            // likewise
      {"Authorization", "stale"},          // likewise
  };
  req.payload_sha256 = kEmptyPayloadSha256;
  SignedRequest s = sign_v4(req, kDocCreds, "us-east-1", "s3", kDocTime);
  EXPECT_EQ(s.canonical_request,
            "PUT\n/b/k\n\n"
            "host:127.0.0.1:4568\n"
            "if-match:\"etag\"\n"
            "x-amz-content-sha256:"
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\n"
            "x-amz-date:20130524T000000Z\n"
            "x-amz-meta-empty:\n"
            "x-amz-meta-zeta:a b c,second\n\n"
            "host;if-match;x-amz-content-sha256;x-amz-date;x-amz-meta-empty;x-amz-meta-zeta\n"
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST(SigV4, PathIsSignedExactlyAsGiven) {
  SigningRequest req;
  req.method = "GET";
  req.host = "127.0.0.1:4568";
  req.path = "/bucket/a//b/./../%2F" + uri_encode("x y+z", false);
  req.payload_sha256 = kEmptyPayloadSha256;
  SignedRequest s = sign_v4(req, kDocCreds, "us-east-1", "s3", kDocTime);
  // No normalisation and no second round of encoding ("%2F" stays, it is not "%252F").
  EXPECT_TRUE(s.canonical_request.starts_with("GET\n/bucket/a//b/./../%2Fx%20y%2Bz\n\n"));
}

TEST(UriEncode, KeepsUnreservedAndEncodesTheRest) {
  EXPECT_EQ(uri_encode("AZaz09-._~", true), "AZaz09-._~");
  EXPECT_EQ(uri_encode("a b", false), "a%20b");
  EXPECT_EQ(uri_encode("a+b", false), "a%2Bb");
  EXPECT_EQ(uri_encode("a*b", false), "a%2Ab");
  EXPECT_EQ(uri_encode("~user", true), "~user");
  EXPECT_EQ(uri_encode("100%", false), "100%25");
  EXPECT_EQ(uri_encode("k=v&x?#", true), "k%3Dv%26x%3F%23");
  EXPECT_EQ(uri_encode("!'()$@:,;", true), "%21%27%28%29%24%40%3A%2C%3B");
  EXPECT_EQ(uri_encode("", true), "");
}

TEST(UriEncode, SlashIsKeptOnlyInPaths) {
  EXPECT_EQ(uri_encode("dir/sub//file", false), "dir/sub//file");
  EXPECT_EQ(uri_encode("dir/sub//file", true), "dir%2Fsub%2F%2Ffile");
}

TEST(UriEncode, EncodesUtf8ByteByByteInUpperCase) {
  EXPECT_EQ(uri_encode("caf\xC3\xA9", false), "caf%C3%A9");                        // café
  EXPECT_EQ(uri_encode("\xE6\x97\xA5\xE6\x9C\xAC", false), "%E6%97%A5%E6%9C%AC");  // 日本
  EXPECT_EQ(uri_encode("\xF0\x9F\x99\x82", false), "%F0%9F%99%82");                // emoji
  EXPECT_EQ(uri_encode(std::string_view("\x00\x7f\xff", 3), true), "%00%7F%FF");
}

TEST(CanonicalQuery, SortsByEncodedNameThenValue) {
  EXPECT_EQ(canonical_query({}), "");
  EXPECT_EQ(canonical_query({{"uploads", ""}}), "uploads=");
  EXPECT_EQ(canonical_query({{"uploadId", "a/b+c=="}, {"partNumber", "2"}}),
            "partNumber=2&uploadId=a%2Fb%2Bc%3D%3D");
  // Upper case sorts before lower case (byte order), and a name that is a prefix of another
  // sorts first even though '-' < '=' would put "a-b=..." before "a=..." as strings.
  EXPECT_EQ(canonical_query({{"b", "1"}, {"a-b", "2"}, {"a", "3"}, {"Z", "4"}}),
            "Z=4&a=3&a-b=2&b=1");
  // Repeated names sort by encoded value: "%20" < "+"'s "%2B" < "A".
  EXPECT_EQ(canonical_query({{"k", "A"}, {"k", "+"}, {"k", " "}}), "k=%20&k=%2B&k=A");
  // Sorting is on the encoded form: '~' (kept, 0x7E) sorts after '%7B' ('{' encoded).
  EXPECT_EQ(canonical_query({{"~", "x"}, {"{", "y"}}), "%7B=y&~=x");
  EXPECT_EQ(
      canonical_query(
          {{"list-type", "2"}, {"prefix", "caf\xC3\xA9/ "}, {"continuation-token", "1/a+b=="}}),
      "continuation-token=1%2Fa%2Bb%3D%3D&list-type=2&prefix=caf%C3%A9%2F%20");
}

TEST(AmzDate, FormatsUtc) {
  EXPECT_EQ(amz_date(0), "19700101T000000Z");
  EXPECT_EQ(amz_date(kDocTime), "20130524T000000Z");
  EXPECT_EQ(amz_date(951782400), "20000229T000000Z");
  EXPECT_EQ(amz_date(4102444799), "20991231T235959Z");
}

TEST(Digests, KnownVectors) {
  EXPECT_EQ(sha256_hex(std::string_view()), kEmptyPayloadSha256);
  EXPECT_EQ(sha256_hex(bytes("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  // RFC 4231 test case 2.
  EXPECT_EQ(hmac_sha256_hex("Jefe", "what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  // RFC 1321 vectors, base64'd.
  EXPECT_EQ(md5_base64(bytes("")), "1B2M2Y8AsgTpgAmY7PhCfg==");
  EXPECT_EQ(md5_base64(bytes("abc")), "kAFQmDzST7DWlj99KOF/cg==");
}

}  // namespace
}  // namespace sluice::s3
