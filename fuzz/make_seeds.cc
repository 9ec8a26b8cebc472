// Writes the fuzzers' seed corpora (fuzz/corpus/<harness>/) from sluice's own encoders and
// from hand-written samples: valid inputs, and near-valid ones a byte or a field away.
//   build-fuzz/fuzz/sluice_fuzz_seeds fuzz/corpus
// Existing files of the same name are replaced; nothing else is removed.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cache/disk_tier.h"
#include "node/frame.h"
#include "sluice/cache/json.h"
#include "sluice/ckpt/manifest.h"
#include "sluice/core/hash.h"
#include "sluice/io/file_handle.h"
#include "sluice/stream/dataset.h"
#include "sluice/stream/tar.h"
#include "stream/catalog.h"

using namespace sluice;
namespace fs = std::filesystem;

namespace {

fs::path root;
int failures = 0;

void put(const std::string& harness, const std::string& name, std::string_view bytes) {
  fs::create_directories(root / harness);
  const fs::path p = root / harness / name;
  FILE* f = std::fopen(p.c_str(), "wb");
  if (!f || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) {
    std::fprintf(stderr, "cannot write %s\n", p.c_str());
    ++failures;
  }
  if (f) std::fclose(f);
}

void put(const std::string& harness, const std::string& name, std::span<const std::byte> b) {
  put(harness, name, std::string_view(reinterpret_cast<const char*>(b.data()), b.size()));
}

void expect(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "seed does not decode: %s\n", what);
    ++failures;
  }
}

// ---- checkpoints ------------------------------------------------------------------------

ckpt::ShardRecord record(unsigned rank, unsigned world) {
  ckpt::ShardRecord r;
  r.series = "llama-7b";
  r.step = 1200;
  r.rank = rank;
  r.world = world;
  r.chunk_size = 8192;
  r.save_id = "0123456789abcdef0123456789abcdef";
  r.run_id = "run-42";
  r.etag = "\"9b2cf535f27731c974343645a3985328\"";
  r.created_ns = 1'700'000'000'000'000'000;
  r.tensors = {{.name = "embed.weight", .dtype = "float32", .shape = {4, 1024}, .bytes = 16384},
               {.name = "norm.bias", .dtype = "bfloat16", .shape = {7}, .bytes = 14},
               {.name = "step", .dtype = "int64", .shape = {}, .bytes = 8}};
  r.bytes = ckpt::layout(r.tensors);
  for (auto& t : r.tensors) {
    const uint64_t n = t.bytes / r.chunk_size + (t.bytes % r.chunk_size != 0);
    for (uint64_t i = 0; i < n; ++i) t.chunks.push_back(0x1234abcd5678ef00ull + i);
  }
  r.tensors[2].mode = 0644;
  return r;
}

void ckpt_seeds() {
  const std::string rec = ckpt::encode_record(record(1, 2));
  expect(ckpt::decode_record(rec, "seed").has_value(), "record");
  put("ckpt_record_fuzz", "record.json", rec);
  ckpt::ShardRecord empty = record(0, 1);
  empty.tensors.clear();
  empty.bytes = 0;
  put("ckpt_record_fuzz", "record-empty.json", ckpt::encode_record(empty));
  std::string damaged = rec;
  damaged[damaged.find("\"step\"") + 8] ^= 1;  // a digit of the step: checksum mismatch
  put("ckpt_record_fuzz", "record-damaged.json", damaged);
  put("ckpt_record_fuzz", "live-marker", "sluice-live 1 node07 4242 123456789\n");

  ckpt::Manifest m;
  m.series = "llama-7b";
  m.step = 1200;
  m.world = 2;
  m.created_ns = 1'700'000'000'000'000'000;
  m.shards = {record(0, 2), record(1, 2)};
  const std::string man = ckpt::encode_manifest(m);
  expect(ckpt::decode_manifest(man, "seed").has_value(), "manifest");
  put("ckpt_manifest_fuzz", "manifest.json", man);
  m.world = 1;
  m.shards = {record(0, 1)};
  put("ckpt_manifest_fuzz", "manifest-one-rank.json", ckpt::encode_manifest(m));
  put("ckpt_manifest_fuzz", "manifest-truncated.json", man.substr(0, man.size() / 2));
}

// ---- tar shards, indexes, catalogs ----------------------------------------------------------

std::vector<std::byte> bytes(std::string_view s) {
  auto b = std::as_bytes(std::span(s.data(), s.size()));
  return {b.begin(), b.end()};
}

std::vector<std::byte> shard(stream::ShardIndex* index) {
  std::vector<std::byte> out;
  stream::TarWriter w([&](std::span<const std::byte> b) {
    out.insert(out.end(), b.begin(), b.end());
    return ok();
  });
  const std::string long_dir(120, 'd');
  struct File {
    std::string name, data;
  };
  const std::vector<std::vector<File>> samples = {
      {{"train/0001.jpg", "\xff\xd8\xff jpeg bytes"}, {"train/0001.cls", "7"}},
      {{"train/0002.jpg", ""}, {"train/0002.json", "{\"label\": 3}"}},
      {{long_dir + "/0003.txt", "a name over 100 bytes: a PAX header"}}};
  for (const auto& s : samples) {
    stream::ShardIndex::Entry e;
    e.offset = w.bytes();
    std::string field;
    for (const auto& f : s) {
      (void)w.add(f.name, bytes(f.data));
      if (e.key.empty()) (void)stream::split_sample_name(f.name, e.key, field);
    }
    e.length = w.bytes() - e.offset;
    if (index) index->samples.push_back(e);
  }
  (void)w.finish();
  if (index) index->shard_size = out.size();
  return out;
}

// A GNU tar entry with a long name ('L') and a base-256 size, by hand (TarWriter writes PAX).
std::vector<std::byte> gnu_shard() {
  std::vector<std::byte> out;
  auto header = [&](std::string_view name, uint64_t size, char type, bool base256) {
    std::array<char, 512> h{};
    std::memcpy(h.data(), name.data(), std::min<size_t>(name.size(), 100));
    std::snprintf(h.data() + 100, 8, "%07o", 0644);
    std::snprintf(h.data() + 108, 8, "%07o", 0);
    std::snprintf(h.data() + 116, 8, "%07o", 0);
    if (base256) {
      h[124] = static_cast<char>(0x80);
      for (int i = 0; i < 8; ++i) h[135 - i] = static_cast<char>(size >> (8 * i));
    } else {
      std::snprintf(h.data() + 124, 12, "%011llo", static_cast<unsigned long long>(size));
    }
    std::snprintf(h.data() + 136, 12, "%011o", 0);
    h[156] = type;
    std::memcpy(h.data() + 257, "ustar  ", 8);  // GNU magic and version
    std::memset(h.data() + 148, ' ', 8);
    unsigned sum = 0;
    for (char c : h) sum += static_cast<unsigned char>(c);
    std::snprintf(h.data() + 148, 7, "%06o", sum);
    auto b = std::as_bytes(std::span(h));
    out.insert(out.end(), b.begin(), b.end());
  };
  auto data = [&](std::string_view d) {
    auto b = bytes(d);
    out.insert(out.end(), b.begin(), b.end());
    out.resize((out.size() + 511) / 512 * 512);
  };
  const std::string long_name = std::string(150, 'n') + "/0001.bin";
  header("././@LongLink", long_name.size() + 1, 'L', false);
  data(long_name + '\0');
  header("ignored", 5, '0', true);
  data("bytes");
  header("dir/", 0, '5', false);
  out.resize(out.size() + 1024);
  return out;
}

void stream_seeds() {
  stream::ShardIndex index;
  const std::vector<std::byte> tar = shard(&index);
  expect(stream::parse_tar(
             [&](uint64_t o, size_t n) -> Result<std::span<const std::byte>> {
               return std::span<const std::byte>(tar).subspan(
                   o, std::min<uint64_t>(n, tar.size() - o));
             },
             0, tar.size(), "seed")
             .has_value(),
         "tar");
  put("tar_fuzz", "webdataset.tar", tar);
  put("tar_fuzz", "gnu-longname.tar", gnu_shard());
  put("tar_fuzz", "truncated.tar", std::span(tar).first(700));

  const std::vector<std::byte> idx = stream::encode_index(index);
  expect(stream::decode_index(idx, "seed").has_value(), "index");
  put("shard_index_fuzz", "shard.idx", idx);
  stream::ShardIndex empty;
  empty.shard_size = 1024;
  put("shard_index_fuzz", "empty.idx", stream::encode_index(empty));

  constexpr std::string_view kIdentity = "fuzz://dataset/ prefix=train/";
  stream::Catalog c;
  c.objects = {{.key = "train/shard-000000.tar", .size = tar.size(), .etag = "\"e1\""},
               {.key = "train/shard-000001.tar", .size = 2048, .etag = "\"e2\""}};
  c.tables.resize(2);
  c.tables[0].indexed = true;
  for (const auto& e : index.samples) c.tables[0].samples.push_back(e);
  c.tables[1].skipped = true;
  const std::vector<std::byte> cat = stream::encode_catalog(c, kIdentity);
  expect(stream::decode_catalog(cat, kIdentity, "seed").has_value(), "catalog");
  put("dataset_catalog_fuzz", "tar.catalog", cat);
  stream::Catalog objects;
  objects.tar = false;
  objects.objects = {{.key = "a/1.bin", .size = 10, .etag = "x"}};
  put("dataset_catalog_fuzz", "objects.catalog", stream::encode_catalog(objects, kIdentity));

  stream::ResumePoint p{.epoch = 3,
                        .position = 1200,
                        .samples = 50000,
                        .fingerprint = 0x9e3779b97f4a7c15ull,
                        .seed = 7,
                        .window = 4096,
                        .identity = 0x243f6a8885a308d3ull};
  const std::string token = stream::make_token(p);
  expect(stream::parse_token(token).has_value(), "token");
  put("resume_token_fuzz", "v3", token);
  put("resume_token_fuzz", "v3-body", token.substr(0, token.rfind('.')));
  put("resume_token_fuzz", "v1", "v1.3.1200.50000.9e3779b97f4a7c15.7.0");
}

// ---- node protocol --------------------------------------------------------------------------

std::string frame(node::FrameType type, uint64_t id, std::string json, std::string_view data = {}) {
  node::Frame f;
  f.type = static_cast<uint16_t>(type);
  f.request_id = id;
  f.json = std::move(json);
  f.data.resize(data.size());
  if (!data.empty()) std::memcpy(f.data.data(), data.data(), data.size());
  auto h = node::encode_header(f);
  std::string out(reinterpret_cast<const char*>(h.data()), h.size());
  return out + f.json + std::string(data);
}

void node_seeds() {
  using node::FrameType;
  put("node_frame_fuzz", "hello", frame(FrameType::kHello, 1, R"({"version":1})"));
  put("node_frame_fuzz", "stat",
      frame(FrameType::kStat, 2, R"({"root":"s3://bucket/data","key":"train/0001.tar"})"));
  put("node_frame_fuzz", "read",
      frame(
          FrameType::kRead, 3,
          R"({"root":"s3://bucket","key":"a/b","offset":0,"length":4194304,"if_match":"\"e\"","inline_only":false,"window":true})"));
  put("node_frame_fuzz", "list",
      frame(FrameType::kList, 4,
            R"({"root":"file:///data","prefix":"train/","continuation":"","max_keys":500})"));
  put("node_frame_fuzz", "declare",
      frame(
          FrameType::kDeclare, 5,
          R"({"root":"s3://bucket","reads":[{"key":"a","offset":0,"length":10},{"key":"b","offset":4096,"length":1}]})"));
  put("node_frame_fuzz", "chunks-evict-pin",
      frame(FrameType::kChunks, 6, R"({"prefix":"train/"})") +
          frame(FrameType::kEvict, 7, R"({"root":"s3://b","prefix":"x/"})") +
          frame(FrameType::kPin, 8, R"({"root":"s3://b","prefix":"x/","pinned":false})") +
          frame(FrameType::kWindow, 9, R"({"bytes":8388608})") +
          frame(FrameType::kWarm, 10, R"({"root":"s3://b","key":"k","offset":0,"length":100})"));
  put("node_frame_fuzz", "read-reply",
      frame(static_cast<FrameType>(node::response_type(FrameType::kRead)), 3,
            R"({"size":11,"etag":"e","pieces":[{"offset":0,"length":11,"data_offset":0}]})",
            "hello world"));
  put("node_frame_fuzz", "error",
      frame(FrameType::kError, 3, R"({"code":1,"code_name":"not_found","message":"no such key"})"));
  // node_server_fuzz: "TYPE JSON" lines against fuzz:// roots.
  put("node_server_fuzz", "every-request",
      "1 {\"version\":1}\n"
      "2 {\"root\":\"fuzz://b\",\"key\":\"a/small.bin\"}\n"
      "3 {\"root\":\"fuzz://b\",\"key\":\"a/chunked.bin\",\"offset\":1000,\"length\":200000}\n"
      "4 {\"root\":\"fuzz://b\",\"prefix\":\"a/\",\"max_keys\":2}\n"
      "5 {}\n"
      "6 {\"root\":\"fuzz://b\",\"prefix\":\"a/\"}\n"
      "7 {\"root\":\"fuzz://b\",\"prefix\":\"train/\",\"pinned\":true}\n"
      "8 {\"prefix\":\"a/\"}\n"
      "9 "
      "{\"root\":\"fuzz://b\",\"reads\":[{\"key\":\"a/"
      "chunked.bin\",\"offset\":0,\"length\":65536}]}\n"
      "11 {\"root\":\"fuzz://b\",\"key\":\"train/shard-000000.tar\"}\n");
  put("node_server_fuzz", "window-read",
      "10 {\"bytes\":1048576}\n"
      "3 "
      "{\"root\":\"fuzz://b\",\"key\":\"a/"
      "chunked.bin\",\"offset\":0,\"length\":307200,\"window\":true,\"if_match\":\"\"}\n"
      "3 "
      "{\"root\":\"fuzz://b\",\"key\":\"a/"
      "small.bin\",\"offset\":0,\"length\":10,\"inline_only\":true}\n");
  put("node_server_fuzz", "refused",
      "2 {\"root\":\"file:///etc\",\"key\":\"passwd\"}\n"
      "2 {\"root\":\"fuzz://b/../x\",\"key\":\"a\"}\n"
      "3 {\"root\":\"fuzz://b\",\"key\":\"../a\",\"offset\":0,\"length\":1}\n"
      "4 {\"root\":\"cache+fuzz://b\"}\n");

  std::string bad = frame(FrameType::kStat, 11, R"({"root":"s3://b","key":"k"})");
  bad[bad.size() - 3] ^= 1;  // the JSON changed under its checksum
  put("node_frame_fuzz", "bad-checksum", bad);
}

// ---- text formats ---------------------------------------------------------------------------

void text_seeds() {
  put("s3_xml_fuzz", "list.xml",
      R"(<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Name>bucket</Name><Prefix>data/train/</Prefix><KeyCount>2</KeyCount><MaxKeys>1000</MaxKeys><IsTruncated>true</IsTruncated><NextContinuationToken>1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM=</NextContinuationToken><Contents><Key>data/train/0001.tar</Key><LastModified>2024-05-01T12:00:00.000Z</LastModified><ETag>&quot;9b2cf535f27731c974343645a3985328&quot;</ETag><Size>268435456</Size><StorageClass>STANDARD</StorageClass></Contents><Contents><Key>data/train/0002.tar</Key><LastModified>2024-05-01T12:00:01.000Z</LastModified><ETag>"e2"</ETag><Size>0</Size></Contents></ListBucketResult>)");
  put("s3_xml_fuzz", "error.xml",
      R"(<?xml version="1.0" encoding="UTF-8"?>
<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message><RequestId>4442587FB7D0A2F9</RequestId></Error>)");
  put("s3_xml_fuzz", "delete.xml",
      R"(<DeleteResult><Deleted><Key>data/a</Key></Deleted><Error><Key>data/b</Key><Code>AccessDenied</Code><Message>Access Denied</Message></Error></DeleteResult>)");
  put("s3_xml_fuzz", "initiate.xml",
      R"(<InitiateMultipartUploadResult><Bucket>bucket</Bucket><Key>data/big</Key><UploadId>VXBsb2FkIElEIGZvciA2aWWpbmcncyBteS1tb3ZpZS5tMnRzIHVwbG9hZA</UploadId></InitiateMultipartUploadResult>)");
  put("s3_xml_fuzz", "complete-error.xml",
      R"(<Error><Code>InternalError</Code><Message>We encountered an internal error. Please try again.</Message></Error>)");
  put("s3_xml_fuzz", "not-xml", "<ListBucketResult><Contents><Key>a</Key>");

  for (auto [name, text] : std::initializer_list<std::pair<const char*, const char*>>{
           {"s3", "s3://bucket/data/train/\ns3://bucket/data/"},
           {"cache-file", "cache+file:///data/x\nfile:///"},
           {"mem", "mem://scratch/key\n*"},
           {"file-dots", "file:///data/../etc\nfile:///data"},
           {"plain", "/data/shards/0001.tar"},
           {"sluiced", "sluiced://node-7@10.0.0.7:7470/ckpt/\nsluiced://node-7@10.0.0.7:7470"},
           {"node", "node+s3://b/k\ns3://b"}})
    put("uri_fuzz", name, text);

  for (auto [name, text] :
       std::initializer_list<std::pair<const char*, const char*>>{{"k", "4K"},
                                                                  {"gib", "1.5GiB"},
                                                                  {"mb", "512MB"},
                                                                  {"t", "10T"},
                                                                  {"plain", "4096"},
                                                                  {"s", "90s"},
                                                                  {"d", "7d"},
                                                                  {"w", "2w"},
                                                                  {"frac", "0.5K"},
                                                                  {"secs", "2.5"}})
    put("sizes_fuzz", name, text);

  for (auto [name, text] : std::initializer_list<std::pair<const char*, const char*>>{
           {"sqlite", "sqlite:///var/lib/sluice/ledger.db"},
           {"path", "/home/u/.sluice/ledger.db"},
           {"pg", "postgresql://sluice:s3cret@db.example:5432/sluice?sslmode=require"},
           {"pg-query", "postgres://db/sluice?user=sluice&password=s3cret&connect_timeout=3"},
           {"location", "s3://bucket/team-a/"}})
    put("ledger_uri_fuzz", name, text);

  put("sluiced_config_fuzz", "full.json", R"({
  "socket": "/run/sluice/sluiced.sock",
  "cache_dir": "/nvme/sluice",
  "cache_ram": "8G",
  "cache_size": "2T",
  "chunk_size": "4M",
  "policy": "s3fifo",
  "revalidate_ms": 1000,
  "endpoint_url": "http://127.0.0.1:9000",
  "region": "us-east-1",
  "max_connections": 256,
  "max_connections_per_uid": 64,
  "idle_timeout_s": 300,
  "window_memory": "512M",
  "peer_listen": "10.0.0.7:7470",
  "peer_timeout_ms": 10000,
  "access_ttl_s": 60,
  "teams": [
    {"name": "vision", "uids": [1001, 1002], "roots": ["s3://images/", "file:///data/vision"]},
    {"name": "nlp", "uids": [2001], "roots": ["*"],
     "aws_access_key_id": "AKIDEXAMPLE", "aws_secret_access_key": "wJalrXUtnFEMI"},
    {"name": "ops", "uids": [0], "roots": ["s3://logs/"], "aws_profile": "ops"}
  ]
})");
  put("sluiced_config_fuzz", "bad-type.json", R"({"max_connections": "many", "teams": {}})");

  put("peer_hosts_fuzz", "hosts",
      std::string("# the job's daemons\nnode01 10.0.0.1:7470\nnode02 10.0.0.2:7470 fetch-only\n"
                  "10.0.0.3:7470\n\n") +
          std::string(1, '\0') + "gpu[001-004,010],login-a");
  put("peer_hosts_fuzz", "slurm", std::string(1, '\0') + "n[1-3],m[08-11],x");

  put("doctor_fuzz", "disk-stat",
      "  182431     5123  9877262    81234   291237    33123 18992112   912345        0   "
      "401234   993579        0        0        0        0    12345     4567\n");
  put("doctor_fuzz", "proc-io",
      "rchar: 323934931\nwchar: 323929600\nsyscr: 632687\nsyscw: 632675\nread_bytes: "
      "0\nwrite_bytes: 323932160\ncancelled_write_bytes: 0\n");
  put("doctor_fuzz", "task-stat",
      "4242 (sluice worker) S 1 4242 4242 0 -1 4194560 1234 0 0 0 512 128 0 0 20 0 8 0 "
      "123456 1234567 890 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 3 0 0 0 0 0\n");
  put("doctor_fuzz", "ceiling.json",
      R"({"target":"/dev/loop0","device":"loop0","direct":true,"direct_why":"","points":[{"engine":"uring","bs":4096,"qd":1,"bytes_s":1.2e8,"lat_us":33.1,"cpu":0.2},{"engine":"uring","bs":1048576,"qd":32,"bytes_s":3.1e9,"lat_us":10800,"cpu":0.4},{"engine":"buffered","bs":131072,"qd":1,"bytes_s":9e8,"lat_us":140,"cpu":1.0}]})");

  put("aws_config_fuzz", "credentials-and-config",
      std::string("[default]\naws_access_key_id = AKIDEXAMPLE\naws_secret_access_key = "
                  "wJalrXUtnFEMI/K7MDENG\n\n[fuzz]\naws_access_key_id=AK2\n"
                  "aws_secret_access_key=SK2\naws_session_token=TOKEN\n") +
          std::string(1, '\0') +
          "[default]\nregion = eu-west-1\n[profile fuzz]\nregion=us-west-2\n"
          "endpoint_url = http://127.0.0.1:9000\n");
  put("aws_config_fuzz", "broken", "[default\naws_access_key_id\n");

  put("peer_request_fuzz", "chunk",
      "GET\nroot=s3://bucket/data\nkey=train/0001.tar\netag=\"9b2c\"\nindex=3\noffset=0\n"
      "length=4194304\nverify=1\nX-Sluice-Node=node01\nX-Sluice-Target=node02\n"
      "X-Sluice-Time=1700000000\nX-Sluice-Signature=00ff\n");
  put("peer_request_fuzz", "object-part",
      "PUT\nop=part\nkey=upload-1\na=0\nb=4096\nX-Sluice-Node=node01\nX-Sluice-Target=node02\n"
      "X-Sluice-Time=1700000000\nX-Sluice-Body-Xxh3=0123456789abcdef\nX-Sluice-Signature=ab\n"
      "--\nGET\nop=list\nkey=ckpt/\nX-Sluice-Time=1700000001\n");
}

// ---- the NVMe tier's index log ----------------------------------------------------------------

// disk_log_fuzz: an index.log that DiskTier itself wrote (chunks of a large object sharing a
// segment, a small object, one removed), behind the harness's flags byte.
void disk_seeds() {
  const fs::path dir =
      fs::temp_directory_path() / ("sluice-seeds-disk-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  auto ctx = io::Context::open({});
  expect(ctx.has_value(), "an I/O context for the disk tier");
  if (!ctx) return;
  cache::DiskTier::Options o;
  o.directory = dir.string();
  o.capacity = 64 << 20;
  o.chunk_size = 64 << 10;
  o.io = *ctx;
  std::string log;
  {
    auto t = cache::DiskTier::open(o);
    expect(t.has_value(), "a fresh disk tier");
    if (!t) return;
    alignas(4096) static std::byte chunk[64 << 10];  // chunks are written 4 KiB-aligned
    std::memset(chunk, 0x5a, sizeof chunk);
    std::span<const std::byte> bytes(chunk, sizeof chunk);
    for (uint64_t i = 0; i < 3; ++i) {  // a 192 KiB object: one segment, appended
      cache::ChunkKey k{"s3://bucket", "train/shard-0001.tar", "\"e1\"", i};
      cache::ChunkView v{k, bytes, cache::checksum(bytes), 3 * bytes.size(), 1'700'000'000};
      expect((*t)->write(v, false).value_or(false), "a chunk written");
    }
    std::span<const std::byte> small(chunk, 100);
    cache::ChunkKey k{"file:///data", "a/b.json", "\"17-64\"", 0};
    cache::ChunkView v{k, small, cache::checksum(small), small.size(), 0};
    expect((*t)->write(v, true).value_or(false), "a small chunk written");
    (*t)->drop_if([](const cache::ChunkKey& c) { return c.index == 1; });  // a remove record
  }
  FILE* f = std::fopen((dir / "index.log").c_str(), "rb");
  for (int c; f && (c = std::fgetc(f)) != EOF;) log.push_back(static_cast<char>(c));
  if (f) std::fclose(f);
  fs::remove_all(dir);
  expect(log.size() > 24, "the tier wrote an index");
  auto seed = [&](const char* name, char flags, std::string_view body) {
    put("disk_log_fuzz", name, std::string(1, flags) + std::string(body));
  };
  seed("valid", 1 | 2 | 4 | 16, log);          // everything restored and readable
  seed("as-written", 0, log);                  // no segments: every record dropped
  seed("short-segments", 1 | 2 | 4 | 8, log);  // segments a page short
  seed("debris", 1 | 2 | 4 | 32, log);         // orphans beside the segments
  seed("torn-tail", 1 | 4, std::string_view(log).substr(0, log.size() - 5));
  seed("header-only", 1, std::string_view(log).substr(0, 24));
  std::string last = log;  // the first record names segment 2^48 - 1 (docs/testing.md, finding 11)
  for (int i = 0; i < 8; ++i)
    last[24 + 8 + i] = static_cast<char>(0xffffffffffff0000ull >> (8 * i));
  seed("last-segment", 1 | 2, last);
}

// ---- replies to the library's clients -----------------------------------------------------

// node_reply_fuzz: sections "OP\nREPLY" for the fake daemon (see the harness).
void node_reply_seeds() {
  const std::string hello =
      R"({"team":"fuzz","directory":"/var/cache/sluice","chunk_size":65536,"pid":4242,)"
      R"("windows":false,"s3_endpoint":"http://127.0.0.1:9000"})";
  std::string windowed = hello;
  windowed.replace(windowed.find("false"), 5, "true");
  const std::string data(256, 'd');
  const std::string sum = std::to_string(xxh3_64(data.data(), data.size()));
  put("node_reply_fuzz", "stat-list",
      "hello\n" + hello + "\n--\nopen\n" + hello +
          "\n--\nstat\n"
          R"({"size":300,"etag":"\"e1\"","mtime_ns":1700000000000000000})"
          "\n--\nlist\n"
          R"({"objects":[{"key":"a/b","size":300,"etag":"\"e1\"","mtime_ns":1700000000000000000},)"
          R"({"key":"a/c","size":0,"etag":"\"e2\""}],"next":"a/c",)"
          R"("skipped":[{"key":"a/d","reason":"permission denied"}]})"
          "\n--\nstat\n!"
          R"({"code":1,"code_name":"not_found","message":"no such key 'a/b'"})");
  put("node_reply_fuzz", "read-inline",
      "hello\n" + hello + "\n--\nopen\n" + hello +
          "\n--\nread\n"
          R"({"etag":"\"e1\"","pieces":[{"offset":100,"length":200,"data_offset":0}]})"
          "\n@" +
          data.substr(0, 200) + "\n--\nmore\n" + R"({"etag":"\"e1\"","pieces":[]})");
  put("node_reply_fuzz", "read-window",
      "hello\n" + windowed + "\n--\nopen\n" + windowed + "\n--\nread\n+{\"bytes\":8192}\n@" + data +
          "\n--\nmore\n" +
          R"({"etag":"\"e1\"","pieces":[{"offset":100,"length":256,"window_offset":4096}],)"
          R"("window_generation":0})");
  put("node_reply_fuzz", "read-handoff",
      "hello\n" + hello + "\n--\nopen\n" + hello + "\n--\nread\n+" +
          R"({"etag":"\"e1\"","pieces":[{"offset":100,"length":256,"fd":0,"file_offset":4096,"xxh3":)" +
          sum + "}]}\n@" + data + "\n--\ndeclare\n{}");
  nlohmann::json stat;
  cache::CacheStats cs;
  cs.ram.bytes = 1 << 20;
  cs.disk.chunks = 3;
  cs.misses = 7;
  cs.directory = "/var/cache/sluice";
  cs.policy = "s3fifo";
  cache::to_json(stat, cs);
  put("node_reply_fuzz", "control",
      "hello\n" + hello +
          "\n--\nwarm\n"
          R"({"size":1048576,"etag":"\"e1\"","end":1052672,"fetched":1048576,"not_kept":0})"
          "\n--\npin\n{\"chunks\":3}\n--\nevict\n{\"chunks\":2}\n--\nchunks\n"
          R"({"chunks":[{"root":"s3://bucket/data","key":"a/b","etag":"\"e1\"","index":0,)"
          R"("length":65536,"in_ram":true,"on_disk":true,"pinned":false}],"truncated":false})"
          "\n--\nstatus\n" +
          stat.dump());
}

// peer_object_reply_fuzz: sections "OP [STATUS]\nheaders\n\nbody" for the fake owner.
void peer_object_reply_seeds() {
  put("peer_object_reply_fuzz", "stat-list-read",
      "stat 200\nX-Sluice-Etag: \"e1\"\n\n"
      R"({"key":"ckpt/x/y","size":512,"etag":"\"e1\"","mtime_ns":1700000000000000000})"
      "\n--\nlist\n\n"
      R"({"objects":[{"key":"ckpt/x/y","size":512,"etag":"\"e1\"","mtime_ns":1700000000000000000},)"
      R"({"key":"ckpt/x/z","size":0,"etag":"\"e2\"","mtime_ns":0}],"next":"ckpt/x/z"})"
      "\n--\nread\nX-Sluice-Etag: \"e1\"\n\n" +
          std::string(512, 'r'));
  put("peer_object_reply_fuzz", "upload",
      "create\n\n{\"upload\":\"u-0123456789abcdef\"}\n--\nwrite\n\n\n--\nmore\n\n\n--\ncommit\n"
      "X-Sluice-Etag: \"e3\"\n\n"
      R"({"key":"ckpt/x/z","size":16,"etag":"\"e3\"","mtime_ns":1700000000000000000})"
      "\n--\nremove\n\n");
  put("peer_object_reply_fuzz", "errors",
      "stat 404\n\nno such object 'ckpt/x/y'\n\n--\nlist 403\n\nbad signature (another node "
      "secret?)\n--\nread 412\n\netag changed\n--\ncreate 507\n\nno space\n--\nstat\n"
      "X-Sluice-Reply-Signature: "
      "00\n\n{\"key\":\"ckpt/x/y\",\"size\":1,\"etag\":\"e\",\"mtime_ns\":0}");
}

// sluiced_uri_fuzz: a URI, then optionally a peers file.
void sluiced_uri_seeds() {
  for (auto [name, text] : std::initializer_list<std::pair<const char*, const char*>>{
           {"folder", "sluiced://node-7@10.0.0.7:7470/ckpt/"},
           {"no-folder", "sluiced://node-7@10.0.0.7:7470"},
           {"deep", "sluiced://n@host.example:1/a/b/c"},
           {"no-member", "sluiced://10.0.0.7:7470/ckpt/"},
           {"peer",
            "peer://ckpt/\nnode01 10.0.0.1:7470\nnode02 10.0.0.2:7470\n"
            "node03 10.0.0.3:7470 fetch-only\n"},
           {"peer-default", "peer://llama/run-1/"}})
    put("sluiced_uri_fuzz", name, text);
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR (fuzz/corpus)\n", argv[0]);
    return 2;
  }
  root = argv[1];
  ckpt_seeds();
  stream_seeds();
  node_seeds();
  text_seeds();
  disk_seeds();
  node_reply_seeds();
  peer_object_reply_seeds();
  sluiced_uri_seeds();
  return failures == 0 ? 0 : 1;
}
