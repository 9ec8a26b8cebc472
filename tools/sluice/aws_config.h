// Where the CLI finds S3 settings: flags, then the standard AWS environment variables,
// then ~/.aws/credentials and ~/.aws/config, as the AWS CLI does.
#pragma once

#include <string>

#include "sluice/core/status.h"
#include "sluice/s3/store.h"

namespace sluice::cli {

struct AwsFlags {
  std::string profile;       // --profile
  std::string endpoint_url;  // --endpoint-url
  std::string region;        // --region
};

// Precedence: flags; then AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN
// (unless --profile was given), AWS_REGION / AWS_DEFAULT_REGION, AWS_ENDPOINT_URL_S3 /
// AWS_ENDPOINT_URL; then the profile (AWS_PROFILE or "default") in
// AWS_SHARED_CREDENTIALS_FILE (~/.aws/credentials) and AWS_CONFIG_FILE (~/.aws/config).
// A custom endpoint selects path-style addressing. A named profile that exists in
// neither file is an error; no credentials at all means unsigned (anonymous) requests.
Result<s3::S3Options> load_s3_options(const AwsFlags& flags);
// StoreOptions carrying those S3 settings, with the s3:// scheme registered: what a
// command passes to open_store for a URI that may be s3://.
Result<store::StoreOptions> s3_store_options(const AwsFlags& flags);

}  // namespace sluice::cli
