// GlooProcessGroup over real TCP: ranks as threads (in-process and TCP stores) at worlds
// 1..4, and ranks as processes (this binary re-executed as a worker through the launcher,
// with a FileStore in a fresh mktemp directory, and with MASTER_ADDR/MASTER_PORT).
#include "engine/distributed/gloo/gloo_process_group.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <latch>
#include <thread>

#include "engine/core/rank_context.h"
#include "engine/distributed/comm_debug_mode.h"
#include "engine/distributed/device_mesh.h"
#include "engine/distributed/gloo/gloo_reduce_scatter.h"
#include "engine/distributed/launch.h"
#include "engine/distributed/store/file_store.h"
#include "engine/distributed/store/hash_store.h"
#include "engine/distributed/store/tcp_store.h"

namespace fsdp::distributed {
namespace {

using std::chrono::milliseconds;

// ---- Ranks as threads ---------------------------------------------------------------------

struct ThreadOutcome {
  bool ok = true;
  ErrorCode code = ErrorCode::kInternal;
  std::string message;
};

// Runs fn(rank, pg) on `world` threads, each with its own RankContext and Gloo group.
template <typename Fn>
std::vector<ThreadOutcome> RunGlooThreads(int world, Fn fn, GlooOptions options = {},
                                          std::shared_ptr<Store> store = nullptr) {
  if (!store) store = std::make_shared<HashStore>();
  std::vector<ThreadOutcome> out(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      RankContext context(r, world);
      RankContextGuard guard(context);
      try {
        auto pg = GlooProcessGroup::Create(store, r, world, options);
        fn(r, *pg);
      } catch (const Error& e) {
        out[r] = {false, e.code(), e.what()};
      } catch (const std::exception& e) {
        out[r] = {false, ErrorCode::kInternal, e.what()};
      }
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

std::string Summary(const std::vector<ThreadOutcome>& outcomes) {
  std::string s;
  for (size_t r = 0; r < outcomes.size(); ++r) {
    s += "rank " + std::to_string(r) + ": " + (outcomes[r].ok ? "ok" : outcomes[r].message) + "\n";
  }
  return s;
}

bool AllOk(const std::vector<ThreadOutcome>& outcomes) {
  for (const auto& o : outcomes) {
    if (!o.ok) return false;
  }
  return true;
}

// Exact-by-construction data, as in the threaded fake's tests: values in {-1, 0, 1}.
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
double Factor(int rank) { return std::ldexp(1.0, -(rank % 3)); }
double Reduced(DType dtype, ReduceOp op, int world, int64_t i, int salt) {
  double acc = 0;
  for (int r = 0; r < world; ++r) {
    const double x = Value(r, i, salt);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        acc += x;
        break;
      case ReduceOp::kPremulSum:
        acc += x * Factor(r);
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

// Every collective of one dtype on `pg`, checked exactly. Shared by the thread and process
// tests.
void CheckEveryCollective(ProcessGroup& pg, DType dtype) {
  const int r = pg.rank();
  const int W = pg.size();
  {
    Tensor in = MakeTensor(r, {2, 3}, dtype, 1);
    Tensor out = Tensor::zeros({2 * W, 3}, dtype);
    pg.all_gather_into_tensor(out, in);
    for (int q = 0; q < W; ++q) {
      EXPECT_EQ(out.narrow(0, 2 * q, 2).to_doubles(), Values(q, 6, 1)) << "rank " << r;
    }
    Tensor whole = Tensor::zeros({3 * W}, dtype);
    Tensor mine = whole.narrow(0, 3 * r, 3);
    mine.copy_(MakeTensor(r, {3}, dtype, 2));
    pg.all_gather_into_tensor(whole, mine);  // in place
    for (int q = 0; q < W; ++q) EXPECT_EQ(whole.narrow(0, 3 * q, 3).to_doubles(), Values(q, 3, 2));
  }
  std::vector<ReduceOptions> ops = {Sum(), Min(), Max()};
  if (IsFloatingPoint(dtype)) {
    ops.push_back(Avg());
    ops.push_back(PremulSum(Factor(r)));
  }
  int salt = 3;
  for (const auto& op : ops) {
    ++salt;
    Tensor in = MakeTensor(r, {W * 4}, dtype, salt);
    Tensor out = Tensor::zeros({4}, dtype);
    pg.reduce_scatter_tensor(out, in, op);
    const auto got = out.to_doubles();
    for (int64_t i = 0; i < 4; ++i) {
      EXPECT_EQ(got[i], Reduced(dtype, op.op, W, r * 4 + i, salt))
          << "reduce_scatter " << ReduceOpName(op.op) << " rank " << r;
    }
    Tensor buf = MakeTensor(r, {W * 4}, dtype, salt);
    Tensor chunk = buf.narrow(0, 4 * r, 4);
    pg.reduce_scatter_tensor(chunk, buf, op);  // in place
    EXPECT_EQ(chunk.to_doubles(), got);
    Tensor t = MakeTensor(r, {5}, dtype, salt);
    pg.all_reduce(t, op);
    const auto ar = t.to_doubles();
    for (int64_t i = 0; i < 5; ++i) {
      EXPECT_EQ(ar[i], Reduced(dtype, op.op, W, i, salt)) << "all_reduce " << ReduceOpName(op.op);
    }
  }
  Tensor b = MakeTensor(r, {4}, dtype, 9);
  pg.broadcast(b, W - 1);
  EXPECT_EQ(b.to_doubles(), Values(W - 1, 4, 9));
  // allgather_ with uneven sizes, including an empty contribution from rank 0.
  Tensor in = MakeTensor(r, {r}, dtype, 11);
  std::vector<Tensor> outs;
  for (int q = 0; q < W; ++q) outs.push_back(Tensor::zeros({q}, dtype));
  pg.all_gather(outs, in);
  for (int q = 0; q < W; ++q) EXPECT_EQ(outs[q].to_doubles(), Values(q, q, 11));
  pg.barrier();
}

class GlooCollectivesTest : public testing::TestWithParam<int> {};

TEST_P(GlooCollectivesTest, EveryCollectiveAndDtypeIsExact) {
  const int world = GetParam();
  GlooOptions options;
  options.timeout = std::chrono::seconds(20);
  auto outcomes = RunGlooThreads(
      world,
      [](int, ProcessGroup& pg) {
        EXPECT_EQ(pg.backend_name(), "gloo");
        EXPECT_EQ(pg.group_name(), "0");
        for (DType dtype :
             {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16, DType::kInt64}) {
          CheckEveryCollective(pg, dtype);
        }
      },
      options);
  ASSERT_TRUE(AllOk(outcomes)) << Summary(outcomes);
}

INSTANTIATE_TEST_SUITE_P(Worlds, GlooCollectivesTest, testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return "W" + std::to_string(info.param); });

// Chunks of several ring segments (and a partial last one) go through the pipelined ring's
// segment bookkeeping ([Note: pipelined ring reduce-scatter]): out of place and in place, with
// a conversion (float16) and without (float32), a scaled op and a plain one.
TEST(GlooProcessGroupTest, ReduceScatterOfMultiSegmentChunksIsExact) {
  constexpr int kWorld = 3;
  const int64_t chunk = static_cast<int64_t>(2 * kRingSegmentBytes / sizeof(float) + 3);
  auto outcomes = RunGlooThreads(kWorld, [&](int, ProcessGroup& pg) {
    const int r = pg.rank();
    int salt = 20;
    for (DType dtype : {DType::kFloat32, DType::kFloat16}) {
      for (const ReduceOptions& op : {Sum(), PremulSum(Factor(r))}) {
        ++salt;
        Tensor in = MakeTensor(r, {kWorld * chunk}, dtype, salt);
        Tensor out = Tensor::empty({chunk}, dtype);
        pg.reduce_scatter_tensor(out, in, op);
        const auto got = out.to_doubles();
        int64_t wrong = 0;
        for (int64_t i = 0; i < chunk; ++i) {
          wrong += got[i] != Reduced(dtype, op.op, kWorld, r * chunk + i, salt);
        }
        EXPECT_EQ(wrong, 0) << DTypeName(dtype) << " " << ReduceOpName(op.op) << " rank " << r;
        Tensor own = in.narrow(0, r * chunk, chunk);
        pg.reduce_scatter_tensor(own, in, op);  // in place
        EXPECT_EQ(own.to_doubles(), got) << "in place, " << DTypeName(dtype);
      }
    }
  });
  ASSERT_TRUE(AllOk(outcomes)) << Summary(outcomes);
}

TEST(GlooProcessGroupTest, CommDebugModeRecordsGlooCollectives) {
  auto outcomes = RunGlooThreads(2, [](int, ProcessGroup& pg) {
    CommDebugMode mode;
    Tensor shard = Tensor::ones({2});
    Tensor full = Tensor::zeros({4});
    pg.all_gather_into_tensor(full, shard);
    pg.reduce_scatter_tensor(shard, full);
    EXPECT_EQ(mode.get_comm_counts(), (CommDebugMode::Counts{{"c10d._allgather_base_", 1},
                                                             {"c10d._reduce_scatter_base_", 1}}));
  });
  ASSERT_TRUE(AllOk(outcomes)) << Summary(outcomes);
}

// The collectives/* scenarios check only that AVG and PREMUL_SUM on int64 fail on every rank
// and leave the group usable (c10d does not say how); our ProcessGroup front rejects them with
// InvalidArgument naming the op and the dtype, before any communication: no sequence number is
// used, on any rank.
TEST(GlooProcessGroupTest, FrontRejectsAvgAndPremulSumOnInt64BeforeCommunicating) {
  auto outcomes = RunGlooThreads(2, [](int, ProcessGroup& pg) {
    const uint64_t sequence = pg.sequence_number();
    for (const ReduceOptions& op : {Avg(), PremulSum(2.0)}) {
      for (bool async_op : {false, true}) {
        Tensor t = Tensor::ones({4}, DType::kInt64);
        Tensor out = Tensor::zeros({2}, DType::kInt64);
        for (bool scatter : {false, true}) {
          try {
            if (scatter) {
              pg.reduce_scatter_tensor(out, t, op, async_op);
            } else {
              pg.all_reduce(t, op, async_op);
            }
            ADD_FAILURE() << ReduceOpName(op.op) << " on int64 was accepted";
          } catch (const Error& e) {
            EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
            EXPECT_NE(e.message().find(ReduceOpName(op.op)), std::string::npos) << e.what();
            EXPECT_NE(e.message().find("int64"), std::string::npos) << e.what();
          }
        }
      }
    }
    EXPECT_EQ(pg.sequence_number(), sequence);
    Tensor t = Tensor::ones({4}, DType::kInt64);
    pg.all_reduce(t);
    EXPECT_EQ(t.to_doubles(), std::vector<double>(4, 2.0));
    EXPECT_EQ(pg.sequence_number(), sequence + 1);
  });
  ASSERT_TRUE(AllOk(outcomes)) << Summary(outcomes);
}

// c10d returns nothing for async_op=False, so the collectives/* scenarios check a Work only for
// async_op=True (returned, wait() returns). Ours: every call returns a Work, complete and
// successful at once for a synchronous call, and after wait() for an asynchronous one.
TEST(GlooProcessGroupTest, WorkOfSyncAndAsyncCallsIsCompleteAndSuccessful) {
  auto outcomes = RunGlooThreads(2, [](int r, ProcessGroup& pg) {
    for (bool async_op : {false, true}) {
      Tensor t = Tensor::ones({4});
      Tensor full = Tensor::zeros({8});
      std::vector<Tensor> outs = {Tensor::zeros({4}), Tensor::zeros({4})};
      const std::vector<std::shared_ptr<Work>> works = {
          pg.all_reduce(t, Sum(), async_op),
          pg.reduce_scatter_tensor(t, Tensor::ones({8}), Sum(), async_op),
          pg.all_gather_into_tensor(full, t, async_op),
          pg.broadcast(t, 0, async_op),
          pg.all_gather(outs, t, async_op)};
      for (const auto& work : works) {
        ASSERT_NE(work, nullptr) << "rank " << r << " async_op " << async_op;
        if (async_op) work->wait();
        EXPECT_TRUE(work->is_completed()) << work->description();
        EXPECT_TRUE(work->is_success()) << work->description();
      }
    }
  });
  ASSERT_TRUE(AllOk(outcomes)) << Summary(outcomes);
}

TEST(GlooProcessGroupTest, SubgroupsAndMesh) {
  auto outcomes = RunGlooThreads(4, [](int r, ProcessGroup& pg) {
    auto evens = pg.new_group({0, 2});
    auto odds = pg.new_group({1, 3});
    auto mine = r % 2 == 0 ? evens : odds;
    ASSERT_NE(mine, nullptr);
    EXPECT_EQ(r % 2 == 0 ? odds : evens, nullptr);
    EXPECT_EQ(mine->group_name(), r % 2 == 0 ? "1" : "2");
    EXPECT_EQ(mine->rank(), r / 2);
    Tensor t = Tensor::full({3}, r, DType::kBFloat16);
    mine->all_reduce(t);
    EXPECT_EQ(t.to_doubles()[0], r % 2 == 0 ? 2.0 : 4.0);
    Tensor out = Tensor::zeros({2});
    mine->reduce_scatter_tensor(out, Tensor::full({4}, r));
    EXPECT_EQ(out.to_doubles()[0], r % 2 == 0 ? 2.0 : 4.0);
    // init_device_mesh((2, 2)) on Gloo.
    auto mesh = DeviceMesh::Init(pg.shared_from_this(), "cpu", {2, 2}, {"dp", "tp"});
    auto tp = mesh->get_group("tp");
    EXPECT_EQ(tp->global_ranks(), (r < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3}));
    Tensor x = Tensor::full({1}, r, DType::kInt64);
    mesh->get_group("dp")->all_reduce(x);
    EXPECT_EQ(x.item(), r % 2 == 0 ? 2 : 4);
  });
  ASSERT_TRUE(AllOk(outcomes)) << Summary(outcomes);
}

TEST(GlooProcessGroupTest, CheckCollectivesReportsMismatchOnEveryRank) {
  GlooOptions options;
  options.check_collectives = true;
  options.timeout = std::chrono::seconds(10);
  auto outcomes = RunGlooThreads(
      3,
      [](int r, ProcessGroup& pg) {
        Tensor ok = Tensor::ones({2});
        pg.all_reduce(ok);
        Tensor t = Tensor::zeros({r == 2 ? 5 : 4});
        pg.all_reduce(t);
      },
      options);
  for (const auto& o : outcomes) {
    ASSERT_FALSE(o.ok);
    EXPECT_EQ(o.code, ErrorCode::kDataLoss) << o.message;
    EXPECT_NE(o.message.find("rank 2: input numel differs: allreduce_ #2 float32 in [4]"),
              std::string::npos)
        << o.message;
    EXPECT_NE(o.message.find("vs allreduce_ #2 float32 in [5]"), std::string::npos) << o.message;
  }
}

TEST(GlooProcessGroupTest, CheckedNewGroupListsMustMatch) {
  GlooOptions options;
  options.check_collectives = true;
  auto outcomes = RunGlooThreads(
      2,
      [](int r, ProcessGroup& pg) {
        pg.new_group(r == 0 ? std::vector<int>{0} : std::vector<int>{1});
      },
      options);
  for (const auto& o : outcomes) {
    ASSERT_FALSE(o.ok);
    EXPECT_EQ(o.code, ErrorCode::kDataLoss) << o.message;
  }
}

TEST(GlooProcessGroupTest, MissingPeerTimesOutWithDeadlineExceededThenGroupIsUnusable) {
  GlooOptions options;
  options.timeout = milliseconds(500);
  std::latch rank0_done(1);
  const auto start = std::chrono::steady_clock::now();
  auto outcomes = RunGlooThreads(
      2,
      [&](int r, ProcessGroup& pg) {
        Tensor t = Tensor::ones({4});
        pg.all_reduce(t);  // both
        if (r == 1) {
          rank0_done.wait();  // never joins the second collective
          return;
        }
        try {
          pg.all_reduce(t);
        } catch (const Error& e) {
          rank0_done.count_down();
          EXPECT_EQ(e.code(), ErrorCode::kDeadlineExceeded) << e.what();
          EXPECT_NE(e.message().find("allreduce_ #2 on group 0"), std::string::npos) << e.what();
          EXPECT_NE(e.message().find("this rank's last collectives"), std::string::npos);
          try {
            pg.barrier();
            ADD_FAILURE() << "a broken group must refuse collectives";
          } catch (const Error& again) {
            EXPECT_EQ(again.code(), ErrorCode::kFailedPrecondition) << again.what();
          }
          return;
        }
        rank0_done.count_down();
        ADD_FAILURE() << "expected a timeout";
      },
      options);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  ASSERT_TRUE(AllOk(outcomes)) << Summary(outcomes);
}

// The straggler check names a rank that never reaches a collective on every waiting rank long
// before the collective's own deadline (20 s here), with its last completed collective; the
// missing rank, arriving late, fails at once with the report of the ranks that gave up. The
// first waiting rank to give up waited the straggler timeout; another one, which may have started
// waiting later, fails as soon as it reads that report, so only the longest wait is bounded below.
TEST(GlooProcessGroupTest, StragglerTimeoutNamesTheMissingRankOnEveryWaitingRank) {
  GlooOptions options;
  options.timeout = milliseconds(20000);
  options.straggler_timeout = milliseconds(300);
  constexpr int kWorld = 3;
  constexpr int kMissing = 2;
  std::latch others_failed(kWorld - 1);
  std::vector<double> waited_ms(kWorld, 0);
  auto outcomes = RunGlooThreads(
      kWorld,
      [&](int r, ProcessGroup& pg) {
        Tensor t = Tensor::ones({4});
        pg.all_reduce(t);  // #1 on every rank
        if (r == kMissing) others_failed.wait();
        const auto start = std::chrono::steady_clock::now();
        try {
          pg.all_reduce(t);  // #2: rank kMissing issues it only after the others gave up
        } catch (...) {
          waited_ms[r] = std::chrono::duration<double, std::milli>(
                             std::chrono::steady_clock::now() - start)
                             .count();
          if (r != kMissing) others_failed.count_down();
          throw;
        }
      },
      options);
  for (int r = 0; r < kWorld; ++r) {
    const ThreadOutcome& o = outcomes[r];
    ASSERT_FALSE(o.ok) << "rank " << r;
    EXPECT_EQ(o.code, ErrorCode::kDeadlineExceeded) << o.message;
    EXPECT_NE(o.message.find("allreduce_ #2 on group 0"), std::string::npos) << o.message;
    EXPECT_NE(o.message.find("rank 2 (global rank 2): last completed collective allreduce_ #1"),
              std::string::npos)
        << o.message;
    if (r == kMissing) {
      EXPECT_NE(o.message.find("a peer gave up waiting"), std::string::npos) << o.message;
      EXPECT_LT(waited_ms[r], 1000.0) << "the late rank fails at once";
    } else {
      EXPECT_NE(o.message.find("straggler timeout 300 ms"), std::string::npos) << o.message;
      EXPECT_LT(waited_ms[r], 5000.0) << "named long before the 20 s collective deadline";
    }
  }
  EXPECT_GE(std::max(waited_ms[0], waited_ms[1]), 300.0) << "the first to give up waited it out";
}

// A rank whose group is destroyed (its function returned) is named at once by the ranks waiting
// for it, not after the straggler timeout.
TEST(GlooProcessGroupTest, StragglerCheckNamesARankThatLeftAtOnce) {
  GlooOptions options;
  options.timeout = milliseconds(20000);
  options.straggler_timeout = milliseconds(10000);
  std::vector<double> waited_ms(2, 0);
  auto outcomes = RunGlooThreads(
      2,
      [&](int r, ProcessGroup& pg) {
        Tensor t = Tensor::ones({4});
        pg.barrier();  // #1 on both
        if (r == 1) return;  // its group is destroyed without #2
        const auto start = std::chrono::steady_clock::now();
        try {
          pg.all_reduce(t);
        } catch (...) {
          waited_ms[r] = std::chrono::duration<double, std::milli>(
                             std::chrono::steady_clock::now() - start)
                             .count();
          throw;
        }
      },
      options);
  EXPECT_TRUE(outcomes[1].ok) << outcomes[1].message;
  ASSERT_FALSE(outcomes[0].ok);
  EXPECT_EQ(outcomes[0].code, ErrorCode::kDeadlineExceeded) << outcomes[0].message;
  EXPECT_NE(outcomes[0].message.find("rank 1 (global rank 1): left the group without reaching "
                                     "it (its group was destroyed) after barrier #1"),
            std::string::npos)
      << outcomes[0].message;
  EXPECT_LT(waited_ms[0], 2000.0) << "a rank that left is named at once";
}

TEST(GlooProcessGroupTest, RendezvousTimesOutWhenAPeerNeverComes) {
  GlooOptions options;
  options.timeout = milliseconds(300);
  RankContext context(0, 2);
  RankContextGuard guard(context);
  try {
    GlooProcessGroup::Create(std::make_shared<HashStore>(), 0, 2, options);
    FAIL() << "expected a rendezvous timeout";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kDeadlineExceeded) << e.what();
    EXPECT_NE(e.message().find("rendezvous of gloo group 0"), std::string::npos) << e.what();
  }
}

TEST(GlooProcessGroupTest, TcpStoreRendezvousInThreads) {
  auto server = std::make_shared<TcpStore>("127.0.0.1", 0, /*is_server=*/true, std::chrono::seconds(10));
  const int port = server->port();
  ASSERT_GT(port, 0);
  server->set("hello", "world");
  EXPECT_EQ(server->get("hello"), "world");
  try {
    server->get("missing", milliseconds(100));
    ADD_FAILURE() << "expected a timeout";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kDeadlineExceeded) << e.what();
  }
  std::vector<std::shared_ptr<Store>> stores = {server};
  for (int r = 1; r < 3; ++r) {
    stores.push_back(std::make_shared<TcpStore>("127.0.0.1", port, false, std::chrono::seconds(10)));
  }
  std::vector<ThreadOutcome> out(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto pg = GlooProcessGroup::Create(stores[r], r, 3);
        Tensor t = Tensor::full({2}, r + 1, DType::kFloat16);
        pg->all_reduce(t);
        EXPECT_EQ(t.to_doubles(), (std::vector<double>{6, 6}));
      } catch (const Error& e) {
        out[r] = {false, e.code(), e.what()};
      }
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE(AllOk(out)) << Summary(out);
}

// ---- Launcher -----------------------------------------------------------------------------

EnvLookup MapEnv(std::map<std::string, std::string> vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

TEST(LaunchTest, ReadsTorchrunMpiAndSlurmVariables) {
  auto torchrun = ReadLaunchEnvironment(MapEnv({{"RANK", "3"},
                                                {"WORLD_SIZE", "8"},
                                                {"LOCAL_RANK", "1"},
                                                {"LOCAL_WORLD_SIZE", "2"},
                                                {"MASTER_ADDR", "node0"},
                                                {"MASTER_PORT", "29500"}}));
  EXPECT_EQ(torchrun.source, "torchrun");
  EXPECT_EQ(torchrun.rank, 3);
  EXPECT_EQ(torchrun.world_size, 8);
  EXPECT_EQ(torchrun.local_rank, 1);
  EXPECT_EQ(torchrun.local_world_size, 2);
  EXPECT_EQ(torchrun.str(), "rank 3/8 (local 1/2) from torchrun, store tcp://node0:29500");

  auto mpi = ReadLaunchEnvironment(MapEnv({{"OMPI_COMM_WORLD_RANK", "1"},
                                           {"OMPI_COMM_WORLD_SIZE", "2"},
                                           {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                           {"FSDP_STORE_PATH", "/mnt/nfs/run1"},
                                           {"FSDP_PG_TIMEOUT_MS", "5000"},
                                           {"GLOO_SOCKET_IFNAME", "eth0"}}));
  EXPECT_EQ(mpi.source, "openmpi");
  EXPECT_EQ(mpi.rank, 1);
  EXPECT_EQ(mpi.store_path, "/mnt/nfs/run1");
  EXPECT_EQ(mpi.iface, "eth0");
  EXPECT_EQ(*mpi.timeout, milliseconds(5000));
  EXPECT_FALSE(mpi.check_collectives);
  EXPECT_TRUE(ReadLaunchEnvironment(MapEnv({{"FSDP_CHECK_COLLECTIVES", "1"}})).check_collectives);
  EXPECT_EQ(mpi.straggler_timeout, milliseconds(0));  // off unless asked for
  EXPECT_EQ(ReadLaunchEnvironment(MapEnv({{"FSDP_STRAGGLER_TIMEOUT_MS", "2500"}})).straggler_timeout,
            milliseconds(2500));

  auto slurm = ReadLaunchEnvironment(MapEnv({{"SLURM_PROCID", "5"},
                                             {"SLURM_NTASKS", "6"},
                                             {"SLURM_LOCALID", "1"},
                                             {"SLURM_NTASKS_PER_NODE", "2(x3)"},
                                             {"MASTER_ADDR", "n1"},
                                             {"MASTER_PORT", "1234"}}));
  EXPECT_EQ(slurm.source, "slurm");
  EXPECT_EQ(slurm.local_world_size, 2);

  auto single = ReadLaunchEnvironment(MapEnv({}));
  EXPECT_EQ(single.source, "default");
  EXPECT_EQ(single.world_size, 1);
}

TEST(LaunchTest, RejectsInconsistentVariables) {
  auto code_of = [](std::map<std::string, std::string> vars) {
    try {
      ReadLaunchEnvironment(MapEnv(std::move(vars)));
    } catch (const Error& e) {
      return std::optional<std::string>(e.message());
    }
    return std::optional<std::string>();
  };
  EXPECT_NE(code_of({{"RANK", "0"}})->find("WORLD_SIZE is not set"), std::string::npos);
  EXPECT_NE(code_of({{"RANK", "4"}, {"WORLD_SIZE", "4"}, {"FSDP_STORE_PATH", "/x"}})
                ->find("not below the world size"),
            std::string::npos);
  EXPECT_NE(code_of({{"RANK", "x"}, {"WORLD_SIZE", "4"}})->find("RANK='x'"), std::string::npos);
  EXPECT_NE(code_of({{"FSDP_STRAGGLER_TIMEOUT_MS", "-1"}})->find("FSDP_STRAGGLER_TIMEOUT_MS='-1'"),
            std::string::npos);
  EXPECT_NE(code_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}})->find("needs a rendezvous"),
            std::string::npos);
  EXPECT_NE(
      code_of({{"FSDP_CHECK_COLLECTIVES", "yes"}})->find("FSDP_CHECK_COLLECTIVES must be 0 or 1"),
      std::string::npos);
}

TEST(LaunchTest, SingleRankSessionNeedsNoRendezvous) {
  auto session = DistributedSession::FromEnvironment(MapEnv({}));
  EXPECT_EQ(session->world().size(), 1);
  EXPECT_EQ(GetDefaultProcessGroup(), session->world_ptr());
  Tensor t = Tensor::ones({2});
  session->world().all_reduce(t);
  EXPECT_EQ(t.to_doubles(), (std::vector<double>{1, 1}));
}

// ---- Ranks as processes -------------------------------------------------------------------

// The worker half of the process tests. It is registered only inside a worker process
// (RunWorkers sets FSDP_GLOO_TEST_WORKER and re-executes this binary filtered to it), so
// ordinary runs neither list, skip nor disable it.
class GlooProcessWorkerTest : public ::testing::Test {
 public:
  void TestBody() override {
    auto session = DistributedSession::FromEnvironment();
    ProcessGroup& pg = session->world();
    ASSERT_EQ(pg.size(), 2);
    for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kInt64}) {
      CheckEveryCollective(pg, dtype);
    }
  }
};

// The worker half of GlooProcessTest.ARankHangingInsideACollectiveIsNamedOnEveryRank: every
// rank runs all_reduce #1, then #2; ranks other than kHangingRank start #2 only once the test
// has stopped rank kHangingRank inside it (the file "<dir>/go"). Each rank writes how #2 ended
// to "<dir>/outcome<rank>": the milliseconds it took, the error code name ("OK" when it
// succeeded) and the message.
constexpr int kHangingRank = 1;

class GlooHangWorkerTest : public ::testing::Test {
 public:
  void TestBody() override {
    const std::string dir = std::getenv("FSDP_GLOO_TEST_DIR");
    auto session = DistributedSession::FromEnvironment();
    ProcessGroup& pg = session->world();
    Tensor t = Tensor::ones({1024});
    pg.all_reduce(t);  // #1
    if (pg.rank() != kHangingRank) {
      while (!std::filesystem::exists(dir + "/go")) std::this_thread::sleep_for(milliseconds(5));
    }
    const auto start = std::chrono::steady_clock::now();
    std::string code = "OK";
    std::string message;
    try {
      pg.all_reduce(t);  // #2
    } catch (const Error& e) {
      code = ErrorCodeName(e.code());
      message = e.what();
    }
    const auto ms = std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() -
                                                             start);
    std::ofstream(dir + "/outcome" + std::to_string(pg.rank()))
        << ms.count() << "\n" << code << "\n" << message;
  }
};

const bool kWorkerRegistered = [] {
  const char* kind = std::getenv("FSDP_GLOO_TEST_WORKER");
  if (kind == nullptr) return false;
  if (std::string(kind) == "hang") {
    ::testing::RegisterTest("GlooProcessWorker", "Rank", nullptr, nullptr, __FILE__, __LINE__,
                            []() -> ::testing::Test* { return new GlooHangWorkerTest; });
    return true;
  }
  ::testing::RegisterTest("GlooProcessWorker", "Rank", nullptr, nullptr, __FILE__, __LINE__,
                          []() -> ::testing::Test* { return new GlooProcessWorkerTest; });
  return true;
}();

int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// Starts this test binary re-executed as `world` worker processes of kind `kind` (the value of
// FSDP_GLOO_TEST_WORKER) with the launcher's environment plus `extra`, each logging to
// "<dir>/worker<rank>.log"; returns their pids.
std::vector<pid_t> StartWorkers(int world, const std::string& dir,
                                const std::map<std::string, std::string>& extra,
                                const std::string& kind = "1") {
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    const std::string log = dir + "/worker" + std::to_string(r) + ".log";
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::setenv("FSDP_GLOO_TEST_WORKER", kind.c_str(), 1);
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::setenv("FSDP_PG_TIMEOUT_MS", "20000", 1);
      for (const auto& [k, v] : extra) ::setenv(k.c_str(), v.c_str(), 1);
      FILE* f = std::freopen(log.c_str(), "w", stdout);
      if (f != nullptr) ::dup2(::fileno(stdout), STDERR_FILENO);
      ::execl(self.c_str(), self.c_str(), "--gtest_filter=GlooProcessWorker.Rank",
              static_cast<char*>(nullptr));
      ::_exit(127);
    }
    pids.push_back(pid);
  }
  return pids;
}

// Waits for worker `pid` until `deadline`, then kills it (SIGKILL, which also ends a stopped
// process); returns its exit status (128 + signal when killed) and whether it ended by itself.
std::pair<int, char> WaitWorker(pid_t pid, std::chrono::steady_clock::time_point deadline) {
  int status = 0;
  char ended = 1;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      ended = 0;
      break;
    }
    std::this_thread::sleep_for(milliseconds(5));
  }
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), ended};
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Re-executes this test binary as `world` worker processes with the launcher's environment
// plus `extra`; returns each worker's exit status and log.
std::vector<std::pair<int, std::string>> RunWorkers(
    int world, const std::string& dir, const std::map<std::string, std::string>& extra) {
  const std::vector<pid_t> pids = StartWorkers(world, dir, extra);
  std::vector<std::pair<int, std::string>> results;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (int r = 0; r < world; ++r) {
    const int status = WaitWorker(pids[r], deadline).first;
    results.emplace_back(status, ReadFile(dir + "/worker" + std::to_string(r) + ".log"));
  }
  return results;
}

std::string MakeTempDir() {
  char pattern[] = "/tmp/fsdp-gloo-XXXXXX";
  const char* dir = ::mkdtemp(pattern);
  return dir == nullptr ? std::string() : std::string(dir);
}

TEST(GlooProcessTest, TwoProcessesWithFileStore) {
  const std::string dir = MakeTempDir();
  ASSERT_FALSE(dir.empty());
  const auto results = RunWorkers(2, dir, {{"FSDP_STORE_PATH", dir + "/store"}});
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_EQ(results[r].first, 0) << "worker " << r << " log:\n" << results[r].second;
    EXPECT_NE(results[r].second.find("[  PASSED  ] 1 test"), std::string::npos)
        << results[r].second;
  }
  std::filesystem::remove_all(dir);
}

TEST(GlooProcessTest, TwoProcessesWithMasterAddrAndPort) {
  const std::string dir = MakeTempDir();
  ASSERT_FALSE(dir.empty());
  const auto results = RunWorkers(
      2, dir, {{"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(FreePort())}});
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_EQ(results[r].first, 0) << "worker " << r << " log:\n" << results[r].second;
  }
  std::filesystem::remove_all(dir);
}

// A rank that stops (SIGSTOP) inside a collective every member reached, where the straggler
// check sees every member arrive and the transfers then block: each other rank's watchdog sees
// its heartbeat stop, and every rank fails with DeadlineExceeded naming the stuck rank, the
// collective and its sequence number, with its flight recorder's last collectives, seconds
// after the straggler timeout instead of at the 20 s collective deadline (before the watchdog
// they waited the deadline). The stopped rank, continued afterwards, fails with the same report
// at once (without dying of SIGPIPE on the connections its peers closed); no worker is left
// behind.
TEST(GlooProcessTest, ARankHangingInsideACollectiveIsNamedOnEveryRank) {
  constexpr int kWorld = 3;
  const std::string dir = MakeTempDir();
  ASSERT_FALSE(dir.empty());
  const std::vector<pid_t> pids =
      StartWorkers(kWorld, dir,
                   {{"FSDP_STORE_PATH", dir + "/store"},
                    {"FSDP_STRAGGLER_TIMEOUT_MS", "1000"},
                    {"FSDP_GLOO_TEST_DIR", dir}},
                   "hang");
  // Rank kHangingRank announced its arrival at #2 (the StragglerMonitor's key in the world
  // group's namespace) and waits there for the others, which wait for "go"; once its watchdog
  // has written a heartbeat (under load the first one can come after the arrival), stop it.
  FileStore store(dir + "/store");
  const std::string hanging = std::to_string(kHangingRank);
  const bool arrived = store.wait_for(
      {"/pg0/stragglers/arrive/2/" + hanging, "/pg0/watchdog/heartbeat/" + hanging},
      std::chrono::seconds(30));
  if (arrived) ::kill(pids[kHangingRank], SIGSTOP);
  std::ofstream(dir + "/go").flush();
  const auto go = std::chrono::steady_clock::now();
  const auto deadline = go + std::chrono::seconds(30);
  std::vector<double> ended_after_ms(kWorld, 0);
  std::vector<char> ended_by_itself(kWorld, 0);  // bool, not std::vector<bool> (std::tie)
  std::vector<int> status(kWorld, -1);
  for (int r = 0; r < kWorld; ++r) {
    if (r == kHangingRank) continue;
    std::tie(status[r], ended_by_itself[r]) = WaitWorker(pids[r], deadline);
    ended_after_ms[r] =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - go).count();
  }
  ::kill(pids[kHangingRank], SIGCONT);
  const auto continued = std::chrono::steady_clock::now();
  std::tie(status[kHangingRank], ended_by_itself[kHangingRank]) =
      WaitWorker(pids[kHangingRank], continued + std::chrono::seconds(10));
  ended_after_ms[kHangingRank] = std::chrono::duration<double, std::milli>(
                                     std::chrono::steady_clock::now() - continued)
                                     .count();
  ASSERT_TRUE(arrived) << "rank " << kHangingRank << " never reached #2:\n"
                       << ReadFile(dir + "/worker1.log");
  for (int r = 0; r < kWorld; ++r) {
    // Reaped above; no process of the worker is left.
    EXPECT_EQ(::kill(pids[r], 0), -1) << "worker " << r << " is still there";
    const std::string outcome = ReadFile(dir + "/outcome" + std::to_string(r));
    const std::string context =
        "rank " + std::to_string(r) + " outcome:\n" + outcome + "\nlog:\n" +
        ReadFile(dir + "/worker" + std::to_string(r) + ".log");
    EXPECT_TRUE(ended_by_itself[r]) << context;
    EXPECT_EQ(status[r], 0) << "no SIGPIPE or crash; " << context;
    EXPECT_LT(ended_after_ms[r], 5000.0) << context;
    EXPECT_NE(outcome.find("\nDeadlineExceeded\n"), std::string::npos) << context;
    EXPECT_NE(outcome.find("allreduce_ #2 on group 0"), std::string::npos) << context;
    EXPECT_NE(outcome.find("hang inside it"), std::string::npos) << context;
    EXPECT_NE(outcome.find("\n    rank 1 (global rank 1): last heartbeat: "), std::string::npos)
        << context;
    EXPECT_NE(outcome.find("this rank's last collectives:"), std::string::npos) << context;
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace fsdp::distributed
