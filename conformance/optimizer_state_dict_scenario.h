// Scenario `fully_shard_state_dict/optimizer_state_dict` (PyTorch's
// torch.distributed.checkpoint.state_dict for optimizers, test_state_dict.py): the zoo's MLP
// sharded per child then root, trained with SGD (momentum) or Adam, then
//   * get_optimizer_state_dict (sharded or full_state_dict) is judged against the float64
//     oracle optimizer's state after the same steps: keys "state.<fqn>.<name>" and
//     "param_groups.<fqn>.lr", each sharded value torch.chunk's rows of the oracle's tensor
//     with its global shape and offsets;
//   * a fresh model and optimizer load both dicts (set_model_state_dict,
//     set_optimizer_state_dict) and take the next step: their parameters must equal the saver's
//     own next step bit for bit (a lost step count, a swapped moment or a mis-sharded buffer
//     changes them).
// Thread-safety: the scenario's functions are stateless.
#pragma once

#include "conformance/scenario.h"

namespace fsdp::conformance {

Scenario OptimizerStateDictScenario();

}  // namespace fsdp::conformance
