// KeepFreedMemoryInProcess: with glibc, a freed 1 MiB block stays in the process (it is not
// mmap-ed on its own, so freeing it cannot unmap it) and is handed out again.
#include "fakes/rank_thread_memory.h"

#include <gtest/gtest.h>

#include <cstdlib>  // defines __GLIBC__ with glibc
#include <cstring>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace fsdp::fakes {
namespace {

#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define FSDP_SANITIZER_MALLOC 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define FSDP_SANITIZER_MALLOC 1
#endif

#if defined(__GLIBC__)
TEST(RankThreadMemory, AFreedLargeBlockStaysInTheProcess) {
#if defined(FSDP_SANITIZER_MALLOC)
  GTEST_SKIP() << "a sanitizer's allocator replaces glibc's malloc and its mallopt";
#endif
  ASSERT_TRUE(KeepFreedMemoryInProcess());
  const size_t mmapped_before = mallinfo2().hblks;
  constexpr size_t kBytes = 1 << 20;  // above glibc's default 128 KiB mmap threshold
  void* block = std::malloc(kBytes);
  ASSERT_NE(block, nullptr);
  std::memset(block, 1, kBytes);
  EXPECT_EQ(mallinfo2().hblks, mmapped_before) << "the 1 MiB block was mmap-ed on its own";
  std::free(block);
  void* again = std::malloc(kBytes);
  EXPECT_EQ(again, block) << "the freed block was not reused";
  std::free(again);
}
#else
TEST(RankThreadMemory, DoesNothingWithoutGlibc) { EXPECT_FALSE(KeepFreedMemoryInProcess()); }
#endif

}  // namespace
}  // namespace fsdp::fakes
