// Unit tests of the per-rank judge checks (rank_checks.h): names, order, fields, errors.
#include "conformance/rank_checks.h"

#include <gtest/gtest.h>

#include "engine/core/error.h"

namespace fsdp::conformance {
namespace {

TEST(RankChecks, EveryRankInRankOrderNamedByRank) {
  const std::vector<nlohmann::json> per_rank = {
      {{"a", 1}, {"b", {{"forward", {{"x", 2}}}}}, {"c", {5, 6}}},
      {{"a", 3}, {"b", nlohmann::json::object()}, {"c", {5}}},
  };
  CheckList checks;
  CheckEveryRank(checks, per_rank, 2,
                 {{"a", "a value", 1},
                  {"b", "forward counts", {{"x", 2}}, "/forward"},
                  {"c", "element 1", 6, "/1"}});
  ASSERT_EQ(checks.checks().size(), 6u);
  EXPECT_TRUE(checks.checks()[2].passed);
  EXPECT_FALSE(checks.checks()[5].passed);  // absent element: null
  EXPECT_TRUE(checks.checks()[5].actual.is_null());
  checks = CheckList();
  CheckEveryRank(checks, per_rank, 2,
                 {{"a", "a value", 1}, {"b", "forward counts", {{"x", 2}}, "/forward"}});
  ASSERT_EQ(checks.checks().size(), 4u);
  EXPECT_EQ(checks.checks()[0].name, "rank 0 a value");
  EXPECT_TRUE(checks.checks()[0].passed);
  EXPECT_EQ(checks.checks()[1].name, "rank 0 forward counts");
  EXPECT_TRUE(checks.checks()[1].passed);
  EXPECT_EQ(checks.checks()[2].name, "rank 1 a value");
  EXPECT_FALSE(checks.checks()[2].passed);
  EXPECT_EQ(checks.checks()[2].expected, 1);
  EXPECT_EQ(checks.checks()[2].actual, 3);
  EXPECT_FALSE(checks.checks()[3].passed);  // absent field: null
  EXPECT_TRUE(checks.checks()[3].actual.is_null());
  EXPECT_EQ(RankName(7), "rank 7");
}

TEST(RankChecks, MissingObservationThrowsDataLossNamingTheRank) {
  const std::vector<nlohmann::json> per_rank = {{{"a", 1}}};
  CheckList checks;
  try {
    CheckRankEqual(checks, per_rank, 0, {"missing", "m", 1});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kDataLoss);
    EXPECT_NE(std::string(e.what()).find("missing"), std::string::npos) << e.what();
  }
}

TEST(RankChecks, ErrorChecksCodeOrReportsItsAbsence) {
  const std::vector<nlohmann::json> per_rank = {
      {{"error", {{"code", "DataLoss"}, {"message", "collective mismatch"}}}},
      {{"error", nullptr}},
  };
  CheckList checks;
  EXPECT_EQ(CheckRankError(checks, per_rank, 0, "DataLoss", "fails", "none"),
            std::optional<std::string>("collective mismatch"));
  EXPECT_EQ(CheckRankError(checks, per_rank, 1, "DataLoss", "fails with DataLoss",
                           "the rank reported no error"),
            std::nullopt);
  ASSERT_EQ(checks.checks().size(), 2u);
  EXPECT_EQ(checks.checks()[0].name, "rank 0 error code");
  EXPECT_TRUE(checks.checks()[0].passed);
  EXPECT_EQ(checks.checks()[1].name, "rank 1 fails with DataLoss");
  EXPECT_EQ(checks.checks()[1].detail, "the rank reported no error");
  EXPECT_FALSE(checks.checks()[1].passed);
}

TEST(RankChecks, FailedAcceptsAnyErrorAndReportsItsAbsence) {
  const std::vector<nlohmann::json> per_rank = {
      {{"error", {{"code", "InvalidArgument"}, {"message", "no AVG on int64"}}}},
      {{"error", nullptr}},
  };
  CheckList checks;
  EXPECT_TRUE(CheckRankFailed(checks, per_rank, 0, "call fails"));
  EXPECT_FALSE(CheckRankFailed(checks, per_rank, 1, "call fails"));
  ASSERT_EQ(checks.checks().size(), 2u);
  EXPECT_EQ(checks.checks()[0].name, "rank 0 call fails");
  EXPECT_TRUE(checks.checks()[0].passed);
  EXPECT_EQ(checks.checks()[0].detail, "InvalidArgument: no AVG on int64");
  EXPECT_EQ(checks.checks()[1].name, "rank 1 call fails");
  EXPECT_EQ(checks.checks()[1].detail, "the rank reported no error");
  EXPECT_FALSE(checks.checks()[1].passed);
}

TEST(RankChecks, TensorExactComparesDtypeShapeAndEveryValue) {
  const auto tensor = [](const std::string& dtype, std::vector<int64_t> shape,
                         std::vector<double> data) {
    return nlohmann::json{{"shape", shape}, {"dtype", dtype}, {"data", data}};
  };
  const std::vector<nlohmann::json> per_rank = {
      {{"tensors",
        {{"a", tensor("float32", {2}, {1.5, -2})},
         {"b", tensor("float32", {2}, {1.5, -2.0000001})},
         {"c", tensor("bfloat16", {2}, {1.5, -2})},
         {"d", tensor("float32", {1, 2}, {1.5, -2})}}}}};
  CheckList checks;
  EXPECT_TRUE(CheckRankTensorExact(checks, per_rank, 0, "a", "float32", {2}, {1.5, -2}));
  ASSERT_EQ(checks.checks().size(), 2u);
  EXPECT_EQ(checks.checks()[0].name, "rank 0 a dtype and shape");
  EXPECT_EQ(checks.checks()[1].name, "rank 0 a values");
  EXPECT_FALSE(CheckRankTensorExact(checks, per_rank, 0, "b", "float32", {2}, {1.5, -2}));
  EXPECT_FALSE(checks.checks().back().passed);
  EXPECT_EQ(checks.checks().back().name, "rank 0 b values");
  // A wrong dtype or shape fails without comparing values.
  const size_t before = checks.checks().size();
  EXPECT_FALSE(CheckRankTensorExact(checks, per_rank, 0, "c", "float32", {2}, {1.5, -2}));
  EXPECT_FALSE(CheckRankTensorExact(checks, per_rank, 0, "d", "float32", {2}, {1.5, -2}));
  ASSERT_EQ(checks.checks().size(), before + 2);
  EXPECT_EQ(checks.checks().back().name, "rank 0 d dtype and shape");
  // A missing tensor is a failed check naming what the rank reported.
  EXPECT_FALSE(CheckRankTensorExact(checks, per_rank, 0, "e", "float32", {2}, {1.5, -2}));
  EXPECT_EQ(checks.checks().back().name, "rank 0 e");
  EXPECT_NE(checks.checks().back().detail.find("tensors: a, b, c, d"), std::string::npos)
      << checks.checks().back().detail;
  // The JSON form: every expected tensor, in order.
  checks = CheckList();
  EXPECT_FALSE(CheckRankTensorsExact(
      checks, per_rank, 0,
      {{"a", tensor("float32", {2}, {1.5, -2})}, {"b", tensor("float32", {2}, {1.5, -2})}}));
  ASSERT_EQ(checks.checks().size(), 4u);
  EXPECT_TRUE(checks.checks()[1].passed);
  EXPECT_FALSE(checks.checks()[3].passed);
}

TEST(RankChecks, NamesRankMatchesTheWholeNumberOnly) {
  EXPECT_TRUE(NamesRank("rank 3 issued: allreduce_", 3));
  EXPECT_TRUE(NamesRank("failed on rank 3", 3));
  EXPECT_TRUE(NamesRank("(rank 3/4, global rank 3)", 3));
  EXPECT_FALSE(NamesRank("rank 31 issued", 3));
  EXPECT_FALSE(NamesRank("rank 13 issued", 3));
  EXPECT_FALSE(NamesRank("rank 0 issued", 3));
  EXPECT_TRUE(NamesRank("rank 31 issued; rank 3 issued", 3));
}

}  // namespace
}  // namespace fsdp::conformance
