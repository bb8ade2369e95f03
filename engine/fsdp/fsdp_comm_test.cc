// fully_shard communication counts and event order (seed 000, test_fully_shard_comm.py):
// TestFullyShardCommunication (counts for Transformer with reshard_after_forward True / False /
// 2, manual reshard with reshard_after_forward False), TestFullyShardPrefetch (the exact
// unshard / post_backward lists of docs/fsdp-behaviour.md, "Backward prefetch", with and
// without activation
// checkpointing, several forwards before one backward, the mistargeted prefetch) and
// TestFullyShardUnshardMultiThread, over the threaded process group at world 4 (2 where the
// seed uses 2).
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "engine/autograd/engine.h"
#include "engine/core/bitwise_equal.h"
#include "engine/distributed/comm_debug_mode.h"
#include "engine/fsdp/fully_shard.h"
#include "engine/fsdp/observer.h"
#include "engine/functional/functional.h"
#include "engine/nn/checkpoint.h"
#include "engine/nn/layers.h"
#include "engine/nn/models.h"
#include "engine/optim/sgd.h"
#include "fakes/run_ranks.h"

namespace fsdp::fakes {
namespace {

using distributed::CommDebugMode;
using distributed::CommPhase;
using fsdp2::EventKind;
using fsdp2::FsdpEvent;
using fsdp2::ReshardAfterForward;
using fsdp2::TrainingState;

constexpr const char* kAllGather = "c10d._allgather_base_";
constexpr const char* kReduceScatter = "c10d._reduce_scatter_base_";

enum class CheckpointImpl { kNone, kUtils, kComposable };

std::string RafName(const ReshardAfterForward& raf) {
  if (const bool* b = std::get_if<bool>(&raf)) return *b ? "True" : "False";
  return std::to_string(std::get<int>(raf));
}

bool IsFalse(const ReshardAfterForward& raf) {
  const bool* b = std::get_if<bool>(&raf);
  return b != nullptr && !*b;
}

// `_init_transformer`: every TransformerBlock (optionally under composable checkpoint) and
// the root are sharded with `raf`.
std::shared_ptr<nn::Transformer> ShardedTransformer(int64_t n_layers, ReshardAfterForward raf,
                                                    CheckpointImpl checkpoint_impl) {
  nn::ModelArgs args;
  args.n_layers = n_layers;
  args.checkpoint_activations = checkpoint_impl == CheckpointImpl::kUtils;
  auto model = std::make_shared<nn::Transformer>(args);
  fsdp2::FullyShardOptions options;
  options.reshard_after_forward = raf;
  for (const nn::ModulePtr& block : model->layers()) {
    if (checkpoint_impl == CheckpointImpl::kComposable) nn::checkpoint(block);
    fsdp2::fully_shard(block, options);
  }
  fsdp2::fully_shard(model, options);
  return model;
}

Tensor Tokens(const nn::ModelArgs& args = {}) {
  return Tensor::randint(0, args.vocab_size, {2, args.max_seq_len});
}

FsdpEvent Unshard(const std::string& fqn, TrainingState s) { return {EventKind::kUnshard, fqn, s}; }
FsdpEvent PostBackward(const std::string& fqn) {
  return {EventKind::kPostBackward, fqn, TrainingState::kPostBackward};
}

// ---- Communication counts ------------------------------------------------------------------

class FsdpCommCount : public ::testing::TestWithParam<ReshardAfterForward> {};

TEST_P(FsdpCommCount, TransformerForwardBackward) {
  // docs/fsdp-behaviour.md, "Collective counts": fwd AG N+1; bwd AG N (True, 2: the root is
  // never resharded after forward) or 0 (False); bwd RS N+1.
  const ReshardAfterForward raf = GetParam();
  auto results = RunRanks(4, [&](RankEnv& env) {
    auto model = ShardedTransformer(2, raf, CheckpointImpl::kNone);
    const int64_t num_blocks = 2;
    const Tensor inp = Tokens();
    CommDebugMode fwd_comm_mode;
    Tensor loss = (*model)(inp).tensor();
    fwd_comm_mode.exit();
    const auto fwd_counts = fwd_comm_mode.get_comm_counts();
    EXPECT_EQ(fwd_counts.size(), 1u);
    EXPECT_EQ(fwd_comm_mode.get_count(kAllGather), num_blocks + 1);
    CommDebugMode bwd_comm_mode;
    sum(loss).backward();
    bwd_comm_mode.exit();
    const auto bwd_counts = bwd_comm_mode.get_comm_counts();
    if (IsFalse(raf)) {
      EXPECT_EQ(bwd_counts.size(), 1u);
    } else {
      EXPECT_EQ(bwd_counts.size(), 2u);
      EXPECT_EQ(bwd_comm_mode.get_count(kAllGather), num_blocks);
    }
    EXPECT_EQ(bwd_comm_mode.get_count(kReduceScatter), num_blocks + 1);
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

TEST_P(FsdpCommCount, PhasesAreAttributedInOneMode) {
  // One CommDebugMode over forward and backward: the FSDP phase guards split the counts.
  const ReshardAfterForward raf = GetParam();
  auto results = RunRanks(4, [&](RankEnv& env) {
    auto model = ShardedTransformer(2, raf, CheckpointImpl::kNone);
    const Tensor inp = Tokens();
    CommDebugMode mode;
    sum((*model)(inp).tensor()).backward();
    mode.exit();
    const auto fwd = mode.get_comm_counts(CommPhase::kForward);
    const auto bwd = mode.get_comm_counts(CommPhase::kBackward);
    EXPECT_EQ(fwd.at(kAllGather), 3);
    EXPECT_EQ(fwd.count(kReduceScatter), 0u);
    EXPECT_EQ(bwd.count(kAllGather) ? bwd.at(kAllGather) : 0, IsFalse(raf) ? 0 : 2);
    EXPECT_EQ(bwd.at(kReduceScatter), 3);
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

INSTANTIATE_TEST_SUITE_P(Fsdp, FsdpCommCount,
                         ::testing::Values(ReshardAfterForward(true), ReshardAfterForward(false),
                                           ReshardAfterForward(2)),
                         [](const auto& info) { return "Raf" + RafName(info.param); });

TEST(FsdpCommCountManual, ReshardWithReshardAfterForwardFalse) {
  // docs/fsdp-behaviour.md, "Manual unshard and reshard": with every module
  // reshard_after_forward=False, forward = num_fsdp_modules
  // all-gathers; after a manual reshard of every module, backward = num_fsdp_modules
  // all-gathers and reduce-scatters.
  auto results = RunRanks(4, [](RankEnv& env) {
    auto model = ShardedTransformer(2, false, CheckpointImpl::kNone);
    int64_t num_fsdp_modules = 0;
    for (const nn::ModulePtr& m : model->modules()) num_fsdp_modules += fsdp2::IsFsdpModule(*m);
    EXPECT_EQ(num_fsdp_modules, 3);
    const Tensor inp = Tokens();
    CommDebugMode fwd_comm_mode;
    Tensor loss = (*model)(inp).tensor();
    fwd_comm_mode.exit();
    EXPECT_EQ(fwd_comm_mode.get_comm_counts().size(), 1u);
    EXPECT_EQ(fwd_comm_mode.get_count(kAllGather), num_fsdp_modules);
    for (const nn::ModulePtr& m : model->modules()) {
      if (fsdp2::IsFsdpModule(*m)) fsdp2::FSDPModule(m).reshard();
    }
    CommDebugMode bwd_comm_mode;
    sum(loss).backward();
    bwd_comm_mode.exit();
    EXPECT_EQ(bwd_comm_mode.get_comm_counts().size(), 2u);
    EXPECT_EQ(bwd_comm_mode.get_count(kAllGather), num_fsdp_modules);
    EXPECT_EQ(bwd_comm_mode.get_count(kReduceScatter), num_fsdp_modules);
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

TEST(FsdpCommCountUnshardInBackward, EmbeddingsStayShardedAndAreStillReduced) {
  // test_train_parity_with_activation_checkpointing's mem_eff grouping: fully_shard([
  // tok_embeddings, pos_embeddings]) with set_unshard_in_backward(False) (an embedding's
  // backward needs no weights). Backward all-gathers the blocks only, yet reduce-scatters every
  // group, and the embeddings' gradient shards equal those of a twin without the switch.
  auto results = RunRanks(2, [](RankEnv& env) {
    nn::ModelArgs args;
    args.n_layers = 2;
    args.weight_tying = false;
    args.dropout_p = 0.0;
    auto model = std::make_shared<nn::Transformer>(args);
    auto twin = std::static_pointer_cast<nn::Transformer>(model->deep_copy());
    for (const auto& m : {model, twin}) {
      for (const auto& layer : m->layers()) fsdp2::fully_shard(layer);
      fsdp2::fully_shard(std::vector<nn::ModulePtr>{m->get_submodule("tok_embeddings"),
                                                    m->get_submodule("pos_embeddings")});
      fsdp2::fully_shard(m);
    }
    fsdp2::FSDPModule(model->get_submodule("tok_embeddings")).set_unshard_in_backward(false);
    const Tensor inp = Tokens(args);
    sum((*twin)(inp).tensor()).backward();
    Tensor loss = (*model)(inp).tensor();
    CommDebugMode bwd_comm_mode;
    sum(loss).backward();
    bwd_comm_mode.exit();
    EXPECT_EQ(bwd_comm_mode.get_count(kAllGather), 2);      // the blocks
    EXPECT_EQ(bwd_comm_mode.get_count(kReduceScatter), 4);  // blocks, embeddings, root
    for (const char* fqn : {"tok_embeddings.weight", "pos_embeddings.weight"}) {
      const Tensor grad = model->get_parameter(fqn).grad();
      ASSERT_TRUE(grad.defined()) << fqn;
      EXPECT_TRUE(BitwiseEqual(grad, twin->get_parameter(fqn).grad())) << fqn;
    }
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

// ---- Event order -------------------------------------------------------------------------

struct PrefetchCase {
  ReshardAfterForward raf;
  CheckpointImpl checkpoint_impl;
};

class FsdpPrefetchEvents : public ::testing::TestWithParam<PrefetchCase> {};

TEST_P(FsdpPrefetchEvents, ForwardBackwardThreeIterations) {
  // `_test_backward_prefetch_forward_backward` (n_layers = 3, three iterations, optimizer step
  // and zero_grad(set_to_none = iter % 2 == 0) between them).
  const PrefetchCase c = GetParam();
  auto results = RunRanks(4, [&](RankEnv& env) {
    auto model = ShardedTransformer(3, c.raf, c.checkpoint_impl);
    optim::SGD optim(model->parameters(), optim::SGDOptions{.lr = 1e-2});
    const Tensor inp = Tokens();
    fsdp2::RecordingObserver observer;
    fsdp2::ScopedObserver install(observer);
    const std::set<EventKind> kinds = {EventKind::kUnshard, EventKind::kPostBackward};
    const TrainingState F = TrainingState::kForward;
    const TrainingState B = TrainingState::kPreBackward;
    for (int iter = 0; iter < 3; ++iter) {
      Tensor loss = (*model)(inp).tensor();
      const std::vector<FsdpEvent> expected_fwd = {Unshard("", F), Unshard("layers.0", F),
                                                   Unshard("layers.1", F),
                                                   Unshard("layers.2", F)};
      EXPECT_EQ(observer.events(kinds), expected_fwd)
          << "iter " << iter << ": " << fsdp2::EventsStr(observer.events(kinds));
      observer.clear();
      sum(loss).backward();
      std::vector<FsdpEvent> expected_bwd = {
          Unshard("layers.2", B), Unshard("layers.1", B), PostBackward("layers.2"),
          Unshard("layers.0", B), PostBackward("layers.1"), PostBackward("layers.0"),
          PostBackward("")};
      if (IsFalse(c.raf)) {
        std::erase_if(expected_bwd, [](const FsdpEvent& e) { return e.kind == EventKind::kUnshard; });
      }
      EXPECT_EQ(observer.events(kinds), expected_bwd)
          << "iter " << iter << ": " << fsdp2::EventsStr(observer.events(kinds));
      observer.clear();
      optim.step();
      optim.zero_grad(/*set_to_none=*/iter % 2 == 0);
    }
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

TEST_P(FsdpPrefetchEvents, MultiForwardOneBackward) {
  // `_test_backward_prefetch_multi_forward` (docs/fsdp-behaviour.md, "Several forwards before
  // one backward"): two forwards, one backward of the sum.
  const PrefetchCase c = GetParam();
  auto results = RunRanks(4, [&](RankEnv& env) {
    auto model = ShardedTransformer(3, c.raf, c.checkpoint_impl);
    const Tensor inp = Tokens();
    fsdp2::RecordingObserver observer;
    fsdp2::ScopedObserver install(observer);
    const std::set<EventKind> kinds = {EventKind::kUnshard, EventKind::kPostBackward};
    const TrainingState F = TrainingState::kForward;
    const TrainingState B = TrainingState::kPreBackward;
    Tensor loss1 = (*model)(inp).tensor();
    Tensor loss2 = (*model)(inp).tensor();
    std::vector<FsdpEvent> expected_fwd = {Unshard("", F), Unshard("layers.0", F),
                                           Unshard("layers.1", F), Unshard("layers.2", F)};
    if (!IsFalse(c.raf)) {
      for (const char* l : {"layers.0", "layers.1", "layers.2"}) expected_fwd.push_back(Unshard(l, F));
    }
    EXPECT_EQ(observer.events(kinds), expected_fwd) << fsdp2::EventsStr(observer.events(kinds));
    observer.clear();
    sum(loss1 + loss2).backward();
    const std::vector<FsdpEvent> pattern = {
        Unshard("layers.2", B), Unshard("layers.1", B), PostBackward("layers.2"),
        Unshard("layers.0", B), PostBackward("layers.1"), PostBackward("layers.0")};
    std::vector<FsdpEvent> expected_bwd;
    for (int use = 0; use < 2; ++use) {
      for (const FsdpEvent& e : pattern) {
        // With False the first pattern finds everything unsharded; post-backward resharded
        // the blocks, so the second pattern all-gathers again.
        if (use == 0 && IsFalse(c.raf) && e.kind == EventKind::kUnshard) continue;
        expected_bwd.push_back(e);
      }
    }
    expected_bwd.push_back(PostBackward(""));
    EXPECT_EQ(observer.events(kinds), expected_bwd) << fsdp2::EventsStr(observer.events(kinds));
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

std::vector<PrefetchCase> PrefetchCases() {
  std::vector<PrefetchCase> cases;
  for (ReshardAfterForward raf :
       {ReshardAfterForward(true), ReshardAfterForward(false), ReshardAfterForward(2)}) {
    for (CheckpointImpl ci : {CheckpointImpl::kNone, CheckpointImpl::kUtils,
                              CheckpointImpl::kComposable}) {
      cases.push_back({raf, ci});
    }
  }
  return cases;
}

std::string PrefetchCaseName(const ::testing::TestParamInfo<PrefetchCase>& info) {
  static const char* const kImpl[] = {"NoAC", "UtilsAC", "ComposableAC"};
  return "Raf" + RafName(info.param.raf) + kImpl[static_cast<int>(info.param.checkpoint_impl)];
}

INSTANTIATE_TEST_SUITE_P(Fsdp, FsdpPrefetchEvents, ::testing::ValuesIn(PrefetchCases()),
                         PrefetchCaseName);

TEST(FsdpPrefetchUnusedInBackward, MistargetedPrefetchIsCleanedUpOnLastBackward) {
  // `_test_backward_prefetch_unused_in_backward` (docs/fsdp-behaviour.md, "Backward
  // prefetch"), as the seed asserts it (E2 / early
  // E3 end-of-backward sweep: no post_backward for groups that are not UNSHARDED).
  auto results = RunRanks(4, [](RankEnv& env) {
    const int64_t dim = 8;
    auto lin0 = std::make_shared<nn::Linear>(dim, dim);
    auto double_linear = std::make_shared<nn::DoubleLinear>(dim);
    auto model = std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{lin0, double_linear});
    fsdp2::fully_shard(lin0);
    fsdp2::fully_shard(double_linear->child("lin1"));
    fsdp2::fully_shard(double_linear->child("lin2"));
    fsdp2::FSDPModule root = fsdp2::fully_shard(model);
    const Tensor inp = Tensor::randn({4, dim});
    fsdp2::RecordingObserver observer;
    fsdp2::ScopedObserver install(observer);
    const std::set<EventKind> kinds = {EventKind::kUnshard, EventKind::kPostBackward};
    const TrainingState F = TrainingState::kForward;
    const TrainingState B = TrainingState::kPreBackward;

    nn::Value out = (*model)(inp);
    Tensor loss1 = out[0].tensor();
    Tensor loss2 = out[1].tensor();
    EXPECT_EQ(observer.events(kinds),
              (std::vector<FsdpEvent>{Unshard("0", F), Unshard("1.lin1", F), Unshard("1.lin2", F)}))
        << fsdp2::EventsStr(observer.events(kinds));
    observer.clear();

    root.set_is_last_backward(false);
    sum(loss2).backward(Tensor(), /*retain_graph=*/true);
    EXPECT_EQ(observer.events(kinds),
              (std::vector<FsdpEvent>{Unshard("1.lin2", B),
                                      Unshard("1.lin1", B),  // mistargeted prefetch
                                      PostBackward("1.lin2"), Unshard("0", B),
                                      PostBackward("0")}))
        << fsdp2::EventsStr(observer.events(kinds));
    observer.clear();
    auto* lin1_group = fsdp2::FSDPModule(double_linear->child("lin1")).param_group();
    EXPECT_TRUE(lin1_group->has_pending_all_gather());  // kept: not the last backward

    root.set_is_last_backward(true);
    sum(loss1).backward();
    EXPECT_EQ(observer.events(kinds),
              (std::vector<FsdpEvent>{Unshard("0", B), PostBackward("1.lin1"), PostBackward("0")}))
        << fsdp2::EventsStr(observer.events(kinds));
    EXPECT_FALSE(lin1_group->has_pending_all_gather());
    EXPECT_TRUE(lin1_group->post_forward_indices().empty());
    EXPECT_TRUE(root.state().comm_ctx()->post_forward_order.empty());
    for (const nn::ModulePtr& m : model->modules()) {
      if (auto* g = fsdp2::IsFsdpModule(*m) ? fsdp2::FSDPModule(m).param_group() : nullptr) {
        EXPECT_TRUE(g->is_sharded()) << g->module_fqn();
        EXPECT_EQ(g->training_state(), TrainingState::kIdle);
      }
    }
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

// ---- Manual unshard ----------------------------------------------------------------------

TEST(FsdpUnshard, NoParamGroup) {
  // test_unshard_no_param_group: the root Sequential manages no parameters.
  auto results = RunRanks(2, [](RankEnv& env) {
    auto model = std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{
        std::make_shared<nn::Linear>(4, 4), std::make_shared<nn::Linear>(4, 4)});
    for (const nn::ModulePtr& lin : model->children()) fsdp2::fully_shard(lin);
    fsdp2::FSDPModule root = fsdp2::fully_shard(model);
    EXPECT_EQ(root.param_group(), nullptr);
    fsdp2::UnshardHandle handle = root.unshard(/*async_op=*/true);
    handle.wait();
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

TEST(FsdpUnshard, WithoutLazyInit) {
  // test_unshard_without_lazy_init: unshard() before any forward registers the unsharded
  // parameters, equal to the reference's.
  auto results = RunRanks(2, [](RankEnv& env) {
    auto model = std::make_shared<nn::MLP>(4);
    nn::ModulePtr ref_model = model->deep_copy();
    fsdp2::FSDPModule fsdp_model = fsdp2::fully_shard(model);
    fsdp_model.unshard();
    const auto ref_params = ref_model->parameters();
    const auto params = model->parameters();
    ASSERT_EQ(ref_params.size(), params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_EQ(params[i].sizes(), ref_params[i].sizes());
      EXPECT_EQ(params[i].to_doubles(), ref_params[i].to_doubles());
    }
    // Async: the handle's wait (idempotent) finishes it.
    fsdp_model.reshard();
    fsdp2::UnshardHandle handle = fsdp_model.unshard(/*async_op=*/true);
    EXPECT_TRUE(fsdp_model.param_group()->has_pending_all_gather());
    handle.wait();
    handle.wait();
    EXPECT_TRUE(fsdp_model.param_group()->is_unsharded());
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

TEST(FsdpUnshard, InvalidIntReshardAfterForward) {
  auto results = RunRanks(4, [](RankEnv& env) {
    auto model = std::make_shared<nn::MLP>(4);
    fsdp2::FullyShardOptions options;
    options.reshard_after_forward = 3;
    try {
      fsdp2::fully_shard(model, options);
      ADD_FAILURE() << "expected an error";
    } catch (const Error& e) {
      EXPECT_EQ(e.message(),
                "If passing reshard_after_forward as an int, it should be a factor of 4, not 3");
    }
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

}  // namespace
}  // namespace fsdp::fakes
