// URIs as users and clients give them: the CLI's locations (tools/sluice/location.h, with
// "cache+"), store URIs through open_store's scheme registry (its backends replaced by stubs,
// so nothing is opened), s3:// bucket URIs, store keys, and the roots sluiced normalises and
// grants (normalize_root, root_granted). The input is a URI, then optionally a newline and a
// grant to check it against. A normalised root must normalise to itself and be granted by
// itself.
#include <cstddef>
#include <cstdint>

#include "fuzz_util.h"
#include "sluice/client/location.h"
#include "sluice/node/server.h"
#include "sluice/s3/store.h"
#include "sluice/store/store.h"

using namespace sluice;

namespace {

// Backends that open nothing: open_store's parsing and dispatch run, no file, memory store
// or connection is made.
void stub_backends() {
  static const bool once = [] {
    for (const char* scheme : {"file", "mem", "s3", "sluiced", "node+s3", "cache+s3"})
      store::register_scheme(
          scheme,
          [](std::string_view,
             const store::StoreOptions&) -> Result<std::unique_ptr<store::Store>> {
            return fail(Code::kUnsupported, "fuzz: not opened");
          });
    return true;
  }();
  (void)once;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  stub_backends();
  const std::string_view text = fuzz::text_of(data, size);
  const size_t nl = text.find('\n');
  const std::string_view uri = text.substr(0, nl);
  const std::string_view grant = nl == std::string_view::npos ? "*" : text.substr(nl + 1);

  (void)client::scheme_of(uri);
  if (auto loc = client::parse_location(std::string(uri)); loc && !loc->local)
    (void)store::open_store(loc->store_uri);
  (void)store::open_store(uri);
  (void)s3::parse_s3_uri(uri);
  (void)store::validate_key(uri);

  if (auto root = node::normalize_root(uri)) {
    auto again = node::normalize_root(*root);
    SLUICE_FUZZ_CHECK(again && *again == *root, "a normalised root normalises to itself");
    SLUICE_FUZZ_CHECK(node::root_granted(*root, *root), "a root is granted by itself");
    (void)node::root_granted(*root, grant);
  }
  return 0;
}
