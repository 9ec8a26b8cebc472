#include "signing.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>

namespace sluice::peer {

std::string hmac_hex(std::string_view secret, std::string_view msg) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  if (!HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
            reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), mac, &len))
    return {};
  static const char* d = "0123456789abcdef";
  std::string s(2 * len, '0');
  for (unsigned i = 0; i < len; ++i) {
    s[2 * i] = d[mac[i] >> 4];
    s[2 * i + 1] = d[mac[i] & 15];
  }
  return s;
}

bool has_control(std::string_view s) {
  return std::any_of(s.begin(), s.end(),
                     [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; });
}

bool equal_in_constant_time(std::string_view a, std::string_view b) {
  return !a.empty() && a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace sluice::peer
