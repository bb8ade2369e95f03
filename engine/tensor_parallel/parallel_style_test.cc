// ColwiseParallel / RowwiseParallel / SequenceParallel / parallelize_module on the threaded
// fake (SequenceParallel: LayerNorm and RMSNorm over sequence-sharded activations, below): an MLPModule
// (net1 Linear(10, 16), relu, net2 Linear(16, 10)) parallelized colwise -> rowwise over a TP
// mesh (worlds 2 and 3: 16 hidden features split unevenly at 3; a 2x2 mesh's "tp" submesh)
// gives the unsharded model's output and gradients, with the functional collectives PyTorch
// issues; bad plans and placements fail with errors naming what was wrong.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "engine/autograd/grad_mode.h"
#include "engine/core/rng.h"
#include "engine/nn/layers.h"
#include "engine/distributed/comm_debug_mode.h"
#include "engine/distributed/device_mesh.h"
#include "engine/functional/functional.h"
#include "engine/nn/models.h"
#include "engine/ops/shape_ops.h"
#include "engine/tensor_parallel/dtensor.h"
#include "engine/tensor_parallel/dtensor_parameter.h"
#include "engine/tensor_parallel/parallelize_module.h"
#include "fakes/run_ranks.h"

namespace fsdp::tensor_parallel {
namespace {

using distributed::CommDebugMode;
using distributed::DeviceMesh;
using Counts = CommDebugMode::Counts;

constexpr const char* kAllGather = "c10d_functional.all_gather_into_tensor";
constexpr const char* kReduceScatter = "c10d_functional.reduce_scatter_tensor";
constexpr const char* kAllReduce = "c10d_functional.all_reduce";

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

// This rank's piece of a full tensor under a 1-D placement over `mesh`.
Tensor Piece(const Tensor& full, const DeviceMesh& mesh, const Placement& placement) {
  if (!placement.is_shard()) return full;
  const int64_t dim = placement.normalized(full.dim()).dim();
  const ChunkRange range = ComputeChunkRange(full.size(dim), mesh.size(0), mesh.get_local_rank(0));
  return ops::kernels::Narrow(full, dim, range.offset, range.length);
}

// Each rank's gradient of every parameter is its piece (by the parameter's DTensor placement)
// of the reference model's gradient.
void ExpectParameterGradients(const nn::Module& model, const nn::Module& reference,
                              const DeviceMesh& tp_mesh) {
  for (const auto& [name, ref_param] : reference.named_parameters()) {
    const auto dot = name.rfind('.');
    const auto owner = model.get_submodule(name.substr(0, dot));
    const auto dtensor = GetDTensorParameter(*owner, name.substr(dot + 1));
    ASSERT_TRUE(dtensor.has_value()) << name << " is not tensor-parallel";
    EXPECT_EQ(dtensor->shape(), ref_param.sizes()) << name;
    ExpectClose(model.get_parameter(name).grad(),
                Piece(ref_param.grad(), tp_mesh, dtensor->placements()[0]), name + ".grad");
  }
}

struct MlpCase {
  int world;
  std::vector<int64_t> mesh_shape;  // (tp) or (dp, tp)
  bool sequence_sharded;            // input/output Shard(0) (the seed-003 plan) or Replicate
};

// Runs the colwise -> rowwise MLP against the unsharded one. Each TP group gets its own
// batch (seeded by its dp index); with sequence_sharded, each rank holds `rows` rows of it
// (rank-major), net1 gathers them and net2 reduce-scatters its output back.
void CheckMlp(const MlpCase& c) {
  auto results = fakes::RunRanks(c.world, [&](fakes::RankEnv& env) {
    const std::vector<std::string> names = c.mesh_shape.size() == 2
                                               ? std::vector<std::string>{"dp", "tp"}
                                               : std::vector<std::string>{"tp"};
    auto mesh = DeviceMesh::Init(env.pg, "cpu", c.mesh_shape, names);
    auto tp_mesh = (*mesh)["tp"];
    const int64_t tp = tp_mesh->size(0);
    const uint64_t dp_index = c.mesh_shape.size() == 2 ? mesh->get_local_rank(0) : 0;
    const int64_t rows = 2;
    const Tensor batch = Random({c.sequence_sharded ? rows * tp : rows, 10}, 11 + dp_index);
    const Tensor upstream = Random({batch.size(0), 10}, 31 + dp_index);  // dL/d(output)

    auto reference = std::make_shared<nn::MLPModule>();
    auto model = std::make_shared<nn::MLPModule>();  // same seed: the same parameters
    ParallelStyleOptions net1;
    ParallelStyleOptions net2;
    if (c.sequence_sharded) {
      net1.input_layouts = Placement::Shard(0);
      net2.output_layouts = Placement::Shard(0);
    }
    parallelize_module(*model, tp_mesh,
                       {{"net1", std::make_shared<ColwiseParallel>(net1)},
                        {"net2", std::make_shared<RowwiseParallel>(net2)}});

    Tensor ref_x = batch.clone().set_requires_grad(true);
    Tensor ref_y = (*reference)(ref_x).tensor();
    sum(mul(ref_y, upstream)).backward();

    const Placement io = c.sequence_sharded ? Placement::Shard(0) : Placement::Replicate();
    Tensor x = Piece(batch, *tp_mesh, io).clone().set_requires_grad(true);
    CommDebugMode comm_mode;
    Tensor y = (*model)(x).tensor();
    comm_mode.exit();
    const Counts forward =
        c.sequence_sharded ? Counts{{kAllGather, 1}, {kReduceScatter, 1}} : Counts{{kAllReduce, 1}};
    EXPECT_EQ(comm_mode.get_comm_counts(), forward);
    ExpectClose(y, Piece(ref_y.detach(), *tp_mesh, io), "output");

    comm_mode.enter();
    sum(mul(y, Piece(upstream, *tp_mesh, io))).backward();
    comm_mode.exit();
    // Backward: the inverse of each forward collective (net2's output all_gathers its
    // Shard(0) gradient; net1's input reduce-scatters its Partial gradient), or, with
    // replicated activations, one all_reduce of the Partial input gradient.
    EXPECT_EQ(comm_mode.get_comm_counts(), forward);
    ExpectClose(x.grad(), Piece(ref_x.grad(), *tp_mesh, io), "input gradient");
    ExpectParameterGradients(*model, *reference, *tp_mesh);
    return 0;
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

TEST(ParallelStyleTest, ColwiseRowwiseMlpMatchesUnshardedModel) {
  for (int world : {2, 3}) CheckMlp({world, {world}, false});
}

TEST(ParallelStyleTest, SequenceShardedColwiseRowwiseMlpMatchesUnshardedModel) {
  for (int world : {2, 3}) CheckMlp({world, {world}, true});
}

TEST(ParallelStyleTest, TwoDimMeshTpSubmeshMatchesUnshardedModel) {
  CheckMlp({4, {2, 2}, false});
  CheckMlp({4, {2, 2}, true});
}

// SequenceParallel on a norm over activations sharded on the sequence dim (5 positions: uneven
// over 2 and 3 ranks): each rank's output and input gradient are its rows of the unsharded
// norm's, and every parameter's gradient is the full one on every rank, each brought there by
// one all_reduce of its Partial local gradient in backward (none in forward).
template <typename Norm>
void CheckSequenceParallelNorm(int world) {
  auto results = fakes::RunRanks(world, [&](fakes::RankEnv& env) {
    auto mesh = DeviceMesh::Init(env.pg, "cpu", {world}, {"tp"});
    const int64_t dim = 6;
    const Tensor batch = Random({2, 5, dim}, 17);
    const Tensor upstream = Random({2, 5, dim}, 19);
    auto reference = std::make_shared<Norm>(dim);
    auto model = std::make_shared<Norm>(dim);
    for (auto [name, p] : reference->named_parameters()) {  // non-trivial affine parameters
      autograd::NoGradGuard no_grad;
      const Tensor values = Random(p.sizes(), 23);
      p.copy_(values);
      model->get_parameter(name).copy_(values);
    }
    parallelize_module(*model, mesh, {{"", std::make_shared<SequenceParallel>(1)}});
    Tensor ref_x = batch.clone().set_requires_grad(true);
    Tensor ref_y = (*reference)(ref_x).tensor();
    sum(mul(ref_y, upstream)).backward();

    const Placement seq = Placement::Shard(1);
    Tensor x = Piece(batch, *mesh, seq).clone().set_requires_grad(true);
    CommDebugMode comm_mode;
    Tensor y = (*model)(x).tensor();
    comm_mode.exit();
    EXPECT_EQ(comm_mode.get_comm_counts(), Counts{});
    ExpectClose(y, Piece(ref_y.detach(), *mesh, seq), "output");
    comm_mode.enter();
    sum(mul(y, Piece(upstream, *mesh, seq))).backward();
    comm_mode.exit();
    const int64_t params = static_cast<int64_t>(reference->named_parameters().size());
    EXPECT_EQ(comm_mode.get_comm_counts(), (Counts{{kAllReduce, params}}));
    ExpectClose(x.grad(), Piece(ref_x.grad(), *mesh, seq), "input gradient");
    for (const auto& [name, ref_param] : reference->named_parameters()) {
      const auto dtensor = GetDTensorParameter(*model, name);
      EXPECT_TRUE(dtensor.has_value()) << name;
      if (!dtensor) continue;
      EXPECT_EQ(dtensor->placements(), Placements{Placement::Replicate()}) << name;
      EXPECT_TRUE(model->get_parameter(name).is_same(dtensor->local_tensor())) << name;
      ExpectClose(model->get_parameter(name).grad(), ref_param.grad(), name + ".grad");
    }
    return 0;
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

TEST(ParallelStyleTest, SequenceParallelLayerNormMatchesUnshardedNorm) {
  for (int world : {2, 3}) CheckSequenceParallelNorm<nn::LayerNorm>(world);
}

TEST(ParallelStyleTest, SequenceParallelRmsNormMatchesUnshardedNorm) {
  for (int world : {2, 3}) CheckSequenceParallelNorm<nn::RMSNormPython>(world);
}

// The sharded parameters' DTensors rebuild the full parameters (full_tensor).
TEST(ParallelStyleTest, ShardedParametersFullTensorEqualsOriginal) {
  auto results = fakes::RunRanks(3, [](fakes::RankEnv& env) {
    auto mesh = DeviceMesh::Init(env.pg, "cpu", {3});
    auto reference = std::make_shared<nn::MLPModule>();
    auto model = std::make_shared<nn::MLPModule>();
    parallelize_module(*model, mesh,
                       {{"net1", std::make_shared<ColwiseParallel>()},
                        {"net2", std::make_shared<RowwiseParallel>()}});
    for (const auto& [name, ref_param] : reference->named_parameters()) {
      const auto dot = name.rfind('.');
      const auto dtensor =
          GetDTensorParameter(*model->get_submodule(name.substr(0, dot)), name.substr(dot + 1));
      EXPECT_TRUE(dtensor.has_value()) << name;
      if (!dtensor) continue;
      EXPECT_TRUE(model->get_parameter(name).is_leaf()) << name;
      ExpectClose(dtensor->full_tensor(), ref_param.detach(), name);
    }
    return 0;
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

std::string ErrorOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ParallelStyleTest, BadPlansMeshesAndPlacementsNameWhatIsWrong) {
  auto results = fakes::RunRanks(2, [](fakes::RankEnv& env) {
    auto mesh = DeviceMesh::Init(env.pg, "cpu", {2}, {"tp"});
    auto model = std::make_shared<nn::MLPModule>();
    const std::string missing = ErrorOf([&] {
      parallelize_module(*model, mesh, {{"net3", std::make_shared<ColwiseParallel>()}});
    });
    EXPECT_NE(missing.find("'net3'"), std::string::npos) << missing;
    EXPECT_NE(missing.find("'net1'"), std::string::npos) << missing;
    const std::string not_linear = ErrorOf([&] {
      parallelize_module(*model, mesh, {{"", std::make_shared<RowwiseParallel>()}});
    });
    EXPECT_NE(not_linear.find("RowwiseParallel currently only supports nn.Linear"),
              std::string::npos)
        << not_linear;
    EXPECT_NE(not_linear.find("MLPModule"), std::string::npos) << not_linear;
    parallelize_module(*model, mesh, {{"net1", std::make_shared<ColwiseParallel>()}});
    const std::string twice = ErrorOf([&] {
      parallelize_module(*model, mesh, {{"net1", std::make_shared<RowwiseParallel>()}});
    });
    EXPECT_NE(twice.find("'net1' is already tensor-parallel"), std::string::npos) << twice;
    const std::string bad_dim = ErrorOf([&] {
      DTensor::from_local(Tensor::zeros({2, 3}), mesh, {Placement::Shard(2)});
    });
    EXPECT_NE(bad_dim.find("Shard(dim=2)"), std::string::npos) << bad_dim;
    EXPECT_NE(bad_dim.find("2 dims"), std::string::npos) << bad_dim;
    const std::string bad_count = ErrorOf([&] {
      DTensor::from_local(Tensor::zeros({2, 3}), mesh,
                          {Placement::Shard(0), Placement::Replicate()});
    });
    EXPECT_NE(bad_count.find("2 placements"), std::string::npos) << bad_count;
    const std::string bad_shape = ErrorOf([&] {
      DTensor::from_local(Tensor::zeros({2, 3}), mesh, {Placement::Shard(0)}, Shape{7, 3});
    });
    const std::string piece =  // this rank's torch.chunk piece of 7 rows
        "[" + std::to_string(ComputeChunkRange(7, 2, env.rank).length) + ", 3]";
    EXPECT_NE(bad_shape.find(piece), std::string::npos) << bad_shape;
    const std::string bad_mesh = ErrorOf([&] { DeviceMesh::Init(env.pg, "cpu", {3}); });
    EXPECT_NE(bad_mesh.find("world size is 2"), std::string::npos) << bad_mesh;
    const std::string local_output = ErrorOf([&] {
      ParallelStyleOptions options;
      options.use_local_output = false;
      ColwiseParallel style(options);
    });
    EXPECT_NE(local_output.find("use_local_output=False"), std::string::npos) << local_output;
    const std::string not_norm = ErrorOf([&] {
      parallelize_module(*model, mesh, {{"net2", std::make_shared<SequenceParallel>()}});
    });
    EXPECT_NE(not_norm.find("SequenceParallel currently only supports nn.LayerNorm"),
              std::string::npos)
        << not_norm;
    EXPECT_NE(not_norm.find("'net2'"), std::string::npos) << not_norm;
    return 0;
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

}  // namespace
}  // namespace fsdp::tensor_parallel
