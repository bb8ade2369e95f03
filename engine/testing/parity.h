// check_sharded_parity (PyTorch's common_fsdp.check_sharded_parity): compares every sharded
// parameter (and gradient) of an FSDP module on the calling rank with the chunk a replicated
// reference says this rank must hold (the same torch.chunk rule as sharding, along the
// parameter's shard dim, so empty shards compare equal). Parameters are matched by FQN after
// removing `prefixes_to_ignore`; a parameter that is not FSDP-managed (ignored) is compared whole.
// DivideGrads turns a replicated reference's global-batch gradients into the data-parallel average,
// and AllReduceSum totals the ranks' losses.
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
#include "engine/distributed/process_group.h"
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

// `_reduce_1d_partial_grads` for a replicated reference trained on the global batch: divides
// every parameter's .grad in place by `factor` (the world size), so that it equals the
// data-parallel average of the ranks' local gradients.
void DivideGrads(nn::Module& module, double factor);

// The sum over `pg` of every rank's `value` (a float64 all-reduce, every rank of `pg` calls
// it): the data-parallel total of the ranks' losses, compared with the replicated reference's
// loss on the global batch.
double AllReduceSum(distributed::ProcessGroup& pg, double value);

}  // namespace fsdp::fsdp2
