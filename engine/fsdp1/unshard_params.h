// summon_full_params (PyTorch's FullyShardedDataParallel.summon_full_params and
// _unshard_param_utils.py; docs/fsdp1.md, "summon_full_params"): while a SummonFullParams is
// alive, the FSDP instances of `module`'s tree (or `module` alone without recurse) expose
// their full parameters in full precision:
//
//  * use_orig_params=False: the flat parameter is deregistered and the original parameters
//    are registered as parameters viewing the unsharded flat parameter; use_orig_params=True:
//    the original parameters view it. named_parameters() on an instance drops the
//    "_fsdp_wrapped_module." prefixes meanwhile.
//  * writeback: on exit this rank's part of the (possibly modified) full parameters (and
//    gradients with with_grads) is copied back into its shard; NO_SHARD always persists.
//  * rank0_only: only global rank 0 keeps the full parameters; other ranks reshard at once.
//  * offload_to_cpu: the full parameters live on the CPU inside the scope (sharded strategies).
//  * with_grads (use_orig_params only): the gradients are unsharded too (an all-reduce and an
//    all-gather over the shard group).
// Entering all-gathers (a collective: every rank of the groups must enter). Unsupported
// combinations throw PyTorch's errors (InvalidArgument); entering during forward/backward or
// inside another summon_full_params throws FailedPrecondition.
//
// Ownership: holds raw pointers to the instances (owned by the module tree, which must outlive
// it). Thread-safety: the rank's thread. Not copyable or movable; exits in reverse order.
#pragma once

#include <memory>
#include <vector>

#include "engine/nn/module.h"

namespace fsdp::fsdp1 {

struct SummonFullParamsOptions {
  bool recurse = true;          // Default: every instance of the tree
  bool writeback = true;        // Default: persist modifications
  bool rank0_only = false;      // Default: every rank
  bool offload_to_cpu = false;  // Default: on the compute device
  bool with_grads = false;      // Default: parameters only
};

class SummonFullParams {
 public:
  explicit SummonFullParams(const nn::ModulePtr& module, SummonFullParamsOptions options = {});
  ~SummonFullParams();
  SummonFullParams(const SummonFullParams&) = delete;
  SummonFullParams& operator=(const SummonFullParams&) = delete;

 private:
  struct Entry;
  std::vector<std::unique_ptr<Entry>> entries_;
};

}  // namespace fsdp::fsdp1
