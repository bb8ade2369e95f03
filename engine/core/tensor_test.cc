#include "engine/core/tensor.h"

#include <cmath>

#include <gtest/gtest.h>

#include "engine/core/rank_context.h"
#include "engine/core/rng.h"
#include "engine/core/storage.h"
#include "engine/core/cuda_stream.h"
#include "engine/core/allocator.h"

namespace fsdp {
namespace {

TEST(CoreTensor, FactoriesAndItem) {
  Tensor t = Tensor::from_doubles({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(t.sizes(), (Shape{2, 3}));
  EXPECT_EQ(t.numel(), 6);
  EXPECT_EQ(t.dtype(), DType::kFloat32);
  EXPECT_EQ(t.data<float>()[4], 5.0f);
  EXPECT_EQ(Tensor::full({1}, 2.5).item(), 2.5);
  EXPECT_EQ(Tensor::zeros({3}, DType::kFloat64).to_doubles(), (std::vector<double>{0, 0, 0}));
  EXPECT_EQ(Tensor::arange(4).to_int64s(), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_THROW(t.data<double>(), Error);
  EXPECT_THROW(t.item(), Error);
}

TEST(CoreTensor, ViewsShareStorage) {
  Tensor t = Tensor::from_doubles({0, 1, 2, 3, 4, 5, 6, 7}, {4, 2});
  Tensor rows = t.narrow(0, 1, 2);
  EXPECT_EQ(rows.to_doubles(), (std::vector<double>{2, 3, 4, 5}));
  rows.fill_(9);
  EXPECT_EQ(t.to_doubles(), (std::vector<double>{0, 1, 9, 9, 9, 9, 6, 7}));
  EXPECT_EQ(t.view({2, -1}).sizes(), (Shape{2, 4}));
  EXPECT_EQ(t.flatten().sizes(), (Shape{8}));
  EXPECT_EQ(t.select(3).to_doubles(), (std::vector<double>{6, 7}));
  EXPECT_EQ(t.unsqueeze(0).sizes(), (Shape{1, 4, 2}));
  EXPECT_EQ(t.unsqueeze(0).squeeze(0).sizes(), (Shape{4, 2}));
  EXPECT_THROW(t.view({3, 3}), Error);
  EXPECT_THROW(t.narrow(1, 0, 1), Error);  // not contiguous
  EXPECT_THROW(t.narrow(0, 3, 2), Error);
}

TEST(CoreTensor, ChunkFollowsTorchChunk) {
  // 6 rows in 4 chunks: torch.chunk gives 3 pieces of 2 (FSDP pads the 4th as empty).
  Tensor t = Tensor::zeros({6, 3});
  auto chunks = t.chunk(4);
  ASSERT_EQ(chunks.size(), 3u);
  for (auto& c : chunks) EXPECT_EQ(c.size(0), 2);
  // 5 rows in 2 chunks: 3 and 2.
  auto c2 = Tensor::zeros({5}).chunk(2);
  ASSERT_EQ(c2.size(), 2u);
  EXPECT_EQ(c2[0].size(0), 3);
  EXPECT_EQ(c2[1].size(0), 2);
  EXPECT_EQ(Tensor::zeros({0, 4}).chunk(3).size(), 3u);
  auto s = Tensor::zeros({7}).split_with_sizes({3, 0, 4});
  EXPECT_EQ(s[1].numel(), 0);
  EXPECT_THROW(Tensor::zeros({7}).split_with_sizes({3, 3}), Error);
}

TEST(CoreTensor, StorageResizeKeepsViewsValid) {
  Tensor full = Tensor::zeros({4, 2});
  Tensor view = full.narrow(0, 2, 2);
  auto storage = full.storage();
  storage->Resize(0);
  EXPECT_FALSE(view.has_storage());
  try {
    view.data_ptr();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kFailedPrecondition);
    EXPECT_NE(std::string(e.what()).find("no allocated storage"), std::string::npos);
  }
  storage->Resize(8 * sizeof(float));
  EXPECT_TRUE(view.has_storage());
  full.copy_(Tensor::from_doubles({1, 2, 3, 4, 5, 6, 7, 8}, {4, 2}));
  EXPECT_EQ(view.to_doubles(), (std::vector<double>{5, 6, 7, 8}));
}

// `empty` and a default Resize zero-fill (every time, also over memory freed dirty); an
// uninitialised allocation is filled with 0xFF bytes exactly when FSDP_FILL_UNINITIALIZED_MEMORY=1
// (ctest runs this test both ways: engine/CMakeLists.txt).
TEST(CoreTensor, ZeroedAndUninitializedAllocations) {
  for (int round = 0; round < 3; ++round) {
    Tensor dirty = Tensor::full({1024}, 7.0, DType::kFloat64);
    dirty = Tensor();  // freed with non-zero contents
    EXPECT_EQ(Tensor::empty({1024}, DType::kFloat64).to_doubles(), std::vector<double>(1024, 0.0));
    Tensor resized = Tensor::full({16}, 3.0);
    resized.storage()->Resize(0);
    resized.storage()->Resize(16 * sizeof(float));
    EXPECT_EQ(resized.to_doubles(), std::vector<double>(16, 0.0));
  }
  const Tensor u = Tensor::empty_uninitialized({5, 3}, DType::kInt64);
  EXPECT_EQ(u.sizes(), (Shape{5, 3}));
  EXPECT_EQ(u.dtype(), DType::kInt64);
  Tensor r = Tensor::zeros({4});
  r.storage()->Resize(0);
  r.storage()->Resize(4 * sizeof(float), AllocInit::kUninitialized);
  if (FillUninitializedMemory()) {
    EXPECT_EQ(u.to_int64s(), std::vector<int64_t>(15, -1));
    for (double v : r.to_doubles()) EXPECT_TRUE(std::isnan(v));
    for (double v : Tensor::empty_uninitialized({3}, DType::kBFloat16).to_doubles()) {
      EXPECT_TRUE(std::isnan(v));
    }
  }
  // Copies overwrite their uninitialised outputs.
  const Tensor src = Tensor::from_doubles({1, 2, 3}, {3});
  EXPECT_EQ(src.clone().to_doubles(), (std::vector<double>{1, 2, 3}));
  EXPECT_EQ(src.to(DType::kFloat64).to_doubles(), (std::vector<double>{1, 2, 3}));
}

TEST(CoreTensor, AllocatorCountsCurrentAndPeakPerRank) {
  RankContext ctx(3, 4);
  RankContextGuard guard(ctx);
  MemoryStats& stats = ctx.memory_stats(Device::CPU());
  EXPECT_EQ(stats.current_bytes(), 0);
  {
    Tensor a = Tensor::zeros({100});  // 400 bytes
    Tensor b = Tensor::zeros({50}, DType::kFloat64);  // 400 bytes
    EXPECT_EQ(stats.current_bytes(), 800);
    a.storage()->Resize(0);
    EXPECT_EQ(stats.current_bytes(), 400);
  }
  EXPECT_EQ(stats.current_bytes(), 0);
  EXPECT_EQ(stats.peak_bytes(), 800);
  stats.ResetPeak();
  EXPECT_EQ(stats.peak_bytes(), 0);
}

TEST(CoreTensor, CastsAndCopies) {
  Tensor t = Tensor::from_doubles({1.0, 1.0 + 1.0 / 2048, -3.5}, {3});
  Tensor h = t.to(DType::kFloat16);
  EXPECT_EQ(h.dtype(), DType::kFloat16);
  EXPECT_EQ(h.to_doubles(), (std::vector<double>{1.0, 1.0, -3.5}));
  Tensor c = t.clone();
  c.fill_(0);
  EXPECT_EQ(t.to_doubles()[2], -3.5);
  EXPECT_THROW(c.copy_(Tensor::zeros({4})), Error);
  EXPECT_TRUE(t.to(DType::kFloat32).is_same(t));
}

TEST(CoreTensor, CudaIsUnavailableWithoutDevice) {
  if (CudaDeviceCount() > 0) GTEST_SKIP() << "a CUDA device is visible; this checks the CPU-only error";
  try {
    Tensor::zeros({2}, DType::kFloat32, Device::CUDA(0));
    FAIL() << "expected Unavailable";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnavailable);
  }
}

// Dtype-changing copies of CUDA tensors run the cast kernel on the device (engine/core/
// cuda_convert.h) and give the CPU conversion's values bit for bit, for every dtype pair.
TEST(CoreTensorGpu, DtypeCopiesOnDeviceMatchCpu) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
  const std::vector<DType> dtypes = {DType::kFloat32, DType::kFloat64, DType::kFloat16,
                                     DType::kBFloat16, DType::kInt64};
  std::vector<double> values;
  for (int i = -50; i < 50; ++i) values.push_back(i * 0.37 + (i % 7) * 1e-3);
  values.push_back(65504.0);
  values.push_back(1e-8);
  for (DType from : dtypes) {
    const Tensor cpu = Tensor::from_doubles(values, {static_cast<int64_t>(values.size())}, from);
    const Tensor cuda = cpu.to(Device::CUDA(0));
    for (DType to : dtypes) {
      const Tensor on_device = cuda.to(to);
      EXPECT_EQ(on_device.device(), Device::CUDA(0));
      EXPECT_EQ(on_device.to_doubles(), cpu.to(to).to_doubles())
          << DTypeName(from) << " -> " << DTypeName(to);
      Tensor into = Tensor::zeros(cpu.sizes(), to, Device::CUDA(0));
      into.copy_(cuda);
      EXPECT_EQ(into.to_doubles(), cpu.to(to).to_doubles());
    }
  }
}

TEST(CoreTensor, PinMemoryNeedsACpuTensorAndADevice) {
  EXPECT_THROW(Storage(16, Device::CUDA(0), /*pinned=*/true), Error);  // only CPU memory
  const Tensor t = Tensor::from_doubles({1, 2, 3}, {3});
  EXPECT_FALSE(t.is_pinned());
  Tensor copy = Tensor::zeros({3});
  copy.copy_(t, /*non_blocking=*/true);  // CPU to CPU: non_blocking has no effect
  EXPECT_EQ(copy.to_doubles(), t.to_doubles());
  if (CudaDeviceCount() > 0) GTEST_SKIP() << "a CUDA device is visible; this checks the CPU-only error";
  try {
    (void)t.pin_memory();
    FAIL() << "expected Unavailable";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnavailable);
    EXPECT_NE(std::string(e.what()).find("none is available"), std::string::npos) << e.what();
  }
}

// Pinned host memory and non-blocking copies both ways; values are read after the current
// stream finished, as a user waits on an event.
TEST(CoreTensorGpu, PinnedNonBlockingCopiesRoundTrip) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
  const Device cuda = Device::CUDA(0);
  const Tensor host = Tensor::arange(4096).to(DType::kFloat32);
  const Tensor pinned = host.pin_memory();
  EXPECT_TRUE(pinned.is_pinned());
  EXPECT_TRUE(pinned.pin_memory().is_same(pinned));
  EXPECT_EQ(pinned.to_doubles(), host.to_doubles());
  const Tensor on_device = pinned.to(cuda, /*non_blocking=*/true);
  const Tensor back = on_device.to(Device::CPU(), /*non_blocking=*/true);
  EXPECT_TRUE(back.is_pinned());  // a non-blocking device-to-host copy lands in pinned memory
  CurrentCudaStream(cuda).Synchronize();
  EXPECT_EQ(back.to_doubles(), host.to_doubles());
  EXPECT_FALSE(on_device.to(Device::CPU()).is_pinned());
}

TEST(CoreRng, PhiloxIsDeterministicAndCounterBased) {
  Generator a(42), b(42);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(a.next_u32(), b.next_u32());
  Generator c(43);
  EXPECT_NE(Generator(42).next_u64(), c.next_u64());
  // Known-answer test from the Philox4x32-10 reference (Random123 kat_vectors): key 0, ctr 0.
  auto zero = Generator::Philox(0, 0, 0);
  EXPECT_EQ(zero[0], 0x6627e8d5u);
  EXPECT_EQ(zero[1], 0xe169c58du);
  EXPECT_EQ(zero[2], 0xbc57ac4cu);
  EXPECT_EQ(zero[3], 0x9b00dbd8u);
  Generator g(7);
  double sum = 0, sq = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    const double x = g.normal();
    sum += x;
    sq += x * x;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.03);
  EXPECT_NEAR(sq / n, 1.0, 0.05);
}

TEST(CoreRng, ManualSeedDropsBufferedWords) {
  Generator g(5);
  g.next_u32();  // leaves three buffered words
  g.manual_seed(9);
  Generator fresh(9);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(g.next_u32(), fresh.next_u32());
}

TEST(CoreRng, RandomFactoriesUseTheRankGenerator) {
  RankContext ctx(0, 1, Device::CPU(), 123);
  RankContextGuard guard(ctx);
  Tensor a = Tensor::randn({4});
  ctx.generator().manual_seed(123);
  Tensor b = Tensor::randn({4});
  EXPECT_EQ(a.to_doubles(), b.to_doubles());
  Tensor r = Tensor::randint(0, 8, {100});
  for (int64_t v : r.to_int64s()) {
    EXPECT_GE(v, 0);
    EXPECT_LT(v, 8);
  }
}

}  // namespace
}  // namespace fsdp
