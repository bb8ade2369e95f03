// FSDP1's runtime (PyTorch's _runtime_utils.py; docs/fsdp1.md, "Runtime", "Prefetch orders",
// "no_sync"): lazy init and root detection, the forward steps, the pre-backward tensor hooks,
// the post-backward hook on the flat parameter's AccumulateGrad (gradient reduction with the
// pre/post divide split), the end-of-backward callback, prefetching, and the unshard / reshard
// steps every other unit goes through.
//
// Observability (the vocabulary of FSDP2's engine/fsdp/observer.h, state mapped by
// ToObserverState): `unshard` when an all-gather of a flat parameter is issued (its handle's
// module FQN, the handle's state at the call, FORWARD / PRE_BACKWARD for a prefetch);
// `reshard` when an unsharded flat parameter is freed; `pre_backward` when an instance's
// pre-backward hook really runs; `post_backward` after its post-backward hook ran. Every
// collective runs under a distributed::CommPhaseGuard(instance FQN, phase): forward for
// FORWARD / IDLE / SUMMON_FULL_PARAMS, backward otherwise.
//
// Free functions over the FSDP instances (the wrapper module is its own state). Autograd hooks
// and the queued callback hold the instance and its handle weakly. Thread-safety: the rank's
// thread.
#pragma once

#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "engine/fsdp1/fsdp_state.h"
#include "engine/nn/value.h"

namespace fsdp::nn {
class Module;
}

namespace fsdp::fsdp1 {

class FullyShardedDataParallel;

// "FSDP instance 'transformer.encoder.layers.0' wrapping TransformerEncoderLayer": how runtime
// errors name an instance (its FQN is known after lazy init).
std::string DescribeInstance(const FullyShardedDataParallel& state);

// `_get_fsdp_states`: the FSDP instances of `module`'s tree, pre-order, each once.
std::vector<FullyShardedDataParallel*> GetFsdpStates(const nn::Module& module);

// `_lazy_init`: on the first instance to run (it becomes the root): checks where the flat
// parameters live, collects all instances, casts buffers (buffer_dtype) and moves them to the
// compute device, fixes the handle order, shares the ExecOrderData, initializes the handles'
// attributes, records every instance's FQN. A no-op once done.
void LazyInit(FullyShardedDataParallel& state);

// `_assert_in_training_states`: FailedPrecondition naming `state`'s instance otherwise.
void AssertInTrainingStates(const FullyShardedDataParallel& state,
                            std::initializer_list<TrainingState> states);

// The forward steps of FullyShardedDataParallel::forward.
std::pair<nn::Value, nn::Value> RootPreForward(FullyShardedDataParallel& state,
                                               const nn::Value& args, const nn::Value& kwargs);
std::pair<nn::Value, nn::Value> PreForward(FullyShardedDataParallel& state,
                                           const nn::Value& args, const nn::Value& kwargs);
nn::Value PostForward(FullyShardedDataParallel& state, const nn::Value& output);

// `_unshard` / `_reshard`: the handle's pre-unshard, all-gather (if freed) and post-unshard /
// reshard (freeing when asked) and post-reshard, with the events and comm attribution above.
// (limit_all_gathers' rate limiter waits on CUDA free events; nothing to wait for here.)
void Unshard(FlatParamHandle& handle);
void Reshard(FlatParamHandle& handle, bool free_unsharded_flat_param);

// `_reset_flat_param_grad_info_if_needed` over handles.
void ResetFlatParamGradInfoIfNeeded(const std::vector<FlatParamHandle*>& handles);

}  // namespace fsdp::fsdp1
