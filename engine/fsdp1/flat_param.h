// FlatParamHandle: one FSDP1 instance's flat parameter and the views of its original
// parameters (PyTorch's FlatParameter + FlatParamHandle, _flat_param.py; docs/fsdp1.md,
// "Flat parameter layout", "Views"):
//
//  * Construction flattens the managed parameters (walk of the fully sharded module in
//    `named_modules(remove_duplicate=False)` order, each module's own parameters in
//    registration order, shared parameters once, with use_orig_params alignment padding) into
//    one 1-D leaf tensor, the flat parameter. Its identity never changes: switching between the
//    sharded and the unsharded form rebinds its data (PyTorch's `flat_param.data = ...`), so
//    autograd, its AccumulateGrad node and optimizers keep referring to the same tensor.
//  * shard(): keeps this rank's torch.chunk chunk of it, zero-padded to the chunk size (the
//    local shard). The padded unsharded flat parameter (all-gather destination, W * chunk
//    elements) is allocated and freed by resizing one persistent Storage, so the views autograd
//    saved in forward see the data again after a backward all-gather.
//  * The original parameters: with use_orig_params=False they are removed from their modules
//    and replaced by plain tensor attributes (nn::Module::set_tensor_attribute) that are views
//    into the unsharded flat parameter (created under autograd in forward, so gradients flow
//    to the flat parameter); with use_orig_params=True the original parameter tensors are kept
//    registered and their data is rebound: to 1-D slices of the local shard when sharded (a
//    size-0 tensor when this rank holds none of it), to views of the unsharded flat parameter
//    inside forward and summon_full_params. Their `.grad` are views into the flat gradient.
//  * Tensor-parallel parameters (dtensor_extensions.h): a DTensor parameter is flattened as its
//    local tensor, and each unsharded view is recorded as a DTensor with its TP placements.
//  * Gradients: autograd accumulates the unsharded gradient into the flat parameter's .grad;
//    prepare_gradient_for_backward / prepare_gradient_for_optim move the sharded gradient
//    between `.grad` and `saved_grad_shard` (the runtime reduces into the latter).
//
// The runtime (runtime_utils.h) drives unshard/reshard and reads/writes the flat parameter's
// runtime attributes, which PyTorch stores on the FlatParameter object; here they are the
// public members under "FlatParameter runtime attributes".
//
// Ownership: owned by its FullyShardedDataParallel (std::shared_ptr; autograd hooks hold it
// weakly). Holds raw pointers to the modules its parameters are registered on (the FSDP
// instance's wrapped module tree, which outlives it) and shares its process group.
// Thread-safety: used by its rank's thread only.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/autograd/hooks.h"
#include "engine/core/tensor.h"
#include "engine/distributed/process_group.h"
#include "engine/fsdp1/api.h"
#include "engine/fsdp1/flat_param_layout.h"
#include "engine/fsdp1/training_state.h"
#include "engine/tensor_parallel/dtensor.h"

namespace fsdp::nn {
class Module;
}
namespace fsdp::autograd {
class Node;
}

namespace fsdp::fsdp1 {

// Where an original parameter is registered (`ParamInfo`): module.param_name, the module's
// FQN relative to the fully sharded module.
struct ParamInfo {
  std::string param_name;
  nn::Module* module = nullptr;
  std::string module_name;
};

// A further registration of a parameter already in the flat parameter (a tied weight,
// `SharedParamInfo`) and where its primary registration is.
struct SharedParamInfo {
  std::string param_name;
  nn::Module* module = nullptr;
  std::string module_name;
  std::string prim_param_name;
  nn::Module* prim_module = nullptr;
  std::string prim_module_name;
};

// `FlatParamShardMetadata`: the original parameters present in this rank's shard.
struct FlatParamShardMetadata {
  std::vector<std::string> param_names;  // FQNs relative to the fully sharded module
  std::vector<Shape> param_shapes;
  std::vector<int64_t> param_numels;
  std::vector<std::pair<int64_t, int64_t>> param_offsets;  // [start, end] inside each param
};

class FlatParamHandle : public std::enable_shared_from_this<FlatParamHandle> {
 public:
  struct Options {
    Device device;  // the compute device
    ShardingStrategy sharding_strategy = ShardingStrategy::kFullShard;
    bool offload_params = false;
    std::optional<DType> mp_param_dtype;
    std::optional<DType> mp_reduce_dtype;
    bool keep_low_precision_grads = false;
    std::shared_ptr<distributed::ProcessGroup> process_group;  // the shard group
    bool use_orig_params = false;
  };

  // Flattens `params` (which must all be registered in `fully_sharded_module`'s tree) and
  // registers the unsharded views (use_unsharded_views(as_params=false)). Throws
  // InvalidArgument for an empty list, non-floating or mixed-dtype parameters, mixed
  // requires_grad without use_orig_params, or parameters on different devices.
  FlatParamHandle(const std::vector<Tensor>& params, nn::Module* fully_sharded_module,
                  Options options);
  FlatParamHandle(const FlatParamHandle&) = delete;
  FlatParamHandle& operator=(const FlatParamHandle&) = delete;

  // ---- Shard initialization and metadata ----
  // Shards the flat parameter (the local shard replaces its data); NO_SHARD only records the
  // metadata. With use_orig_params, registers the sharded views.
  void shard();
  // Lazy init: the local shard (pinned with CPU offload on a CUDA device), the CPU gradient
  // buffer (offload), the low-precision shard (parameter mixed precision) and the padded
  // unsharded flat parameters (sharded strategies), all freed until used.
  void init_flat_param_attributes();
  FlatParamShardMetadata shard_metadata() const;

  // ---- Unshard / reshard (`pre_unshard`, `unshard`, `post_unshard`, `reshard`,
  // `post_reshard`) ----
  // Makes the flat parameter's data what must be all-gathered (low-precision or device copy
  // of the local shard); writes back changed original parameters (use_orig_params). Returns
  // whether it did anything.
  bool pre_unshard();
  // All-gathers into the padded unsharded flat parameter when it is freed (a collective over
  // the shard group), then uses the unsharded flat parameter (and, in forward, the unsharded
  // views). NO_SHARD: only the views.
  void unshard();
  // True for a sharded strategy whose padded unsharded flat parameter is freed.
  bool needs_unshard() const;
  void post_unshard();
  // Switches to the local shard (and the sharded views); frees the unsharded flat parameter
  // when `free_unsharded_flat_param`.
  void reshard(bool free_unsharded_flat_param);
  void post_reshard();
  // summon_full_params(with_grads): all-gathers the sharded gradient (an all-reduce of the
  // "grad is None" count first; both collectives over the shard group) / restores it.
  void unshard_grad();
  void reshard_grad();
  // summon_full_params(offload_to_cpu): moves the unpadded unsharded flat parameter to the
  // CPU (freeing the device copy) / back to the compute device.
  void to_cpu();
  void from_cpu();
  // `flat_param_to(device)`: moves the flat parameter's data (the views follow).
  void flat_param_to(Device device);
  // Stashes an existing sharded gradient in saved_grad_shard so autograd writes a fresh
  // unsharded one; an unsharded gradient accumulated in no_sync() is left in place.
  void prepare_gradient_for_backward();
  // Moves the sharded gradient (saved_grad_shard, or the CPU gradient) into .grad.
  void prepare_gradient_for_optim();

  // ---- Views ----
  // as_params=false: the views are plain tensor attributes (use_orig_params=False) or, with
  // use_orig_params, saved in forward and reused in pre-backward; as_params=true: registered
  // as parameters (the original ones with use_orig_params, new leaves aliasing the views
  // otherwise).
  void use_unsharded_views(bool as_params);
  void use_unsharded_grad_views();
  void use_sharded_views();
  void use_sharded_grad_views();
  // Copies original parameters (and gradients) whose storage changed back into the flat
  // parameter (use_orig_params). Throws when a shape changed.
  bool writeback_orig_params();
  // use_orig_params: the flat gradient becomes None when every original gradient is None,
  // and the flat parameter requires grad iff any original parameter does.
  void reset_flat_param_grad_info_if_needed();
  // use_orig_params: a post-backward sees every parameter that requires grad as having one.
  void reset_is_grad_none();

  // ---- Accessors ----
  const Tensor& flat_param() const { return flat_param_; }
  nn::Module* fully_sharded_module() const { return fully_sharded_module_; }
  const Options& options() const { return options_; }
  ShardingStrategy sharding_strategy() const { return options_.sharding_strategy; }
  bool uses_sharded_strategy() const { return UsesShardedStrategy(options_.sharding_strategy); }
  bool use_orig_params() const { return options_.use_orig_params; }
  bool offload_params() const { return options_.offload_params; }
  const Device& device() const { return options_.device; }
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  DType orig_param_dtype() const { return orig_param_dtype_; }
  DType fwd_bwd_param_dtype() const { return fwd_bwd_param_dtype_; }
  DType reduce_dtype() const { return reduce_dtype_; }
  bool keep_low_precision_grads() const { return options_.keep_low_precision_grads; }
  bool uses_param_mixed_precision() const { return fwd_bwd_param_dtype_ != orig_param_dtype_; }
  bool uses_reduce_mixed_precision() const { return reduce_dtype_ != orig_param_dtype_; }
  // Mixed precision is disabled inside summon_full_params.
  bool force_full_precision() const;
  // The sharded gradient: the CPU gradient (offload), else saved_grad_shard while it exists,
  // else .grad.
  Tensor sharded_grad() const;
  // True when `tensor` has the sharded size (always false for NO_SHARD).
  bool is_sharded(const Tensor& tensor) const;
  // True while use_orig_params skipped the post-forward sharded views (SHARD_GRAD_OP).
  bool skipped_use_sharded_views() const { return unsharded_flat_param_for_skipped_views_.defined(); }

  // Flat-parameter metadata.
  const FlatParamLayout& layout() const { return layout_; }
  const std::vector<ParamInfo>& param_infos() const { return param_infos_; }
  const std::vector<SharedParamInfo>& shared_param_infos() const { return shared_param_infos_; }
  const std::vector<std::string>& fqns() const { return fqns_; }
  const std::vector<Shape>& shapes() const { return shapes_; }
  const std::vector<int64_t>& numels() const { return numels_; }
  const std::vector<ShardParamInfo>& shard_param_infos() const { return shard_param_infos_; }
  // The tensor-parallel extension of each flattened parameter (dtensor_extensions.h): its
  // DTensor (mesh, placements, global shape), or nullopt for a plain parameter.
  const std::vector<std::optional<tensor_parallel::DTensor>>& param_extensions() const {
    return param_extensions_;
  }
  bool has_param_extensions() const;
  int64_t unpadded_unsharded_numel() const { return layout_.total_numel; }
  int64_t sharded_numel() const { return sharded_numel_; }
  int64_t shard_numel_padded() const { return shard_numel_padded_; }
  int64_t padded_unsharded_numel() const { return sharded_numel_ * world_size_; }
  // The original parameters (use_orig_params; empty otherwise), flattening order.
  const std::vector<Tensor>& orig_params() const { return params_; }
  const Tensor& local_shard() const { return local_shard_; }
  // The padded unsharded flat parameter of the current context (full precision inside
  // summon_full_params with parameter mixed precision).
  const Tensor& padded_unsharded_flat_param() const;

  // ---- Runtime flags (set by runtime_utils, as PyTorch sets them on the handle) ----
  HandleTrainingState training_state = HandleTrainingState::kIdle;
  // The owning instance's clean FQN from the lazy-init root (events and comm attribution).
  std::string module_fqn;
  std::optional<int> pre_forward_order_index;  // index in the pre-forward order (first iteration)
  std::optional<int> post_forward_index;       // index in the post-forward order
  bool needs_pre_forward_unshard = false;      // guards mistargeted forward prefetches
  bool needs_pre_backward_unshard = false;     // guards mistargeted backward prefetches
  bool prefetched = false;
  bool ran_pre_backward_hook = false;

  // ---- FlatParameter runtime attributes ----
  // `_saved_grad_shard`: present (has_saved_grad_shard) from the first reduction of a
  // backward until prepare_gradient_for_optim; the tensor may be undefined (None).
  bool has_saved_grad_shard = false;
  Tensor saved_grad_shard;
  // `_cpu_grad`: the CPU gradient buffer (CPU offload only; undefined otherwise).
  Tensor cpu_grad;
  // `_post_backward_called`.
  bool post_backward_called = false;
  // `_post_backward_hook_state`: the flat parameter's AccumulateGrad (kept alive from the
  // first forward to the end of backward) and the hook registered on it.
  std::shared_ptr<autograd::Node> post_backward_acc_grad;
  autograd::RemovableHandle post_backward_hook_handle;

 private:
  void init_param_reduce_dtypes();
  void init_flat_param_and_metadata(const std::vector<Tensor>& params);
  void init_shard_metadata(int64_t numel_padded, int64_t unsharded_start_idx,
                           int64_t unsharded_end_idx);
  std::vector<Tensor> get_unflat_views(const Tensor& tensor) const;
  void use_low_precision_shard();
  void free_low_precision_sharded_param();
  // Re-allocates the freed padded unsharded flat parameter: uninitialised (PyTorch's
  // `_alloc_storage`) before an all-gather that writes all of it, zeroed when only the unpadded
  // part is written next (so the padding holds the zeros an all-gather would have brought).
  Tensor alloc_padded_unsharded_flat_param(AllocInit init);
  Tensor all_gather_flat_param(const Tensor& padded_unsharded_flat_param);
  void use_unsharded_flat_param(const Tensor& padded_unsharded_flat_param);
  void use_sharded_flat_param();
  void free_unsharded_flat_param();
  void writeback_tensor(const Tensor& src, const Tensor& dst, size_t index,
                        int64_t expected_numel, int64_t offset, bool is_param);
  // `_setattr_param` / `_setattr_tensor`: (re)register `tensor` under module.name as a
  // parameter / as a plain tensor attribute.
  static void setattr_param(nn::Module* module, const std::string& name, const Tensor& param);
  static void setattr_tensor(nn::Module* module, const std::string& name, const Tensor& tensor);
  void check_sharded(const Tensor& tensor, const char* what) const;
  void check_unsharded(const Tensor& tensor, const char* what) const;

  nn::Module* fully_sharded_module_;
  Options options_;
  int rank_ = 0;
  int world_size_ = 1;
  DType orig_param_dtype_ = DType::kFloat32;
  DType fwd_bwd_param_dtype_ = DType::kFloat32;
  DType reduce_dtype_ = DType::kFloat32;
  bool low_prec_param_dtype_specified_ = false;
  bool low_prec_reduce_dtype_specified_ = false;
  int64_t aligned_numel_ = 0;

  Tensor flat_param_;
  FlatParamLayout layout_;
  std::vector<ParamInfo> param_infos_;
  std::vector<SharedParamInfo> shared_param_infos_;
  std::vector<std::string> fqns_;
  std::vector<Shape> shapes_;
  std::vector<int64_t> numels_;
  std::vector<std::optional<tensor_parallel::DTensor>> param_extensions_;
  // use_orig_params: the original parameter tensors, their shared registrations, the views
  // saved in forward for pre-backward, and which gradients were None at writeback.
  std::vector<Tensor> params_;
  std::vector<Tensor> shared_params_;
  std::vector<Tensor> tensors_;
  std::vector<bool> is_grad_none_mask_;

  // Shard metadata (set by shard()).
  bool sharded_ = false;
  int64_t sharded_numel_ = 0;
  int64_t shard_numel_padded_ = 0;
  std::vector<ShardParamInfo> shard_param_infos_;

  // Lazy-init attributes.
  Tensor local_shard_;
  Tensor mp_shard_;
  Tensor full_param_padded_;
  Tensor full_prec_full_param_padded_;
  Tensor unsharded_flat_param_for_skipped_views_;
  Tensor cpu_unsharded_flat_param_;  // to_cpu()'s copy
};

}  // namespace fsdp::fsdp1
