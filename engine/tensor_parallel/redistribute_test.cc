// DTensor redistributions on the threaded fake at worlds 2, 3 (uneven shards) and 4 (a 2x2
// mesh): forward values and backward gradients of every transition against a single-process
// computation on the global tensor, and the functional collectives CommDebugMode counts.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "engine/core/rng.h"
#include "engine/distributed/comm_debug_mode.h"
#include "engine/distributed/device_mesh.h"
#include "engine/functional/functional.h"
#include "engine/ops/elementwise.h"
#include "engine/ops/shape_ops.h"
#include "engine/tensor_parallel/dtensor.h"
#include "fakes/run_ranks.h"

namespace fsdp::tensor_parallel {
namespace {

using distributed::CommDebugMode;
using distributed::DeviceMesh;

constexpr const char* kAllGather = "c10d_functional.all_gather_into_tensor";
constexpr const char* kReduceScatter = "c10d_functional.reduce_scatter_tensor";
constexpr const char* kAllReduce = "c10d_functional.all_reduce";

Tensor Random(const Shape& shape, uint64_t seed) {
  Generator generator(seed);
  return Tensor::randn(shape, DType::kFloat32, &generator);
}

// The single-process piece of `full` this rank holds under `placements` (Partial pieces are
// the whole tensor): torch.chunk along each sharded dim by this rank's mesh index.
Tensor ExpectedLocal(const Tensor& full, const DeviceMesh& mesh, const Placements& placements) {
  Tensor out = full;
  for (int i = 0; i < mesh.ndim(); ++i) {
    const Placement& p = placements[static_cast<size_t>(i)];
    if (!p.is_shard()) continue;
    const ChunkRange range =
        ComputeChunkRange(full.size(p.dim()), mesh.size(i), mesh.get_local_rank(i));
    out = ops::kernels::Narrow(out, p.dim(), range.offset, range.length);
  }
  return out;
}

// The collectives one mesh dim's transition issues (the table in redistribute.h).
std::map<std::string, int64_t> ExpectedCounts(const Placements& from, const Placements& to) {
  std::map<std::string, int64_t> counts;
  for (size_t i = 0; i < from.size(); ++i) {
    if (from[i] == to[i]) continue;
    if (from[i].is_shard()) ++counts[kAllGather];
    if (from[i].is_partial()) ++counts[to[i].is_shard() ? kReduceScatter : kAllReduce];
  }
  return counts;
}

Placements ForGrad(Placements placements) {
  for (Placement& p : placements) {
    if (p.is_partial()) p = Placement::Replicate();
  }
  return placements;
}

void ExpectEqualValues(const Tensor& actual, const Tensor& expected, const std::string& what) {
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  const std::vector<double> a = actual.to_doubles();
  const std::vector<double> e = expected.to_doubles();
  for (size_t k = 0; k < a.size(); ++k) {
    ASSERT_NEAR(a[k], e[k], 1e-5 * (1.0 + std::abs(e[k]))) << what << " element " << k;
  }
}

// The factor of this rank's Partial piece on mesh dim i: the pieces along a Partial(sum) dim
// are global * 2(k+1)/(n(n+1)) (they sum to global), along Partial(avg) global * 2(k+1)/(n+1)
// (they average to global), so every rank holds different values.
double PartialFactor(const DeviceMesh& mesh, const Placements& placements) {
  double factor = 1.0;
  for (int i = 0; i < mesh.ndim(); ++i) {
    const Placement& p = placements[static_cast<size_t>(i)];
    if (!p.is_partial()) continue;
    const double n = static_cast<double>(mesh.size(i));
    const double k = static_cast<double>(mesh.get_local_rank(i));
    factor *= 2.0 * (k + 1.0) / (n + 1.0);
    if (p.reduce_op() == distributed::ReduceOp::kSum) factor /= n;
  }
  return factor;
}

// Runs source -> target on `world` ranks with a mesh of `mesh_shape` for a global tensor of
// `shape`. The source is a leaf: this rank's piece of the global tensor (Partial pieces scaled
// by PartialFactor) wrapped with from_local. Loss = sum(global output * upstream), so the
// single-process gradient of the global tensor is `upstream`; each rank's source gradient must
// be its piece of it under the source placements with Partial read as Replicate.
void CheckTransition(int world, const std::vector<int64_t>& mesh_shape, const Shape& shape,
                     const Placements& source_in, const Placements& target_in) {
  const std::string what = PlacementsStr(source_in) + " -> " + PlacementsStr(target_in) +
                           " on mesh " + std::to_string(mesh_shape.size()) + "-D, world " +
                           std::to_string(world);
  auto results = fakes::RunRanks(world, [&](fakes::RankEnv& env) {
    auto mesh = DeviceMesh::Init(env.pg, "cpu", mesh_shape);
    const int64_t ndim = static_cast<int64_t>(shape.size());
    const Placements source = NormalizePlacements(source_in, *mesh, ndim, what);
    const Placements target = NormalizePlacements(target_in, *mesh, ndim, what);
    const Tensor global = Random(shape, 3);
    const Tensor upstream = Random(shape, 7);
    Tensor leaf =
        ops::kernels::MulScalar(ExpectedLocal(global, *mesh, source), PartialFactor(*mesh, source));
    leaf.set_requires_grad(true);
    const DTensor input = DTensor::from_local(leaf, mesh, source, shape);

    CommDebugMode comm_mode;
    const DTensor output = input.redistribute(target);
    comm_mode.exit();
    EXPECT_EQ(comm_mode.get_comm_counts(), ExpectedCounts(source, target)) << what << " forward";
    EXPECT_EQ(output.shape(), shape) << what;
    EXPECT_EQ(output.placements(), target) << what;
    const Tensor local = output.to_local();
    ExpectEqualValues(
        local,
        ops::kernels::MulScalar(ExpectedLocal(global, *mesh, target), PartialFactor(*mesh, target)),
        what + " forward local");

    // Each rank's output piece gets its piece of `upstream` as gradient (declared with the
    // output's placements by to_local).
    comm_mode.enter();
    sum(mul(local, ExpectedLocal(upstream, *mesh, target))).backward();
    comm_mode.exit();
    EXPECT_EQ(comm_mode.get_comm_counts(), ExpectedCounts(ForGrad(target), ForGrad(source)))
        << what << " backward";
    ExpectEqualValues(leaf.grad(), ExpectedLocal(upstream, *mesh, ForGrad(source)),
                      what + " backward gradient");
    return 0;
  });
  ASSERT_TRUE(results.all_ok()) << what << ": " << results.summary();
}

const Placement kShard0 = Placement::Shard(0);
const Placement kShard1 = Placement::Shard(1);
const Placement kShardLast = Placement::Shard(-1);
const Placement kReplicate = Placement::Replicate();
const Placement kPartial = Placement::Partial();
const Placement kPartialAvg = Placement::Partial(distributed::ReduceOp::kAvg);

// Every supported 1-D transition at worlds 2 and 3 (shape 5 x 7: uneven at both).
TEST(RedistributeTest, EveryOneDimTransitionForwardAndBackward) {
  const std::vector<Placement> sources = {kShard0, kShard1, kReplicate, kPartial, kPartialAvg};
  const std::vector<Placement> targets = {kShard0, kShard1, kShardLast, kReplicate};
  for (int world : {2, 3}) {
    for (const Placement& s : sources) {
      for (const Placement& t : targets) {
        CheckTransition(world, {world}, {5, 7}, {s}, {t});
      }
    }
  }
}

// 2x2 mesh (world 4): both mesh dims change, one at a time and together.
TEST(RedistributeTest, TwoDimMeshTransitionsForwardAndBackward) {
  const std::vector<std::pair<Placements, Placements>> cases = {
      {{kShard0, kShard1}, {kReplicate, kReplicate}},
      {{kShard0, kShard1}, {kShard1, kShard0}},
      {{kPartial, kShard0}, {kReplicate, kShard1}},
      {{kPartial, kPartial}, {kShard0, kReplicate}},
      {{kReplicate, kPartial}, {kShard1, kShard0}},
      {{kReplicate, kReplicate}, {kShard0, kShard1}},
      {{kShard1, kReplicate}, {kReplicate, kShard1}},
  };
  for (const auto& [source, target] : cases) {
    CheckTransition(4, {2, 2}, {3, 5}, source, target);
  }
}

}  // namespace
}  // namespace fsdp::tensor_parallel
