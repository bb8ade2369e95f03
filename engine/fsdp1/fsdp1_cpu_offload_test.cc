// CPUOffload(offload_params=True) and a flat parameter that gets no gradient in a backward
// (docs/fsdp1.md, "CPU offload"), for every sharding strategy: DoubleLinear with lin1 and lin2
// as nested instances trains one step on (out1 * out2).sum(), then one on out1.sum(), which
// leaves lin2 out of the backward. As PyTorch's prepare_gradient_for_optim (flat_param.grad =
// _cpu_grad whenever the CPU gradient buffer exists), lin2's `.grad` after the second backward
// is the CPU gradient buffer still holding the first backward's sharded gradient, and SGD steps
// lin2's local shard with it. Strategies that do not reshard after forward (SHARD_GRAD_OP,
// _HYBRID_SHARD_ZERO2) keep lin2's unsharded flat parameter of the second forward
// (_catch_all_reshard finds the flat parameter already on its local shard and frees nothing),
// so summon_full_params shows lin2 as that forward saw it, not the stepped shard; the others
// all-gather the stepped shard.
#include <gtest/gtest.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "engine/core/rng.h"
#include "engine/distributed/device_mesh.h"
#include "engine/fsdp1/fully_sharded_data_parallel.h"
#include "engine/fsdp1/unshard_params.h"
#include "engine/fsdp1/wrap_policy.h"
#include "engine/functional/functional.h"
#include "engine/nn/models.h"
#include "engine/optim/sgd.h"
#include "fakes/run_ranks.h"

namespace fsdp::fakes {
namespace {

using fsdp1::ShardingStrategy;

constexpr int64_t kDim = 6;
constexpr double kLr = 0.1;

// lin2's full parameters, flattened in registration order, read in summon_full_params.
std::vector<double> FullLin2(const nn::ModulePtr& fsdp_model) {
  fsdp1::SummonFullParams full(fsdp_model, {.writeback = false});
  std::vector<double> out;
  for (const auto& [name, p] : fsdp_model->named_parameters()) {
    if (name.rfind("lin2.", 0) != 0) continue;
    const std::vector<double> v = p.to_doubles();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

void ExpectNear(const std::vector<double>& expected, const std::vector<double>& actual,
                const std::string& what) {
  ASSERT_EQ(expected.size(), actual.size()) << what;
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_NEAR(expected[i], actual[i], 1e-6) << what << " element " << i;
  }
}

class Fsdp1CpuOffloadUnusedFlatParam : public ::testing::TestWithParam<ShardingStrategy> {};

TEST_P(Fsdp1CpuOffloadUnusedFlatParam, StepsTheStaleCpuGradient) {
  const ShardingStrategy strategy = GetParam();
  const bool hybrid = fsdp1::IsHybridStrategy(strategy);
  const int world = hybrid ? 4 : 2;
  auto results = RunRanks(world, [&](RankEnv& env) {
    auto model = std::make_shared<nn::DoubleLinear>(kDim, /*use_second_linear=*/true);
    std::set<const nn::Module*> nested = {model->get_submodule("lin1").get(),
                                          model->get_submodule("lin2").get()};
    fsdp1::FullyShardedDataParallelOptions options;
    options.sharding_strategy = strategy;
    options.cpu_offload.offload_params = true;
    options.sync_module_states = true;
    options.auto_wrap_policy = std::make_shared<fsdp1::LambdaAutoWrapPolicy>(
        [nested](const nn::Module& m) { return nested.count(&m) > 0; });
    if (hybrid) {
      options.device_mesh = distributed::DeviceMesh::Init(env.pg, "cpu", {2, world / 2},
                                                          {"replicate", "shard"});
    }
    auto fsdp_model = std::make_shared<fsdp1::FullyShardedDataParallel>(model, options);
    optim::SGD optimizer(fsdp_model->parameters(), optim::SGDOptions{.lr = kLr});
    Generator gen(100 + static_cast<uint64_t>(env.rank));
    const fsdp1::FlatParamHandle& lin2 =
        *fsdp1::AsFsdp(*fsdp_model->get_submodule("_fsdp_wrapped_module.lin2"))->handle;

    // Step 0: lin2 takes part in backward; its reduced shard lands in the CPU buffer.
    std::vector<Tensor> out = (*fsdp_model)(Tensor::randn({2, kDim}, DType::kFloat32, &gen)).tensors();
    sum(mul(out[0], out[1])).backward();
    ASSERT_TRUE(lin2.flat_param().grad().defined());
    EXPECT_EQ(lin2.flat_param().grad().storage(), lin2.cpu_grad.storage());
    const std::vector<double> grad0 = lin2.cpu_grad.to_doubles();
    optimizer.step();
    optimizer.zero_grad(/*set_to_none=*/true);
    const std::vector<double> full_after_step0 = FullLin2(fsdp_model);

    // Step 1: only out1 reaches the loss; lin2 runs forward but gets no gradient.
    out = (*fsdp_model)(Tensor::randn({2, kDim}, DType::kFloat32, &gen)).tensors();
    sum(out[0]).backward();
    const Tensor grad1 = lin2.flat_param().grad();
    ASSERT_TRUE(grad1.defined()) << "prepare_gradient_for_optim hands the CPU buffer over";
    EXPECT_EQ(grad1.storage(), lin2.cpu_grad.storage());
    ExpectNear(grad0, grad1.to_doubles(), "lin2's gradient after a backward it took no part in");
    const std::vector<double> shard_before = lin2.local_shard().to_doubles();
    optimizer.step();
    std::vector<double> stepped = shard_before;
    for (size_t i = 0; i < stepped.size(); ++i) stepped[i] -= kLr * grad0[i];
    ExpectNear(stepped, lin2.local_shard().to_doubles(), "lin2's local shard after SGD");

    // What summon_full_params shows: the kept unsharded copy of step 1's forward, or the
    // all-gathered stepped shard.
    const bool kept = lin2.uses_sharded_strategy() && !fsdp1::ReshardsAfterForward(strategy);
    if (lin2.uses_sharded_strategy()) EXPECT_EQ(lin2.needs_unshard(), !kept);
    const std::vector<double> full_after_step1 = FullLin2(fsdp_model);
    if (kept) {
      ExpectNear(full_after_step0, full_after_step1, "lin2 as the kept unsharded copy");
    } else {
      bool moved = false;
      for (size_t i = 0; i < full_after_step0.size(); ++i) {
        moved = moved || full_after_step0[i] != full_after_step1[i];
      }
      EXPECT_TRUE(moved) << "the stepped shard is all-gathered";
    }
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

INSTANTIATE_TEST_SUITE_P(
    EveryStrategy, Fsdp1CpuOffloadUnusedFlatParam,
    ::testing::Values(ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp,
                      ShardingStrategy::kNoShard, ShardingStrategy::kHybridShard,
                      ShardingStrategy::kHybridShardZero2),
    [](const ::testing::TestParamInfo<ShardingStrategy>& info) {
      std::string name = fsdp1::ShardingStrategyName(info.param);
      if (name[0] == '_') name = name.substr(1);
      return name;
    });

}  // namespace
}  // namespace fsdp::fakes
