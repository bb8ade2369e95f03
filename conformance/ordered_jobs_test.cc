// RunOrdered delivers every job's result in index order whatever order the workers finish in,
// runs jobs at the same time when given several threads, passes a declined job on as nullopt,
// and turns a job's exception into RunOrdered's own without losing the results before it.
#include "conformance/ordered_jobs.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace fsdp::conformance {
namespace {

TEST(RunOrdered, DeliversInIndexOrderWhateverOrderJobsFinish) {
  for (int jobs : {1, 2, 4}) {
    std::vector<size_t> delivered;
    RunOrdered<size_t>(
        9, jobs,
        [](size_t i) -> std::optional<size_t> {
          // Early jobs take longest, so later ones finish first.
          std::this_thread::sleep_for(std::chrono::milliseconds(2 * (9 - i)));
          return i * 10;
        },
        [&](size_t i, std::optional<size_t> r) {
          ASSERT_TRUE(r.has_value());
          EXPECT_EQ(*r, i * 10);
          delivered.push_back(i);
        });
    EXPECT_EQ(delivered, (std::vector<size_t>{0, 1, 2, 3, 4, 5, 6, 7, 8})) << "jobs=" << jobs;
  }
}

TEST(RunOrdered, RunsJobsAtTheSameTimeWithSeveralThreads) {
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  // Each of the first two jobs waits for the other: only two threads at once can finish them.
  RunOrdered<int>(
      2, 2,
      [&](size_t) -> std::optional<int> {
        std::unique_lock<std::mutex> lock(mu);
        ++arrived;
        cv.notify_all();
        const bool both = cv.wait_for(lock, std::chrono::seconds(10), [&] { return arrived == 2; });
        return both ? 1 : 0;
      },
      [](size_t i, std::optional<int> r) { EXPECT_EQ(r, 1) << "job " << i << " ran alone"; });
}

TEST(RunOrdered, ADeclinedJobIsDeliveredAsNullopt) {
  std::vector<bool> ran;
  RunOrdered<int>(
      5, 2,
      [](size_t i) -> std::optional<int> {
        return i % 2 == 0 ? std::optional<int>(1) : std::nullopt;
      },
      [&](size_t, std::optional<int> r) { ran.push_back(r.has_value()); });
  EXPECT_EQ(ran, (std::vector<bool>{true, false, true, false, true}));
}

TEST(RunOrdered, AJobsExceptionIsRethrownAfterTheResultsBeforeIt) {
  for (int jobs : {1, 3}) {
    std::vector<size_t> delivered;
    EXPECT_THROW(RunOrdered<size_t>(
                     20, jobs,
                     [](size_t i) -> std::optional<size_t> {
                       if (i == 4) throw std::runtime_error("job 4 failed");
                       return i;
                     },
                     [&](size_t i, std::optional<size_t>) { delivered.push_back(i); }),
                 std::runtime_error);
    EXPECT_EQ(delivered, (std::vector<size_t>{0, 1, 2, 3})) << "jobs=" << jobs;
  }
}

// The workers stop taking jobs and are joined: RunOrdered returns by rethrowing.
TEST(RunOrdered, ADeliverersExceptionStopsTheWorkers) {
  EXPECT_THROW(RunOrdered<int>(
                   100000, 2, [](size_t) -> std::optional<int> { return 0; },
                   [](size_t i, std::optional<int>) {
                     if (i == 1) throw std::invalid_argument("stop");
                   }),
               std::invalid_argument);
}

}  // namespace
}  // namespace fsdp::conformance
