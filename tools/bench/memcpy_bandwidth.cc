#include "tools/bench/memcpy_bandwidth.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

#include "engine/core/error.h"

namespace fsdp::bench {

MemcpyBandwidth MeasureMemcpyBandwidth(size_t bytes, int repeats, int threads) {
  FSDP_CHECK(bytes > 0, "MeasureMemcpyBandwidth: bytes must be > 0");
  FSDP_CHECK(repeats >= 1, "MeasureMemcpyBandwidth: repeats must be >= 1, got ", repeats);
  FSDP_CHECK(threads >= 1, "MeasureMemcpyBandwidth: threads must be >= 1, got ", threads);
  const size_t slice = (bytes + static_cast<size_t>(threads) - 1) / static_cast<size_t>(threads);
  auto copy_slice = [&](unsigned char* dst, const unsigned char* src, size_t t) {
    const size_t begin = std::min(bytes, t * slice);
    const size_t end = std::min(bytes, begin + slice);
    if (end > begin) std::memcpy(dst + begin, src + begin, end - begin);
  };
  std::vector<unsigned char> src(bytes), dst(bytes);
  for (size_t i = 0; i < bytes; ++i) src[i] = static_cast<unsigned char>(i * 131u);
  std::memset(dst.data(), 0, bytes);  // fault the pages in before timing
  double best = std::numeric_limits<double>::infinity();
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    if (threads == 1) {
      std::memcpy(dst.data(), src.data(), bytes);
    } else {
      std::vector<std::thread> workers;
      for (int t = 1; t < threads; ++t) {
        workers.emplace_back(copy_slice, dst.data(), src.data(), static_cast<size_t>(t));
      }
      copy_slice(dst.data(), src.data(), 0);
      for (auto& w : workers) w.join();
    }
    const auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double>(t1 - t0).count());
    // Make the copy observable so that it cannot be elided.
    volatile unsigned char sink = dst[(i * 4099u) % bytes];
    (void)sink;
  }
  MemcpyBandwidth out;
  out.bytes = bytes;
  out.repeats = repeats;
  out.threads = threads;
  out.best_seconds = best;
  out.gbps = best > 0 ? static_cast<double>(bytes) / best / 1e9 : 0;
  return out;
}

}  // namespace fsdp::bench
