// Eviction policies of a cache tier; see policy.h for what each one does.
#include "sluice/cache/policy.h"

#include <algorithm>
#include <bit>
#include <deque>
#include <limits>
#include <list>
#include <optional>
#include <set>
#include <unordered_map>

#include "sluice/cache/read_ahead.h"

namespace sluice::cache {

std::string_view policy_name(PolicyKind kind) {
  switch (kind) {
    case PolicyKind::kS3Fifo:
      return "s3fifo";
    case PolicyKind::kLru:
      return "lru";
    case PolicyKind::kDeclared:
      return "declared";
  }
  return "?";
}

Result<PolicyKind> parse_policy(std::string_view name) {
  for (PolicyKind k : {PolicyKind::kS3Fifo, PolicyKind::kLru, PolicyKind::kDeclared}) {
    if (name == policy_name(k)) return k;
  }
  return fail(Code::kInvalidArgument,
              "unknown cache policy '" + std::string(name) + "' (s3fifo, lru or declared)");
}

namespace {

uint64_t mix(uint64_t x) {  // splitmix64's finalizer: ids are sequential, spread them
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// A count-min sketch of how often each chunk was read lately (TinyLFU). Counters saturate
// at 15 and are halved every 10 x width additions, so old popularity fades.
class FrequencySketch {
 public:
  explicit FrequencySketch(size_t width) { resize(width); }

  void add(ChunkId id) {
    for (size_t row = 0; row < kRows; ++row) {
      uint8_t& c = cell(row, id);
      if (c < 15) ++c;
    }
    if (++additions_ >= 10 * width_) age();
  }
  unsigned estimate(ChunkId id) const {
    unsigned m = 15;
    for (size_t row = 0; row < kRows; ++row) m = std::min<unsigned>(m, cell(row, id));
    return m;
  }
  size_t width() const { return width_; }
  // Starts over with a wider table (estimates restart from zero).
  void resize(size_t width) {
    width_ = std::bit_ceil(std::max<size_t>(width, 1024));
    counters_.assign(kRows * width_, 0);
    additions_ = 0;
  }

 private:
  static constexpr size_t kRows = 4;
  uint8_t& cell(size_t row, ChunkId id) {
    return counters_[row * width_ + (mix(id + row * 0x51ed27) & (width_ - 1))];
  }
  uint8_t cell(size_t row, ChunkId id) const {
    return counters_[row * width_ + (mix(id + row * 0x51ed27) & (width_ - 1))];
  }
  void age() {
    for (uint8_t& c : counters_) c >>= 1;
    additions_ /= 2;
  }
  size_t width_ = 0;
  size_t additions_ = 0;
  std::vector<uint8_t> counters_;
};

class S3FifoPolicy final : public EvictionPolicy {
 public:
  explicit S3FifoPolicy(uint64_t capacity)
      : capacity_(capacity),
        small_target_(capacity / 10),
        sketch_(std::clamp<uint64_t>(capacity >> 16, 1024, kMaxSketch)) {}

  void on_hit(ChunkId id) override {
    sketch_.add(id);
    auto it = entries_.find(id);
    if (it != entries_.end() && it->second.freq < 3) ++it->second.freq;
  }

  Admission admit(ChunkId id, uint64_t bytes) override {
    sketch_.add(id);
    Admission a;
    if (bytes > capacity_ || entries_.contains(id)) return a;
    insert(id, bytes, /*main=*/false);
    make_room(id, a);
    a.admitted = entries_.contains(id);
    std::erase(a.evicted, id);  // it came and went in one step: it was never resident
    return a;
  }

  Admission restore(ChunkId id, uint64_t bytes) override {
    Admission a;
    if (bytes > capacity_ || entries_.contains(id)) return a;
    sketch_.add(id);
    insert(id, bytes, /*main=*/true);
    make_room(id, a);
    a.admitted = entries_.contains(id);
    std::erase(a.evicted, id);
    return a;
  }

  void erase(ChunkId id) override {
    auto it = entries_.find(id);
    if (it == entries_.end()) return;
    drop(it);
  }

  void set_pinned(ChunkId id, bool pinned) override {
    auto it = entries_.find(id);
    if (it != entries_.end()) it->second.pinned = pinned;
  }

  bool contains(ChunkId id) const override { return entries_.contains(id); }
  uint64_t resident_bytes() const override { return small_bytes_ + main_bytes_; }
  uint64_t capacity() const override { return capacity_; }
  PolicyKind kind() const override { return PolicyKind::kS3Fifo; }

 private:
  static constexpr uint64_t kMaxSketch = 1 << 22;
  struct Entry {
    uint64_t bytes = 0;
    uint8_t freq = 0;  // hits while resident, at most 3 (S3-FIFO's two bits)
    bool pinned = false;
    bool in_main = false;
    std::list<ChunkId>::iterator pos;
  };
  using Map = std::unordered_map<ChunkId, Entry>;

  void insert(ChunkId id, uint64_t bytes, bool main) {
    std::list<ChunkId>& q = main ? main_ : small_;
    q.push_back(id);
    entries_[id] = Entry{bytes, 0, false, main, std::prev(q.end())};
    (main ? main_bytes_ : small_bytes_) += bytes;
    // Keep the sketch wide enough for what is resident, or its estimates collide.
    if (entries_.size() * 4 > sketch_.width() && sketch_.width() < kMaxSketch) {
      sketch_.resize(sketch_.width() * 2);
    }
  }

  void drop(Map::iterator it) {
    Entry& e = it->second;
    (e.in_main ? main_ : small_).erase(e.pos);
    (e.in_main ? main_bytes_ : small_bytes_) -= e.bytes;
    entries_.erase(it);
  }

  void evict(ChunkId id, Admission& a) {
    drop(entries_.find(id));
    a.evicted.push_back(id);
  }

  void move_to_main(ChunkId id) {
    Entry& e = entries_.at(id);
    small_.erase(e.pos);
    small_bytes_ -= e.bytes;
    main_.push_back(id);
    main_bytes_ += e.bytes;
    e.pos = std::prev(main_.end());
    e.in_main = true;
    e.freq = 0;
  }

  // The main queue's next victim, CLOCK-style: an entry read since it last came round
  // goes back to the tail with one hit less; pinned entries are skipped. 0 entries: none.
  std::optional<ChunkId> main_victim() {
    for (size_t seen = 0, n = main_.size() * 4 + 1; seen < n && !main_.empty(); ++seen) {
      ChunkId id = main_.front();
      Entry& e = entries_.at(id);
      if (!e.pinned && e.freq == 0) return id;
      if (e.freq > 0) --e.freq;
      main_.splice(main_.end(), main_, main_.begin());
    }
    return std::nullopt;
  }

  // Evicts until resident bytes fit the capacity. Each step either handles the small
  // queue's head (to main if main has room or the filter prefers it, else out) or evicts
  // main's victim.
  void make_room(ChunkId newcomer, Admission& a) {
    uint64_t main_room = capacity_ - small_target_;
    size_t stuck = 0;  // steps that freed nothing (pinned heads rotating)
    while (resident_bytes() > capacity_ && stuck <= entries_.size()) {
      if (!small_.empty() && (small_bytes_ > small_target_ || main_.empty())) {
        ChunkId head = small_.front();
        Entry& e = entries_.at(head);
        if (e.pinned || e.freq > 0 || main_bytes_ + e.bytes <= main_room) {
          move_to_main(head);  // read again while in the small queue, or room in main
          ++stuck;
          continue;
        }
        std::optional<ChunkId> victim = main_victim();
        if (victim && sketch_.estimate(head) > sketch_.estimate(*victim)) {
          evict(*victim, a);
          move_to_main(head);
        } else {
          evict(head, a);
        }
        stuck = 0;
        continue;
      }
      std::optional<ChunkId> victim = main_victim();
      if (!victim) break;
      evict(*victim, a);
      stuck = 0;
    }
    // Only pinned bytes left to evict: the newcomer does not stay.
    if (resident_bytes() > capacity_) erase(newcomer);
  }

  uint64_t capacity_;
  uint64_t small_target_;
  uint64_t small_bytes_ = 0, main_bytes_ = 0;
  FrequencySketch sketch_;
  std::list<ChunkId> small_, main_;
  Map entries_;
};

class LruPolicy final : public EvictionPolicy {
 public:
  explicit LruPolicy(uint64_t capacity) : capacity_(capacity) {}

  void on_hit(ChunkId id) override {
    auto it = entries_.find(id);
    if (it != entries_.end()) order_.splice(order_.begin(), order_, it->second.pos);
  }
  Admission admit(ChunkId id, uint64_t bytes) override { return insert(id, bytes); }
  Admission restore(ChunkId id, uint64_t bytes) override { return insert(id, bytes); }
  void erase(ChunkId id) override {
    auto it = entries_.find(id);
    if (it == entries_.end()) return;
    bytes_ -= it->second.bytes;
    order_.erase(it->second.pos);
    entries_.erase(it);
  }
  void set_pinned(ChunkId id, bool pinned) override {
    auto it = entries_.find(id);
    if (it != entries_.end()) it->second.pinned = pinned;
  }
  bool contains(ChunkId id) const override { return entries_.contains(id); }
  uint64_t resident_bytes() const override { return bytes_; }
  uint64_t capacity() const override { return capacity_; }
  PolicyKind kind() const override { return PolicyKind::kLru; }

 private:
  struct Entry {
    uint64_t bytes = 0;
    bool pinned = false;
    std::list<ChunkId>::iterator pos;
  };

  Admission insert(ChunkId id, uint64_t bytes) {
    Admission a;
    if (bytes > capacity_ || entries_.contains(id)) return a;
    std::vector<ChunkId> victims;  // from the cold end, skipping pinned entries
    uint64_t freed = 0;
    for (auto it = order_.rbegin(); bytes_ + bytes - freed > capacity_ && it != order_.rend();
         ++it) {
      const Entry& e = entries_.at(*it);
      if (e.pinned) continue;
      victims.push_back(*it);
      freed += e.bytes;
    }
    if (bytes_ + bytes - freed > capacity_) return a;  // only pinned bytes left
    for (ChunkId v : victims) erase(v);
    a.evicted = std::move(victims);
    order_.push_front(id);
    entries_[id] = Entry{bytes, false, order_.begin()};
    bytes_ += bytes;
    a.admitted = true;
    return a;
  }

  uint64_t capacity_;
  uint64_t bytes_ = 0;
  std::list<ChunkId> order_;  // most recent first
  std::unordered_map<ChunkId, Entry> entries_;
};

class DeclaredPolicy final : public EvictionPolicy {
 public:
  explicit DeclaredPolicy(uint64_t capacity) : capacity_(capacity) {}

  void on_hit(ChunkId id) override {
    auto it = entries_.find(id);
    if (it == entries_.end()) {
      consume(id);
      return;
    }
    reorder(it->second, [&] { consume(id); });
  }

  Admission admit(ChunkId id, uint64_t bytes) override {
    consume(id);
    return insert(id, bytes, /*test=*/true);
  }
  Admission restore(ChunkId id, uint64_t bytes) override {
    return insert(id, bytes, /*test=*/false);
  }

  void erase(ChunkId id) override {
    auto it = entries_.find(id);
    if (it == entries_.end()) return;
    if (!it->second.pinned) by_next_use_.erase(rank(id, it->second));
    bytes_ -= it->second.bytes;
    entries_.erase(it);
  }

  void set_pinned(ChunkId id, bool pinned) override {
    auto it = entries_.find(id);
    if (it == entries_.end() || it->second.pinned == pinned) return;
    if (pinned) by_next_use_.erase(rank(id, it->second));
    it->second.pinned = pinned;
    if (!pinned) by_next_use_.insert(rank(id, it->second));
  }

  void declare(std::span<const ChunkId> order) override {
    for (ChunkId id : order) {
      // Bounded: declarations that are never read (a killed job) stop adding past this;
      // reads consume them and make room.
      if (outstanding_ >= kMaxOutstanding) return;
      ++outstanding_;
      auto it = entries_.find(id);
      if (it == entries_.end()) {
        future_[id].push_back(next_position_++);
      } else {
        reorder(it->second, [&] { future_[id].push_back(next_position_++); });
      }
    }
  }

  bool contains(ChunkId id) const override { return entries_.contains(id); }
  uint64_t resident_bytes() const override { return bytes_; }
  uint64_t capacity() const override { return capacity_; }
  PolicyKind kind() const override { return PolicyKind::kDeclared; }

 private:
  static constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();
  struct Entry {
    uint64_t bytes = 0;
    uint64_t seq = 0;  // admission order, for ties among chunks never read again
    bool pinned = false;
    ChunkId id = 0;
  };
  // Ordered so the last element is the best victim: furthest next use, then oldest.
  using Rank = std::tuple<uint64_t, uint64_t, ChunkId>;  // next use, ~seq, id

  uint64_t next_use(ChunkId id) const {
    auto it = future_.find(id);
    return it == future_.end() || it->second.empty() ? kNever : it->second.front();
  }
  Rank rank(ChunkId id, const Entry& e) const { return {next_use(id), ~e.seq, id}; }

  // Runs `change` (which moves id's next use) while keeping by_next_use_ ordered.
  template <typename F>
  void reorder(Entry& e, F change) {
    if (!e.pinned) by_next_use_.erase(rank(e.id, e));
    change();
    if (!e.pinned) by_next_use_.insert(rank(e.id, e));
  }

  void consume(ChunkId id) {
    auto it = future_.find(id);
    if (it == future_.end()) return;
    if (!it->second.empty()) {
      it->second.pop_front();
      --outstanding_;
    }
    if (it->second.empty()) future_.erase(it);
  }

  Admission insert(ChunkId id, uint64_t bytes, bool test) {
    Admission a;
    if (bytes > capacity_ || entries_.contains(id)) return a;
    uint64_t mine = next_use(id);
    std::vector<ChunkId> victims;
    uint64_t freed = 0;
    for (auto it = by_next_use_.rbegin();
         bytes_ + bytes - freed > capacity_ && it != by_next_use_.rend(); ++it) {
      auto [use, inv_seq, victim] = *it;
      // Belady with bypass: never push out a chunk needed sooner than this one.
      if (test && mine != kNever && use <= mine) return a;
      if (test && mine == kNever && use != kNever) return a;
      victims.push_back(victim);
      freed += entries_.at(victim).bytes;
    }
    if (bytes_ + bytes - freed > capacity_) return a;  // only pinned bytes left
    for (ChunkId v : victims) {
      erase(v);
      a.evicted.push_back(v);
    }
    Entry e{bytes, seq_++, false, id};
    entries_[id] = e;
    by_next_use_.insert(rank(id, e));
    bytes_ += bytes;
    a.admitted = true;
    return a;
  }

  uint64_t capacity_;
  uint64_t bytes_ = 0;
  uint64_t seq_ = 0;
  uint64_t next_position_ = 0;
  std::unordered_map<ChunkId, std::deque<uint64_t>> future_;  // declared positions, ascending
  size_t outstanding_ = 0;                                    // positions in future_
  static constexpr size_t kMaxOutstanding = 4 * kMaxDeclaredChunks;
  std::unordered_map<ChunkId, Entry> entries_;
  std::set<Rank> by_next_use_;  // unpinned resident chunks
};

}  // namespace

std::vector<double> replay_trace(EvictionPolicy& p, std::span<const std::vector<ChunkId>> epochs,
                                 uint64_t chunk_bytes, TraceDeclare declare) {
  if (declare == TraceDeclare::kAll) {
    for (const auto& e : epochs) p.declare(e);
  }
  std::vector<double> ratios;
  for (const auto& epoch : epochs) {
    if (declare == TraceDeclare::kEachEpoch) p.declare(epoch);
    size_t hits = 0;
    for (ChunkId id : epoch) {
      if (p.contains(id)) {
        p.on_hit(id);
        ++hits;
      } else {
        (void)p.admit(id, chunk_bytes);
      }
    }
    ratios.push_back(epoch.empty() ? 0.0 : static_cast<double>(hits) / epoch.size());
  }
  return ratios;
}

std::unique_ptr<EvictionPolicy> make_policy(PolicyKind kind, uint64_t capacity_bytes) {
  switch (kind) {
    case PolicyKind::kLru:
      return std::make_unique<LruPolicy>(capacity_bytes);
    case PolicyKind::kDeclared:
      return std::make_unique<DeclaredPolicy>(capacity_bytes);
    case PolicyKind::kS3Fifo:
      break;
  }
  return std::make_unique<S3FifoPolicy>(capacity_bytes);
}

}  // namespace sluice::cache
