// RankContext: all per-rank mutable state (rank, world size, device, RNG, memory statistics,
// and extension slots that other units use for observers and comm recorders). While a rank
// runs, its context is the thread's current one (RankContextGuard), which is what makes many
// ranks as threads of one process possible. There are no other globals.
//
// Ownership: whoever runs the rank owns the RankContext (e.g. the threaded runner); threads
// without an installed context get a default per-thread context (rank 0 of 1, CPU, seed 0).
// Thread-safety: a context is used by its rank's thread; memory statistics and extension
// slots may be read from other threads (they are synchronised).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <typeindex>

#include "engine/core/allocator.h"
#include "engine/core/device.h"
#include "engine/core/rng.h"

namespace fsdp {

class RankContext {
 public:
  explicit RankContext(int rank = 0, int world_size = 1, Device device = Device::CPU(),
                       uint64_t seed = 0);
  RankContext(const RankContext&) = delete;
  RankContext& operator=(const RankContext&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  Device device() const { return device_; }
  void set_device(Device device) { device_ = device; }
  Generator& generator() { return generator_; }

  // Memory statistics of this rank on `device` (created on first use; never destroyed while
  // a storage still references it).
  MemoryStats& memory_stats(Device device) { return *memory_stats_ptr(device); }
  std::shared_ptr<MemoryStats> memory_stats_ptr(Device device);

  // Per-rank state owned by another unit, default-constructed on first use. T must be
  // default-constructible. Used for observers, comm recorders and similar per-rank registries.
  template <typename T>
  T& slot() {
    std::lock_guard<std::mutex> lock(mu_);
    auto& entry = slots_[std::type_index(typeid(T))];
    if (!entry) entry = std::make_shared<T>();
    return *std::static_pointer_cast<T>(entry);
  }

  // The calling thread's current context.
  static RankContext& Current();

 private:
  friend class RankContextGuard;
  int rank_;
  int world_size_;
  Device device_;
  Generator generator_;
  std::mutex mu_;
  std::map<std::pair<int, int>, std::shared_ptr<MemoryStats>> memory_stats_;
  std::map<std::type_index, std::shared_ptr<void>> slots_;
};

// Installs a context as the calling thread's current one for the guard's lifetime.
class RankContextGuard {
 public:
  explicit RankContextGuard(RankContext& context);
  ~RankContextGuard();
  RankContextGuard(const RankContextGuard&) = delete;
  RankContextGuard& operator=(const RankContextGuard&) = delete;

 private:
  RankContext* previous_;
};

}  // namespace fsdp
