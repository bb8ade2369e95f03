#include "tools/bench/byte_size.h"

#include <gtest/gtest.h>

#include "engine/core/error.h"

namespace fsdp::bench {
namespace {

TEST(ByteSizeTest, ParsesPlainNumbersAndBinarySuffixes) {
  EXPECT_EQ(ParseByteSize("0"), 0);
  EXPECT_EQ(ParseByteSize("1000"), 1000);
  EXPECT_EQ(ParseByteSize("1K"), 1024);
  EXPECT_EQ(ParseByteSize("64k"), 64 * 1024);
  EXPECT_EQ(ParseByteSize("64M"), int64_t{64} << 20);
  EXPECT_EQ(ParseByteSize("2G"), int64_t{2} << 30);
  EXPECT_EQ(ParseByteSize("64MB"), int64_t{64} << 20);
  EXPECT_EQ(ParseByteSize("64MiB"), int64_t{64} << 20);
  EXPECT_EQ(ParseByteSize("512B"), 512);
}

TEST(ByteSizeTest, RejectsMalformedSizesNamingTheFlag) {
  for (const char* bad : {"", "K", "-1", "1.5M", "1T", "1KK", "1 K", "1Mx"}) {
    try {
      ParseByteSize(bad, "-b");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(e.message().find("-b"), std::string::npos) << e.message();
    }
  }
  EXPECT_THROW(ParseByteSize("99999999999999999999"), Error);
  EXPECT_THROW(ParseByteSize("9999999999999G"), Error);
}

TEST(ByteSizeTest, FormatsTheShortestExactSpelling) {
  EXPECT_EQ(FormatByteSize(0), "0");
  EXPECT_EQ(FormatByteSize(1000), "1000");
  EXPECT_EQ(FormatByteSize(1024), "1K");
  EXPECT_EQ(FormatByteSize(1536), "1536");
  EXPECT_EQ(FormatByteSize(int64_t{64} << 20), "64M");
  EXPECT_EQ(FormatByteSize(int64_t{3} << 30), "3G");
  for (int64_t v : {int64_t{1}, int64_t{4096}, int64_t{3} << 20, int64_t{12345}}) {
    EXPECT_EQ(ParseByteSize(FormatByteSize(v)), v);
  }
}

}  // namespace
}  // namespace fsdp::bench
