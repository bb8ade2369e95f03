// The models of seed 001 (test_fsdp_state_dict.py) for the `fsdp_state_dict/*` family, built
// twice from one description: unwrapped (the plain model whose state_dict() keys and values are
// the oracle's) and wrapped with FullyShardedDataParallel as the seed wraps it. The description
// also names the FSDP instances (their clean FQNs) so that the judge can derive LOCAL flat
// parameters from the plain model's parameters by the flattening rule (docs/fsdp1.md, "Flat
// parameter layout"). Stateless; thread-safe.
//
//   simple              FSDP(Linear(10, 10, bias=False))                       _get_simple_model
//   simple_nested       FSDP(Sequential(FSDP(Linear), Linear)), no biases      _get_simple_nested_model
//   multibuffer_nested  FSDP(Sequential(FSDP(Linear), FSDP(BatchNorm1d(10)), Linear))
//                                                                   _get_multibuffer_nested_model
//   model               FSDP(Model): inner = FSDP(Linear(4, 4)), outer = Linear(4, 5), with
//                       persistent and non-persistent buffers (register_buffers=True)   Model
//   transformer         TransformerWithSharedParams(add_bn=False), encoder and decoder layers
//                       wrapped (ModuleWrapPolicy)                       FSDPInitMode.RECURSIVE
//   dummy               FSDP(TestDummyModel): net3 is net2, shared_parameter is
//                       random_parameter                                         TestDummyModel
//   one_element         FSDP(a module whose only parameter has 1 element, 3.1415926)
//   transformer_manual  TransformerWithSharedParams(add_bn=False) wrapped by hand: every encoder
//                       and decoder layer FSDP(layer) (FSDP(checkpoint_wrapper(layer)) with
//                       checkpoint "wrap"), then FSDP(transformer); the root stays plain
//                                                       test_state_dict_with_manual_ac_wrapper
//   container           FSDPContainer (not FSDP): non_fsdp_lin = Linear(10, 10, bias=False),
//                       fsdp_1 and fsdp_2 = simple_nested each          _get_non_fsdp_root_module
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/distributed/process_group.h"
#include "engine/fsdp1/fully_sharded_data_parallel.h"
#include "engine/nn/module.h"

namespace fsdp::conformance {

// How the FSDP instances are configured (the seed's fsdp_kwargs).
struct StateDictModelOptions {
  bool use_orig_params = false;
  bool cpu_offload = false;
  bool mixed_precision = false;  // MixedPrecision(float16 x 3); BatchNorm's instance float32
  // "", "wrap" (checkpoint_wrapper before FSDP, the seed's checkpoint_wrap=True) or
  // "after_wrap" (apply_activation_checkpointing on the Linears of the wrapped model).
  std::string checkpoint = "";
  bool sync_module_states = false;  // broadcast rank 0's states at construction
};

// Every model name above.
const std::vector<std::string>& StateDictModelNames();
// The plain model `name` (parameters from the current generator; buffers as constructed).
nn::ModulePtr BuildPlainStateDictModel(const std::string& name);
// The clean FQNs of the FSDP instances that `name` has ("" for an FSDP root).
std::vector<std::string> StateDictModelInstances(const std::string& name);
// Whether the entry `key` of the plain model's state dict belongs to an FSDP instance of `name`.
bool ManagedByFsdp(const std::string& name, const std::string& key);
// `plain` (a model from BuildPlainStateDictModel(name)) wrapped as the seed wraps it, over `pg`
// (the root is an FSDP instance for every model but `container`).
nn::ModulePtr WrapStateDictModel(
    const std::string& name, const nn::ModulePtr& plain,
    const std::shared_ptr<distributed::ProcessGroup>& pg, const StateDictModelOptions& options);

}  // namespace fsdp::conformance
