// The host's memcpy bandwidth, the yardstick pg-bench divides its bus bandwidths by: the best
// of `repeats` std::memcpy calls of a `bytes`-sized buffer into another (both touched first),
// as bytes copied per second. With `threads` > 1 the buffer is split into `threads` contiguous
// slices copied concurrently, one thread each (the machine's all-core memcpy limit, the
// yardstick of the threaded backend, whose ranks share one process). Run it while the machine
// is otherwise quiet.
// Thread-safety: stateless; allocates its own buffers.
#pragma once

#include <cstddef>

namespace fsdp::bench {

struct MemcpyBandwidth {
  double gbps = 0;          // bytes / best time, in GB/s (1e9 B/s)
  double best_seconds = 0;  // the fastest copy
  size_t bytes = 0;         // buffer size copied per repeat
  int repeats = 0;
  int threads = 1;          // threads copying concurrently
};

// Default: a 64 MiB buffer, best of 5, one thread. Throws InvalidArgument for bytes == 0,
// repeats < 1 or threads < 1.
MemcpyBandwidth MeasureMemcpyBandwidth(size_t bytes = size_t{64} << 20, int repeats = 5,
                                       int threads = 1);

}  // namespace fsdp::bench
