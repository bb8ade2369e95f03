#include "engine/core/caching_allocator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/core/allocator.h"
#include "engine/core/cuda_stream.h"
#include "engine/core/error.h"
#include "engine/core/tensor.h"

namespace fsdp {
namespace {

using ::testing::HasSubstr;

// Host memory standing in for a device: a capacity, and a log of what the cache did to it.
// Thread-safety: used under the allocator's mutex only.
class FakeDeviceMemory final : public RawDeviceMemory {
 public:
  struct Log {
    int64_t in_use = 0;
    int mallocs = 0;
    int frees = 0;
    int syncs = 0;
    int frees_before_first_sync = 0;
  };
  FakeDeviceMemory(int64_t capacity, Log* log) : capacity_(capacity), log_(log) {}
  void* Malloc(size_t nbytes) override {
    if (log_->in_use + static_cast<int64_t>(nbytes) > capacity_) return nullptr;
    log_->in_use += static_cast<int64_t>(nbytes);
    ++log_->mallocs;
    void* p = ::operator new(nbytes);
    sizes_[p] = nbytes;
    return p;
  }
  void Free(void* ptr) override {
    if (log_->syncs == 0) ++log_->frees_before_first_sync;
    log_->in_use -= static_cast<int64_t>(sizes_.at(ptr));
    sizes_.erase(ptr);
    ++log_->frees;
    ::operator delete(ptr);
  }
  void Synchronize() override { ++log_->syncs; }
  std::string DeviceName() const override { return "cuda:7"; }

 private:
  int64_t capacity_;
  Log* log_;
  std::unordered_map<void*, size_t> sizes_;
};

// Two distinct addresses standing for two streams.
int stream_a_tag = 0;
int stream_b_tag = 0;
const CachingAllocator::StreamKey A = &stream_a_tag;
const CachingAllocator::StreamKey B = &stream_b_tag;

std::unique_ptr<CachingAllocator> MakeCache(FakeDeviceMemory::Log* log,
                                            int64_t capacity = int64_t{1} << 30) {
  return std::make_unique<CachingAllocator>(std::make_unique<FakeDeviceMemory>(capacity, log));
}

TEST(CoreCachingAllocator, RoundsToBlocksOf512Bytes) {
  EXPECT_EQ(CachingAllocator::RoundSize(1), 512u);
  EXPECT_EQ(CachingAllocator::RoundSize(512), 512u);
  EXPECT_EQ(CachingAllocator::RoundSize(513), 1024u);
  FakeDeviceMemory::Log log;
  auto cache = MakeCache(&log);
  void* p = cache->Allocate(700, A);
  EXPECT_EQ(log.in_use, 1024);
  EXPECT_EQ(cache->stats().allocated_bytes, 1024);
  cache->Free(p);
  EXPECT_THROW(cache->Allocate(0, A), Error);
}

TEST(CoreCachingAllocator, FreedBlockIsReusedOnItsStreamWithoutSynchronising) {
  FakeDeviceMemory::Log log;
  auto cache = MakeCache(&log);
  void* p = cache->Allocate(4000, A);
  cache->Free(p);
  EXPECT_EQ(cache->Allocate(3900, A), p);  // same rounded size class, same stream
  const CachingAllocatorStats s = cache->stats();
  EXPECT_EQ(s.num_raw_allocs, 1);
  EXPECT_EQ(s.num_cache_hits, 1);
  EXPECT_EQ(log.syncs, 0);
  EXPECT_EQ(log.frees, 0);
}

TEST(CoreCachingAllocator, BlocksAreNeverHandedToAnotherStream) {
  FakeDeviceMemory::Log log;
  auto cache = MakeCache(&log);
  void* on_a = cache->Allocate(4096, A);
  cache->Free(on_a);
  void* on_b = cache->Allocate(4096, B);
  EXPECT_NE(on_b, on_a);
  EXPECT_EQ(log.mallocs, 2);
  EXPECT_EQ(cache->stats().num_cached_blocks, 1);
  EXPECT_EQ(cache->Allocate(4096, A), on_a);  // still cached for A
}

TEST(CoreCachingAllocator, BestFitAndNoBlockTwiceTheRequest) {
  FakeDeviceMemory::Log log;
  auto cache = MakeCache(&log);
  void* small = cache->Allocate(1024, A);
  void* mid = cache->Allocate(4096, A);
  void* big = cache->Allocate(16384, A);
  cache->Free(big);
  cache->Free(mid);
  cache->Free(small);
  EXPECT_EQ(cache->Allocate(3000, A), mid);    // smallest that fits: 4096, not 16384
  EXPECT_EQ(cache->Allocate(1000, A), small);
  void* fresh = cache->Allocate(6000, A);      // 16384 >= 2 * 6144: too wasteful
  EXPECT_NE(fresh, big);
  EXPECT_EQ(log.mallocs, 4);
  EXPECT_EQ(cache->Allocate(9000, A), big);    // 16384 < 2 * 9216
}

TEST(CoreCachingAllocator, OutOfMemoryReleasesTheCacheAfterSynchronisingAndRetries) {
  FakeDeviceMemory::Log log;
  auto cache = MakeCache(&log, /*capacity=*/8192);
  void* a = cache->Allocate(4096, A);
  void* b = cache->Allocate(2048, B);
  cache->Free(a);
  cache->Free(b);
  // 8192 does not fit beside the 6144 cached bytes: the cache is released, then it fits.
  void* c = cache->Allocate(8192, A);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(log.syncs, 1);
  EXPECT_EQ(log.frees_before_first_sync, 0);
  const CachingAllocatorStats s = cache->stats();
  EXPECT_EQ(s.num_alloc_retries, 1);
  EXPECT_EQ(s.num_raw_frees, 2);
  EXPECT_EQ(s.reserved_bytes, 8192);
  EXPECT_EQ(s.num_cached_blocks, 0);
}

TEST(CoreCachingAllocator, OutOfMemoryAfterTheRetryNamesDeviceAndBytes) {
  FakeDeviceMemory::Log log;
  auto cache = MakeCache(&log, /*capacity=*/8192);
  void* live = cache->Allocate(4096, A);
  try {
    cache->Allocate(5000, A);
    FAIL() << "expected ResourceExhausted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kResourceExhausted);
    EXPECT_THAT(e.what(), HasSubstr("cuda:7 out of memory"));
    EXPECT_THAT(e.what(), HasSubstr("5120 bytes (5000 requested)"));
    EXPECT_THAT(e.what(), HasSubstr("4096 bytes allocated"));
  }
  // Nothing was lost: the live block is intact and can be freed and reused.
  cache->Free(live);
  EXPECT_EQ(cache->Allocate(4096, A), live);
}

TEST(CoreCachingAllocator, EmptyCacheReleasesOnlyFreeBlocks) {
  FakeDeviceMemory::Log log;
  auto cache = MakeCache(&log);
  void* keep = cache->Allocate(2048, A);
  cache->Free(cache->Allocate(1024, A));
  cache->Free(cache->Allocate(1024, B));
  EXPECT_EQ(cache->stats().reserved_bytes, 4096);
  cache->EmptyCache();
  EXPECT_EQ(log.syncs, 1);
  EXPECT_EQ(log.frees, 2);
  const CachingAllocatorStats s = cache->stats();
  EXPECT_EQ(s.reserved_bytes, 2048);
  EXPECT_EQ(s.allocated_bytes, 2048);
  EXPECT_EQ(s.num_live_blocks, 1);
  cache->Free(keep);
  cache.reset();  // the destructor returns the last block
  EXPECT_EQ(log.in_use, 0);
}

TEST(CoreCachingAllocator, PeaksAndReset) {
  FakeDeviceMemory::Log log;
  auto cache = MakeCache(&log);
  void* a = cache->Allocate(4096, A);
  void* b = cache->Allocate(4096, A);
  cache->Free(a);
  cache->Free(b);
  CachingAllocatorStats s = cache->stats();
  EXPECT_EQ(s.peak_allocated_bytes, 8192);
  EXPECT_EQ(s.allocated_bytes, 0);
  EXPECT_EQ(s.peak_reserved_bytes, 8192);
  cache->ResetPeakStats();
  s = cache->stats();
  EXPECT_EQ(s.peak_allocated_bytes, 0);
  EXPECT_EQ(s.peak_reserved_bytes, 8192);
}

TEST(CoreCachingAllocator, FreeOfAForeignOrFreedPointerIsAnError) {
  FakeDeviceMemory::Log log;
  auto cache = MakeCache(&log);
  void* p = cache->Allocate(512, A);
  cache->Free(p);
  try {
    cache->Free(p);
    FAIL() << "expected an error for a double free";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInternal);
    EXPECT_THAT(e.what(), HasSubstr("already freed"));
  }
  int foreign = 0;
  EXPECT_THROW(cache->Free(&foreign), Error);
  EXPECT_EQ(cache->stats().num_cached_blocks, 1);
}

TEST(CoreCachingAllocator, CachingOffReturnsEveryFreeToTheRawMemory) {
  // PYTORCH_NO_CUDA_MEMORY_CACHING=1: the same sizes, errors and statistics, no cache.
  FakeDeviceMemory::Log log;
  CachingAllocator cache(std::make_unique<FakeDeviceMemory>(int64_t{1} << 30, &log),
                         /*caching=*/false);
  void* p = cache.Allocate(700, A);
  EXPECT_EQ(log.in_use, 1024);
  cache.Free(p);
  EXPECT_EQ(log.in_use, 0);
  cache.Free(cache.Allocate(700, A));
  const CachingAllocatorStats s = cache.stats();
  EXPECT_EQ(s.num_raw_allocs, 2);
  EXPECT_EQ(s.num_raw_frees, 2);
  EXPECT_EQ(s.num_cache_hits, 0);
  EXPECT_EQ(s.reserved_bytes, 0);
  EXPECT_EQ(s.num_cached_blocks, 0);
  EXPECT_EQ(s.peak_reserved_bytes, 1024);
}

TEST(CoreCachingAllocator, ConcurrentRanksNeverShareALiveBlock) {
  FakeDeviceMemory::Log log;
  auto cache = MakeCache(&log);
  constexpr int kThreads = 4;
  constexpr int kRounds = 300;
  std::mutex mu;
  std::unordered_map<void*, int> owner;  // live block -> thread
  std::atomic<int> conflicts{0};
  std::vector<int> stream_ids(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // Threads 0/1 share one stream (the legacy default stream of two ranks on one GPU).
      const CachingAllocator::StreamKey stream = &stream_ids[t < 2 ? 0 : t];
      for (int i = 0; i < kRounds; ++i) {
        const size_t n = 512 * static_cast<size_t>(1 + (i * 7 + t) % 5);
        void* p = cache->Allocate(n, stream);
        {
          std::lock_guard<std::mutex> lock(mu);
          if (!owner.emplace(p, t).second) ++conflicts;
        }
        {
          std::lock_guard<std::mutex> lock(mu);
          owner.erase(p);
        }
        cache->Free(p);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(conflicts.load(), 0);
  const CachingAllocatorStats s = cache->stats();
  EXPECT_EQ(s.allocated_bytes, 0);
  EXPECT_EQ(s.num_live_blocks, 0);
  EXPECT_EQ(s.num_raw_allocs + s.num_cache_hits, kThreads * kRounds);
  EXPECT_LT(s.num_raw_allocs, kThreads * kRounds / 10);  // the cache serves nearly everything
}

// On a GPU: tensors on cuda:0 reuse their stream's blocks, and a side stream gets its own.
TEST(CoreCachingAllocatorGpu, TensorsReuseBlocksOfTheirStream) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
  const Device cuda = Device::CUDA(0);
  void* first = nullptr;
  {
    Tensor t = Tensor::zeros({1000}, DType::kFloat32, cuda);
    first = t.data_ptr();
  }
  const CachingAllocatorStats before = CudaCachingAllocatorStats(0);
  Tensor again = Tensor::zeros({1000}, DType::kFloat32, cuda);
  EXPECT_EQ(again.data_ptr(), first);
  EXPECT_EQ(again.to_doubles(), std::vector<double>(1000, 0.0));  // zero-filled on reuse
  EXPECT_EQ(CudaCachingAllocatorStats(0).num_cache_hits, before.num_cache_hits + 1);
  again = Tensor();
  CudaStream side(cuda);
  {
    CudaStreamGuard guard(side.ref());
    Tensor on_side = Tensor::zeros({1000}, DType::kFloat32, cuda);
    EXPECT_NE(on_side.data_ptr(), first);
  }
  CudaEmptyCache();
  EXPECT_EQ(CudaCachingAllocatorStats(0).num_cached_blocks, 0);
}

}  // namespace
}  // namespace fsdp
