// FSDP1 collective counts and event orders (docs/fsdp1.md, "Collective counts", "Events"):
// TransformerWithSharedParams with its 2 encoder and 2 decoder layers as nested instances (K = 5
// instances, root last in the post-forward order) runs the seed's no_sync pattern; every
// micro-batch's CommDebugMode counts per phase and every micro-batch's event list are compared
// with what the rules derive, for every strategy x backward_prefetch (x use_orig_params for the
// counts).
#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "engine/distributed/comm_debug_mode.h"
#include "engine/fsdp/observer.h"
#include "engine/fsdp1/fully_sharded_data_parallel.h"
#include "engine/functional/functional.h"
#include "engine/nn/checkpoint.h"
#include "engine/nn/models.h"
#include "fakes/run_ranks.h"

namespace fsdp::fakes {
namespace {

using fsdp1::BackwardPrefetch;
using fsdp1::ShardingStrategy;
using fsdp2::EventKind;
using fsdp2::FsdpEvent;
using fsdp2::TrainingState;
using nn::TransformerWithSharedParams;
using Names = std::vector<std::string>;

// On the CPU FSDP1 all-gathers a flat parameter with the list all_gather.
constexpr const char* kAllGather = "c10d.allgather_";
constexpr const char* kReduceScatter = "c10d._reduce_scatter_base_";
constexpr const char* kAllReduce = "c10d.allreduce_";

// The wrapped layers in forward order (the encoder runs before the decoder).
Names WrappedLayers(const nn::Module& model) {
  Names out;
  for (const auto& [name, module] : model.named_modules()) {
    if (module->type_name() == "TransformerEncoderLayer" ||
        module->type_name() == "TransformerDecoderLayer") {
      out.push_back(name);
    }
  }
  return out;
}

nn::Value Input() {
  return nn::Value::Tuple({Tensor::arange(12).view({6, 2}), Tensor::arange(8).view({4, 2})});
}

// The seed's first pattern, micro-batch by micro-batch: true = inside no_sync().
const std::vector<bool> kNoSyncPattern = {true, true, true, false, false, false, true, true, false};

struct Expected {
  distributed::CommDebugMode::Counts forward;
  distributed::CommDebugMode::Counts backward;
};

// The counts of one micro-batch with K instances, derived from the rules:
//  * forward: an instance all-gathers iff its unsharded flat parameter is freed (FULL_SHARD
//    frees after every backward; SHARD_GRAD_OP only after a synced one; NO_SHARD never shards);
//  * backward: FULL_SHARD re-gathers every instance but the root (kept after forward);
//  * a synced backward reduce-scatters every sharded instance once (HSDP also all-reduces),
//    NO_SHARD all-reduces every instance; inside no_sync() nothing is reduced.
Expected ExpectedCounts(ShardingStrategy strategy, int num_instances, bool sync,
                        bool previous_backward_synced) {
  Expected e;
  const bool sharded = strategy != ShardingStrategy::kNoShard;
  const bool freed_before_forward =
      strategy == ShardingStrategy::kFullShard || (sharded && previous_backward_synced);
  if (freed_before_forward) e.forward[kAllGather] = num_instances;
  if (strategy == ShardingStrategy::kFullShard) e.backward[kAllGather] = num_instances - 1;
  if (sync) e.backward[sharded ? kReduceScatter : kAllReduce] = num_instances;
  return e;
}

FsdpEvent Event(EventKind kind, const std::string& fqn, TrainingState state) {
  return FsdpEvent{kind, fqn, state};
}

// One micro-batch's events derived from docs/fsdp1.md, "Events" (the §8.4 orders): `units`
// are the non-root instances in post-forward order; backward visits them in reverse, each
// unit's post-backward before the next unit's pre-backward, the root's post-backward last.
std::vector<FsdpEvent> ExpectedEvents(const Names& units, ShardingStrategy strategy,
                                      std::optional<BackwardPrefetch> prefetch, bool sync,
                                      bool previous_backward_synced) {
  using TS = TrainingState;
  const bool sharded = strategy != ShardingStrategy::kNoShard;
  const bool full_shard = strategy == ShardingStrategy::kFullShard;
  const bool freed_before_forward = full_shard || (sharded && previous_backward_synced);
  const bool freed_in_backward = sharded && (sync || full_shard);
  std::vector<FsdpEvent> out;
  // Forward: root first; every unit reshards after its forward under FULL_SHARD.
  if (freed_before_forward) out.push_back(Event(EventKind::kUnshard, "", TS::kForward));
  for (const std::string& u : units) {
    if (freed_before_forward) out.push_back(Event(EventKind::kUnshard, u, TS::kForward));
    if (full_shard) out.push_back(Event(EventKind::kReshard, u, TS::kForward));
  }
  // Backward: only FULL_SHARD units need an all-gather (the root kept its parameters).
  std::set<std::string> prefetched;
  auto unshard_for_backward = [&](const std::string& u) {
    if (full_shard) out.push_back(Event(EventKind::kUnshard, u, TS::kPreBackward));
    prefetched.insert(u);
  };
  const bool pre = prefetch == BackwardPrefetch::kBackwardPre;
  const bool post = prefetch == BackwardPrefetch::kBackwardPost;
  out.push_back(Event(EventKind::kPreBackward, "", TS::kPreBackward));
  if (pre && !units.empty()) unshard_for_backward(units.back());
  for (size_t k = units.size(); k-- > 0;) {
    const std::string& u = units[k];
    out.push_back(Event(EventKind::kPreBackward, u, TS::kPreBackward));
    if (!prefetched.count(u) && full_shard) out.push_back(Event(EventKind::kUnshard, u, TS::kPreBackward));
    if (pre && k > 0) unshard_for_backward(units[k - 1]);
    if (freed_in_backward) out.push_back(Event(EventKind::kReshard, u, TS::kPostBackward));
    if (post && k > 0) unshard_for_backward(units[k - 1]);
    out.push_back(Event(EventKind::kPostBackward, u, TS::kPostBackward));
  }
  if (freed_in_backward) out.push_back(Event(EventKind::kReshard, "", TS::kPostBackward));
  out.push_back(Event(EventKind::kPostBackward, "", TS::kPostBackward));
  return out;
}

std::shared_ptr<fsdp1::FullyShardedDataParallel> Wrap(const nn::ModulePtr& model,
                                                      ShardingStrategy strategy,
                                                      std::optional<BackwardPrefetch> prefetch,
                                                      bool use_orig_params) {
  fsdp1::FullyShardedDataParallelOptions options;
  options.sharding_strategy = strategy;
  options.backward_prefetch = prefetch;
  options.use_orig_params = use_orig_params;
  options.auto_wrap_policy = std::make_shared<fsdp1::ModuleWrapPolicy>(
      std::set<std::string>{"TransformerEncoderLayer", "TransformerDecoderLayer"});
  return std::make_shared<fsdp1::FullyShardedDataParallel>(model, options);
}

// Runs the no_sync pattern, calling check(micro_batch, sync, previous_backward_synced, comm
// mode, events) after every micro-batch.
template <typename Check>
void RunPattern(fsdp1::FullyShardedDataParallel& fsdp_model, Check&& check) {
  bool previous_backward_synced = true;  // construction leaves every flat parameter sharded
  for (size_t i = 0; i < kNoSyncPattern.size(); ++i) {
    const bool sync = !kNoSyncPattern[i];
    std::optional<fsdp1::NoSync> no_sync;
    if (!sync) no_sync.emplace(fsdp_model.no_sync());
    fsdp2::RecordingObserver observer;
    fsdp2::ScopedObserver install(observer);
    distributed::CommDebugMode comm_mode;
    const nn::Value input = Input();
    TransformerWithSharedParams::get_loss(input, fsdp_model(input).tensor()).backward();
    comm_mode.exit();
    check(i, sync, previous_backward_synced, comm_mode, observer.events());
    previous_backward_synced = sync;
  }
}

using CountsParam = std::tuple<ShardingStrategy, std::optional<BackwardPrefetch>, bool>;

class Fsdp1CommCounts : public ::testing::TestWithParam<CountsParam> {};

TEST_P(Fsdp1CommCounts, PerPhaseCountsFollowTheRules) {
  // Named copies, not structured bindings: the lambdas below capture them.
  const ShardingStrategy strategy = std::get<0>(GetParam());
  const std::optional<BackwardPrefetch> prefetch = std::get<1>(GetParam());
  const bool use_orig_params = std::get<2>(GetParam());
  auto results = RunRanks(2, [&](RankEnv& env) {
    auto model = std::make_shared<TransformerWithSharedParams>(0, false, true);
    const int num_instances = static_cast<int>(WrappedLayers(*model).size()) + 1;
    auto fsdp_model = Wrap(model, strategy, prefetch, use_orig_params);
    ASSERT_EQ(fsdp1::FullyShardedDataParallel::fsdp_modules(fsdp_model).size(),
              static_cast<size_t>(num_instances));
    RunPattern(*fsdp_model, [&](size_t i, bool sync, bool previous_backward_synced,
                                const distributed::CommDebugMode& comm_mode,
                                const std::vector<FsdpEvent>&) {
      const Expected e = ExpectedCounts(strategy, num_instances, sync, previous_backward_synced);
      EXPECT_EQ(comm_mode.get_comm_counts(distributed::CommPhase::kForward), e.forward)
          << "micro-batch " << i << "\n" << comm_mode.str();
      EXPECT_EQ(comm_mode.get_comm_counts(distributed::CommPhase::kBackward), e.backward)
          << "micro-batch " << i << "\n" << comm_mode.str();
    });
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

std::string CountsName(const ::testing::TestParamInfo<CountsParam>& info) {
  const auto& [strategy, prefetch, use_orig_params] = info.param;
  return std::string(fsdp1::ShardingStrategyName(strategy)) + "_" +
         fsdp1::BackwardPrefetchName(prefetch) + (use_orig_params ? "_orig" : "_flat");
}

const auto kStrategies = ::testing::Values(ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp,
                                           ShardingStrategy::kNoShard);
const auto kPrefetches = ::testing::Values(std::optional<BackwardPrefetch>(),
                                           std::optional<BackwardPrefetch>(BackwardPrefetch::kBackwardPre),
                                           std::optional<BackwardPrefetch>(BackwardPrefetch::kBackwardPost));

INSTANTIATE_TEST_SUITE_P(AllModes, Fsdp1CommCounts,
                         ::testing::Combine(kStrategies, kPrefetches, ::testing::Bool()), CountsName);

using EventsParam = std::tuple<ShardingStrategy, std::optional<BackwardPrefetch>>;

class Fsdp1Events : public ::testing::TestWithParam<EventsParam> {};

TEST_P(Fsdp1Events, OrderFollowsThePrefetchMode) {
  const ShardingStrategy strategy = std::get<0>(GetParam());
  const std::optional<BackwardPrefetch> prefetch = std::get<1>(GetParam());
  auto results = RunRanks(2, [&](RankEnv& env) {
    auto model = std::make_shared<TransformerWithSharedParams>(0, false, true);
    const Names units = WrappedLayers(*model);
    auto fsdp_model = Wrap(model, strategy, prefetch, /*use_orig_params=*/false);
    RunPattern(*fsdp_model, [&](size_t i, bool sync, bool previous_backward_synced,
                                const distributed::CommDebugMode&,
                                const std::vector<FsdpEvent>& events) {
      const std::vector<FsdpEvent> expected =
          ExpectedEvents(units, strategy, prefetch, sync, previous_backward_synced);
      EXPECT_EQ(events, expected) << "micro-batch " << i << "\nactual:   " << fsdp2::EventsStr(events)
                                  << "\nexpected: " << fsdp2::EventsStr(expected);
    });
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

std::string EventsName(const ::testing::TestParamInfo<EventsParam>& info) {
  const auto& [strategy, prefetch] = info.param;
  return std::string(fsdp1::ShardingStrategyName(strategy)) + "_" + fsdp1::BackwardPrefetchName(prefetch);
}

INSTANTIATE_TEST_SUITE_P(AllModes, Fsdp1Events, ::testing::Combine(kStrategies, kPrefetches),
                         EventsName);

TEST(Fsdp1CommCounts, ActivationCheckpointingChangesNeitherCountsNorEvents) {
  // Checkpoint wrappers inside the layer instances (wrapped before FSDP) and around them
  // (applied after): the recompute in backward finds the handles in BACKWARD_PRE.
  for (bool checkpoint_before_wrap : {true, false}) {
    auto results = RunRanks(2, [&](RankEnv& env) {
      auto model = std::make_shared<TransformerWithSharedParams>(0, false, true);
      const Names units = WrappedLayers(*model);
      const std::set<std::string> layers = {"TransformerEncoderLayer", "TransformerDecoderLayer"};
      fsdp1::FullyShardedDataParallelOptions options;
      options.auto_wrap_policy = std::make_shared<fsdp1::ModuleWrapPolicy>(layers);
      if (checkpoint_before_wrap) {
        nn::apply_activation_checkpointing(
            model, [&layers](nn::Module& m) { return layers.count(m.type_name()) > 0; });
        options.auto_wrap_policy =
            std::make_shared<fsdp1::ModuleWrapPolicy>(std::set<std::string>{"CheckpointWrapper"});
      }
      auto fsdp_model = std::make_shared<fsdp1::FullyShardedDataParallel>(model, options);
      if (!checkpoint_before_wrap) {
        nn::apply_activation_checkpointing(
            fsdp_model, [](nn::Module& m) { return fsdp1::AsFsdp(m) != nullptr; });
      }
      const int num_instances = static_cast<int>(units.size()) + 1;
      RunPattern(*fsdp_model, [&](size_t i, bool sync, bool previous_backward_synced,
                                  const distributed::CommDebugMode& comm_mode,
                                  const std::vector<FsdpEvent>& events) {
        const Expected e = ExpectedCounts(ShardingStrategy::kFullShard, num_instances, sync,
                                          previous_backward_synced);
        EXPECT_EQ(comm_mode.get_comm_counts(distributed::CommPhase::kForward), e.forward)
            << "micro-batch " << i;
        EXPECT_EQ(comm_mode.get_comm_counts(distributed::CommPhase::kBackward), e.backward)
            << "micro-batch " << i;
        const std::vector<FsdpEvent> expected =
            ExpectedEvents(units, ShardingStrategy::kFullShard, BackwardPrefetch::kBackwardPre, sync,
                           previous_backward_synced);
        EXPECT_EQ(events, expected) << "micro-batch " << i << "\nactual:   " << fsdp2::EventsStr(events)
                                    << "\nexpected: " << fsdp2::EventsStr(expected);
      });
    });
    ASSERT_TRUE(results.all_ok()) << results.summary();
  }
}

TEST(Fsdp1CommCounts, HybridShardAllReducesAcrossReplicas) {
  // World 4 as (2 replicate, 2 shard): FULL_SHARD's counts plus one all-reduce per
  // reduce-scatter when synced.
  for (ShardingStrategy strategy : {ShardingStrategy::kHybridShard, ShardingStrategy::kHybridShardZero2}) {
    auto results = RunRanks(4, [&](RankEnv& env) {
      auto model = std::make_shared<TransformerWithSharedParams>(0, false, true);
      const int num_instances = static_cast<int>(WrappedLayers(*model).size()) + 1;
      fsdp1::FullyShardedDataParallelOptions options;
      options.sharding_strategy = strategy;
      options.device_mesh = distributed::DeviceMesh::Init(env.pg, "cpu", {2, 2}, {"replicate", "shard"});
      options.auto_wrap_policy = std::make_shared<fsdp1::ModuleWrapPolicy>(
          std::set<std::string>{"TransformerEncoderLayer", "TransformerDecoderLayer"});
      auto fsdp_model = std::make_shared<fsdp1::FullyShardedDataParallel>(model, options);
      const ShardingStrategy like = strategy == ShardingStrategy::kHybridShard
                                        ? ShardingStrategy::kFullShard
                                        : ShardingStrategy::kShardGradOp;
      RunPattern(*fsdp_model, [&](size_t i, bool sync, bool previous_backward_synced,
                                  const distributed::CommDebugMode& comm_mode,
                                  const std::vector<FsdpEvent>&) {
        Expected e = ExpectedCounts(like, num_instances, sync, previous_backward_synced);
        if (sync) e.backward[kAllReduce] = num_instances;
        EXPECT_EQ(comm_mode.get_comm_counts(distributed::CommPhase::kForward), e.forward)
            << "micro-batch " << i;
        EXPECT_EQ(comm_mode.get_comm_counts(distributed::CommPhase::kBackward), e.backward)
            << "micro-batch " << i;
      });
    });
    ASSERT_TRUE(results.all_ok()) << results.summary();
  }
}

TEST(Fsdp1CommCounts, ForwardPrefetchIssuesTheSameAllGathers) {
  // forward_prefetch moves the next instance's all-gather into the current pre-forward: the
  // counts are unchanged, the events show each prefetched unshard before the previous
  // instance's reshard from the second iteration on.
  auto results = RunRanks(2, [](RankEnv& env) {
    auto model = std::make_shared<TransformerWithSharedParams>(0, false, true);
    const Names units = WrappedLayers(*model);
    fsdp1::FullyShardedDataParallelOptions options;
    options.forward_prefetch = true;
    options.auto_wrap_policy = std::make_shared<fsdp1::ModuleWrapPolicy>(
        std::set<std::string>{"TransformerEncoderLayer", "TransformerDecoderLayer"});
    auto fsdp_model = std::make_shared<fsdp1::FullyShardedDataParallel>(model, options);
    for (int iter = 0; iter < 2; ++iter) {
      fsdp2::RecordingObserver observer;
      fsdp2::ScopedObserver install(observer);
      distributed::CommDebugMode comm_mode;
      Tensor out = (*fsdp_model)(Input()).tensor();
      comm_mode.exit();
      EXPECT_EQ(comm_mode.get_count(kAllGather), static_cast<int64_t>(units.size() + 1));
      // Forward events: the root's pre-forward prefetches the first unit, each unit's
      // pre-forward the next one (pre-forward order of the first iteration).
      std::vector<FsdpEvent> expected = {Event(EventKind::kUnshard, "", TrainingState::kForward)};
      if (iter == 0) {
        for (const std::string& u : units) {
          expected.push_back(Event(EventKind::kUnshard, u, TrainingState::kForward));
          expected.push_back(Event(EventKind::kReshard, u, TrainingState::kForward));
        }
      } else {
        expected.push_back(Event(EventKind::kUnshard, units[0], TrainingState::kForward));
        for (size_t k = 0; k < units.size(); ++k) {
          if (k + 1 < units.size()) {
            expected.push_back(Event(EventKind::kUnshard, units[k + 1], TrainingState::kForward));
          }
          expected.push_back(Event(EventKind::kReshard, units[k], TrainingState::kForward));
        }
      }
      EXPECT_EQ(observer.events(), expected) << "iteration " << iter << "\n"
                                             << fsdp2::EventsStr(observer.events());
      TransformerWithSharedParams::get_loss(Input(), out).backward();
    }
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

}  // namespace
}  // namespace fsdp::fakes
