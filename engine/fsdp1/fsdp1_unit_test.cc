// FullyShardedDataParallel's structure and API on the threaded fake (docs/fsdp1.md): FQNs
// through `_fsdp_wrapped_module`, the flat parameter's layout and shards (against a replicated
// copy), use_orig_params, auto-wrap policies, enable_wrap/wrap, ignored modules,
// sync_module_states, summon_full_params, clip_grad_norm_, fsdp_modules, mixed precision and
// the world-size-1 fallback to NO_SHARD.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "engine/autograd/grad_mode.h"
#include "engine/core/rank_context.h"
#include "engine/distributed/comm_debug_mode.h"
#include "engine/fsdp/observer.h"
#include "engine/fsdp1/fully_sharded_data_parallel.h"
#include "engine/fsdp1/runtime_utils.h"
#include "engine/fsdp1/unshard_params.h"
#include "engine/fsdp1/wrap.h"
#include "engine/functional/functional.h"
#include "engine/nn/init.h"
#include "engine/nn/layers.h"
#include "engine/nn/models.h"
#include "engine/testing/fsdp1_parity.h"
#include "engine/testing/parity.h"
#include "fakes/run_ranks.h"

namespace fsdp::fakes {
namespace {

using fsdp1::FullyShardedDataParallel;
using fsdp1::FullyShardedDataParallelOptions;
using fsdp1::ShardingStrategy;
using nn::TransformerWithSharedParams;
using Names = std::vector<std::string>;

const std::set<std::string> kTransformerLayers = {"TransformerEncoderLayer",
                                                  "TransformerDecoderLayer"};

FullyShardedDataParallelOptions TransformerOptions(ShardingStrategy strategy, bool use_orig_params) {
  FullyShardedDataParallelOptions options;
  options.sharding_strategy = strategy;
  options.use_orig_params = use_orig_params;
  options.auto_wrap_policy = std::make_shared<fsdp1::ModuleWrapPolicy>(kTransformerLayers);
  return options;
}

nn::Value TransformerInput() {
  return nn::Value::Tuple({Tensor::arange(12).view({6, 2}), Tensor::arange(8).view({4, 2})});
}

// The module FQNs the policy wraps, in the unwrapped model.
Names WrappedModuleNames(const nn::Module& model, const std::set<std::string>& classes) {
  Names out;
  for (const auto& [name, module] : model.named_modules()) {
    if (!name.empty() && classes.count(module->type_name())) out.push_back(name);
  }
  return out;
}

bool HasPrefix(const std::string& name, const std::string& prefix) {
  return name.compare(0, prefix.size() + 1, prefix + ".") == 0;
}

template <typename Pairs>
Names NamesOf(const Pairs& pairs) {
  Names out;
  for (const auto& p : pairs) out.push_back(p.first);
  return out;
}

// ---- Structure -------------------------------------------------------------------------------

TEST(Fsdp1Structure, FlatParametersAreRegisteredUnderTheWrappedModules) {
  auto results = RunRanks(2, [](RankEnv& env) {
    auto model = std::make_shared<TransformerWithSharedParams>(0, false, true);
    const Names wrapped = WrappedModuleNames(*model, kTransformerLayers);
    auto fsdp_model = std::make_shared<FullyShardedDataParallel>(
        model, TransformerOptions(ShardingStrategy::kFullShard, false));
    // One flat parameter per instance: the root's, then each wrapped layer's, in pre-order.
    Names expected = {std::string(fsdp1::kFsdpPrefix) + fsdp1::kFlatParam};
    Names expected_clean = {fsdp1::kFlatParam};
    for (const std::string& name : wrapped) {
      expected.push_back(std::string(fsdp1::kFsdpPrefix) + name + "." + fsdp1::kFsdpPrefix +
                         fsdp1::kFlatParam);
      expected_clean.push_back(name + "." + fsdp1::kFlatParam);
    }
    EXPECT_EQ(NamesOf(fsdp_model->named_parameters()), expected);
    Names clean;
    for (const std::string& name : expected) clean.push_back(fsdp1::CleanTensorName(name));
    EXPECT_EQ(clean, expected_clean);
    EXPECT_EQ(FullyShardedDataParallel::fsdp_modules(fsdp_model).size(), wrapped.size() + 1);
    EXPECT_TRUE(fsdp_model->fsdp_wrapped_module() == model);
    EXPECT_TRUE(fsdp_model->module() == model);
    // Forward still works through the plain-tensor views.
    Tensor loss = TransformerWithSharedParams::get_loss(TransformerInput(),
                                                        (*fsdp_model)(TransformerInput()).tensor());
    EXPECT_TRUE(std::isfinite(loss.item()));
    EXPECT_TRUE(fsdp_model->check_is_root());
    const auto roots = FullyShardedDataParallel::fsdp_modules(fsdp_model, /*root_only=*/true);
    ASSERT_EQ(roots.size(), 1u);
    EXPECT_EQ(roots[0], fsdp_model.get());
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

TEST(Fsdp1Structure, UseOrigParamsKeepsTheOriginalParameters) {
  auto results = RunRanks(2, [](RankEnv& env) {
    auto model = std::make_shared<TransformerWithSharedParams>(0, false, true);
    const std::vector<nn::NamedTensor> originals = model->named_parameters();
    std::vector<int64_t> numels;
    for (const auto& [name, p] : originals) numels.push_back(p.numel());
    auto fsdp_model = std::make_shared<FullyShardedDataParallel>(
        model, TransformerOptions(ShardingStrategy::kFullShard, true));
    const std::vector<nn::NamedTensor> params = fsdp_model->named_parameters();
    ASSERT_EQ(params.size(), originals.size());
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_EQ(fsdp1::CleanTensorName(params[i].first), originals[i].first);
      EXPECT_TRUE(params[i].second.is_same(originals[i].second)) << originals[i].first;
      // Sharded form: a 1-D slice of the flat shard; the ranks' slices partition the param.
      EXPECT_EQ(params[i].second.dim(), 1);
      EXPECT_EQ(fsdp2::AllReduceSum(*env.pg, static_cast<double>(params[i].second.numel())),
                static_cast<double>(numels[i]))
          << originals[i].first;
    }
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

// use_orig_params in forward: the unsharded views are listed among the parameters
// (`module._parameters[name] = view`); after the forward SHARD_GRAD_OP keeps listing them whole
// until backward, FULL_SHARD lists the sharded views again.
TEST(Fsdp1Structure, UseOrigParamsListsTheUnshardedViewsAfterForward) {
  for (ShardingStrategy strategy : {ShardingStrategy::kShardGradOp, ShardingStrategy::kFullShard}) {
    auto results = RunRanks(2, [strategy](RankEnv& env) {
      auto model = std::make_shared<TransformerWithSharedParams>(0, false, true);
      std::map<std::string, int64_t> numels;
      for (const auto& [name, p] : model->named_parameters()) numels[name] = p.numel();
      auto fsdp_model =
          std::make_shared<FullyShardedDataParallel>(model, TransformerOptions(strategy, true));
      fsdp_model->forward(TransformerInput());
      const std::vector<nn::NamedTensor> params = fsdp_model->named_parameters();
      ASSERT_EQ(params.size(), numels.size());
      for (const auto& [name, p] : params) {
        const std::string clean = fsdp1::CleanTensorName(name);
        // The root never frees its unsharded flat parameter after forward, but only the
        // strategies that keep it skip the sharded views.
        if (strategy == ShardingStrategy::kShardGradOp) {
          EXPECT_EQ(p.numel(), numels.at(clean)) << clean;
        } else {
          EXPECT_EQ(p.dim(), 1) << clean;
          EXPECT_EQ(fsdp2::AllReduceSum(*env.pg, static_cast<double>(p.numel())),
                    static_cast<double>(numels.at(clean)))
              << clean;
        }
      }
    });
    ASSERT_TRUE(results.all_ok()) << results.summary();
  }
}

TEST(Fsdp1Structure, FlatParameterIsTheChunkOfTheConcatenation) {
  // World 3 (uneven chunks), both views, every strategy: the flat layout (managed parameters
  // in pre-order, the tied weight once) and this rank's shard against a replicated copy.
  for (ShardingStrategy strategy : {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp,
                                    ShardingStrategy::kNoShard}) {
    for (bool use_orig_params : {false, true}) {
      auto results = RunRanks(3, [&](RankEnv& env) {
        auto model = std::make_shared<TransformerWithSharedParams>(0, false, true);
        nn::ModulePtr ref = model->deep_copy();
        const Names wrapped = WrappedModuleNames(*model, kTransformerLayers);
        Names root_params;  // managed by the root: not under a wrapped layer
        for (const auto& [name, p] : model->named_parameters()) {
          bool nested = false;
          for (const std::string& w : wrapped) nested = nested || HasPrefix(name, w);
          if (!nested) root_params.push_back(name);
        }
        auto fsdp_model = std::make_shared<FullyShardedDataParallel>(
            model, TransformerOptions(strategy, use_orig_params));
        ASSERT_NE(fsdp_model->handle, nullptr);
        EXPECT_EQ(fsdp_model->handle->fqns(), root_params);
        ASSERT_EQ(fsdp_model->handle->shared_param_infos().size(), 1u);
        EXPECT_EQ(fsdp_model->handle->shared_param_infos()[0].module_name, "output_proj");
        EXPECT_EQ(fsdp_model->handle->shared_param_infos()[0].prim_module_name, "embed_tokens");
        // FQNs are known after lazy init (the first forward).
        (*fsdp_model)(TransformerInput());
        fsdp2::ParityOptions options;
        options.check_grads = false;
        const std::string parity = fsdp1::CheckFlatParamParity(*fsdp_model, *ref, options);
        EXPECT_TRUE(parity.empty()) << parity;
      });
      ASSERT_TRUE(results.all_ok()) << results.summary();
    }
  }
}

TEST(Fsdp1Structure, FrozenFlatParameterIsReshardedByItsInputsHook) {
  // The middle Linear is frozen: its flat parameter does not require grad, so instead of the
  // AccumulateGrad hook a hook on its inputs' gradients reshards it (post_backward event).
  auto results = RunRanks(2, [](RankEnv& env) {
    auto model = std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{
        std::make_shared<nn::Linear>(8, 8), std::make_shared<nn::Linear>(8, 8),
        std::make_shared<nn::Linear>(8, 4)});
    model->child("1")->requires_grad_(false);
    nn::ModulePtr ref = model->deep_copy();
    FullyShardedDataParallelOptions options;
    options.auto_wrap_policy = std::make_shared<fsdp1::LambdaAutoWrapPolicy>(
        [](const nn::Module& m) { return m.type_name() == "Linear"; });
    auto fsdp_model = std::make_shared<FullyShardedDataParallel>(model, options);
    fsdp2::RecordingObserver observer;
    fsdp2::ScopedObserver install(observer);
    const Tensor x = Tensor::rand({4, 8});
    sum((*fsdp_model)(x).tensor()).backward();
    sum((*ref)(x).tensor()).backward();
    const std::vector<fsdp2::FsdpEvent> events = observer.events({fsdp2::EventKind::kReshard,
                                                                  fsdp2::EventKind::kPostBackward});
    const std::vector<fsdp2::FsdpEvent> frozen_tail = {
        {fsdp2::EventKind::kReshard, "1", fsdp2::TrainingState::kPostBackward},
        {fsdp2::EventKind::kPostBackward, "1", fsdp2::TrainingState::kPostBackward}};
    EXPECT_NE(std::search(events.begin(), events.end(), frozen_tail.begin(), frozen_tail.end()),
              events.end())
        << fsdp2::EventsStr(events);
    for (FullyShardedDataParallel* state : FullyShardedDataParallel::fsdp_modules(fsdp_model)) {
      if (!state->handle) continue;
      EXPECT_TRUE(state->handle->flat_param().storage() == state->handle->local_shard().storage())
          << "instance '" << state->fqn << "' is not resharded";
    }
    EXPECT_FALSE(fsdp1::AsFsdp(*model->child("1"))->handle->flat_param().grad().defined());
    const std::string parity = fsdp1::CheckFlatParamParity(*fsdp_model, *ref, {.rtol = 1e-5, .atol = 1e-6});
    EXPECT_TRUE(parity.empty()) << parity;
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

TEST(Fsdp1Structure, WorldSizeOneSwitchesToNoShard) {
  auto results = RunRanks(1, [](RankEnv& env) {
    auto model = std::make_shared<nn::MLP>(8);
    auto fsdp_model = std::make_shared<FullyShardedDataParallel>(model);
    EXPECT_EQ(fsdp_model->sharding_strategy, ShardingStrategy::kNoShard);
    EXPECT_FALSE(fsdp_model->handle->uses_sharded_strategy());
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

// ---- Wrapping --------------------------------------------------------------------------------

Names FsdpInstanceNames(const nn::Module& root) {
  Names out;
  for (const auto& [name, module] : root.named_modules()) {
    if (fsdp1::AsFsdp(*module)) out.push_back(fsdp1::CleanTensorName(name));
  }
  return out;
}

std::shared_ptr<nn::Sequential> SizeModel() {
  // 0: Linear(8, 8) = 72 params, 1: Linear(8, 8) = 72, 2: Sequential(Linear(8, 4) = 36,
  // Linear(4, 4) = 20) = 56.
  return std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{
      std::make_shared<nn::Linear>(8, 8), std::make_shared<nn::Linear>(8, 8),
      std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{
          std::make_shared<nn::Linear>(8, 4), std::make_shared<nn::Linear>(4, 4)})});
}

TEST(Fsdp1Wrapping, SizeBasedPolicyWrapsModulesReachingTheThreshold) {
  auto results = RunRanks(2, [](RankEnv& env) {
    // min 50: both 72-parameter Linears; inside "2" neither Linear (36, 20) but "2" itself
    // (remainder 56 >= 50); the root is never wrapped by the policy.
    FullyShardedDataParallelOptions options;
    options.auto_wrap_policy = std::make_shared<fsdp1::SizeBasedAutoWrapPolicy>(50);
    auto fsdp_model = std::make_shared<FullyShardedDataParallel>(SizeModel(), options);
    EXPECT_EQ(FsdpInstanceNames(*fsdp_model), (Names{"", "0", "1", "2"}));
    // min 60: "2" (56) is too small to recurse into or wrap.
    options.auto_wrap_policy = std::make_shared<fsdp1::SizeBasedAutoWrapPolicy>(60);
    fsdp_model = std::make_shared<FullyShardedDataParallel>(SizeModel(), options);
    EXPECT_EQ(FsdpInstanceNames(*fsdp_model), (Names{"", "0", "1"}));
    // Excluded classes are recursed into but never wrapped.
    options.auto_wrap_policy = std::make_shared<fsdp1::SizeBasedAutoWrapPolicy>(
        30, std::set<std::string>{}, std::set<std::string>{"Sequential"});
    fsdp_model = std::make_shared<FullyShardedDataParallel>(SizeModel(), options);
    EXPECT_EQ(FsdpInstanceNames(*fsdp_model), (Names{"", "0", "1", "2.0"}));
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

TEST(Fsdp1Wrapping, LambdaAndModulePoliciesWrapChildrenBeforeParents) {
  auto results = RunRanks(2, [](RankEnv& env) {
    FullyShardedDataParallelOptions options;
    options.auto_wrap_policy = std::make_shared<fsdp1::LambdaAutoWrapPolicy>(
        [](const nn::Module& m) { return m.type_name() == "Linear"; });
    auto fsdp_model = std::make_shared<FullyShardedDataParallel>(SizeModel(), options);
    EXPECT_EQ(FsdpInstanceNames(*fsdp_model), (Names{"", "0", "1", "2.0", "2.1"}));
    // Every Linear is its own instance: the root and "2" manage no parameters.
    EXPECT_EQ(fsdp_model->handle, nullptr);
    options.auto_wrap_policy =
        std::make_shared<fsdp1::ModuleWrapPolicy>(std::set<std::string>{"Sequential", "Linear"});
    fsdp_model = std::make_shared<FullyShardedDataParallel>(SizeModel(), options);
    EXPECT_EQ(FsdpInstanceNames(*fsdp_model), (Names{"", "0", "1", "2", "2.0", "2.1"}));
    // Nested instances are initialised by the root's lazy init, in pre-order.
    Tensor out = (*fsdp_model)(Tensor::ones({2, 8})).tensor();
    Names fqns;
    for (FullyShardedDataParallel* s : fsdp_model->all_fsdp_states) fqns.push_back(s->fqn);
    EXPECT_EQ(fqns, FsdpInstanceNames(*fsdp_model));
    EXPECT_EQ(out.sizes(), (Shape{2, 4}));
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

TEST(Fsdp1Wrapping, EnableWrapScopesWrap) {
  auto results = RunRanks(2, [](RankEnv& env) {
    auto lin = std::make_shared<nn::Linear>(4, 4);
    EXPECT_TRUE(fsdp1::wrap(lin) == lin);  // outside a scope: the module itself
    {
      FullyShardedDataParallelOptions options;
      options.sharding_strategy = ShardingStrategy::kShardGradOp;
      fsdp1::EnableWrap scope(options);
      nn::ModulePtr wrapped = fsdp1::wrap(lin);
      auto* fsdp = fsdp1::AsFsdp(*wrapped);
      ASSERT_NE(fsdp, nullptr);
      EXPECT_EQ(fsdp->sharding_strategy, ShardingStrategy::kShardGradOp);
      nn::ModulePtr overridden = fsdp1::wrap(std::make_shared<nn::Linear>(4, 4), [](auto& o) {
        o.sharding_strategy = ShardingStrategy::kNoShard;
      });
      EXPECT_EQ(fsdp1::AsFsdp(*overridden)->sharding_strategy, ShardingStrategy::kNoShard);
      EXPECT_THROW(fsdp1::EnableWrap nested(options), Error);
    }
    EXPECT_TRUE(fsdp1::wrap(std::make_shared<nn::Linear>(4, 4))->type_name() == "Linear");
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

TEST(Fsdp1Wrapping, IgnoredModulesKeepTheirParametersAndLocalGradients) {
  // TransformerWithSharedParams.get_ignored_modules() = [transformer]: its parameters stay
  // plain (unsharded, unreduced) parameters; the rest is flattened.
  auto results = RunRanks(2, [](RankEnv& env) {
    auto model = std::make_shared<TransformerWithSharedParams>(0, false, true);
    nn::ModulePtr ref = model->deep_copy();
    FullyShardedDataParallelOptions options;
    options.ignored_modules = model->get_ignored_modules();
    auto fsdp_model = std::make_shared<FullyShardedDataParallel>(model, options);
    Names expected = {std::string(fsdp1::kFsdpPrefix) + fsdp1::kFlatParam};
    for (const auto& [name, p] : model->child("transformer")->named_parameters("transformer")) {
      expected.push_back(std::string(fsdp1::kFsdpPrefix) + name);
    }
    Names actual = NamesOf(fsdp_model->named_parameters());
    std::sort(actual.begin(), actual.end());
    std::sort(expected.begin(), expected.end());
    EXPECT_EQ(actual, expected);
    // A rank-specific batch: ignored gradients are this rank's own, the rest averaged.
    std::vector<int64_t> src = Tensor::arange(12).to_int64s();
    for (int64_t& v : src) v = (v + 5 * env.rank) % TransformerWithSharedParams::kVocab;
    const nn::Value input = nn::Value::Tuple({Tensor::from_int64s(src, {6, 2}), Tensor::arange(8).view({4, 2})});
    TransformerWithSharedParams::get_loss(input, (*fsdp_model)(input).tensor()).backward();
    TransformerWithSharedParams::get_loss(input, (*ref)(input).tensor()).backward();
    for (const auto& [name, p] : ref->child("transformer")->named_parameters("transformer")) {
      const Tensor g = model->get_parameter(name).grad();
      ASSERT_TRUE(g.defined()) << name;
      const std::vector<double> a = g.to_doubles();
      const std::vector<double> e = p.grad().to_doubles();
      for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], e[i], 1e-4) << name;
    }
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

TEST(Fsdp1Wrapping, SyncModuleStatesBroadcastsRankZero) {
  auto results = RunRanks(2, [](RankEnv& env) {
    nn::ManualSeed(static_cast<uint64_t>(100 + env.rank));  // different parameters per rank
    auto model = std::make_shared<nn::MLP>(8, true, /*with_buffer=*/true);
    Tensor rank0_param;
    {
      // Rank 0's values, for comparison after the broadcast.
      Tensor w = model->child("in_proj")->parameter("weight").detach().clone();
      env.pg->broadcast(w, 0);
      rank0_param = w;
    }
    Tensor rank0_buffer = model->buffer("buffer").detach().clone();
    env.pg->broadcast(rank0_buffer, 0);
    distributed::CommDebugMode comm_mode;
    FullyShardedDataParallelOptions options;
    options.sync_module_states = true;
    auto fsdp_model = std::make_shared<FullyShardedDataParallel>(model, options);
    comm_mode.exit();
    // One coalesced broadcast of the float32 buffer and parameters.
    EXPECT_EQ(comm_mode.get_count("c10d.broadcast_"), 1);
    EXPECT_EQ(model->buffer("buffer").to_doubles(), rank0_buffer.to_doubles());
    fsdp1::SummonFullParams summon(fsdp_model, {.writeback = false});
    EXPECT_EQ(model->child("in_proj")->parameter("weight").to_doubles(), rank0_param.to_doubles());
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

// ---- summon_full_params ------------------------------------------------------------------------

TEST(Fsdp1SummonFullParams, ExposesFullParametersAndWritesBack) {
  for (ShardingStrategy strategy : {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp,
                                    ShardingStrategy::kNoShard}) {
    for (bool use_orig_params : {false, true}) {
      auto results = RunRanks(2, [&](RankEnv& env) {
        auto model = std::make_shared<TransformerWithSharedParams>(0, false, true);
        nn::ModulePtr ref = model->deep_copy();
        auto fsdp_model = std::make_shared<FullyShardedDataParallel>(
            model, TransformerOptions(strategy, use_orig_params));
        const std::vector<nn::NamedTensor> ref_params = ref->named_parameters();
        {
          fsdp1::SummonFullParams summon(fsdp_model);
          // Clean names and full values, as the unwrapped model's.
          const std::vector<nn::NamedTensor> params = fsdp_model->named_parameters();
          ASSERT_EQ(NamesOf(params), NamesOf(ref_params));
          for (size_t i = 0; i < params.size(); ++i) {
            EXPECT_EQ(params[i].second.to_doubles(), ref_params[i].second.to_doubles())
                << params[i].first;
          }
          // Modify every parameter in place: persisted by the writeback.
          autograd::NoGradGuard no_grad;
          for (const auto& [name, p] : params) Tensor(p).copy_(p * 2.0);
        }
        for (const auto& [name, p] : ref->named_parameters()) Tensor(p).copy_(p * 2.0);
        fsdp2::ParityOptions options;
        options.check_grads = false;
        std::string parity = fsdp1::CheckFlatParamParity(*fsdp_model, *ref, options);
        EXPECT_TRUE(parity.empty()) << parity;
        {
          // writeback=false discards the changes (NO_SHARD's are persisted regardless).
          fsdp1::SummonFullParams summon(fsdp_model, {.writeback = false});
          autograd::NoGradGuard no_grad;
          for (const auto& [name, p] : fsdp_model->named_parameters()) Tensor(p).copy_(p * -1.0);
        }
        if (strategy == ShardingStrategy::kNoShard) {
          for (const auto& [name, p] : ref->named_parameters()) Tensor(p).copy_(p * -1.0);
        }
        parity = fsdp1::CheckFlatParamParity(*fsdp_model, *ref, options);
        EXPECT_TRUE(parity.empty()) << parity;
      });
      ASSERT_TRUE(results.all_ok()) << ShardingStrategyName(strategy) << " " << use_orig_params
                                    << "\n" << results.summary();
    }
  }
}

TEST(Fsdp1SummonFullParams, Rank0OnlyOffloadAndWithGrads) {
  auto results = RunRanks(2, [](RankEnv& env) {
    auto model = std::make_shared<TransformerWithSharedParams>(0, false, true);
    nn::ModulePtr ref = model->deep_copy();
    auto fsdp_model = std::make_shared<FullyShardedDataParallel>(
        model, TransformerOptions(ShardingStrategy::kFullShard, /*use_orig_params=*/true));
    const nn::Value input = TransformerInput();
    TransformerWithSharedParams::get_loss(input, (*fsdp_model)(input).tensor()).backward();
    TransformerWithSharedParams::get_loss(input, (*ref)(input).tensor()).backward();
    const std::vector<nn::NamedTensor> ref_params = ref->named_parameters();
    {
      // rank0_only: full parameters on rank 0, shards elsewhere.
      fsdp1::SummonFullParams summon(fsdp_model, {.writeback = false, .rank0_only = true});
      const std::vector<nn::NamedTensor> params = fsdp_model->named_parameters();
      int64_t numel = 0;
      int64_t full_numel = 0;
      for (size_t i = 0; i < params.size(); ++i) {
        if (env.rank == 0) {
          EXPECT_EQ(params[i].second.sizes(), ref_params[i].second.sizes()) << params[i].first;
        } else {
          EXPECT_EQ(params[i].second.dim(), 1) << params[i].first;  // sharded 1-D views
        }
        numel += params[i].second.numel();
        full_numel += ref_params[i].second.numel();
      }
      if (env.rank != 0) EXPECT_LT(numel, full_numel);
    }
    {
      fsdp1::SummonFullParams summon(fsdp_model, {.writeback = false, .offload_to_cpu = true});
      const std::vector<nn::NamedTensor> params = fsdp_model->named_parameters();
      for (size_t i = 0; i < params.size(); ++i) {
        EXPECT_TRUE(params[i].second.device().is_cpu());
        EXPECT_EQ(params[i].second.to_doubles(), ref_params[i].second.to_doubles());
      }
    }
    {
      // with_grads: the full gradients (same input on both ranks: the average is the local).
      fsdp1::SummonFullParams summon(fsdp_model, {.writeback = false, .with_grads = true});
      const std::vector<nn::NamedTensor> params = fsdp_model->named_parameters();
      for (size_t i = 0; i < params.size(); ++i) {
        const Tensor g = params[i].second.grad();
        ASSERT_TRUE(g.defined()) << params[i].first;
        ASSERT_EQ(g.sizes(), ref_params[i].second.sizes()) << params[i].first;
        const std::vector<double> a = g.to_doubles();
        const std::vector<double> e = ref_params[i].second.grad().to_doubles();
        for (size_t k = 0; k < a.size(); ++k) ASSERT_NEAR(a[k], e[k], 1e-4) << params[i].first;
      }
    }
    // Back to sharded gradients afterwards.
    const std::string parity = fsdp1::CheckFlatParamParity(*fsdp_model, *ref, {.rtol = 1e-5, .atol = 1e-5});
    EXPECT_TRUE(parity.empty()) << parity;
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

// ---- clip_grad_norm_ -----------------------------------------------------------------------

TEST(Fsdp1ClipGradNorm, TotalNormOverAllShardsAndScaledGradients) {
  for (ShardingStrategy strategy : {ShardingStrategy::kFullShard, ShardingStrategy::kNoShard}) {
    for (double norm_type : {2.0, 1.0, static_cast<double>(INFINITY)}) {
      auto results = RunRanks(2, [&](RankEnv& env) {
        auto model = std::make_shared<TransformerWithSharedParams>(0, false, true);
        nn::ModulePtr ref = model->deep_copy();
        auto fsdp_model = std::make_shared<FullyShardedDataParallel>(
            model, TransformerOptions(strategy, false));
        const nn::Value input = TransformerInput();
        TransformerWithSharedParams::get_loss(input, (*fsdp_model)(input).tensor()).backward();
        TransformerWithSharedParams::get_loss(input, (*ref)(input).tensor()).backward();
        // The reference: the norm of the full (averaged = local here) gradients.
        double ref_norm = 0.0;
        for (const Tensor& p : ref->parameters()) {
          for (double v : p.grad().to_doubles()) {
            ref_norm = std::isinf(norm_type) ? std::max(ref_norm, std::fabs(v))
                                             : ref_norm + std::pow(std::fabs(v), norm_type);
          }
        }
        if (!std::isinf(norm_type)) ref_norm = std::pow(ref_norm, 1.0 / norm_type);
        const double max_norm = ref_norm / 4;
        const Tensor total = fsdp_model->clip_grad_norm_(max_norm, norm_type);
        EXPECT_NEAR(total.item(), ref_norm, 1e-4 * ref_norm);
        const double coef = max_norm / (ref_norm + 1e-6);
        for (const Tensor& p : ref->parameters()) {
          Tensor g = p.grad();
          g.copy_(g * coef);
        }
        const std::string parity = fsdp1::CheckFlatParamParity(*fsdp_model, *ref, {.rtol = 1e-4, .atol = 1e-5});
        EXPECT_TRUE(parity.empty()) << parity;
      });
      ASSERT_TRUE(results.all_ok()) << results.summary();
    }
  }
}

// ---- Mixed precision -----------------------------------------------------------------------

TEST(Fsdp1MixedPrecision, ComputesInParamDtypeAndKeepsFullPrecisionShards) {
  for (bool keep_low_precision_grads : {false, true}) {
    auto results = RunRanks(2, [&](RankEnv& env) {
      auto model = std::make_shared<nn::MLP>(8, true, /*with_buffer=*/true);
      nn::ModulePtr ref = model->deep_copy();
      FullyShardedDataParallelOptions options;
      options.mixed_precision.param_dtype = DType::kBFloat16;
      options.mixed_precision.buffer_dtype = DType::kBFloat16;
      options.mixed_precision.keep_low_precision_grads = keep_low_precision_grads;
      auto fsdp_model = std::make_shared<FullyShardedDataParallel>(model, options);
      EXPECT_EQ(fsdp_model->handle->reduce_dtype(), DType::kBFloat16);  // inferred
      const Tensor x = Tensor::ones({4, 8});
      Tensor out = (*fsdp_model)(x).tensor();
      // The root casts the input; parameters and buffers are used in bfloat16.
      EXPECT_EQ(out.dtype(), DType::kBFloat16);
      EXPECT_EQ(model->buffer("buffer").dtype(), DType::kBFloat16);
      sum(out).backward();
      const Tensor& flat = fsdp_model->handle->flat_param();
      EXPECT_EQ(flat.dtype(), DType::kFloat32);
      EXPECT_EQ(flat.grad().dtype(), keep_low_precision_grads ? DType::kBFloat16 : DType::kFloat32);
      // Values agree with a float32 replica to bfloat16 precision.
      sum((*ref)(x).tensor()).backward();
      const std::string parity =
          fsdp1::CheckFlatParamParity(*fsdp_model, *ref, {.rtol = 5e-2, .atol = 5e-2});
      EXPECT_TRUE(parity.empty()) << parity;
    });
    ASSERT_TRUE(results.all_ok()) << results.summary();
  }
}

}  // namespace
}  // namespace fsdp::fakes
