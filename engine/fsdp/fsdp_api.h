// The policy structs of fully_shard (PyTorch's _fsdp_api.py): MixedPrecisionPolicy and
// OffloadPolicy (CPUOffloadPolicy when offload_to_cpu is set). See docs/fsdp-behaviour.md,
// "Dtypes", "Mixed precision" and "CPU offload". Value types; thread-safe.
#pragma once

#include <optional>

#include "engine/core/dtype.h"

namespace fsdp::fsdp2 {

// MixedPrecisionPolicy(param_dtype, reduce_dtype, output_dtype, cast_forward_inputs).
struct MixedPrecisionPolicy {
  // Dtype of the all-gathered (unsharded) parameters and of forward/backward compute.
  // Default: unset (the parameter's own dtype).
  std::optional<DType> param_dtype;
  // Dtype of the gradient reduce-scatter (and HSDP all-reduce). Default: unset (the gradient
  // dtype, i.e. param_dtype when set).
  std::optional<DType> reduce_dtype;
  // Floating-point forward outputs are cast to it in post-forward. Default: unset.
  std::optional<DType> output_dtype;
  // With param_dtype set, floating-point forward inputs of every FSDP module are cast to it in
  // pre-forward. Default: true.
  bool cast_forward_inputs = true;
};

// OffloadPolicy() / CPUOffloadPolicy(pin_memory): sharded parameters and their gradients
// live on the CPU; the all-gather input is copied host→device and each new gradient shard
// device→host; the optimizer steps on the CPU.
struct OffloadPolicy {
  bool offload_to_cpu = false;  // Default: false (OffloadPolicy(), no offload)
  bool pin_memory = true;       // Default: true (CPUOffloadPolicy's default; CPU: no effect)

  static OffloadPolicy CPUOffload(bool pin_memory = true) { return {true, pin_memory}; }
};

}  // namespace fsdp::fsdp2
