#include "tools/bench/table.h"

#include <gtest/gtest.h>

#include <sstream>

#include "engine/core/error.h"

namespace fsdp::bench {
namespace {

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

Table Sample() {
  Table t({{"size", "size", "(B)", 0},
           {"time_us", "time", "(us)", 2},
           {"type", "type", "", 0, true},
           {"wrong", "#wrong"}});
  t.AddRow({int64_t{1024}, 12.345, std::string("float"), int64_t{0}});
  t.AddRow({int64_t{67108864}, 1234.5, std::string("bf16"), TableCell()});
  return t;
}

TEST(TableTest, TextAlignsColumnsUnderTheirHeaders) {
  const auto lines = Lines(Sample().ToText());
  ASSERT_EQ(lines.size(), 4u);  // header, units, two rows
  EXPECT_EQ(lines[0][0], '#');
  EXPECT_EQ(lines[1][0], '#');
  EXPECT_NE(lines[1].find("(us)"), std::string::npos);
  EXPECT_NE(lines[2].find("12.35"), std::string::npos);  // precision 2
  EXPECT_NE(lines[3].find("1234.50"), std::string::npos);
  EXPECT_NE(lines[3].find(" -"), std::string::npos);  // empty cell
  // Right-aligned numbers end where their header ends.
  const size_t size_end = lines[0].find("size") + 4;
  EXPECT_EQ(lines[2].find("1024") + 4, size_end);
  EXPECT_EQ(lines[3].find("67108864") + 8, size_end);
  // Left-aligned strings start where their header starts.
  EXPECT_EQ(lines[2].find("float"), lines[0].find("type"));
  EXPECT_EQ(lines[3].find("bf16"), lines[0].find("type"));
}

TEST(TableTest, IndentPrefixesEveryLine) {
  for (const auto& l : Lines(Sample().ToText("    "))) EXPECT_EQ(l.rfind("    ", 0), 0u) << l;
}

TEST(TableTest, JsonKeysRowsByColumnKeyWithFullPrecision) {
  const nlohmann::json j = Sample().ToJson();
  ASSERT_TRUE(j.is_array());
  ASSERT_EQ(j.size(), 2u);
  EXPECT_EQ(j[0]["size"], 1024);
  EXPECT_DOUBLE_EQ(j[0]["time_us"].get<double>(), 12.345);
  EXPECT_EQ(j[0]["type"], "float");
  EXPECT_EQ(j[0]["wrong"], 0);
  EXPECT_TRUE(j[1]["wrong"].is_null());
}

TEST(TableTest, RejectsBadShapes) {
  Table t({{"a"}, {"b"}});
  EXPECT_THROW(t.AddRow({int64_t{1}}), Error);
  EXPECT_THROW(Table({}), Error);
  EXPECT_THROW(Table({{"a"}, {"a"}}), Error);
  EXPECT_EQ(t.ColumnIndex("b"), 1u);
  try {
    t.ColumnIndex("c");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
  }
}

TEST(TableTest, HeaderDefaultsToKeyAndNoUnitsLineWithoutUnits) {
  Table t({{"alpha"}, {"beta"}});
  t.AddRow({int64_t{1}, std::string("x")});
  const auto lines = Lines(t.ToText());
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_NE(lines[0].find("alpha"), std::string::npos);
}

}  // namespace
}  // namespace fsdp::bench
