// Heap settings for a process that runs many ranks as threads (the threaded fake).
//
// glibc gives threads their own malloc arenas and, by default, hands memory back to the kernel
// as soon as a large block is freed: blocks of 128 KiB and more are mmap-ed and unmapped one by
// one, and an arena's free top is trimmed. A threaded world of 128 ranks allocates and frees
// the same parameter-sized buffers at every collective, so the kernel faults in and zero-fills
// the same pages again each time (measured on fully_shard_comm/all_gather_fp32 at world 128:
// 245k page faults, half of them such re-faults). KeepFreedMemoryInProcess() raises glibc's
// mmap and trim thresholds (mallopt) so that freed blocks stay in the process for reuse, as
// PyTorch's caching allocators keep device memory. The process's resident size then stays at
// its peak; nothing else changes.
//
// Call it once, early, from a program's main (fsdp-conform, fsdp-bench, pg-bench); a library
// never calls it. Thread-safety: call before starting threads. Without glibc it does nothing.
#pragma once

namespace fsdp::fakes {

// Returns whether the settings were applied (false without glibc or if mallopt refused).
bool KeepFreedMemoryInProcess();

}  // namespace fsdp::fakes
