// HostStaging: host-memory views of collective buffers for CPU-only backends (the threaded
// fake, Gloo). CPU tensors are used in place; CUDA tensors are copied to host staging tensors
// (inputs) or staged and written back after the collective succeeded (outputs).
//
// Ownership: owns the staging tensors for one collective call.
// Thread-safety: used by one rank thread for one call.
#pragma once

#include <utility>
#include <vector>

#include "engine/core/tensor.h"

namespace fsdp::distributed {

class HostStaging {
 public:
  // Host pointer to `t`'s data (nullptr when empty).
  const char* Input(const Tensor& t) {
    if (t.numel() == 0) return nullptr;
    if (t.device().is_cpu()) return static_cast<const char*>(t.data_ptr());
    staged_.push_back(t.to(Device::CPU()));
    return static_cast<const char*>(staged_.back().data_ptr());
  }
  // Host pointer that the collective writes; `preserve`: start from t's current contents.
  char* Output(const Tensor& t, bool preserve) {
    if (t.numel() == 0) return nullptr;
    if (t.device().is_cpu()) return static_cast<char*>(t.data_ptr());
    Tensor host = preserve ? t.to(Device::CPU()) : Tensor::empty(t.sizes(), t.dtype());
    write_back_.emplace_back(t, host);
    return static_cast<char*>(host.data_ptr());
  }
  // Copies staged outputs back to their device tensors.
  void WriteBack() {
    for (auto& [device_tensor, host] : write_back_) {
      Tensor dst = device_tensor;
      dst.copy_(host);
    }
    write_back_.clear();
  }

 private:
  std::vector<Tensor> staged_;
  std::vector<std::pair<Tensor, Tensor>> write_back_;
};

}  // namespace fsdp::distributed
