// The threaded fake's collective checker and failure semantics: mismatches, missing ranks,
// throwing ranks and deadlines give the documented error code on every rank, promptly, with a
// report naming both sides.
#include <gtest/gtest.h>

#include <chrono>
#include <latch>
#include <thread>
#include <utility>

#include "fakes/run_ranks.h"

namespace fsdp::fakes {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

template <typename T>
void ExpectAllFailWith(const RunResult<T>& results, ErrorCode code,
                       const std::vector<std::string>& needles) {
  for (const auto& r : results) {
    ASSERT_FALSE(r.ok()) << r.str();
    EXPECT_EQ(*r.code, code) << r.str();
    for (const auto& n : needles) EXPECT_TRUE(Contains(r.message, n)) << n << "\n" << r.message;
  }
}

RunRanksOptions Timeout(milliseconds timeout) {
  RunRanksOptions options;
  options.timeout = timeout;
  return options;
}

TEST(CollectiveCheckerTest, MismatchedOpFailsEveryRankWithBothSides) {
  auto results = RunRanks(4, [](RankEnv& env) {
    Tensor t = Tensor::zeros({4});
    if (env.rank == 1) {
      Tensor out = Tensor::zeros({16});
      env.pg->all_gather_into_tensor(out, t);
    } else {
      env.pg->all_reduce(t);
    }
  });
  ExpectAllFailWith(results, ErrorCode::kDataLoss,
                    {"collective mismatch on group 0", "rank 0 issued: allreduce_ #1",
                     "rank 1 issued: _allgather_base_ #1", "op allreduce_ vs _allgather_base_"});
}

TEST(CollectiveCheckerTest, MismatchedSizeFailsEveryRank) {
  auto results = RunRanks(3, [](RankEnv& env) {
    Tensor t = Tensor::zeros({env.rank == 2 ? 5 : 4});
    env.pg->all_reduce(t);
  });
  ExpectAllFailWith(results, ErrorCode::kDataLoss,
                    {"rank 2 issued: allreduce_ #1", "input numel 4 [4] vs 5 [5]"});
}

// What the faults/mismatched_op and faults/mismatched_size scenarios see (they check only that
// every rank fails): after a barrier (#1), the faulty rank (the last, or rank 0, which every
// rank is compared with) issues another collective or another size than the others'
// all_reduce (#2); every rank gets DataLoss showing both calls.
TEST(CollectiveCheckerTest, MismatchAfterABarrierShowsBothCallsOnEveryRank) {
  const std::vector<std::pair<std::string, std::string>> faults = {
      {"broadcast", "broadcast_ #2"},
      {"all_gather_into_tensor", "_allgather_base_ #2"},
      {"barrier", "barrier #2"},
      {"size", "allreduce_ #2 float32 in [5]"}};
  for (int faulty : {3, 0}) {
    for (const auto& [fault, faulty_call] : faults) {
      auto results = RunRanks(4, [faulty, fault = fault](RankEnv& env) {
        env.pg->barrier();
        Tensor t = Tensor::ones({env.rank == faulty && fault == "size" ? 5 : 4});
        if (env.rank != faulty || fault == "size") {
          env.pg->all_reduce(t);
        } else if (fault == "broadcast") {
          env.pg->broadcast(t, 0);
        } else if (fault == "all_gather_into_tensor") {
          env.pg->all_gather_into_tensor(Tensor::zeros({16}), t);
        } else {
          env.pg->barrier();
        }
      });
      SCOPED_TRACE("faulty rank " + std::to_string(faulty) + ": " + fault);
      ExpectAllFailWith(results, ErrorCode::kDataLoss,
                        {"collective mismatch",
                         "rank " + std::to_string(faulty) + " issued: " + faulty_call,
                         fault == "size" ? "issued: allreduce_ #2 float32 in [4]"
                                         : "issued: allreduce_ #2"});
    }
  }
}

TEST(CollectiveCheckerTest, MismatchedDtypeReduceOpRootAndGroupRanks) {
  auto dtype = RunRanks(2, [](RankEnv& env) {
    Tensor t = Tensor::zeros({4}, env.rank == 0 ? DType::kFloat32 : DType::kFloat16);
    env.pg->all_reduce(t);
  });
  ExpectAllFailWith(dtype, ErrorCode::kDataLoss, {"dtype float32 vs float16"});

  auto op = RunRanks(2, [](RankEnv& env) {
    Tensor t = Tensor::zeros({4});
    env.pg->all_reduce(t, env.rank == 0 ? distributed::Sum() : distributed::Max());
  });
  ExpectAllFailWith(op, ErrorCode::kDataLoss, {"reduce op SUM vs MAX"});

  auto root = RunRanks(2, [](RankEnv& env) {
    Tensor t = Tensor::zeros({4});
    env.pg->broadcast(t, env.rank);
  });
  ExpectAllFailWith(root, ErrorCode::kDataLoss, {"root 0 vs 1"});

  auto groups = RunRanks(3, [](RankEnv& env) {
    env.pg->new_group(env.rank == 2 ? std::vector<int>{1, 2} : std::vector<int>{0, 1});
  });
  ExpectAllFailWith(groups, ErrorCode::kDataLoss, {"new_group ranks [0, 1] vs [1, 2]"});

  auto uneven = RunRanks(2, [](RankEnv& env) {
    // Rank 1 believes rank 0 sends 3 elements; rank 0 sends 2.
    Tensor in = Tensor::zeros({2});
    std::vector<Tensor> outs = {Tensor::zeros({env.rank == 0 ? 2 : 3}), Tensor::zeros({2})};
    env.pg->all_gather(outs, in);
  });
  ExpectAllFailWith(uneven, ErrorCode::kDataLoss, {"output numels [2, 2] vs [3, 2]"});
}

TEST(CollectiveCheckerTest, MismatchAtWorld128FailsEveryRank) {
  auto results = RunRanks(128, [](RankEnv& env) {
    Tensor in = Tensor::zeros({env.rank == 127 ? 256 : 128});
    Tensor out = Tensor::zeros({1});
    env.pg->reduce_scatter_tensor(out, in);
  });
  ASSERT_EQ(results.size(), 128u);
  // Rank 127's local check fails first (its input is not 128 * output), which aborts the
  // world; every other rank fails with kAborted naming rank 127.
  EXPECT_EQ(*results[127].code, ErrorCode::kInvalidArgument) << results[127].str();
  for (int r = 0; r < 127; ++r) {
    ASSERT_FALSE(results[r].ok());
    EXPECT_EQ(*results[r].code, ErrorCode::kAborted) << results[r].str();
    EXPECT_TRUE(Contains(results[r].message, "rank 127 failed")) << results[r].message;
  }

  auto mismatch = RunRanks(128, [](RankEnv& env) {
    Tensor t = Tensor::zeros({env.rank == 127 ? 3 : 2}, DType::kBFloat16);
    env.pg->all_reduce(t);
  });
  ExpectAllFailWith(mismatch, ErrorCode::kDataLoss,
                    {"1 rank(s) issued a different collective", "rank 127 issued"});
}

TEST(CollectiveCheckerTest, ThrowingRankAbortsPeersPromptly) {
  const auto start = steady_clock::now();
  auto results = RunRanks(
      4,
      [](RankEnv& env) {
        Tensor t = Tensor::ones({2});
        env.pg->all_reduce(t);
        if (env.rank == 2) FSDP_THROW(ErrorCode::kInternal, "boom from rank 2");
        env.pg->all_reduce(t);  // rank 2 never arrives
      },
      Timeout(std::chrono::seconds(30)));
  // Far below the 30 s deadline: the abort woke the peers.
  EXPECT_LT(steady_clock::now() - start, std::chrono::seconds(20));
  EXPECT_EQ(*results[2].code, ErrorCode::kInternal);
  for (int r : {0, 1, 3}) {
    ASSERT_FALSE(results[r].ok());
    EXPECT_EQ(*results[r].code, ErrorCode::kAborted) << results[r].str();
    EXPECT_TRUE(Contains(results[r].message, "allreduce_ #2")) << results[r].message;
    EXPECT_TRUE(Contains(results[r].message, "rank 2 failed: Internal: boom from rank 2"))
        << results[r].message;
  }
}

TEST(CollectiveCheckerTest, CollectivesAfterAnAbortFailImmediately) {
  auto results = RunRanks(
      2,
      [](RankEnv& env) {
        if (env.rank == 0) FSDP_THROW(ErrorCode::kNotFound, "rank 0 gives up");
        Tensor t = Tensor::ones({2});
        // Either aborted while waiting or at issue: kAborted, never a hang.
        for (int i = 0; i < 3; ++i) {
          try {
            env.pg->all_reduce(t);
          } catch (const Error& e) {
            EXPECT_EQ(e.code(), ErrorCode::kAborted);
          }
        }
      },
      Timeout(std::chrono::seconds(30)));
  EXPECT_EQ(*results[0].code, ErrorCode::kNotFound);
  EXPECT_TRUE(results[1].ok()) << results[1].str();
}

TEST(CollectiveCheckerTest, RankThatReturnedIsReportedUnavailableAtOnce) {
  const auto start = steady_clock::now();
  auto results = RunRanks(
      3,
      [](RankEnv& env) {
        if (env.rank == 1) return;  // never joins
        Tensor t = Tensor::ones({2});
        env.pg->all_reduce(t);
      },
      Timeout(std::chrono::seconds(30)));
  EXPECT_LT(steady_clock::now() - start, std::chrono::seconds(20));
  EXPECT_TRUE(results[1].ok());
  for (int r : {0, 2}) {
    ASSERT_FALSE(results[r].ok());
    EXPECT_EQ(*results[r].code, ErrorCode::kUnavailable) << results[r].str();
    EXPECT_TRUE(Contains(results[r].message, "allreduce_ #1")) << results[r].message;
    EXPECT_TRUE(Contains(results[r].message, "rank 1 has returned from the rank function"))
        << results[r].message;
  }
}

TEST(CollectiveCheckerTest, MissingRankTimesOutOnEveryWaitingRankWithReport) {
  std::latch waiting_ranks_done(3);
  const auto start = steady_clock::now();
  auto results = RunRanks(
      4,
      [&](RankEnv& env) {
        Tensor t = Tensor::ones({4});
        env.pg->all_reduce(t);  // #1: everyone
        if (env.rank == 3) {
          // Stuck outside any collective until the others have given up.
          waiting_ranks_done.wait();
          return;
        }
        try {
          env.pg->all_gather_into_tensor(Tensor::zeros({16}), t);  // #2: rank 3 missing
        } catch (...) {
          waiting_ranks_done.count_down();
          throw;
        }
      },
      Timeout(milliseconds(1000)));
  // Every waiting rank failed by the deadline (well before the stall watchdog).
  EXPECT_LT(steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_TRUE(results[3].ok()) << results[3].str();
  for (int r = 0; r < 3; ++r) {
    ASSERT_FALSE(results[r].ok());
    EXPECT_EQ(*results[r].code, ErrorCode::kDeadlineExceeded) << results[r].str();
    const auto& m = results[r].message;
    EXPECT_TRUE(Contains(m, "_allgather_base_ #2")) << m;
    EXPECT_TRUE(Contains(m, "timed out after 1000 ms")) << m;
    EXPECT_TRUE(Contains(m, "arrived (3 of 4): ranks [0, 1, 2]")) << m;
    EXPECT_TRUE(Contains(m, "missing rank 3: running; last collectives:")) << m;
    // Rank 3's flight recorder: its last collective was allreduce_ #1, completed.
    EXPECT_TRUE(Contains(m, "allreduce_ #1 on group 0 (rank 3/4")) << m;
    EXPECT_TRUE(Contains(m, "[completed]")) << m;
  }
}

// What faults/missing_rank mode=sleep sees (it checks only that every rank fails, and when):
// the others time out naming the missing rank, and the late rank, when it finally issues the
// collective, fails at once with the same report.
TEST(CollectiveCheckerTest, LateRankFailsAtOnceWhenItFinallyIssues) {
  constexpr auto kDeadline = milliseconds(300);
  std::vector<steady_clock::duration> late_wait(1);
  auto results = RunRanks(
      3,
      [&](RankEnv& env) {
        env.pg->barrier();  // #1
        Tensor t = Tensor::ones({4});
        if (env.rank == 2) {
          std::this_thread::sleep_for(kDeadline + milliseconds(200));
          const auto issued = steady_clock::now();
          try {
            env.pg->all_reduce(t);  // #2, after the others gave up
          } catch (...) {
            late_wait[0] = steady_clock::now() - issued;
            throw;
          }
          return;
        }
        env.pg->all_reduce(t);  // #2
      },
      Timeout(kDeadline));
  ExpectAllFailWith(results, ErrorCode::kDeadlineExceeded,
                    {"allreduce_ #2", "timed out after 300 ms", "missing rank 2"});
  EXPECT_LT(late_wait[0], std::chrono::seconds(2));
}

TEST(CollectiveCheckerTest, MissingRankInSubgroupNamesGlobalRanks) {
  std::latch done(1);
  auto results = RunRanks(
      4,
      [&](RankEnv& env) {
        auto sub = env.pg->new_group({1, 3});
        if (env.rank == 3) {
          done.wait();
          return;
        }
        if (env.rank == 1) {
          Tensor t = Tensor::ones({1});
          try {
            sub->all_reduce(t);
          } catch (...) {
            done.count_down();
            throw;
          }
        }
      },
      Timeout(milliseconds(500)));
  ASSERT_FALSE(results[1].ok());
  EXPECT_EQ(*results[1].code, ErrorCode::kDeadlineExceeded);
  EXPECT_TRUE(Contains(results[1].message, "missing rank 1 (global 3)")) << results[1].message;
  EXPECT_TRUE(Contains(results[1].message, "global ranks [1, 3]")) << results[1].message;
}

TEST(CollectiveCheckerTest, WorldReportListsEveryRank) {
  auto results = RunRanks(2, [](RankEnv& env) {
    Tensor t = Tensor::ones({1});
    env.pg->all_reduce(t);
    env.pg->barrier();
    env.pg->barrier();
    if (env.rank == 0) {
      const std::string report = env.world->Report();
      EXPECT_TRUE(Contains(report, "threaded world of 2 ranks")) << report;
      EXPECT_TRUE(Contains(report, "rank 1: ")) << report;
      EXPECT_TRUE(Contains(report, "barrier #3 on group 0")) << report;
    }
    env.pg->barrier();
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

TEST(CollectiveCheckerTest, NonFsdpExceptionsAreInternal) {
  auto results = RunRanks(1, [](int) -> int { throw std::runtime_error("plain"); });
  EXPECT_EQ(*results[0].code, ErrorCode::kInternal);
  EXPECT_TRUE(Contains(results[0].message, "plain"));
}

}  // namespace
}  // namespace fsdp::fakes
