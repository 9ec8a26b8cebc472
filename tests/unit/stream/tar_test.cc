// Tar parsing and writing, and the shard index.
#include "sluice/stream/tar.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>

#include "test_util.h"

namespace sluice::stream {
namespace {

using testing::as_bytes;

std::vector<std::byte> make_tar(const std::vector<std::pair<std::string, std::string>>& files,
                                bool finish = true) {
  std::vector<std::byte> out;
  TarWriter w([&](std::span<const std::byte> b) {
    out.insert(out.end(), b.begin(), b.end());
    return ok();
  });
  for (const auto& [name, data] : files) {
    EXPECT_TRUE(w.add(name, as_bytes(data)));
  }
  if (finish) {
    EXPECT_TRUE(w.finish());
  }
  EXPECT_EQ(w.bytes(), out.size());
  return out;
}

Result<std::vector<TarSample>> parse(const std::vector<std::byte>& tar) {
  ByteSource src = [&](uint64_t off, size_t n) -> Result<std::span<const std::byte>> {
    return std::span<const std::byte>(tar).subspan(off, std::min<uint64_t>(n, tar.size() - off));
  };
  return parse_tar(src, 0, tar.size(), "t.tar");
}

std::string bytes_at(const std::vector<std::byte>& tar, const TarField& f) {
  return std::string(reinterpret_cast<const char*>(tar.data() + f.offset), f.size);
}

TEST(Tar, GroupsFilesIntoSamplesByBasename) {
  std::string long_dir(150, 'd');
  auto tar = make_tar({{"a/0001.jpg", "JPEG"},
                       {"a/0001.cls", "7"},
                       {"a/0002.jpg", ""},  // an empty file is an empty field
                       {"a/0002.meta.json", "{}"},
                       {"README", "not a sample file"},
                       {"__meta__.json", "skipped"},
                       {long_dir + "/x.txt", "long"}});
  auto samples = parse(tar);
  ASSERT_TRUE(samples) << samples.error().to_string();
  ASSERT_EQ(samples->size(), 3u);
  EXPECT_EQ((*samples)[0].key, "a/0001");
  ASSERT_EQ((*samples)[0].fields.size(), 2u);
  EXPECT_EQ((*samples)[0].fields[0].name, "jpg");
  EXPECT_EQ(bytes_at(tar, (*samples)[0].fields[0]), "JPEG");
  EXPECT_EQ(bytes_at(tar, (*samples)[0].fields[1]), "7");
  EXPECT_EQ((*samples)[1].fields[0].size, 0u);
  EXPECT_EQ((*samples)[1].fields[1].name, "meta.json");
  EXPECT_EQ((*samples)[2].key, long_dir + "/x");
  EXPECT_EQ(bytes_at(tar, (*samples)[2].fields[0]), "long");
  // Each sample's range holds exactly that sample.
  for (const auto& s : *samples) {
    auto one = parse_tar_sample(std::span(tar).subspan(s.offset, s.length), s.offset, "t.tar");
    ASSERT_TRUE(one) << one.error().to_string();
    EXPECT_EQ(one->key, s.key);
    EXPECT_EQ(one->fields.size(), s.fields.size());
  }
}

TEST(Tar, SplitSampleName) {
  std::string k, f;
  EXPECT_TRUE(split_sample_name("./dir.v1/abc.x.y", k, f));
  EXPECT_EQ(k, "dir.v1/abc");
  EXPECT_EQ(f, "x.y");
  EXPECT_FALSE(split_sample_name("noext", k, f));
  EXPECT_FALSE(split_sample_name("d/.hidden", k, f));
  EXPECT_FALSE(split_sample_name("d/__key__.txt", k, f));
  EXPECT_FALSE(split_sample_name("trailing.", k, f));
}

TEST(Tar, BadChecksumNamesShardAndOffset) {
  auto tar = make_tar({{"a.txt", "1"}, {"b.txt", "2"}});
  tar[1024 + 10] = std::byte{'Z'};  // the second header's name
  auto r = parse(tar);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), Code::kCorruption);
  EXPECT_NE(r.error().message().find("t.tar at offset 1024"), std::string::npos)
      << r.error().message();
  EXPECT_NE(r.error().message().find("checksum"), std::string::npos);
}

TEST(Tar, ChecksumsSummedSignedAsOldTarsWroteThemAreAccepted) {
  // A name byte above 127: its unsigned and signed sums differ by 256. An old tar that
  // summed signed chars stored the signed sum; both are accepted, anything else is not.
  auto tar = make_tar({{"\xe9t\xe9.txt", "1"}});
  int64_t signed_sum = 8 * ' ';
  for (size_t i = 0; i < 512; ++i)
    if (i < 148 || i >= 156) signed_sum += static_cast<signed char>(tar[i]);
  char field[8];
  std::snprintf(field, sizeof field, "%06llo", static_cast<unsigned long long>(signed_sum));
  std::memcpy(tar.data() + 148, field, 7);
  auto r = parse(tar);
  ASSERT_TRUE(r) << r.error().message();
  ASSERT_EQ(r->size(), 1u);
  std::snprintf(field, sizeof field, "%06llo", static_cast<unsigned long long>(signed_sum + 1));
  std::memcpy(tar.data() + 148, field, 7);
  EXPECT_FALSE(parse(tar));
}

TEST(Tar, TruncatedArchiveIsCorruption) {
  auto tar = make_tar({{"a.txt", std::string(3000, 'a')}}, /*finish=*/false);
  tar.resize(2048);  // the data runs past the end
  auto r = parse(tar);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), Code::kCorruption);
  EXPECT_NE(r.error().message().find("runs past the end"), std::string::npos);
  auto two = make_tar({{"a.txt", "1"}, {"b.txt", "2"}});
  two.resize(1024 + 100);  // the second header is torn
  r = parse(two);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message().find("truncated tar header"), std::string::npos);
}

TEST(Tar, ArchiveWithoutEndMarkerEndsAtItsSize) {
  auto tar = make_tar({{"a.txt", "1"}}, /*finish=*/false);
  auto r = parse(tar);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->size(), 1u);
}

// Issue 47, item 4: a page zeroed in the middle of a shard (what a torn write leaves) read
// as the end of the archive, and the samples after it were dropped without a word.
TEST(Tar, ZeroBlocksFollowedByDataAreCorruption) {
  std::vector<std::pair<std::string, std::string>> files;
  for (int i = 0; i < 20; ++i)
    files.push_back(
        {"s" + std::to_string(100 + i) + ".bin", std::string(1500, static_cast<char>('a' + i))});
  auto tar = make_tar(files);
  ASSERT_TRUE(parse(tar));
  EXPECT_EQ(parse(tar)->size(), 20u);
  auto torn = tar;
  const size_t page = 4096 * (tar.size() / 4096 / 2);
  std::fill(torn.begin() + page, torn.begin() + page + 4096, std::byte{0});
  auto r = parse(torn);
  ASSERT_FALSE(r) << r->size() << " samples";
  EXPECT_EQ(r.error().code(), Code::kCorruption);
  EXPECT_NE(r.error().message().find("t.tar"), std::string::npos) << r.error().message();
  EXPECT_NE(r.error().message().find("followed by data at offset"), std::string::npos)
      << r.error().message();
  // Zeros to the end (the end blocks, a record's padding) are a well-formed end.
  auto padded = tar;
  padded.resize(tar.size() + 10240, std::byte{0});
  ASSERT_TRUE(parse(padded));
  EXPECT_EQ(parse(padded)->size(), 20u);
}

TEST(Tar, HostileSizeFieldsAreRefused) {
  auto tar = make_tar({{"a.txt", "1"}});
  // A base-256 size of 2^63: must not overflow the offset arithmetic.
  std::byte* h = tar.data();
  std::memset(h + 124, 0, 12);
  h[124] = std::byte{0x80};
  h[128] = std::byte{0x80};
  std::memset(h + 148, ' ', 8);
  unsigned sum = 0;
  for (int i = 0; i < 512; ++i) sum += static_cast<unsigned char>(h[i]);
  std::snprintf(reinterpret_cast<char*>(h) + 148, 8, "%06o", sum);
  auto r = parse(tar);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code(), Code::kCorruption);
}

TEST(ShardIndex, RoundTripAndDamage) {
  ShardIndex idx{.shard_size = 8192, .samples = {{"a", 0, 1024}, {"b/c", 1024, 2048}}};
  auto bytes = encode_index(idx);
  auto back = decode_index(bytes, "x.idx");
  ASSERT_TRUE(back) << back.error().to_string();
  EXPECT_EQ(back->shard_size, 8192u);
  ASSERT_EQ(back->samples.size(), 2u);
  EXPECT_EQ(back->samples[1].key, "b/c");
  EXPECT_EQ(back->samples[1].length, 2048u);
  auto damaged = bytes;
  damaged[30] ^= std::byte{1};
  auto r = decode_index(damaged, "x.idx");
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message().find("x.idx"), std::string::npos);
  EXPECT_FALSE(decode_index(std::span(bytes).first(20), "x.idx"));
  // Ranges outside the shard or overlapping are refused even with a good checksum.
  ShardIndex bad{.shard_size = 1024, .samples = {{"a", 0, 1024}, {"b", 512, 512}}};
  EXPECT_FALSE(decode_index(encode_index(bad), "bad.idx"));
  ShardIndex outside{.shard_size = 1024, .samples = {{"a", 512, 1024}}};
  EXPECT_FALSE(decode_index(encode_index(outside), "bad.idx"));
}

}  // namespace
}  // namespace sluice::stream
