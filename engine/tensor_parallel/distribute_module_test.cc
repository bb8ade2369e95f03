// distribute_module on the threaded fake: RMSNormPython replicated over a TP mesh (worlds 2
// and 3, and a 2x2 mesh's "tp" submesh) with the seed-003 input_fn (each rank's rows are a
// Shard(0) piece of the batch) gives the unsharded module's output rows, and its weight's
// gradient, Partial by the placement rule, is all-reduced into the full-batch gradient with
// one c10d_functional.all_reduce in backward; a Replicate() input needs none. Inputs the rule
// does not cover fail with errors naming the module and the placements. The default partition
// replicates every parameter and buffer (rank 0's values everywhere).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "engine/autograd/grad_mode.h"
#include "engine/core/rng.h"
#include "engine/distributed/comm_debug_mode.h"
#include "engine/distributed/device_mesh.h"
#include "engine/functional/functional.h"
#include "engine/nn/models.h"
#include "engine/ops/shape_ops.h"
#include "engine/tensor_parallel/distribute_module.h"
#include "engine/tensor_parallel/dtensor_parameter.h"
#include "engine/tensor_parallel/parallelize_module.h"
#include "fakes/run_ranks.h"

namespace fsdp::tensor_parallel {
namespace {

using distributed::CommDebugMode;
using distributed::DeviceMesh;
using Counts = CommDebugMode::Counts;

Tensor Random(const Shape& shape, uint64_t seed) {
  Generator generator(seed);
  return Tensor::randn(shape, DType::kFloat32, &generator);
}

void ExpectClose(const Tensor& actual, const Tensor& expected, const std::string& what) {
  ASSERT_TRUE(actual.defined()) << what;
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  const std::vector<double> a = actual.to_doubles();
  const std::vector<double> e = expected.to_doubles();
  for (size_t k = 0; k < a.size(); ++k) {
    ASSERT_NEAR(a[k], e[k], 1e-5 * (1.0 + std::abs(e[k]))) << what << " element " << k;
  }
}

// The seed's distribute_rmsnorm: input Shard(0), output to_local().
void DistributeRmsNorm(nn::Module& module, const std::shared_ptr<DeviceMesh>& mesh,
                       const Placement& input_placement) {
  distribute_module(
      module, mesh, nullptr,
      [input_placement](nn::Module&, const nn::Value& inputs, const std::shared_ptr<DeviceMesh>& m) {
        return DTensor::from_local(inputs.is_tensor() ? inputs.tensor() : inputs[0].tensor(), m,
                                   {input_placement});
      },
      [](nn::Module&, const DTensor& output, const std::shared_ptr<DeviceMesh>&) {
        return nn::Value(output.to_local());
      });
}

void CheckRmsNorm(int world, const std::vector<int64_t>& mesh_shape, bool sharded_rows) {
  auto results = fakes::RunRanks(world, [&](fakes::RankEnv& env) {
    const std::vector<std::string> names =
        mesh_shape.size() == 2 ? std::vector<std::string>{"dp", "tp"} : std::vector<std::string>{"tp"};
    auto mesh = DeviceMesh::Init(env.pg, "cpu", mesh_shape, names);
    auto tp_mesh = (*mesh)["tp"];
    const int64_t tp = tp_mesh->size(0);
    const int64_t index = tp_mesh->get_local_rank(0);
    const int64_t rows = 2;
    const uint64_t group = mesh_shape.size() == 2 ? mesh->get_local_rank(0) : 0;
    const Tensor batch = Random({sharded_rows ? rows * tp : rows, 10}, 7 + group);
    const Tensor upstream = Random({batch.size(0), 10}, 17 + group);

    auto reference = std::make_shared<nn::RMSNormPython>(10);
    auto model = std::make_shared<nn::RMSNormPython>(10);
    {  // a non-trivial weight, the same on every rank
      autograd::NoGradGuard no_grad;
      const Tensor w = Random({10}, 3);
      reference->parameter("weight").copy_(w);
      model->parameter("weight").copy_(w);
    }
    DistributeRmsNorm(*model, tp_mesh, sharded_rows ? Placement::Shard(0) : Placement::Replicate());
    const auto weight = GetDTensorParameter(*model, "weight");
    EXPECT_TRUE(weight.has_value());
    EXPECT_EQ(weight->placements(), Placements{Placement::Replicate()});

    Tensor ref_y = (*reference)(batch).tensor();
    sum(mul(ref_y, upstream)).backward();

    auto mine = [&](const Tensor& full) {
      return sharded_rows ? ops::kernels::Narrow(full, 0, index * rows, rows) : full;
    };
    CommDebugMode comm_mode;
    Tensor y = (*model)(mine(batch)).tensor();
    comm_mode.exit();
    EXPECT_EQ(comm_mode.get_total_counts(), 0);
    ExpectClose(y, mine(ref_y.detach()), "output");
    EXPECT_TRUE(model->parameter("weight").is_same(weight->local_tensor()))
        << "the slot gets its leaf back after the call";

    comm_mode.enter();
    sum(mul(y, mine(upstream))).backward();
    comm_mode.exit();
    const Counts backward =
        sharded_rows ? Counts{{"c10d_functional.all_reduce", 1}} : Counts{};
    EXPECT_EQ(comm_mode.get_comm_counts(), backward);
    ExpectClose(model->parameter("weight").grad(), reference->parameter("weight").grad(),
                "weight gradient");
    return 0;
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

TEST(DistributeModuleTest, ShardedRowsGiveAllReducedReplicateGradient) {
  for (int world : {2, 3}) CheckRmsNorm(world, {world}, true);
  CheckRmsNorm(4, {2, 2}, true);
}

// Without a partition_fn every parameter and buffer becomes Replicate(): rank 0's values on
// every rank (distribute_tensor's broadcast), parameters recorded as DTensors.
TEST(DistributeModuleTest, DefaultPartitionReplicatesParametersAndBuffers) {
  auto results = fakes::RunRanks(3, [](fakes::RankEnv& env) {
    auto mesh = DeviceMesh::Init(env.pg, "cpu", {3});
    auto model = std::make_shared<nn::RMSNormPython>(4);
    {
      autograd::NoGradGuard no_grad;
      model->parameter("weight").copy_(Random({4}, 40 + env.rank));
    }
    model->register_buffer("running", Random({2, 4}, 50 + env.rank));
    distribute_module(*model, mesh);
    const auto weight = GetDTensorParameter(*model, "weight");
    EXPECT_TRUE(weight.has_value());
    if (!weight) return 0;
    EXPECT_EQ(weight->placements(), Placements{Placement::Replicate()});
    EXPECT_TRUE(model->parameter("weight").is_same(weight->local_tensor()));
    EXPECT_EQ(model->parameter("weight").to_doubles(), Random({4}, 40).to_doubles());
    EXPECT_EQ(model->buffer("running").to_doubles(), Random({2, 4}, 50).to_doubles());
    return 0;
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

TEST(DistributeModuleTest, ReplicatedInputNeedsNoCollective) { CheckRmsNorm(2, {2}, false); }

TEST(DistributeModuleTest, GradPlacementsFollowTheInputsBatchDims) {
  EXPECT_EQ(ReplicatedParamGradPlacements({Placement::Shard(0)}, 2, "m"),
            Placements{Placement::Partial()});
  EXPECT_EQ(ReplicatedParamGradPlacements({Placement::Shard(1)}, 3, "m"),
            Placements{Placement::Partial()});
  EXPECT_EQ(ReplicatedParamGradPlacements({Placement::Replicate(), Placement::Shard(0)}, 2, "m"),
            (Placements{Placement::Replicate(), Placement::Partial()}));
}

TEST(DistributeModuleTest, UncoveredInputsAndShardedParametersFail) {
  auto results = fakes::RunRanks(2, [](fakes::RankEnv& env) {
    auto mesh = DeviceMesh::Init(env.pg, "cpu", {2});
    try {
      auto model = std::make_shared<nn::RMSNormPython>(10);
      DistributeRmsNorm(*model, mesh, Placement::Shard(-1));
      (*model)(Random({2, 5}, 1));
      ADD_FAILURE() << "a Shard on the feature dim must fail";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("Shard on the last (feature) dim"), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("RMSNormPython"), std::string::npos) << e.what();
    }
    try {
      auto mlp = std::make_shared<nn::MLPModule>();
      parallelize_module(*mlp, mesh, {{"net1", std::make_shared<ColwiseParallel>()}});
      distribute_module(*mlp->get_submodule("net1"), mesh);
      ADD_FAILURE() << "a sharded parameter must fail";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("Replicate() parameters only"), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("Shard(dim=0)"), std::string::npos) << e.what();
    }
    return 0;
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

}  // namespace
}  // namespace fsdp::tensor_parallel
