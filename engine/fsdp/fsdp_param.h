// FsdpParam: one parameter managed by fully_shard (PyTorch's FSDPParam), in its three forms
// (docs/fsdp-behaviour.md, "Dim-0 sharding" through "Reduce-scatter", "Int
// reshard_after_forward" and "shard_placement_fn"):
//
//  * sharded: a zero-padded buffer of [c, *rest] rows (c = ceil(d0 / W)) holding this rank's
//    torch.chunk rows at the top; the registered sharded parameter is a leaf view of its first
//    `rows` rows (shape [rows, *rest], possibly [0, *rest]). It carries DTensor-like metadata:
//    shard group, placement Shard(0), global shape; full_tensor() all-gathers it. Optimizers
//    step it in place, which writes the padded buffer (padding rows stay zero).
//    With a placement Shard(d), d > 0 (fully_shard's shard_placement_fn), the buffer is this
//    rank's torch.chunk(param, W, dim=d) piece, contiguous and unpadded (the size along d
//    must divide by W); the all-gather output is chunk-cat'ed along d into the unsharded
//    parameter, and the gradient is chunk-cat'ed to dim 0 before the reduce-scatter.
//  * unsharded: one persistent 1-D all-gather output of W * c * rest elements (param dtype)
//    and the unsharded parameter, a leaf view of its first d0 rows with the original shape.
//    Both are created on the first all-gather and keep their identity forever: freeing and
//    re-allocating is done by resizing their shared Storage to 0 bytes and back, so anything
//    autograd saved keeps aliasing the same tensor. Copy-out never bumps the version counter.
//  * sharded post-forward (int reshard_after_forward = k): slice (post-forward rank) of the k
//    equal slices of the padded unsharded buffer, cloned, used as the all-gather input over the
//    k-rank post-forward group.
//
// A tensor-parallel parameter (a DTensor over the TP mesh, engine/tensor_parallel) is sharded
// the same way on its TP-local tensor: global_shape() is then the TP-local shape (PyTorch's
// `_orig_size`), and tp_sharding() holds the 2-D spec (tp_sharding.h). The unsharded parameter
// is the TP-local tensor again, which the parallel styles consume; its gradient arrives in the
// TP placement (see tp_sharding.h), so the reduce-scatter over dp needs no redistribution.
// The style's DTensor (GetDTensorParameter) keeps only the TP spec afterwards: its local tensor
// has the TP-local shape and no storage.
//
// It also records where it is registered: the owning (module, attribute) and every shared
// location of a tied weight; every swap (sharded ↔ unsharded) sets all of them.
//
// Ownership: owned by its FsdpParamGroup (std::unique_ptr). Holds raw pointers to the modules
// it is registered on (the modules own the group through their FSDP state, so they outlive
// it). Registers its sharded parameter in the rank's sharded-parameter registry
// (LookupFsdpParam) for its lifetime.
// Thread-safety: used by its rank's thread only.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/core/tensor.h"
#include "engine/fsdp/comm_context.h"
#include "engine/fsdp/fsdp_api.h"
#include "engine/fsdp/mesh_info.h"
#include "engine/fsdp/semantics.h"
#include "engine/fsdp/shard_layout.h"
#include "engine/fsdp/tp_sharding.h"
#include "engine/fsdp/training_state.h"
#include "engine/tensor_parallel/placement.h"

namespace fsdp::nn {
class Module;
}

namespace fsdp::fsdp2 {

// Where a parameter is registered: module.param_name, plus shared (tied) locations.
struct ParamModuleInfo {
  nn::Module* module = nullptr;
  std::string param_name;
  std::vector<nn::Module*> shared_modules;
  std::vector<std::string> shared_param_names;
  // The FQN under the module fully_shard was applied to ("0.in_proj.weight"), naming the
  // parameter in fully_shard's errors. Default: empty (the attribute name is used).
  std::string fqn;
};

namespace internal {
struct ShardedParamRegistry;
}

class FsdpParam {
 public:
  // Shards `param` (the original leaf) immediately: allocates the padded sharded buffer on
  // `device` (the CPU with CPU offload), copies this rank's rows and creates the sharded
  // parameter, which it registers on every location of `module_info`. Rejects 0-dim
  // parameters with PyTorch's message. A parameter a parallel style registered as a DTensor
  // (GetDTensorParameter) is sharded on its TP-local tensor (MakeTpSharding checks the meshes).
  // `fsdp_placement`: shard_placement_fn's result for this parameter (nullopt: Shard(0)); a
  // negative dim is normalized; refused: a non-Shard placement, a dim outside the parameter,
  // uneven sharding on a dim > 0 (PyTorch's NotImplementedError) and a dim > 0 for a
  // tensor-parallel parameter.
  FsdpParam(const Tensor& param, ParamModuleInfo module_info, const FsdpMeshInfo& mesh_info,
            std::optional<FsdpMeshInfo> post_forward_mesh_info, Device device,
            const OffloadPolicy& offload_policy,
            const std::optional<tensor_parallel::Placement>& fsdp_placement = std::nullopt);
  ~FsdpParam();
  FsdpParam(const FsdpParam&) = delete;
  FsdpParam& operator=(const FsdpParam&) = delete;

  // ---- Identity ----
  // The parameter FQN from the lazy-init root ("layers.0.attention.wq.weight"); before lazy
  // init, the attribute name.
  const std::string& fqn() const { return fqn_; }
  void set_fqn(std::string fqn) { fqn_ = std::move(fqn); }
  const ParamModuleInfo& module_info() const { return module_info_; }

  // ---- Sharded form ----
  const Tensor& sharded_param() const { return sharded_param_; }
  // The padded sharded buffer, flattened ([c * rest] elements).
  const Tensor& sharded_param_data() const { return sharded_param_data_; }
  // The shape FSDP shards over its mesh: the parameter's, or a tensor-parallel parameter's
  // TP-local tensor's.
  const Shape& global_shape() const { return global_shape_; }
  // Set for a tensor-parallel parameter (FSDP × TP).
  const std::optional<TpSharding>& tp_sharding() const { return tp_sharding_; }
  bool is_dtensor() const { return tp_sharding_.has_value(); }
  // The shape of the full tensor (tp_sharding's global shape for a tensor-parallel parameter)
  // and the offsets of this rank's sharded parameter in it.
  const Shape& tensor_shape() const;
  Shape tensor_offsets() const;
  const ShardInfo& shard_info() const { return shard_info_; }
  // The FSDP placement over the shard mesh: Shard(dim), dim normalized (PyTorch's
  // `fsdp_placement`).
  tensor_parallel::Placement fsdp_placement() const {
    return tensor_parallel::Placement::Shard(shard_info_.shard_dim);
  }
  // The unsharded tensor (global_shape()) of `gathered`, the flat rank-major all-gather of
  // every rank's padded shard (W * padded numel elements): a view for Shard(0), else
  // torch.cat(torch.chunk(gathered.view([W * c0, ...]), W), dim=shard_dim) (a new tensor).
  Tensor unshard_all_gathered(const Tensor& gathered, int world_size) const;
  Shape padded_sharded_size() const { return shard_info_.padded_shard_shape; }
  const FsdpMeshInfo& mesh_info() const { return mesh_info_; }
  const std::optional<FsdpMeshInfo>& post_forward_mesh_info() const {
    return post_forward_mesh_info_;
  }
  void set_post_forward_mesh_info(std::optional<FsdpMeshInfo> info);
  ShardedState sharded_state() const { return sharded_state_; }
  bool offload_to_cpu() const { return offload_policy_.offload_to_cpu; }

  // DTensor.full_tensor(): all-gathers the sharded parameter over the shard group (a
  // collective: every rank of the group must call it) and returns the global tensor; for a
  // tensor-parallel parameter then all-gathers the TP-local tensor over tp as well.
  Tensor full_tensor() const;
  // The same for the sharded gradient (undefined when this rank has none; all ranks must
  // agree on whether it exists).
  Tensor full_grad() const;

  // `reset_sharded_param`: if the module slot holds a different tensor than sharded_param()
  // (load_state_dict(assign=True), Module::to), adopts it as the sharded parameter and
  // re-pads it into a fresh padded buffer (the tensor is rebound to view that buffer).
  void reset_sharded_param();

  // ---- Dtypes (docs/fsdp-behaviour.md, "Dtypes"; computed at lazy init) ----
  // `semantics` decides what an unset reduce_dtype means (ReducesInParamDtypeWhenReduceDtypeUnset).
  void init_dtype_attrs(const MixedPrecisionPolicy& mp_policy, Semantics semantics);
  DType orig_dtype() const { return orig_dtype_; }
  // Unset when equal to the original dtype or when the parameter is not floating point.
  const std::optional<DType>& param_dtype() const { return param_dtype_; }
  // The dtype gradients are accumulated (without sync) and reduced in; unset: the gradient's
  // own, param_dtype when set. torch-2.4 / torch-2.8: the policy's reduce_dtype, unset when
  // equal to the policy's param_dtype. torch-2.15: the policy's reduce_dtype, else the
  // original dtype when param_dtype is set (unset otherwise: gradients have that dtype).
  const std::optional<DType>& reduce_dtype() const { return reduce_dtype_; }
  DType unsharded_dtype() const { return param_dtype_.value_or(orig_dtype_); }

  // ---- All-gather ----
  // The all-gather inputs (one tensor, flat, on the compute device, in the param dtype): the
  // padded sharded data when SHARDED, the post-forward shard when SHARDED_POST_FORWARD.
  std::vector<Tensor> all_gather_inputs() const;
  // Creates the persistent all-gather outputs (once; same numels and dtypes afterwards).
  void init_all_gather_outputs(const std::vector<int64_t>& input_numels,
                               const std::vector<DType>& input_dtypes, int world_size);
  const std::vector<Tensor>& all_gather_outputs() const { return all_gather_outputs_; }
  // Re-allocates the (freed) storage of the all-gather outputs, uninitialised: the all-gather
  // copy-out overwrites every element next.
  void alloc_all_gather_outputs();
  // Frees the storage of the all-gather outputs (and so of the unsharded parameter).
  void free_unsharded_param();
  // Creates the unsharded parameter on the first call (a view of all_gather_outputs()[0]);
  // later calls keep the same tensor.
  void init_unsharded_param();
  bool has_unsharded_param() const { return unsharded_param_.defined(); }
  const Tensor& unsharded_param() const;

  // ---- Transitions (the group keeps its own state equal to its params') ----
  void to_sharded();
  void to_sharded_post_forward();
  void to_unsharded();

  // ---- Gradients ----
  // The unsharded gradient of the last backward(s) (undefined when none).
  Tensor unsharded_grad() const;
  // Gradient accumulation without reduction with a reduce dtype (docs/fsdp-behaviour.md,
  // "Mixed precision").
  const Tensor& unsharded_accumulated_grad() const { return unsharded_accumulated_grad_; }
  void clear_unsharded_accumulated_grad() { unsharded_accumulated_grad_ = Tensor(); }
  void to_accumulated_grad_if_needed();
  void accumulate_unsharded_grad_if_needed();
  // Sets or accumulates the new gradient shard (shape = sharded_param's) into the sharded
  // parameter's .grad (moved to the CPU with offload), then runs the sharded parameter's
  // post-accumulate-grad hooks once. With CPU offload, pin_memory and no gradient to
  // accumulate into, the device-to-host copy is non-blocking into pinned memory and
  // grad_offload_event is recorded on the current (reduce-scatter) stream, as FSDP2 does; the
  // hooks, if any, wait for it first (FSDP2 runs them without waiting).
  void accumulate_sharded_grad(const Tensor& new_sharded_grad);
  // Blocks the host until the non-blocking gradient offload finished (finalize_backward: the
  // CPU optimizer reads the gradient next). A no-op when none is pending.
  void wait_for_grad_offload();

 private:
  // Re-registers the style's DTensor of a tensor-parallel parameter over a storage-less local
  // tensor, so the TP-local tensor `param` is not kept alive beside the sharded data.
  void release_tp_local_param(const Tensor& param);
  // Sets `tensor` into every registered location of this parameter.
  void setattr_on_modules(const Tensor& tensor);
  void register_sharded_param();
  void unregister_sharded_param();
  // Creates the padded buffer for `local` (this rank's rows) and rebinds `target` to view it.
  void init_sharded_data(const Tensor& local, const Tensor& target);
  // The view of a padded shard buffer (padded_sharded_size()) holding this rank's rows (only
  // dim 0 may be uneven, so for a dim > 0 the whole buffer).
  Tensor unpadded_rows(const Tensor& padded) const;
  // fqn for errors: the FQN under the module fully_shard was applied to, else fqn().
  const std::string& error_fqn() const;

  std::string fqn_;
  ParamModuleInfo module_info_;
  FsdpMeshInfo mesh_info_;
  std::optional<FsdpMeshInfo> post_forward_mesh_info_;
  Device device_;
  OffloadPolicy offload_policy_;
  Shape global_shape_;
  std::optional<TpSharding> tp_sharding_;
  ShardInfo shard_info_;
  ShardedState sharded_state_ = ShardedState::kSharded;

  Tensor sharded_param_;
  Tensor sharded_param_data_;  // pinned with CPU offload + pin_memory on a CUDA device
  std::optional<CommEvent> grad_offload_event_;
  DType orig_dtype_ = DType::kFloat32;
  std::optional<DType> param_dtype_;
  std::optional<DType> reduce_dtype_;
  // KeepsUnshardedGradInReduceDtype of the group's semantics (init_dtype_attrs).
  bool keeps_unsharded_grad_in_reduce_dtype_ = false;

  std::vector<Tensor> all_gather_outputs_;
  std::vector<int64_t> all_gather_output_numels_;
  Tensor unsharded_param_;
  Tensor sharded_post_forward_param_data_;
  Tensor sharded_post_forward_param_;
  Tensor unsharded_accumulated_grad_;

  std::shared_ptr<internal::ShardedParamRegistry> registry_;
};

// The FsdpParam whose sharded parameter is `tensor` on the calling rank (nullptr if none).
FsdpParam* LookupFsdpParam(const Tensor& tensor);

}  // namespace fsdp::fsdp2
