#include "engine/core/rng.h"

#include <cmath>

namespace fsdp {

std::array<uint32_t, 4> Generator::Philox(uint64_t key, uint64_t counter_hi, uint64_t counter_lo) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  std::array<uint32_t, 4> c = {static_cast<uint32_t>(counter_lo), static_cast<uint32_t>(counter_lo >> 32),
                               static_cast<uint32_t>(counter_hi), static_cast<uint32_t>(counter_hi >> 32)};
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kM0) * c[0];
    const uint64_t p1 = static_cast<uint64_t>(kM1) * c[2];
    c = {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k0, static_cast<uint32_t>(p1),
         static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k1, static_cast<uint32_t>(p0)};
    k0 += kW0;
    k1 += kW1;
  }
  return c;
}

std::array<uint32_t, 4> Generator::next4() {
  buffered_ = 0;
  return Philox(seed_, 0, offset_++);
}

uint32_t Generator::next_u32() {
  if (buffered_ == 0) {
    buffer_ = Philox(seed_, 0, offset_++);
    buffered_ = 4;
  }
  return buffer_[4 - buffered_--];
}

uint64_t Generator::next_u64() {
  const uint64_t hi = next_u32();
  return (hi << 32) | next_u32();
}

float Generator::uniform_float() { return static_cast<float>(next_u32() >> 8) * (1.0f / 16777216.0f); }

double Generator::uniform_double() {
  return static_cast<double>(next_u64() >> 11) * (1.0 / 9007199254740992.0);
}

double Generator::normal() {
  // 1 - u keeps the log argument in (0, 1].
  const double u1 = 1.0 - uniform_double();
  const double u2 = uniform_double();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

}  // namespace fsdp
