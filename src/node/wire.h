// JSON bodies of the node protocol, shared by sluiced and its clients: typed field access
// that turns a missing or mistyped field into InvalidArgument (never an exception escaping
// to the caller), and errors carried as {"code", "message"}.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "node/frame.h"
#include "sluice/core/status.h"

namespace sluice::node {

using Json = nlohmann::json;

inline Result<Json> parse_body(std::string_view text) {
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return fail(Code::kInvalidArgument, "request body is not a JSON object (in UTF-8)");
  return j;
}

inline std::unexpected<Error> bad_field(std::string_view name, std::string_view want) {
  return fail(Code::kInvalidArgument,
              "field '" + std::string(name) + "' must be " + std::string(want));
}

inline Result<std::string> get_string(const Json& j, std::string_view name) {
  auto it = j.find(name);
  if (it == j.end() || !it->is_string()) return bad_field(name, "a string");
  return it->get<std::string>();
}

inline Result<std::string> get_string_or(const Json& j, std::string_view name,
                                         std::string fallback) {
  if (!j.contains(name)) return fallback;
  return get_string(j, name);
}

inline Result<uint64_t> get_u64(const Json& j, std::string_view name) {
  auto it = j.find(name);
  if (it == j.end() || !it->is_number_unsigned()) return bad_field(name, "an unsigned integer");
  return it->get<uint64_t>();
}

inline Result<uint64_t> get_u64_or(const Json& j, std::string_view name, uint64_t fallback) {
  if (!j.contains(name)) return fallback;
  return get_u64(j, name);
}

inline Result<bool> get_bool_or(const Json& j, std::string_view name, bool fallback) {
  auto it = j.find(name);
  if (it == j.end()) return fallback;
  if (!it->is_boolean()) return bad_field(name, "true or false");
  return it->get<bool>();
}

// At most this much of an error's message goes into a frame or a log line: a message that
// quotes a request (a key of up to 1 MiB) must not make the reply too large to send.
inline constexpr size_t kMaxMessageBytes = 4096;

inline std::string clipped(std::string m) {
  if (m.size() > kMaxMessageBytes) {
    m.resize(kMaxMessageBytes);
    m += "... (" + std::to_string(m.size()) + " bytes shown)";
  }
  return m;
}

inline Frame error_frame(uint64_t request_id, const Error& e) {
  Frame f;
  f.type = static_cast<uint16_t>(FrameType::kError);
  f.request_id = request_id;
  f.json = Json{{"code", static_cast<int>(e.code())},
                {"code_name", std::string(code_name(e.code()))},
                {"message", clipped(e.message())}}
               .dump(-1, ' ', false, Json::error_handler_t::replace);
  return f;
}

// The error an error frame carries; a frame that does not parse is itself the error.
inline Error error_of(const Frame& f, std::string_view what) {
  auto j = parse_body(f.json);
  Code code = Code::kInternal;
  std::string message = "malformed error reply";
  if (j) {
    auto c = get_u64(*j, "code");
    auto m = get_string(*j, "message");
    if (c && *c > 0 && *c <= static_cast<uint64_t>(Code::kInternal)) code = static_cast<Code>(*c);
    if (m) message = *m;
  }
  return Error(code, std::string(what) + ": " + message);
}

}  // namespace sluice::node
