#include <filesystem>

#include "sluice/s3_store.h"
#include "sluice/store.h"
#include "sluice/store_wrapper.h"

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
  while (done < dst.size()) {
    SLUICE_ASSIGN_OR_RETURN(size_t n, read(key, offset + done, dst.subspan(done), options));
    if (n == 0) break;
    done += n;
  }
  return done;
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

Result<std::vector<ObjectInfo>> Store::list_all(std::string_view prefix) {
  std::vector<ObjectInfo> all;
  ListOptions opts;
  opts.prefix = std::string(prefix);
  do {
    SLUICE_ASSIGN_OR_RETURN(ListPage page, list(opts));
    for (auto& o : page.objects) all.push_back(std::move(o));
    opts.continuation = std::move(page.next_token);
  } while (!opts.continuation.empty());
  return all;
}

Result<std::unique_ptr<Store>> open_store(std::string_view uri, const StoreOptions& options) {
  std::unique_ptr<Store> store;
  if (uri.starts_with("mem://")) {
    std::string name(uri.substr(6));
    if (name.empty()) return fail(Code::kInvalidArgument, "store URI 'mem://' needs a name");
    store = open_named_memory_store(name);
  } else if (uri.starts_with("s3://")) {
    SLUICE_ASSIGN_OR_RETURN(store,
                            s3::open_s3_store(uri, options.s3 ? *options.s3 : s3::S3Options{}));
  } else if (uri.find("://") != std::string_view::npos && !uri.starts_with("file://")) {
    return fail(Code::kUnsupported, "unsupported store URI '" + std::string(uri) +
                                        "': known schemes are file://, s3:// and mem://");
  } else {
    std::string path(uri.starts_with("file://") ? uri.substr(7) : uri);
    if (path.empty())
      return fail(Code::kInvalidArgument, "store URI '" + std::string(uri) + "' has no path");
    std::error_code ec;
    std::filesystem::create_directories(path, ec);
    if (ec) return fail_errno(ec.value(), "create store directory '" + path + "'");
    if (!std::filesystem::is_directory(path, ec))
      return fail(Code::kInvalidArgument, "store path '" + path + "' is not a directory");
    store = make_posix_store(path);
  }
  if (options.registry) store = with_telemetry(std::move(store), *options.registry);
  return store;
}

}  // namespace sluice::store
