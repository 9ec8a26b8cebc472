// Checkpoint records and manifests: JSON, checked as untrusted input on the way in.
#include "sluice/ckpt/manifest.h"

#include "sluice/store/store.h"

#include <xxhash.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <type_traits>

namespace sluice::ckpt {

namespace {

using nlohmann::json;

constexpr const char* kRecordFormat = "sluice-checkpoint-shard";
constexpr const char* kManifestFormat = "sluice-checkpoint";
constexpr uint64_t kMaxChunkSize = uint64_t{1} << 30;
constexpr size_t kMaxTensors = 1 << 20;
constexpr size_t kMaxRanks = 1 << 16;

// The checksum covers the document's compact form without the checksum field; nlohmann
// keeps object keys sorted, so the form is canonical.
uint64_t body_checksum(json doc) {
  doc.erase("checksum");
  std::string body = doc.dump();
  return XXH3_64bits(body.data(), body.size());
}

std::string seal(json doc) {
  doc["checksum"] = hex64(body_checksum(doc));
  return doc.dump(1) + "\n";
}

bool parse_hex64(std::string_view s, uint64_t& v) {
  if (s.size() != 16) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v, 16);
  return ec == std::errc() && p == s.data() + s.size();
}

// A field that must be an integer of type T. nlohmann's get<> turns a float, or a number
// out of T's range, into an integer with undefined behaviour or wraps it (rank 2^32 would
// read as rank 0): a document is untrusted, so each integer is checked first.
struct FieldError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
template <typename T>
T integer(const json& j, const char* name) {
  const json& v = j.at(name);
  if (!v.is_number_integer()) throw FieldError(std::string(name) + " is not an integer");
  if (v.is_number_unsigned()) {
    const uint64_t x = v.get<uint64_t>();
    if (x > static_cast<uint64_t>(std::numeric_limits<T>::max()))
      throw FieldError(std::string(name) + " is out of range");
    return static_cast<T>(x);
  }
  const int64_t x = v.get<int64_t>();
  if constexpr (std::is_signed_v<T>) {
    if (x < std::numeric_limits<T>::min() || x > std::numeric_limits<T>::max())
      throw FieldError(std::string(name) + " is out of range");
  } else {
    if (x < 0) throw FieldError(std::string(name) + " is negative");
    if (static_cast<uint64_t>(x) > static_cast<uint64_t>(std::numeric_limits<T>::max()))
      throw FieldError(std::string(name) + " is out of range");
  }
  return static_cast<T>(x);
}

json tensor_json(const TensorEntry& t) {
  json chunks = json::array();
  for (uint64_t c : t.chunks) chunks.push_back(hex64(c));
  json j = {{"name", t.name},     {"dtype", t.dtype}, {"shape", t.shape},
            {"offset", t.offset}, {"bytes", t.bytes}, {"chunks", std::move(chunks)}};
  if (t.mode) j["mode"] = t.mode;
  return j;
}

json record_json(const ShardRecord& r) {
  json tensors = json::array();
  for (const auto& t : r.tensors) tensors.push_back(tensor_json(t));
  return {{"series", r.series},
          {"step", r.step},
          {"rank", r.rank},
          {"world", r.world},
          {"chunk_size", r.chunk_size},
          {"bytes", r.bytes},
          {"etag", r.etag},
          {"save_id", r.save_id},
          {"run_id", r.run_id},
          {"created_ns", r.created_ns},
          {"tensors", std::move(tensors)}};
}

// Reads and checks one record's fields; `why` gets what is wrong.
bool record_from(const json& j, ShardRecord& r, std::string& why) {
  try {
    r.series = j.at("series").get<std::string>();
    r.step = integer<uint64_t>(j, "step");
    r.rank = integer<unsigned>(j, "rank");
    r.world = integer<unsigned>(j, "world");
    r.chunk_size = integer<uint64_t>(j, "chunk_size");
    r.bytes = integer<uint64_t>(j, "bytes");
    r.etag = j.at("etag").get<std::string>();
    r.save_id = j.at("save_id").get<std::string>();
    r.run_id = j.at("run_id").get<std::string>();
    r.created_ns = integer<int64_t>(j, "created_ns");
    const json& ts = j.at("tensors");
    if (!ts.is_array() || ts.size() > kMaxTensors) return why = "bad tensor list", false;
    for (const json& tj : ts) {
      TensorEntry t;
      t.name = tj.at("name").get<std::string>();
      t.dtype = tj.at("dtype").get<std::string>();
      const json& shape = tj.at("shape");
      if (!shape.is_array() || shape.size() > 64) throw FieldError("shape is not a short list");
      for (const json& d : shape) {
        if (!d.is_number_integer() ||
            (d.is_number_unsigned() &&
             d.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())))
          throw FieldError("shape holds a value that is not a 64-bit integer");
        t.shape.push_back(d.get<int64_t>());
      }
      t.offset = integer<uint64_t>(tj, "offset");
      t.bytes = integer<uint64_t>(tj, "bytes");
      if (tj.contains("mode")) {
        t.mode = integer<uint32_t>(tj, "mode");
        if (t.mode == 0 || t.mode > 07777)
          return why = "tensor '" + t.name + "' has a bad mode " + std::to_string(t.mode), false;
      }
      for (const json& c : tj.at("chunks")) {
        uint64_t v = 0;
        if (!c.is_string() || !parse_hex64(c.get<std::string>(), v))
          return why = "tensor '" + t.name + "' has a malformed chunk checksum", false;
        t.chunks.push_back(v);
      }
      r.tensors.push_back(std::move(t));
    }
  } catch (const json::exception& e) {
    return why = std::string("missing or mistyped field: ") + e.what(), false;
  } catch (const FieldError& e) {
    return why = e.what(), false;
  }
  if (!validate_series(r.series)) return why = "bad series name", false;
  if (r.world == 0 || r.world > kMaxRanks || r.rank >= r.world)
    return why = "rank " + std::to_string(r.rank) + " of world " + std::to_string(r.world), false;
  if (r.chunk_size == 0 || r.chunk_size % kTensorAlignment || r.chunk_size > kMaxChunkSize)
    return why = "bad chunk_size " + std::to_string(r.chunk_size), false;
  if (r.bytes > kMaxShardBytes)
    return why = "shard of " + std::to_string(r.bytes) + " bytes", false;
  if (r.run_id.size() > 256) return why = "run_id over 256 bytes", false;
  if (r.step > kMaxStep) return why = "step over " + std::to_string(kMaxStep), false;
  if (r.save_id.size() != 32 ||
      r.save_id.find_first_not_of("0123456789abcdef") != std::string::npos)
    return why = "save_id is not 32 hex digits", false;
  uint64_t end = 0;
  std::set<std::string_view> names;
  for (const auto& t : r.tensors) {
    if (t.name.empty() || t.name.size() > 4096 || !names.insert(t.name).second)
      return why = "tensor name empty, too long or repeated: '" + t.name + "'", false;
    if (t.offset % kTensorAlignment || t.offset < end || t.bytes > r.bytes ||
        t.offset > r.bytes - t.bytes)
      return why = "tensor '" + t.name + "' lies outside the shard or overlaps another", false;
    end = t.offset + t.bytes;
    uint64_t want = t.bytes / r.chunk_size + (t.bytes % r.chunk_size != 0);
    if (t.chunks.size() != want)
      return why = "tensor '" + t.name + "' has " + std::to_string(t.chunks.size()) +
                   " chunk checksums, not " + std::to_string(want),
             false;
    if (size_t es = dtype_size(t.dtype); es && t.bytes % es)
      return why = "tensor '" + t.name + "' is not a whole number of " + t.dtype, false;
  }
  return true;
}

// How deeply arrays and objects nest in a JSON text (outside strings). Ours nest 5 deep;
// a hostile document nested thousands deep would exhaust the stack in dump().
size_t nesting(std::string_view text) {
  size_t depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

// Parses and checks the envelope: size, nesting, JSON, format, version, checksum.
Result<json> open_document(std::string_view text, std::string_view format, std::string_view where) {
  auto bad = [&](const std::string& why) {
    return fail(Code::kCorruption, std::string(where) + ": " + why);
  };
  if (text.size() > kMaxDocumentBytes)
    return bad("over " + std::to_string(kMaxDocumentBytes) + " bytes");
  if (nesting(text) > 8) return bad("nested too deeply");
  json doc = json::parse(text, nullptr, false);
  if (doc.is_discarded() || !doc.is_object()) return bad("not a JSON object");
  if (!doc.contains("format") || !doc["format"].is_string() ||
      doc["format"].get<std::string>() != format)
    return bad("not a " + std::string(format) + " document");
  if (!doc.contains("version") || !doc["version"].is_number_integer())
    return bad("no format version");
  if (doc["version"].get<int64_t>() != kFormatVersion)
    return bad("format version " + doc["version"].dump() + " (this sluice reads version " +
               std::to_string(kFormatVersion) + ")");
  uint64_t sum = 0;
  if (!doc.contains("checksum") || !doc["checksum"].is_string() ||
      !parse_hex64(doc["checksum"].get<std::string>(), sum))
    return bad("no checksum");
  if (sum != body_checksum(doc)) return bad("checksum mismatch (the document is damaged)");
  return doc;
}

}  // namespace

uint64_t Manifest::bytes() const {
  uint64_t n = 0;
  for (const auto& s : shards)
    for (const auto& t : s.tensors) n += t.bytes;
  return n;
}

size_t dtype_size(std::string_view d) {
  static constexpr std::pair<std::string_view, size_t> kSizes[] = {
      {"uint8", 1},     {"int8", 1},       {"bool", 1},    {"float8_e4m3fn", 1}, {"float8_e5m2", 1},
      {"int16", 2},     {"uint16", 2},     {"float16", 2}, {"bfloat16", 2},      {"int32", 4},
      {"uint32", 4},    {"float32", 4},    {"int64", 8},   {"uint64", 8},        {"float64", 8},
      {"complex64", 8}, {"complex128", 16}};
  for (auto [name, size] : kSizes)
    if (name == d) return size;
  return 0;
}

Status validate_series(std::string_view s) {
  bool good =
      !s.empty() && s.size() <= 128 && s[0] != '.' && std::all_of(s.begin(), s.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
               c == '.' || c == '_' || c == '-';
      });
  if (!good)
    return fail(Code::kInvalidArgument,
                "series name '" + std::string(s) +
                    "' must be 1 to 128 of A-Z a-z 0-9 . _ - and not start with '.'");
  return ok();
}

std::string step_prefix(std::string_view series, uint64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "/step-%012llu/", static_cast<unsigned long long>(step));
  return std::string(series) + buf;
}

std::string shard_key(std::string_view series, uint64_t step, unsigned rank,
                      std::string_view save_id) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "rank-%05u-", rank);
  return step_prefix(series, step) + buf + std::string(save_id) + ".shard";
}

std::string record_key(std::string_view series, uint64_t step, unsigned rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "rank-%05u.json", rank);
  return step_prefix(series, step) + buf;
}

std::string manifest_key(std::string_view series, uint64_t step) {
  return step_prefix(series, step) + "manifest.json";
}

bool parse_step_key(std::string_view series, std::string_view key, uint64_t& step,
                    std::string& leaf) {
  std::string head = std::string(series) + "/step-";
  if (!key.starts_with(head)) return false;
  key.remove_prefix(head.size());
  if (key.size() < 14 || key[12] != '/') return false;
  auto [p, ec] = std::from_chars(key.data(), key.data() + 12, step);
  if (ec != std::errc() || p != key.data() + 12) return false;
  leaf = std::string(key.substr(13));
  return true;
}

Result<std::string> read_document(store::Store& s, const std::string& key) {
  SLUICE_ASSIGN_OR_RETURN(auto info, s.stat(key));
  return read_document(s, info);
}

Result<std::string> read_document(store::Store& s, const store::ObjectInfo& info) {
  const std::string& key = info.key;
  if (info.size > kMaxDocumentBytes)
    return fail(Code::kCorruption, key + " in " + s.uri() + " has " + std::to_string(info.size) +
                                       " bytes; a checkpoint document has at most " +
                                       std::to_string(kMaxDocumentBytes));
  std::string text(info.size, '\0');
  store::ReadOptions ro;
  ro.if_match = info.etag;
  SLUICE_ASSIGN_OR_RETURN(size_t n,
                          s.read_full(key, 0, std::as_writable_bytes(std::span(text)), ro));
  text.resize(n);
  return text;
}

Result<Manifest> read_whole_step(store::Store& tier, std::string_view series, uint64_t step,
                                 const std::map<std::string, uint64_t>& sizes,
                                 std::string_view where) {
  const std::string key = manifest_key(series, step);
  const std::string at = key + " on " + std::string(where);
  SLUICE_ASSIGN_OR_RETURN(std::string text, read_document(tier, key));
  SLUICE_ASSIGN_OR_RETURN(Manifest m, decode_manifest(text, at));
  if (m.series != series || m.step != step)
    return fail(Code::kCorruption, at + " describes another series or step");
  for (const auto& sh : m.shards) {
    const std::string sk = shard_key(series, step, sh.rank, sh.save_id);
    auto it = sizes.find(sk);
    if (it == sizes.end())
      return fail(Code::kCorruption, "step " + std::to_string(step) + " on " + std::string(where) +
                                         ": shard " + sk + " named by its manifest is missing");
    if (it->second != sh.bytes)
      return fail(Code::kCorruption, "step " + std::to_string(step) + " on " + std::string(where) +
                                         ": shard " + sk + " has " + std::to_string(it->second) +
                                         " bytes, its manifest says " + std::to_string(sh.bytes));
  }
  return m;
}

bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    if (n == 0 || i + n > s.size() || (n == 2 && c < 0xc2) || (n == 4 && c > 0xf4)) return false;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) >> 6) != 0x2) return false;
    if (n == 3) {  // no overlong forms, no surrogates
      const auto c1 = static_cast<unsigned char>(s[i + 1]);
      if ((c == 0xe0 && c1 < 0xa0) || (c == 0xed && c1 >= 0xa0)) return false;
    }
    if (n == 4) {
      const auto c1 = static_cast<unsigned char>(s[i + 1]);
      if ((c == 0xf0 && c1 < 0x90) || (c == 0xf4 && c1 >= 0x90)) return false;
    }
    i += n;
  }
  return true;
}

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

uint64_t layout(std::vector<TensorEntry>& tensors) {
  uint64_t end = 0;
  for (auto& t : tensors) {
    t.offset = (end + kTensorAlignment - 1) / kTensorAlignment * kTensorAlignment;
    end = t.offset + t.bytes;
  }
  return (end + kTensorAlignment - 1) / kTensorAlignment * kTensorAlignment;
}

std::string encode_record(const ShardRecord& r) {
  json doc = record_json(r);
  doc["format"] = kRecordFormat;
  doc["version"] = kFormatVersion;
  return seal(std::move(doc));
}

Result<ShardRecord> decode_record(std::string_view text, std::string_view where) {
  SLUICE_ASSIGN_OR_RETURN(json doc, open_document(text, kRecordFormat, where));
  ShardRecord r;
  std::string why;
  if (!record_from(doc, r, why)) return fail(Code::kCorruption, std::string(where) + ": " + why);
  return r;
}

std::string encode_manifest(const Manifest& m) {
  json shards = json::array();
  for (const auto& s : m.shards) shards.push_back(record_json(s));
  json doc = {{"format", kManifestFormat},  {"version", kFormatVersion},
              {"series", m.series},         {"step", m.step},
              {"world", m.world},           {"created_ns", m.created_ns},
              {"shards", std::move(shards)}};
  return seal(std::move(doc));
}

Result<Manifest> decode_manifest(std::string_view text, std::string_view where) {
  SLUICE_ASSIGN_OR_RETURN(json doc, open_document(text, kManifestFormat, where));
  auto bad = [&](const std::string& why) {
    return fail(Code::kCorruption, std::string(where) + ": " + why);
  };
  Manifest m;
  try {
    m.series = doc.at("series").get<std::string>();
    m.step = integer<uint64_t>(doc, "step");
    m.world = integer<unsigned>(doc, "world");
    m.created_ns = integer<int64_t>(doc, "created_ns");
    const json& shards = doc.at("shards");
    if (!shards.is_array()) return bad("shards is not a list");
    for (const json& sj : shards) {
      ShardRecord r;
      std::string why;
      if (!record_from(sj, r, why))
        return bad("shard " + std::to_string(m.shards.size()) + ": " + why);
      m.shards.push_back(std::move(r));
    }
  } catch (const json::exception& e) {
    return bad(std::string("missing or mistyped field: ") + e.what());
  } catch (const FieldError& e) {
    return bad(e.what());
  }
  if (!validate_series(m.series)) return bad("bad series name");
  if (m.world == 0 || m.shards.size() != m.world)
    return bad(std::to_string(m.shards.size()) + " shards for a world of " +
               std::to_string(m.world));
  for (unsigned i = 0; i < m.world; ++i) {
    const auto& s = m.shards[i];
    if (s.rank != i || s.world != m.world || s.series != m.series || s.step != m.step)
      return bad("shard " + std::to_string(i) + " belongs to another rank, step or series");
    if (s.chunk_size != m.shards[0].chunk_size)
      return bad("shard " + std::to_string(i) + " has another chunk size than shard 0");
  }
  return m;
}

}  // namespace sluice::ckpt
