// The AWS files the CLI and sluiced read for S3 settings (~/.aws/credentials and
// ~/.aws/config, INI, include/sluice/client/environment.h): a parser that only reads files, so the
// input is written to two files under /dev/shm (split at the first NUL: credentials, then
// config), named by AWS_SHARED_CREDENTIALS_FILE and AWS_CONFIG_FILE, and load_s3_options
// reads them for the default profile and a named one.
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "fuzz_util.h"
#include "sluice/client/environment.h"

using namespace sluice;

namespace {

std::string dir;

void write_file(const std::string& path, std::string_view text) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();  // /dev/shm is the harness's own: a failure here is the machine's
  if (!text.empty()) std::fwrite(text.data(), 1, text.size(), f);
  std::fclose(f);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  dir = "/dev/shm/sluice-fuzz-aws-" + std::to_string(::getpid());
  ::mkdir(dir.c_str(), 0700);
  setenv("AWS_SHARED_CREDENTIALS_FILE", (dir + "/credentials").c_str(), 1);
  setenv("AWS_CONFIG_FILE", (dir + "/config").c_str(), 1);
  for (const char* v :
       {"AWS_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
        "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"})
    unsetenv(v);
  std::atexit([] {
    std::remove((dir + "/credentials").c_str());
    std::remove((dir + "/config").c_str());
    ::rmdir(dir.c_str());
  });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text = fuzz::text_of(data, size);
  const size_t nul = text.find('\0');
  write_file(dir + "/credentials", text.substr(0, nul));
  write_file(dir + "/config", nul == std::string_view::npos ? "" : text.substr(nul + 1));
  (void)client::s3_options_from_environment({});
  (void)client::s3_options_from_environment({.profile = "fuzz"});
  return 0;
}
