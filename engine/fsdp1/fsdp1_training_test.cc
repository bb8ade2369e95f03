// FSDP1 training equals unsharded data-parallel training (seed 004, test_fsdp_grad_acc.py, and
// docs/fsdp1.md, "no_sync"): TransformerWithSharedParams wrapped with FSDP1 (encoder and
// decoder layers as nested instances) trains on 2 ranks, accumulating gradients over
// micro-batches inside and outside no_sync(); after every optimizer step its flat parameter
// shards and gradient shards equal the matching chunks of an unsharded replica trained on all
// ranks' micro-batches concatenated (gradients divided by the world size, as FSDP averages).
// Every strategy x use_orig_params x backward_prefetch x no_sync pattern of the seed, the seed's
// CPU-offload variant, and mixed precision, HYBRID_SHARD and forward_prefetch runs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "engine/distributed/device_mesh.h"
#include "engine/fsdp1/fully_sharded_data_parallel.h"
#include "engine/functional/functional.h"
#include "engine/nn/checkpoint.h"
#include "engine/nn/models.h"
#include "engine/optim/sgd.h"
#include "engine/testing/fsdp1_parity.h"
#include "engine/testing/parity.h"
#include "fakes/run_ranks.h"

namespace fsdp::fakes {
namespace {

using fsdp1::BackwardPrefetch;
using fsdp1::ShardingStrategy;
using nn::TransformerWithSharedParams;

// `_GradAccConfig`: num_iters micro-batches inside or outside no_sync().
struct GradAccConfig {
  bool use_no_sync;
  int num_iters;
};

// The seed's two patterns.
const std::vector<std::vector<GradAccConfig>>& SeedConfigs() {
  static const std::vector<std::vector<GradAccConfig>> configs = {
      {{true, 3}, {false, 3}, {true, 3}},
      {{false, 3}, {true, 3}, {false, 3}},
  };
  return configs;
}

std::string ConfigsName(const std::vector<GradAccConfig>& configs) {
  std::string out;
  for (const GradAccConfig& c : configs) out += (c.use_no_sync ? "N" : "S") + std::to_string(c.num_iters);
  return out;
}

// Activation checkpointing of the Transformer layers: none, applied before wrapping (FSDP
// wraps the CheckpointWrapper modules) or after (CheckpointWrapper around the nested FSDP
// instances, whose forward then runs again in backward).
enum class Checkpointing { kNone, kBeforeWrap, kAfterWrap };

struct RunSpec {
  ShardingStrategy strategy = ShardingStrategy::kFullShard;
  bool use_orig_params = false;
  std::optional<BackwardPrefetch> backward_prefetch = BackwardPrefetch::kBackwardPre;
  std::vector<GradAccConfig> configs;
  bool cpu_offload = false;
  bool forward_prefetch = false;
  bool hybrid = false;       // HYBRID_SHARD over a (2, world / 2) mesh
  int world_size = 2;
  int steps = 2;             // optimizer steps, each over every config
  Checkpointing checkpointing = Checkpointing::kNone;
  fsdp2::ParityOptions parity{.rtol = 1e-5, .atol = 1e-5};
};

// A permutation of every tensor's elements (`permute_tensor` of the seed), from `gen`.
nn::Value PermuteBatch(const nn::Value& batch, std::mt19937& gen) {
  std::vector<Tensor> out;
  for (const Tensor& t : batch.tensors()) {
    std::vector<int64_t> values = t.to_int64s();
    std::shuffle(values.begin(), values.end(), gen);
    out.push_back(Tensor::from_int64s(values, t.sizes()));
  }
  return batch.with_tensors(out);
}

// Micro-batch `i` of `rank` (every rank can rebuild every rank's batches).
nn::Value MicroBatch(int rank, int i) {
  // TransformerWithSharedParams.get_input: (arange(12).view(6, 2), arange(8).view(4, 2)).
  const nn::Value base = nn::Value::Tuple({Tensor::arange(12).view({6, 2}), Tensor::arange(8).view({4, 2})});
  std::mt19937 gen(static_cast<uint32_t>(1000 * rank + i));
  return PermuteBatch(base, gen);
}

// Batches concatenated along the batch dimension (dim 1, sequence-first).
nn::Value ConcatBatches(const std::vector<nn::Value>& batches) {
  std::vector<Tensor> src;
  std::vector<Tensor> tgt;
  for (const nn::Value& b : batches) {
    src.push_back(b[0].tensor());
    tgt.push_back(b[1].tensor());
  }
  return nn::Value::Tuple({cat(src, 1), cat(tgt, 1)});
}

std::shared_ptr<fsdp1::FullyShardedDataParallel> WrapTransformer(
    const nn::ModulePtr& model, const RunSpec& spec, const RankEnv& env) {
  fsdp1::FullyShardedDataParallelOptions options;
  options.sharding_strategy = spec.strategy;
  options.use_orig_params = spec.use_orig_params;
  options.backward_prefetch = spec.backward_prefetch;
  options.cpu_offload.offload_params = spec.cpu_offload;
  options.forward_prefetch = spec.forward_prefetch;
  const std::set<std::string> layers = {"TransformerEncoderLayer", "TransformerDecoderLayer"};
  options.auto_wrap_policy = std::make_shared<fsdp1::ModuleWrapPolicy>(layers);
  if (spec.checkpointing == Checkpointing::kBeforeWrap) {
    nn::apply_activation_checkpointing(
        model, [&layers](nn::Module& m) { return layers.count(m.type_name()) > 0; });
    options.auto_wrap_policy =
        std::make_shared<fsdp1::ModuleWrapPolicy>(std::set<std::string>{"CheckpointWrapper"});
  }
  if (spec.hybrid) {
    options.device_mesh = distributed::DeviceMesh::Init(
        env.pg, "cpu", {2, env.world_size / 2}, {"replicate", "shard"});
  }
  auto fsdp_model = std::make_shared<fsdp1::FullyShardedDataParallel>(model, options);
  if (spec.checkpointing == Checkpointing::kAfterWrap) {
    nn::apply_activation_checkpointing(
        fsdp_model, [](nn::Module& m) { return fsdp1::AsFsdp(m) != nullptr; });
  }
  return fsdp_model;
}

// The seed's `_test_grad_acc` against an unsharded replica, for `spec.steps` optimizer steps.
void RunGradAccParity(const RunSpec& spec) {
  auto results = RunRanks(spec.world_size, [&](RankEnv& env) {
    auto model = std::make_shared<TransformerWithSharedParams>(env.rank, /*add_bn=*/false,
                                                               /*deterministic=*/true);
    nn::ModulePtr ref_model = model->deep_copy();
    auto fsdp_model = WrapTransformer(model, spec, env);
    const optim::SGDOptions sgd{.lr = 0.01, .momentum = 0.9};
    optim::SGD optim(fsdp_model->parameters(), sgd);
    optim::SGD ref_optim(ref_model->parameters(), sgd);

    int num_micro_batches = 0;
    for (const GradAccConfig& c : spec.configs) num_micro_batches += c.num_iters;
    for (int step = 0; step < spec.steps; ++step) {
      // FSDP: the configs' micro-batches, the last one always synced.
      double local_loss = 0.0;
      int batch_idx = 0;
      auto run_micro_batch = [&]() {
        const nn::Value batch = MicroBatch(env.rank, step * num_micro_batches + batch_idx++);
        Tensor loss = TransformerWithSharedParams::get_loss(batch, (*fsdp_model)(batch).tensor());
        loss.backward();
        local_loss += loss.item();
      };
      for (const GradAccConfig& config : spec.configs) {
        std::optional<fsdp1::NoSync> no_sync;
        if (config.use_no_sync) no_sync.emplace(fsdp_model->no_sync());
        for (int i = 0; i < config.num_iters && batch_idx < num_micro_batches - 1; ++i) {
          run_micro_batch();
        }
      }
      run_micro_batch();
      // Reference: every rank's micro-batches in one batch; FSDP averages over ranks.
      std::vector<nn::Value> all_batches;
      for (int r = 0; r < env.world_size; ++r) {
        for (int i = 0; i < num_micro_batches; ++i) {
          all_batches.push_back(MicroBatch(r, step * num_micro_batches + i));
        }
      }
      const nn::Value concat = ConcatBatches(all_batches);
      Tensor ref_loss = TransformerWithSharedParams::get_loss(concat, (*ref_model)(concat).tensor());
      ref_loss.backward();
      for (const Tensor& p : ref_model->parameters()) {
        Tensor g = p.grad();
        if (g.defined()) g.copy_(g * (1.0 / env.world_size));
      }
      EXPECT_NEAR(fsdp2::AllReduceSum(*env.pg, local_loss), ref_loss.item(),
                  1e-4 * std::fabs(ref_loss.item()))
          << "step " << step;
      const std::string grad_parity = fsdp1::CheckFlatParamParity(*fsdp_model, *ref_model, spec.parity);
      EXPECT_TRUE(grad_parity.empty()) << "step " << step << " before the optimizer step\n"
                                       << grad_parity;
      optim.step();
      ref_optim.step();
      fsdp2::ParityOptions params_only = spec.parity;
      params_only.check_grads = false;
      const std::string param_parity = fsdp1::CheckFlatParamParity(*fsdp_model, *ref_model, params_only);
      EXPECT_TRUE(param_parity.empty()) << "step " << step << " after the optimizer step\n"
                                        << param_parity;
      optim.zero_grad(/*set_to_none=*/step % 2 == 0);
      ref_optim.zero_grad(/*set_to_none=*/step % 2 == 0);
    }
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

using GradAccParam =
    std::tuple<ShardingStrategy, bool, std::optional<BackwardPrefetch>, int /*configs index*/>;

class Fsdp1GradAcc : public ::testing::TestWithParam<GradAccParam> {};

TEST_P(Fsdp1GradAcc, MatchesUnshardedDataParallel) {
  RunSpec spec;
  std::tie(spec.strategy, spec.use_orig_params, spec.backward_prefetch, std::ignore) = GetParam();
  spec.configs = SeedConfigs().at(static_cast<size_t>(std::get<3>(GetParam())));
  RunGradAccParity(spec);
}

std::string GradAccName(const ::testing::TestParamInfo<GradAccParam>& info) {
  const auto& [strategy, use_orig_params, prefetch, configs] = info.param;
  return std::string(fsdp1::ShardingStrategyName(strategy)) + (use_orig_params ? "_orig" : "_flat") +
         "_" + fsdp1::BackwardPrefetchName(prefetch) + "_" +
         ConfigsName(SeedConfigs().at(static_cast<size_t>(configs)));
}

const auto kStrategies = ::testing::Values(ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp,
                                           ShardingStrategy::kNoShard);
const auto kPrefetches = ::testing::Values(std::optional<BackwardPrefetch>(),
                                           std::optional<BackwardPrefetch>(BackwardPrefetch::kBackwardPre),
                                           std::optional<BackwardPrefetch>(BackwardPrefetch::kBackwardPost));

INSTANTIATE_TEST_SUITE_P(SeedMatrix, Fsdp1GradAcc,
                         ::testing::Combine(kStrategies, ::testing::Bool(), kPrefetches,
                                            ::testing::Values(0, 1)),
                         GradAccName);

using GradAccCpuOffloadParam = std::tuple<ShardingStrategy, bool, std::optional<BackwardPrefetch>>;

class Fsdp1GradAccCpuOffload : public ::testing::TestWithParam<GradAccCpuOffloadParam> {};

TEST_P(Fsdp1GradAccCpuOffload, MatchesUnshardedDataParallel) {
  // `test_grad_acc_cpu_offload`: only no_sync() accumulation (then one synced micro-batch).
  RunSpec spec;
  std::tie(spec.strategy, spec.use_orig_params, spec.backward_prefetch) = GetParam();
  spec.configs = {{true, 3}};
  spec.cpu_offload = true;
  RunGradAccParity(spec);
}

std::string GradAccCpuOffloadName(const ::testing::TestParamInfo<GradAccCpuOffloadParam>& info) {
  const auto& [strategy, use_orig_params, prefetch] = info.param;
  return std::string(fsdp1::ShardingStrategyName(strategy)) +
         (use_orig_params ? "_orig_" : "_flat_") + fsdp1::BackwardPrefetchName(prefetch);
}

INSTANTIATE_TEST_SUITE_P(SeedMatrix, Fsdp1GradAccCpuOffload,
                         ::testing::Combine(kStrategies, ::testing::Bool(), kPrefetches),
                         GradAccCpuOffloadName);

TEST(Fsdp1Training, ForwardPrefetchMatchesUnshardedDataParallel) {
  for (ShardingStrategy strategy : {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp}) {
    RunSpec spec;
    spec.strategy = strategy;
    spec.forward_prefetch = true;
    spec.configs = {{false, 2}};
    spec.steps = 3;  // forward prefetch follows the first iteration's order from step 2 on
    RunGradAccParity(spec);
  }
}

TEST(Fsdp1Training, ActivationCheckpointingMatchesUnshardedDataParallel) {
  // Recompute in backward finds the handles in BACKWARD_PRE: no extra unshard, same results.
  for (Checkpointing checkpointing : {Checkpointing::kBeforeWrap, Checkpointing::kAfterWrap}) {
    for (bool use_orig_params : {false, true}) {
      RunSpec spec;
      spec.checkpointing = checkpointing;
      spec.use_orig_params = use_orig_params;
      spec.configs = {{true, 2}, {false, 1}};
      RunGradAccParity(spec);
    }
  }
}

TEST(Fsdp1Training, HybridShardMatchesUnshardedDataParallel) {
  // World 4 as a (2 replicate, 2 shard) mesh: reduce-scatter in the shard group, all-reduce
  // across replicas, divided by the data-parallel size 4.
  for (ShardingStrategy strategy : {ShardingStrategy::kHybridShard, ShardingStrategy::kHybridShardZero2}) {
    for (bool use_orig_params : {false, true}) {
      RunSpec spec;
      spec.strategy = strategy;
      spec.use_orig_params = use_orig_params;
      spec.hybrid = true;
      spec.world_size = 4;
      spec.configs = {{true, 2}, {false, 1}};
      RunGradAccParity(spec);
    }
  }
}

}  // namespace
}  // namespace fsdp::fakes
