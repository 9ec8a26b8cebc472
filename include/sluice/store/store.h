// sluice/store/store.h: the one interface every place bytes rest behind.
//
// A Store is a flat namespace of keys ("datasets/shard-0001.tar") mapping to immutable
// byte strings (objects), the common ground of a file system, an S3 bucket, a peer's cache
// and memory. Backends: file:// (posix, local or shared file systems), mem:// (process
// memory, for tests); other backends (s3://, later cache:// and peer://) register their
// scheme with register_scheme. Decorators (StoreWrapper) add fault
// injection, telemetry, quota charging and rate limits around any of them.
//
// Contract:
// - Keys are non-empty, at most 1024 bytes, relative, '/'-separated, without empty, "." or
//   ".." components, NUL bytes or a leading '/'. A key that breaks these rules is rejected
//   with InvalidArgument before any I/O; no key can name anything outside the store.
// - `read` copies bytes from `offset` into the caller's buffer and returns how many. Like
//   pread it may return fewer than asked (a backend may cap one request); 0 means `offset`
//   is at or past the end. Use `read_full` to loop until the buffer is full or the object
//   ends. On error no bytes are reported as read.
// - `create` returns a Writer. Bytes appended are invisible to readers until `commit`,
//   which publishes the whole object atomically (readers see the old object or the new one,
//   never a mix) and durably (it survives a crash once commit returns). A Writer destroyed
//   or aborted without commit leaves nothing behind.
// - `list` returns keys in byte-wise ascending order, a page at a time; pass the returned
//   `next_token` to continue. An empty token means the listing is complete.
// - `remove` of a missing key returns NotFound where the backend can tell (file://, mem://);
//   S3's DELETE is idempotent and cannot, so it succeeds there.
// - A Writer must not outlive the Store that created it.
// - All methods may be called concurrently from many threads; a Writer is used by one
//   thread at a time (except Writer::write_at, where a writer supports it).
#pragma once

#include <any>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <typeindex>
#include <typeinfo>
#include <unordered_map>
#include <vector>

#include "sluice/core/status.h"

namespace sluice::telemetry {
class Registry;
}

namespace sluice::store {

struct ObjectInfo {
  std::string key;
  uint64_t size = 0;
  int64_t mtime_ns = 0;  // last modification, nanoseconds since the Unix epoch
  std::string etag;      // changes whenever the object's bytes may have changed
};

struct ListOptions {
  std::string prefix;        // only keys starting with this
  std::string continuation;  // the previous page's next_token, or empty to start
  size_t max_keys = 1000;    // page size, 1..10000
  // A key that is listed but cannot be described for any other reason (a file it may not
  // stat) goes to ListPage::skipped instead of failing the whole listing.
  bool skip_unreadable = false;
};

// A name a listing found but left out of its objects, and why.
struct SkippedKey {
  std::string key;
  std::string reason;  // the error's message, which names the key and the store
};

struct ListPage {
  std::vector<ObjectInfo> objects;
  std::string next_token;  // empty when there is nothing more
  // Names left out of `objects`, for the caller to report. file:// always leaves out a
  // symlink that leads out of its root (or loops), a dangling one, and what is no regular
  // file (a FIFO, a device): none is an object of the store (a read of it is refused), and
  // anyone who can write in a shared folder could otherwise fail every listing of it. With
  // ListOptions::skip_unreadable, any other key that cannot be described.
  std::vector<SkippedKey> skipped;
};

// Callbacks and results a backend may give a read's caller (ReadOptions::hooks).
struct ReadHooks {
  // Told, on the reading thread, as the bytes of a read arrive in order: the bytes from
  // the read's offset up to object offset `end` are in its buffer now (not yet checked:
  // the read may still fail, and a retried request lands them again, usually with a
  // lower `end` first). Only a read a backend does as one streamed request calls it
  // (s3:// when the read is one GET); others never do, so it can hurry work along (write
  // what has landed) but never replace checking the read's result. Never called at once
  // from two threads, nor after the read returns; it must not throw, and while it runs
  // the transfer waits.
  std::function<void(uint64_t end)> on_landed;
  // Where a backend that computed the XXH3-64 of exactly the bytes the read returned (to
  // check them: a chunk from a peer) puts it, so the caller need not hash them again; left
  // as it was by every other read.
  std::optional<uint64_t>* xxh3 = nullptr;
};

struct ReadOptions {
  // Read only if the object's etag is still this one; Conflict otherwise. Pins a series
  // of ranged reads of one object to one version of it.
  std::string if_match;
  // The object's size, when the caller knows it (from a listing). Lets an object store
  // read a whole small object with one plain GET instead of a ranged one.
  std::optional<uint64_t> object_size;
  // false: send one request per read, where a backend would otherwise split a large read
  // into parallel requests (s3://); for callers that keep their own reads in parallel.
  bool split = true;
  // What a backend tells the caller during and after the read. They describe this read's
  // bytes in this buffer, so a wrapper that splits a read, or reads into other memory, gives
  // its sub-reads none (`sub.hooks = {}`) and fills them in itself where it can.
  ReadHooks hooks;
};

// What a publish replaced: nothing (a new object), or an object of `size` bytes.
struct Replaced {
  bool existed = false;
  uint64_t size = 0;
};

struct WriteOptions {
  bool overwrite = true;  // false: commit fails with AlreadyExists if the key exists
  // true: commit returns only once the object survives a crash. false lets a backend that
  // can (file://) skip the flush to stable storage: the publish is still atomic, but a
  // crash soon after may lose the object. Object stores are always durable.
  bool durable = true;
  // The object's final size, when known: lets file:// reserve the blocks up front, so a
  // full disk fails at create() with NoSpace instead of midway.
  std::optional<uint64_t> size_hint;
  // file://: the permission bits the object is created with (less the umask). Object
  // stores have no modes and ignore it.
  uint32_t mode = 0644;
  // file://, mem://: the published object's modification time (a copy that keeps its
  // source's, as gc's moves to and from the trash do, so retention still orders objects by
  // when they were made). Object stores set their own and ignore it.
  std::optional<int64_t> mtime_ns;
  // Called by commit once the object is published, with what the publish replaced, by
  // backends that know it exactly (file://, mem://), and while publishes of other writers
  // into the same folder wait (file://: an flock on the folder; mem://: the store's lock).
  // So callbacks for one key run in the order the publishes happened, even across
  // processes, and see exactly the object each replaced: quota charging uses it to keep
  // usage exact under racing overwrites. Backends that cannot know (object stores) never
  // call it. It must be quick and must not touch the store.
  std::function<void(const Replaced&)> on_publish;
};

class Writer {
 public:
  virtual ~Writer() = default;
  // Appends bytes to the pending object. Errors (NoSpace, IoError) leave the writer
  // aborted: later calls fail, and nothing is published.
  virtual Status append(std::span<const std::byte> data) = 0;
  // Publishes the object atomically and durably. A Writer can commit once.
  virtual Status commit() = 0;
  // Discards the pending object. Safe to call more than once, and after a failure.
  virtual void abort() = 0;
  // Bytes appended so far (or, for positional writes, the end of the furthest one).
  virtual uint64_t size() const = 0;

  // Positional writes, for writers that can take the parts of an object in any order
  // (file://): a copy then writes each part as it arrives instead of holding it until the
  // parts before it are in. A writer that supports them may have write_at called from
  // several threads at once (never together with append); commit publishes bytes
  // [0, size()). Others return false / Unsupported.
  virtual bool positional() const { return false; }
  virtual Status write_at(uint64_t offset, std::span<const std::byte> data);

  // Writers whose pending object is a local file (file://) name that file here, so a
  // caller can fill it through its own data path (io::FileHandle: io_uring, O_DIRECT)
  // instead of append or write_at. Such a caller then says how long the object is with
  // `extend_to` before commit, which syncs and publishes the file as usual. Empty for
  // other writers, whose extend_to returns Unsupported.
  virtual std::string local_path() const { return {}; }
  virtual Status extend_to(uint64_t size);
};

class Store {
 public:
  virtual ~Store() = default;

  virtual Result<ObjectInfo> stat(std::string_view key) = 0;
  virtual Result<size_t> read(std::string_view key, uint64_t offset, std::span<std::byte> dst,
                              const ReadOptions& options = {}) = 0;
  virtual Result<std::unique_ptr<Writer>> create(std::string_view key,
                                                 const WriteOptions& options = {}) = 0;
  virtual Result<ListPage> list(const ListOptions& options) = 0;
  virtual Status remove(std::string_view key) = 0;
  // Removes many keys; object stores do it in batches. Missing keys are not an error here.
  // The default removes one at a time.
  virtual Status remove_many(std::span<const std::string> keys);
  // The URI this store was opened with ("file:///data", "mem://test").
  virtual std::string uri() const = 0;
  // What tells this store's data apart from any other's: its URI and whatever else picks
  // the server (an S3 endpoint). Caches and catalogs name what they keep by it, so a
  // bucket of the same name on another server never shares their entries.
  virtual std::string identity() const { return uri(); }
  // Whether `objects` new objects holding `bytes` could be written under `key` now: ok, or
  // the error creating them would give (QuotaExceeded from a charging store). A check, not
  // a reservation: another writer may take the room first. A store with no limit of its
  // own to ask says ok (free space is the caller's to check where it can).
  virtual Status can_write(std::string_view key, uint64_t bytes, uint64_t objects);
  // Whether its writers call WriteOptions::on_publish with what each publish replaced
  // (file://, mem://). Object stores cannot know it.
  virtual bool reports_replaced() const { return false; }
  // A request costs little next to its bytes (a local file system, memory): readers need
  // not merge neighbouring ranges into one request across gaps.
  virtual bool cheap_requests() const { return false; }
  // What this store offers beyond these calls (a cache's read-ahead, its counters), asked by
  // type: the object of that type behind this store, or null. A decorator forwards the
  // question to the store it wraps, so no wrapper hides a capability; use capability<T>().
  virtual void* find_capability(const std::type_info& type);
  template <class T>
  T* capability() {
    return static_cast<T*>(find_capability(typeid(T)));
  }

  // Conveniences built on the methods above.
  Status put(std::string_view key, std::span<const std::byte> data,
             const WriteOptions& options = {});
  Result<std::vector<std::byte>> get(std::string_view key);
  // Reads until `dst` is full or the object ends; returns the bytes read.
  Result<size_t> read_full(std::string_view key, uint64_t offset, std::span<std::byte> dst,
                           const ReadOptions& options = {});
  // Every key under a prefix, following pagination. The names the pages left out
  // (ListPage::skipped) are appended to `skipped` when it is given, else dropped.
  Result<std::vector<ObjectInfo>> list_all(std::string_view prefix,
                                           std::vector<SkippedKey>* skipped = nullptr);
};

// Checks a key against the rules in the contract above.
Status validate_key(std::string_view key);
// Whether a key has a ".sluice-tmp" component, which file:// keeps for its temporary files
// and refuses to write (a checkpoint refuses such tensor names before any I/O).
bool is_reserved_key(std::string_view key);

// Options only one backend understands, kept by type so this header never names them:
//   StoreOptions o; o.backend.set(s3::S3Options{...}); open_store("s3://b", o);
// and the s3 backend reads o.backend.get<s3::S3Options>() (null when none was set).
class BackendOptions {
 public:
  template <typename T>
  void set(T value) {
    by_type_[std::type_index(typeid(T))] = std::move(value);
  }
  template <typename T>
  const T* get() const {
    auto it = by_type_.find(std::type_index(typeid(T)));
    return it == by_type_.end() ? nullptr : std::any_cast<T>(&it->second);
  }

 private:
  std::unordered_map<std::type_index, std::any> by_type_;
};

// What open_store hands to a backend.
struct StoreOptions {
  telemetry::Registry* registry = nullptr;  // where the store records metrics; may be null
  // file://: create the directory when it is missing. false, for commands that only read:
  // a missing directory is NotFound, so a mistyped path is an error, not a new directory.
  bool create = true;
  // file://: refuse a root directory whose path has a symlink in any component (it is
  // opened with openat2 RESOLVE_NO_SYMLINKS). For a caller that checked a grant against
  // that exact path (sluiced): a component swapped for a symlink after the check cannot
  // lead the store elsewhere.
  bool no_symlinked_root = false;
  BackendOptions backend;
};

// Opens a store by URI, through the backend registered for its scheme:
//   file:///abs/path, file://rel/path or a plain path   the directory holding the objects
//   mem://NAME                                            a process-local memory store; the
//                                                         same NAME opens the same store
// file:// and mem:// are always there; other backends register their scheme (s3:// with
// s3::register_scheme(), see s3/store.h). A scheme no backend registered in this process
// is InvalidArgument, naming the schemes that are (a caller's URI, most often a typo; a
// program that forgot to register a backend sees its scheme missing from the list).
// Telemetry is added around the store when options.registry is set.
Result<std::unique_ptr<Store>> open_store(std::string_view uri, const StoreOptions& options = {});

// Opens a store of one scheme. `uri` is the whole URI ("s3://bucket/prefix").
using StoreFactory =
    std::function<Result<std::unique_ptr<Store>>(std::string_view uri, const StoreOptions&)>;
// Makes open_store send URIs starting with "<scheme>://" to `factory`. Registering a scheme
// again replaces its factory. Thread-safe.
void register_scheme(std::string scheme, StoreFactory factory);
// The schemes open_store knows now, sorted.
std::vector<std::string> registered_schemes();

std::unique_ptr<Store> make_posix_store(std::string root);
// The same, refusing (PermissionDenied) a root whose absolute path holds a symlink in any
// component (StoreOptions::no_symlinked_root).
Result<std::unique_ptr<Store>> make_posix_store_without_symlinks(std::string root);
// A fresh, private memory store.
std::unique_ptr<Store> make_memory_store(std::string name = "anonymous");
// The process-wide memory store called `name` (what mem://NAME opens).
std::unique_ptr<Store> open_named_memory_store(const std::string& name);
// A store that keeps nothing: writes succeed and vanish, reads and stats are NotFound.
// The destination of a copy done only for its reads (cache warming, benchmarks).
std::unique_ptr<Store> make_discard_store();

}  // namespace sluice::store
