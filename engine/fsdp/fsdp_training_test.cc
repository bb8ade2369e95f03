// fully_shard training behaviour over the threaded process group (seed 002,
// test_fully_shard_autograd.py, and docs/fsdp-behaviour.md, "Mixed precision", "Explicit
// prefetch", "Runtime switches", "Post-accumulate-grad hooks"): unused forward
// outputs and modules (parity with a replicated reference through check_sharded_parity),
// post-accumulate-grad hooks once per parameter and optimizer-in-backward parity, a training
// parity smoke test, gradient accumulation without sync, mixed precision, CPU offload,
// explicit forward/backward prefetch lists and the runtime switches.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/autograd/variable.h"
#include "engine/distributed/comm_debug_mode.h"
#include "engine/fsdp/fully_shard.h"
#include "engine/fsdp/observer.h"
#include "engine/functional/functional.h"
#include "engine/nn/layers.h"
#include "engine/nn/models.h"
#include "engine/optim/adam.h"
#include "engine/optim/sgd.h"
#include "engine/testing/parity.h"
#include "fakes/run_ranks.h"

namespace fsdp::fakes {
namespace {

using fsdp2::EventKind;
using fsdp2::FsdpEvent;
using fsdp2::ReshardAfterForward;
using fsdp2::TrainingState;

fsdp2::FullyShardOptions Raf(ReshardAfterForward raf) {
  fsdp2::FullyShardOptions options;
  options.reshard_after_forward = raf;
  return options;
}

class FsdpAutograd : public ::testing::TestWithParam<ReshardAfterForward> {};

TEST_P(FsdpAutograd, UnusedForwardOutput) {
  // `_test_unused_forward_output`: lin1 and the root (holding lin2) sharded; the first
  // iterations use both outputs, later ones only the first (lin2 gets no gradient).
  const ReshardAfterForward raf = GetParam();
  auto results = RunRanks(4, [&](RankEnv& env) {
    const int64_t local_batch_size = 2;
    const int64_t dim = 24;
    const int64_t global_batch_size = env.world_size * local_batch_size;
    auto model = std::make_shared<nn::DoubleLinear>(dim, true);
    nn::ModulePtr ref_model = model->deep_copy();
    fsdp2::fully_shard(model->child("lin1"), Raf(raf));
    fsdp2::fully_shard(model, Raf(raf));
    optim::Adam ref_optim(ref_model->parameters(), optim::AdamOptions{.lr = 1e-2});
    optim::Adam optim(model->parameters(), optim::AdamOptions{.lr = 1e-2});
    for (int iter = 0; iter < 6; ++iter) {
      const Tensor global_inp = Tensor::rand({global_batch_size, dim});
      const Tensor local_inp =
          global_inp.narrow(0, env.rank * local_batch_size, local_batch_size).clone();
      nn::Value out = (*model)(local_inp);
      Tensor loss = iter < 3 ? sum(out[0].tensor() * out[1].tensor()) : sum(out[0].tensor());
      loss.backward();
      optim.step();
      nn::Value ref_out = (*ref_model)(global_inp);
      Tensor ref_loss =
          iter < 3 ? sum(ref_out[0].tensor() * ref_out[1].tensor()) : sum(ref_out[0].tensor());
      ref_loss.backward();
      fsdp2::DivideGrads(*ref_model, env.world_size);
      ref_optim.step();
      EXPECT_NEAR(fsdp2::AllReduceSum(*env.pg, loss.item()), ref_loss.item(), 1e-4)
          << "iter " << iter;
      optim.zero_grad(iter % 2 == 1);
      ref_optim.zero_grad(iter % 2 == 1);
      const std::string parity = fsdp2::CheckShardedParity(*ref_model, *model);
      EXPECT_TRUE(parity.empty()) << "iter " << iter << "\n" << parity;
    }
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

TEST_P(FsdpAutograd, UnusedForwardModule) {
  // `_test_unused_forward_module`: lin2 never runs forward; its group is never unsharded and
  // the end-of-backward sweep skips it.
  const ReshardAfterForward raf = GetParam();
  auto results = RunRanks(4, [&](RankEnv& env) {
    const int64_t local_batch_size = 2;
    const int64_t dim = 24;
    const int64_t global_batch_size = env.world_size * local_batch_size;
    auto model = std::make_shared<nn::DoubleLinear>(dim, false);
    nn::ModulePtr ref_model = model->deep_copy();
    fsdp2::fully_shard(model->child("lin1"), Raf(raf));
    fsdp2::fully_shard(model->child("lin2"), Raf(raf));
    fsdp2::fully_shard(model, Raf(raf));
    optim::Adam ref_optim(ref_model->parameters(), optim::AdamOptions{.lr = 1e-2});
    optim::Adam optim(model->parameters(), optim::AdamOptions{.lr = 1e-2});
    for (int iter = 0; iter < 6; ++iter) {
      const Tensor global_inp = Tensor::rand({global_batch_size, dim});
      const Tensor local_inp =
          global_inp.narrow(0, env.rank * local_batch_size, local_batch_size).clone();
      Tensor ref_loss = sum((*ref_model)(global_inp).tensor());
      ref_loss.backward();
      Tensor loss = sum((*model)(local_inp).tensor());
      loss.backward();
      fsdp2::DivideGrads(*ref_model, env.world_size);
      EXPECT_NEAR(fsdp2::AllReduceSum(*env.pg, loss.item()), ref_loss.item(), 1e-4)
          << "iter " << iter;
      const std::string parity = fsdp2::CheckShardedParity(*ref_model, *model);
      EXPECT_TRUE(parity.empty()) << "iter " << iter << "\n" << parity;
      for (optim::Optimizer* o : {static_cast<optim::Optimizer*>(&optim),
                                  static_cast<optim::Optimizer*>(&ref_optim)}) {
        o->step();
        o->zero_grad(iter % 2 == 1);
      }
    }
    EXPECT_FALSE(fsdp2::FSDPModule(model->child("lin2")).param_group()->has_pending_all_gather());
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

std::string RafName(const ReshardAfterForward& raf) {
  if (const bool* b = std::get_if<bool>(&raf)) return *b ? "True" : "False";
  return std::to_string(std::get<int>(raf));
}

INSTANTIATE_TEST_SUITE_P(Fsdp, FsdpAutograd,
                         ::testing::Values(ReshardAfterForward(true), ReshardAfterForward(false),
                                           ReshardAfterForward(2)),
                         [](const auto& info) { return "Raf" + RafName(info.param); });

TEST(FsdpPostAccGradHook, RunsOncePerParam) {
  // test_post_acc_grad_hook_runs: MLP(8) with in_proj, out_proj and the root sharded.
  auto results = RunRanks(2, [](RankEnv& env) {
    auto model = std::make_shared<nn::MLP>(8);
    for (const char* name : {"in_proj", "out_proj"}) fsdp2::fully_shard(model->child(name));
    fsdp2::fully_shard(model);
    std::map<std::string, int> counts;
    for (const auto& [name, param] : model->named_parameters()) {
      autograd::register_post_accumulate_grad_hook(
          param, [&counts, name = name](const Tensor&) { ++counts[name]; });
    }
    sum((*model)(Tensor::randn({2, 8})).tensor()).backward();
    const auto named = model->named_parameters();
    EXPECT_EQ(counts.size(), named.size());
    for (const auto& [name, param] : named) EXPECT_EQ(counts[name], 1) << name;
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

TEST(FsdpPostAccGradHook, OptimizerInBackwardParity) {
  // test_post_acc_grad_hook_optim_parity: per-parameter AdamW steps inside the hooks give the
  // same losses and parameters as a normal optimizer loop (dropout off).
  auto results = RunRanks(2, [](RankEnv& env) {
    nn::ModelArgs args;
    args.dropout_p = 0.0;
    auto model = std::make_shared<nn::Transformer>(args);
    auto ref_model = std::static_pointer_cast<nn::Transformer>(model->deep_copy());
    for (const auto& layer : ref_model->layers()) fsdp2::fully_shard(layer);
    fsdp2::fully_shard(ref_model);
    optim::AdamW ref_optim(ref_model->parameters(), optim::AdamWOptions{.lr = 1e-2});
    for (const auto& layer : model->layers()) fsdp2::fully_shard(layer);
    fsdp2::fully_shard(model);
    std::vector<std::unique_ptr<optim::AdamW>> optims;
    for (const Tensor& p : model->parameters()) {
      optims.push_back(std::make_unique<optim::AdamW>(std::vector<Tensor>{p},
                                                      optim::AdamWOptions{.lr = 1e-2}));
      optim::AdamW* o = optims.back().get();
      autograd::register_post_accumulate_grad_hook(p, [o](const Tensor&) {
        o->step();
        o->zero_grad();
      });
    }
    const Tensor inp = Tensor::randint(0, args.vocab_size, {2, 16});
    for (int i = 0; i < 4; ++i) {
      Tensor ref_loss = sum((*ref_model)(inp).tensor());
      ref_loss.backward();
      ref_optim.step();
      ref_optim.zero_grad();
      Tensor loss = sum((*model)(inp).tensor());
      loss.backward();
      EXPECT_EQ(ref_loss.item(), loss.item()) << "iter " << i;
      const auto ref_params = ref_model->parameters();
      const auto params = model->parameters();
      for (size_t j = 0; j < params.size(); ++j) {
        EXPECT_EQ(ref_params[j].to_doubles(), params[j].to_doubles()) << "iter " << i;
      }
    }
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

// A few SGD steps of an MLP sharded over `world` ranks against the same model unsharded,
// returning nothing; every comparison is an EXPECT inside.
using OptionsFactory = std::function<fsdp2::FullyShardOptions(RankEnv&)>;

void TrainParity(int world, const OptionsFactory& make_options, int steps, double tol,
                 bool no_sync_microbatches = false) {
  auto results = RunRanks(world, [&](RankEnv& env) {
    const fsdp2::FullyShardOptions options = make_options(env);
    const int64_t dim = 8;
    const int64_t local_batch = 3;
    auto model = std::make_shared<nn::MLP>(dim, true, false, 3);  // uneven: 24 rows
    nn::ModulePtr ref_model = model->deep_copy();
    for (const char* name : {"in_proj", "out_proj"}) fsdp2::fully_shard(model->child(name), options);
    fsdp2::FSDPModule root = fsdp2::fully_shard(model, options);
    optim::SGD optim(model->parameters(), optim::SGDOptions{.lr = 0.1});
    optim::SGD ref_optim(ref_model->parameters(), optim::SGDOptions{.lr = 0.1});
    fsdp2::ParityOptions parity_options;
    parity_options.atol = tol;
    parity_options.rtol = tol;
    for (int step = 0; step < steps; ++step) {
      const int micro = no_sync_microbatches ? 2 : 1;
      double loss_sum = 0.0;
      double ref_loss_sum = 0.0;
      for (int m = 0; m < micro; ++m) {
        const Tensor global_inp = Tensor::randn({world * local_batch, dim});
        const Tensor local_inp = global_inp.narrow(0, env.rank * local_batch, local_batch).clone();
        if (no_sync_microbatches) root.set_requires_gradient_sync(m == micro - 1);
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
      optim.step();
      ref_optim.step();
      optim.zero_grad();
      ref_optim.zero_grad();
    }
    const std::string parity = fsdp2::CheckShardedParity(*ref_model, *model, parity_options);
    EXPECT_TRUE(parity.empty()) << parity;
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

void TrainParity(int world, const fsdp2::FullyShardOptions& options, int steps, double tol,
                 bool no_sync_microbatches = false) {
  TrainParity(world, [&](RankEnv&) { return options; }, steps, tol, no_sync_microbatches);
}

TEST(FsdpTrainingParity, MlpSgdWorld2) { TrainParity(2, fsdp2::FullyShardOptions{}, 4, 1e-5); }

TEST(FsdpTrainingParity, MlpSgdWorlds1And3) {
  TrainParity(1, fsdp2::FullyShardOptions{}, 2, 1e-5);
  TrainParity(3, fsdp2::FullyShardOptions{}, 2, 1e-5);
}

TEST(FsdpTrainingParity, GradientAccumulationWithoutSync) {
  // set_requires_gradient_sync(False) on the first microbatch: no reduce-scatter; the second
  // reduces the accumulated unsharded grads (docs/fsdp-behaviour.md, "Runtime switches").
  TrainParity(2, fsdp2::FullyShardOptions{}, 2, 1e-5, /*no_sync_microbatches=*/true);
  fsdp2::FullyShardOptions mp;
  mp.mp_policy.reduce_dtype = DType::kFloat64;  // accumulated grad upcast to the reduce dtype
  TrainParity(2, mp, 2, 1e-5, /*no_sync_microbatches=*/true);
}

TEST(FsdpTrainingParity, CpuOffloadAndReshardAfterForwardInt) {
  fsdp2::FullyShardOptions offload;
  offload.offload_policy = fsdp2::OffloadPolicy::CPUOffload();
  TrainParity(2, offload, 2, 1e-5);
  TrainParity(4, Raf(2), 2, 1e-5);
}

TEST(FsdpTrainingParity, HsdpOn2x2Mesh) {
  // HSDP: reduce-scatter over the shard dim, all-reduce over the replicate dim.
  TrainParity(
      4,
      [](RankEnv& env) {
        fsdp2::FullyShardOptions options;
        options.mesh = distributed::DeviceMesh::Init(env.pg, "cpu", {2, 2});
        return options;
      },
      2, 1e-5);
}

TEST(FsdpMixedPrecision, ParamReduceAndOutputDtypes) {
  // param_dtype bf16: unsharded params and compute in bf16, sharded params and grads stay f32;
  // output_dtype f32 casts the output; results close to the f32 reference.
  auto results = RunRanks(2, [](RankEnv& env) {
    auto model = std::make_shared<nn::MLP>(8);
    nn::ModulePtr ref_model = model->deep_copy();
    fsdp2::FullyShardOptions options;
    options.mp_policy.param_dtype = DType::kBFloat16;
    options.mp_policy.reduce_dtype = DType::kFloat32;
    options.mp_policy.output_dtype = DType::kFloat32;
    fsdp2::fully_shard(model->child("in_proj"), options);
    fsdp2::FSDPModule root = fsdp2::fully_shard(model, options);
    const Tensor global_inp = Tensor::randn({4, 8});
    const Tensor local_inp = global_inp.narrow(0, 2 * env.rank, 2).clone();
    Tensor out = (*model)(local_inp).tensor();
    EXPECT_EQ(out.dtype(), DType::kFloat32);
    auto* in_proj = fsdp2::FSDPModule(model->child("in_proj")).param_group();
    EXPECT_EQ(in_proj->fsdp_params()[0]->unsharded_param().dtype(), DType::kBFloat16);
    EXPECT_EQ(in_proj->fsdp_params()[0]->param_dtype(), DType::kBFloat16);
    EXPECT_FALSE(in_proj->fsdp_params()[0]->reduce_dtype().has_value() &&
                 *in_proj->fsdp_params()[0]->reduce_dtype() != DType::kFloat32);
    sum(out).backward();
    Tensor ref_loss = sum((*ref_model)(global_inp).tensor());
    ref_loss.backward();
    fsdp2::DivideGrads(*ref_model, 2);
    for (const auto& [name, p] : model->named_parameters()) {
      EXPECT_EQ(p.dtype(), DType::kFloat32) << name;
      ASSERT_TRUE(p.grad().defined()) << name;
      EXPECT_EQ(p.grad().dtype(), DType::kFloat32) << name;
    }
    fsdp2::ParityOptions loose;
    loose.atol = 5e-2;
    loose.rtol = 5e-2;
    const std::string parity = fsdp2::CheckShardedParity(*ref_model, *model, loose);
    EXPECT_TRUE(parity.empty()) << parity;
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

// ---- Explicit prefetch and switches --------------------------------------------------------

std::shared_ptr<nn::Transformer> ShardedTransformer(int64_t n_layers, double dropout_p = 0.1) {
  nn::ModelArgs args;
  args.n_layers = n_layers;
  args.dropout_p = dropout_p;
  auto model = std::make_shared<nn::Transformer>(args);
  for (const auto& layer : model->layers()) fsdp2::fully_shard(layer);
  fsdp2::fully_shard(model);
  return model;
}

FsdpEvent E(EventKind kind, const std::string& fqn, TrainingState state) {
  return {kind, fqn, state};
}

TEST(FsdpExplicitPrefetch, ForwardOneAheadAndBackwardTwoBehind) {
  // docs/fsdp-behaviour.md, "Explicit prefetch", with the E3 root (never resharded after
  // forward, so no `reshard root` in forward
  // and no `unshard root` in backward).
  auto results = RunRanks(2, [](RankEnv& env) {
    auto model = ShardedTransformer(4);
    const auto layers = model->layers();
    for (size_t i = 0; i + 1 < layers.size(); ++i) {
      fsdp2::FSDPModule(layers[i]).set_modules_to_forward_prefetch({layers[i + 1]});
    }
    for (size_t i = 0; i < layers.size(); ++i) {
      std::vector<nn::ModulePtr> targets;
      if (i >= 1) targets.push_back(layers[i - 1]);
      if (i >= 2) targets.push_back(layers[i - 2]);
      fsdp2::FSDPModule(layers[i]).set_modules_to_backward_prefetch(targets);
    }
    const Tensor inp = Tensor::randint(0, 8, {2, 16});
    fsdp2::RecordingObserver observer;
    fsdp2::ScopedObserver install(observer);
    const std::set<EventKind> kinds = {EventKind::kUnshard, EventKind::kReshard,
                                       EventKind::kPostBackward};
    const auto U = EventKind::kUnshard;
    const auto R = EventKind::kReshard;
    const auto P = EventKind::kPostBackward;
    const auto F = TrainingState::kForward;
    const auto B = TrainingState::kPreBackward;
    const auto PB = TrainingState::kPostBackward;
    Tensor loss = (*model)(inp).tensor();
    EXPECT_EQ(observer.events(kinds),
              (std::vector<FsdpEvent>{E(U, "", F), E(U, "layers.0", F), E(U, "layers.1", F),
                                      E(R, "layers.0", F), E(U, "layers.2", F),
                                      E(R, "layers.1", F), E(U, "layers.3", F),
                                      E(R, "layers.2", F), E(R, "layers.3", F)}))
        << fsdp2::EventsStr(observer.events(kinds));
    observer.clear();
    sum(loss).backward();
    EXPECT_EQ(observer.events(kinds),
              (std::vector<FsdpEvent>{
                  E(U, "layers.3", B), E(U, "layers.2", B), E(U, "layers.1", B),
                  E(R, "layers.3", PB), E(P, "layers.3", PB), E(U, "layers.0", B),
                  E(R, "layers.2", PB), E(P, "layers.2", PB), E(R, "layers.1", PB),
                  E(P, "layers.1", PB), E(R, "layers.0", PB), E(P, "layers.0", PB),
                  E(R, "", PB), E(P, "", PB)}))
        << fsdp2::EventsStr(observer.events(kinds));
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

TEST(FsdpSwitches, ReshardAfterBackwardUnshardInBackwardAndDivideFactor) {
  auto results = RunRanks(2, [](RankEnv& env) {
    auto model = ShardedTransformer(2, /*dropout_p=*/0.0);
    fsdp2::FSDPModule root(model);
    const Tensor inp = Tensor::randint(0, 8, {2, 16});

    // set_reshard_after_backward(False): parameters stay unsharded after backward, so the next
    // forward all-gathers nothing.
    root.set_reshard_after_backward(false);
    sum((*model)(inp).tensor()).backward();
    for (const auto& m : model->modules()) {
      if (fsdp2::IsFsdpModule(*m)) EXPECT_TRUE(fsdp2::FSDPModule(m).param_group()->is_unsharded());
    }
    {
      distributed::CommDebugMode mode;
      Tensor loss = (*model)(inp).tensor();
      EXPECT_EQ(mode.get_count("_allgather_base_"), 0);
      root.set_reshard_after_backward(true);
      sum(loss).backward();
    }

    // set_reshard_after_forward(True) after lazy init also reshards the root after forward.
    root.set_reshard_after_forward(true);
    {
      distributed::CommDebugMode mode;
      Tensor loss = (*model)(inp).tensor();
      mode.exit();
      EXPECT_TRUE(root.param_group()->is_sharded());
      distributed::CommDebugMode bwd;
      sum(loss).backward();
      EXPECT_EQ(bwd.get_count("_allgather_base_"), 3);
    }

    // set_gradient_divide_factor(1): a plain sum (PREMUL_SUM by 1) doubles the grads at W=2.
    model->zero_grad();
    sum((*model)(inp).tensor()).backward();
    std::vector<Tensor> avg_grads;
    for (const Tensor& p : model->parameters()) avg_grads.push_back(p.grad().clone());
    model->zero_grad();
    for (const auto& m : model->modules()) {
      if (fsdp2::IsFsdpModule(*m)) fsdp2::FSDPModule(m).set_gradient_divide_factor(1.0);
    }
    {
      distributed::CommDebugMode mode;
      sum((*model)(inp).tensor()).backward();
      for (const auto& rec : mode.records()) {
        if (rec.op == "c10d._reduce_scatter_base_") {
          EXPECT_EQ(rec.info.reduce_op, distributed::ReduceOp::kPremulSum);
        }
      }
    }
    const auto params = model->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      const auto a = avg_grads[i].to_doubles();
      const auto s = params[i].grad().to_doubles();
      for (size_t j = 0; j < a.size(); ++j) EXPECT_NEAR(s[j], 2 * a[j], 1e-4 * (1 + std::fabs(a[j])));
    }
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

TEST(FsdpSwitches, ModulesWithoutParametersAndTiedWeights) {
  auto results = RunRanks(2, [](RankEnv& env) {
    auto model = ShardedTransformer(2);
    // output.weight is tok_embeddings.weight: one FsdpParam with a shared location.
    auto* root_group = fsdp2::FSDPModule(model).param_group();
    ASSERT_EQ(root_group->fsdp_params().size(), 4u);
    const auto& tok = root_group->fsdp_params()[0];
    EXPECT_EQ(tok->module_info().shared_param_names, (std::vector<std::string>{"weight"}));
    EXPECT_TRUE(model->child("output")->parameter("weight").is_same(tok->sharded_param()));
    const Tensor inp = Tensor::randint(0, 8, {2, 16});
    Tensor loss = (*model)(inp).tensor();
    EXPECT_TRUE(model->child("output")->parameter("weight").is_same(tok->unsharded_param()));
    sum(loss).backward();
    EXPECT_TRUE(model->child("output")->parameter("weight").is_same(tok->sharded_param()));
    EXPECT_EQ(tok->fqn(), "tok_embeddings.weight");
    EXPECT_EQ(root_group->module_fqn(), "");
    EXPECT_EQ(fsdp2::FSDPModule(model->layers()[1]).param_group()->module_fqn(), "layers.1");
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

}  // namespace
}  // namespace fsdp::fakes
