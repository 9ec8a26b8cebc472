// Records every store call into the telemetry registry: one request counter, one error
// counter and one latency histogram per operation, plus bytes read and written. The
// metric cells are looked up once, at wrap time, so recording is a few relaxed adds.
#include "sluice/store/wrapper.h"
#include "sluice/telemetry/registry.h"

namespace sluice::store {
namespace {

struct OpMetrics {
  telemetry::Counter* requests;
  telemetry::Counter* errors;
  telemetry::Histogram* latency;
};

enum Op { kStat, kRead, kCommit, kList, kRemove, kOpCount };
constexpr const char* kOpNames[kOpCount] = {"stat", "read", "commit", "list", "remove"};

struct StoreMetrics {
  OpMetrics op[kOpCount];
  telemetry::Counter* bytes_read;
  telemetry::Counter* bytes_written;
};

class Timer {
 public:
  explicit Timer(const OpMetrics& m) : m_(m), start_(telemetry::now_ns()) {}
  template <typename R>
  R done(R result) {
    m_.requests->add();
    if (!result) m_.errors->add();
    m_.latency->record(telemetry::now_ns() - start_);
    return result;
  }

 private:
  const OpMetrics& m_;
  uint64_t start_;
};

class TelemetryWriter : public Writer {
 public:
  TelemetryWriter(std::unique_ptr<Writer> inner, const StoreMetrics& m)
      : inner_(std::move(inner)), m_(m) {}
  Status append(std::span<const std::byte> data) override { return inner_->append(data); }
  Status commit() override {
    Timer t(m_.op[kCommit]);
    uint64_t bytes = inner_->size();  // before commit: a committed writer may hold nothing
    auto st = inner_->commit();
    if (st) m_.bytes_written->add(bytes);
    return t.done(std::move(st));
  }
  void abort() override { inner_->abort(); }
  uint64_t size() const override { return inner_->size(); }
  // The inner writer's abilities pass through: positional writes, and a local file a caller
  // may fill through its own data path.
  bool positional() const override { return inner_->positional(); }
  Status write_at(uint64_t offset, std::span<const std::byte> data) override {
    return inner_->write_at(offset, data);
  }
  std::string local_path() const override { return inner_->local_path(); }
  Status extend_to(uint64_t size) override { return inner_->extend_to(size); }

 private:
  std::unique_ptr<Writer> inner_;
  const StoreMetrics& m_;
};

class TelemetryStore : public StoreWrapper {
 public:
  TelemetryStore(std::unique_ptr<Store> inner, telemetry::Registry& registry)
      : StoreWrapper(std::move(inner)) {
    std::string u = uri();
    std::string scheme = u.substr(0, u.find("://"));
    for (int i = 0; i < kOpCount; ++i) {
      telemetry::Labels l{{"scheme", scheme}, {"op", kOpNames[i]}};
      m_.op[i].requests = &registry.counter("sluice_store_requests_total", l,
                                            "Store calls by scheme and operation");
      m_.op[i].errors =
          &registry.counter("sluice_store_errors_total", l, "Store calls that failed");
      m_.op[i].latency =
          &registry.histogram("sluice_store_latency_seconds", l, "Store call latency", 1e-9);
    }
    m_.bytes_read = &registry.counter("sluice_store_read_bytes_total", {{"scheme", scheme}},
                                      "Bytes read from stores");
    m_.bytes_written = &registry.counter("sluice_store_written_bytes_total", {{"scheme", scheme}},
                                         "Bytes committed to stores");
  }

  Result<ObjectInfo> stat(std::string_view key) override {
    Timer t(m_.op[kStat]);
    return t.done(StoreWrapper::stat(key));
  }
  Result<size_t> read(std::string_view key, uint64_t offset, std::span<std::byte> dst,
                      const ReadOptions& options) override {
    Timer t(m_.op[kRead]);
    auto r = StoreWrapper::read(key, offset, dst, options);
    if (r) m_.bytes_read->add(*r);
    return t.done(std::move(r));
  }
  Result<std::unique_ptr<Writer>> create(std::string_view key,
                                         const WriteOptions& options) override {
    SLUICE_ASSIGN_OR_RETURN(auto inner, StoreWrapper::create(key, options));
    return std::unique_ptr<Writer>(std::make_unique<TelemetryWriter>(std::move(inner), m_));
  }
  Result<ListPage> list(const ListOptions& options) override {
    Timer t(m_.op[kList]);
    return t.done(StoreWrapper::list(options));
  }
  Status remove(std::string_view key) override {
    Timer t(m_.op[kRemove]);
    return t.done(StoreWrapper::remove(key));
  }

 private:
  StoreMetrics m_;
};

}  // namespace

std::unique_ptr<Store> with_telemetry(std::unique_ptr<Store> store, telemetry::Registry& registry) {
  return std::make_unique<TelemetryStore>(std::move(store), registry);
}

}  // namespace sluice::store
