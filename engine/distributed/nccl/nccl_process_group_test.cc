// GPU tests of NcclProcessGroup (ctest label gpu). Each test skips with a reason when fewer
// CUDA devices are visible than it needs:
//   >= 1 device: a world of one on cuda:0, every collective x dtype x reduce op, sync and
//                async, in place, barrier, and the wrong-device error;
//   >= 2 devices: two ranks as threads of this process, one device each (two
//                ncclCommInitRankConfig calls sharing an in-process store): every collective
//                against the rank-order reference, subgroups by ncclCommSplit, async work on a
//                user stream, and the deadline abort (one rank does not arrive).
// Inputs are exact ({-1, 0, 1} and power-of-two PREMUL factors), so NCCL's reduction order
// and precision cannot change the results, and expectations come from ReduceInRankOrder.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "engine/core/allocator.h"
#include "engine/core/cuda_stream.h"
#include "engine/core/rank_context.h"
#include "engine/core/tensor.h"
#include "engine/distributed/nccl/nccl_process_group.h"
#include "engine/distributed/reduce_op.h"
#include "engine/distributed/store/hash_store.h"

namespace fsdp::distributed {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;

#define SKIP_UNLESS_GPUS(n)                                                                \
  do {                                                                                     \
    if (CudaDeviceCount() < (n))                                                           \
      GTEST_SKIP() << "needs " << (n) << " CUDA device(s), " << CudaDeviceCount()          \
                   << " visible";                                                          \
  } while (0)

constexpr DType kAllDTypes[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16,
                                DType::kBFloat16, DType::kInt64};

std::vector<ReduceOptions> AllReduceOps(int rank) {
  // Power-of-two PREMUL factors keep every product exact; ranks use different ones.
  return {Sum(), Avg(), Min(), Max(), PremulSum(rank == 0 ? 0.5 : 2.0)};
}

std::string OpName(const ReduceOptions& o) { return ReduceOpName(o.op); }

// Rank `rank`'s input of `n` elements: values in {-1, 0, 1}.
std::vector<double> Pattern(int rank, int64_t n) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    v[static_cast<size_t>(i)] = static_cast<double>((i + 2 * static_cast<int64_t>(rank)) % 3 - 1);
  }
  return v;
}

Tensor Make(const std::vector<double>& values, DType dtype, Device device) {
  return Tensor::from_doubles(values, {static_cast<int64_t>(values.size())}, dtype, device);
}

// The reduction of `per_rank` inputs in rank order (the threaded fake's numerics contract).
std::vector<double> Reference(DType dtype, const ReduceOptions& op,
                              const std::vector<std::vector<double>>& per_rank,
                              const std::vector<double>& factors) {
  std::vector<Tensor> host;
  std::vector<const void*> ptrs;
  host.reserve(per_rank.size());
  for (const auto& v : per_rank) {
    host.push_back(Make(v, dtype, Device::CPU()));
    ptrs.push_back(host.back().data_ptr());
  }
  Tensor out = Tensor::empty({static_cast<int64_t>(per_rank.front().size())}, dtype);
  ReduceInRankOrder(dtype, op.op, ptrs, factors, out.data_ptr(), per_rank.front().size());
  return out.to_doubles();
}

std::vector<double> Slice(const std::vector<double>& v, size_t begin, size_t n) {
  return {v.begin() + static_cast<std::ptrdiff_t>(begin),
          v.begin() + static_cast<std::ptrdiff_t>(begin + n)};
}

// ---- World of one ---------------------------------------------------------------------------

TEST(NcclProcessGroupWorld1, EveryCollectiveDTypeAndReduceOp) {
  SKIP_UNLESS_GPUS(1);
  const Device dev = Device::CUDA(0);
  RankContext context(0, 1, dev);
  RankContextGuard guard(context);
  auto pg = NcclProcessGroup::Create(std::make_shared<HashStore>(), 0, 1, dev,
                                     {.timeout = std::chrono::seconds(60)});
  EXPECT_EQ(pg->backend_name(), "nccl");
  EXPECT_EQ(pg->group_name(), "0");
  const int64_t n = 7;
  const std::vector<double> in = Pattern(0, n);
  for (DType dtype : kAllDTypes) {
    SCOPED_TRACE(DTypeName(dtype));
    for (const ReduceOptions& op : AllReduceOps(0)) {
      if (!ReduceOpSupports(op.op, dtype)) continue;
      SCOPED_TRACE(OpName(op));
      const std::vector<double> expected = Reference(dtype, op, {in}, {op.premul_factor});
      for (bool async_op : {false, true}) {
        Tensor t = Make(in, dtype, dev);
        auto work = pg->all_reduce(t, op, async_op);
        work->wait();
        EXPECT_TRUE(work->is_success());
        EXPECT_EQ(t.to_doubles(), expected) << "all_reduce async_op=" << async_op;

        Tensor rs_in = Make(in, dtype, dev);
        Tensor rs_out = Tensor::zeros({n}, dtype, dev);
        pg->reduce_scatter_tensor(rs_out, rs_in, op, async_op)->wait();
        EXPECT_EQ(rs_out.to_doubles(), expected) << "reduce_scatter async_op=" << async_op;
      }
      Tensor whole = Make(in, dtype, dev);  // in place: the output is the input's chunk 0
      pg->reduce_scatter_tensor(whole, whole, op);
      EXPECT_EQ(whole.to_doubles(), expected) << "reduce_scatter in place";
    }
    Tensor ag_in = Make(in, dtype, dev);
    Tensor ag_out = Tensor::zeros({n}, dtype, dev);
    pg->all_gather_into_tensor(ag_out, ag_in);
    EXPECT_EQ(ag_out.to_doubles(), ag_in.to_doubles());

    Tensor b = Make(in, dtype, dev);
    pg->broadcast(b, 0);
    EXPECT_EQ(b.to_doubles(), ag_in.to_doubles());

    std::vector<Tensor> outs = {Tensor::zeros({n}, dtype, dev)};
    pg->all_gather(outs, ag_in, /*async_op=*/true)->wait();
    EXPECT_EQ(outs[0].to_doubles(), ag_in.to_doubles());
  }
  pg->barrier();
  // Empty payloads never reach NCCL.
  Tensor empty = Tensor::zeros({0}, DType::kFloat32, dev);
  EXPECT_TRUE(pg->all_reduce(empty)->is_success());
  EXPECT_FALSE(pg->is_aborted());
}

TEST(NcclProcessGroupWorld1, TensorsOnAnotherDeviceAreRejectedNamingTheDevice) {
  SKIP_UNLESS_GPUS(1);
  const Device dev = Device::CUDA(0);
  RankContext context(0, 1, dev);
  RankContextGuard guard(context);
  auto pg = NcclProcessGroup::Create(std::make_shared<HashStore>(), 0, 1, dev);
  Tensor cpu = Tensor::ones({4});
  try {
    pg->all_reduce(cpu);
    FAIL() << "expected InvalidArgument";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_THAT(e.message(), HasSubstr("allreduce_ #1 on group 0"));
    EXPECT_THAT(e.message(), HasSubstr("is on cpu"));
    EXPECT_THAT(e.message(), HasSubstr("needs CUDA tensors on this rank's device cuda:0"));
  }
  if (CudaDeviceCount() >= 2) {
    Tensor other = Tensor::ones({4}, DType::kFloat32, Device::CUDA(1));
    try {
      pg->broadcast(other, 0);
      FAIL() << "expected InvalidArgument";
    } catch (const Error& e) {
      EXPECT_THAT(e.message(), HasSubstr("is on cuda:1"));
    }
  }
  Tensor ok = Tensor::ones({4}, DType::kFloat32, dev);
  pg->all_reduce(ok);  // the group is still usable after argument errors
  EXPECT_EQ(ok.to_doubles(), std::vector<double>(4, 1.0));
}

// ---- Two ranks, one device each ---------------------------------------------------------------

// Runs fn(rank, group) on two threads, each with its own RankContext and device; returns each
// rank's error ("" when it succeeded). The group is destroyed on its rank's thread.
template <typename Fn>
std::vector<std::string> RunTwoRanks(const NcclOptions& options, Fn fn) {
  auto store = std::make_shared<HashStore>();
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  threads.reserve(2);
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      RankContext context(r, 2, Device::CUDA(r));
      RankContextGuard guard(context);
      try {
        auto pg = NcclProcessGroup::Create(store, r, 2, Device::CUDA(r), options);
        fn(r, *pg);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

TEST(NcclProcessGroupTwoRanks, CollectivesMatchTheRankOrderReference) {
  SKIP_UNLESS_GPUS(2);
  const int64_t n = 5;
  const auto errors = RunTwoRanks({.timeout = std::chrono::seconds(60)}, [&](int rank,
                                                                           ProcessGroup& pg) {
    const Device dev = Device::CUDA(rank);
    const std::vector<std::vector<double>> inputs = {Pattern(0, 2 * n), Pattern(1, 2 * n)};
    for (DType dtype : kAllDTypes) {
      SCOPED_TRACE(DTypeName(dtype));
      // all_gather_into_tensor, out of place and in place.
      Tensor in = Make(Slice(inputs[rank], 0, n), dtype, dev);
      Tensor out = Tensor::zeros({2 * n}, dtype, dev);
      pg.all_gather_into_tensor(out, in);
      std::vector<double> gathered = Slice(inputs[0], 0, n);
      const auto second = Slice(inputs[1], 0, n);
      gathered.insert(gathered.end(), second.begin(), second.end());
      EXPECT_EQ(out.to_doubles(), Make(gathered, dtype, Device::CPU()).to_doubles());
      Tensor whole = Tensor::zeros({2 * n}, dtype, dev);
      whole.narrow(0, rank * n, n).copy_(in);
      pg.all_gather_into_tensor(whole, whole.narrow(0, rank * n, n));
      EXPECT_EQ(whole.to_doubles(), out.to_doubles());

      for (const ReduceOptions& op : AllReduceOps(rank)) {
        if (!ReduceOpSupports(op.op, dtype)) continue;
        SCOPED_TRACE(OpName(op));
        const std::vector<double> factors = {AllReduceOps(0).back().premul_factor,
                                             AllReduceOps(1).back().premul_factor};
        const std::vector<double> reduced = Reference(dtype, op, inputs, factors);
        Tensor t = Make(inputs[rank], dtype, dev);
        pg.all_reduce(t, op);
        EXPECT_EQ(t.to_doubles(), reduced) << "all_reduce";

        Tensor rs_in = Make(inputs[rank], dtype, dev);
        Tensor rs_out = Tensor::zeros({n}, dtype, dev);
        pg.reduce_scatter_tensor(rs_out, rs_in, op, /*async_op=*/true)->wait();
        EXPECT_EQ(rs_out.to_doubles(), Slice(reduced, static_cast<size_t>(rank * n), n))
            << "reduce_scatter";
      }
      Tensor b = Make(inputs[rank], dtype, dev);
      pg.broadcast(b, /*root=*/1);
      EXPECT_EQ(b.to_doubles(), Make(inputs[1], dtype, Device::CPU()).to_doubles());

      // Uneven all_gather (a broadcast per rank): rank r contributes r + 2 elements.
      std::vector<Tensor> outs = {Tensor::zeros({2}, dtype, dev), Tensor::zeros({3}, dtype, dev)};
      pg.all_gather(outs, Make(Slice(inputs[rank], 0, 2 + rank), dtype, dev));
      for (int r = 0; r < 2; ++r) {
        EXPECT_EQ(outs[r].to_doubles(),
                  Make(Slice(inputs[r], 0, 2 + r), dtype, Device::CPU()).to_doubles());
      }
    }
    pg.barrier();
  });
  EXPECT_EQ(errors, std::vector<std::string>(2, ""));
}

TEST(NcclProcessGroupTwoRanks, SubgroupsAreSplitsNamedInCreationOrder) {
  SKIP_UNLESS_GPUS(2);
  const auto errors = RunTwoRanks({.timeout = std::chrono::seconds(60)}, [](int rank,
                                                                          ProcessGroup& pg) {
    const Device dev = Device::CUDA(rank);
    auto only_one = pg.new_group({1});  // rank 0 passes NCCL_SPLIT_NOCOLOR
    if (rank == 0) {
      EXPECT_EQ(only_one, nullptr);
    } else {
      ASSERT_NE(only_one, nullptr);
      EXPECT_EQ(only_one->group_name(), "1");
      EXPECT_EQ(only_one->size(), 1);
      EXPECT_EQ(only_one->global_ranks(), std::vector<int>({1}));
      Tensor t = Tensor::full({3}, 2.0, DType::kFloat32, dev);
      only_one->all_reduce(t);
      EXPECT_EQ(t.to_doubles(), std::vector<double>(3, 2.0));
    }
    auto both = pg.new_group({1, 0});
    ASSERT_NE(both, nullptr);
    EXPECT_EQ(both->group_name(), "2");
    EXPECT_EQ(both->rank(), rank);
    Tensor t = Tensor::full({4}, rank + 1.0, DType::kFloat32, dev);
    both->all_reduce(t);
    EXPECT_EQ(t.to_doubles(), std::vector<double>(4, 3.0));
    auto nested = both->new_group({0});
    EXPECT_EQ(nested != nullptr, rank == 0);
    if (nested) EXPECT_EQ(nested->group_name(), "2.1");
    // The parent still works after its splits.
    Tensor u = Tensor::full({2}, 1.0, DType::kBFloat16, dev);
    pg.all_reduce(u);
    EXPECT_EQ(u.to_doubles(), std::vector<double>(2, 2.0));
  });
  EXPECT_EQ(errors, std::vector<std::string>(2, ""));
}

TEST(NcclProcessGroupTwoRanks, AsyncWorkOrdersTheCallersStream) {
  SKIP_UNLESS_GPUS(2);
  const auto errors = RunTwoRanks({.timeout = std::chrono::seconds(60)}, [](int rank,
                                                                          ProcessGroup& pg) {
    const Device dev = Device::CUDA(rank);
    CudaStream user(dev);
    CudaStreamGuard on_user(user.ref());
    Tensor t = Tensor::full({1 << 16}, rank + 1.0, DType::kFloat32, dev);
    auto work = pg.all_reduce(t, Sum(), /*async_op=*/true);
    work->wait();  // the user stream now waits for the all-reduce; the host waited too
    EXPECT_TRUE(work->is_completed());
    EXPECT_TRUE(work->is_success());
    EXPECT_EQ(t.to_doubles(), std::vector<double>(1 << 16, 3.0));
  });
  EXPECT_EQ(errors, std::vector<std::string>(2, ""));
}

TEST(NcclProcessGroupTwoRanks, AMissingRankIsADeadlineAbortNamingTheCollective) {
  SKIP_UNLESS_GPUS(2);
  const milliseconds timeout(1500);
  std::promise<void> rank0_done;
  std::shared_future<void> rank0_done_future = rank0_done.get_future().share();
  const auto errors = RunTwoRanks({.timeout = timeout}, [&](int rank, ProcessGroup& pg) {
    auto& nccl = dynamic_cast<NcclProcessGroup&>(pg);
    const Device dev = Device::CUDA(rank);
    Tensor t = Tensor::ones({8}, DType::kFloat32, dev);
    pg.all_reduce(t);  // both ranks: connections are up
    EXPECT_EQ(t.to_doubles(), std::vector<double>(8, 2.0));
    if (rank == 1) {  // never issues allreduce_ #2; stays alive until rank 0 has checked
      EXPECT_EQ(rank0_done_future.wait_for(std::chrono::seconds(120)), std::future_status::ready);
      return;
    }
    struct SignalOnExit {
      std::promise<void>& done;
      ~SignalOnExit() { done.set_value(); }
    } signal{rank0_done};
    const auto start = std::chrono::steady_clock::now();
    try {
      pg.all_reduce(t, Sum(), /*async_op=*/true)->wait();
      ADD_FAILURE() << "expected DeadlineExceeded";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kDeadlineExceeded) << e.what();
      EXPECT_THAT(e.message(), HasSubstr("allreduce_ #2 on group 0"));
      EXPECT_THAT(e.message(), HasSubstr("ncclCommAbort"));
    }
    const auto elapsed = std::chrono::steady_clock::now() - start;
    EXPECT_GE(elapsed, timeout - milliseconds(50));
    EXPECT_LT(elapsed, timeout + std::chrono::seconds(10));
    EXPECT_TRUE(nccl.is_aborted());
    try {
      pg.all_reduce(t);
      ADD_FAILURE() << "expected FailedPrecondition";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kFailedPrecondition);
      EXPECT_THAT(e.message(), HasSubstr("aborted"));
    }
  });
  EXPECT_EQ(errors, std::vector<std::string>(2, ""));
}

}  // namespace
}  // namespace fsdp::distributed
