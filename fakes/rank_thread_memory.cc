#include "fakes/rank_thread_memory.h"

#include <cstdlib>  // defines __GLIBC__ with glibc

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace fsdp::fakes {

bool KeepFreedMemoryInProcess() {
#if defined(__GLIBC__)
  // 32 MiB: the largest mmap threshold glibc accepts on 64-bit (half its 64 MiB arena heaps);
  // setting it also stops glibc's dynamic threshold from dropping back after a large free.
  constexpr int kMmapThreshold = 32 << 20;
  // Trim an arena only once 1 GiB at its top is free.
  constexpr int kTrimThreshold = 1 << 30;
  return mallopt(M_MMAP_THRESHOLD, kMmapThreshold) == 1 &&
         mallopt(M_TRIM_THRESHOLD, kTrimThreshold) == 1;
#else
  return false;
#endif
}

}  // namespace fsdp::fakes
