#include "tools/bench/pg_bench_sweep.h"

#include <gtest/gtest.h>

#include "fakes/run_ranks.h"
#include "tools/bench/pg_bench_report.h"

namespace fsdp::bench {
namespace {

PgBenchOptions SmallOptions() {
  PgBenchOptions o;
  o.min_bytes = 64;
  o.max_bytes = 4096;
  o.factor = 8;
  o.iters = 2;
  o.warmup_iters = 1;
  o.check = true;
  return o;
}

TEST(PgBenchSweepTest, EveryRankReturnsTheSameVerifiedRows) {
  for (int world : {1, 3, 4}) {
    for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kInt64}) {
      PgBenchOptions o = SmallOptions();
      o.dtype = dtype;
      o.redop = dtype == DType::kInt64 ? distributed::ReduceOp::kMin : distributed::ReduceOp::kAvg;
      auto results =
          fakes::RunRanks(world, [&](fakes::RankEnv& env) { return RunPgBenchSweep(*env.pg, o); });
      ASSERT_TRUE(results.all_ok()) << results.summary();
      const auto sweeps = results.values();
      const auto& rows = sweeps[0].rows;
      SCOPED_TRACE("world " + std::to_string(world) + " " + DTypeName(dtype));
      ASSERT_FALSE(rows.empty());
      for (const auto& s : sweeps) {
        ASSERT_EQ(s.rows.size(), rows.size());
        for (size_t i = 0; i < rows.size(); ++i) {
          EXPECT_EQ(s.rows[i].time_us, rows[i].time_us);  // max over ranks: identical
          EXPECT_EQ(s.rows[i].wrong, rows[i].wrong);
        }
      }
      for (const auto& r : rows) {
        ASSERT_TRUE(r.wrong.has_value());
        EXPECT_EQ(*r.wrong, 0) << r.collective->name << " " << r.counts.bytes;
        EXPECT_GT(r.time_us, 0);
        EXPECT_DOUBLE_EQ(r.algbw_gbps, static_cast<double>(r.counts.bytes) / (r.time_us * 1e3));
        EXPECT_DOUBLE_EQ(r.busbw_gbps, r.algbw_gbps * BusBandwidthFactor(*r.collective, world));
        EXPECT_EQ(r.redop.has_value(), r.collective->reduces);
        EXPECT_EQ(r.root, r.collective->root);
      }
    }
  }
}

TEST(PgBenchSweepTest, TooSmallSizesAreSkippedWithAReason) {
  PgBenchOptions o = SmallOptions();
  o.min_bytes = 8;
  o.max_bytes = 64;
  o.collectives = {&FindCollective("all_gather")};
  auto results =
      fakes::RunRanks(4, [&](fakes::RankEnv& env) { return RunPgBenchSweep(*env.pg, o); });
  ASSERT_TRUE(results.all_ok()) << results.summary();
  const auto sweep = results.values()[0];
  ASSERT_EQ(sweep.rows.size(), 1u);  // 64 B = 16 floats = 4 per rank; 8 B is too small
  EXPECT_EQ(sweep.rows[0].counts.bytes, 64);
  ASSERT_EQ(sweep.skipped.size(), 1u);
  EXPECT_NE(sweep.skipped[0].find("all_gather 8"), std::string::npos) << sweep.skipped[0];
}

TEST(PgBenchSweepTest, WithoutCheckThereIsNoWrongCount) {
  PgBenchOptions o = SmallOptions();
  o.check = false;
  o.collectives = {&FindCollective("broadcast")};
  auto results =
      fakes::RunRanks(2, [&](fakes::RankEnv& env) { return RunPgBenchSweep(*env.pg, o); });
  ASSERT_TRUE(results.all_ok()) << results.summary();
  const PgBenchSweep sweep = results.values()[0];
  ASSERT_FALSE(sweep.rows.empty());
  for (const auto& r : sweep.rows) EXPECT_FALSE(r.wrong.has_value());
}

TEST(PgBenchReportTest, TextAndJsonCarryRowsFactsAndMemcpyRatio) {
  PgBenchOptions o = SmallOptions();
  o.collectives = {&FindCollective("all_reduce"), &FindCollective("all_gather")};
  auto results =
      fakes::RunRanks(2, [&](fakes::RankEnv& env) { return RunPgBenchSweep(*env.pg, o); });
  ASSERT_TRUE(results.all_ok()) << results.summary();
  const PgBenchSweep sweep = results.values()[0];
  PgBenchFacts facts;
  facts.backend = "threaded";
  facts.world = 2;
  facts.nproc = 2;
  facts.hostname = "host";
  facts.memcpy = {10.0, 0.001, size_t{64} << 20, 5, 1};
  facts.memcpy_all_cores = {16.0, 0.001, size_t{64} << 20, 5, 2};

  const std::string text = PgBenchText(facts, o, sweep);
  for (const char* s :
       {"# memcpy bandwidth: 10.00 GB/s", "16.00 GB/s with 2 threads", "# all_reduce",
        "# all_gather", "busbw/memcpy", "proc-busbw/memcpyN", "#wrong",
        "Avg bus bandwidth", "Out of bounds values : 0 OK"}) {
    EXPECT_NE(text.find(s), std::string::npos) << s << "\n" << text;
  }

  const nlohmann::json j = PgBenchJson(facts, o, sweep);
  EXPECT_EQ(j["backend"], "threaded");
  EXPECT_EQ(j["world"], 2);
  EXPECT_EQ(j["nproc"], 2);
  EXPECT_DOUBLE_EQ(j["memcpy"]["gbps"].get<double>(), 10.0);
  EXPECT_EQ(j["memcpy_all_cores"]["threads"], 2);
  EXPECT_EQ(j["wrong"], 0);
  ASSERT_EQ(j["results"].size(), 2u);
  EXPECT_EQ(j["results"][0]["collective"], "all_reduce");
  const auto& rows = j["results"][0]["rows"];
  ASSERT_EQ(rows.size(), 3u);  // 64 B, 512 B, 4 KiB
  for (const auto& row : rows) {
    EXPECT_DOUBLE_EQ(row["busbw_per_memcpy"].get<double>(), row["busbw_gbps"].get<double>() / 10.0);
    // Both ranks are threads of one process: the process moves 2 × busbw.
    EXPECT_DOUBLE_EQ(row["process_busbw_per_memcpy_all_cores"].get<double>(),
                     row["busbw_gbps"].get<double>() * 2 / 16.0);
    EXPECT_EQ(row["type"], "float");
    EXPECT_EQ(row["redop"], "sum");
  }
  EXPECT_EQ(j["results"][1]["rows"][0]["redop"], "none");
}

}  // namespace
}  // namespace fsdp::bench
