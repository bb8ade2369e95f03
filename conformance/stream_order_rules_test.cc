// The stream-order judge (stream_order_rules.h) against traces the engine recorded through the
// fully_shard_overlap scenarios: the recorded traces pass; deleting one record that is waited
// for, or one wait that nothing else can stand in for, fails a rule; and each rule fails for
// some single deletion. (Other waits may be implied by a later one, e.g. the end-of-backward
// wait for the last reduce-scatter by the post-reduce wait before it; the judge accepts a
// deletion whose order still holds.)
#include "conformance/stream_order_rules.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "conformance/catalog.h"
#include "conformance/runner.h"

namespace fsdp::conformance {
namespace {

// Rank 0's trace of one case of `scenario` at `world` with `params` fixed.
nlohmann::json RecordedTrace(const std::string& scenario, int world,
                             std::map<std::string, std::string> params) {
  RunOptions options;
  options.patterns = {scenario};
  options.backend = kBackendThreaded;
  options.world = world;
  options.params = std::move(params);
  Runner runner(DefaultCatalog(), options);
  const std::vector<PlannedCase> plan = runner.Plan();
  EXPECT_EQ(plan.size(), 1u);
  const CaseResult result = runner.RunCase(plan.at(0));
  EXPECT_EQ(result.status, CaseStatus::kPassed);
  return result.observations.at(0).at("stream_trace");
}

bool Holds(const std::map<std::string, std::vector<std::string>>& verdict) {
  for (const auto& [rule, violations] : verdict) {
    if (!violations.empty()) return false;
  }
  return true;
}

// The rules that fail when entry `i` is deleted from `trace`.
std::set<std::string> FailingRulesWithout(const nlohmann::json& trace, size_t i,
                                          const StreamOrderFacts& facts) {
  nlohmann::json mutated = trace;
  mutated.erase(i);
  std::set<std::string> failing;
  for (const auto& [rule, violations] : JudgeStreamOrder(mutated, facts)) {
    if (!violations.empty()) failing.insert(rule);
  }
  return failing;
}

// Whether entry `i` records an event that a later entry waits for.
bool RecordIsWaited(const nlohmann::json& trace, size_t i) {
  for (size_t j = i + 1; j < trace.size(); ++j) {
    if (trace[j]["op"] == "wait_event" && trace[j]["event"] == trace[i]["event"]) return true;
  }
  return false;
}

// The waits that nothing else can stand in for: the copy-out's wait for its all-gather, the
// all-gather's for its copy-in, the reduce-scatter's for the gradients and the all-reduce's for
// the reduce-scatter.
bool IsSoleOrderingWait(const nlohmann::json& e) {
  if (e["op"] == "wait_stream") {
    const std::string stream = e["stream"], other = e["other"];
    return (stream == "all_gather" && other == "all_gather_copy_in") ||
           (stream == "reduce_scatter" && other == "current") ||
           (stream == "all_reduce" && other == "reduce_scatter");
  }
  return false;
}

// The recorded trace passes; deleting a record that is waited for, one of the sole-ordering
// waits, or a copy-out's wait for its all-gather fails a rule; and every rule in `live` fails
// for some single deletion (no rule is vacuous on real traces).
void ExpectDeletionsCaught(const nlohmann::json& trace, const StreamOrderFacts& facts,
                           const std::set<std::string>& live) {
  ASSERT_TRUE(Holds(JudgeStreamOrder(trace, facts)));
  std::set<std::string> triggered;
  int checked = 0;
  for (size_t i = 0; i < trace.size(); ++i) {
    const nlohmann::json& e = trace[i];
    const std::string op = e["op"];
    if (op != "record" && op != "wait_event" && op != "wait_stream") continue;
    const std::set<std::string> failing = FailingRulesWithout(trace, i, facts);
    triggered.insert(failing.begin(), failing.end());
    const bool copy_out_wait =
        op == "wait_event" && i + 1 < trace.size() && trace[i + 1]["op"] == "work" &&
        trace[i + 1]["what"] == "all_gather_copy_out";
    if ((op == "record" && RecordIsWaited(trace, i)) || IsSoleOrderingWait(e) || copy_out_wait) {
      ++checked;
      EXPECT_FALSE(failing.empty()) << "deleting #" << i << " " << e.dump() << " went unnoticed";
    }
  }
  EXPECT_GT(checked, 0);
  for (const std::string& rule : live) {
    EXPECT_EQ(triggered.count(rule), 1u) << rule << " fails for no single deletion";
  }
}

TEST(StreamOrderRules, DeletionsFromAnIntReshardAfterForwardTraceAreCaught) {
  const nlohmann::json trace =
      RecordedTrace("fully_shard_overlap/stream_order", 4,
                    {{"reshard_after_forward", "2"}, {"post_optim_event", "False"},
                     {"hsdp", "False"}});
  ExpectDeletionsCaught(
      trace, {{"layers.0", "layers.1"}},
      {"events_recorded_before_waited", "copy_in_after_optimizer_step",
       "copy_in_after_post_forward_reshard", "all_gather_after_copy_in",
       "copy_out_after_all_gather", "all_gather_buffer_released_after_copy_out",
       "reduce_scatter_after_copy_in", "reduce_scatter_input_released_after_reduce_scatter",
       "optimizer_after_reduction"});
}

TEST(StreamOrderRules, DeletionsFromAnHsdpTraceWithAPostOptimizerEventAreCaught) {
  const nlohmann::json trace =
      RecordedTrace("fully_shard_overlap/stream_order", 4,
                    {{"reshard_after_forward", "True"}, {"post_optim_event", "True"},
                     {"hsdp", "True"}});
  ExpectDeletionsCaught(trace, {},
                        {"copy_in_after_optimizer_step", "all_reduce_after_reduce_scatter",
                         "optimizer_after_reduction"});
}

TEST(StreamOrderRules, DeletionsFromAMistargetedPrefetchTraceAreCaught) {
  const nlohmann::json trace = RecordedTrace("fully_shard_overlap/stream_order_unused_in_backward",
                                             2, {{"reshard_after_forward", "True"}});
  ExpectDeletionsCaught(trace, {}, {"all_gather_waited_before_release"});
}

TEST(StreamOrderRules, AWaitBeforeItsRecordAndAnUnbalancedGuardAreReported) {
  const nlohmann::json trace = {
      {{"op", "wait_event"}, {"stream", "current"}, {"event", 1}},
      {{"op", "enter_stream"}, {"stream", "all_gather"}}};
  const auto verdict = JudgeStreamOrder(trace, {});
  EXPECT_EQ(verdict.at("events_recorded_before_waited").size(), 1u);
  EXPECT_EQ(verdict.at("stream_guards_balanced").size(), 1u);
}

}  // namespace
}  // namespace fsdp::conformance
