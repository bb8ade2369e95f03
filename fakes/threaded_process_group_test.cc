// Every collective x dtype x world size on the threaded fake, with data that is exact by
// construction (small integers; AVG replicates the documented float accumulation).
#include "fakes/threaded_process_group.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <thread>

#include "engine/distributed/reduce_op.h"
#include "fakes/run_ranks.h"

namespace fsdp::fakes {
namespace {

using distributed::ReduceOp;
using distributed::ReduceOptions;

// Element i of rank r's "salt" input: in {-1, 0, 1}, so sums over up to 128 ranks are exact
// even in bfloat16.
double Value(int rank, int64_t i, int salt) {
  return static_cast<double>((rank + i + salt) % 3) - 1;
}

std::vector<double> Values(int rank, int64_t n, int salt) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = Value(rank, i, salt);
  return v;
}

Tensor MakeTensor(int rank, const Shape& shape, DType dtype, int salt) {
  return Tensor::from_doubles(Values(rank, Numel(shape), salt), shape, dtype);
}

double RoundTo(DType dtype, double v) {
  return Tensor::from_doubles({v}, {1}, dtype).to_doubles()[0];
}

// The expected reduction of element i over `world` ranks, following ReduceInRankOrder.
double Reduced(DType dtype, ReduceOp op, int world, int64_t i, int salt,
               const std::vector<double>& factors = {}) {
  double acc = 0;
  for (int r = 0; r < world; ++r) {
    const double x = Value(r, i, salt);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        acc += x;
        break;
      case ReduceOp::kPremulSum:
        acc += x * factors[r];
        break;
      case ReduceOp::kMin:
        acc = r == 0 ? x : std::min(acc, x);
        break;
      case ReduceOp::kMax:
        acc = r == 0 ? x : std::max(acc, x);
        break;
    }
  }
  if (op == ReduceOp::kAvg) {
    acc = dtype == DType::kFloat64
              ? acc / world
              : static_cast<double>(static_cast<float>(acc) / static_cast<float>(world));
  }
  return RoundTo(dtype, acc);
}

// Powers of two, so PREMUL_SUM stays exact.
double Factor(int rank) { return std::ldexp(1.0, -(rank % 3)); }

struct Case {
  int world;
  DType dtype;
};

std::string CaseName(const testing::TestParamInfo<Case>& info) {
  return "W" + std::to_string(info.param.world) + "_" + DTypeName(info.param.dtype);
}

class CollectivesTest : public testing::TestWithParam<Case> {};

// All collectives of one (world, dtype) in one run of the ranks.
void RunAllCollectives(int world, DType dtype) {
  const bool floating = IsFloatingPoint(dtype);
  RunRanksOptions options;
  options.timeout = std::chrono::seconds(20);
  auto results = RunRanks(
      world,
      [&](RankEnv& env) {
        const int r = env.rank;
        const int W = env.world_size;
        auto& pg = *env.pg;
        ASSERT_EQ(pg.rank(), r);
        ASSERT_EQ(pg.size(), W);
        ASSERT_EQ(pg.backend_name(), "threaded");
        ASSERT_EQ(pg.group_name(), "0");

        // _allgather_base_, out of place.
        {
          Tensor in = MakeTensor(r, {2, 3}, dtype, 1);
          Tensor out = Tensor::zeros({2 * W, 3}, dtype);
          pg.all_gather_into_tensor(out, in)->wait();
          const auto got = out.to_doubles();
          for (int q = 0; q < W; ++q) {
            for (int64_t i = 0; i < 6; ++i) {
              ASSERT_EQ(got[q * 6 + i], Value(q, i, 1)) << "rank " << r << " chunk " << q;
            }
          }
        }
        // _allgather_base_, in place (input = output's chunk rank), async handle.
        {
          Tensor out = Tensor::zeros({3 * W}, dtype);
          Tensor in = out.narrow(0, 3 * r, 3);
          in.copy_(MakeTensor(r, {3}, dtype, 2));
          auto work = pg.all_gather_into_tensor(out, in, /*async_op=*/true);
          work->wait();
          EXPECT_TRUE(work->is_completed());
          const auto got = out.to_doubles();
          for (int q = 0; q < W; ++q) {
            for (int64_t i = 0; i < 3; ++i) ASSERT_EQ(got[q * 3 + i], Value(q, i, 2));
          }
        }
        // _allgather_base_ with empty shards.
        {
          Tensor in = Tensor::zeros({0}, dtype);
          Tensor out = Tensor::zeros({0}, dtype);
          pg.all_gather_into_tensor(out, in);
        }
        // _reduce_scatter_base_ and allreduce_ with every supported op.
        std::vector<ReduceOptions> ops = {distributed::Sum(), distributed::Min(), distributed::Max()};
        if (floating) {
          ops.push_back(distributed::Avg());
          ops.push_back(distributed::PremulSum(Factor(r)));
        }
        std::vector<double> factors(W);
        for (int q = 0; q < W; ++q) factors[q] = Factor(q);
        int salt = 3;
        for (const auto& op : ops) {
          ++salt;
          // Out of place: input [W * 4] -> output [4].
          Tensor in = MakeTensor(r, {W * 4}, dtype, salt);
          Tensor out = Tensor::full({4}, 7, dtype);
          pg.reduce_scatter_tensor(out, in, op);
          auto got = out.to_doubles();
          for (int64_t i = 0; i < 4; ++i) {
            ASSERT_EQ(got[i], Reduced(dtype, op.op, W, r * 4 + i, salt, factors))
                << distributed::ReduceOpName(op.op) << " rank " << r << " element " << i;
          }
          // In place: output = input's chunk rank.
          Tensor buf = MakeTensor(r, {W * 2, 2}, dtype, salt);
          Tensor chunk = buf.narrow(0, 2 * r, 2);
          pg.reduce_scatter_tensor(chunk, buf, op);
          got = chunk.to_doubles();
          for (int64_t i = 0; i < 4; ++i) {
            ASSERT_EQ(got[i], Reduced(dtype, op.op, W, r * 4 + i, salt, factors))
                << "in place " << distributed::ReduceOpName(op.op);
          }
          // allreduce_.
          Tensor t = MakeTensor(r, {5}, dtype, salt);
          pg.all_reduce(t, op);
          got = t.to_doubles();
          for (int64_t i = 0; i < 5; ++i) {
            ASSERT_EQ(got[i], Reduced(dtype, op.op, W, i, salt, factors))
                << "all_reduce " << distributed::ReduceOpName(op.op);
          }
        }
        // broadcast_ from the last and the first rank.
        for (int root : {W - 1, 0}) {
          Tensor t = MakeTensor(r, {2, 2}, dtype, 9);
          pg.broadcast(t, root);
          const auto got = t.to_doubles();
          for (int64_t i = 0; i < 4; ++i) ASSERT_EQ(got[i], Value(root, i, 9));
        }
        // allgather_ into a list with uneven sizes: rank q contributes q + 1 elements.
        {
          Tensor in = MakeTensor(r, {r + 1}, dtype, 11);
          std::vector<Tensor> outs;
          for (int q = 0; q < W; ++q) outs.push_back(Tensor::zeros({q + 1}, dtype));
          pg.all_gather(outs, in);
          for (int q = 0; q < W; ++q) ASSERT_EQ(outs[q].to_doubles(), Values(q, q + 1, 11));
        }
        // allgather_ in place (outputs[rank] is the input).
        {
          std::vector<Tensor> outs;
          for (int q = 0; q < W; ++q) outs.push_back(Tensor::zeros({2}, dtype));
          outs[r].copy_(MakeTensor(r, {2}, dtype, 12));
          pg.all_gather(outs, outs[r]);
          for (int q = 0; q < W; ++q) ASSERT_EQ(outs[q].to_doubles(), Values(q, 2, 12));
        }
        pg.barrier();
        EXPECT_GT(pg.sequence_number(), 10u);
      },
      options);
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

TEST_P(CollectivesTest, EveryCollectiveIsExact) {
  RunAllCollectives(GetParam().world, GetParam().dtype);
}

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  for (int world : {1, 2, 3, 4, 8}) {
    for (DType dtype :
         {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16, DType::kInt64}) {
      cases.push_back({world, dtype});
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Worlds, CollectivesTest, testing::ValuesIn(AllCases()), CaseName);

// World 128 on 2 cores: every collective and dtype; condition variables only, so this stays
// fast.
TEST(CollectivesTest128, Float32) { RunAllCollectives(128, DType::kFloat32); }
TEST(CollectivesTest128, Float64) { RunAllCollectives(128, DType::kFloat64); }
TEST(CollectivesTest128, Float16) { RunAllCollectives(128, DType::kFloat16); }
TEST(CollectivesTest128, BFloat16) { RunAllCollectives(128, DType::kBFloat16); }
TEST(CollectivesTest128, Int64) { RunAllCollectives(128, DType::kInt64); }

// Reductions of arbitrary (inexact) data are bit-identical on every rank and equal to the
// rank-order reference.
TEST(ThreadedProcessGroupTest, RankOrderReductionIsBitIdenticalOnEveryRank) {
  constexpr int kWorld = 8;
  constexpr int64_t kN = 1000;
  for (DType dtype : {DType::kFloat16, DType::kBFloat16, DType::kFloat32}) {
    auto input_of = [&](int rank) {
      Generator gen(1234 + static_cast<uint64_t>(rank));
      return Tensor::randn({kN}, dtype, &gen);
    };
    auto results = RunRanks(kWorld, [&](RankEnv& env) {
      Tensor t = input_of(env.rank);
      env.pg->all_reduce(t, distributed::Avg());
      Tensor rs = Tensor::empty({kN / kWorld}, dtype);
      env.pg->reduce_scatter_tensor(rs, input_of(env.rank));
      const size_t bytes = t.nbytes();
      std::vector<uint8_t> raw(bytes);
      std::memcpy(raw.data(), t.data_ptr(), bytes);
      return std::make_pair(raw, rs.to_doubles());
    });
    ASSERT_TRUE(results.all_ok()) << results.summary();
    // Reference: ReduceInRankOrder over the same inputs.
    std::vector<Tensor> inputs;
    std::vector<const void*> ptrs;
    for (int r = 0; r < kWorld; ++r) inputs.push_back(input_of(r));
    for (auto& t : inputs) ptrs.push_back(t.data_ptr());
    Tensor expected = Tensor::empty({kN}, dtype);
    distributed::ReduceInRankOrder(dtype, ReduceOp::kAvg, ptrs, {}, expected.data_ptr(), kN);
    std::vector<uint8_t> expected_raw(expected.nbytes());
    std::memcpy(expected_raw.data(), expected.data_ptr(), expected.nbytes());
    Tensor expected_sum = Tensor::empty({kN}, dtype);
    distributed::ReduceInRankOrder(dtype, ReduceOp::kSum, ptrs, {}, expected_sum.data_ptr(), kN);
    const auto sum = expected_sum.to_doubles();
    for (int r = 0; r < kWorld; ++r) {
      EXPECT_EQ(results[r].value->first, expected_raw) << DTypeName(dtype) << " rank " << r;
      EXPECT_EQ(results[r].value->second,
                std::vector<double>(sum.begin() + r * 125, sum.begin() + (r + 1) * 125));
    }
  }
}

// Each rank performs its own share of a collective ([Note: every rank does its own share]);
// the results must be byte-for-byte those of reducing the whole buffers in rank order on one
// thread (ReduceInRankOrder), for every reduce op and dtype, including float16/bfloat16
// rounding, at a numel that does not divide evenly into the all-reduce's per-rank slices.
TEST(ThreadedProcessGroupTest, ShareByShareResultsAreBitIdenticalToWholeBufferReduction) {
  const std::vector<ReduceOp> ops = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin,
                                     ReduceOp::kMax, ReduceOp::kPremulSum};
  for (int world : {3, 8}) {
    const int64_t chunk = 37;
    const int64_t n = chunk * world;  // the all-reduce slices of n / world are uneven below
    for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16,
                        DType::kInt64}) {
      for (ReduceOp op : ops) {
        if (!distributed::ReduceOpSupports(op, dtype)) continue;
        auto input_of = [&](int rank, int64_t numel) {
          Generator gen(77 + static_cast<uint64_t>(rank));
          Tensor t = Tensor::randn({numel}, DType::kFloat64, &gen);
          auto v = t.to_doubles();
          if (dtype == DType::kInt64) {
            for (auto& x : v) x = std::round(x * 1000);
          }
          return Tensor::from_doubles(v, {numel}, dtype);
        };
        auto factor_of = [](int rank) { return 0.5 + 0.25 * rank; };
        auto options_of = [&](int rank) {
          ReduceOptions o;
          o.op = op;
          if (op == ReduceOp::kPremulSum) o.premul_factor = factor_of(rank);
          return o;
        };
        auto raw = [](const Tensor& t) {
          std::vector<uint8_t> b(t.nbytes());
          if (!b.empty()) std::memcpy(b.data(), t.data_ptr(), b.size());
          return b;
        };
        const int64_t odd = n + 1;  // all-reduce numel: slices of different lengths
        auto results = RunRanks(world, [&](RankEnv& env) {
          Tensor ar = input_of(env.rank, odd);
          env.pg->all_reduce(ar, options_of(env.rank));
          Tensor rs = Tensor::empty({chunk}, dtype);
          env.pg->reduce_scatter_tensor(rs, input_of(env.rank, n), options_of(env.rank));
          return std::make_pair(raw(ar), raw(rs));
        });
        ASSERT_TRUE(results.all_ok()) << results.summary();
        std::vector<Tensor> ar_inputs, rs_inputs;
        std::vector<const void*> ar_ptrs;
        std::vector<double> factors;
        for (int r = 0; r < world; ++r) {
          ar_inputs.push_back(input_of(r, odd));
          rs_inputs.push_back(input_of(r, n));
          ar_ptrs.push_back(ar_inputs.back().data_ptr());
          factors.push_back(factor_of(r));
        }
        Tensor ar_expected = Tensor::empty({odd}, dtype);
        distributed::ReduceInRankOrder(dtype, op, ar_ptrs, factors, ar_expected.data_ptr(),
                                       static_cast<size_t>(odd));
        Tensor rs_whole = Tensor::empty({n}, dtype);
        std::vector<const void*> rs_ptrs;
        for (auto& t : rs_inputs) rs_ptrs.push_back(t.data_ptr());
        distributed::ReduceInRankOrder(dtype, op, rs_ptrs, factors, rs_whole.data_ptr(),
                                       static_cast<size_t>(n));
        const auto whole = raw(rs_whole);
        const size_t chunk_bytes = static_cast<size_t>(chunk) * ElementSize(dtype);
        for (int r = 0; r < world; ++r) {
          const std::string where = std::string(DTypeName(dtype)) + " " +
                                    distributed::ReduceOpName(op) + " world " +
                                    std::to_string(world) + " rank " + std::to_string(r);
          EXPECT_EQ(results[r].value->first, raw(ar_expected)) << "all_reduce " << where;
          EXPECT_EQ(results[r].value->second,
                    std::vector<uint8_t>(whole.begin() + r * chunk_bytes,
                                         whole.begin() + (r + 1) * chunk_bytes))
              << "reduce_scatter_tensor " << where;
        }
      }
    }
  }
}

TEST(ThreadedProcessGroupTest, SubgroupsFromEveryRankThread) {
  auto results = RunRanks(6, [](RankEnv& env) {
    // Every rank calls new_group for both subgroups, in the same order (torch semantics).
    auto evens = env.pg->new_group({4, 0, 2});  // any order; group ranks follow global order
    auto odds = env.pg->new_group({1, 3, 5});
    auto mine = env.rank % 2 == 0 ? evens : odds;
    EXPECT_EQ(env.rank % 2 == 0 ? odds : evens, nullptr);
    EXPECT_EQ(mine->size(), 3);
    EXPECT_EQ(mine->rank(), env.rank / 2);
    EXPECT_EQ(mine->global_rank(), env.rank);
    EXPECT_EQ(mine->group_name(), env.rank % 2 == 0 ? "1" : "2");
    EXPECT_EQ(mine->global_ranks(),
              env.rank % 2 == 0 ? std::vector<int>({0, 2, 4}) : std::vector<int>({1, 3, 5}));
    Tensor t = Tensor::full({1}, env.rank, DType::kInt64);
    mine->all_reduce(t);
    EXPECT_EQ(t.item(), env.rank % 2 == 0 ? 0 + 2 + 4 : 1 + 3 + 5);
    // A subgroup of a subgroup, created only by that subgroup's members.
    auto pair = mine->new_group({mine->global_ranks()[0], mine->global_ranks()[1]});
    if (mine->rank() < 2) {
      ASSERT_NE(pair, nullptr);
      Tensor p = Tensor::full({1}, 1, DType::kInt64);
      pair->all_reduce(p);
      EXPECT_EQ(p.item(), 2);
    } else {
      EXPECT_EQ(pair, nullptr);
    }
    // Broadcast on a subgroup uses the group rank as root.
    Tensor b = Tensor::full({1}, env.rank, DType::kInt64);
    mine->broadcast(b, mine->group_rank(env.rank % 2 == 0 ? 4 : 5));
    EXPECT_EQ(b.item(), env.rank % 2 == 0 ? 4 : 5);
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

TEST(ThreadedProcessGroupTest, DefaultGroupAndSeeds) {
  RunRanksOptions options;
  options.seed = 7;
  options.seed_by_rank = true;
  auto results = RunRanks(
      3,
      [](int rank) {
        EXPECT_TRUE(distributed::HasDefaultProcessGroup());
        auto pg = distributed::GetDefaultProcessGroup();
        EXPECT_EQ(pg->rank(), rank);
        EXPECT_EQ(RankContext::Current().rank(), rank);
        EXPECT_EQ(RankContext::Current().world_size(), 3);
        return RankContext::Current().generator().seed();
      },
      options);
  ASSERT_TRUE(results.all_ok()) << results.summary();
  EXPECT_EQ(results.values(), (std::vector<uint64_t>{7, 8, 9}));
}

TEST(ThreadedProcessGroupTest, ArgumentErrorsAreLocalAndNameTheCall) {
  auto results = RunRanks(2, [](RankEnv& env) {
    Tensor in = Tensor::zeros({3});
    Tensor bad_out = Tensor::zeros({5});
    try {
      env.pg->all_gather_into_tensor(bad_out, in);
      ADD_FAILURE() << "expected an error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(e.message().find("_allgather_base_ #1 on group 0"), std::string::npos) << e.what();
      EXPECT_NE(e.message().find("world size 2"), std::string::npos) << e.what();
    }
    Tensor ints = Tensor::zeros({2}, DType::kInt64);
    EXPECT_THROW(env.pg->all_reduce(ints, distributed::Avg()), Error);
    Tensor t = Tensor::zeros({2});
    EXPECT_THROW(env.pg->broadcast(t, 2), Error);
    // A misaligned in-place view is rejected.
    Tensor whole = Tensor::zeros({4});
    EXPECT_THROW(env.pg->all_gather_into_tensor(whole, whole.narrow(0, 1, 2)), Error);
    // Failed validation does not consume a sequence number: the groups stay in step.
    EXPECT_EQ(env.pg->sequence_number(), 0u);
    env.pg->all_reduce(t);
    EXPECT_EQ(env.pg->sequence_number(), 1u);
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

// c10d returns nothing for async_op=False, so the collectives/* scenarios check a Work only for
// async_op=True (returned, wait() returns). The threaded fake: every call returns a Work,
// complete and successful at once for a synchronous call, and after wait() for an asynchronous
// one.
TEST(ThreadedProcessGroupTest, WorkOfSyncAndAsyncCallsIsCompleteAndSuccessful) {
  auto results = RunRanks(2, [](RankEnv& env) {
    auto& pg = *env.pg;
    for (bool async_op : {false, true}) {
      Tensor t = Tensor::ones({4});
      Tensor full = Tensor::zeros({8});
      std::vector<Tensor> outs = {Tensor::zeros({4}), Tensor::zeros({4})};
      const std::vector<std::shared_ptr<distributed::Work>> works = {
          pg.all_reduce(t, distributed::Sum(), async_op),
          pg.reduce_scatter_tensor(t, Tensor::ones({8}), distributed::Sum(), async_op),
          pg.all_gather_into_tensor(full, t, async_op),
          pg.broadcast(t, 0, async_op),
          pg.all_gather(outs, t, async_op)};
      for (const auto& work : works) {
        ASSERT_NE(work, nullptr) << "rank " << env.rank << " async_op " << async_op;
        if (async_op) work->wait();
        EXPECT_TRUE(work->is_completed()) << work->description();
        EXPECT_TRUE(work->is_success()) << work->description();
      }
    }
  });
  ASSERT_TRUE(results.all_ok()) << results.summary();
}

TEST(ThreadedProcessGroupTest, WorldGroupsForLaunchersThatStartTheirOwnThreads) {
  auto groups = MakeThreadedWorldGroups(3, std::chrono::seconds(10));
  ASSERT_EQ(groups.size(), 3u);
  ThreadedWorld& world = static_cast<ThreadedProcessGroup&>(*groups[0]).world();
  std::vector<double> sums(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      RankContext context(r, 3);
      RankContextGuard guard(context);
      world.AttachRankContext(r, &context);
      Tensor t = Tensor::full({1}, r);
      groups[r]->all_reduce(t);
      sums[r] = t.item();
      world.MarkRankReturned(r);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(sums, (std::vector<double>{3, 3, 3}));
  EXPECT_NE(world.Report().find("returned from its function"), std::string::npos);
  EXPECT_THROW(world.CreateWorldGroup(0), Error);  // one handle per rank
}

}  // namespace
}  // namespace fsdp::fakes
