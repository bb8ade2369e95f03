// CommDebugMode: PyTorch's keys, per-phase and per-module counts, nesting, functional
// collectives, and recording through decorators without double counting.
#include "engine/distributed/comm_debug_mode.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engine/distributed/flight_recorder.h"
#include "engine/distributed/functional_collectives.h"
#include "fakes/mock_process_group.h"
#include "fakes/recording_process_group.h"
#include "fakes/run_ranks.h"

namespace fsdp::fakes {
namespace {

using distributed::CommDebugMode;
using distributed::CommPhase;
using distributed::CommPhaseGuard;
using Counts = CommDebugMode::Counts;

TEST(CommDebugModeTest, CountsC10dOpsWithPyTorchKeysAndBytes) {
  auto results = RunRanks(2, [](RankEnv& env) {
    auto& pg = *env.pg;
    CommDebugMode mode;
    Tensor shard = Tensor::zeros({3});
    Tensor full = Tensor::zeros({6});
    pg.all_gather_into_tensor(full, shard);
    pg.all_gather_into_tensor(full, shard);
    pg.reduce_scatter_tensor(shard, full);
    pg.all_reduce(shard);
    pg.broadcast(shard, 0);
    std::vector<Tensor> outs = {Tensor::zeros({3}), Tensor::zeros({3})};
    pg.all_gather(outs, shard);
    pg.barrier();  // not counted, as in PyTorch
    EXPECT_EQ(mode.get_comm_counts(), (Counts{{"c10d._allgather_base_", 2},
                                              {"c10d._reduce_scatter_base_", 1},
                                              {"c10d.allreduce_", 1},
                                              {"c10d.broadcast_", 1},
                                              {"c10d.allgather_", 1}}));
    EXPECT_EQ(mode.get_total_counts(), 6);
    EXPECT_EQ(mode.get_count("_allgather_base_"), 2);
    EXPECT_EQ(mode.get_count("c10d._reduce_scatter_base_"), 1);
    EXPECT_EQ(mode.get_count("all_gather_into_tensor"), 0);
    // Payload bytes: the full buffer (all-gather output, reduce-scatter input).
    EXPECT_EQ(mode.get_comm_bytes()["c10d._allgather_base_"], 2 * 6 * 4);
    EXPECT_EQ(mode.get_comm_bytes()["c10d._reduce_scatter_base_"], 6 * 4);
    const auto records = mode.records();
    ASSERT_EQ(records.size(), 6u);
    EXPECT_EQ(records[0].info.sequence_number, 1u);
    EXPECT_EQ(records[0].module_fqn, "Global");
    mode.exit();
    pg.all_reduce(shard);  // after exit: not counted
    EXPECT_EQ(mode.get_total_counts(), 6);
    mode.enter();  // re-entering clears, like `with comm_mode:` again
    EXPECT_EQ(mode.get_total_counts(), 0);
    pg.all_reduce(shard);
    EXPECT_EQ(mode.get_total_counts(), 1);
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

TEST(CommDebugModeTest, PhasesAndModulesLikeTheFsdpCountTests) {
  auto results = RunRanks(2, [](RankEnv& env) {
    auto& pg = *env.pg;
    Tensor shard = Tensor::zeros({2});
    Tensor full = Tensor::zeros({4});
    CommDebugMode mode;
    {
      CommPhaseGuard root("", CommPhase::kForward);
      pg.all_gather_into_tensor(full, shard);  // root group
      for (const char* block : {"layers.0", "layers.1"}) {
        CommPhaseGuard g(block, CommPhase::kForward);
        pg.all_gather_into_tensor(full, shard);
      }
    }
    {
      for (const char* block : {"layers.1", "layers.0"}) {
        CommPhaseGuard g(block, CommPhase::kBackward);
        pg.all_gather_into_tensor(full, shard);
        pg.reduce_scatter_tensor(shard, full);
      }
      CommPhaseGuard root("", CommPhase::kBackward);
      pg.reduce_scatter_tensor(shard, full);
    }
    const Counts fwd = mode.get_comm_counts(CommPhase::kForward);
    const Counts bwd = mode.get_comm_counts(CommPhase::kBackward);
    EXPECT_EQ(fwd.size(), 1u);  // only all-gathers in forward
    EXPECT_EQ(fwd.at("c10d._allgather_base_"), 3);
    EXPECT_EQ(bwd.size(), 2u);  // all-gather + reduce-scatter in backward
    EXPECT_EQ(bwd.at("c10d._allgather_base_"), 2);
    EXPECT_EQ(bwd.at("c10d._reduce_scatter_base_"), 3);
    const auto modules = mode.get_comm_module_counts();
    EXPECT_EQ(modules.at("layers.0").at("forward").at("c10d._allgather_base_"), 1);
    EXPECT_EQ(modules.at("layers.0").at("backward").at("c10d._reduce_scatter_base_"), 1);
    EXPECT_EQ(modules.at("Global").at("backward").at("c10d._reduce_scatter_base_"), 3);
    EXPECT_NE(mode.str().find("BACKWARD PASS"), std::string::npos);
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

TEST(CommDebugModeTest, CollectivesCountInEnclosingAndForwardParentModules) {
  distributed::CommDebugMode mode;
  testing::NiceMock<MockProcessGroup> pg(0, 1);
  Tensor t = Tensor::zeros({1});
  {
    CommPhaseGuard outer("model", CommPhase::kForward);
    CommPhaseGuard inner("model.block", CommPhase::kForward);
    pg.all_reduce(t);
  }
  {
    // Backward of the inner module alone still reaches its forward parent.
    CommPhaseGuard inner("model.block", CommPhase::kBackward);
    pg.all_reduce(t);
  }
  const auto modules = mode.get_comm_module_counts();
  EXPECT_EQ(modules.at("model").at("forward").at("c10d.allreduce_"), 1);
  EXPECT_EQ(modules.at("model").at("backward").at("c10d.allreduce_"), 1);
  EXPECT_EQ(modules.at("model.block").at("backward").at("c10d.allreduce_"), 1);
  EXPECT_EQ(modules.at("Global").at("forward").at("c10d.allreduce_"), 1);
  EXPECT_EQ(distributed::CurrentCommModule(), "Global");
  EXPECT_EQ(distributed::CurrentCommPhase(), CommPhase::kForward);
}

// FSDP's pre-forward enters its module and the post-forward, another call, leaves it; the
// modules entered inside are the entered one's forward children, and leaving truncates them.
TEST(CommDebugModeTest, EnterAndExitCommModuleAcrossCalls) {
  distributed::CommDebugMode mode;
  testing::NiceMock<MockProcessGroup> pg(0, 1);
  Tensor t = Tensor::zeros({1});
  const size_t root = distributed::EnterCommModule("FSDPModel", CommPhase::kForward);
  const size_t block = distributed::EnterCommModule("FSDPModel.block", CommPhase::kForward);
  pg.all_reduce(t);
  EXPECT_EQ(block, root + 1);
  EXPECT_EQ(distributed::CurrentCommModule(), "FSDPModel.block");
  distributed::ExitCommModule(root);  // also leaves the block, left open
  EXPECT_EQ(distributed::CurrentCommModule(), "Global");
  {
    CommPhaseGuard backward("FSDPModel.block", CommPhase::kBackward);
    pg.all_reduce(t);
  }
  const auto modules = mode.get_comm_module_counts();
  EXPECT_EQ(modules.at("FSDPModel").at("forward").at("c10d.allreduce_"), 1);
  EXPECT_EQ(modules.at("FSDPModel").at("backward").at("c10d.allreduce_"), 1);
  EXPECT_EQ(modules.at("FSDPModel.block").at("forward").at("c10d.allreduce_"), 1);
  EXPECT_EQ(modules.at("Global").at("backward").at("c10d.allreduce_"), 1);
}

TEST(CommDebugModeTest, NestedModesBothCount) {
  testing::NiceMock<MockProcessGroup> pg(0, 1);
  Tensor t = Tensor::zeros({1});
  CommDebugMode outer;
  pg.all_reduce(t);
  {
    CommDebugMode inner;
    pg.all_reduce(t);
    EXPECT_EQ(inner.get_total_counts(), 1);
  }
  pg.all_reduce(t);
  EXPECT_EQ(outer.get_total_counts(), 3);
}

TEST(CommDebugModeTest, FunctionalCollectivesUseFunctionalKeys) {
  auto results = RunRanks(2, [](RankEnv& env) {
    auto& pg = *env.pg;
    CommDebugMode mode;
    Tensor x = Tensor::full({2, 3}, env.rank + 1);
    Tensor gathered = distributed::funcol::all_gather_tensor(x, pg);
    EXPECT_EQ(gathered.sizes(), (Shape{4, 3}));
    Tensor scattered = distributed::funcol::reduce_scatter_tensor(gathered, distributed::Sum(), pg);
    EXPECT_EQ(scattered.sizes(), (Shape{2, 3}));
    EXPECT_EQ(scattered.to_doubles()[0], 2.0 * (env.rank + 1));
    Tensor reduced = distributed::funcol::all_reduce(x, distributed::Sum(), pg);
    EXPECT_EQ(reduced.to_doubles()[0], 3.0);
    EXPECT_EQ(x.to_doubles()[0], env.rank + 1.0);  // out of place
    // A c10d call after the functional ones keeps its c10d key.
    pg.all_gather_into_tensor(gathered, x);
    EXPECT_EQ(mode.get_comm_counts(), (Counts{{"c10d_functional.all_gather_into_tensor", 1},
                                              {"c10d_functional.reduce_scatter_tensor", 1},
                                              {"c10d_functional.all_reduce", 1},
                                              {"c10d._allgather_base_", 1}}));
    EXPECT_EQ(mode.get_count("all_reduce"), 1);
    EXPECT_EQ(mode.get_count("allreduce_"), 0);
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

TEST(CommDebugModeTest, DecoratorsAreNotCountedTwice) {
  auto results = RunRanks(2, [](RankEnv& env) {
    auto trace = std::make_shared<CollectiveTrace>();
    auto pg = std::make_shared<RecordingProcessGroup>(
        std::make_shared<RecordingProcessGroup>(env.pg, trace), trace);
    CommDebugMode mode;
    Tensor t = Tensor::zeros({2});
    const uint64_t before = distributed::CurrentFlightRecorder().issued_count();
    pg->all_reduce(t);
    EXPECT_EQ(mode.get_total_counts(), 1);
    EXPECT_EQ(distributed::CurrentFlightRecorder().issued_count(), before + 1);
    // Both decorator layers saw it.
    EXPECT_EQ(trace->ForRank(env.rank).size(), 2u);
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

TEST(CommDebugModeTest, ModesArePerRank) {
  auto results = RunRanks(3, [](RankEnv& env) {
    // Only rank 1 records.
    std::unique_ptr<CommDebugMode> mode;
    if (env.rank == 1) mode = std::make_unique<CommDebugMode>();
    Tensor t = Tensor::zeros({2});
    env.pg->all_reduce(t);
    env.pg->all_reduce(t);
    return mode ? mode->get_total_counts() : -1;
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
  EXPECT_EQ(results.values(), (std::vector<int64_t>{-1, 2, -1}));
}

}  // namespace
}  // namespace fsdp::fakes
