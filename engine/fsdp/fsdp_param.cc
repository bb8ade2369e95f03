#include "engine/fsdp/fsdp_param.h"

#include <algorithm>
#include <mutex>
#include <unordered_map>

#include "engine/autograd/variable.h"
#include "engine/core/error.h"
#include "engine/core/rank_context.h"
#include "engine/nn/module.h"
#include "engine/ops/elementwise.h"
#include "engine/ops/shape_ops.h"
#include "engine/tensor_parallel/dtensor_parameter.h"

namespace fsdp::fsdp2 {

namespace internal {

// The calling rank's map from sharded parameter (TensorImpl identity) to its FsdpParam.
struct ShardedParamRegistry {
  std::mutex mu;
  std::unordered_map<const TensorImpl*, FsdpParam*> params;
};

// RankContext slot holding the rank's registry (shared with the FsdpParams so that one
// destroyed on another thread still unregisters from the right rank).
struct ShardedParamRegistrySlot {
  std::shared_ptr<ShardedParamRegistry> registry = std::make_shared<ShardedParamRegistry>();
};

}  // namespace internal

namespace {

std::shared_ptr<internal::ShardedParamRegistry> CurrentRegistry() {
  return RankContext::Current().slot<internal::ShardedParamRegistrySlot>().registry;
}

}  // namespace

FsdpParam* LookupFsdpParam(const Tensor& tensor) {
  if (!tensor.defined()) return nullptr;
  auto registry = CurrentRegistry();
  std::lock_guard<std::mutex> lock(registry->mu);
  auto it = registry->params.find(tensor.impl());
  return it == registry->params.end() ? nullptr : it->second;
}

FsdpParam::FsdpParam(const Tensor& param, ParamModuleInfo module_info,
                     const FsdpMeshInfo& mesh_info,
                     std::optional<FsdpMeshInfo> post_forward_mesh_info, Device device,
                     const OffloadPolicy& offload_policy,
                     const std::optional<tensor_parallel::Placement>& fsdp_placement)
    : fqn_(module_info.param_name),
      module_info_(std::move(module_info)),
      mesh_info_(mesh_info),
      post_forward_mesh_info_(std::move(post_forward_mesh_info)),
      device_(device),
      offload_policy_(offload_policy),
      registry_(CurrentRegistry()) {
  FSDP_CHECK(param.defined(), "fully_shard: parameter ", fqn_, " is None");
  FSDP_CHECK(param.dim() > 0, "fully_shard doesn't support salar parameters. Change ", fqn_,
             " to a 1D tensor with numel equal to 1.");
  global_shape_ = param.sizes();
  if (auto dtensor = tensor_parallel::GetDTensorParameter(*module_info_.module,
                                                          module_info_.param_name);
      dtensor && dtensor->local_tensor().is_same(param)) {
    tp_sharding_ = MakeTpSharding(*dtensor, mesh_info_,
                                  module_info_.fqn.empty() ? fqn_ : module_info_.fqn);
  }
  const int world = mesh_info_.shard_mesh_size;
  int64_t shard_dim = 0;
  if (fsdp_placement) {
    FSDP_CHECK(fsdp_placement->is_shard(), "shard_placement_fn must return Shard or None but "
               "returned ", fsdp_placement->str(), " for parameter ", error_fqn());
    const int64_t ndim = param.dim();
    shard_dim = fsdp_placement->dim() < 0 ? fsdp_placement->dim() + ndim : fsdp_placement->dim();
    FSDP_CHECK(shard_dim >= 0 && shard_dim < ndim, "Shard dim ", fsdp_placement->dim(),
               " is invalid for ", ndim, "D tensor: ", ShapeStr(global_shape_), " (parameter ",
               error_fqn(), ")");
  }
  FSDP_CHECK(shard_dim == 0 || !tp_sharding_, "fully_shard: parameter ", error_fqn(),
             " is tensor-parallel (", tp_sharding_ ? tp_sharding_->placements_str() : "",
             "); shard_placement_fn may only return Shard(0) or None for it");
  FSDP_CHECK(shard_dim == 0 || global_shape_[shard_dim] % world == 0,
             "FSDP does not support uneven sharding on dim ", shard_dim, ": ",
             ShapeStr(global_shape_), " (world size: ", world, ") for parameter ", error_fqn());
  shard_info_ = ComputeShardInfo(global_shape_, mesh_info_.shard_mesh_rank, world, shard_dim);
  orig_dtype_ = param.dtype();
  const Tensor local =
      shard_dim == 0 ? param.narrow(0, shard_info_.row_begin, shard_info_.rows)
                     : ops::kernels::Narrow(param, shard_dim, shard_info_.row_begin,
                                            shard_info_.rows);
  sharded_param_ = Tensor(std::make_shared<TensorImpl>());
  init_sharded_data(local, sharded_param_);
  if (param.requires_grad()) sharded_param_.set_requires_grad(true);
  if (tp_sharding_) release_tp_local_param(param);
  register_sharded_param();
  setattr_on_modules(sharded_param_);
}

void FsdpParam::release_tp_local_param(const Tensor& param) {
  // PyTorch replaces the module's DTensor parameter by the sharded one, dropping the TP-local
  // tensor; here the style's DTensor registry keeps the TP spec for the hooks, over a local
  // tensor of the TP-local shape without storage (the values now live in the sharded data).
  Tensor spec_only = Tensor::empty(param.sizes(), param.dtype(), param.device());
  spec_only.storage()->Resize(0);
  tensor_parallel::RegisterDTensorParameter(
      *module_info_.module, module_info_.param_name,
      tensor_parallel::DTensor::from_local(spec_only, tp_sharding_->tp_mesh,
                                           {tp_sharding_->tp_placement},
                                           tp_sharding_->global_shape));
}

FsdpParam::~FsdpParam() { unregister_sharded_param(); }

void FsdpParam::register_sharded_param() {
  std::lock_guard<std::mutex> lock(registry_->mu);
  registry_->params[sharded_param_.impl()] = this;
}

void FsdpParam::unregister_sharded_param() {
  std::lock_guard<std::mutex> lock(registry_->mu);
  auto it = registry_->params.find(sharded_param_.impl());
  if (it != registry_->params.end() && it->second == this) registry_->params.erase(it);
}

void FsdpParam::init_sharded_data(const Tensor& local, const Tensor& target) {
  FSDP_CHECK(local.sizes() == shard_info_.sharded_shape, "FSDP parameter ", fqn_,
             ": expected a local shard of shape ", ShapeStr(shard_info_.sharded_shape), " but got ",
             ShapeStr(local.sizes()));
  const Device data_device = offload_policy_.offload_to_cpu ? Device::CPU() : device_;
  Tensor padded = Tensor::zeros(shard_info_.padded_shard_shape, local.dtype(), data_device);
  // Pinned so that the all-gather copy-in's upload is asynchronous (no effect on a CPU device).
  if (offload_policy_.offload_to_cpu && offload_policy_.pin_memory && device_.is_cuda()) {
    padded = padded.pin_memory();
  }
  if (shard_info_.rows > 0) unpadded_rows(padded).copy_(local);
  sharded_param_data_ = padded.flatten();
  TensorImpl* impl = target.impl();
  impl->storage = padded.storage();
  impl->storage_offset = 0;
  impl->sizes = shard_info_.sharded_shape;
  impl->dtype = local.dtype();
}

Tensor FsdpParam::unpadded_rows(const Tensor& padded) const {
  if (shard_info_.rows == shard_info_.chunk_rows) return padded;
  FSDP_INTERNAL_ASSERT(shard_info_.shard_dim == 0, "uneven shard of ", fqn_, " on dim ",
                       shard_info_.shard_dim);
  return padded.narrow(0, 0, shard_info_.rows);
}

const std::string& FsdpParam::error_fqn() const {
  return module_info_.fqn.empty() ? fqn_ : module_info_.fqn;
}

Tensor FsdpParam::unshard_all_gathered(const Tensor& gathered, int world_size) const {
  if (shard_info_.shard_dim == 0) {
    return gathered.narrow(0, 0, Numel(global_shape_)).view(global_shape_);
  }
  const int64_t n = shard_info_.padded_shard_numel();
  FSDP_INTERNAL_ASSERT(gathered.numel() == n * world_size, "all-gather of ", fqn_, " has ",
                       gathered.numel(), " elements, expected ", n * world_size);
  std::vector<Tensor> chunks;
  chunks.reserve(world_size);
  for (int k = 0; k < world_size; ++k) {
    chunks.push_back(gathered.narrow(0, k * n, n).view(shard_info_.padded_shard_shape));
  }
  return ops::kernels::Cat(chunks, shard_info_.shard_dim);
}

void FsdpParam::set_post_forward_mesh_info(std::optional<FsdpMeshInfo> info) {
  post_forward_mesh_info_ = std::move(info);
}

void FsdpParam::reset_sharded_param() {
  const Tensor current = module_info_.module->parameter(module_info_.param_name);
  if (sharded_state_ != ShardedState::kSharded || !current.defined()) return;
  if (!current.is_same(sharded_param_)) {
    FSDP_CHECK(current.sizes() == shard_info_.sharded_shape, "FSDP parameter ", fqn_,
               " was replaced by a tensor of shape ", ShapeStr(current.sizes()),
               " but its local shard has shape ", ShapeStr(shard_info_.sharded_shape));
    unregister_sharded_param();
    sharded_param_ = current;
    register_sharded_param();
  }
  // Every shared location of a tied weight holds the sharded parameter again (a load with
  // assign=True installs one tensor per key; the owner's wins).
  for (size_t i = 0; i < module_info_.shared_modules.size(); ++i) {
    nn::Module* m = module_info_.shared_modules[i];
    if (!m->parameter(module_info_.shared_param_names[i]).is_same(sharded_param_)) {
      m->set_parameter(module_info_.shared_param_names[i], sharded_param_);
    }
  }
  // Re-pad when the sharded parameter no longer views the padded buffer (replaced, or its
  // data swapped by Module::to).
  if (sharded_param_.storage() != sharded_param_data_.storage() ||
      sharded_param_.dtype() != sharded_param_data_.dtype() ||
      sharded_param_.storage_offset() != 0) {
    const Tensor local = sharded_param_.detach().clone();
    init_sharded_data(local, sharded_param_);
  }
  orig_dtype_ = sharded_param_.dtype();
}

void FsdpParam::init_dtype_attrs(const MixedPrecisionPolicy& mp_policy, Semantics semantics) {
  orig_dtype_ = sharded_param_.dtype();
  std::optional<DType> param_dtype = mp_policy.param_dtype;
  std::optional<DType> reduce_dtype = mp_policy.reduce_dtype;
  const bool reduces_in_param_dtype = ReducesInParamDtypeWhenReduceDtypeUnset(semantics);
  // Gradients are computed in param_dtype, so a reduce_dtype equal to it needs no cast; unset
  // then means the same (not under torch-2.15, where unset means the original dtype).
  if (reduces_in_param_dtype && reduce_dtype == param_dtype) reduce_dtype.reset();
  if (param_dtype == orig_dtype_ || !IsFloatingPoint(orig_dtype_)) param_dtype.reset();
  // torch-2.15: an unset reduce_dtype is the original dtype (PyTorch 2.15's
  // FSDPParam.unsharded_grad_dtype): gradients computed in param_dtype are upcast to it to
  // accumulate across backwards without sync and to be reduced.
  if (!reduces_in_param_dtype && !reduce_dtype && param_dtype) reduce_dtype = orig_dtype_;
  param_dtype_ = param_dtype;
  reduce_dtype_ = reduce_dtype;
  keeps_unsharded_grad_in_reduce_dtype_ = KeepsUnshardedGradInReduceDtype(semantics);
}

std::vector<Tensor> FsdpParam::all_gather_inputs() const {
  if (sharded_state_ == ShardedState::kShardedPostForward) {
    return {sharded_post_forward_param_data_};
  }
  FSDP_CHECK_CODE(ErrorCode::kFailedPrecondition, sharded_state_ == ShardedState::kSharded,
                  "FSDP parameter ", fqn_, ": all-gather inputs requested in state ",
                  ShardedStateName(sharded_state_));
  Tensor input = sharded_param_data_;
  if (input.device() != device_) input = input.to(device_, /*non_blocking=*/true);
  if (param_dtype_) input = input.to(*param_dtype_);
  return {input};
}

void FsdpParam::init_all_gather_outputs(const std::vector<int64_t>& input_numels,
                                        const std::vector<DType>& input_dtypes, int world_size) {
  if (!all_gather_outputs_.empty()) return;  // persistent after the first all-gather
  FSDP_INTERNAL_ASSERT(input_numels.size() == input_dtypes.size());
  for (size_t i = 0; i < input_numels.size(); ++i) {
    all_gather_output_numels_.push_back(input_numels[i] * world_size);
    all_gather_outputs_.push_back(
        Tensor::empty_uninitialized({input_numels[i] * world_size}, input_dtypes[i], device_));
  }
}

void FsdpParam::alloc_all_gather_outputs() {
  // Uninitialised (PyTorch's alloc_storage, resize_): the copy-out writes every element.
  for (size_t i = 0; i < all_gather_outputs_.size(); ++i) {
    const Tensor& t = all_gather_outputs_[i];
    t.storage()->Resize(static_cast<size_t>(all_gather_output_numels_[i]) * t.element_size(),
                        AllocInit::kUninitialized);
  }
}

void FsdpParam::free_unsharded_param() {
  for (const Tensor& t : all_gather_outputs_) t.storage()->Resize(0);
}

void FsdpParam::init_unsharded_param() {
  if (unsharded_param_.defined()) return;  // same object across iterations
  FSDP_INTERNAL_ASSERT(!all_gather_outputs_.empty(), "for ", fqn_);
  unsharded_param_ =
      all_gather_outputs_[0].narrow(0, 0, Numel(global_shape_)).view(global_shape_);
  if (sharded_param_.requires_grad()) unsharded_param_.set_requires_grad(true);
}

const Tensor& FsdpParam::unsharded_param() const {
  FSDP_CHECK_CODE(ErrorCode::kFailedPrecondition, unsharded_param_.defined(), "FSDP parameter ",
                  fqn_, " has no unsharded parameter yet (it was never all-gathered)");
  return unsharded_param_;
}

void FsdpParam::setattr_on_modules(const Tensor& tensor) {
  module_info_.module->set_parameter(module_info_.param_name, tensor);
  for (size_t i = 0; i < module_info_.shared_modules.size(); ++i) {
    module_info_.shared_modules[i]->set_parameter(module_info_.shared_param_names[i], tensor);
  }
}

void FsdpParam::to_sharded() {
  setattr_on_modules(sharded_param_);
  free_unsharded_param();
  sharded_post_forward_param_ = Tensor();
  sharded_post_forward_param_data_ = Tensor();
  sharded_state_ = ShardedState::kSharded;
}

void FsdpParam::to_sharded_post_forward() {
  FSDP_CHECK_CODE(ErrorCode::kFailedPrecondition, sharded_state_ == ShardedState::kUnsharded,
                  "FSDP parameter ", fqn_, ": expects UNSHARDED to reshard to the post-forward "
                  "mesh but got ", ShardedStateName(sharded_state_));
  FSDP_INTERNAL_ASSERT(post_forward_mesh_info_.has_value(), "for ", fqn_);
  const int k = post_forward_mesh_info_->shard_mesh_size;
  const int j = post_forward_mesh_info_->shard_mesh_rank;
  const Tensor& output = all_gather_outputs_.at(0);
  const int64_t numel = output.numel();
  FSDP_INTERNAL_ASSERT(numel % k == 0, "all-gather output numel ", numel, " of ", fqn_,
                       " is not divisible by the post-forward size ", k);
  const int64_t slice = numel / k;
  // Clone so that the all-gather output can be freed.
  sharded_post_forward_param_data_ = output.narrow(0, slice * j, slice).clone();
  if (shard_info_.shard_dim == 0) {
    // Rows of the global parameter this slice covers (the slice is W/k padded shards).
    const int64_t slice_rows = shard_info_.chunk_rows * (mesh_info_.shard_mesh_size / k);
    const int64_t rows = std::clamp<int64_t>(global_shape_[0] - slice_rows * j, 0, slice_rows);
    Shape shape = global_shape_;
    shape[0] = rows;
    sharded_post_forward_param_ =
        sharded_post_forward_param_data_.narrow(0, 0, rows * shard_info_.row_numel).view(shape);
  } else {
    // Shard(d > 0): the output holds the unsharded parameter (no padding), so the slice is a
    // flat piece of it, not whole rows of any dim; the post-forward all-gather over the k
    // ranks rebuilds the unsharded parameter without a chunk-cat.
    sharded_post_forward_param_ = sharded_post_forward_param_data_.view({slice});
  }
  if (sharded_param_.requires_grad()) sharded_post_forward_param_.set_requires_grad(true);
  setattr_on_modules(sharded_post_forward_param_);
  free_unsharded_param();
  sharded_state_ = ShardedState::kShardedPostForward;
}

void FsdpParam::to_unsharded() {
  Tensor unsharded = unsharded_param();
  if (unsharded.requires_grad() != sharded_param_.requires_grad()) {
    unsharded.set_requires_grad(sharded_param_.requires_grad());
  }
  setattr_on_modules(unsharded);
  if (sharded_state_ == ShardedState::kShardedPostForward) {
    sharded_post_forward_param_ = Tensor();
    sharded_post_forward_param_data_ = Tensor();  // free
  }
  sharded_state_ = ShardedState::kUnsharded;
}

Tensor FsdpParam::unsharded_grad() const {
  if (!unsharded_param_.defined()) return Tensor();
  return unsharded_param_.grad();
}

void FsdpParam::to_accumulated_grad_if_needed() {
  if (!reduce_dtype_ || !unsharded_param_.defined()) return;
  const Tensor grad = unsharded_param_.grad();
  if (!grad.defined() || grad.dtype() == *reduce_dtype_) return;
  if (keeps_unsharded_grad_in_reduce_dtype_) {
    // torch-2.15: the gradient stays in .grad, in the reduce dtype (the unsharded parameter's
    // grad_dtype there, so Tensor::set_grad's same-dtype check does not apply); AccumulateGrad
    // adds the next backward's gradient into it in that dtype (grad_kernels Add casts to the
    // target's).
    autograd::materialize_autograd_meta(unsharded_param_).grad = grad.to(*reduce_dtype_);
    return;
  }
  unsharded_param_.set_grad(Tensor());
  unsharded_accumulated_grad_ = grad.to(*reduce_dtype_);
}

void FsdpParam::accumulate_unsharded_grad_if_needed() {
  if (!unsharded_accumulated_grad_.defined() || !unsharded_param_.defined()) return;
  const Tensor grad = unsharded_param_.grad();
  if (!grad.defined()) return;
  unsharded_accumulated_grad_.copy_(ops::kernels::Add(unsharded_accumulated_grad_, grad));
  unsharded_param_.set_grad(Tensor());
}

void FsdpParam::accumulate_sharded_grad(const Tensor& new_sharded_grad) {
  Tensor grad = new_sharded_grad;
  Tensor existing = sharded_param_.grad();
  if (offload_policy_.offload_to_cpu && !grad.device().is_cpu()) {
    // Overlap the copy only when nothing is accumulated into on the host next.
    const bool non_blocking = offload_policy_.pin_memory && !existing.defined();
    grad = grad.to(Device::CPU(), non_blocking);
    if (non_blocking) grad_offload_event_ = CommStream::Current(device_).record_event();
  }
  if (existing.defined()) {
    existing.copy_(ops::kernels::Add(existing, grad));
  } else {
    sharded_param_.set_grad(grad);
  }
  // Autograd never accumulates into the sharded parameter, so FSDP runs its
  // post-accumulate-grad hooks itself (docs/fsdp-behaviour.md, "Post-accumulate-grad hooks").
  autograd::AutogradMeta* meta = autograd::get_autograd_meta(sharded_param_);
  if (meta != nullptr && meta->post_accumulate_grad_hooks) {
    wait_for_grad_offload();  // a hook may read the gradient on the host at once
    for (const auto& hook : meta->post_accumulate_grad_hooks->snapshot()) hook(sharded_param_);
  }
}

void FsdpParam::wait_for_grad_offload() {
  if (!grad_offload_event_) return;
  grad_offload_event_->synchronize();
  grad_offload_event_.reset();
}

const Shape& FsdpParam::tensor_shape() const {
  return tp_sharding_ ? tp_sharding_->global_shape : global_shape_;
}

Shape FsdpParam::tensor_offsets() const {
  if (tp_sharding_) return tp_sharding_->global_offsets(shard_info_.row_begin);
  Shape offsets(global_shape_.size(), 0);
  offsets[shard_info_.shard_dim] = shard_info_.row_begin;
  return offsets;
}

Tensor FsdpParam::full_tensor() const {
  const auto& group = mesh_info_.shard_process_group;
  const int world = mesh_info_.shard_mesh_size;
  Tensor input = sharded_param_data_.to(device_);
  Tensor output = Tensor::empty_uninitialized({input.numel() * world}, input.dtype(), device_);
  group->all_gather_into_tensor(output, input);
  const Tensor unsharded = unshard_all_gathered(output, world);
  return tp_sharding_ ? tp_sharding_->full_tensor(unsharded) : unsharded;
}

Tensor FsdpParam::full_grad() const {
  const Tensor grad = sharded_param_.grad();
  if (!grad.defined()) return Tensor();
  const auto& group = mesh_info_.shard_process_group;
  const int world = mesh_info_.shard_mesh_size;
  Tensor padded = Tensor::zeros(shard_info_.padded_shard_shape, grad.dtype(), device_);
  if (shard_info_.rows > 0) unpadded_rows(padded).copy_(grad);
  Tensor output = Tensor::empty_uninitialized({padded.numel() * world}, grad.dtype(), device_);
  group->all_gather_into_tensor(output, padded.flatten());
  const Tensor unsharded = unshard_all_gathered(output, world);
  return tp_sharding_ ? tp_sharding_->full_tensor(unsharded) : unsharded;
}

}  // namespace fsdp::fsdp2
