// A peer daemon's object-space replies as the sluiced:// store reads them (src/peer/
// object_store.cc, docs/formats/peer-protocol.md "Object space"): the status and error body,
// the reply's XXH3 and signature headers, stat's and list's JSON, begin's upload id, a read's
// bytes. A fake owner in the process answers on 127.0.0.1 (an ephemeral port, nothing
// leaves the host) each request it gets, in order, with the next reply of the input, and
// closes the connection after it; the store is sluiced://node-7@127.0.0.1:PORT/ckpt/.
//
// The input is sections separated by "\n--\n". Each starts with a line "OP [STATUS]": OP is
// what the store does when the harness reaches the section (stat, list, read, create,
// write, commit, remove; anything else: nothing, the reply only waits its turn), STATUS the
// reply's HTTP status (200 when absent). Then "Name: value" header lines up to an empty
// line, then the body. X-Sluice-Xxh3 and X-Sluice-Reply-Signature are computed for the body
// and the request's signature with the node secret, unless the section gives its own:
// so the fuzzer reaches the JSON behind the signature, and can still send a bad one.
// Requests beyond the replies get 503.
// Beyond "no crash": a call that succeeds took a reply signed with the secret; what it
// returns stays within what it asked for (the key stat'ed, the folder and prefix listed,
// the buffer read into).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sanitizer/lsan_interface.h>
#include <sys/socket.h>
#include <unistd.h>

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>

#include "fuzz_util.h"
#include "sluice/core/fd.h"
#include "sluice/core/hash.h"
#include "sluice/peer/object_store.h"
#include "sluice/peer/peer_store.h"

using namespace sluice;

namespace {

constexpr size_t kMaxInput = 128 << 10;
constexpr std::string_view kSecret = "fuzz-node-secret-0123456789";

struct Reply {
  int status = 200;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
};

std::string hex16(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// The fake owner: one thread accepting a connection at a time (the store sends one request
// at a time), reading one request and answering it.
struct FakeOwner {
  UniqueFd listener;
  uint16_t port = 0;
  int wake[2] = {-1, -1};
  std::thread thread;
  std::mutex mu;
  std::deque<Reply> replies;  // guarded by mu
  std::vector<bool> genuine;  // per request answered: a 200 signed with the secret; mu

  // The request's head (its body, if any, is read and ignored); empty on a broken one.
  static std::string read_request(int fd) {
    std::string in;
    char buf[4096];
    size_t head_end;
    while ((head_end = in.find("\r\n\r\n")) == std::string::npos) {
      ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0 || in.size() > (1 << 20)) return {};
      in.append(buf, static_cast<size_t>(n));
    }
    std::string head = in.substr(0, head_end + 2);
    size_t length = 0;
    for (std::string_view name : {"Content-Length: ", "content-length: "}) {
      if (size_t at = head.find(name); at != std::string::npos) {
        const char* p = head.data() + at + name.size();
        std::from_chars(p, head.data() + head.size(), length);
      }
    }
    for (size_t have = in.size() - head_end - 4; have < length;) {
      ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) return {};
      have += static_cast<size_t>(n);
    }
    return head;
  }

  static std::string header_of(const std::string& head, std::string_view name) {
    size_t at = head.find("\r\n" + std::string(name) + ": ");
    if (at == std::string::npos) return {};
    at += name.size() + 4;
    return head.substr(at, head.find("\r\n", at) - at);
  }

  void answer(int fd) {
    timeval tv{2, 0};
    (void)::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    (void)::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    const std::string head = read_request(fd);
    if (head.empty()) return;
    Reply r;
    bool have = false;
    {
      std::lock_guard lock(mu);
      if (!replies.empty()) {
        r = std::move(replies.front());
        replies.pop_front();
        have = true;
      }
    }
    if (!have) r.status = 503;
    std::string etag, xxh3, signature;
    bool own_sum = false, own_signature = false;
    for (const auto& [k, v] : r.headers) {
      if (k == "X-Sluice-Etag") etag = v;
      if (k == "X-Sluice-Xxh3") own_sum = true, xxh3 = v;
      if (k == "X-Sluice-Reply-Signature") own_signature = true, signature = v;
    }
    const uint64_t sum = xxh3_64(r.body.data(), r.body.size());
    std::string right;
    {
      // OpenSSL keeps a state per thread (pthread_setspecific), which LeakSanitizer does not
      // find from a thread other than the main one. The store's own signing and checking run
      // on the main thread, where a leak is still reported.
      __lsan::ScopedDisabler not_this_thread_state;
      right = peer::sign_chunk_reply(header_of(head, "X-Sluice-Signature"), etag, r.body.size(),
                                     sum, kSecret);
    }
    std::string out = "HTTP/1.1 " + std::to_string(r.status) + " Fuzz\r\n";
    for (const auto& [k, v] : r.headers) out += k + ": " + v + "\r\n";
    if (!own_sum) out += "X-Sluice-Xxh3: " + hex16(sum) + "\r\n";
    if (!own_signature) out += "X-Sluice-Reply-Signature: " + right + "\r\n";
    out += "Content-Length: " + std::to_string(r.body.size()) + "\r\nConnection: close\r\n\r\n";
    out += r.body;
    {
      std::lock_guard lock(mu);
      genuine.push_back(have && r.status == 200 && (!own_sum || xxh3 == hex16(sum)) &&
                        (!own_signature || signature == right));
    }
    for (size_t sent = 0; sent < out.size();) {
      ssize_t n = ::send(fd, out.data() + sent, out.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) break;
      sent += static_cast<size_t>(n);
    }
  }

  void serve() {
    for (;;) {
      pollfd p[2] = {{listener.get(), POLLIN, 0}, {wake[0], POLLIN, 0}};
      if (::poll(p, 2, -1) < 0) {
        if (errno == EINTR) continue;
        return;
      }
      if (p[1].revents) return;
      UniqueFd c(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (c.valid()) answer(c.get());
    }
  }
};
FakeOwner* owner_ = nullptr;

Reply parse_reply(std::string_view first_line, std::string_view rest) {
  Reply r;
  if (size_t sp = first_line.find(' '); sp != std::string_view::npos) {
    int status = 0;
    std::string_view s = first_line.substr(sp + 1);
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), status);
    if (ec == std::errc() && status >= 100 && status <= 599) r.status = status;
  }
  while (!rest.empty()) {
    const size_t nl = rest.find('\n');
    std::string_view line = rest.substr(0, nl);
    rest = nl == std::string_view::npos ? std::string_view{} : rest.substr(nl + 1);
    if (line.empty()) break;
    const size_t colon = line.find(": ");
    if (colon == std::string_view::npos || line.find('\r') != std::string_view::npos) continue;
    r.headers.emplace_back(std::string(line.substr(0, colon)), std::string(line.substr(colon + 2)));
  }
  r.body = std::string(rest);
  return r;
}

struct Section {
  std::string op;
  Reply reply;
};

std::vector<Section> sections_of(std::string_view text) {
  std::vector<Section> out;
  while (out.size() < 32) {
    const size_t sep = text.find("\n--\n");
    std::string_view s = text.substr(0, sep);
    const size_t nl = s.find('\n');
    std::string_view first = s.substr(0, nl);
    out.push_back({std::string(first.substr(0, first.find(' '))),
                   parse_reply(first, nl == std::string_view::npos ? "" : s.substr(nl + 1))});
    if (sep == std::string_view::npos) break;
    text.remove_prefix(sep + 4);
  }
  return out;
}

size_t answered() {
  std::lock_guard lock(owner_->mu);
  return owner_->genuine.size();
}

// A call that made one request and succeeded must have been answered with a signed 200.
void check_signed(bool succeeded, size_t before) {
  if (!succeeded) return;
  std::lock_guard lock(owner_->mu);
  if (owner_->genuine.size() == before + 1)
    SLUICE_FUZZ_CHECK(owner_->genuine[before], "only a reply signed with the secret is taken");
}

void act(const std::string& op, store::Store& s, std::unique_ptr<store::Writer>& w) {
  const size_t before = answered();
  if (op == "stat") {
    auto info = s.stat("x/y");
    if (info) SLUICE_FUZZ_CHECK(info->key == "x/y", "stat names its key");
    check_signed(info.has_value(), before);
  } else if (op == "list") {
    store::ListOptions lo;
    lo.prefix = "x/";
    lo.max_keys = 100;
    auto page = s.list(lo);
    if (page)
      for (const auto& o : page->objects)
        SLUICE_FUZZ_CHECK(o.key.starts_with("x/"), "a listing stays within its prefix");
    check_signed(page.has_value(), before);
  } else if (op == "read") {
    std::vector<std::byte> buf(512);
    auto n = s.read("x/y", 0, buf);
    if (n) SLUICE_FUZZ_CHECK(*n <= buf.size(), "a read fits its buffer");
    check_signed(n.has_value(), before);
  } else if (op == "create") {
    auto c = s.create("x/z", {});
    check_signed(c.has_value(), before);
    if (c) w = std::move(*c);
  } else if (op == "write" && w) {
    std::vector<std::byte> bytes(16, std::byte{'s'});
    Status st = w->append(bytes);
    check_signed(st.has_value(), before);
  } else if (op == "commit" && w) {
    Status st = w->commit();
    check_signed(st.has_value(), before);
  } else if (op == "remove") {
    Status st = s.remove("x/y");
    check_signed(st.has_value(), before);
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  owner_ = new FakeOwner;
  owner_->listener.reset(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (!owner_->listener.valid() ||
      ::bind(owner_->listener.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::listen(owner_->listener.get(), 16) != 0 ||
      ::getsockname(owner_->listener.get(), reinterpret_cast<sockaddr*>(&a), &len) != 0 ||
      ::pipe2(owner_->wake, O_CLOEXEC) != 0) {
    std::perror("peer_object_reply_fuzz: the fake owner's socket");
    std::abort();
  }
  owner_->port = ntohs(a.sin_port);
  owner_->thread = std::thread([] { owner_->serve(); });
  std::atexit([] {
    (void)::write(owner_->wake[1], "x", 1);
    owner_->thread.join();
  });
  peer::register_object_scheme();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > kMaxInput) return -1;
  std::vector<Section> sections = sections_of(fuzz::text_of(data, size));
  {
    std::lock_guard lock(owner_->mu);
    owner_->replies.clear();
    owner_->genuine.clear();
    for (Section& s : sections) owner_->replies.push_back(std::move(s.reply));
  }
  store::StoreOptions so;
  peer::ObjectStoreOptions po;
  po.node = "node-3";
  po.secret = std::string(kSecret);
  po.part_size = 8;  // a write of 16 bytes is two parts
  po.connect_timeout = std::chrono::milliseconds(1000);
  po.timeout = std::chrono::milliseconds(3000);
  so.backend.set(po);
  auto s = store::open_store(
      "sluiced://node-7@127.0.0.1:" + std::to_string(owner_->port) + "/ckpt/", so);
  SLUICE_FUZZ_CHECK(s.has_value(), "the store opens");
  {
    std::unique_ptr<store::Writer> w;
    for (const Section& sec : sections) act(sec.op, **s, w);
  }  // an uncommitted writer aborts its upload: one more request
  std::lock_guard lock(owner_->mu);
  owner_->replies.clear();
  return 0;
}
