#include "conformance/scenario_registry.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engine/core/error.h"

namespace fsdp::conformance {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

Scenario Make(const std::string& name) {
  Scenario s;
  s.info.name = name;
  s.info.description = "d";
  s.info.seed_test = "t.py::C::test";
  s.run_rank = [](RankEnv&) { return nlohmann::json::object(); };
  s.judge = [](const CaseParams&, int, const std::vector<nlohmann::json>&, CheckList& c) {
    c.CheckTrue("ok", true);
  };
  return s;
}

std::string ErrorOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(GlobMatch, StarAndQuestionMark) {
  EXPECT_TRUE(GlobMatch("*", "fully_shard_comm/all_gather_fp32"));
  EXPECT_TRUE(GlobMatch("fully_shard_comm/*", "fully_shard_comm/all_gather_fp32"));
  EXPECT_FALSE(GlobMatch("fully_shard_comm/*", "fully_shard_autograd/unused_forward_output"));
  EXPECT_TRUE(GlobMatch("*/reduce_scatter_fp??", "fully_shard_comm/reduce_scatter_fp16"));
  EXPECT_FALSE(GlobMatch("*/reduce_scatter_fp?", "fully_shard_comm/reduce_scatter_fp16"));
  EXPECT_TRUE(GlobMatch("*comm*count*", "fully_shard_comm/communication_count"));
  EXPECT_TRUE(GlobMatch("a/b", "a/b"));
  EXPECT_FALSE(GlobMatch("a/b", "a/bc"));
  EXPECT_FALSE(GlobMatch("a/b*", "a/"));
  EXPECT_TRUE(GlobMatch("a/**", "a/"));
  EXPECT_TRUE(GlobMatch("", ""));
  EXPECT_FALSE(GlobMatch("", "x"));
}

TEST(ScenarioRegistry, MatchSortsAndDeduplicates) {
  ScenarioRegistry r;
  r.Add(Make("fam_b/one"));
  r.Add(Make("fam_a/two"));
  r.Add(Make("fam_a/one"));
  std::vector<std::string> names;
  for (const Scenario* s : r.Match({"fam_a/*", "*/one"})) names.push_back(s->info.name);
  EXPECT_THAT(names, ElementsAre("fam_a/one", "fam_a/two", "fam_b/one"));
  EXPECT_EQ(r.Get("fam_a/two").info.family(), "fam_a");
  EXPECT_EQ(r.Get("fam_a/two").info.case_name(), "two");
  EXPECT_EQ(r.Find("fam_c/x"), nullptr);
}

TEST(ScenarioRegistry, UnknownPatternListsTheScenarios) {
  ScenarioRegistry r;
  r.Add(Make("fam/one"));
  r.Add(Make("fam/two"));
  const std::string err = ErrorOf([&] { r.Match({"fam/one", "nope/*"}); });
  EXPECT_THAT(err, HasSubstr("no scenario matches 'nope/*'"));
  EXPECT_THAT(err, HasSubstr("fam/one, fam/two"));
  EXPECT_THAT(ErrorOf([&] { r.Get("fam/three"); }), HasSubstr("unknown scenario 'fam/three'"));
}

TEST(ScenarioRegistry, FamiliesMayNest) {
  ScenarioRegistry r;
  r.Add(Make("nested/fam/three"));
  EXPECT_EQ(r.Get("nested/fam/three").info.family(), "nested/fam");
  EXPECT_EQ(r.Get("nested/fam/three").info.case_name(), "three");
}

TEST(ScenarioRegistry, RejectsBadScenarios) {
  ScenarioRegistry r;
  r.Add(Make("fam/one"));
  EXPECT_THAT(ErrorOf([&] { r.Add(Make("fam/one")); }), HasSubstr("registered twice"));
  EXPECT_THAT(ErrorOf([&] { r.Add(Make("noslash")); }), HasSubstr("'family/case'"));
  EXPECT_THAT(ErrorOf([&] { r.Add(Make("Fam/Upper")); }), HasSubstr("lowercase"));
  EXPECT_THAT(ErrorOf([&] { r.Add(Make("a//c")); }), HasSubstr("'family/case'"));
  EXPECT_THAT(ErrorOf([&] { r.Add(Make("fam/")); }), HasSubstr("'family/case'"));
  Scenario worlds = Make("fam/worlds");
  worlds.info.min_world = 4;
  worlds.info.default_world = 2;
  EXPECT_THAT(ErrorOf([&] { r.Add(worlds); }), HasSubstr("min_world (4) <= default_world (2)"));
  Scenario no_judge = Make("fam/no_judge");
  no_judge.judge = nullptr;
  EXPECT_THAT(ErrorOf([&] { r.Add(no_judge); }), HasSubstr("judge is not set"));
  Scenario no_seed = Make("fam/no_seed");
  no_seed.info.seed_test.clear();
  EXPECT_THAT(ErrorOf([&] { r.Add(no_seed); }), HasSubstr("seed_test is empty"));
  EXPECT_EQ(r.size(), 1u);
}

TEST(RegisterAllScenarios, ProducesAValidRegistry) {
  ScenarioRegistry r;
  RegisterAllScenarios(r);  // every family validates on Add
  for (const Scenario* s : r.All()) EXPECT_NO_THROW(ValidateScenario(*s)) << s->info.name;
}

}  // namespace
}  // namespace fsdp::conformance
