// Tar parsing and writing for WebDataset shards, and the shard index's binary form.
#include "sluice/stream/tar.h"

#include <xxhash.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cstring>
#include <optional>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace sluice::stream {
namespace {

constexpr size_t kMaxPaxBytes = size_t{1} << 20;
constexpr uint64_t kMaxEntrySize = uint64_t{1} << 46;  // 64 TiB: offsets cannot overflow

uint64_t round_block(uint64_t n) {
  return (n + kTarBlock - 1) / kTarBlock * kTarBlock;
}

std::string at(std::string_view shard, uint64_t offset) {
  return "shard " + std::string(shard) + " at offset " + std::to_string(offset);
}

std::string field_string(const std::byte* p, size_t n) {
  const char* c = reinterpret_cast<const char*>(p);
  return std::string(c, strnlen(c, n));
}

// An octal number (spaces or NUL around it), or GNU base-256 when the top bit is set.
bool parse_number(const std::byte* p, size_t n, uint64_t& out) {
  auto u = [&](size_t i) { return static_cast<unsigned char>(p[i]); };
  out = 0;
  if (u(0) & 0x80) {
    if (u(0) != 0x80) return false;  // negative, or larger than 64 bits with the 0x7f bits
    for (size_t i = 1; i < n; ++i) {
      if (out >> 56) return false;
      out = (out << 8) | u(i);
    }
    return true;
  }
  size_t i = 0;
  while (i < n && u(i) == ' ') ++i;
  bool digits = false;
  for (; i < n && u(i) >= '0' && u(i) <= '7'; ++i) {
    if (out >> 60) return false;
    out = out * 8 + (u(i) - '0');
    digits = true;
  }
  for (; i < n; ++i)
    if (u(i) != ' ' && u(i) != 0) return false;
  return digits;
}

// The sum of a header's 512 bytes, unsigned. On x86-64 (SSE2 always) by PSADBW, eight
// bytes to a lane at a time: the plain loop the compiler made of it widened each byte to
// 64 bits, and this runs once a sample, a million times a second for small ones.
uint64_t byte_sum(const std::byte* h) {
#if defined(__x86_64__)
  __m128i acc = _mm_setzero_si128();
  const __m128i zero = _mm_setzero_si128();
  for (size_t i = 0; i < kTarBlock; i += 16) {
    __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i));
    acc = _mm_add_epi64(acc, _mm_sad_epu8(v, zero));
  }
  return static_cast<uint64_t>(_mm_cvtsi128_si64(acc)) +
         static_cast<uint64_t>(_mm_cvtsi128_si64(_mm_unpackhi_epi64(acc, acc)));
#else
  const auto* u = reinterpret_cast<const unsigned char*>(h);
  uint64_t sum = 0;
  for (size_t i = 0; i < kTarBlock; ++i) sum += u[i];
  return sum;
#endif
}

// The header's checksum: the sum of its bytes with the checksum field read as spaces,
// unsigned as POSIX says, or signed as some old tars wrote it (only looked for when the
// unsigned sum does not match).
bool checksum_ok(const std::byte* h) {
  uint64_t stored = 0;
  if (!parse_number(h + 148, 8, stored)) return false;
  const auto* u = reinterpret_cast<const unsigned char*>(h);
  uint64_t unsigned_sum = 8 * ' ' + byte_sum(h);
  for (size_t i = 148; i < 156; ++i) unsigned_sum -= u[i];
  if (stored == unsigned_sum) return true;
  const auto* s = reinterpret_cast<const signed char*>(h);
  int64_t signed_sum = 8 * ' ';
  for (size_t i = 0; i < kTarBlock; ++i) signed_sum += s[i];
  for (size_t i = 148; i < 156; ++i) signed_sum -= s[i];
  return static_cast<int64_t>(stored) == signed_sum;
}

bool all_zero(std::span<const std::byte> b) {
  static constexpr std::byte kZeros[kTarBlock] = {};
  if (b.size() == kTarBlock) return std::memcmp(b.data(), kZeros, kTarBlock) == 0;
  return std::all_of(b.begin(), b.end(), [](std::byte x) { return x == std::byte{0}; });
}

// After the end-of-archive block at `zero`, the rest up to `end` must be zeros too (the
// second end block, a record's padding). Data after zeros is what a torn or zeroed write
// leaves in the middle of a shard: ending there would drop every sample after it silently.
// Reads the rest a MiB at a time; a well-formed archive has at most a record (10 KiB) left.
Status only_zeros_after(const ByteSource& source, uint64_t zero, uint64_t end,
                        std::string_view shard) {
  for (uint64_t pos = zero + kTarBlock; pos < end;) {
    SLUICE_ASSIGN_OR_RETURN(auto b, source(pos, std::min<uint64_t>(end - pos, 1 << 20)));
    if (b.empty()) break;  // the source ends before `end`: nothing more to look at
    auto data = std::find_if(b.begin(), b.end(), [](std::byte x) { return x != std::byte{0}; });
    if (data != b.end())
      return fail(Code::kCorruption,
                  at(shard, zero) + ": zero blocks followed by data at offset " +
                      std::to_string(pos + static_cast<uint64_t>(data - b.begin())) +
                      " (a torn or zeroed write?); the samples after it would be lost");
    pos += b.size();
  }
  return ok();
}

// PAX records "LEN key=value\n"; takes path and size.
// `has_size`: whether a size record was there (plain members: gcc 12 takes an optional's
// value for uninitialized in parse_tar once this file inlines more).
bool parse_pax(std::string_view body, std::string& path, uint64_t& size, bool& has_size) {
  while (!body.empty()) {
    size_t len = 0;
    auto [p, ec] = std::from_chars(body.data(), body.data() + body.size(), len);
    if (ec != std::errc{} || len == 0 || len > body.size() || *p != ' ') return false;
    std::string_view rec = body.substr(0, len);
    body.remove_prefix(len);
    if (rec.back() != '\n') return false;
    rec.remove_prefix(static_cast<size_t>(p - rec.data()) + 1);
    rec.remove_suffix(1);
    size_t eq = rec.find('=');
    if (eq == std::string_view::npos) return false;
    std::string_view k = rec.substr(0, eq), v = rec.substr(eq + 1);
    if (k == "path") {
      path.assign(v);
    } else if (k == "size") {
      uint64_t s = 0;
      auto [q, ec2] = std::from_chars(v.data(), v.data() + v.size(), s);
      if (ec2 != std::errc{} || q != v.data() + v.size()) return false;
      size = s;
      has_size = true;
    }
  }
  return true;
}

}  // namespace

bool split_sample_name(std::string_view path, std::string_view& key, std::string_view& field) {
  while (path.starts_with("./")) path.remove_prefix(2);
  size_t slash = path.rfind('/');
  size_t base = slash == std::string_view::npos ? 0 : slash + 1;
  if (path.substr(base).starts_with("__")) return false;
  size_t dot = path.find('.', base);
  if (dot == std::string_view::npos || dot == base || dot + 1 == path.size()) return false;
  key = path.substr(0, dot);
  field = path.substr(dot + 1);
  return true;
}

bool split_sample_name(std::string_view path, std::string& key, std::string& field) {
  std::string_view k, f;
  if (!split_sample_name(path, k, f)) return false;
  key.assign(k);
  field.assign(f);
  return true;
}

Result<std::vector<TarSample>> parse_tar(const ByteSource& source, uint64_t begin, uint64_t end,
                                         std::string_view shard) {
  std::vector<TarSample> samples;
  std::string long_name, pax_path;
  uint64_t pax_size = 0;
  bool has_pax_size = false;
  uint64_t pos = begin;
  uint64_t entry_start = begin;  // where the current file's headers (L, x, then its own) began
  auto corrupt = [&](uint64_t off, const std::string& why) {
    return fail(Code::kCorruption, at(shard, off) + ": " + why);
  };
  while (pos < end) {
    if (end - pos < kTarBlock) return corrupt(pos, "truncated tar header");
    SLUICE_ASSIGN_OR_RETURN(auto h, source(pos, kTarBlock));
    if (h.size() < kTarBlock) return corrupt(pos, "truncated tar header");
    // End of archive: a zero block (a header's name never starts with NUL, so only such a
    // block is compared whole), and nothing but zeros after it.
    if (h[0] == std::byte{0} && all_zero(h.first(kTarBlock))) {
      SLUICE_RETURN_IF_ERROR(only_zeros_after(source, pos, end, shard));
      break;
    }
    if (!checksum_ok(h.data())) return corrupt(pos, "bad tar header checksum");
    uint64_t size = 0;
    if (!parse_number(h.data() + 124, 12, size))
      return corrupt(pos, "bad size field in tar header");
    char type = static_cast<char>(h[156]);
    std::string name = field_string(h.data(), 100);
    bool posix = std::memcmp(h.data() + 257,
                             "ustar\0"
                             "00",
                             8) == 0;
    if (posix && h[345] != std::byte{0}) name = field_string(h.data() + 345, 155) + "/" + name;
    if (has_pax_size && type != 'x' && type != 'L') size = pax_size;
    if (size > kMaxEntrySize) return corrupt(pos, "tar entry size out of range");
    uint64_t data = pos + kTarBlock;
    uint64_t next = data + round_block(size);
    if (next > end || next < data)
      return corrupt(pos, "tar entry of " + std::to_string(size) + " bytes runs past the end");
    auto read_body = [&](size_t limit) -> Result<std::string> {
      if (size > limit) return corrupt(pos, "tar extended header too large");
      SLUICE_ASSIGN_OR_RETURN(auto b, source(data, size));
      if (b.size() < size) return corrupt(data, "truncated tar extended header");
      return std::string(reinterpret_cast<const char*>(b.data()), size);
    };
    if (type == 'L') {
      SLUICE_ASSIGN_OR_RETURN(long_name, read_body(kMaxTarName));
      long_name.resize(strnlen(long_name.c_str(), long_name.size()));
      pos = next;
      continue;
    }
    if (type == 'x') {
      SLUICE_ASSIGN_OR_RETURN(auto body, read_body(kMaxPaxBytes));
      if (!parse_pax(body, pax_path, pax_size, has_pax_size))
        return corrupt(data, "malformed PAX header");
      if (pax_path.size() > kMaxTarName) return corrupt(data, "PAX path too long");
      pos = next;
      continue;
    }
    if (!pax_path.empty())
      name = pax_path;
    else if (!long_name.empty())
      name = long_name;
    long_name.clear();
    pax_path.clear();
    has_pax_size = false;
    bool regular = type == '0' || type == '\0' || type == '7';
    std::string key, field;
    if (regular && split_sample_name(name, key, field)) {
      if (samples.empty() || samples.back().key != key)
        samples.push_back(TarSample{std::move(key), entry_start, 0, {}});
      TarSample& s = samples.back();
      s.fields.push_back(TarField{std::move(field), data, size});
      s.length = next - s.offset;
    }
    pos = next;
    entry_start = next;
  }
  if (!long_name.empty() || !pax_path.empty() || has_pax_size)
    return corrupt(pos, "extended header without the entry it describes");
  return samples;
}

namespace {

// The common case of one sample in memory: plain ustar (or v7) headers of regular files,
// no long names or PAX records. Checks what parse_tar checks, without its source calls and
// lists, into `out`'s memory (this runs once a sample, a million times a second for small
// ones). nullopt: a header it does not handle, for parse_tar to take.
std::optional<Status> parse_plain_sample(std::span<const std::byte> bytes, uint64_t offset,
                                         std::string_view shard, TarSample& out) {
  out.offset = offset;
  size_t fields = 0;
  uint64_t pos = 0;
  while (pos < bytes.size()) {
    if (bytes.size() - pos < kTarBlock) return std::nullopt;
    const std::byte* h = bytes.data() + pos;
    const char type = static_cast<char>(h[156]);
    if (h[0] == std::byte{0} || !(type == '0' || type == '\0' || type == '7'))
      return std::nullopt;  // an end marker, a long name, PAX, a directory...
    if (!checksum_ok(h))
      return std::optional<Status>(
          fail(Code::kCorruption, at(shard, offset + pos) + ": bad tar header checksum"));
    uint64_t size = 0;
    if (!parse_number(h + 124, 12, size) || size > kMaxEntrySize)
      return std::nullopt;  // parse_tar names it
    const char* c = reinterpret_cast<const char*>(h);
    std::string_view name(c, strnlen(c, 100));
    const bool posix = std::memcmp(h + 257,
                                   "ustar\0"
                                   "00",
                                   8) == 0;
    if (posix && h[345] != std::byte{0}) return std::nullopt;  // a prefix: parse_tar joins it
    const uint64_t next = pos + kTarBlock + round_block(size);
    if (next > bytes.size()) return std::nullopt;
    std::string_view key, field;
    if (!split_sample_name(name, key, field)) return std::nullopt;
    if (fields == 0)
      out.key.assign(key);
    else if (key != out.key)
      return std::nullopt;  // two samples: parse_tar says so
    if (fields == out.fields.size()) out.fields.emplace_back();
    TarField& f = out.fields[fields++];
    f.name.assign(field);
    f.offset = offset + pos + kTarBlock;
    f.size = size;
    pos = next;
  }
  if (fields == 0) return std::nullopt;
  out.fields.resize(fields);
  out.length = pos;
  return std::optional<Status>(ok());
}

}  // namespace

Status parse_tar_sample(std::span<const std::byte> bytes, uint64_t offset, std::string_view shard,
                        TarSample& out) {
  if (auto plain = parse_plain_sample(bytes, offset, shard, out)) return *plain;
  ByteSource mem = [&](uint64_t off, size_t n) -> Result<std::span<const std::byte>> {
    uint64_t rel = off - offset;
    if (off < offset || rel > bytes.size()) return fail(Code::kInternal, "read outside the sample");
    return bytes.subspan(rel, std::min<uint64_t>(n, bytes.size() - rel));
  };
  SLUICE_ASSIGN_OR_RETURN(auto samples, parse_tar(mem, offset, offset + bytes.size(), shard));
  if (samples.size() != 1)
    return fail(Code::kCorruption, at(shard, offset) + ": expected one sample, found " +
                                       std::to_string(samples.size()) +
                                       " (the index does not match the shard)");
  out = std::move(samples.front());
  return ok();
}

Result<TarSample> parse_tar_sample(std::span<const std::byte> bytes, uint64_t offset,
                                   std::string_view shard) {
  TarSample out;
  SLUICE_RETURN_IF_ERROR(parse_tar_sample(bytes, offset, shard, out));
  return out;
}

uint64_t tar_file_bytes(std::string_view name, uint64_t size) {
  uint64_t n = kTarBlock + round_block(size);
  if (name.size() > 100) {
    std::string rec = " path=" + std::string(name) + "\n";
    size_t len = rec.size() + 1;
    while (std::to_string(len).size() + rec.size() != len) ++len;
    n += kTarBlock + round_block(len);
  }
  return n;
}

Status TarWriter::pad(uint64_t size) {
  static const std::array<std::byte, kTarBlock> zeros{};
  uint64_t rest = round_block(size) - size;
  if (rest == 0) return ok();
  offset_ += rest;
  return sink_(std::span(zeros).first(rest));
}

Status TarWriter::header(std::string_view name, uint64_t size, char type, int64_t mtime_s) {
  std::array<char, kTarBlock> h{};
  std::memcpy(h.data(), name.data(), std::min<size_t>(name.size(), 100));
  std::snprintf(h.data() + 100, 8, "%07o", 0644);
  std::snprintf(h.data() + 108, 8, "%07o", 0);
  std::snprintf(h.data() + 116, 8, "%07o", 0);
  std::snprintf(h.data() + 124, 12, "%011llo",
                static_cast<unsigned long long>(std::min<uint64_t>(size, 077777777777)));
  std::snprintf(h.data() + 136, 12, "%011llo",
                static_cast<unsigned long long>(std::max<int64_t>(0, mtime_s) & 077777777777));
  h[156] = type;
  std::memcpy(h.data() + 257,
              "ustar\0"
              "00",
              8);
  std::memset(h.data() + 148, ' ', 8);
  unsigned sum = 0;
  for (char c : h) sum += static_cast<unsigned char>(c);
  std::snprintf(h.data() + 148, 8, "%06o", sum);
  h[155] = ' ';
  offset_ += kTarBlock;
  return sink_(std::as_bytes(std::span(h)));
}

Status TarWriter::add(std::string_view name, std::span<const std::byte> data, int64_t mtime_s) {
  if (name.empty() || name.size() > kMaxTarName)
    return fail(Code::kInvalidArgument, "tar entry name must be 1 to 4096 bytes");
  if (name.size() > 100 || data.size() > 077777777777) {
    std::string recs;
    auto add_record = [&](const std::string& kv) {
      std::string rec = " " + kv + "\n";
      size_t len = rec.size() + 1;
      while (std::to_string(len).size() + rec.size() != len) ++len;
      recs += std::to_string(len) + rec;
    };
    if (name.size() > 100) add_record("path=" + std::string(name));
    if (data.size() > 077777777777) add_record("size=" + std::to_string(data.size()));
    SLUICE_RETURN_IF_ERROR(header("PaxHeader", recs.size(), 'x', mtime_s));
    offset_ += recs.size();
    SLUICE_RETURN_IF_ERROR(sink_(std::as_bytes(std::span(recs))));
    SLUICE_RETURN_IF_ERROR(pad(recs.size()));
  }
  SLUICE_RETURN_IF_ERROR(header(name, data.size(), '0', mtime_s));
  offset_ += data.size();
  if (!data.empty()) SLUICE_RETURN_IF_ERROR(sink_(data));
  return pad(data.size());
}

Status TarWriter::finish() {
  static const std::array<std::byte, 2 * kTarBlock> zeros{};
  offset_ += zeros.size();
  return sink_(zeros);
}

// ---- shard index -----------------------------------------------------------------------

namespace {
constexpr char kMagic[8] = {'S', 'L', 'U', 'I', 'C', 'E', 'I', 'X'};
constexpr uint32_t kVersion = 1;

void put_u64(std::vector<std::byte>& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::byte>(v >> (8 * i)));
}
void put_u32(std::vector<std::byte>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<std::byte>(v >> (8 * i)));
}
}  // namespace

std::vector<std::byte> encode_index(const ShardIndex& index) {
  std::vector<std::byte> out(sizeof kMagic);
  std::memcpy(out.data(), kMagic, sizeof kMagic);
  put_u32(out, kVersion);
  put_u32(out, 0);
  put_u64(out, index.shard_size);
  put_u64(out, index.samples.size());
  for (const auto& e : index.samples) {
    put_u64(out, e.offset);
    put_u64(out, e.length);
    put_u32(out, static_cast<uint32_t>(e.key.size()));
    for (char c : e.key) out.push_back(static_cast<std::byte>(c));
  }
  put_u64(out, XXH3_64bits(out.data(), out.size()));
  return out;
}

Result<ShardIndex> decode_index(std::span<const std::byte> bytes, std::string_view what) {
  auto bad = [&](const std::string& why) {
    return fail(Code::kCorruption, "shard index " + std::string(what) + ": " + why);
  };
  size_t pos = 0;
  auto get = [&](size_t n, uint64_t& v) {
    if (bytes.size() - pos < n) return false;
    v = 0;
    for (size_t i = 0; i < n; ++i)
      v |= uint64_t(static_cast<unsigned char>(bytes[pos + i])) << (8 * i);
    pos += n;
    return true;
  };
  if (bytes.size() < 40 || std::memcmp(bytes.data(), kMagic, 8) != 0)
    return bad("not a shard index");
  uint64_t sum = 0;
  std::memcpy(&sum, bytes.data() + bytes.size() - 8, 8);  // little-endian hosts only (x86, arm64)
  if (sum != XXH3_64bits(bytes.data(), bytes.size() - 8)) return bad("checksum mismatch");
  bytes = bytes.first(bytes.size() - 8);
  pos = 8;
  uint64_t version = 0, flags = 0, count = 0;
  ShardIndex index;
  get(4, version);
  get(4, flags);
  get(8, index.shard_size);
  get(8, count);
  if (version != kVersion) return bad("version " + std::to_string(version) + " is not supported");
  if (count > (bytes.size() - pos) / 20) return bad("sample count out of range");
  index.samples.reserve(count);
  uint64_t prev_end = 0;
  for (uint64_t i = 0; i < count; ++i) {
    ShardIndex::Entry e;
    uint64_t klen = 0;
    if (!get(8, e.offset) || !get(8, e.length) || !get(4, klen) || klen == 0 ||
        klen > kMaxTarName || bytes.size() - pos < klen)
      return bad("entry " + std::to_string(i) + " is truncated");
    e.key.assign(reinterpret_cast<const char*>(bytes.data() + pos), klen);
    pos += klen;
    if (e.offset < prev_end || e.length == 0 || e.offset % kTarBlock || e.length % kTarBlock ||
        e.length > index.shard_size || e.offset > index.shard_size - e.length)
      return bad("entry " + std::to_string(i) + " (" + e.key + ") has a bad range");
    prev_end = e.offset + e.length;
    index.samples.push_back(std::move(e));
  }
  if (pos != bytes.size()) return bad("trailing bytes");
  return index;
}

}  // namespace sluice::stream
