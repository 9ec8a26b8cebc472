// Reads one object through sluice's node cache, the way any embedding program would:
//
//   sluice_embed HOME STORE_URI KEY
//
// HOME holds the embedded cache (HOME/cache) and, when sluiced runs there, its socket; the
// read goes through sluiced when it answers and through the embedded cache otherwise. The
// object is read twice, and both reads must agree. Prints the size, the XXH3 of the bytes and
// the store read through, one `name value` per line.
#include <cinttypes>
#include <cstdio>
#include <string>
#include <vector>

#include "sluice/client/session.h"
#include "sluice/core/hash.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s HOME STORE_URI KEY\n", argv[0]);
    return 2;
  }
  sluice::client::SessionOptions options;
  options.home = argv[1];
  options.on_fallback = [](const std::string& why) {
    std::fprintf(stderr, "sluice_embed: the embedded cache: %s\n", why.c_str());
  };
  sluice::client::Session session(std::move(options));
  auto store = session.open_cached(argv[2]);
  if (!store) {
    std::fprintf(stderr, "sluice_embed: %s\n", store.error().to_string().c_str());
    return 1;
  }
  const std::string key = argv[3];
  uint64_t hash = 0;
  uint64_t size = 0;
  for (int round = 0; round < 2; ++round) {
    auto info = (*store)->stat(key);
    if (!info) {
      std::fprintf(stderr, "sluice_embed: %s\n", info.error().to_string().c_str());
      return 1;
    }
    std::vector<std::byte> bytes(info->size);
    auto n = (*store)->read_full(key, 0, bytes);
    if (!n) {
      std::fprintf(stderr, "sluice_embed: %s\n", n.error().to_string().c_str());
      return 1;
    }
    const uint64_t h = sluice::xxh3_64(std::span<const std::byte>(bytes.data(), *n));
    if (round == 1 && h != hash) {
      std::fprintf(stderr, "sluice_embed: the cached read of %s differs\n", key.c_str());
      return 1;
    }
    hash = h;
    size = *n;
  }
  std::printf("size %" PRIu64 "\nxxh3 %016" PRIx64 "\n", size, hash);
  std::printf("through %s\n", (*store)->uri().c_str());
  return 0;
}
