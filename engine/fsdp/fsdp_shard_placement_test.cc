// fully_shard's shard_placement_fn on the threaded process group (PyTorch's
// test_fully_shard_training.py, TestFullyShardShardPlacementFn*; docs/fsdp-behaviour.md,
// "shard_placement_fn"): training parity against the replicated model with every parameter
// sharded on its largest evenly divisible dim (LargestEvenShardDim) at worlds 2, 3 and 4, the
// same with reshard_after_forward False / int, CPU offload, HSDP, mixed precision, gradient
// accumulation and fully_shard([m1, m2]); sharded parameters and gradients are this rank's torch.chunk piece along the
// chosen dim (shapes, values and state_dict offsets derived from ComputeShardInfo); a state
// dict round trip; the errors (uneven dim > 0, dim out of range, a non-Shard placement).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <string>

#include "engine/core/bitwise_equal.h"
#include "engine/distributed/device_mesh.h"
#include "engine/fsdp/fsdp_param.h"
#include "engine/fsdp/fully_shard.h"
#include "engine/fsdp/shard_layout.h"
#include "engine/functional/functional.h"
#include "engine/nn/models.h"
#include "engine/ops/shape_ops.h"
#include "engine/optim/adam.h"
#include "engine/testing/parity.h"
#include "fakes/run_ranks.h"

namespace fsdp::fakes {
namespace {

using tensor_parallel::Placement;

// dim 24 and 4 heads: the model dims (24, 96) divide by 2, 3 and 4, the vocabulary (7) by none.
nn::ModelArgs Args() {
  nn::ModelArgs args;
  args.n_layers = 3;
  args.vocab_size = 7;
  args.dim = 24;
  args.dropout_p = 0.0;
  return args;
}

fsdp2::ShardPlacementFn LargestDim(int world) {
  return [world](const Tensor& param) -> std::optional<Placement> {
    return Placement::Shard(fsdp2::LargestEvenShardDim(param.sizes(), world));
  };
}

using OptionsFactory = std::function<fsdp2::FullyShardOptions(RankEnv&)>;

// test_train_parity_shard_placement_fn_shard_largest_dim: every block and the root sharded
// with the largest-dim placement; the full parameters equal the reference's before and after
// `steps` AdamW steps, losses and step shards match on every step. With `accumulate`, each
// step runs two microbatches, the first without gradient sync.
void TrainParity(int world, const OptionsFactory& make_options, int steps, double tol,
                 bool accumulate = false) {
  auto results = RunRanks(world, [&](RankEnv& env) {
    fsdp2::FullyShardOptions options = make_options(env);
    options.shard_placement_fn = LargestDim(options.mesh ? options.mesh->size(-1) : world);
    auto model = std::make_shared<nn::Transformer>(Args());
    auto ref_model = std::static_pointer_cast<nn::Transformer>(model->deep_copy());
    for (const auto& layer : model->layers()) fsdp2::fully_shard(layer, options);
    fsdp2::FSDPModule root = fsdp2::fully_shard(model, options);
    int non_zero_dims = 0;
    for (const Tensor& p : model->parameters()) {
      non_zero_dims += fsdp2::LookupFsdpParam(p)->shard_info().shard_dim != 0;
    }
    EXPECT_GT(non_zero_dims, 0) << "no parameter sharded on a dim > 0";
    const auto ref_params = ref_model->parameters();
    const auto params = model->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_TRUE(BitwiseEqual(fsdp2::LookupFsdpParam(params[i])->full_tensor(), ref_params[i]));
    }
    optim::AdamW optim(params, optim::AdamWOptions{.lr = 1e-2});
    optim::AdamW ref_optim(ref_params, optim::AdamWOptions{.lr = 1e-2});
    fsdp2::ParityOptions parity_options;
    parity_options.atol = tol;
    parity_options.rtol = tol;
    const int64_t local_batch = 2;
    const int micro = accumulate ? 2 : 1;
    for (int step = 0; step < steps; ++step) {
      double loss_sum = 0.0;
      double ref_loss_sum = 0.0;
      for (int m = 0; m < micro; ++m) {
        const Tensor global_inp = Tensor::randint(0, Args().vocab_size, {world * local_batch, 8});
        const Tensor local_inp =
            global_inp.narrow(0, env.rank * local_batch, local_batch).clone();
        if (accumulate) root.set_requires_gradient_sync(m == micro - 1);
        Tensor loss = sum((*model)(local_inp).tensor());
        loss.backward();
        loss_sum += fsdp2::AllReduceSum(*env.pg, loss.item());
        Tensor ref_loss = sum((*ref_model)(global_inp).tensor());
        ref_loss.backward();
        ref_loss_sum += ref_loss.item();
      }
      fsdp2::DivideGrads(*ref_model, world);
      EXPECT_NEAR(loss_sum, ref_loss_sum, tol * (1 + std::fabs(ref_loss_sum))) << "step " << step;
      const std::string parity = fsdp2::CheckShardedParity(*ref_model, *model, parity_options);
      EXPECT_TRUE(parity.empty()) << "step " << step << "\n" << parity;
      for (const Tensor& p : params) {
        const fsdp2::FsdpParam* fp = fsdp2::LookupFsdpParam(p);
        ASSERT_TRUE(p.grad().defined()) << fp->fqn();
        EXPECT_EQ(p.grad().sizes(), fp->shard_info().sharded_shape) << fp->fqn();
      }
      optim.step();
      ref_optim.step();
      optim.zero_grad();
      ref_optim.zero_grad();
    }
    for (size_t i = 0; i < params.size(); ++i) {
      const Tensor full = fsdp2::LookupFsdpParam(params[i])->full_tensor();
      EXPECT_EQ(full.sizes(), ref_params[i].sizes());
      const std::vector<double> a = full.to_doubles();
      const std::vector<double> e = ref_params[i].to_doubles();
      for (size_t j = 0; j < a.size(); ++j) {
        ASSERT_NEAR(a[j], e[j], tol * (1 + std::fabs(e[j]))) << "parameter " << i << "[" << j << "]";
      }
    }
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

fsdp2::FullyShardOptions Defaults(RankEnv&) { return {}; }

class FsdpShardPlacementParity : public ::testing::TestWithParam<int> {};

TEST_P(FsdpShardPlacementParity, ShardLargestDim) { TrainParity(GetParam(), Defaults, 3, 1e-5); }

INSTANTIATE_TEST_SUITE_P(Worlds, FsdpShardPlacementParity, ::testing::Values(2, 3, 4));

TEST(FsdpShardPlacement, ReshardAfterForwardFalseAndInt) {
  TrainParity(2, [](RankEnv&) {
    fsdp2::FullyShardOptions o;
    o.reshard_after_forward = false;
    return o;
  }, 2, 1e-5);
  // int 2 on 4 ranks: the post-forward shard of a dim > 0 parameter is a flat slice of the
  // unsharded parameter, all-gathered back without a chunk-cat.
  TrainParity(4, [](RankEnv&) {
    fsdp2::FullyShardOptions o;
    o.reshard_after_forward = fsdp2::ReshardAfterForward(2);
    return o;
  }, 2, 1e-5);
}

TEST(FsdpShardPlacement, CpuOffloadHsdpAndGradientAccumulation) {
  TrainParity(2, [](RankEnv&) {
    fsdp2::FullyShardOptions o;
    o.offload_policy = fsdp2::OffloadPolicy::CPUOffload();
    return o;
  }, 2, 1e-5);
  TrainParity(4, [](RankEnv& env) {
    fsdp2::FullyShardOptions o;
    o.mesh = distributed::DeviceMesh::Init(env.pg, "cpu", {2, 2});
    return o;
  }, 2, 1e-5);
  TrainParity(2, Defaults, 2, 1e-5, /*accumulate=*/true);
}

TEST(FsdpShardPlacement, MixedPrecisionMatchesDim0Sharding) {
  // bf16 compute is far from the f32 replicated reference, so the reference here is the same
  // model sharded on dim 0 with the same policy: the unsharded bf16 parameters and the
  // per-element reduce-scatter sums are the same, so losses, gradients and parameters are
  // bitwise equal.
  auto results = RunRanks(2, [](RankEnv& env) {
    fsdp2::FullyShardOptions options;
    options.mp_policy.param_dtype = DType::kBFloat16;
    options.mp_policy.reduce_dtype = DType::kFloat32;
    auto dim0 = std::make_shared<nn::Transformer>(Args());
    auto model = std::static_pointer_cast<nn::Transformer>(dim0->deep_copy());
    for (const auto& layer : dim0->layers()) fsdp2::fully_shard(layer, options);
    fsdp2::fully_shard(dim0, options);
    options.shard_placement_fn = LargestDim(env.world_size);
    for (const auto& layer : model->layers()) fsdp2::fully_shard(layer, options);
    fsdp2::fully_shard(model, options);
    optim::AdamW o0(dim0->parameters(), optim::AdamWOptions{.lr = 1e-2});
    optim::AdamW o1(model->parameters(), optim::AdamWOptions{.lr = 1e-2});
    const auto p0 = dim0->parameters();
    const auto p1 = model->parameters();
    for (int step = 0; step < 2; ++step) {
      const Tensor inp = Tensor::randint(0, Args().vocab_size, {2, 8});
      Tensor l0 = sum((*dim0)(inp).tensor());
      Tensor l1 = sum((*model)(inp).tensor());
      EXPECT_EQ(l0.item(), l1.item()) << "step " << step;
      l0.backward();
      l1.backward();
      for (size_t i = 0; i < p0.size(); ++i) {
        const auto* f0 = fsdp2::LookupFsdpParam(p0[i]);
        const auto* f1 = fsdp2::LookupFsdpParam(p1[i]);
        EXPECT_TRUE(BitwiseEqual(f0->full_grad(), f1->full_grad())) << f1->fqn();
      }
      o0.step();
      o1.step();
      o0.zero_grad();
      o1.zero_grad();
    }
    for (size_t i = 0; i < p0.size(); ++i) {
      EXPECT_TRUE(BitwiseEqual(fsdp2::LookupFsdpParam(p0[i])->full_tensor(),
                               fsdp2::LookupFsdpParam(p1[i])->full_tensor()));
    }
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

TEST(FsdpShardPlacement, ContiguousParamsAndGradsOnShard1) {
  // test_shard_placement_fn_contiguous_params_grads: Shard(1) for matrices, Shard(0) else;
  // the sharded parameters and gradients are contiguous torch.chunk pieces along that dim
  // with placement Shard(1), and the unsharded parameters have the original shapes.
  auto results = RunRanks(2, [](RankEnv& env) {
    const int64_t dim = 4;
    auto model = std::make_shared<nn::MLP>(dim);
    nn::ModulePtr ref_model = model->deep_copy();
    fsdp2::FullyShardOptions options;
    options.shard_placement_fn = [](const Tensor& p) -> std::optional<Placement> {
      return Placement::Shard(p.dim() > 1 ? 1 : 0);
    };
    fsdp2::fully_shard(model->child("in_proj"), options);
    fsdp2::fully_shard(model->child("out_proj"), options);
    fsdp2::fully_shard(model, options);
    for (const auto& [name, p] : model->named_parameters()) {
      const fsdp2::FsdpParam* fp = fsdp2::LookupFsdpParam(p);
      ASSERT_NE(fp, nullptr) << name;
      EXPECT_EQ(fp->fsdp_placement(), Placement::Shard(p.dim() > 1 ? 1 : 0)) << name;
      const fsdp2::ShardInfo want = fsdp2::ComputeShardInfo(
          fp->global_shape(), env.rank, env.world_size, fp->shard_info().shard_dim);
      EXPECT_EQ(p.sizes(), want.sharded_shape) << name;
    }
    const Tensor global_inp = Tensor::randn({2 * env.world_size, dim});
    const Tensor local_inp = global_inp.narrow(0, 2 * env.rank, 2).clone();
    sum((*model)(local_inp).tensor()).backward();
    sum((*ref_model)(global_inp).tensor()).backward();
    fsdp2::DivideGrads(*ref_model, env.world_size);
    for (const auto& [name, p] : model->named_parameters()) {
      ASSERT_TRUE(p.grad().defined()) << name;
      EXPECT_EQ(p.grad().sizes(), p.sizes()) << name;
    }
    const std::string parity = fsdp2::CheckShardedParity(*ref_model, *model);
    EXPECT_TRUE(parity.empty()) << parity;
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

TEST(FsdpShardPlacement, GroupOfModulesTrainsLikeTheReplicatedModel) {
  // fully_shard([in_proj, out_proj]) with Shard(1) for matrices: one all-gather and one
  // reduce-scatter over both, the parameters still this rank's pieces along dim 1.
  auto results = RunRanks(4, [](RankEnv& env) {
    const int64_t dim = 8;
    auto model = std::make_shared<nn::MLP>(dim);
    nn::ModulePtr ref_model = model->deep_copy();
    fsdp2::FullyShardOptions options;
    options.shard_placement_fn = [](const Tensor& p) -> std::optional<Placement> {
      return Placement::Shard(p.dim() > 1 ? 1 : 0);
    };
    fsdp2::fully_shard({model->child("in_proj"), model->child("out_proj")}, options);
    fsdp2::fully_shard(model, options);
    optim::Adam optim(model->parameters(), optim::AdamOptions{.lr = 1e-2});
    optim::Adam ref_optim(ref_model->parameters(), optim::AdamOptions{.lr = 1e-2});
    for (int step = 0; step < 3; ++step) {
      const Tensor global_inp = Tensor::randn({2 * env.world_size, dim});
      const Tensor local_inp = global_inp.narrow(0, 2 * env.rank, 2).clone();
      sum((*model)(local_inp).tensor()).backward();
      sum((*ref_model)(global_inp).tensor()).backward();
      fsdp2::DivideGrads(*ref_model, env.world_size);
      const std::string parity = fsdp2::CheckShardedParity(*ref_model, *model);
      EXPECT_TRUE(parity.empty()) << "step " << step << "\n" << parity;
      optim.step();
      ref_optim.step();
      optim.zero_grad();
      ref_optim.zero_grad();
    }
    const std::string parity = fsdp2::CheckShardedParity(*ref_model, *model);
    EXPECT_TRUE(parity.empty()) << parity;
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

TEST(FsdpShardPlacement, StateDictOffsetsAlongTheShardDimAndRoundTrip) {
  auto results = RunRanks(4, [](RankEnv& env) {
    auto make = [&] {
      auto model = std::make_shared<nn::Transformer>(Args());
      fsdp2::FullyShardOptions options;
      options.shard_placement_fn = LargestDim(env.world_size);
      for (const auto& layer : model->layers()) fsdp2::fully_shard(layer, options);
      fsdp2::fully_shard(model, options);
      return model;
    };
    auto model = make();
    nn::StateDict sd = model->state_dict();
    for (const auto& [key, value] : sd) {
      const nn::ShardedEntry* s = sd.sharding(key);
      ASSERT_NE(s, nullptr) << key;
      const int64_t d = fsdp2::LargestEvenShardDim(s->global_shape, env.world_size);
      const fsdp2::ShardInfo info =
          fsdp2::ComputeShardInfo(s->global_shape, env.rank, env.world_size, d);
      Shape offsets(s->global_shape.size(), 0);
      offsets[d] = info.row_begin;
      EXPECT_EQ(s->offsets, offsets) << key;
      EXPECT_EQ(value.sizes(), info.sharded_shape) << key;
    }
    // Round trip: a second sharded model loads the first one's shards and then agrees with it
    // bitwise after a training step of both.
    nn::StateDict saved;
    for (const auto& [k, v] : sd) saved.insert(k, v.clone());
    saved.sharded = sd.sharded;
    auto loaded = make();
    loaded->load_state_dict(saved);
    optim::Adam o1(model->parameters(), optim::AdamOptions{.lr = 1e-2});
    optim::Adam o2(loaded->parameters(), optim::AdamOptions{.lr = 1e-2});
    const Tensor inp = Tensor::randint(0, Args().vocab_size, {2, 8});
    sum((*model)(inp).tensor()).backward();
    sum((*loaded)(inp).tensor()).backward();
    o1.step();
    o2.step();
    const nn::StateDict a = model->state_dict();
    const nn::StateDict b = loaded->state_dict();
    for (const auto& [key, value] : a) EXPECT_TRUE(BitwiseEqual(value, b.at(key))) << key;
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

// The message of the error fully_shard throws for `fn` on an MLP (in_proj 8 → 8 * mult) over
// `world` ranks ("" when it throws none).
std::string FullyShardError(int world, int64_t dim_multiplier, fsdp2::ShardPlacementFn fn) {
  std::string message;
  auto results = RunRanks(world, [&](RankEnv& env) {
    auto model = std::make_shared<nn::MLP>(5, true, false, dim_multiplier);
    fsdp2::FullyShardOptions options;
    options.shard_placement_fn = fn;
    try {
      fsdp2::fully_shard(model->child("in_proj"), options);
    } catch (const Error& e) {
      if (env.rank == 0) message = e.what();
    }
  });
  EXPECT_TRUE(results.all_ok()) << results.summary();
  return message;
}

TEST(FsdpShardPlacement, Errors) {
  // in_proj.weight is [5 * mult, 5]: dim 1 (5) does not divide by 2.
  const std::string uneven =
      FullyShardError(2, 2, [](const Tensor&) { return Placement::Shard(1); });
  EXPECT_NE(uneven.find("FSDP does not support uneven sharding on dim 1: [10, 5] (world size: 2)"),
            std::string::npos) << uneven;
  EXPECT_NE(uneven.find("weight"), std::string::npos) << uneven;
  const std::string out_of_range =
      FullyShardError(2, 2, [](const Tensor&) { return Placement::Shard(2); });
  EXPECT_NE(out_of_range.find("Shard dim 2 is invalid for"), std::string::npos) << out_of_range;
  EXPECT_NE(out_of_range.find("[10, 5]"), std::string::npos) << out_of_range;
  const std::string replicate =
      FullyShardError(2, 2, [](const Tensor&) { return Placement::Replicate(); });
  EXPECT_NE(replicate.find("must return Shard or None"), std::string::npos) << replicate;
  // Negative dims are normalized: Shard(-1) of [10, 5] on 5 ranks is Shard(1); the bias [10]
  // is Shard(0) (-1 + 1).
  EXPECT_EQ(FullyShardError(5, 2, [](const Tensor&) { return Placement::Shard(-1); }), "");
  auto results = RunRanks(5, [](RankEnv&) {
    auto model = std::make_shared<nn::MLP>(5, true, false, 2);
    fsdp2::FullyShardOptions options;
    options.shard_placement_fn = [](const Tensor&) { return Placement::Shard(-1); };
    fsdp2::fully_shard(model->child("in_proj"), options);
    for (const auto& [name, p] : model->child("in_proj")->named_parameters()) {
      EXPECT_EQ(fsdp2::LookupFsdpParam(p)->fsdp_placement(), Placement::Shard(p.dim() - 1))
          << name;
    }
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

}  // namespace
}  // namespace fsdp::fakes
