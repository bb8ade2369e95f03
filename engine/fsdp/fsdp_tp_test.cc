// fully_shard over a tensor-parallel model on a 2-D (dp, tp) mesh (FSDP2 × TP,
// engine/fsdp/tp_sharding.h; PyTorch's TestFullyShard2DTraining): an MLPStack parallelised
// colwise -> rowwise over mesh_2d["tp"], then fully_shard per MLP and on the root over
// mesh_2d["dp"], trained with SGD against the unsharded model on every dp batch (gradients
// averaged over dp), at (dp, tp) = (2, 2) and (3, 2) with uneven chunks. Checked per step: the
// outputs, every rank's gradient and parameter shards (the nested torch.chunk: TP piece, then
// the dp chunk of dim 0), full_tensor() / full gradients, the state-dict sharding (and that it
// loads back, while full tensors do not), and the
// collectives of forward and backward by name, derived from the groups and the placements.
// The sequence-parallel pattern (a SequenceParallel norm, then colwise / rowwise on sequence-
// sharded activations) trains the same way.
// Bad meshes fail with errors naming the parameter and the meshes.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "engine/autograd/grad_mode.h"
#include "engine/core/rng.h"
#include "engine/distributed/comm_debug_mode.h"
#include "engine/distributed/device_mesh.h"
#include "engine/fsdp/fsdp_param.h"
#include "engine/fsdp/fully_shard.h"
#include "engine/functional/functional.h"
#include "engine/nn/layers.h"
#include "engine/nn/models.h"
#include "engine/ops/elementwise.h"
#include "engine/ops/shape_ops.h"
#include "engine/optim/sgd.h"
#include "engine/tensor_parallel/dtensor_parameter.h"
#include "engine/tensor_parallel/parallelize_module.h"
#include "fakes/run_ranks.h"

namespace fsdp::fsdp2 {
namespace {

using distributed::CommDebugMode;
using distributed::DeviceMesh;
using tensor_parallel::ColwiseParallel;
using tensor_parallel::Placement;
using tensor_parallel::RowwiseParallel;
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

// Identical deterministic values in every parameter (every rank builds the same model).
void FillParameters(nn::Module& module) {
  autograd::NoGradGuard no_grad;
  uint64_t seed = 1000;
  for (auto [name, p] : module.named_parameters()) {
    p.copy_(ops::kernels::MulScalar(Random(p.sizes(), seed++), 0.5));
  }
}

// The nested torch.chunk piece of `full` this rank holds: its TP piece (by `tp_placement` over
// `tp` ranks, index `tp_index`), then its chunk of dim 0 over the `shard` ranks of its dp
// shard group (index `shard_index`).
Tensor NestedPiece(const Tensor& full, const Placement& tp_placement, int64_t tp, int64_t tp_index,
                   int64_t shard, int64_t shard_index) {
  Tensor t = full;
  if (tp_placement.is_shard()) {
    const int64_t dim = tp_placement.normalized(full.dim()).dim();
    const auto r = tensor_parallel::ComputeChunkRange(full.size(dim), tp, tp_index);
    t = ops::kernels::Narrow(t, dim, r.offset, r.length);
  }
  const auto r = tensor_parallel::ComputeChunkRange(t.size(0), shard, shard_index);
  return ops::kernels::Narrow(t, 0, r.offset, r.length);
}

// MLPStack.parallelize's TP plan: every in_proj colwise, every out_proj rowwise.
tensor_parallel::ParallelizePlan MlpStackPlan(const nn::Module& stack) {
  tensor_parallel::ParallelizePlan plan;
  for (const auto& [name, child] : stack.named_children()) {
    plan.emplace_back(name + ".in_proj", std::make_shared<ColwiseParallel>());
    plan.emplace_back(name + ".out_proj", std::make_shared<RowwiseParallel>());
  }
  return plan;
}

constexpr int64_t kDim = 5;  // in_proj [15, 5] / [20, 5]: uneven over tp 2, then over dp 3
constexpr int64_t kBatch = 3;
constexpr int kSteps = 2;

// FSDP2 × TP on a (dp, tp) mesh, or HSDP × TP on a (replicate, shard, tp) mesh (fully_shard
// over mesh_3d[("dp_replicate", "dp_shard")]) when `replicate` > 1: every dp rank
// (replicate × shard of them) trains on its own batch, against the unsharded model on all of
// them.
void CheckTrainParity(int64_t replicate, int64_t shard, int64_t tp) {
  const int64_t dp = replicate * shard;
  const int world = static_cast<int>(dp * tp);
  auto results = fakes::RunRanks(world, [&](fakes::RankEnv& env) {
    std::shared_ptr<DeviceMesh> dp_mesh;
    std::shared_ptr<DeviceMesh> tp_mesh;
    if (replicate > 1) {
      auto mesh_3d = DeviceMesh::Init(env.pg, "cpu", {replicate, shard, tp},
                                      {"dp_replicate", "dp_shard", "tp"});
      dp_mesh = mesh_3d->slice({"dp_replicate", "dp_shard"});
      tp_mesh = (*mesh_3d)["tp"];
    } else {
      auto mesh_2d = DeviceMesh::Init(env.pg, "cpu", {dp, tp}, {"dp", "tp"});
      dp_mesh = (*mesh_2d)["dp"];
      tp_mesh = (*mesh_2d)["tp"];
    }
    const int64_t tp_index = tp_mesh->get_local_rank(0);
    const int64_t dp_index = env.rank / tp;  // init_device_mesh's row-major layout
    const int64_t shard_index = dp_mesh->get_local_rank(dp_mesh->ndim() - 1);
    auto piece = [&](const Tensor& full, const Placement& placement) {
      return NestedPiece(full, placement, tp, tp_index, shard, shard_index);
    };
    auto reference = std::make_shared<nn::MLPStack>(kDim);
    auto model = std::make_shared<nn::MLPStack>(kDim);
    FillParameters(*reference);
    FillParameters(*model);
    tensor_parallel::parallelize_module(*model, tp_mesh, MlpStackPlan(*model));
    FullyShardOptions options;
    options.mesh = dp_mesh;
    std::vector<nn::ModulePtr> blocks = model->children();
    for (const nn::ModulePtr& block : blocks) fully_shard(block, options);
    fully_shard(model, options);

    // The 2-D sharding of every parameter: ([Replicate(),] _StridedShard(0, sf=tp) | Shard(0),
    // TP placement).
    std::map<std::string, Placement> tp_placements;
    for (const auto& [name, param] : model->named_parameters()) {
      const FsdpParam* fsdp_param = LookupFsdpParam(param);
      ASSERT_NE(fsdp_param, nullptr) << name;
      ASSERT_TRUE(fsdp_param->is_dtensor()) << name;
      const TpSharding& s = *fsdp_param->tp_sharding();
      tp_placements.emplace(name, s.tp_placement);
      const bool strided = s.tp_placement.is_shard(0) && tp > 1;
      EXPECT_EQ(s.placements_str(),
                std::string(replicate > 1 ? "(Replicate(), " : "(") +
                    (strided ? "_StridedShard(dim=0, sf=" + std::to_string(tp) + ")"
                             : std::string("Shard(dim=0)")) +
                    ", " + s.tp_placement.str() + ")")
          << name;
      EXPECT_EQ(fsdp_param->tensor_shape(), reference->get_parameter(name).sizes()) << name;
      // The style's DTensor keeps the TP spec only; the TP-local values are not kept beside
      // the shard.
      const auto dot = name.rfind('.');
      const auto dtensor = tensor_parallel::GetDTensorParameter(
          *model->get_submodule(name.substr(0, dot)), name.substr(dot + 1));
      ASSERT_TRUE(dtensor.has_value()) << name;
      EXPECT_EQ(dtensor->local_tensor().sizes(), s.tp_local_shape) << name;
      EXPECT_EQ(dtensor->local_tensor().storage()->nbytes(), 0u) << name;
      EXPECT_TRUE(param.is_same(fsdp_param->sharded_param())) << name;
    }

    optim::SGDOptions sgd;
    sgd.lr = 0.1;
    optim::SGD ref_optim(reference->parameters(), sgd);
    optim::SGD optim(model->parameters(), sgd);
    // Collectives derived from the groups and the placements: FSDP all-gathers each block's
    // group over its shard group in forward and again in backward (reshard after forward; the
    // root has no parameters; none over a shard group of one rank), and reduce-scatters each in
    // backward, then (HSDP) all-reduces the result over the replicate group; each
    // RowwiseParallel all-reduces its Partial output over tp in forward, and each
    // ColwiseParallel whose input needs a gradient all-reduces that Partial gradient in
    // backward (the first block's input does not).
    const int64_t groups = static_cast<int64_t>(blocks.size());
    const int64_t all_gathers = shard > 1 ? groups : 0;
    const int64_t colwise_with_input_grad = groups - 1;
    Counts want_forward{{"c10d._allgather_base_", all_gathers},
                        {"c10d_functional.all_reduce", groups}};
    Counts want_backward{{"c10d._allgather_base_", all_gathers},
                         {"c10d._reduce_scatter_base_", groups},
                         {"c10d_functional.all_reduce", colwise_with_input_grad}};
    if (replicate > 1) want_backward["c10d.allreduce_"] = groups;
    for (Counts* counts : {&want_forward, &want_backward})
      std::erase_if(*counts, [](const auto& kv) { return kv.second == 0; });
    for (int step = 0; step < kSteps; ++step) {
      // The unsharded model on every dp batch; gradients averaged over dp.
      ref_optim.zero_grad();
      Tensor ref_out_here;
      for (int64_t i = 0; i < dp; ++i) {
        const Tensor x = Random({kBatch, kDim}, 100 + 10 * step + i);
        const Tensor up = Random({kBatch, kDim}, 200 + 10 * step + i);
        Tensor y = (*reference)(x).tensor();
        sum(mul(y, up)).backward();
        if (i == dp_index) ref_out_here = y.detach();
      }
      {
        autograd::NoGradGuard no_grad;
        for (Tensor p : reference->parameters()) {
          p.grad().copy_(ops::kernels::DivScalar(p.grad(), static_cast<double>(dp)));
        }
      }
      const Tensor x = Random({kBatch, kDim}, 100 + 10 * step + dp_index);
      const Tensor up = Random({kBatch, kDim}, 200 + 10 * step + dp_index);
      optim.zero_grad();
      CommDebugMode comm_mode;
      Tensor y = (*model)(x).tensor();
      comm_mode.exit();
      EXPECT_EQ(comm_mode.get_comm_counts(), want_forward) << "forward, step " << step;
      comm_mode.enter();
      sum(mul(y, up)).backward();
      EXPECT_EQ(comm_mode.get_comm_counts(), want_backward) << "backward, step " << step;
      comm_mode.exit();
      ExpectClose(y, ref_out_here, "output, step " + std::to_string(step));
      for (const auto& [name, param] : model->named_parameters()) {
        const Tensor ref = reference->get_parameter(name);
        const Placement& placement = tp_placements.at(name);
        ExpectClose(param.grad(), piece(ref.grad(), placement),
                    name + ".grad shard, step " + std::to_string(step));
        ExpectClose(LookupFsdpParam(param)->full_grad(), ref.grad(),
                    name + " full gradient, step " + std::to_string(step));
      }
      ref_optim.step();
      optim.step();
      for (const auto& [name, param] : model->named_parameters()) {
        const Tensor ref = reference->get_parameter(name);
        ExpectClose(param, piece(ref, tp_placements.at(name)),
                    name + " shard after step " + std::to_string(step));
        ExpectClose(LookupFsdpParam(param)->full_tensor(), ref,
                    name + " full_tensor() after step " + std::to_string(step));
      }
    }
    // state_dict(): the local shards, marked with the full shape and this rank's offsets.
    const nn::StateDict sd = model->state_dict();
    for (const auto& [name, param] : model->named_parameters()) {
      const nn::ShardedEntry* entry = sd.sharding(name);
      ASSERT_NE(entry, nullptr) << name;
      const Tensor ref = reference->get_parameter(name);
      EXPECT_EQ(entry->global_shape, ref.sizes()) << name;
      const Tensor mine = piece(ref, tp_placements.at(name));
      if (mine.numel() > 0) {
        Tensor at = ref;
        for (size_t d = 0; d < entry->offsets.size(); ++d) {
          at = ops::kernels::Narrow(at, static_cast<int64_t>(d), entry->offsets[d], mine.size(d));
        }
        ExpectClose(*sd.find(name), at, name + " state-dict value at its offsets");
      }
    }
    // It loads back; a full tensor does not, and the error names the 2-D placements.
    model->load_state_dict(sd);
    nn::StateDict full;
    for (const auto& [name, param] : reference->named_parameters()) full.insert(name, param);
    try {
      model->load_state_dict(full);
      ADD_FAILURE() << "loading full tensors into FSDP x TP parameters did not fail";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(", Shard(dim="), std::string::npos) << e.what();
    }
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

TEST(FsdpTpTest, TrainParity2DMlpStackDp2Tp2) { CheckTrainParity(1, 2, 2); }
TEST(FsdpTpTest, TrainParity2DMlpStackDp3Tp2) { CheckTrainParity(1, 3, 2); }
// HSDP × TP on (replicate, shard, tp): the gradient is reduce-scattered over shard, then
// all-reduced over replicate; a shard group of one rank all-gathers nothing.
TEST(FsdpTpTest, TrainParityHsdpTimesTpMlpStack2x2x2) { CheckTrainParity(2, 2, 2); }
TEST(FsdpTpTest, TrainParityHsdpTimesTpMlpStack2x1x2) { CheckTrainParity(2, 1, 2); }

// The sequence-parallel pattern (PyTorch's MLPStack with use_seq_parallel, on [batch, seq, dim]
// activations): a LayerNorm under SequenceParallel(1), then Linear ColwiseParallel
// (input_layouts=Shard(1)), ReLU, Linear RowwiseParallel(output_layouts=Shard(1)), each rank
// holding its sequence rows, under fully_shard over dp (the norm's
// Replicate parameters are sharded over dp only). Gradients and parameters equal the unsharded
// model's; per step the collectives follow from the placements: forward the colwise input
// all-gather and the rowwise output reduce-scatter, backward their inverses and one all-reduce
// per norm parameter (its Partial gradient), plus FSDP's all-gather per group and
// reduce-scatter per group.
TEST(FsdpTpTest, SequenceParallelNormThenColwiseRowwise2D) {
  const int64_t dp = 2;
  const int64_t tp = 2;
  auto results = fakes::RunRanks(static_cast<int>(dp * tp), [&](fakes::RankEnv& env) {
    auto mesh_2d = DeviceMesh::Init(env.pg, "cpu", {dp, tp}, {"dp", "tp"});
    auto make = [] {
      return std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{
          std::make_shared<nn::LayerNorm>(kDim), std::make_shared<nn::Linear>(kDim, 3 * kDim),
          std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(3 * kDim, kDim)});
    };
    auto reference = make();
    auto model = make();
    FillParameters(*reference);
    FillParameters(*model);
    tensor_parallel::ParallelStyleOptions colwise;
    colwise.input_layouts = Placement::Shard(1);
    tensor_parallel::ParallelStyleOptions rowwise;
    rowwise.output_layouts = Placement::Shard(1);
    tensor_parallel::parallelize_module(
        *model, (*mesh_2d)["tp"],
        {{"0", std::make_shared<tensor_parallel::SequenceParallel>(1)},
         {"1", std::make_shared<ColwiseParallel>(colwise)},
         {"3", std::make_shared<RowwiseParallel>(rowwise)}});
    FullyShardOptions options;
    options.mesh = (*mesh_2d)["dp"];
    for (const char* child : {"0", "1", "3"}) fully_shard(model->get_submodule(child), options);
    fully_shard(model, options);
    const int64_t groups = 3;  // the root holds no parameter of its own
    const int64_t norm_params = 2;
    const Counts want_forward{{"c10d._allgather_base_", groups},
                              {"c10d_functional.all_gather_into_tensor", 1},
                              {"c10d_functional.reduce_scatter_tensor", 1}};
    const Counts want_backward{{"c10d._allgather_base_", groups},
                               {"c10d._reduce_scatter_base_", groups},
                               {"c10d_functional.all_gather_into_tensor", 1},
                               {"c10d_functional.reduce_scatter_tensor", 1},
                               {"c10d_functional.all_reduce", norm_params}};
    // Even over tp: a plain tensor annotated Shard(1) has the global size local * tp (from_local
    // without a shape, as PyTorch assumes).
    const int64_t seq = 4 * tp;
    const int64_t dp_index = mesh_2d->get_local_rank(0);
    const auto range = tensor_parallel::ComputeChunkRange(seq, tp, mesh_2d->get_local_rank(1));
    optim::SGDOptions sgd;
    sgd.lr = 0.1;
    optim::SGD ref_optim(reference->parameters(), sgd);
    optim::SGD optim(model->parameters(), sgd);
    for (int step = 0; step < kSteps; ++step) {
      ref_optim.zero_grad();
      Tensor ref_out_here;
      for (int64_t i = 0; i < dp; ++i) {
        Tensor y = (*reference)(Random({2, seq, kDim}, 300 + 10 * step + i)).tensor();
        sum(mul(y, Random({2, seq, kDim}, 400 + 10 * step + i))).backward();
        if (i == dp_index) ref_out_here = y.detach();
      }
      {
        autograd::NoGradGuard no_grad;
        for (Tensor p : reference->parameters()) {
          p.grad().copy_(ops::kernels::DivScalar(p.grad(), static_cast<double>(dp)));
        }
      }
      const Tensor x = ops::kernels::Narrow(Random({2, seq, kDim}, 300 + 10 * step + dp_index), 1,
                                            range.offset, range.length);
      const Tensor up = ops::kernels::Narrow(Random({2, seq, kDim}, 400 + 10 * step + dp_index),
                                             1, range.offset, range.length);
      optim.zero_grad();
      CommDebugMode comm_mode;
      Tensor y = (*model)(x).tensor();
      comm_mode.exit();
      EXPECT_EQ(comm_mode.get_comm_counts(), want_forward) << "forward, step " << step;
      comm_mode.enter();
      sum(mul(y, up)).backward();
      comm_mode.exit();
      EXPECT_EQ(comm_mode.get_comm_counts(), want_backward) << "backward, step " << step;
      ExpectClose(y, ops::kernels::Narrow(ref_out_here, 1, range.offset, range.length),
                  "output rows, step " + std::to_string(step));
      for (const auto& [name, param] : model->named_parameters()) {
        const FsdpParam* fsdp_param = LookupFsdpParam(param);
        ASSERT_NE(fsdp_param, nullptr) << name;
        ASSERT_TRUE(fsdp_param->is_dtensor()) << name;
        ExpectClose(fsdp_param->full_grad(), reference->get_parameter(name).grad(),
                    name + " full gradient, step " + std::to_string(step));
        ExpectClose(param.grad(),
                    NestedPiece(reference->get_parameter(name).grad(),
                                fsdp_param->tp_sharding()->tp_placement, tp,
                                mesh_2d->get_local_rank(1), dp, dp_index),
                    name + ".grad shard, step " + std::to_string(step));
      }
      ref_optim.step();
      optim.step();
      for (const auto& [name, param] : model->named_parameters()) {
        ExpectClose(LookupFsdpParam(param)->full_tensor(), reference->get_parameter(name),
                    name + " full_tensor() after step " + std::to_string(step));
      }
    }
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

// fully_shard given the 2-D mesh instead of mesh_2d["dp"], or a mesh whose groups are not two
// dims of one parent with the TP mesh, fails naming the parameter and the meshes.
TEST(FsdpTpTest, RejectsMeshesThatAreNotTheDpSubmesh) {
  auto results = fakes::RunRanks(4, [](fakes::RankEnv& env) {
    auto mesh_2d = DeviceMesh::Init(env.pg, "cpu", {2, 2}, {"dp", "tp"});
    auto make = [&] {
      auto model = std::make_shared<nn::MLP>(4);
      tensor_parallel::parallelize_module(
          *model, (*mesh_2d)["tp"],
          {{"in_proj", std::make_shared<ColwiseParallel>()},
           {"out_proj", std::make_shared<RowwiseParallel>()}});
      return model;
    };
    FullyShardOptions two_d;
    two_d.mesh = mesh_2d;
    try {
      fully_shard(make(), two_d);
      ADD_FAILURE() << "fully_shard on the 2-D mesh did not fail";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("in_proj.weight"), std::string::npos) << what;
      EXPECT_NE(what.find("mesh_2d[\"dp\"]"), std::string::npos) << what;
      EXPECT_NE(what.find("'tp'"), std::string::npos) << what;
    }
    FullyShardOptions world_group;  // the default (world) group: not orthogonal to tp
    try {
      fully_shard(make(), world_group);
      ADD_FAILURE() << "fully_shard over the world group did not fail";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("FSDP requires the DP and TP mesh to have the same "
                                           "parent mesh"),
                std::string::npos)
          << e.what();
    }
    // A mesh whose dims do not multiply to the world size.
    try {
      DeviceMesh::Init(env.pg, "cpu", {3, 2}, {"dp", "tp"});
      ADD_FAILURE() << "a (3, 2) mesh over 4 ranks did not fail";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("4"), std::string::npos) << e.what();
    }
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

}  // namespace
}  // namespace fsdp::fsdp2
