// FSDP2's state-dict hooks (PyTorch's FSDPParamGroup._register_state_dict_hooks, with the
// DTensor metadata of the values; docs/checkpoint.md):
//
//  * state_dict(): keys are the original FQNs (fully_shard inserts no module), both keys of a
//    tied weight included; each FSDP parameter's value is its sharded parameter (this rank's
//    torch.chunk rows, unpadded, sharing storage with the live parameter; possibly 0 rows)
//    marked in StateDict::sharded with its global shape and offsets (a Shard(0) DTensor).
//    Buffers are plain tensors. No communication.
//  * Before saving and before loading, a pre-hook on every module holding FSDP parameters
//    forces its group to SHARDED, so a model run with reshard_after_forward=False gives the
//    same state dict before and after a forward.
//  * load_state_dict(sd, strict, assign): each FSDP parameter's value must be a sharded entry
//    of the same global shape at this rank's offsets (what state_dict() returns at the same
//    world size); it is copied into the sharded parameter. With assign=True the value replaces
//    the parameter and a post-load hook re-pads it (FsdpParam::reset_sharded_param). A full
//    tensor, another global shape or another rank's offsets is an error naming the FQN (load
//    full or resharded values with set_model_state_dict or a checkpoint instead).
//
// Ownership: the hooks hold the group weakly (the modules own it through their FSDP state).
// Thread-safety: used by the rank's thread only.
#pragma once

#include <memory>

#include "engine/fsdp/fsdp_param_group.h"

namespace fsdp::fsdp2 {

// Registers the hooks above on every module that holds a parameter of `group` (owners and the
// shared locations of tied weights). Called once by fully_shard.
void RegisterStateDictHooks(const std::shared_ptr<FsdpParamGroup>& group);

}  // namespace fsdp::fsdp2
