// check_sharded_parity (PyTorch's common_fsdp.check_sharded_parity): compares every sharded
// parameter (and gradient) of an FSDP module on the calling rank with the chunk a replicated
// reference says this rank must hold (the same torch.chunk rule as sharding, so empty shards
// compare equal). Parameters are matched by FQN after removing `prefixes_to_ignore`; a
// parameter that is not FSDP-managed (ignored) is compared whole.
//
// Test-only (library fsdp_testing, engine/testing/; never part of fsdp_engine; the namespace
// stays fsdp::fsdp2 beside the FSDP API it checks).
// Ownership: borrows its arguments. Thread-safety: call on the rank's thread (it reads the
// rank's sharded-parameter registry; no collectives).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "engine/core/tensor.h"
#include "engine/nn/module.h"

namespace fsdp::fsdp2 {

struct ParityOptions {
  double rtol = 1.3e-6;  // Default: PyTorch's assertEqual float32 rtol
  double atol = 1e-5;    // Default: PyTorch's assertEqual float32 atol
  bool check_grads = true;  // Default: true
  std::vector<std::string> prefixes_to_ignore;  // Default: none
};

// Returns "" on parity, else one line per mismatch (name, what differs, max abs difference).
std::string CheckShardedParity(const std::map<std::string, Tensor>& reference_params,
                               const std::map<std::string, Tensor>& reference_grads,
                               const nn::Module& sharded_module, const ParityOptions& options = {});
// The replicated module's named parameters and their .grad as the reference. Both modules
// must have the same number of parameters.
std::string CheckShardedParity(const nn::Module& replicated_module,
                               const nn::Module& sharded_module, const ParityOptions& options = {});

}  // namespace fsdp::fsdp2
