// RecordingProcessGroup, FaultInjectingProcessGroup and MockProcessGroup.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <latch>

#include "fakes/fault_injecting_process_group.h"
#include "fakes/mock_process_group.h"
#include "fakes/recording_process_group.h"
#include "fakes/run_ranks.h"

namespace fsdp::fakes {
namespace {

using ::testing::_;
using ::testing::Field;
using ::testing::NiceMock;
using ::testing::Return;

RunRanksOptions Timeout(std::chrono::milliseconds t) {
  RunRanksOptions o;
  o.timeout = t;
  return o;
}

TEST(RecordingProcessGroupTest, TracesEveryCollectivePerRankIncludingSubgroups) {
  auto trace = std::make_shared<CollectiveTrace>();
  auto results = RunRanks(4, [&](RankEnv& env) {
    auto pg = std::make_shared<RecordingProcessGroup>(env.pg, trace);
    Tensor t = Tensor::zeros({4}, DType::kBFloat16);
    pg->all_reduce(t, distributed::Avg());
    pg->broadcast(t, 3);
    auto sub = pg->new_group({0, 1});
    if (sub) {
      Tensor out = Tensor::zeros({8}, DType::kBFloat16);
      sub->all_gather_into_tensor(out, t);
    }
    std::vector<Tensor> outs;
    for (int q = 0; q < 4; ++q) outs.push_back(Tensor::zeros({q + 1}, DType::kBFloat16));
    pg->all_gather(outs, Tensor::zeros({env.rank + 1}, DType::kBFloat16));
    pg->barrier();
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
  EXPECT_EQ(trace->OpLines(0), (std::vector<std::string>{
                                   "allreduce_ group=0 bfloat16 numel=4 AVG",
                                   "broadcast_ group=0 bfloat16 numel=4 root=3",
                                   "new_group group=0 ranks=[0,1]",
                                   "_allgather_base_ group=1 bfloat16 numel=4",
                                   "allgather_ group=0 bfloat16 numels=[1,2,3,4]",
                                   "barrier group=0",
                               }));
  EXPECT_EQ(trace->ForRank(3).size(), 5u);  // not in the subgroup
  EXPECT_EQ(trace->All().size(), 4u * 5 + 2);
  EXPECT_EQ(trace->ForRank(1)[3].group_rank, 1);
}

TEST(FaultInjectingProcessGroupTest, FailOnRankAbortsPeers) {
  auto plan = std::make_shared<FaultPlan>();
  plan->Add(Fault::Fail(/*rank=*/2, /*collective=*/2, ErrorCode::kUnavailable, "NIC down"));
  auto results = RunRanks(
      4,
      [&](RankEnv& env) {
        FaultInjectingProcessGroup pg(env.pg, plan);
        Tensor t = Tensor::ones({2});
        pg.all_reduce(t);
        pg.all_reduce(t);
      },
      Timeout(std::chrono::seconds(30)));
  EXPECT_EQ(plan->fired(), 1);
  EXPECT_EQ(*results[2].code, ErrorCode::kUnavailable);
  EXPECT_NE(results[2].message.find("NIC down (FaultInjectingProcessGroup, on allreduce_ #2"),
            std::string::npos)
      << results[2].message;
  for (int r : {0, 1, 3}) EXPECT_EQ(*results[r].code, ErrorCode::kAborted) << results[r].str();
}

TEST(FaultInjectingProcessGroupTest, DropMakesPeersTimeOut) {
  auto plan = std::make_shared<FaultPlan>();
  Fault drop = Fault::Drop(/*rank=*/0, /*collective=*/1);
  drop.op = distributed::CollectiveOp::kAllgatherBase;  // the first all-gather, not the first op
  plan->Add(drop);
  std::latch peers_done(1);
  auto results = RunRanks(
      2,
      [&](RankEnv& env) {
        FaultInjectingProcessGroup pg(env.pg, plan);
        Tensor t = Tensor::ones({2});
        pg.all_reduce(t);
        Tensor out = Tensor::zeros({4});
        if (env.rank == 0) {
          pg.all_gather_into_tensor(out, t);  // dropped: returns without joining
          peers_done.wait();
          return;
        }
        try {
          pg.all_gather_into_tensor(out, t);
        } catch (...) {
          peers_done.count_down();
          throw;
        }
      },
      Timeout(std::chrono::milliseconds(300)));
  EXPECT_TRUE(results[0].ok()) << results[0].str();
  EXPECT_EQ(*results[1].code, ErrorCode::kDeadlineExceeded) << results[1].str();
}

TEST(FaultInjectingProcessGroupTest, CorruptAndDelayAffectOnlyTheTarget) {
  auto plan = std::make_shared<FaultPlan>();
  plan->Add(Fault::Corrupt(/*rank=*/1, /*collective=*/1, 0.5));
  plan->Add(Fault::Delay(/*rank=*/0, /*collective=*/1, std::chrono::milliseconds(20)));
  auto results = RunRanks(3, [&](RankEnv& env) {
    FaultInjectingProcessGroup pg(env.pg, plan);
    Tensor t = Tensor::ones({2});
    pg.all_reduce(t);
    return t.to_doubles();
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
  EXPECT_EQ(*results[0].value, (std::vector<double>{3, 3}));
  EXPECT_EQ(*results[1].value, (std::vector<double>{3.5, 3.5}));
  EXPECT_EQ(*results[2].value, (std::vector<double>{3, 3}));
  EXPECT_EQ(plan->fired(), 2);
}

TEST(MockProcessGroupTest, ImplsAreMockedBehindTheValidatingFront) {
  NiceMock<MockProcessGroup> pg(/*rank=*/1, /*size=*/4);
  Tensor input = Tensor::zeros({2});
  Tensor output = Tensor::zeros({8});
  EXPECT_CALL(pg,
              all_gather_into_tensor_impl(_, _, Field(&distributed::CollectiveInfo::sequence_number, 1u)))
      .Times(1);
  pg.all_gather_into_tensor(output, input);
  // The front rejects bad arguments before the backend is called.
  EXPECT_CALL(pg, reduce_scatter_tensor_impl(_, _, _, _)).Times(0);
  EXPECT_THROW(pg.reduce_scatter_tensor(output, input), Error);
  EXPECT_CALL(pg, new_group_impl(std::vector<int>{1, 2}, _)).WillOnce(Return(nullptr));
  EXPECT_EQ(pg.new_group({2, 1}), nullptr);
  EXPECT_EQ(pg.global_rank(), 1);
  EXPECT_EQ(pg.describe(), "group 0 (mock, rank 1/4)");
}

}  // namespace
}  // namespace fsdp::fakes
