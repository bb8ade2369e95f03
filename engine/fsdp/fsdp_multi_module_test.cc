// fully_shard over several modules at once, fully_shard([m1, m2]) (PyTorch's group forward
// hooks; test_fully_shard_training.py's "mem_eff" module groupings): one parameter group per
// call, unsharded upon the first module's pre-forward and resharded upon the last module's
// post-forward, training like the replicated model; and the errors (an empty list, a module
// already sharded, a group of several modules as the root).
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "engine/core/error.h"
#include "engine/fsdp/fully_shard.h"
#include "engine/fsdp/observer.h"
#include "engine/functional/functional.h"
#include "engine/nn/layers.h"
#include "engine/nn/models.h"
#include "engine/optim/sgd.h"
#include "engine/testing/parity.h"
#include "fakes/run_ranks.h"

namespace fsdp::fakes {
namespace {

using fsdp2::EventKind;
using fsdp2::FsdpEvent;
using fsdp2::TrainingState;

// The module groupings of test_train_parity_with_activation_checkpointing: "mem_eff" shards
// layers[0] alone, the other blocks together, the two embeddings together and (norm, output)
// together; "mem_eff_weight_tied" shards (tok_embeddings, output), whose weight is tied, and
// each block.
void ApplyGrouping(nn::Transformer& model, const std::string& grouping) {
  const std::vector<nn::ModulePtr> layers = model.layers();
  if (grouping == "mem_eff") {
    fsdp2::fully_shard(layers[0]);
    fsdp2::fully_shard(std::vector<nn::ModulePtr>(layers.begin() + 1, layers.end()));
    fsdp2::fully_shard({model.child("tok_embeddings"), model.child("pos_embeddings")});
    fsdp2::fully_shard({model.child("norm"), model.child("output")});
  } else {
    fsdp2::fully_shard({model.child("tok_embeddings"), model.child("output")});
    for (const nn::ModulePtr& layer : layers) fsdp2::fully_shard(layer);
  }
}

class FsdpMultiModuleGrouping : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(FsdpMultiModuleGrouping, TrainsLikeTheReplicatedModel) {
  const std::string grouping = std::get<0>(GetParam());
  const int world = std::get<1>(GetParam());
  auto results = RunRanks(world, [&](RankEnv& env) {
    nn::ModelArgs args;
    args.n_layers = 3;
    args.dropout_p = 0.0;
    args.weight_tying = grouping != "mem_eff";  // separate groups cannot share a weight
    auto model = std::make_shared<nn::Transformer>(args);
    nn::ModulePtr ref_model = model->deep_copy();
    ApplyGrouping(*model, grouping);
    fsdp2::fully_shard(model);
    optim::SGD optim(model->parameters(), optim::SGDOptions{.lr = 1e-2});
    optim::SGD ref_optim(ref_model->parameters(), optim::SGDOptions{.lr = 1e-2});
    // float32 sums over different batch splits (the conformance scenario judges float64).
    fsdp2::ParityOptions parity;
    parity.atol = 1e-4;
    parity.rtol = 1e-4;
    const int64_t local_batch = 2;
    for (int step = 0; step < 3; ++step) {
      const Tensor global_inp =
          Tensor::randint(0, args.vocab_size, {world * local_batch, args.max_seq_len});
      const Tensor local_inp = global_inp.narrow(0, env.rank * local_batch, local_batch).clone();
      sum((*model)(local_inp).tensor()).backward();
      sum((*ref_model)(global_inp).tensor()).backward();
      fsdp2::DivideGrads(*ref_model, world);
      const std::string mismatch = fsdp2::CheckShardedParity(*ref_model, *model, parity);
      EXPECT_TRUE(mismatch.empty()) << "step " << step << "\n" << mismatch;
      optim.step();
      ref_optim.step();
      optim.zero_grad();
      ref_optim.zero_grad();
    }
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

INSTANTIATE_TEST_SUITE_P(Groupings, FsdpMultiModuleGrouping,
                         ::testing::Combine(::testing::Values("mem_eff", "mem_eff_weight_tied"),
                                            ::testing::Values(2, 3)));

// The group of (norm, output) unshards in norm's pre-forward and reshards after output's
// post-forward: one all-gather for both modules, named by their FQNs joined by ", ".
TEST(FsdpMultiModule, GroupUnshardsOnceBeforeTheFirstModuleAndReshardsAfterTheLast) {
  auto results = RunRanks(2, [&](RankEnv&) {
    nn::ModelArgs args;
    args.n_layers = 1;
    args.dropout_p = 0.0;
    args.weight_tying = false;
    auto model = std::make_shared<nn::Transformer>(args);
    std::vector<fsdp2::FSDPModule> handles =
        fsdp2::fully_shard({model->child("norm"), model->child("output")});
    ASSERT_EQ(handles.size(), 2u);
    EXPECT_EQ(&handles[0].state(), &handles[1].state()) << "one state for both modules";
    fsdp2::fully_shard(model);
    // Where norm's forward runs, relative to the group's events.
    auto marks = std::make_shared<std::vector<std::string>>();
    fsdp2::RecordingObserver observer;
    fsdp2::ScopedObserver install(observer);
    auto norm_ran = model->child("norm")->register_forward_hook(
        [&observer, marks](nn::Module&, const nn::Value&,
                           const nn::Value&) -> std::optional<nn::Value> {
          marks->push_back("norm ran after " + std::to_string(observer.events().size()) +
                           " events");
          return std::nullopt;
        });
    const Tensor inp = Tensor::randint(0, args.vocab_size, {2, args.max_seq_len});
    Tensor loss = sum((*model)(inp).tensor());
    const std::vector<FsdpEvent> forward = observer.events();
    const FsdpEvent unshard{EventKind::kUnshard, "norm, output", TrainingState::kForward};
    const FsdpEvent reshard{EventKind::kReshard, "norm, output", TrainingState::kForward};
    std::vector<size_t> unshards, reshards;
    for (size_t i = 0; i < forward.size(); ++i) {
      if (forward[i] == unshard) unshards.push_back(i);
      if (forward[i] == reshard) reshards.push_back(i);
    }
    ASSERT_EQ(unshards.size(), 1u) << "one all-gather for both modules";
    ASSERT_EQ(reshards.size(), 1u);
    EXPECT_EQ(reshards[0], forward.size() - 1) << "resharded after output, the last module";
    ASSERT_EQ(marks->size(), 1u);
    EXPECT_EQ((*marks)[0], "norm ran after " + std::to_string(unshards[0] + 1) + " events")
        << "unsharded in norm's pre-forward, before norm runs";
    loss.backward();
    size_t post_backwards = 0;
    for (const FsdpEvent& e : observer.events({EventKind::kPostBackward})) {
      if (e.fqn == "norm, output") ++post_backwards;
    }
    EXPECT_EQ(post_backwards, 1u) << "one reduce-scatter for both modules";
    norm_ran.remove();
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

// A module given under another given one is managed through it: one group, one FSDPModule.
TEST(FsdpMultiModule, AModuleUnderAnotherGivenOneIsManagedThroughIt) {
  auto results = RunRanks(2, [&](RankEnv&) {
    auto model = std::make_shared<nn::MLPStack>(8);
    const nn::ModulePtr block = model->child("0");
    const nn::ModulePtr inner = block->child("in_proj");
    std::vector<fsdp2::FSDPModule> handles = fsdp2::fully_shard({inner, block});
    ASSERT_EQ(handles.size(), 1u);
    EXPECT_EQ(handles[0].module(), block);
    EXPECT_FALSE(fsdp2::IsFsdpModule(*inner));
    EXPECT_EQ(handles[0].param_group()->fsdp_params().size(), block->parameters().size());
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

TEST(FsdpMultiModule, Errors) {
  auto results = RunRanks(2, [&](RankEnv&) {
    auto model = std::make_shared<nn::MLPStack>(8);
    try {
      fsdp2::fully_shard(std::vector<nn::ModulePtr>{});
      ADD_FAILURE() << "an empty list must be refused";
    } catch (const Error& e) {
      EXPECT_NE(e.message().find("non-empty list of modules"), std::string::npos) << e.what();
    }
    fsdp2::fully_shard(model->child("0"));
    try {
      fsdp2::fully_shard({model->child("1"), model->child("0")});
      ADD_FAILURE() << "a module already sharded must be refused";
    } catch (const Error& e) {
      EXPECT_NE(e.message().find("can only be applied to a module once"), std::string::npos)
          << e.what();
    }
    EXPECT_FALSE(fsdp2::IsFsdpModule(*model->child("1"))) << "a refused call changes nothing";
    // (blocks 1, 2) without a root over them: the first state to run forward is theirs.
    fsdp2::fully_shard({model->child("1"), model->child("2")});
    try {
      (*model)(Tensor::randn({2, 8}));
      ADD_FAILURE() << "a group of several modules cannot be the root";
    } catch (const Error& e) {
      EXPECT_NE(e.message().find("FSDP requires a single root module but got ["), std::string::npos)
          << e.what();
    }
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

}  // namespace
}  // namespace fsdp::fakes
