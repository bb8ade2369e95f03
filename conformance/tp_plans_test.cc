// The zoo's tensor-parallel plans (conformance/tp_plans.h): every Linear of the MLPStack and of
// the Transformer's blocks is planned colwise or rowwise, each planned parameter gets its
// style's placement, MLPStack's sequence-parallel plan adds SequenceParallel on its LayerNorm,
// the nested (tp, then dp) shards of a tensor partition it, and a TP size
// that does not divide the Transformer's heads fails naming the attention module.
#include "conformance/tp_plans.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <numeric>
#include <set>

#include "conformance/model_zoo.h"
#include "engine/core/error.h"
#include "fakes/run_ranks.h"

namespace fsdp::conformance {
namespace {

using ::testing::HasSubstr;
using tensor_parallel::Placement;

CaseParams Defaults(const std::string& kind) {
  CaseParams p;
  for (const ParamSpec& spec : ZooModel::Kind(kind).params) p.set(spec.name, spec.default_value());
  return p;
}

// A planned module's weight is Shard(0) under ColwiseParallel and Shard(1) under
// RowwiseParallel, its bias Shard(0) / Replicate(); every planned module's input needs a
// gradient except the MLPStack's first (it reads the model's input).
TEST(ZooTpPlans, EveryLinearIsPlannedWithItsStylePlacement) {
  for (const std::string kind : {"mlp_stack", "transformer"}) {
    SCOPED_TRACE(kind);
    const ZooModel model = ZooModel::Make(kind, Defaults(kind));
    const std::vector<std::string> names = model.ParameterNames();
    const auto plan = ZooTpPlan(kind, names);
    const auto placements = ZooTpPlacements(kind, names);
    ASSERT_FALSE(plan.empty());
    for (const auto& [fqn, style] : plan) {
      const bool colwise = style->str().rfind("ColwiseParallel", 0) == 0;
      ASSERT_TRUE(placements.count(fqn + ".weight")) << fqn;
      EXPECT_EQ(placements.at(fqn + ".weight"), Placement::Shard(colwise ? 0 : 1)) << fqn;
      if (placements.count(fqn + ".bias")) {
        EXPECT_EQ(placements.at(fqn + ".bias"),
                  colwise ? Placement::Shard(0) : Placement::Replicate())
            << fqn;
      }
    }
    const auto with_grad = PlannedModulesWithInputGrad(names, plan);
    EXPECT_EQ(with_grad.size(), plan.size() - (kind == "mlp_stack" ? 1 : 0));
  }
}

// MLPStack.parallelize(with_seq_parallel=True): the last out_proj reduce-scatters its output
// onto the sequence dim (RowwiseParallel(output_layouts=Shard(1))), the LayerNorm "3" is
// SequenceParallel(sequence_dim=1) with its weight Replicate(), and the output is
// sequence-sharded; every other Linear is planned as in mlp_stack.
TEST(ZooTpPlans, MlpStackSeqParallelPlansTheNormAndTheLastRowwiseOutput) {
  const std::string kind = "mlp_stack_seq_parallel";
  const std::vector<std::string> names = ZooModel::Make(kind, Defaults(kind)).ParameterNames();
  const auto plan = ZooTpPlan(kind, names);
  std::map<std::string, std::string> styles;
  for (const auto& [fqn, style] : plan) styles[fqn] = style->str();
  std::map<std::string, std::string> plain;
  for (const auto& [fqn, style] : ZooTpPlan("mlp_stack", names)) plain[fqn] = style->str();
  ASSERT_EQ(styles.size(), plain.size() + 1);
  for (const auto& [fqn, str] : plain) {
    if (fqn != "2.out_proj") EXPECT_EQ(styles.at(fqn), str) << fqn;
  }
  EXPECT_THAT(styles.at("2.out_proj"), HasSubstr("output_layouts=Shard(dim=1)"));
  EXPECT_EQ(styles.at("3"), "SequenceParallel(sequence_dim=1, use_local_output=False)");
  EXPECT_EQ(ZooTpPlacements(kind, names).at("3.weight"), Placement::Replicate());
  EXPECT_TRUE(ZooTpOutputIsSequenceSharded(kind));
  EXPECT_FALSE(ZooTpOutputIsSequenceSharded("mlp_stack"));
}

// The (dp, tp) shards of a tensor hold every element exactly once, for every placement.
TEST(ZooTpPlans, NestedShardsPartitionTheTensor) {
  reference::RefTensor full({5, 7});
  std::iota(full.data.begin(), full.data.end(), 0.0);
  for (const std::optional<Placement>& placement :
       {std::optional<Placement>(), std::optional<Placement>(Placement::Replicate()),
        std::optional<Placement>(Placement::Shard(0)),
        std::optional<Placement>(Placement::Shard(1))}) {
    for (const auto& [dp, tp] : std::vector<std::pair<int, int>>{{2, 2}, {3, 2}, {2, 4}}) {
      const int copies = placement && placement->is_shard() ? 1 : tp;
      std::multiset<double> seen;
      for (int i = 0; i < dp; ++i) {
        for (int j = 0; j < tp; ++j) {
          const reference::RefTensor shard = NestedShardOf(full, placement, i, dp, j, tp);
          seen.insert(shard.data.begin(), shard.data.end());
        }
      }
      ASSERT_EQ(seen.size(), full.data.size() * copies)
          << (placement ? placement->str() : "none") << " dp " << dp << " tp " << tp;
      for (double v : full.data) EXPECT_EQ(seen.count(v), static_cast<size_t>(copies));
    }
  }
}

TEST(ZooTpPlans, TpSizeThatDoesNotDivideTheHeadsFails) {
  auto results = fakes::RunRanks(3, [](fakes::RankEnv& env) {
    const ZooModel model = ZooModel::Make("transformer", Defaults("transformer"));
    nn::ModulePtr module = model.BuildEngine();
    auto mesh = distributed::DeviceMesh::Init(env.pg, "cpu", {3}, {"tp"});
    try {
      ParallelizeZooModel("transformer", *module, mesh);
      ADD_FAILURE() << "tp 3 with 4 heads did not fail";
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("layers.0.attention"));
      EXPECT_THAT(e.what(), HasSubstr("TP size 3 does not divide n_heads 4"));
    }
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

}  // namespace
}  // namespace fsdp::conformance
