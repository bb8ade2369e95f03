// A deterministic counter-based random number generator (Philox-4x32-10, as in PyTorch's
// CUDA generator). Each draw is a pure function of (seed, offset), so results do not depend on
// thread scheduling. One Generator lives in each RankContext; it is not thread-safe by itself
// (a rank is one thread).
#pragma once

#include <array>
#include <cstdint>

namespace fsdp {

class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : seed_(seed) {}
  void manual_seed(uint64_t seed) {
    seed_ = seed;
    offset_ = 0;
    buffered_ = 0;
  }
  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_; }
  void set_offset(uint64_t offset) {
    offset_ = offset;
    buffered_ = 0;
  }

  // The inputs of a counter-based kernel drawing one 32-bit word per element, four elements
  // per Philox block (element i reads word i % 4 of Philox(seed, 0, offset + i / 4)).
  struct PhiloxInputs {
    uint64_t seed;
    uint64_t offset;  // the first reserved counter
  };
  // Reserves the ceil(numel / 4) Philox counters that `numel` such elements use and returns
  // (seed, first counter); the generator's offset moves past them (PyTorch's
  // philox_engine_inputs). The one place that advances the offset for dropout (CPU and CUDA
  // masks stay equal because both take their counters from here).
  PhiloxInputs reserve_philox(int64_t numel) {
    const PhiloxInputs inputs{seed_, offset_};
    set_offset(offset_ + static_cast<uint64_t>((numel + 3) / 4));
    return inputs;
  }

  // Next four 32-bit words; advances the counter by one.
  std::array<uint32_t, 4> next4();
  uint32_t next_u32();
  uint64_t next_u64();
  // Uniform in [0, 1) with 24 (float) / 53 (double) random bits.
  float uniform_float();
  double uniform_double();
  // Standard normal (Box-Muller on two uniform draws).
  double normal();

  // The Philox-4x32-10 block for (key, counter): exposed for tests and for kernels that
  // compute element i's draw directly from (seed, offset + i).
  static std::array<uint32_t, 4> Philox(uint64_t key, uint64_t counter_hi, uint64_t counter_lo);

 private:
  uint64_t seed_;
  uint64_t offset_ = 0;
  std::array<uint32_t, 4> buffer_{};
  int buffered_ = 0;
};

}  // namespace fsdp
