// Device identity: CPU or CUDA with an index. Value type; thread-safe.
#pragma once

#include <cstdint>
#include <string>

namespace fsdp {

enum class DeviceType : uint8_t { kCPU, kCUDA };

struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;  // CUDA ordinal; 0 for the CPU

  static Device CPU() { return Device{}; }
  static Device CUDA(int index = 0) { return Device{DeviceType::kCUDA, index}; }
  bool is_cpu() const { return type == DeviceType::kCPU; }
  bool is_cuda() const { return type == DeviceType::kCUDA; }
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
  // "cpu" or "cuda:N", as torch.device prints.
  std::string str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }
};

}  // namespace fsdp
