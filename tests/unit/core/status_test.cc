#include <cerrno>

#include <gtest/gtest.h>

#include "sluice/core/status.h"

namespace sluice {
namespace {

TEST(Status, ErrnoMapsToCodesInOnePlace) {
  EXPECT_EQ(error_from_errno(ENOENT, "open /x").code(), Code::kNotFound);
  EXPECT_EQ(error_from_errno(ENOSPC, "write /x").code(), Code::kNoSpace);
  EXPECT_EQ(error_from_errno(EDQUOT, "write /x").code(), Code::kNoSpace);
  EXPECT_EQ(error_from_errno(EACCES, "open /x").code(), Code::kPermissionDenied);
  EXPECT_EQ(error_from_errno(EROFS, "open /x").code(), Code::kPermissionDenied);
  EXPECT_EQ(error_from_errno(EINVAL, "pread").code(), Code::kInvalidArgument);
  EXPECT_EQ(error_from_errno(EIO, "pread").code(), Code::kIoError);
  EXPECT_EQ(error_from_errno(ENOSYS, "io_uring_setup").code(), Code::kUnsupported);
  EXPECT_EQ(error_from_errno(ECONNRESET, "recv").code(), Code::kUnavailable);
}

TEST(Status, MessageNamesTheObjectAndTheCause) {
  Error e = error_from_errno(ENOENT, "open /data/shard-7");
  EXPECT_EQ(e.sys_errno(), ENOENT);
  EXPECT_EQ(e.to_string(), "not_found: open /data/shard-7: No such file or directory");
  Error c = e.with_context("loading dataset");
  EXPECT_EQ(c.code(), Code::kNotFound);
  EXPECT_EQ(c.message(), "loading dataset: open /data/shard-7: No such file or directory");
}

TEST(Status, EveryCodeHasAName) {
  for (int c = 0; c <= static_cast<int>(Code::kInternal); ++c)
    EXPECT_NE(code_name(static_cast<Code>(c)), "unknown") << c;
}

Result<int> half(int v) {
  if (v % 2) return fail(Code::kInvalidArgument, std::to_string(v) + " is odd");
  return v / 2;
}

Result<int> quarter(int v) {
  SLUICE_ASSIGN_OR_RETURN(int h, half(v));
  SLUICE_ASSIGN_OR_RETURN(int q, half(h));
  return q;
}

Status check_even(int v) {
  SLUICE_RETURN_IF_ERROR(half(v));
  return ok();
}

TEST(Status, MacrosPropagateErrors) {
  EXPECT_EQ(quarter(8).value(), 2);
  auto r = quarter(6);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().message(), "3 is odd");
  EXPECT_TRUE(check_even(2));
  EXPECT_FALSE(check_even(3));
}

}  // namespace
TEST(Status, ControlCharactersInMessagesAreEscaped) {
  // Defect 9: a key with a newline must not print a second, forged log line.
  Error e(Code::kNotFound, "object 'a\nsluice: error: forged\r\t\x1b[2J' missing");
  EXPECT_EQ(e.message(), "object 'a\\nsluice: error: forged\\r\\t\\x1b[2J' missing");
  EXPECT_EQ(e.to_string().find('\n'), std::string::npos);
  EXPECT_EQ(e.with_context("ctx\n").message().find('\n'), std::string::npos);
  EXPECT_EQ(printable("plain/key ok"), "plain/key ok");
  EXPECT_EQ(printable(std::string("nul\0byte", 8)), "nul\\x00byte");
  EXPECT_EQ(printable(printable("a\nb")), "a\\nb");  // quoting a message escapes once
  EXPECT_EQ(printable("\xc3\xbcnï"), "\xc3\xbcnï");  // UTF-8 is kept
}

}  // namespace sluice
