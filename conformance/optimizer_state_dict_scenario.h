// Scenario `fully_shard_state_dict/optimizer_state_dict` (PyTorch's
// torch.distributed.checkpoint.state_dict for optimizers, test_state_dict.py): the zoo's MLP
// sharded per child then root, trained with SGD (momentum) or Adam, then
//   * get_optimizer_state_dict (sharded or full_state_dict) is judged against the float64
//     oracle optimizer's state after the same steps: keys "state.<fqn>.<name>" and
//     "param_groups.<fqn>.lr", each sharded value torch.chunk's rows of the oracle's tensor
//     with its global shape and offsets;
//   * a model and optimizer that took one step of their own (the optimizer has state) load
//     both dicts (set_model_state_dict, set_optimizer_state_dict: the loaded state replaces
//     theirs) and take the next step: their parameters must equal the saver's
//     own next step bit for bit (a lost step count, a swapped moment or a mis-sharded buffer
//     changes them). The loader's param_groups lrs right after the load are observed too.
//   With param_groups=True (test_multi_param_groups) the second half of the parameters form a
//   second param group of twice the lr, stepped so by the oracle; with frozen=True the last
//   parameter has requires_grad=False: it keeps its param_groups.<fqn>.lr entry without state.
// `fully_shard_state_dict/optimizer_state_dict_shared_weight` runs the same on the zoo's
// Transformer, whose output.weight is tok_embeddings.weight (test_state_dict.py's
// test_shared_weight): the model dict reports the tied parameter under both keys, sharded
// alike, and the optimizer dict keys its state by the first FQN. Both report the model dict's
// sharding (global shape and offsets per key) besides the optimizer's.
// Thread-safety: the scenario's functions are stateless.
#pragma once

#include "conformance/scenario.h"

namespace fsdp::conformance {

Scenario OptimizerStateDictScenario();
Scenario OptimizerStateDictSharedWeightScenario();

}  // namespace fsdp::conformance
