// FsdpState: the state of one FSDP1 instance (PyTorch's _FSDPState; with the wrapper API the
// FullyShardedDataParallel module is its own state and inherits this struct). Construction
// (init_utils.h) fills the configuration; the runtime (runtime_utils.h) reads and writes the
// rest, as PyTorch's functions do on `state`. See docs/fsdp1.md, "State machines".
//
// Ownership: owns its flat parameter handle (std::shared_ptr; autograd hooks hold it weakly);
// shares the process groups, the device mesh and, after lazy init, the root's ExecOrderData.
// `all_fsdp_states` (root only) points at the instances of the root's module tree, which the
// tree owns. Thread-safety: used by its rank's thread only.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "engine/core/device.h"
#include "engine/core/tensor.h"
#include "engine/distributed/device_mesh.h"
#include "engine/distributed/process_group.h"
#include "engine/fsdp1/api.h"
#include "engine/fsdp1/exec_order.h"
#include "engine/fsdp1/flat_param.h"
#include "engine/fsdp1/state_dict_type.h"
#include "engine/fsdp1/training_state.h"

namespace fsdp::nn {
class Module;
}

namespace fsdp::fsdp1 {

class FullyShardedDataParallel;
class SummonFullParams;

struct FsdpState {
  // ---- Process groups (`_init_process_group_state`) ----
  // The group the flat parameter is sharded over (the intra-node group of a hybrid strategy).
  std::shared_ptr<distributed::ProcessGroup> process_group;
  // Hybrid strategies: the group gradients are all-reduced over (`_inter_node_pg`).
  std::shared_ptr<distributed::ProcessGroup> inter_node_process_group;
  std::shared_ptr<distributed::DeviceMesh> device_mesh;
  int rank = 0;        // in process_group
  int world_size = 1;  // of process_group
  // The pre/post split of the data-parallel size (shard size x replicate size).
  double gradient_predivide_factor = 1.0;
  double gradient_postdivide_factor = 1.0;

  // ---- Configuration (`_init_core_state`, `_init_prefetching_state`) ----
  ShardingStrategy sharding_strategy = ShardingStrategy::kFullShard;
  MixedPrecision mixed_precision;
  CPUOffload cpu_offload;
  bool limit_all_gathers = true;
  bool use_orig_params = false;
  std::optional<BackwardPrefetch> backward_prefetch = BackwardPrefetch::kBackwardPre;
  bool forward_prefetch = false;
  Device compute_device;

  // ---- Ignored states (`_init_ignored_module_states`) and buffers (`_init_buffer_state`) ----
  std::set<const nn::Module*> ignored_modules;
  std::set<const TensorImpl*> ignored_params;
  std::set<std::string> ignored_buffer_names;  // clean FQNs from this instance's module
  std::map<std::string, DType> buffer_name_to_orig_dtype;  // clean FQN -> dtype at construction

  // ---- Runtime (`_init_runtime_state`) ----
  TrainingState training_state = TrainingState::kIdle;
  std::optional<bool> is_root;  // unset until lazy init
  // False inside no_sync(): gradients are accumulated unsharded, not reduced.
  bool sync_gradients = true;
  bool post_backward_callback_queued = false;
  // Root only: every FSDP instance of its tree, pre-order (itself first).
  std::vector<FullyShardedDataParallel*> all_fsdp_states;
  std::shared_ptr<ExecOrderData> exec_order_data;
  // Null when the instance manages no parameters.
  std::shared_ptr<FlatParamHandle> handle;
  // This instance's clean FQN from the lazy-init root ("" for the root; events, comm counts).
  std::string fqn;

  // ---- State dicts (`_state_dict_type`, `_state_dict_config`, `_unshard_params_ctx`;
  // state_dict_type.h, state_dict_utils.h) ----
  StateDictType state_dict_type = StateDictType::kFullStateDict;
  StateDictConfig state_dict_config = FullStateDictConfig{};
  // The unshard scope a FULL / SHARDED state-dict hook opened for this instance, closed by the
  // matching post-hook (shared_ptr: SummonFullParams is incomplete here).
  std::shared_ptr<SummonFullParams> unshard_params_ctx;
};

}  // namespace fsdp::fsdp1
