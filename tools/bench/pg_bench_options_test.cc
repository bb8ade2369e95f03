#include "tools/bench/pg_bench_options.h"

#include <gtest/gtest.h>

#include "engine/core/error.h"

namespace fsdp::bench {
namespace {

std::string MessageOf(const std::vector<std::string>& args) {
  try {
    ParsePgBenchArgs(args);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    return e.message();
  }
  ADD_FAILURE() << "no error";
  return "";
}

TEST(PgBenchOptionsTest, DefaultsAreNcclTests) {
  const PgBenchOptions o = ParsePgBenchArgs({});
  EXPECT_EQ(o.min_bytes, int64_t{32} << 20);
  EXPECT_EQ(o.max_bytes, int64_t{32} << 20);
  EXPECT_EQ(o.iters, 20);
  EXPECT_EQ(o.warmup_iters, 5);
  EXPECT_TRUE(o.check);
  EXPECT_EQ(o.dtype, DType::kFloat32);
  EXPECT_EQ(o.redop, distributed::ReduceOp::kSum);
  EXPECT_EQ(o.collectives, AllCollectives());
  EXPECT_EQ(o.backend, "threaded");
  EXPECT_FALSE(o.world.has_value());
}

TEST(PgBenchOptionsTest, ParsesShortAttachedAndLongFlags) {
  const PgBenchOptions o =
      ParsePgBenchArgs({"-b",  "1K",  "-e64M",     "-f",   "2",         "-n",     "3",
                        "-w0", "-c",  "0",         "-d",   "bfloat16",  "-o",     "reduce_scatter",
                        "-r",  "max", "--backend", "gloo", "--world=4", "--json", "-"});
  EXPECT_EQ(o.min_bytes, 1024);
  EXPECT_EQ(o.max_bytes, int64_t{64} << 20);
  EXPECT_EQ(o.factor, 2);
  EXPECT_EQ(o.iters, 3);
  EXPECT_EQ(o.warmup_iters, 0);
  EXPECT_FALSE(o.check);
  EXPECT_EQ(o.dtype, DType::kBFloat16);
  ASSERT_EQ(o.collectives.size(), 1u);
  EXPECT_STREQ(o.collectives[0]->name, "reduce_scatter");
  EXPECT_EQ(o.redop, distributed::ReduceOp::kMax);
  EXPECT_EQ(o.backend, "gloo");
  EXPECT_EQ(o.world, 4);
  EXPECT_EQ(o.json_path, "-");

  const PgBenchOptions l =
      ParsePgBenchArgs({"--minbytes=8", "--maxbytes", "8K", "--warmup-iters", "2", "--datatype",
                        "float32", "--collective", "all_reduce", "--redop=avg"});
  EXPECT_EQ(l.min_bytes, 8);
  EXPECT_EQ(l.max_bytes, 8192);
  EXPECT_EQ(l.warmup_iters, 2);
  EXPECT_EQ(l.dtype, DType::kFloat32);
  EXPECT_EQ(l.redop, distributed::ReduceOp::kAvg);
}

TEST(PgBenchOptionsTest, ErrorsNameTheFlag) {
  EXPECT_NE(MessageOf({"-b", "1X"}).find("-b"), std::string::npos);
  EXPECT_NE(MessageOf({"-n", "0"}).find("-n"), std::string::npos);
  EXPECT_NE(MessageOf({"-c", "2"}).find("-c"), std::string::npos);
  EXPECT_NE(MessageOf({"--world", "0"}).find("--world"), std::string::npos);
  EXPECT_NE(MessageOf({"--bogus"}).find("--bogus"), std::string::npos);
  EXPECT_NE(MessageOf({"-x", "1"}).find("-x"), std::string::npos);
  EXPECT_NE(MessageOf({"stray"}).find("stray"), std::string::npos);
  EXPECT_NE(MessageOf({"-e"}).find("needs a value"), std::string::npos);
  EXPECT_NE(MessageOf({"--backend", "mpi"}).find("mpi"), std::string::npos);
  // Any backend of fakes::DefaultBackends() is accepted; the error lists them.
  EXPECT_NE(MessageOf({"--backend", "mpi"}).find("gloo, nccl, threaded"), std::string::npos);
  for (const char* name : {"threaded", "gloo", "nccl"}) {
    EXPECT_EQ(ParsePgBenchArgs({"--backend", name}).backend, name);
  }
  EXPECT_NE(MessageOf({"-b", "2K", "-e", "1K"}).find("-b"), std::string::npos);
  EXPECT_NE(MessageOf({"-b", "1K", "-e", "2K", "-i", "0"}).find("-i"), std::string::npos);
  // AVG needs floating point, as in NCCL; only matters when a reduction is selected.
  EXPECT_NE(MessageOf({"-d", "int64", "-r", "avg"}).find("-r avg"), std::string::npos);
  EXPECT_NO_THROW(ParsePgBenchArgs({"-d", "int64", "-r", "avg", "-o", "broadcast"}));
  bool help = false;
  ParsePgBenchArgs({"-h"}, &help);
  EXPECT_TRUE(help);
}

TEST(PgBenchOptionsTest, UsageAndErrorsListTheRegisteredCollectives) {
  const std::string usage = PgBenchUsage();
  EXPECT_NE(usage.find("  -o, --collective OP      all_gather, reduce_scatter, all_reduce, "
                       "broadcast, or all\n                           (default all)\n"),
            std::string::npos)
      << usage;
  for (const CollectiveDescriptor* c : AllCollectives()) {
    EXPECT_NE(usage.find(c->name), std::string::npos) << c->name;
  }
  EXPECT_NE(MessageOf({"-o", "alltoall"})
                .find("(choose all_gather, reduce_scatter, all_reduce, broadcast or all)"),
            std::string::npos);
}

}  // namespace
}  // namespace fsdp::bench
