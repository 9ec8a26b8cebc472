#include "sluice/store/store.h"
#include "sluice/store/wrapper.h"

namespace sluice::store {

Status validate_key(std::string_view key) {
  auto bad = [&](std::string_view why) {
    return fail(Code::kInvalidArgument,
                "invalid key '" + std::string(key) + "': " + std::string(why));
  };
  if (key.empty()) return bad("empty");
  if (key.size() > 1024) return bad("longer than 1024 bytes");
  if (key.front() == '/') return bad("absolute (starts with '/')");
  if (key.find('\0') != std::string_view::npos) return bad("contains a NUL byte");
  size_t start = 0;
  while (start <= key.size()) {
    size_t end = key.find('/', start);
    if (end == std::string_view::npos) end = key.size();
    std::string_view part = key.substr(start, end - start);
    if (part.empty()) return bad("has an empty path component");
    if (part == "." || part == "..") return bad("has a '.' or '..' component");
    start = end + 1;
  }
  return ok();
}

Status Writer::write_at(uint64_t offset, std::span<const std::byte>) {
  return fail(Code::kUnsupported,
              "this writer takes bytes in order only (write_at " + std::to_string(offset) + ")");
}

Status Writer::extend_to(uint64_t size) {
  return fail(Code::kUnsupported,
              "this writer has no local file to fill (extend_to " + std::to_string(size) + ")");
}

Status Store::put(std::string_view key, std::span<const std::byte> data,
                  const WriteOptions& options) {
  SLUICE_ASSIGN_OR_RETURN(auto writer, create(key, options));
  if (auto st = writer->append(data); !st) {
    writer->abort();
    return st;
  }
  return writer->commit();
}

Result<size_t> Store::read_full(std::string_view key, uint64_t offset, std::span<std::byte> dst,
                                const ReadOptions& options) {
  size_t done = 0;
  int reads = 0;
  while (done < dst.size()) {
    SLUICE_ASSIGN_OR_RETURN(size_t n, read(key, offset + done, dst.subspan(done), options));
    ++reads;
    if (n == 0) break;
    done += n;
  }
  // A hash a backend gave (ReadHooks::xxh3) covers one read's bytes, not the buffer's.
  if (reads > 1 && options.hooks.xxh3) options.hooks.xxh3->reset();
  return done;
}

Status Store::can_write(std::string_view, uint64_t, uint64_t) {
  return ok();
}

void* Store::find_capability(const std::type_info&) {
  return nullptr;
}

Status Store::remove_many(std::span<const std::string> keys) {
  for (const std::string& k : keys) {
    auto st = remove(k);
    if (!st && st.error().code() != Code::kNotFound) return st;
  }
  return ok();
}

Result<std::vector<std::byte>> Store::get(std::string_view key) {
  SLUICE_ASSIGN_OR_RETURN(ObjectInfo info, stat(key));
  std::vector<std::byte> data(info.size);
  SLUICE_ASSIGN_OR_RETURN(size_t n, read_full(key, 0, data, ReadOptions{info.etag, info.size}));
  if (n != info.size)
    return fail(Code::kCorruption, "object '" + std::string(key) + "' in " + uri() +
                                       " changed while being read: expected " +
                                       std::to_string(info.size) + " bytes, got " +
                                       std::to_string(n));
  return data;
}

Result<std::vector<ObjectInfo>> Store::list_all(std::string_view prefix,
                                                std::vector<SkippedKey>* skipped) {
  std::vector<ObjectInfo> all;
  ListOptions opts;
  opts.prefix = std::string(prefix);
  do {
    SLUICE_ASSIGN_OR_RETURN(ListPage page, list(opts));
    for (auto& o : page.objects) all.push_back(std::move(o));
    if (skipped)
      for (auto& s : page.skipped) skipped->push_back(std::move(s));
    opts.continuation = std::move(page.next_token);
  } while (!opts.continuation.empty());
  return all;
}

}  // namespace sluice::store
