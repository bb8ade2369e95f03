// Bad input to FSDP1 gets PyTorch's errors, naming the module or instance (docs/fsdp1.md,
// "Errors"): no_sync() and clip_grad_norm_() on an inner instance, wrapping a module twice
// (by hand or by auto wrapping over existing instances), process groups and meshes a strategy
// cannot use, FSDP modules among the ignored modules, scalar parameters, summon_full_params
// misuse, and CPU offload with parameters moved off the CPU (needs a GPU).
#include <gtest/gtest.h>
#include <gmock/gmock.h>

#include <functional>
#include <memory>
#include <set>
#include <string>

#include "engine/core/allocator.h"
#include "engine/distributed/device_mesh.h"
#include "engine/fsdp1/fully_sharded_data_parallel.h"
#include "engine/fsdp1/unshard_params.h"
#include "engine/nn/layers.h"
#include "engine/nn/models.h"
#include "fakes/run_ranks.h"

namespace fsdp::fakes {
namespace {

using fsdp1::FullyShardedDataParallel;
using fsdp1::FullyShardedDataParallelOptions;
using fsdp1::ShardingStrategy;
using ::testing::HasSubstr;

// Runs `fn` on every rank and expects each to throw `code` with every one of `substrings`.
void ExpectErrorOnEveryRank(int world, ErrorCode code, const std::vector<std::string>& substrings,
                            const std::function<void(RankEnv&)>& fn) {
  auto results = RunRanks(world, [&](RankEnv& env) {
    try {
      fn(env);
      ADD_FAILURE() << "rank " << env.rank << ": expected an error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
      for (const std::string& s : substrings) EXPECT_THAT(e.message(), HasSubstr(s));
    }
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

std::shared_ptr<FullyShardedDataParallel> WrappedTransformer(int rank) {
  FullyShardedDataParallelOptions options;
  options.auto_wrap_policy = std::make_shared<fsdp1::ModuleWrapPolicy>(
      std::set<std::string>{"TransformerEncoderLayer", "TransformerDecoderLayer"});
  return std::make_shared<FullyShardedDataParallel>(
      std::make_shared<nn::TransformerWithSharedParams>(rank, false, true), options);
}

nn::Value Input() {
  return nn::Value::Tuple({Tensor::arange(12).view({6, 2}), Tensor::arange(8).view({4, 2})});
}

FullyShardedDataParallel& FirstEncoderLayer(FullyShardedDataParallel& root) {
  for (FullyShardedDataParallel* state : FullyShardedDataParallel::fsdp_modules(root.shared())) {
    if (state != &root) return *state;
  }
  throw std::runtime_error("no nested instance");
}

TEST(Fsdp1Errors, NoSyncOnAnInnerInstance) {
  ExpectErrorOnEveryRank(
      2, ErrorCode::kFailedPrecondition,
      {"`no_sync()` on inner FSDP instances is not supported. Please call `no_sync()` on root "
       "FSDP module.",
       "'transformer.encoder.layers.0' wrapping TransformerEncoderLayer"},
      [](RankEnv& env) {
        auto fsdp_model = WrappedTransformer(env.rank);
        (*fsdp_model)(Input());  // lazy init: the outermost instance is the root
        fsdp1::NoSync no_sync = FirstEncoderLayer(*fsdp_model).no_sync();
      });
}

TEST(Fsdp1Errors, ClipGradNormOnAnInnerInstance) {
  ExpectErrorOnEveryRank(2, ErrorCode::kFailedPrecondition,
                         {"`clip_grad_norm_()` should only be called on the root FSDP instance",
                          "'transformer.encoder.layers.0'"},
                         [](RankEnv& env) {
                           auto fsdp_model = WrappedTransformer(env.rank);
                           (*fsdp_model)(Input());
                           FirstEncoderLayer(*fsdp_model).clip_grad_norm_(1.0);
                         });
}

TEST(Fsdp1Errors, WrappingAModuleTwice) {
  ExpectErrorOnEveryRank(2, ErrorCode::kInvalidArgument,
                         {"FSDP has already been applied to this Linear"}, [](RankEnv& env) {
                           auto lin = std::make_shared<nn::Linear>(4, 4);
                           auto once = std::make_shared<FullyShardedDataParallel>(lin);
                           auto twice = std::make_shared<FullyShardedDataParallel>(lin);
                         });
}

TEST(Fsdp1Errors, AutoWrappingOverExistingInstances) {
  ExpectErrorOnEveryRank(
      2, ErrorCode::kInvalidArgument,
      {"FSDP auto wrapping requires modules to not already have FSDP applied but found 0 in"},
      [](RankEnv& env) {
        auto model = std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{
            std::make_shared<nn::Linear>(4, 4), std::make_shared<nn::Linear>(4, 4)});
        model->register_module("0", std::make_shared<FullyShardedDataParallel>(model->child("0")));
        FullyShardedDataParallelOptions options;
        options.auto_wrap_policy =
            std::make_shared<fsdp1::ModuleWrapPolicy>(std::set<std::string>{"Linear"});
        auto root = std::make_shared<FullyShardedDataParallel>(model, options);
      });
}

TEST(Fsdp1Errors, ProcessGroupAndDeviceMeshTogether) {
  ExpectErrorOnEveryRank(2, ErrorCode::kInvalidArgument,
                         {"Cannot pass both process_group and device_mesh at the same time",
                          "FullyShardedDataParallel(MLP)"},
                         [](RankEnv& env) {
                           FullyShardedDataParallelOptions options;
                           options.process_group = env.pg;
                           options.device_mesh = distributed::DeviceMesh::Init(env.pg, "cpu", {2});
                           FullyShardedDataParallel(std::make_shared<nn::MLP>(4), options);
                         });
}

TEST(Fsdp1Errors, StrategiesTheGroupsCannotServe) {
  auto make = [](const FullyShardedDataParallelOptions& options) {
    return std::make_shared<FullyShardedDataParallel>(std::make_shared<nn::MLP>(4), options);
  };
  ExpectErrorOnEveryRank(4, ErrorCode::kInvalidArgument,
                         {"Manual wrapping with ShardingStrategy.HYBRID_SHARD requires explicit "
                          "specification of process group or device_mesh.",
                          "FullyShardedDataParallel(MLP)"},
                         [&](RankEnv& env) {
                           FullyShardedDataParallelOptions options;
                           options.sharding_strategy = ShardingStrategy::kHybridShard;
                           make(options);
                         });
  ExpectErrorOnEveryRank(4, ErrorCode::kInvalidArgument,
                         {"Expected device_mesh to have ndim=2 but got 1"}, [&](RankEnv& env) {
                           FullyShardedDataParallelOptions options;
                           options.sharding_strategy = ShardingStrategy::kHybridShardZero2;
                           options.device_mesh = distributed::DeviceMesh::Init(env.pg, "cpu", {4});
                           make(options);
                         });
  ExpectErrorOnEveryRank(4, ErrorCode::kInvalidArgument,
                         {"Expected process_group to be passed in as either None or "
                          "Tuple[dist.ProcessGroup, dist.ProcessGroup]"},
                         [&](RankEnv& env) {
                           FullyShardedDataParallelOptions options;
                           options.sharding_strategy = ShardingStrategy::kHybridShard;
                           options.process_group = env.pg;
                           make(options);
                         });
  ExpectErrorOnEveryRank(4, ErrorCode::kInvalidArgument,
                         {"ShardingStrategy.FULL_SHARD shards over a 1-D device_mesh but got ndim=2"},
                         [&](RankEnv& env) {
                           FullyShardedDataParallelOptions options;
                           options.device_mesh = distributed::DeviceMesh::Init(env.pg, "cpu", {2, 2});
                           make(options);
                         });
  ExpectErrorOnEveryRank(4, ErrorCode::kInvalidArgument,
                         {"shards over a group of 1 rank, which cannot serve a hybrid strategy"},
                         [&](RankEnv& env) {
                           FullyShardedDataParallelOptions options;
                           options.sharding_strategy = ShardingStrategy::kHybridShard;
                           options.device_mesh = distributed::DeviceMesh::Init(env.pg, "cpu", {4, 1});
                           make(options);
                         });
}

TEST(Fsdp1Errors, IgnoredModulesIncludeAnFsdpModule) {
  ExpectErrorOnEveryRank(2, ErrorCode::kInvalidArgument,
                         {"`ignored_modules` should not include FSDP modules",
                          "FullyShardedDataParallel(Sequential)"},
                         [](RankEnv& env) {
                           auto inner = std::make_shared<FullyShardedDataParallel>(
                               std::make_shared<nn::Linear>(4, 4));
                           auto model = std::make_shared<nn::Sequential>(
                               std::vector<nn::ModulePtr>{inner, std::make_shared<nn::Linear>(4, 4)});
                           FullyShardedDataParallelOptions options;
                           options.ignored_modules = {inner};
                           FullyShardedDataParallel(model, options);
                         });
}

TEST(Fsdp1Errors, ScalarParameter) {
  ExpectErrorOnEveryRank(
      2, ErrorCode::kInvalidArgument,
      {"FSDP doesn't support scalar parameters. Change scale to a 1D tensor with numel equal to 1."},
      [](RankEnv& env) {
        auto module = std::make_shared<nn::Linear>(4, 4);
        module->register_parameter("scale", Tensor::ones({}));
        FullyShardedDataParallel fsdp(module);
      });
}

TEST(Fsdp1Errors, SummonFullParamsMisuse) {
  ExpectErrorOnEveryRank(2, ErrorCode::kInvalidArgument,
                         {"writeback=True and rank0_only=True is not supported yet"},
                         [](RankEnv& env) {
                           auto fsdp_model = WrappedTransformer(env.rank);
                           fsdp1::SummonFullParams summon(fsdp_model, {.rank0_only = true});
                         });
  ExpectErrorOnEveryRank(2, ErrorCode::kInvalidArgument,
                         {"with_grads=True, use_orig_params=False, offload_to_cpu=False is not "
                          "supported yet"},
                         [](RankEnv& env) {
                           auto fsdp_model = WrappedTransformer(env.rank);
                           fsdp1::SummonFullParams summon(fsdp_model, {.with_grads = true});
                         });
  ExpectErrorOnEveryRank(2, ErrorCode::kFailedPrecondition,
                         {"Cannot manually unshard parameters when already unsharding parameters"},
                         [](RankEnv& env) {
                           auto fsdp_model = WrappedTransformer(env.rank);
                           fsdp1::SummonFullParams outer(fsdp_model);
                           fsdp1::SummonFullParams inner(fsdp_model);
                         });
}

TEST(Fsdp1ErrorsGpu, CpuOffloadWithParametersMovedToTheGpu) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
  RunRanksOptions run_options;
  run_options.device = Device::CUDA(0);
  auto results = RunRanks(
      1,
      [](RankEnv& env) {
        FullyShardedDataParallelOptions options;
        options.cpu_offload.offload_params = true;
        auto fsdp_model =
            std::make_shared<FullyShardedDataParallel>(std::make_shared<nn::MLP>(4), options);
        fsdp_model->to(Device::CUDA(0));  // moves the flat parameter off the CPU
        try {
          (*fsdp_model)(Tensor::ones({2, 4}));
          ADD_FAILURE() << "expected an error";
        } catch (const Error& e) {
          EXPECT_THAT(e.message(), HasSubstr("An FSDP-managed module with parameter CPU offloading "
                                             "enabled has parameters on cuda:0"));
          EXPECT_THAT(e.message(), HasSubstr("wrapping MLP"));
        }
      },
      run_options);
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

}  // namespace
}  // namespace fsdp::fakes
