#include "conformance/checks.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "conformance/observations.h"
#include "engine/core/error.h"

namespace fsdp::conformance {
namespace {

using ::testing::HasSubstr;

TEST(CheckList, EqualComparesJsonValues) {
  CheckList c;
  EXPECT_TRUE(c.CheckEqual("counts", {{"_allgather_base_", 3}}, {{"_allgather_base_", 3}}));
  EXPECT_FALSE(c.CheckEqual("events", nlohmann::json::array({"a"}), nlohmann::json::array({"b"})));
  EXPECT_EQ(c.failed_count(), 1);
  EXPECT_FALSE(c.all_passed());
  const std::string table = c.Table();
  EXPECT_THAT(table, HasSubstr("events"));
  EXPECT_THAT(table, HasSubstr("FAIL"));
  EXPECT_THAT(table, ::testing::Not(HasSubstr("counts")));  // failed only
  EXPECT_THAT(c.Table(false), HasSubstr("counts"));
  EXPECT_EQ(c.Summary(), "checks=1/2");
}

TEST(CheckList, CloseReportsMaxErrors) {
  CheckList c;
  EXPECT_TRUE(c.CheckClose("w", std::vector<double>{1.0, 2.0, 4.0},
                           std::vector<double>{1.0, 2.0 + 1e-7, 4.0}, {1e-5, 0}));
  EXPECT_THAT(c.checks()[0].detail, HasSubstr("max abs err 1e-07 at [1]"));
  EXPECT_FALSE(c.CheckClose("g", std::vector<double>{1.0, 2.0}, std::vector<double>{1.0, 2.5},
                            {1e-3, 1e-3}));
  EXPECT_THAT(c.checks()[1].detail, HasSubstr("first mismatch at [1]: expected 2, got 2.5"));
  EXPECT_DOUBLE_EQ(c.figures().at("max_abs_err").get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(c.figures().at("max_rel_err").get<double>(), 0.25);
  EXPECT_EQ(c.Summary(), "checks=1/2 max_abs_err=0.5 max_rel_err=0.25");
}

TEST(CheckList, CloseHandlesLengthsNansAndRelativeTolerance) {
  CheckList c;
  EXPECT_FALSE(c.CheckClose("len", std::vector<double>{1}, std::vector<double>{1, 2}));
  EXPECT_THAT(c.checks().back().detail, HasSubstr("length 2, expected 1"));
  EXPECT_FALSE(c.CheckClose("nan", std::vector<double>{1}, std::vector<double>{NAN}));
  EXPECT_TRUE(c.CheckClose("both nan", std::vector<double>{NAN}, std::vector<double>{NAN}));
  EXPECT_TRUE(
      c.CheckClose("rel", std::vector<double>{1000}, std::vector<double>{1000.5}, {0, 1e-3}));
  EXPECT_TRUE(c.CheckClose("exact", std::vector<double>{}, std::vector<double>{}, {0, 0}));
}

TEST(CheckList, CloseOnJsonValidatesNumberArrays) {
  CheckList c;
  EXPECT_TRUE(c.CheckClose("j", nlohmann::json::array({1, 2}), nlohmann::json::array({1, 2})));
  EXPECT_TRUE(c.CheckClose("scalar", nlohmann::json(3.0), nlohmann::json(3.0)));
  EXPECT_FALSE(c.CheckClose("bad", nlohmann::json::array({1}), nlohmann::json::array({"x"})));
  EXPECT_THAT(c.checks().back().detail, HasSubstr("actual value is element 0 is string"));
}

TEST(CheckList, LongArraysAreElidedInReports) {
  CheckList c;
  std::vector<double> big(1000, 1.0);
  c.CheckClose("big", big, big);
  EXPECT_EQ(c.checks()[0].expected.at("numel"), 1000);
  EXPECT_THAT(BriefJson(nlohmann::json(std::vector<int>(100, 7))), HasSubstr("more)]"));
  EXPECT_EQ(BriefJson(nullptr), "-");
}

TEST(CheckList, TrueAndFailRecordVerdicts) {
  CheckList c;
  EXPECT_TRUE(c.CheckTrue("t", true));
  c.Fail("rank 1 reported no losses", "keys: events");
  EXPECT_EQ(c.failed_count(), 1);
  const nlohmann::json j = c.checks()[1].ToJson();
  EXPECT_EQ(j["passed"], false);
  EXPECT_EQ(j["detail"], "keys: events");
  for (const char* key : {"name", "expected", "actual", "passed"}) EXPECT_TRUE(j.contains(key));
  c.SetFigure("steps", 10);
  EXPECT_THAT(c.Summary(), HasSubstr("steps=10"));
}

TEST(Observations, ValidateCatchesMalformedConventions) {
  auto err = [](const nlohmann::json& obs) {
    try {
      ValidateObservations(obs, "rank 3");
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kDataLoss);
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(err({{"comm_counts", {{"forward", {{"_allgather_base_", 3}}}}},
                 {"events", {{"unshard", "layers.0", "FORWARD"}}},
                 {"losses", {1.5, 2}},
                 {"tensors", {{"w", TensorJson({2}, "float32", {1, 2})}}},
                 {"extra", "anything"}}),
            "");
  EXPECT_THAT(err(nlohmann::json::array()),
              HasSubstr("rank 3: observations must be a JSON object"));
  EXPECT_THAT(err({{"comm_counts", {{"forward", {{"x", "3"}}}}}}),
              HasSubstr("comm_counts.forward.x"));
  EXPECT_THAT(err({{"events", nlohmann::json::array({nlohmann::json::array({"unshard", "l"})})}}),
              HasSubstr("events[0]"));
  EXPECT_THAT(err({{"losses", {"a"}}}), HasSubstr("losses[0]"));
  EXPECT_THAT(err({{"tensors", {{"w", {{"shape", {3}}, {"dtype", "float32"}, {"data", {1}}}}}}}),
              HasSubstr("has shape [3] but 1 data values"));
  EXPECT_THAT(err({{"tensors", {{"w", {{"shape", {4294967296LL, 4294967296LL}}, {"dtype", "float32"}, {"data", {1}}}}}}}),
              HasSubstr("but 1 data values"));
  EXPECT_THAT(err({{"tensors", {{"w", {{"shape", {1}}, {"dtype", "float33"}, {"data", {1}}}}}}}),
              HasSubstr("is not float32, float64, float16, bfloat16 or int64"));
}

TEST(Observations, AccessorsNameTheRankAndKey) {
  std::vector<nlohmann::json> per_rank = {
      {{"losses", {1.0, 0.5}},
       {"comm_counts",
        {{"forward", {{"_allgather_base_", 3}}}, {"backward", nlohmann::json::object()}}},
       {"tensors", {{"w", TensorJson({2, 1}, "float32", {1, 2})}}}},
      nlohmann::json::object()};
  EXPECT_EQ(Losses(per_rank, 0), (std::vector<double>{1.0, 0.5}));
  EXPECT_EQ(CommCount(per_rank, 0, "forward", "_allgather_base_"), 3);
  EXPECT_EQ(CommCount(per_rank, 0, "backward", "_reduce_scatter_base_"), 0);
  EXPECT_EQ(TensorData(per_rank, 0, "w"), (std::vector<double>{1, 2}));
  EXPECT_EQ(TensorShape(per_rank, 0, "w"), (std::vector<int64_t>{2, 1}));
  try {
    Losses(per_rank, 1);
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.message(), HasSubstr("rank 1 reported no 'losses' (keys: (none))"));
  }
  EXPECT_THROW(RankObservation(per_rank, 2, "x"), Error);
  EXPECT_THROW(TensorData(per_rank, 0, "v"), Error);
  EXPECT_EQ(ReportedObservations(per_rank[0]).size(), 2u);  // comm_counts, losses
  EXPECT_TRUE(ReportedObservations(per_rank[1]).is_null());
}

TEST(Observations, TensorToJsonRoundTrips) {
  const Tensor t = Tensor::from_doubles({1, 2, 3, 4, 5, 6}, {2, 3});
  const nlohmann::json j = TensorToJson(t);
  EXPECT_EQ(j["shape"], nlohmann::json::array({2, 3}));
  EXPECT_EQ(j["dtype"], "float32");
  EXPECT_EQ(j["data"].size(), 6u);
  EXPECT_NO_THROW(ValidateObservations({{"tensors", {{"t", j}}}}, "rank 0"));
  EXPECT_EQ(TensorToJson(Tensor::arange(3))["data"], nlohmann::json::array({0, 1, 2}));
}

}  // namespace
}  // namespace fsdp::conformance
