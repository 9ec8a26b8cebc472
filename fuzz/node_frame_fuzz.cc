// Node-protocol frames (docs/formats/node-protocol.md) as sluiced and its clients receive
// them. The input is written into one end of a socket pair and read back with
// FrameChannel::receive until the stream ends or a frame is refused; each frame's JSON goes
// through parse_body and the typed field access of node/wire.h (what every request handler
// and reply parser uses), error frames through error_of, and the error reply a daemon would
// send back through error_frame. Each input is also tried with its frames' magic, version
// and checksums made right, so the fuzzer reaches the JSON behind them.
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <thread>

#include "fuzz_util.h"
#include "node/frame.h"
#include "node/wire.h"

using namespace sluice;
using namespace std::chrono_literals;

namespace {

constexpr size_t kMaxInput = size_t{1} << 20;

uint32_t le32(const std::byte* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t(std::to_integer<uint8_t>(p[i])) << (8 * i);
  return v;
}

// The input with each frame's header made valid: magic, version, checksum (its lengths and
// type are the fuzzer's).
std::vector<std::byte> with_valid_headers(std::span<const std::byte> in) {
  std::vector<std::byte> out(in.begin(), in.end());
  for (size_t pos = 0; pos + node::kHeaderBytes <= out.size();) {
    std::byte* h = out.data() + pos;
    std::memcpy(h, "SLND", 4);
    h[4] = std::byte(node::kProtocolVersion & 0xff);
    h[5] = std::byte(node::kProtocolVersion >> 8);
    const uint64_t json = le32(h + 8), data = le32(h + 12);
    const uint64_t body = std::min<uint64_t>(json + data, out.size() - pos - node::kHeaderBytes);
    std::vector<std::byte> covered(h, h + 24);
    covered.insert(covered.end(), h + node::kHeaderBytes, h + node::kHeaderBytes + body);
    const uint64_t sum = xxh3_64(covered.data(), covered.size());
    for (int i = 0; i < 8; ++i) h[24 + i] = std::byte(sum >> (8 * i));
    pos += node::kHeaderBytes + body;
  }
  return out;
}

// What the daemon and the clients read from a body: every typed accessor, on the fields
// the protocol names, at the top level and in the arrays of objects.
void read_body(const node::Json& j) {
  static const char* const kFields[] = {"root",         "key",           "prefix",
                                        "offset",       "length",        "if_match",
                                        "inline_only",  "window",        "bytes",
                                        "pinned",       "reads",         "max_keys",
                                        "continuation", "version",       "size",
                                        "etag",         "end",           "fetched",
                                        "not_kept",     "chunks",        "pieces",
                                        "fd",           "file_offset",   "xxh3",
                                        "data_offset",  "window_offset", "window_generation",
                                        "objects",      "next",          "team",
                                        "directory",    "chunk_size",    "pid",
                                        "windows",      "mtime_ns",      "code",
                                        "message",      "truncated"};
  for (const char* f : kFields) {
    (void)node::get_string(j, f);
    (void)node::get_string_or(j, f, "");
    (void)node::get_u64(j, f);
    (void)node::get_u64_or(j, f, 0);
    (void)node::get_bool_or(j, f, false);
  }
  for (const char* list : {"reads", "pieces", "objects", "chunks"}) {
    auto it = j.find(list);
    if (it == j.end() || !it->is_array()) continue;
    for (const node::Json& e : *it) {
      if (!e.is_object()) continue;
      for (const char* f : kFields) {
        (void)node::get_string(e, f);
        (void)node::get_u64(e, f);
        (void)node::get_bool_or(e, f, false);
      }
    }
  }
}

void receive_all(std::span<const std::byte> stream) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return;
  node::FrameChannel channel{UniqueFd(sv[0])};
  UniqueFd writer_end(sv[1]);
  std::thread writer([&] {
    size_t sent = 0;
    while (sent < stream.size()) {
      ssize_t n =
          ::send(writer_end.get(), stream.data() + sent, stream.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) break;  // the reader gave up: the rest is not wanted
      sent += static_cast<size_t>(n);
    }
    ::shutdown(writer_end.get(), SHUT_WR);
  });
  for (int frames = 0; frames < 1024; ++frames) {
    auto f = channel.receive(2000ms, 2000ms);
    if (!f || !*f) break;  // refused (the channel is lost), or the stream ended
    const node::Frame& frame = **f;
    if (auto j = node::parse_body(frame.json)) read_body(*j);
    (void)node::error_of(frame, "fuzz");
    // A daemon quotes what it refuses; the reply must still be sendable JSON.
    node::Frame reply =
        node::error_frame(frame.request_id, Error(Code::kInvalidArgument, frame.json));
    SLUICE_FUZZ_CHECK(reply.json.size() <= node::kMaxJsonBytes, "an error reply fits a frame");
    SLUICE_FUZZ_CHECK(node::parse_body(reply.json).has_value(), "an error reply is JSON");
  }
  ::shutdown(channel.fd(), SHUT_RDWR);  // unblocks a writer still sending
  writer.join();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > kMaxInput) return -1;
  const auto bytes = fuzz::bytes_of(data, size);
  receive_all(bytes);
  receive_all(with_valid_headers(bytes));
  return 0;
}
