// get/set_model_state_dict, get/set_optimizer_state_dict and checkpoint save/load on the
// threaded process group: full state dicts equal the plain model's (parameters sharded on dim
// 0 or, by a shard_placement_fn, on a later dim; rank 0 only with cpu_offload,
// broadcast_from_rank0 loads), a load continues training bit-exactly, a checkpoint saved at N
// ranks loads at M for every pair of {1, 2, 3, 4, 8} bit-exact (model and optimizer state),
// and a corrupt file fails the load on every rank with nothing loaded. Expected values come
// from the unsharded model (deep copies) or the saving run itself.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>

#include "engine/checkpoint/save_load.h"
#include "engine/checkpoint/state_dict.h"
#include "engine/distributed/process_group.h"
#include "engine/fsdp/fsdp_param.h"
#include "engine/fsdp/fully_shard.h"
#include "engine/fsdp/shard_layout.h"
#include "engine/functional/functional.h"
#include "engine/nn/models.h"
#include "engine/optim/adam.h"
#include "engine/serialization/atomic_file.h"
#include "fakes/run_ranks.h"

namespace fsdp::fakes {
namespace {

namespace fs = std::filesystem;
using checkpoint::StateDictOptions;

nn::ModelArgs Args() {
  nn::ModelArgs args;
  args.vocab_size = 7;  // uneven at every world above 1
  args.dropout_p = 0.0;
  return args;
}

std::shared_ptr<nn::Transformer> Sharded(std::shared_ptr<nn::Transformer> model) {
  for (const auto& layer : model->layers()) fsdp2::fully_shard(layer);
  fsdp2::fully_shard(model);
  return model;
}

void TrainStep(nn::Transformer& model, optim::Optimizer& optim, int64_t seed) {
  Generator gen(static_cast<uint64_t>(seed));
  const Tensor inp = Tensor::randint(0, 7, {2, 8}, &gen);
  sum(model(inp).tensor()).backward();
  optim.step();
  optim.zero_grad();
}

// Bytes of every value, by key (a comparable snapshot that survives the ranks' threads).
using Snapshot = std::map<std::string, std::string>;
Snapshot Snap(const nn::StateDict& sd) {
  Snapshot out;
  for (const auto& [key, t] : sd) {
    const Tensor h = t.to(Device::CPU());
    out[key] = ShapeStr(h.sizes()) + DTypeName(h.dtype()) +
               std::string(static_cast<const char*>(h.data_ptr()), h.nbytes());
  }
  return out;
}

StateDictOptions Full(bool cpu_offload = false, bool broadcast = false) {
  StateDictOptions o;
  o.full_state_dict = true;
  o.cpu_offload = cpu_offload;
  o.broadcast_from_rank0 = broadcast;
  return o;
}

class ModelStateDict : public ::testing::TestWithParam<int> {};

TEST_P(ModelStateDict, FullStateDictsEqualThePlainModelAndLoadBack) {
  auto results = RunRanks(GetParam(), [](RankEnv& env) {
    auto model = std::make_shared<nn::Transformer>(Args());
    const Snapshot plain = Snap(model->deep_copy()->state_dict());
    Sharded(model);
    EXPECT_EQ(Snap(checkpoint::get_model_state_dict(*model, Full())), plain);
    const nn::StateDict rank0 = checkpoint::get_model_state_dict(*model, Full(/*cpu_offload=*/true));
    if (env.rank == 0) {
      EXPECT_EQ(Snap(rank0), plain);
    } else {
      EXPECT_TRUE(rank0.empty()) << "rank " << env.rank << " got " << rank0.size() << " entries";
    }
    // broadcast_from_rank0: only rank 0 passes the dict.
    auto other = Sharded(std::make_shared<nn::Transformer>(Args()));
    EXPECT_NE(Snap(checkpoint::get_model_state_dict(*other, Full())), plain);
    checkpoint::set_model_state_dict(*other, rank0, Full(true, /*broadcast=*/true));
    EXPECT_EQ(Snap(checkpoint::get_model_state_dict(*other, Full())), plain);
    // Every rank passes the full dict.
    auto third = Sharded(std::make_shared<nn::Transformer>(Args()));
    checkpoint::set_model_state_dict(*third, checkpoint::get_model_state_dict(*model, Full()), Full());
    EXPECT_EQ(Snap(checkpoint::get_model_state_dict(*third, Full())), plain);
    // A missing key: an error before anything is loaded.
    nn::StateDict partial = checkpoint::get_model_state_dict(*model, Full());
    partial.erase("norm.weight");
    auto fourth = Sharded(std::make_shared<nn::Transformer>(Args()));
    const Snapshot before = Snap(fourth->state_dict());
    try {
      checkpoint::set_model_state_dict(*fourth, partial, Full());
      ADD_FAILURE() << "a dict without norm.weight loaded";
    } catch (const Error& e) {
      EXPECT_NE(e.message().find("Missing key(s) in state_dict: \"norm.weight\""), std::string::npos) << e.what();
    }
    EXPECT_EQ(Snap(fourth->state_dict()), before) << "a failed load changed the model";
    return 0;
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

// shard_placement_fn: every parameter sharded on its largest dim that divides by the world
// (PyTorch's largest-dim policy), so the Transformer's (16, 64) and (64, 16) weights shard on
// dim 1 at worlds 2 and 4: full dicts gather and load those Shard(1) pieces too.
TEST_P(ModelStateDict, FullStateDictsOfShardsOnLaterDimsEqualThePlainModelAndLoadBack) {
  const int world = GetParam();
  auto results = RunRanks(world, [world](RankEnv&) {
    fsdp2::FullyShardOptions options;
    options.shard_placement_fn = [world](const Tensor& param) {
      return std::optional(
          tensor_parallel::Placement::Shard(fsdp2::LargestEvenShardDim(param.sizes(), world)));
    };
    const auto sharded = [&options](std::shared_ptr<nn::Transformer> model) {
      for (const auto& layer : model->layers()) fsdp2::fully_shard(layer, options);
      fsdp2::fully_shard(model, options);
      return model;
    };
    auto model = std::make_shared<nn::Transformer>(Args());
    const Snapshot plain = Snap(model->deep_copy()->state_dict());
    sharded(model);
    int later_dims = 0;
    for (const Tensor& p : model->parameters()) {
      later_dims += fsdp2::LookupFsdpParam(p)->shard_info().shard_dim != 0;
    }
    if (world == 2 || world == 4) EXPECT_GT(later_dims, 0) << "no parameter sharded on a dim > 0";
    EXPECT_EQ(Snap(checkpoint::get_model_state_dict(*model, Full())), plain);
    auto other = sharded(std::make_shared<nn::Transformer>(Args()));
    checkpoint::set_model_state_dict(*other, checkpoint::get_model_state_dict(*model, Full()),
                                     Full());
    EXPECT_EQ(Snap(checkpoint::get_model_state_dict(*other, Full())), plain);
    EXPECT_EQ(Snap(other->state_dict()), Snap(model->state_dict())) << "the loaded shards differ";
    return 0;
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

TEST_P(ModelStateDict, OptimizerStateKeyedByFqnContinuesTrainingExactly) {
  auto results = RunRanks(GetParam(), [](RankEnv&) {
    auto model = Sharded(std::make_shared<nn::Transformer>(Args()));
    optim::Adam optim(model->parameters(), optim::AdamOptions{.lr = 1e-2});
    TrainStep(*model, optim, 1);
    TrainStep(*model, optim, 2);
    const nn::StateDict osd = checkpoint::get_optimizer_state_dict(*model, optim);
    EXPECT_NE(osd.find("state.tok_embeddings.weight.step"), nullptr);
    EXPECT_NE(osd.sharding("state.tok_embeddings.weight.exp_avg"), nullptr);
    EXPECT_EQ(osd.sharding("state.tok_embeddings.weight.step"), nullptr);
    EXPECT_NE(osd.find("param_groups.norm.weight.lr"), nullptr);
    EXPECT_EQ(osd.find("state.output.weight.step"), nullptr) << "a tied weight keeps its first FQN";
    // A fresh model and optimizer (state created by one step of their own) load both dicts in
    // full form, then take the same step as the original.
    auto other = Sharded(std::make_shared<nn::Transformer>(Args()));
    optim::Adam other_optim(other->parameters(), optim::AdamOptions{.lr = 5e-2});
    TrainStep(*other, other_optim, 9);
    checkpoint::set_model_state_dict(*other, checkpoint::get_model_state_dict(*model, Full()), Full());
    checkpoint::set_optimizer_state_dict(*other, other_optim,
                                         checkpoint::get_optimizer_state_dict(*model, optim, Full()), Full());
    EXPECT_EQ(Snap(checkpoint::get_optimizer_state_dict(*other, other_optim)), Snap(osd));
    TrainStep(*model, optim, 3);
    TrainStep(*other, other_optim, 3);
    EXPECT_EQ(Snap(other->state_dict()), Snap(model->state_dict()));
    EXPECT_EQ(Snap(checkpoint::get_optimizer_state_dict(*other, other_optim)),
              Snap(checkpoint::get_optimizer_state_dict(*model, optim)));
    return 0;
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

INSTANTIATE_TEST_SUITE_P(Worlds, ModelStateDict, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

class DistributedCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("dcp_test." + std::to_string(::getpid()) + "." +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

// Saves a trained model and its optimizer at `world` ranks into `dir`; returns the full model
// and optimizer dicts (snapshots, gathered on every rank).
std::pair<Snapshot, Snapshot> SaveTrained(int world, const std::string& dir) {
  auto results = RunRanks(world, [dir](RankEnv& env) {
    auto model = Sharded(std::make_shared<nn::Transformer>(Args()));
    optim::Adam optim(model->parameters(), optim::AdamOptions{.lr = 1e-2});
    TrainStep(*model, optim, 1);
    checkpoint::save(checkpoint::get_model_state_dict(*model), dir, *env.pg);
    checkpoint::save(checkpoint::get_optimizer_state_dict(*model, optim), dir, *env.pg, "optimizer");
    return std::make_pair(Snap(checkpoint::get_model_state_dict(*model, Full())),
                          Snap(checkpoint::get_optimizer_state_dict(*model, optim, Full())));
  });
  EXPECT_TRUE(results.all_ok()) << results.summary();
  return results.all_ok() ? results.values()[0] : std::pair<Snapshot, Snapshot>{};
}

TEST_F(DistributedCheckpoint, SavedAtEveryWorldLoadsAtEveryOtherBitExact) {
  const std::vector<int> worlds = {1, 2, 3, 4, 8};
  for (int n : worlds) {
    const std::string dir = (dir_ / ("n" + std::to_string(n))).string();
    const auto [model_full, optim_full] = SaveTrained(n, dir);
    ASSERT_FALSE(model_full.empty());
    for (int m : worlds) {
      auto results = RunRanks(m, [&dir](RankEnv& env) {
        auto model = Sharded(std::make_shared<nn::Transformer>(Args()));
        optim::Adam optim(model->parameters(), optim::AdamOptions{.lr = 1e-2});
        TrainStep(*model, optim, 7);  // creates the optimizer state the load replaces
        checkpoint::set_model_state_dict(
            *model, checkpoint::load(checkpoint::get_model_state_dict(*model), dir, *env.pg));
        checkpoint::set_optimizer_state_dict(
            *model, optim,
            checkpoint::load(checkpoint::get_optimizer_state_dict(*model, optim), dir, *env.pg,
                             "optimizer"));
        return std::make_pair(Snap(checkpoint::get_model_state_dict(*model, Full())),
                              Snap(checkpoint::get_optimizer_state_dict(*model, optim, Full())));
      });
      ASSERT_TRUE(results.all_ok()) << "saved at " << n << ", loaded at " << m << "\n" << results.summary();
      for (const auto& [model_got, optim_got] : results.values()) {
        EXPECT_EQ(model_got, model_full) << "model saved at " << n << ", loaded at " << m;
        EXPECT_EQ(optim_got, optim_full) << "optimizer saved at " << n << ", loaded at " << m;
      }
    }
  }
}

TEST_F(DistributedCheckpoint, ACorruptFileFailsTheLoadOnEveryRankAndLoadsNothing) {
  const std::string dir = dir_.string();
  SaveTrained(2, dir);
  for (const auto& e : fs::directory_iterator(dir_)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("model-00002-of-00002-", 0) == 0) {
      const std::string bytes = serialization::ReadRegularFile(e.path().string(), 1 << 24);
      std::ofstream(e.path(), std::ios::binary) << bytes.substr(0, bytes.size() / 2);
    }
  }
  auto results = RunRanks(3, [&dir](RankEnv& env) {
    auto model = Sharded(std::make_shared<nn::Transformer>(Args()));
    const Snapshot before = Snap(model->state_dict());
    try {
      checkpoint::set_model_state_dict(
          *model, checkpoint::load(checkpoint::get_model_state_dict(*model), dir, *env.pg));
      ADD_FAILURE() << "rank " << env.rank << " loaded a truncated checkpoint";
    } catch (const Error& e) {
      // Ranks that need the truncated file name it; the others learn that a rank failed.
      const bool names_file = e.message().find("model-00002-of-00002-") != std::string::npos &&
                              e.message().find("truncated") != std::string::npos;
      const bool aborted = e.code() == ErrorCode::kAborted;
      EXPECT_TRUE(names_file || aborted) << e.what();
    }
    EXPECT_EQ(Snap(model->state_dict()), before) << "rank " << env.rank << " changed its model";
    return 0;
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

}  // namespace
}  // namespace fsdp::fakes
