// DTensor API on the threaded fake: from_local shape inference, distribute_tensor's
// src_data_rank, Replicate -> Partial, to_local(grad_placements) and the placements a
// gradient keeps on its way back (PyTorch's Redistribute backward normalization).
#include "engine/tensor_parallel/dtensor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "engine/core/rng.h"
#include "engine/distributed/comm_debug_mode.h"
#include "engine/distributed/device_mesh.h"
#include "engine/functional/functional.h"
#include "engine/ops/elementwise.h"
#include "fakes/run_ranks.h"

namespace fsdp::tensor_parallel {
namespace {

using distributed::CommDebugMode;
using distributed::DeviceMesh;
using Counts = CommDebugMode::Counts;

constexpr const char* kAllReduce = "c10d_functional.all_reduce";
constexpr const char* kBroadcast = "c10d_functional.broadcast";

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

TEST(DTensorTest, FromLocalInfersEvenShardedShape) {
  auto results = fakes::RunRanks(3, [](fakes::RankEnv& env) {
    auto mesh = DeviceMesh::Init(env.pg, "cpu", {3});
    const DTensor dt = DTensor::from_local(Tensor::zeros({2, 5}), mesh, {Placement::Shard(-1)});
    EXPECT_EQ(dt.shape(), (Shape{2, 5 * 3}));
    EXPECT_EQ(dt.placements(), Placements{Placement::Shard(1)});  // normalized
    const DTensor replicated =
        DTensor::from_local(Tensor::zeros({2, 5}), mesh, {Placement::Replicate()});
    EXPECT_EQ(replicated.shape(), (Shape{2, 5}));
    return 0;
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

// With src_data_rank 0 every rank gets rank 0's values (one broadcast per mesh dim); without
// it each rank chunks its own tensor and nothing is communicated.
TEST(DTensorTest, DistributeTensorSrcDataRank) {
  auto results = fakes::RunRanks(4, [](fakes::RankEnv& env) {
    auto mesh = DeviceMesh::Init(env.pg, "cpu", {2, 2});
    const Tensor mine = Random({5, 3}, 50 + static_cast<uint64_t>(env.rank));
    const Tensor rank0 = Random({5, 3}, 50);
    const Placements placements = {Placement::Shard(0), Placement::Replicate()};
    CommDebugMode comm_mode;
    const DTensor from_rank0 = distribute_tensor(mine, mesh, placements);
    comm_mode.exit();
    EXPECT_EQ(comm_mode.get_comm_counts(), (Counts{{kBroadcast, mesh->ndim()}}));
    ExpectClose(from_rank0.full_tensor(), rank0, "src_data_rank=0");
    comm_mode.enter();
    const DTensor own =
        distribute_tensor(mine.clone().set_requires_grad(true), mesh, placements, std::nullopt);
    comm_mode.exit();
    EXPECT_EQ(comm_mode.get_total_counts(), 0);
    EXPECT_TRUE(own.local_tensor().is_leaf());
    EXPECT_TRUE(own.requires_grad());
    const ChunkRange rows = ComputeChunkRange(5, 2, mesh->get_local_rank(0));
    ExpectClose(own.local_tensor(), mine.narrow(0, rows.offset, rows.length), "src_data_rank=None");
    return 0;
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

// Replicate -> Partial(sum) divides by the mesh size (Partial._partition_value) and
// Partial(avg) keeps the value; reducing back gives the original.
TEST(DTensorTest, ReplicateToPartialPartitionsTheValue) {
  auto results = fakes::RunRanks(3, [](fakes::RankEnv& env) {
    auto mesh = DeviceMesh::Init(env.pg, "cpu", {3});
    const Tensor value = Random({4, 2}, 9);
    const DTensor replicated = DTensor::from_local(value, mesh, {Placement::Replicate()});
    const DTensor sum = replicated.redistribute({Placement::Partial()});
    ExpectClose(sum.to_local(), ops::kernels::DivScalar(value, 3.0), "Partial(sum) local");
    ExpectClose(sum.full_tensor(), value, "Partial(sum) full_tensor");
    const DTensor avg = replicated.redistribute({Placement::Partial(distributed::ReduceOp::kAvg)});
    ExpectClose(avg.to_local(), value, "Partial(avg) local");
    ExpectClose(avg.full_tensor(), value, "Partial(avg) full_tensor");
    return 0;
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

// A Replicate tensor whose local gradient is declared Partial (the colwise input pattern) gets
// the sum of every rank's local gradient (one all_reduce); a Partial gradient of a Partial
// source stays Partial (no collective), as PyTorch's Redistribute backward keeps it.
TEST(DTensorTest, GradPlacementsDecideTheBackwardCollective) {
  auto results = fakes::RunRanks(3, [](fakes::RankEnv& env) {
    auto mesh = DeviceMesh::Init(env.pg, "cpu", {3});
    auto rank_grad = [](int rank) { return Random({4, 2}, 70 + static_cast<uint64_t>(rank)); };
    Tensor summed = rank_grad(0);
    for (int r = 1; r < 3; ++r) summed = ops::kernels::Add(summed, rank_grad(r));

    Tensor leaf = Random({4, 2}, 1).set_requires_grad(true);
    Tensor local = DTensor::from_local(leaf, mesh, {Placement::Replicate()})
                       .to_local(Placements{Placement::Partial()});
    CommDebugMode comm_mode;
    sum(mul(local, rank_grad(env.rank))).backward();
    comm_mode.exit();
    EXPECT_EQ(comm_mode.get_comm_counts(), (Counts{{kAllReduce, 1}}));
    ExpectClose(leaf.grad(), summed, "Replicate input, Partial gradient");

    Tensor partial_leaf = Random({4, 2}, 2).set_requires_grad(true);
    Tensor out = DTensor::from_local(partial_leaf, mesh, {Placement::Partial()})
                     .redistribute({Placement::Replicate()})
                     .to_local(Placements{Placement::Partial()});
    comm_mode.enter();
    sum(mul(out, rank_grad(env.rank))).backward();
    comm_mode.exit();
    EXPECT_EQ(comm_mode.get_total_counts(), 0);
    ExpectClose(partial_leaf.grad(), rank_grad(env.rank), "Partial source, Partial gradient");
    return 0;
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

// One DTensor consumed twice with gradients of different placements is refused in backward.
TEST(DTensorTest, ConflictingGradientPlacementsAreRefused) {
  auto results = fakes::RunRanks(2, [](fakes::RankEnv& env) {
    auto mesh = DeviceMesh::Init(env.pg, "cpu", {2});
    Tensor leaf = Random({2, 2}, 3).set_requires_grad(true);
    const DTensor dt = DTensor::from_local(leaf, mesh, {Placement::Replicate()});
    Tensor a = dt.to_local(Placements{Placement::Partial()});
    Tensor b = dt.to_local();
    std::string error;
    try {
      sum(add(a, b)).backward();
    } catch (const Error& e) {
      error = e.what();
    }
    EXPECT_NE(error.find("different placements"), std::string::npos) << error;
    return 0;
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

}  // namespace
}  // namespace fsdp::tensor_parallel
