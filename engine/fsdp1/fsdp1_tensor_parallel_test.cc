// FSDP1 over a tensor-parallel model (dtensor_extensions.h) on the threaded fake, on a
// (dp, tp) = (2, 2) mesh at world 4:
//  * seed 003's extension-grad model (RMSNormPython replicated with distribute_module over
//    Shard(0) rows, MLPModule colwise -> rowwise with Shard(0) input and output) wrapped by
//    FSDP1 on mesh_2d["dp"]: one forward/backward issues exactly the collectives the placements
//    imply, the flat parameter holds TP-local pieces, and unsharded views are DTensors again;
//  * seed 003's SimpleModel: TP + FSDP1 gradients, averaged over tp as the seed does, equal
//    FSDP-only gradients (every strategy the seed runs, use_orig_params both ways);
//  * sync_module_states broadcasts within each dp group only.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/autograd/grad_mode.h"
#include "engine/core/rng.h"
#include "engine/distributed/comm_debug_mode.h"
#include "engine/distributed/device_mesh.h"
#include "engine/fsdp1/flat_param.h"
#include "engine/fsdp1/fully_sharded_data_parallel.h"
#include "engine/fsdp1/unshard_params.h"
#include "engine/functional/functional.h"
#include "engine/nn/init.h"
#include "engine/nn/models.h"
#include "engine/ops/shape_ops.h"
#include "engine/tensor_parallel/distribute_module.h"
#include "engine/tensor_parallel/dtensor_parameter.h"
#include "engine/tensor_parallel/parallelize_module.h"
#include "fakes/run_ranks.h"

namespace fsdp::fsdp1 {
namespace {

using distributed::CommDebugMode;
using distributed::DeviceMesh;
using tensor_parallel::ColwiseParallel;
using tensor_parallel::DTensor;
using tensor_parallel::GetDTensorParameter;
using tensor_parallel::Placement;
using tensor_parallel::RowwiseParallel;

Tensor Random(const Shape& shape, uint64_t seed) {
  Generator generator(seed);
  return Tensor::rand(shape, DType::kFloat32, &generator);
}

// Seed 003's TestModel: mlp(mlp_norm(x)).
class NormMlp : public nn::Module {
 public:
  NormMlp() : nn::Module("TestModel") {
    register_module("mlp", std::make_shared<nn::MLPModule>());
    register_module("mlp_norm", std::make_shared<nn::RMSNormPython>(10));
  }
  nn::Value forward(const nn::Value& x) override {
    return call_child("mlp", call_child("mlp_norm", x));
  }
};

std::shared_ptr<DeviceMesh> Mesh2d(const std::shared_ptr<distributed::ProcessGroup>& pg, int64_t dp,
                                   int64_t tp) {
  return DeviceMesh::Init(pg, "cpu", {dp, tp}, {"dp", "tp"});
}

tensor_parallel::ParallelStyleOptions Layouts(std::optional<Placement> in,
                                              std::optional<Placement> out) {
  tensor_parallel::ParallelStyleOptions o;
  o.input_layouts = in;
  o.output_layouts = out;
  return o;
}

TEST(Fsdp1TensorParallel, ExtensionGradIssuesTheCollectivesOfThePlacements) {
  auto results = fakes::RunRanks(4, [](fakes::RankEnv& env) {
    auto mesh_2d = Mesh2d(env.pg, 2, 2);
    auto tp_mesh = (*mesh_2d)["tp"];
    auto model = std::make_shared<NormMlp>();
    tensor_parallel::parallelize_module(
        *model, tp_mesh,
        {{"mlp.net1", std::make_shared<ColwiseParallel>(Layouts(Placement::Shard(0), std::nullopt))},
         {"mlp.net2",
          std::make_shared<RowwiseParallel>(Layouts(std::nullopt, Placement::Shard(0)))}});
    tensor_parallel::distribute_module(
        *model->get_submodule("mlp_norm"), tp_mesh, nullptr,
        [](nn::Module&, const nn::Value& in, const std::shared_ptr<DeviceMesh>& m) {
          return DTensor::from_local(in.tensor(), m, {Placement::Shard(0)});
        },
        [](nn::Module&, const DTensor& out, const std::shared_ptr<DeviceMesh>&) {
          return nn::Value(out.to_local());
        });
    const int64_t local_numel = 10 + 8 * 10 + 8 + 10 * 8 + 10;  // TP-local pieces
    FullyShardedDataParallelOptions options;
    options.device_mesh = (*mesh_2d)["dp"];
    auto fsdp_model = std::make_shared<FullyShardedDataParallel>(model, options);
    EXPECT_EQ(fsdp_model->handle->unpadded_unsharded_numel(), local_numel);
    EXPECT_TRUE(fsdp_model->handle->has_param_extensions());

    CommDebugMode comm_mode;
    Tensor out = (*fsdp_model)(Random({2, 10}, 100 + env.rank)).tensor();
    // Inside forward's unsharded views, every TP parameter is a DTensor again.
    const auto w1 = GetDTensorParameter(*model->get_submodule("mlp.net1"), "weight");
    EXPECT_EQ(w1->placements(), tensor_parallel::Placements{Placement::Shard(0)});
    EXPECT_EQ(w1->shape(), (Shape{16, 10}));
    EXPECT_EQ(w1->local_tensor().sizes(), (Shape{8, 10}));
    sum(out).backward();
    comm_mode.exit();
    EXPECT_EQ(comm_mode.get_comm_counts(),
              (CommDebugMode::Counts{{"c10d_functional.all_gather_into_tensor", 2},
                                     {"c10d_functional.reduce_scatter_tensor", 2},
                                     {"c10d_functional.all_reduce", 1},
                                     {"c10d.allgather_", 1},
                                     {"c10d._reduce_scatter_base_", 1}}));
    EXPECT_EQ(comm_mode.get_total_counts(), 7);
    for (const Tensor& p : fsdp_model->parameters()) {
      EXPECT_TRUE(p.grad().defined());
      if (!p.grad().defined()) continue;
      for (double v : p.grad().to_doubles()) EXPECT_TRUE(std::isfinite(v));
    }
    return 0;
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

// The unsharded flat gradient of `handle` (all-gathered over its group), unflattened: one
// tensor per flattened parameter, in flattening order.
std::vector<Tensor> UnshardedGrads(const FlatParamHandle& handle) {
  const Tensor shard = handle.sharded_grad();
  const int world = handle.world_size();
  Tensor full = Tensor::zeros({shard.numel() * world}, shard.dtype());
  std::vector<Tensor> pieces;
  for (int r = 0; r < world; ++r) pieces.push_back(full.narrow(0, r * shard.numel(), shard.numel()));
  handle.options().process_group->all_gather(pieces, shard)->wait();
  std::vector<Tensor> out;
  int64_t offset = 0;
  size_t idx = 0;
  for (size_t i = 0; i < handle.layout().numels_with_padding.size(); ++i) {
    const int64_t numel = handle.layout().numels_with_padding[i];
    if (!handle.layout().is_padding_mask[i]) {
      out.push_back(full.narrow(0, offset, numel).view(handle.shapes()[idx++]));
    }
    offset += numel;
  }
  return out;
}

void CheckSimpleModel(ShardingStrategy strategy, bool use_orig_params) {
  auto results = fakes::RunRanks(4, [&](fakes::RankEnv& env) {
    auto mesh_2d = Mesh2d(env.pg, 2, 2);
    auto tp_mesh = (*mesh_2d)["tp"];
    nn::ManualSeed(0);
    auto model = std::make_shared<nn::SimpleModel>();
    auto reference = model->deep_copy();
    tensor_parallel::parallelize_module(
        *model, tp_mesh,
        {{"net1", std::make_shared<ColwiseParallel>(Layouts(Placement::Shard(0), std::nullopt))},
         {"net2", std::make_shared<RowwiseParallel>(Layouts(std::nullopt, Placement::Shard(0)))}});
    FullyShardedDataParallelOptions options;
    options.device_mesh = (*mesh_2d)["dp"];
    options.sharding_strategy = strategy;
    options.use_orig_params = use_orig_params;
    auto fsdp_model = std::make_shared<FullyShardedDataParallel>(model, options);

    // Every rank's batch; the reference computes the FSDP-only gradient (the mean over ranks
    // of each rank's gradient) on all of them.
    std::vector<Tensor> batches;
    for (int r = 0; r < 4; ++r) batches.push_back(Random({2, 3, 5}, 1 + r));
    Tensor ref_out = (*reference)(batches[env.rank]).tensor();
    Tensor out = (*fsdp_model)(batches[env.rank]).tensor();
    const std::vector<double> a = out.to_doubles();
    const std::vector<double> e = ref_out.to_doubles();
    for (size_t k = 0; k < a.size(); ++k) EXPECT_NEAR(a[k], e[k], 1e-5);
    sum(out).backward();
    for (int r = 0; r < 4; ++r) sum((*reference)(batches[r]).tensor()).backward();

    // The seed's _sync_tp_grads + _get_grads_as_flattened: the full gradient of each TP
    // parameter (gathered over tp), the tp-summed gradient of the plain ones, all / tp.
    const FlatParamHandle& handle = *fsdp_model->handle;
    const std::vector<Tensor> grads = UnshardedGrads(handle);
    for (size_t i = 0; i < grads.size(); ++i) {
      const ParamInfo& info = handle.param_infos()[i];
      const std::optional<DTensor> dt = handle.param_extensions()[i];
      Tensor full;
      if (dt) {
        full = DTensor::from_local(grads[i], tp_mesh, dt->placements(), dt->shape()).full_tensor();
      } else {
        full = grads[i].clone();
        tp_mesh->get_group(0)->all_reduce(full)->wait();
      }
      const std::vector<double> got = full.to_doubles();
      const std::vector<double> want =
          reference->get_parameter(handle.fqns()[i]).grad().to_doubles();
      EXPECT_EQ(got.size(), want.size()) << handle.fqns()[i];
      if (got.size() != want.size()) continue;
      for (size_t k = 0; k < got.size(); ++k) {
        EXPECT_NEAR(got[k] / 2, want[k] / 4, 1e-5) << info.module_name << "." << info.param_name;
      }
    }
    return 0;
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

TEST(Fsdp1TensorParallel, SimpleModelGradientsEqualFsdpOnlyGradients) {
  for (ShardingStrategy strategy : {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp}) {
    for (bool use_orig_params : {false, true}) CheckSimpleModel(strategy, use_orig_params);
  }
}

TEST(Fsdp1TensorParallel, SyncModuleStatesBroadcastsWithinDpGroups) {
  auto results = fakes::RunRanks(4, [](fakes::RankEnv& env) {
    auto mesh_2d = Mesh2d(env.pg, 2, 2);
    auto tp_mesh = (*mesh_2d)["tp"];
    auto model = std::make_shared<nn::Module>("TestModel");
    const Tensor param = Random({8, 8}, 50 + env.rank);
    const Tensor buf = Random({8, 8}, 60 + env.rank);
    const Tensor leaf = model->register_parameter("param", param);
    {
      autograd::NoGradGuard no_grad;
      tensor_parallel::RecordDTensorParameter(
          *model, "param", DTensor::from_local(leaf, tp_mesh, {Placement::Replicate()}));
    }
    model->register_buffer("buf", buf);
    FullyShardedDataParallelOptions options;
    options.device_mesh = (*mesh_2d)["dp"];
    options.sync_module_states = true;
    auto fsdp_model = std::make_shared<FullyShardedDataParallel>(model, options);
    SummonFullParams full(fsdp_model);
    // dp index 0 of this rank's dp group is rank tp_index (ranks {0, 2} and {1, 3}).
    const int src = static_cast<int>(mesh_2d->get_local_rank(1));
    const std::vector<double> want_param = Random({8, 8}, 50 + src).to_doubles();
    const std::vector<double> want_buf = Random({8, 8}, 60 + src).to_doubles();
    EXPECT_EQ(GetDTensorParameter(*model, "param")->to_local().to_doubles(), want_param);
    EXPECT_EQ(model->buffer("buf").to_doubles(), want_buf);
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
  return "(no error)";
}

// A TP model wrapped over the whole 2-D mesh, and state dicts of a wrapped TP model, fail
// naming what is wrong.
TEST(Fsdp1TensorParallel, TwoDimMeshAndStateDictsFailClearly) {
  auto results = fakes::RunRanks(4, [](fakes::RankEnv& env) {
    auto mesh_2d = Mesh2d(env.pg, 2, 2);
    auto model = std::make_shared<nn::SimpleModel>();
    tensor_parallel::parallelize_module(*model, (*mesh_2d)["tp"],
                                        {{"net1", std::make_shared<ColwiseParallel>()}});
    FullyShardedDataParallelOptions options;
    options.device_mesh = mesh_2d;
    const std::string two_dim =
        ErrorOf([&] { std::make_shared<FullyShardedDataParallel>(model, options); });
    EXPECT_NE(two_dim.find("shards over a 1-D device_mesh but got ndim=2"), std::string::npos)
        << two_dim;
    options.device_mesh = (*mesh_2d)["dp"];
    auto fsdp_model = std::make_shared<FullyShardedDataParallel>(model, options);
    const std::string state_dict = ErrorOf([&] { fsdp_model->state_dict(); });
    EXPECT_NE(state_dict.find("'net1.weight' is DTensor("), std::string::npos) << state_dict;
    EXPECT_NE(state_dict.find("not implemented"), std::string::npos) << state_dict;
    return 0;
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

}  // namespace
}  // namespace fsdp::fsdp1
