#include "sluice/core/endpoint.h"

#include <gtest/gtest.h>

namespace sluice {
namespace {

TEST(Endpoint, SpellingsOfOneServerAreTheSame) {
  EXPECT_TRUE(same_endpoint("http://127.0.0.1:4568", "http://127.0.0.1:4568/"));
  EXPECT_TRUE(same_endpoint("http://127.0.0.1:4568", "HTTP://LOCALHOST:4568"));
  EXPECT_TRUE(same_endpoint("http://s3.example.com", "http://s3.example.com:80"));
  EXPECT_TRUE(same_endpoint("https://s3.example.com", "https://S3.Example.com:0443/"));
  EXPECT_TRUE(same_endpoint("http://key@rgw:7480", "http://rgw:7480"));
  EXPECT_TRUE(same_endpoint("http://[::1]:9000", "http://[::1]:9000/"));
  EXPECT_EQ(endpoint_identity("http://localhost:4568/"), "http://127.0.0.1:4568");
}

TEST(Endpoint, DifferentServersDiffer) {
  EXPECT_FALSE(same_endpoint("http://127.0.0.1:4568", "http://127.0.0.1:9"));
  EXPECT_FALSE(same_endpoint("http://s3.example.com", "https://s3.example.com"));
  EXPECT_FALSE(same_endpoint("http://rgw:7480", "http://rgw:7480/other"));
  // A DNS name that starts like a loopback address is a name, not the loopback.
  EXPECT_FALSE(same_endpoint("http://127.corp.example:80", "http://127.0.0.1:80"));
  // IPv6's loopback is not IPv4's: a server bound to one is not reachable on the other.
  EXPECT_FALSE(same_endpoint("http://[::1]:4568", "http://127.0.0.1:4568"));
}

}  // namespace
}  // namespace sluice
