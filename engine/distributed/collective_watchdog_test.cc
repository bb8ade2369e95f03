// CollectiveWatchdog over an in-process store, its abort function recording the report: a
// member whose heartbeat stops is named once the collective has been in flight for the
// straggler timeout, and only then; a member that is alive (its own watchdog beats) is never
// named however long the collective takes; a peer's report is adopted. The Gloo end to end case
// (a SIGSTOPped rank process) is GlooProcessTest.ARankHangingInsideACollectiveIsNamedOnEveryRank.
#include "engine/distributed/collective_watchdog.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "engine/distributed/store/hash_store.h"

namespace fsdp::distributed {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

CollectiveInfo AllreduceInfo(int rank, uint64_t sequence_number) {
  CollectiveInfo info;
  info.op = CollectiveOp::kAllreduce;
  info.group_name = "0";
  info.group_rank = rank;
  info.group_size = 2;
  info.global_rank = rank;
  info.sequence_number = sequence_number;
  return info;
}

// Records the abort function's calls.
struct AbortRecorder {
  std::mutex mu;
  std::vector<std::string> reports;
  Clock::time_point first_at;
  CollectiveWatchdog::AbortFn Fn() {
    return [this](const std::string& report) {
      std::lock_guard<std::mutex> lock(mu);
      if (reports.empty()) first_at = Clock::now();
      reports.push_back(report);
    };
  }
  size_t count() {
    std::lock_guard<std::mutex> lock(mu);
    return reports.size();
  }
};

// Waits until `pred` holds or `limit` passes.
template <typename Pred>
bool WaitUntil(Pred pred, milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  while (!pred()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(milliseconds(5));
  }
  return true;
}

TEST(CollectiveWatchdogTest, AMemberWithoutHeartbeatIsNamedAfterTheStragglerTimeout) {
  auto store = std::make_shared<HashStore>();
  constexpr milliseconds kTimeout{300};
  AbortRecorder aborts;
  CollectiveWatchdog watchdog(store, 0, {0, 5}, kTimeout, aborts.Fn());
  // Rank 1 (global rank 5) beat once, then stopped: no watchdog of its own runs.
  store->set("heartbeat/1", "7 completed allreduce_ #3 on group 0");
  const CollectiveInfo info = AllreduceInfo(0, 4);
  const auto start = Clock::now();
  watchdog.Started(info);
  ASSERT_TRUE(WaitUntil([&] { return aborts.count() > 0; }, milliseconds(20000)));
  watchdog.Finished();
  const auto waited = aborts.first_at - start;
  // Judged only once in flight for the timeout and stale for the stale window (>= 1 s).
  EXPECT_GE(waited, kTimeout);
  EXPECT_GE(waited, milliseconds(1000));
  ASSERT_EQ(aborts.count(), 1u);
  const std::string& report = aborts.reports[0];
  EXPECT_NE(report.find("rank 0 (global rank 0) has been in allreduce_ #4 on group 0"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("(straggler timeout 300 ms)"), std::string::npos) << report;
  EXPECT_NE(report.find("rank 1 (global rank 5): last heartbeat: completed allreduce_ #3"),
            std::string::npos)
      << report;
  EXPECT_EQ(watchdog.HangReport(4), report);
  EXPECT_EQ(watchdog.aborted(), report);
  EXPECT_EQ(watchdog.HangReport(3), std::nullopt);
}

TEST(CollectiveWatchdogTest, LiveMembersAreNeverNamedHoweverLongTheCollective) {
  auto store = std::make_shared<HashStore>();
  constexpr milliseconds kTimeout{100};
  AbortRecorder aborts0, aborts1;
  CollectiveWatchdog rank0(store, 0, {0, 1}, kTimeout, aborts0.Fn());
  CollectiveWatchdog rank1(store, 1, {0, 1}, kTimeout, aborts1.Fn());
  rank0.Started(AllreduceInfo(0, 1));
  rank1.Started(AllreduceInfo(1, 1));
  // Well past the timeout and the stale window: both watchdogs beat, so nobody is named.
  std::this_thread::sleep_for(milliseconds(1600));
  rank0.Finished();
  rank1.Finished();
  EXPECT_EQ(aborts0.count(), 0u);
  EXPECT_EQ(aborts1.count(), 0u);
  EXPECT_EQ(rank0.HangReport(1), std::nullopt);
  // The heartbeat says what the rank did last.
  EXPECT_TRUE(WaitUntil(
      [&] {
        return store->try_get("heartbeat/0").value_or("").find("completed allreduce_ #1") !=
               std::string::npos;
      },
      milliseconds(10000)))
      << store->try_get("heartbeat/0").value_or("(none)");
}

TEST(CollectiveWatchdogTest, APeersReportIsAdoptedAndACompletedCollectiveIsNotAborted) {
  auto store = std::make_shared<HashStore>();
  constexpr milliseconds kTimeout{100};
  AbortRecorder aborts;
  CollectiveWatchdog watchdog(store, 0, {0, 1}, kTimeout, aborts.Fn());
  // A report for a collective this rank is not in changes nothing.
  store->set("hung/1", "a peer's report on #1");
  watchdog.Started(AllreduceInfo(0, 2));
  std::this_thread::sleep_for(milliseconds(200));
  EXPECT_EQ(aborts.count(), 0u);
  // Rank 1 keeps beating (alive), but a peer reports a hang in #2: it is adopted at once.
  std::atomic<bool> stop{false};
  std::thread beat([&] {
    for (int b = 0; !stop; ++b) {
      store->set("heartbeat/1", std::to_string(b) + " in allreduce_ #2");
      std::this_thread::sleep_for(milliseconds(10));
    }
  });
  store->set("hung/2", "a peer's report on #2");
  EXPECT_TRUE(WaitUntil([&] { return aborts.count() > 0; }, milliseconds(10000)));
  stop = true;
  beat.join();
  watchdog.Finished();
  ASSERT_EQ(aborts.count(), 1u);
  EXPECT_EQ(aborts.reports[0], "a peer's report on #2");
  EXPECT_EQ(watchdog.aborted(), "a peer's report on #2");
}

}  // namespace
}  // namespace fsdp::distributed
