// The dataset catalog's binary form; see catalog.h and docs/formats/dataset-catalog.md.
#include "stream/catalog.h"

#include <xxhash.h>

#include <cstring>

namespace sluice::stream {
namespace {

constexpr char kMagic[8] = {'S', 'L', 'U', 'I', 'C', 'E', 'C', 'T'};
constexpr uint32_t kVersion = 1;

class Writer {
 public:
  void u8(uint8_t v) { out.push_back(static_cast<std::byte>(v)); }
  void u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) u8(static_cast<uint8_t>(v >> (8 * i)));
  }
  void u64(uint64_t v) {
    for (int i = 0; i < 8; ++i) u8(static_cast<uint8_t>(v >> (8 * i)));
  }
  void str(std::string_view s) {
    u32(static_cast<uint32_t>(s.size()));
    for (char c : s) u8(static_cast<uint8_t>(c));
  }
  std::vector<std::byte> out;
};

class Reader {
 public:
  explicit Reader(std::span<const std::byte> b) : b_(b) {}
  bool u8(uint8_t& v) {
    if (pos_ >= b_.size()) return false;
    v = static_cast<uint8_t>(b_[pos_++]);
    return true;
  }
  bool u32(uint32_t& v) { return num(v, 4); }
  bool u64(uint64_t& v) { return num(v, 8); }
  bool str(std::string& s, size_t max) {
    uint32_t n = 0;
    if (!u32(n) || n > max || b_.size() - pos_ < n) return false;
    s.assign(reinterpret_cast<const char*>(b_.data() + pos_), n);
    pos_ += n;
    return true;
  }
  bool done() const { return pos_ == b_.size(); }
  size_t left() const { return b_.size() - pos_; }

 private:
  template <typename T>
  bool num(T& v, size_t n) {
    if (b_.size() - pos_ < n) return false;
    v = 0;
    for (size_t i = 0; i < n; ++i) v |= T(static_cast<uint8_t>(b_[pos_ + i])) << (8 * i);
    pos_ += n;
    return true;
  }
  std::span<const std::byte> b_;
  size_t pos_ = 0;
};

}  // namespace

std::vector<std::byte> encode_catalog(const Catalog& c, std::string_view identity) {
  Writer w;
  for (char m : kMagic) w.u8(static_cast<uint8_t>(m));
  w.u32(kVersion);
  w.u32(c.tar ? 1 : 0);
  w.str(identity);
  w.u64(c.objects.size());
  for (size_t i = 0; i < c.objects.size(); ++i) {
    const auto& o = c.objects[i];
    w.str(o.key);
    w.u64(o.size);
    w.str(o.etag);
    if (!c.tar) continue;
    const auto& t = c.tables[i];
    w.u8(static_cast<uint8_t>((t.skipped ? 1 : 0) | (t.indexed ? 2 : 0)));
    w.u64(t.samples.size());
    for (const auto& e : t.samples) {
      w.str(e.key);
      w.u64(e.offset);
      w.u64(e.length);
    }
  }
  w.u64(XXH3_64bits(w.out.data(), w.out.size()));
  return std::move(w.out);
}

Result<Catalog> decode_catalog(std::span<const std::byte> bytes, std::string_view identity,
                               std::string_view what) {
  auto bad = [&](const std::string& why) {
    return fail(Code::kCorruption, "dataset catalog " + std::string(what) + ": " + why);
  };
  if (bytes.size() < 8 + 8 || std::memcmp(bytes.data(), kMagic, 8) != 0)
    return bad("not a dataset catalog");
  uint64_t sum = 0;
  std::memcpy(&sum, bytes.data() + bytes.size() - 8, 8);  // little-endian hosts
  if (sum != XXH3_64bits(bytes.data(), bytes.size() - 8)) return bad("checksum mismatch");
  Reader r(bytes.subspan(8, bytes.size() - 16));
  uint32_t version = 0, tar = 0;
  std::string id;
  uint64_t n = 0;
  if (!r.u32(version) || version != kVersion) return bad("unsupported version");
  if (!r.u32(tar) || tar > 1 || !r.str(id, 1 << 16)) return bad("truncated header");
  if (id != identity) return bad("written for another dataset");
  if (!r.u64(n) || n > r.left() / 16) return bad("object count out of range");
  Catalog c;
  c.tar = tar == 1;
  c.objects.resize(n);
  if (c.tar) c.tables.resize(n);
  for (uint64_t i = 0; i < n; ++i) {
    auto& o = c.objects[i];
    if (!r.str(o.key, 1024) || !r.u64(o.size) || !r.str(o.etag, 4096))
      return bad("entry " + std::to_string(i) + " is truncated");
    if (!c.tar) continue;
    auto& t = c.tables[i];
    uint8_t flags = 0;
    uint64_t count = 0;
    if (!r.u8(flags) || !r.u64(count) || count > r.left() / 20)
      return bad("table " + std::to_string(i) + " is truncated");
    t.skipped = flags & 1;
    t.indexed = flags & 2;
    t.samples.resize(count);
    for (auto& e : t.samples)
      if (!r.str(e.key, kMaxTarName) || !r.u64(e.offset) || !r.u64(e.length) || e.length > o.size ||
          e.offset > o.size - e.length)
        return bad("table " + std::to_string(i) + " has a bad entry");
  }
  if (!r.done()) return bad("trailing bytes");
  return c;
}

}  // namespace sluice::stream
