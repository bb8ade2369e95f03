// ObservationSchema: strict validation (undeclared, missing, mistyped keys; tensor names by
// pattern) and the JSON Schema it prints.
#include "conformance/observation_schema.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "engine/core/error.h"

namespace fsdp::conformance {
namespace {

using ::testing::HasSubstr;

ObservationSchema Example() {
  ObservationSchema schema;
  schema.Add(ObservationKey::CommCounts("collectives per phase"))
      .Add(ObservationKey::Events("forward_events", "events in forward"))
      .Add(ObservationKey::Integer("n", "a count"))
      .Add(ObservationKey::StringList("names", "names").Optional())
      .AddTensors({"step{k}/{fqn}", "float32", "the shard", "parameters"});
  return schema;
}

nlohmann::json Tensor1() { return {{"shape", {1}}, {"dtype", "float32"}, {"data", {1.5}}}; }

nlohmann::json Good() {
  return {{"comm_counts", {{"forward", {{"c10d._allgather_base_", 2}}}}},
          {"forward_events", {{"unshard", "layers.0", "FORWARD"}}},
          {"n", 3},
          {"tensors", {{"step0/layers.0.weight", Tensor1()}}}};
}

std::string ErrorOf(const nlohmann::json& obs) {
  try {
    Example().Validate(obs, "rank 1");
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kDataLoss);
    return e.message();
  }
  return "";
}

TEST(ObservationSchema, AcceptsConformingObservations) {
  EXPECT_EQ(ErrorOf(Good()), "");
  nlohmann::json with_optional = Good();
  with_optional["names"] = {"a", "b"};
  EXPECT_EQ(ErrorOf(with_optional), "");
}

TEST(ObservationSchema, RejectsUndeclaredMissingAndMistypedKeys) {
  nlohmann::json extra = Good();
  extra["mismatched_params"] = 0;
  EXPECT_THAT(ErrorOf(extra), HasSubstr("rank 1: undeclared key 'mismatched_params'"));
  nlohmann::json missing = Good();
  missing.erase("n");
  EXPECT_THAT(ErrorOf(missing), HasSubstr("missing required key 'n' (a count)"));
  nlohmann::json mistyped = Good();
  mistyped["n"] = "3";
  EXPECT_THAT(ErrorOf(mistyped), HasSubstr("rank 1.n: expected integer, got string"));
  nlohmann::json bad_event = Good();
  bad_event["forward_events"] =
      nlohmann::json::array({nlohmann::json::array({"unshard", "layers.0"})});
  EXPECT_THAT(ErrorOf(bad_event), HasSubstr("rank 1.forward_events[0]: has 2 items, fewer than 3"));
  nlohmann::json negative = Good();
  negative["comm_counts"]["forward"]["c10d._allgather_base_"] = -1;
  EXPECT_THAT(ErrorOf(negative), HasSubstr("below the minimum"));
}

// A NaN (or infinite) number is refused in process as it is after a JSON file turned it into
// null: the same malformed observation on every backend, not a failed comparison on one.
TEST(ObservationSchema, NonFiniteNumbersAreRefusedLikeTheNullJsonMakesOfThem) {
  nlohmann::json nan_tensor = Good();
  nan_tensor["tensors"]["step0/layers.0.weight"]["data"][0] = std::nan("");
  EXPECT_THAT(ErrorOf(nan_tensor), HasSubstr("expected number, got a non-finite number"));
  nlohmann::json null_tensor = Good();
  null_tensor["tensors"]["step0/layers.0.weight"]["data"][0] = nullptr;
  EXPECT_THAT(ErrorOf(null_tensor), HasSubstr("expected number, got null"));
  nlohmann::json infinite = Good();
  infinite["tensors"]["step0/layers.0.weight"]["data"][0] = HUGE_VAL;
  EXPECT_THAT(ErrorOf(infinite), HasSubstr("non-finite"));
}

TEST(ObservationSchema, TensorNamesFollowTheDeclaredPatterns) {
  nlohmann::json stray = Good();
  stray["tensors"]["grad0/layers.0.weight"] = Tensor1();
  EXPECT_THAT(ErrorOf(stray), HasSubstr("rank 1.tensors: undeclared key 'grad0/layers.0.weight'"));
  nlohmann::json none = Good();
  none["tensors"] = nlohmann::json::object();
  EXPECT_THAT(ErrorOf(none), HasSubstr("no tensor named like 'step{k}/{fqn}'"));
  nlohmann::json bad_dtype = Good();
  bad_dtype["tensors"]["step0/layers.0.weight"]["dtype"] = "float8";
  EXPECT_THAT(ErrorOf(bad_dtype), HasSubstr("is not one of"));
  EXPECT_EQ(TensorObservation({"step{k}/{fqn}", "", "", ""}).Regex(),
            "^step[0-9]+/[A-Za-z0-9_.]+$");
  EXPECT_EQ(TensorObservation({"output{k}", "", "", ""}).Regex(), "^output[0-9]+$");
}

TEST(ObservationSchema, PrintsAClosedJsonSchema) {
  const nlohmann::json s = Example().ToJsonSchema();
  EXPECT_EQ(s["$schema"], "https://json-schema.org/draft/2020-12/schema");
  EXPECT_EQ(s["additionalProperties"], false);
  EXPECT_EQ(s["required"], nlohmann::json({"comm_counts", "forward_events", "n", "tensors"}));
  EXPECT_EQ(s["properties"]["n"]["description"], "a count");
  EXPECT_TRUE(s["properties"]["tensors"]["patternProperties"].contains("^step[0-9]+/[A-Za-z0-9_.]+$"));
  EXPECT_THROW(ObservationSchema().Add(ObservationKey::Integer("x", "")).Add(ObservationKey::Integer("x", "")),
               Error);
}

}  // namespace
}  // namespace fsdp::conformance
