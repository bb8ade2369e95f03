// FSDP2 state dicts on the threaded process group (docs/checkpoint.md; PyTorch's
// test_fully_shard_state_dict.py): keys equal the plain model's (both keys of the tied
// weight), every FSDP parameter is this rank's torch.chunk rows with its global shape and
// offsets, no communication, SHARDED forced before save; load_state_dict (copy and assign)
// continues training exactly as the saved model; wrong values are errors naming the FQN.
// Expected rows come from ComputeShardInfo (torch.chunk) for any world; the vocabulary of 7
// rows is uneven at every world above 1.
#include <gtest/gtest.h>

#include <memory>

#include "engine/core/bitwise_equal.h"
#include "engine/distributed/comm_debug_mode.h"
#include "engine/fsdp/fsdp_param.h"
#include "engine/fsdp/fully_shard.h"
#include "engine/fsdp/shard_layout.h"
#include "engine/functional/functional.h"
#include "engine/nn/models.h"
#include "engine/optim/adam.h"
#include "fakes/run_ranks.h"

namespace fsdp::fakes {
namespace {

nn::ModelArgs Args() {
  nn::ModelArgs args;
  args.vocab_size = 7;
  args.dropout_p = 0.0;
  return args;
}

std::shared_ptr<nn::Transformer> Shard(std::shared_ptr<nn::Transformer> model, bool raf = true) {
  fsdp2::FullyShardOptions options;
  options.reshard_after_forward = raf;
  for (const auto& layer : model->layers()) fsdp2::fully_shard(layer, options);
  fsdp2::fully_shard(model, options);
  return model;
}

// A detached copy of every value (state_dict() values alias the live parameters).
nn::StateDict Cloned(const nn::StateDict& sd) {
  nn::StateDict out;
  for (const auto& [k, v] : sd) out.insert(k, v.clone());
  out.sharded = sd.sharded;
  return out;
}

void TrainStep(nn::Transformer& model, optim::Adam& optim, const Tensor& inp) {
  sum(model(inp).tensor()).backward();
  optim.step();
  optim.zero_grad();
}

class FsdpStateDict : public ::testing::TestWithParam<int> {};

TEST_P(FsdpStateDict, KeysAreThePlainModelsAndValuesAreThisRanksChunkRows) {
  auto results = RunRanks(GetParam(), [](RankEnv& env) {
    auto model = std::make_shared<nn::Transformer>(Args());
    const nn::StateDict plain = Cloned(model->deep_copy()->state_dict());
    Shard(model);
    distributed::CommDebugMode comm;
    const nn::StateDict sd = model->state_dict();
    comm.exit();
    EXPECT_TRUE(comm.get_comm_counts().empty()) << "state_dict() communicated";
    EXPECT_EQ(sd.keys(), plain.keys());
    EXPECT_NE(sd.find("output.weight"), nullptr);
    EXPECT_NE(sd.find("tok_embeddings.weight"), nullptr);
    for (const auto& [key, full] : plain) {
      const nn::ShardedEntry* s = sd.sharding(key);
      EXPECT_NE(s, nullptr) << key << " (every parameter of this model is FSDP-managed)";
      if (s == nullptr) continue;
      const fsdp2::ShardInfo info = fsdp2::ComputeShardInfo(full.sizes(), env.rank, env.world_size);
      EXPECT_EQ(s->global_shape, full.sizes()) << key;
      EXPECT_EQ(s->offsets[0], info.row_begin) << key;
      EXPECT_TRUE(BitwiseEqual(sd.at(key), full.narrow(0, info.row_begin, info.rows))) << key;
    }
    return 0;
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

TEST_P(FsdpStateDict, SavingForcesShardedAfterAForwardWithoutReshard) {
  auto results = RunRanks(GetParam(), [](RankEnv&) {
    auto model = Shard(std::make_shared<nn::Transformer>(Args()), /*raf=*/false);
    const nn::StateDict before = Cloned(model->state_dict());
    (*model)(Tensor::randint(0, 7, {2, 8}));  // leaves every group UNSHARDED
    const nn::StateDict after = model->state_dict();
    EXPECT_EQ(after.keys(), before.keys());
    for (const auto& [key, v] : before) {
      EXPECT_TRUE(BitwiseEqual(after.at(key), v)) << key;
      EXPECT_NE(after.sharding(key), nullptr) << key;
      if (after.sharding(key) == nullptr) continue;
      EXPECT_EQ(after.sharding(key)->offsets, before.sharding(key)->offsets) << key;
    }
    return 0;
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

TEST_P(FsdpStateDict, LoadThenTrainingContinuesAsWithoutTheSave) {
  for (const bool assign : {false, true}) {
    auto results = RunRanks(GetParam(), [assign](RankEnv&) {
      auto model = Shard(std::make_shared<nn::Transformer>(Args()));
      optim::Adam optim(model->parameters(), optim::AdamOptions{.lr = 1e-2});
      const Tensor inp = Tensor::randint(0, 7, {2, 8});
      TrainStep(*model, optim, inp);
      const nn::StateDict saved = Cloned(model->state_dict());
      // A fresh model (other initial values) loads the saved values and takes the same step.
      auto other = Shard(std::make_shared<nn::Transformer>(Args()));
      other->load_state_dict(saved, /*strict=*/true, assign);
      for (const auto& [key, v] : saved) EXPECT_TRUE(BitwiseEqual(other->state_dict().at(key), v)) << key;
      for (const Tensor& p : other->parameters()) {
        EXPECT_NE(fsdp2::LookupFsdpParam(p), nullptr) << "assign=" << assign;
      }
      // Fresh optimizers on both sides (optimizer state is not part of the model).
      optim::Adam a(model->parameters(), optim::AdamOptions{.lr = 1e-2});
      optim::Adam b(other->parameters(), optim::AdamOptions{.lr = 1e-2});
      for (int i = 0; i < 2; ++i) {
        TrainStep(*model, a, inp);
        TrainStep(*other, b, inp);
      }
      const nn::StateDict want = model->state_dict();
      const nn::StateDict got = other->state_dict();
      for (const auto& [key, v] : want) EXPECT_TRUE(BitwiseEqual(got.at(key), v)) << key << " assign=" << assign;
      return 0;
    });
    ASSERT_TRUE(results.all_ok()) << results.summary();
  }
}

TEST_P(FsdpStateDict, LoadingAFullTensorOrAnotherRanksShardNamesTheFqn) {
  auto results = RunRanks(GetParam(), [](RankEnv& env) {
    auto model = Shard(std::make_shared<nn::Transformer>(Args()));
    nn::StateDict full = Cloned(model->state_dict());
    full.sharded.erase("norm.weight");
    try {
      model->load_state_dict(full);
      ADD_FAILURE() << "a plain tensor was loaded into a DTensor parameter";
    } catch (const Error& e) {
      EXPECT_NE(e.message().find("norm.weight"), std::string::npos) << e.what();
      EXPECT_NE(e.message().find("plain tensor"), std::string::npos) << e.what();
    }
    if (env.world_size > 1) {
      nn::StateDict moved = Cloned(model->state_dict());
      nn::ShardedEntry e = *moved.sharding("layers.0.attention.wq.weight");
      e.offsets[0] += 1;
      moved.sharded.insert("layers.0.attention.wq.weight", e);
      try {
        model->load_state_dict(moved);
        ADD_FAILURE() << "another rank's shard was loaded";
      } catch (const Error& err) {
        EXPECT_NE(err.message().find("layers.0.attention.wq.weight"), std::string::npos) << err.what();
        EXPECT_NE(err.message().find("not this rank's shard"), std::string::npos) << err.what();
      }
    }
    return 0;
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

INSTANTIATE_TEST_SUITE_P(Worlds, FsdpStateDict, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

}  // namespace
}  // namespace fsdp::fakes
