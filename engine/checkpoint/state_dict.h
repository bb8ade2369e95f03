// torch.distributed.checkpoint.state_dict for the engine: the model and optimizer state dicts
// of a fully_shard-ed (FSDP2) or plain module in one shape, sharded or full.
//
//  * get_model_state_dict(model, options): model.state_dict() (FSDP2: this rank's Shard(0)
//    pieces marked in StateDict::sharded). full_state_dict all-gathers every sharded value
//    (FsdpParam::full_tensor(), a collective: every rank calls it); with cpu_offload too, rank 0
//    gets the full dict on the CPU and the other ranks `{}` (PyTorch's rank0-only offload).
//    cpu_offload alone moves the values to the CPU.
//  * set_model_state_dict(model, state_dict, options): sharded values load directly;
//    full_state_dict values are cut into this rank's torch.chunk rows first. With
//    broadcast_from_rank0 only rank 0 needs the dict: every tensor is broadcast from it over the
//    default process group (rank 0's key or shape errors are raised on every rank; under
//    strict=False a key rank 0 lacks keeps the model's value and is not reported missing, as
//    PyTorch's _broadcast_state_dict fills it from the model's own dict). Keys and
//    shapes are checked before anything is loaded (strict: missing and unexpected keys, with
//    PyTorch's wording).
//  * get_optimizer_state_dict / set_optimizer_state_dict: the optimizer's state flattened and
//    keyed by parameter FQN, as PyTorch's flattened optimizer state dicts are:
//    "state.<fqn>.<name>" (step, exp_avg, exp_avg_sq, momentum_buffer, ...) and
//    "param_groups.<fqn>.lr" (a 0-dim float64 tensor). A state tensor of the parameter's shape
//    is sharded like the parameter; scalars (step) are full tensors. The options apply as for
//    the model.
//
// FSDP1 modules are not handled here yet (their state dicts come from FSDP1's
// state_dict_type API).
// Thread-safety: collective functions; each rank calls them from its own thread, in the same
// order.
#pragma once

#include "engine/nn/module.h"
#include "engine/optim/optimizer.h"

namespace fsdp::checkpoint {

// torch.distributed.checkpoint.state_dict.StateDictOptions (the fields the engine supports).
struct StateDictOptions {
  bool full_state_dict = false;       // Default: false (sharded values)
  bool cpu_offload = false;           // Default: false
  bool broadcast_from_rank0 = false;  // Default: false (set_*: every rank passes the dict)
  bool strict = true;                 // Default: true
};

nn::StateDict get_model_state_dict(nn::Module& model, const StateDictOptions& options = {});
nn::IncompatibleKeys set_model_state_dict(nn::Module& model, const nn::StateDict& state_dict,
                                          const StateDictOptions& options = {});

nn::StateDict get_optimizer_state_dict(nn::Module& model, const optim::Optimizer& optimizer,
                                       const StateDictOptions& options = {});
void set_optimizer_state_dict(nn::Module& model, optim::Optimizer& optimizer,
                              const nn::StateDict& state_dict,
                              const StateDictOptions& options = {});

}  // namespace fsdp::checkpoint
