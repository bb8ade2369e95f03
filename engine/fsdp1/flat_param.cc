#include "engine/fsdp1/flat_param.h"

#include <set>
#include <unordered_map>

#include "engine/autograd/grad_mode.h"
#include "engine/autograd/node.h"
#include "engine/autograd/variable.h"
#include "engine/core/error.h"
#include "engine/fsdp1/dtensor_extensions.h"
#include "engine/fsdp1/tensor_data.h"
#include "engine/functional/functional.h"
#include "engine/nn/module.h"

namespace fsdp::fsdp1 {
namespace {

// `_FLAT_PARAM_PADDING_VALUE`: alignment padding is filled with it (never used in compute).
constexpr double kFlatParamPaddingValue = 42.0;

bool SameStorage(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() && a.storage() == b.storage();
}

// `_same_storage_size(t, numel)`: the storage is allocated with exactly numel elements.
bool StorageAllocatedWithNumel(const Tensor& t, int64_t numel) {
  return t.storage()->nbytes() == static_cast<size_t>(numel) * t.element_size();
}

void FreeStorage(const Tensor& t) { t.storage()->Resize(0); }

// `_alloc_storage`: `init` says whether the new storage is zeroed or left for an overwrite.
void AllocStorage(const Tensor& t, int64_t numel, AllocInit init) {
  t.storage()->Resize(static_cast<size_t>(numel) * t.element_size(), init);
}

// A persistent 1-D buffer whose storage starts freed (`torch.empty(...)` + `_free_storage`).
Tensor FreedBuffer(int64_t numel, DType dtype, Device device) {
  Tensor t = Tensor::empty_uninitialized({numel}, dtype, device);
  FreeStorage(t);
  return t;
}

}  // namespace

// ---- Construction ------------------------------------------------------------------------

FlatParamHandle::FlatParamHandle(const std::vector<Tensor>& params,
                                 nn::Module* fully_sharded_module, Options options)
    : fully_sharded_module_(fully_sharded_module), options_(std::move(options)) {
  FSDP_CHECK(!params.empty(), "Cannot construct a FlatParamHandle with an empty parameter list");
  FSDP_CHECK(options_.process_group != nullptr, "FlatParamHandle: null process group");
  rank_ = options_.process_group->rank();
  world_size_ = options_.process_group->size();
  orig_param_dtype_ = params[0].dtype();
  init_param_reduce_dtypes();
  // Only align addresses for use_orig_params=True (as PyTorch).
  aligned_numel_ = options_.use_orig_params ? AlignedNumel(fwd_bwd_param_dtype_) : 0;
  init_flat_param_and_metadata(params);
  autograd::NoGradGuard no_grad;  // construction-time views need no graph
  use_unsharded_views(/*as_params=*/false);
}

void FlatParamHandle::init_param_reduce_dtypes() {
  low_prec_param_dtype_specified_ = options_.mp_param_dtype.has_value();
  low_prec_reduce_dtype_specified_ = options_.mp_reduce_dtype.has_value();
  if (low_prec_param_dtype_specified_ && !low_prec_reduce_dtype_specified_) {
    // FSDP1 infers the reduce dtype from the parameter dtype.
    fwd_bwd_param_dtype_ = *options_.mp_param_dtype;
    reduce_dtype_ = fwd_bwd_param_dtype_;
  } else {
    fwd_bwd_param_dtype_ = options_.mp_param_dtype.value_or(orig_param_dtype_);
    reduce_dtype_ = options_.mp_reduce_dtype.value_or(orig_param_dtype_);
  }
}

void FlatParamHandle::init_flat_param_and_metadata(const std::vector<Tensor>& params) {
  // `_validate_tensors_to_flatten`.
  std::optional<DType> dtype;
  std::optional<bool> requires_grad;
  std::optional<Device> device;
  for (const Tensor& t : params) {
    FSDP_CHECK(dtype.has_value() || IsFloatingPoint(t.dtype()),
               "Cannot flatten integer dtype tensors");
    FSDP_CHECK(!dtype || t.dtype() == *dtype, "Must flatten tensors with uniform dtype but got ",
               DTypeName(*dtype), " and ", DTypeName(t.dtype()));
    FSDP_CHECK(options_.use_orig_params || !requires_grad || t.requires_grad() == *requires_grad,
               "Must flatten tensors with uniform `requires_grad` when `use_orig_params=False`");
    FSDP_CHECK(!device || t.device() == *device, "Must flatten tensors on the same device but got "
               "both ", device->str(), " and ", t.device().str());
    dtype = t.dtype();
    requires_grad = requires_grad.value_or(false) || t.requires_grad();
    device = t.device();
  }
  std::set<const TensorImpl*> params_set;
  for (const Tensor& t : params) params_set.insert(t.impl());

  // Flattening order: pre-order over the module tree with duplicates, each module's own
  // parameters in registration order; a tensor met again is a shared registration.
  struct Primary {
    nn::Module* module;
    std::string module_name;
    std::string param_name;
  };
  std::unordered_map<const TensorImpl*, Primary> shared_param_memo;
  std::vector<Tensor> params_to_flatten;
  std::vector<Tensor> shared_params;
  for (const auto& [submodule_name, submodule] :
       fully_sharded_module_->named_modules("", /*remove_duplicate=*/false)) {
    for (const auto& [param_name, param] : submodule->parameter_slots()) {
      if (!param.defined() || !params_set.count(param.impl())) continue;
      if (auto it = shared_param_memo.find(param.impl()); it != shared_param_memo.end()) {
        shared_params.push_back(param);
        shared_param_infos_.push_back(SharedParamInfo{param_name, submodule.get(), submodule_name,
                                                      it->second.param_name, it->second.module,
                                                      it->second.module_name});
        continue;
      }
      shared_param_memo[param.impl()] = Primary{submodule.get(), submodule_name, param_name};
      params_to_flatten.push_back(param);
      param_infos_.push_back(ParamInfo{param_name, submodule.get(), submodule_name});
      numels_.push_back(param.numel());
      shapes_.push_back(param.sizes());
      fqns_.push_back(submodule_name.empty() ? param_name : submodule_name + "." + param_name);
      param_extensions_.push_back(
          PreFlattenTransform(*submodule, param_name, param, fqns_.back()));
    }
  }
  FSDP_CHECK(params_to_flatten.size() == params.size(),
             "`params` were not found in `module`'s tree: found ", params_to_flatten.size(),
             " of ", params.size(), " parameters in ", fully_sharded_module_->type_name());

  layout_ = ComputeFlatParamLayout(numels_, aligned_numel_, world_size_);
  Tensor flat = Tensor::empty({layout_.total_numel}, *dtype, *device);
  int64_t offset = 0;
  size_t next_param = 0;
  for (size_t i = 0; i < layout_.numels_with_padding.size(); ++i) {
    const int64_t numel = layout_.numels_with_padding[i];
    Tensor slot = flat.narrow(0, offset, numel);
    if (layout_.is_padding_mask[i]) {
      slot.fill_(kFlatParamPaddingValue);
    } else if (numel > 0) {
      slot.copy_(params_to_flatten[next_param].detach().flatten());
    }
    if (!layout_.is_padding_mask[i]) ++next_param;
    offset += numel;
  }
  flat_param_ = flat;
  flat_param_.set_requires_grad(*requires_grad);
  if (options_.use_orig_params) {
    params_ = params_to_flatten;
    shared_params_ = shared_params;
    is_grad_none_mask_.assign(params_.size(), false);
    tensors_.assign(params_.size(), Tensor());
  }
}

// ---- Shard initialization and metadata ---------------------------------------------------

void FlatParamHandle::shard() {
  if (!uses_sharded_strategy()) {
    init_shard_metadata(0, 0, flat_param_.numel() - 1);
  } else {
    const FlatParamShard shard = ComputeFlatParamShard(flat_param_.numel(), rank_, world_size_);
    Tensor sharded = Tensor::zeros({shard.padded_numel}, flat_param_.dtype(), flat_param_.device());
    if (shard.numel > 0) sharded.narrow(0, 0, shard.numel).copy_(flat_param_.narrow(0, shard.begin, shard.numel));
    SetData(flat_param_, sharded);
    init_shard_metadata(shard.numel_padded, shard.unsharded_start_idx(rank_),
                        shard.unsharded_end_idx(rank_));
  }
  if (options_.use_orig_params) use_sharded_views();
}

void FlatParamHandle::init_shard_metadata(int64_t numel_padded, int64_t unsharded_start_idx,
                                          int64_t unsharded_end_idx) {
  sharded_ = true;
  sharded_numel_ = flat_param_.numel();
  FSDP_INTERNAL_ASSERT(numel_padded <= sharded_numel_, "numel_padded: ", numel_padded,
                       " sharded_flat_param_numel: ", sharded_numel_);
  shard_param_infos_ = ComputeShardParamInfos(layout_, unsharded_start_idx, unsharded_end_idx);
  shard_numel_padded_ = numel_padded;
}

FlatParamShardMetadata FlatParamHandle::shard_metadata() const {
  FlatParamShardMetadata out;
  for (size_t i = 0; i < fqns_.size(); ++i) {
    const ShardParamInfo& info = shard_param_infos_.at(i);
    if (!info.in_shard) continue;
    out.param_names.push_back(fqns_[i]);
    out.param_shapes.push_back(shapes_[i]);
    out.param_numels.push_back(numels_[i]);
    out.param_offsets.emplace_back(info.intra_param_start_idx, info.intra_param_end_idx);
  }
  return out;
}

void FlatParamHandle::init_flat_param_attributes() {
  if (flat_param_.dtype() != orig_param_dtype_) {
    // The user changed the parameter dtype after construction (mixed-precision settings
    // take precedence).
    if (!low_prec_param_dtype_specified_) fwd_bwd_param_dtype_ = flat_param_.dtype();
    if (!low_prec_reduce_dtype_specified_ && !low_prec_param_dtype_specified_) {
      reduce_dtype_ = flat_param_.dtype();
    }
    orig_param_dtype_ = flat_param_.dtype();
  }
  if (options_.offload_params) {
    FSDP_CHECK_CODE(ErrorCode::kFailedPrecondition, flat_param_.device().is_cpu(),
                    "Expects the `FlatParameter` to be on CPU when parameter CPU offloading is "
                    "enabled, not ", flat_param_.device().str());
  }
  local_shard_ = flat_param_.detach();
  if (options_.offload_params) {
    // Pinned for asynchronous host-to-device copies (only meaningful with a CUDA device).
    if (device().is_cuda()) {
      local_shard_ = local_shard_.pin_memory();
      SetData(flat_param_, local_shard_);
      if (options_.use_orig_params) use_sharded_views();
    }
    cpu_grad = Tensor::zeros(local_shard_.sizes(), local_shard_.dtype(), Device::CPU());
    if (device().is_cuda()) cpu_grad = cpu_grad.pin_memory();
  }
  if (uses_param_mixed_precision()) {
    mp_shard_ = FreedBuffer(local_shard_.numel(), fwd_bwd_param_dtype_, device());
  }
  if (uses_sharded_strategy()) {
    const DType unsharded_dtype =
        uses_param_mixed_precision() ? fwd_bwd_param_dtype_ : flat_param_.dtype();
    full_param_padded_ = FreedBuffer(padded_unsharded_numel(), unsharded_dtype, device());
    if (uses_param_mixed_precision()) {
      full_prec_full_param_padded_ =
          FreedBuffer(padded_unsharded_numel(), flat_param_.dtype(), device());
    }
  }
}

bool FlatParamHandle::force_full_precision() const {
  return (uses_param_mixed_precision() || uses_reduce_mixed_precision()) &&
         training_state == HandleTrainingState::kSummonFullParams;
}

// ---- Unshard / reshard -------------------------------------------------------------------

bool FlatParamHandle::pre_unshard() {
  if (training_state == HandleTrainingState::kSummonFullParams && skipped_use_sharded_views()) {
    // summon_full_params forces full precision: start again from the sharded views.
    use_sharded_views();
  }
  bool ret = false;
  if (options_.use_orig_params) ret = writeback_orig_params();
  if (uses_sharded_strategy() && !options_.offload_params && !needs_unshard()) {
    // nothing to prepare: the unsharded flat parameter is still allocated
  } else if (uses_param_mixed_precision() && !force_full_precision()) {
    use_low_precision_shard();
    ret = true;
  } else if (options_.offload_params && flat_param_.device() != device()) {
    flat_param_to(device());
    ret = true;
  }
  return ret;
}

void FlatParamHandle::use_low_precision_shard() {
  AllocStorage(mp_shard_, local_shard_.numel(), AllocInit::kUninitialized);  // copied into next
  mp_shard_.copy_(local_shard_.to(device()).to(fwd_bwd_param_dtype_));
  SetData(flat_param_, mp_shard_);
}

void FlatParamHandle::unshard() {
  if (!needs_unshard()) {
    // Even without an all-gather, switch to the unsharded flat parameter.
    use_unsharded_flat_param(uses_sharded_strategy() ? padded_unsharded_flat_param()
                                                     : flat_param_);
    return;
  }
  Tensor unsharded = alloc_padded_unsharded_flat_param(AllocInit::kUninitialized);
  use_unsharded_flat_param(all_gather_flat_param(unsharded));
}

bool FlatParamHandle::needs_unshard() const {
  if (!uses_sharded_strategy()) return false;
  const Tensor& unsharded = padded_unsharded_flat_param();
  return !StorageAllocatedWithNumel(unsharded, unsharded.numel());
}

const Tensor& FlatParamHandle::padded_unsharded_flat_param() const {
  FSDP_INTERNAL_ASSERT(uses_sharded_strategy(), "expects a sharded strategy");
  FSDP_CHECK_CODE(ErrorCode::kFailedPrecondition, full_param_padded_.defined(),
                  "FSDP flat parameter of ", fully_sharded_module_->type_name(),
                  " has not been lazily initialized (run forward through the root first)");
  if (force_full_precision() && uses_param_mixed_precision()) return full_prec_full_param_padded_;
  return full_param_padded_;
}

Tensor FlatParamHandle::alloc_padded_unsharded_flat_param(AllocInit init) {
  Tensor unsharded = padded_unsharded_flat_param();
  if (force_full_precision() && uses_param_mixed_precision() &&
      full_param_padded_.storage()->nbytes() > 0) {
    // The full-precision copy may be modified: the low-precision one must be all-gathered
    // again afterwards.
    FreeStorage(full_param_padded_);
  }
  FSDP_INTERNAL_ASSERT(unsharded.storage()->nbytes() == 0,
                       "expects the unsharded flat parameter's storage to be freed");
  AllocStorage(unsharded, padded_unsharded_numel(), init);
  return unsharded;
}

Tensor FlatParamHandle::all_gather_flat_param(const Tensor& padded_unsharded_flat_param) {
  const Tensor sharded_flat_param = flat_param_.detach();
  FSDP_INTERNAL_ASSERT(padded_unsharded_flat_param.numel() ==
                           sharded_flat_param.numel() * world_size_,
                       "Expects ", sharded_flat_param.numel() * world_size_, " numel but got ",
                       padded_unsharded_flat_param.numel());
  // As `_all_gather_flat_param`: all_gather_into_tensor (c10d `_allgather_base_`) on an
  // accelerator, the list all_gather (c10d `allgather_`) into views of the W chunks on the CPU.
  if (sharded_flat_param.device().is_cuda()) {
    options_.process_group->all_gather_into_tensor(padded_unsharded_flat_param,
                                                   sharded_flat_param);
  } else {
    const int64_t chunk = sharded_flat_param.numel();
    std::vector<Tensor> tensor_list;
    for (int r = 0; r < world_size_; ++r) {
      tensor_list.push_back(padded_unsharded_flat_param.narrow(0, r * chunk, chunk));
    }
    options_.process_group->all_gather(tensor_list, sharded_flat_param);
  }
  return padded_unsharded_flat_param;
}

void FlatParamHandle::use_unsharded_flat_param(const Tensor& padded_unsharded_flat_param) {
  SetData(flat_param_, padded_unsharded_flat_param.narrow(0, 0, unpadded_unsharded_numel()));
  const bool in_forward = training_state == HandleTrainingState::kForward;
  const bool in_pre_backward = training_state == HandleTrainingState::kBackwardPre;
  if (options_.use_orig_params) {
    // The pre-backward counterpart of a skipped post-forward use_sharded_views is skipped too.
    if (skipped_use_sharded_views() && in_pre_backward) return;
    use_unsharded_views(/*as_params=*/!in_forward && !in_pre_backward);
  } else if (in_forward) {
    use_unsharded_views(/*as_params=*/false);
  }
}

void FlatParamHandle::post_unshard() {
  if (uses_param_mixed_precision() && uses_sharded_strategy()) free_low_precision_sharded_param();
}

void FlatParamHandle::free_low_precision_sharded_param() { FreeStorage(mp_shard_); }

void FlatParamHandle::reshard(bool free_unsharded) {
  // Switch to the sharded flat parameter before freeing.
  use_sharded_flat_param();
  if (free_unsharded) free_unsharded_flat_param();
}

void FlatParamHandle::post_reshard() {
  // NO_SHARD's low-precision shard is also its unsharded flat parameter: freed only now.
  if (uses_param_mixed_precision() && !uses_sharded_strategy() && !force_full_precision()) {
    free_low_precision_sharded_param();
  }
}

void FlatParamHandle::free_unsharded_flat_param() {
  const Tensor& unsharded = padded_unsharded_flat_param();
  FSDP_INTERNAL_ASSERT(unsharded.storage()->nbytes() > 0,
                       "expects the unsharded flat parameter's storage to be allocated");
  FreeStorage(unsharded);
}

void FlatParamHandle::use_sharded_flat_param() {
  bool skip_use_sharded_views = false;
  Tensor unsharded_flat_param;
  const bool in_forward = training_state == HandleTrainingState::kForward;
  if (options_.use_orig_params) {
    // SHARD_GRAD_OP keeps the unsharded views after forward.
    skip_use_sharded_views =
        autograd::GradMode::is_enabled() && in_forward &&
        (options_.sharding_strategy == ShardingStrategy::kShardGradOp ||
         options_.sharding_strategy == ShardingStrategy::kHybridShardZero2);
    if (skip_use_sharded_views) unsharded_flat_param = flat_param_.detach();
  }
  if (options_.offload_params) {
    FSDP_INTERNAL_ASSERT(local_shard_.device().is_cpu(), "Expects the local shard to be on CPU but got ",
                         local_shard_.device().str());
  }
  SetData(flat_param_, local_shard_);
  if (!options_.use_orig_params) return;
  if (skip_use_sharded_views) {
    unsharded_flat_param_for_skipped_views_ = unsharded_flat_param;
  } else {
    use_sharded_views();
  }
  // Post-forward: sharded gradient views, or the unsharded ones of a no_sync() accumulation;
  // post-backward delays them until after the reduction.
  if (in_forward && !skipped_use_sharded_views()) {
    const Tensor grad = flat_param_.grad();
    const bool accumulated_grad_in_no_sync =
        grad.defined() && uses_sharded_strategy() && grad.numel() == unpadded_unsharded_numel();
    if (accumulated_grad_in_no_sync) {
      use_unsharded_grad_views();
    } else {
      use_sharded_grad_views();
    }
  }
}

// ---- Gradients ---------------------------------------------------------------------------

void FlatParamHandle::unshard_grad() {
  if (!uses_sharded_strategy()) {
    use_unsharded_grad_views();
    return;
  }
  check_unsharded(flat_param_, "flat parameter");
  // All ranks agree on whether there is a gradient at all.
  Tensor num_grad_none = Tensor::zeros({1}, DType::kInt64, device());
  if (!flat_param_.grad().defined()) num_grad_none.fill_(1);
  options_.process_group->all_reduce(num_grad_none);
  if (static_cast<int>(num_grad_none.item()) == world_size_) {
    has_saved_grad_shard = true;
    saved_grad_shard = Tensor();
    use_unsharded_grad_views();
    return;
  }
  Tensor sharded_grad;
  if (!flat_param_.grad().defined()) {
    // Some ranks have None: zeros approximate theirs.
    has_saved_grad_shard = true;
    saved_grad_shard = Tensor();
    sharded_grad = Tensor::zeros({sharded_numel_}, flat_param_.dtype(), device());
  } else {
    check_sharded(flat_param_.grad(), "gradient");
    has_saved_grad_shard = true;
    saved_grad_shard = flat_param_.grad();
    sharded_grad = saved_grad_shard;
  }
  Tensor padded_unsharded_grad =
      Tensor::empty_uninitialized({padded_unsharded_numel()}, sharded_grad.dtype(), device());
  options_.process_group->all_gather_into_tensor(padded_unsharded_grad, sharded_grad);
  SetGradUnchecked(flat_param_, padded_unsharded_grad.narrow(0, 0, unpadded_unsharded_numel()));
  use_unsharded_grad_views();
}

void FlatParamHandle::reshard_grad() {
  if (options_.use_orig_params) use_sharded_grad_views();
  if (!uses_sharded_strategy()) return;
  SetGradUnchecked(flat_param_, saved_grad_shard);
  has_saved_grad_shard = false;
  saved_grad_shard = Tensor();
}

void FlatParamHandle::to_cpu() {
  FSDP_INTERNAL_ASSERT(uses_sharded_strategy(), "to_cpu expects a sharded strategy");
  check_unsharded(flat_param_, "flat parameter");
  // A copy even on a CPU compute device: the unsharded storage is freed below.
  cpu_unsharded_flat_param_ = flat_param_.detach().to(Device::CPU());
  if (SameStorage(cpu_unsharded_flat_param_, flat_param_)) {
    cpu_unsharded_flat_param_ = cpu_unsharded_flat_param_.clone();
  }
  // Like PyTorch's flat_param_to(cpu): the views follow the CPU copy.
  SetData(flat_param_, cpu_unsharded_flat_param_);
  if (options_.use_orig_params) use_unsharded_views(/*as_params=*/true);
  free_unsharded_flat_param();
}

void FlatParamHandle::from_cpu() {
  check_unsharded(flat_param_, "flat parameter");
  Tensor padded = alloc_padded_unsharded_flat_param(AllocInit::kZeros);
  padded.narrow(0, 0, unpadded_unsharded_numel()).copy_(flat_param_.detach());
  cpu_unsharded_flat_param_ = Tensor();
  use_unsharded_flat_param(padded);
}

void FlatParamHandle::prepare_gradient_for_backward() {
  FSDP_INTERNAL_ASSERT(training_state == HandleTrainingState::kBackwardPre ||
                           training_state == HandleTrainingState::kIdle,
                       "Expects to be in `BACKWARD_PRE` or `IDLE` (if prefetching)");
  const Tensor grad = flat_param_.grad();
  if (!grad.defined()) return;
  if (grad.numel() == unpadded_unsharded_numel() && grad.device() == flat_param_.device()) return;
  // With CPU offload a sharded gradient lives in host memory (the CPU gradient buffer, or a
  // writeback of it), which on a CUDA compute device is another device: treat it as offloaded
  // on a CPU compute device too, so that the behaviour does not depend on the device.
  const bool grad_offloaded = grad.device() != device() || options_.offload_params;
  FSDP_INTERNAL_ASSERT(!grad_offloaded || options_.offload_params, "Expects the sharded gradient "
                       "to be on ", device().str(), " but got ", grad.device().str());
  const bool prev_iter_synced_gradients = grad.numel() == local_shard_.numel();
  if (prev_iter_synced_gradients) {
    // Gradient accumulation outside no_sync() does not work with CPU offload (PyTorch's TODO):
    // the CPU gradient buffer is overwritten by the next reduction.
    Tensor sharded_grad;
    if (!grad_offloaded) {
      has_saved_grad_shard = true;
      saved_grad_shard = grad;
      sharded_grad = saved_grad_shard;
    } else {
      sharded_grad = cpu_grad;
    }
    if (options_.keep_low_precision_grads && sharded_grad.dtype() != local_shard_.dtype()) {
      SetData(sharded_grad, sharded_grad.to(local_shard_.dtype()));
    }
  } else {
    FSDP_INTERNAL_ASSERT(grad.numel() == padded_unsharded_numel(),
                         "Expects `.grad` to be the unsharded gradient in `no_sync()` with size ",
                         padded_unsharded_numel(), " but got size ", grad.numel());
  }
  SetGradUnchecked(flat_param_, Tensor());
}

void FlatParamHandle::prepare_gradient_for_optim() {
  auto cast_grad_to_param_dtype_if_needed = [this]() {
    if (force_full_precision() || !options_.keep_low_precision_grads) return;
    const Tensor grad = flat_param_.grad();
    FSDP_INTERNAL_ASSERT(grad.defined(), "Unexpected None grad!");
    if (grad.dtype() != fwd_bwd_param_dtype_) {
      SetData(grad, grad.to(fwd_bwd_param_dtype_));
      if (options_.use_orig_params) use_sharded_grad_views();
    }
  };
  if (cpu_grad.defined()) {
    check_sharded(flat_param_, "flat parameter");
    SetGradUnchecked(flat_param_, cpu_grad);
    cast_grad_to_param_dtype_if_needed();
  } else if (has_saved_grad_shard) {
    check_sharded(flat_param_, "flat parameter");
    // No sharded gradient computed this iteration: nothing to forward to .grad.
    if (post_backward_called) {
      SetGradUnchecked(flat_param_, saved_grad_shard);
      if (saved_grad_shard.defined()) cast_grad_to_param_dtype_if_needed();
    }
  } else {
    FSDP_INTERNAL_ASSERT(!uses_sharded_strategy() || !post_backward_called,
                         "All sharded parameters that received a gradient in the post-backward "
                         "should use `_saved_grad_shard`");
  }
  // Its existence marks a gradient to accumulate into in the next post-backward.
  has_saved_grad_shard = false;
  saved_grad_shard = Tensor();
}

Tensor FlatParamHandle::sharded_grad() const {
  if (cpu_grad.defined()) return cpu_grad;
  if (has_saved_grad_shard) return saved_grad_shard;
  return flat_param_.grad();
}

bool FlatParamHandle::has_param_extensions() const {
  for (const auto& extension : param_extensions_) {
    if (extension) return true;
  }
  return false;
}

bool FlatParamHandle::is_sharded(const Tensor& tensor) const {
  return sharded_ && uses_sharded_strategy() && tensor.numel() == sharded_numel_ &&
         tensor.dim() == 1;
}

// ---- Views -------------------------------------------------------------------------------

std::vector<Tensor> FlatParamHandle::get_unflat_views(const Tensor& tensor) const {
  std::vector<Tensor> splits = split(tensor, layout_.numels_with_padding, 0);
  std::vector<Tensor> views;
  size_t idx = 0;
  for (size_t i = 0; i < splits.size(); ++i) {
    if (layout_.is_padding_mask[i]) continue;
    views.push_back(view(splits[i], shapes_[idx]));
    ++idx;
  }
  return views;
}

void FlatParamHandle::setattr_param(nn::Module* module, const std::string& name,
                                    const Tensor& param) {
  if (module->has_parameter(name)) module->remove_parameter(name);
  module->register_parameter(name, param, param.requires_grad());
}

void FlatParamHandle::setattr_tensor(nn::Module* module, const std::string& name,
                                     const Tensor& tensor) {
  if (module->has_parameter(name)) module->remove_parameter(name);
  module->set_tensor_attribute(name, tensor);
}

void FlatParamHandle::use_unsharded_views(bool as_params) {
  check_unsharded(flat_param_, "flat parameter");
  std::optional<autograd::NoGradGuard> no_grad;
  if (as_params) no_grad.emplace();  // parameters alias the data; no graph
  const std::vector<Tensor> views = get_unflat_views(flat_param_);
  for (size_t i = 0; i < views.size(); ++i) {
    const ParamInfo& info = param_infos_[i];
    const std::optional<tensor_parallel::DTensor>& extension = param_extensions_[i];
    if (options_.use_orig_params && as_params) {
      setattr_param(info.module, info.param_name, params_[i]);
      SetData(params_[i], views[i]);
      if (extension) PostUnflattenTransform(*info.module, info.param_name, params_[i], *extension);
    } else if (as_params) {
      Tensor param = views[i].detach();
      param.set_requires_grad(flat_param_.requires_grad());
      setattr_param(info.module, info.param_name, param);
      if (extension) PostUnflattenTransform(*info.module, info.param_name, param, *extension);
    } else {
      Tensor param_var = views[i];
      if (options_.use_orig_params) {
        if (training_state == HandleTrainingState::kForward) {
          tensors_[i] = views[i];  // saved for the pre-backward
        } else if (training_state == HandleTrainingState::kBackwardPre && tensors_[i].defined()) {
          // Reuse the forward's tensor so that its autograd graph stays connected.
          SetData(tensors_[i], views[i]);
          param_var = tensors_[i];
        }
      }
      setattr_tensor(info.module, info.param_name, param_var);
      if (extension) PostUnflattenTransform(*info.module, info.param_name, param_var, *extension);
      // In forward the views are also listed as parameters (`module._parameters[name] =
      // param_var`): named_parameters() shows them until the post-forward reshard (and, where
      // SHARD_GRAD_OP skips the sharded views, until backward).
      if (options_.use_orig_params && training_state == HandleTrainingState::kForward) {
        info.module->set_parameter_slot(info.param_name, info.module->parameter(info.param_name));
      }
    }
  }
  for (size_t i = 0; i < shared_param_infos_.size(); ++i) {
    const SharedParamInfo& info = shared_param_infos_[i];
    const Tensor prim_param = info.prim_module->parameter(info.prim_param_name);
    if (options_.use_orig_params && as_params) {
      setattr_param(info.module, info.param_name, shared_params_[i]);
      if (!shared_params_[i].is_same(prim_param)) SetData(shared_params_[i], prim_param);
    } else if (as_params) {
      setattr_param(info.module, info.param_name, prim_param);
    } else {
      setattr_tensor(info.module, info.param_name, prim_param);
      if (options_.use_orig_params && training_state == HandleTrainingState::kForward) {
        info.module->set_parameter_slot(info.param_name, prim_param);
      }
    }
  }
}

void FlatParamHandle::use_unsharded_grad_views() {
  const Tensor flat_grad = flat_param_.grad();
  if (!flat_grad.defined()) {
    for (const Tensor& p : params_) SetGradUnchecked(p, Tensor());
    for (const Tensor& p : shared_params_) SetGradUnchecked(p, Tensor());
    return;
  }
  check_unsharded(flat_grad, "gradient");
  autograd::NoGradGuard no_grad;
  const std::vector<Tensor> views = get_unflat_views(flat_grad);
  for (size_t i = 0; i < views.size(); ++i) {
    const ParamInfo& info = param_infos_[i];
    SetGradUnchecked(info.module->parameter(info.param_name), views[i]);
  }
  for (const SharedParamInfo& info : shared_param_infos_) {
    const Tensor param = info.module->parameter(info.param_name);
    const Tensor prim_param = info.prim_module->parameter(info.prim_param_name);
    if (!param.is_same(prim_param)) SetGradUnchecked(param, prim_param.grad());
  }
}

void FlatParamHandle::use_sharded_views() {
  unsharded_flat_param_for_skipped_views_ = Tensor();
  if (!uses_sharded_strategy()) {
    // NO_SHARD: the unflattened unsharded views, since the parameter is unsharded.
    use_unsharded_views(/*as_params=*/true);
    return;
  }
  check_sharded(flat_param_, "flat parameter");
  autograd::NoGradGuard no_grad;
  // Parameters without data in this shard get a size-0 tensor (kept registered, so that they
  // can still be handed to an optimizer and printed).
  const Tensor size_0_empty_tensor = Tensor::empty({0}, flat_param_.dtype(), flat_param_.device());
  for (size_t i = 0; i < params_.size(); ++i) {
    const ParamInfo& info = param_infos_[i];
    const ShardParamInfo& shard_info = shard_param_infos_[i];
    setattr_param(info.module, info.param_name, params_[i]);
    SetData(params_[i], shard_info.in_shard
                           ? flat_param_.narrow(0, shard_info.offset_in_shard,
                                                shard_info.numel_in_shard)
                           : size_0_empty_tensor);
  }
  for (size_t i = 0; i < shared_param_infos_.size(); ++i) {
    const SharedParamInfo& info = shared_param_infos_[i];
    setattr_param(info.module, info.param_name, shared_params_[i]);
    const Tensor prim_param = info.prim_module->parameter(info.prim_param_name);
    if (!shared_params_[i].is_same(prim_param)) SetData(shared_params_[i], prim_param);
  }
  if (training_state == HandleTrainingState::kBackwardPost) {
    for (Tensor& t : tensors_) t = Tensor();  // no longer needed
  }
}

void FlatParamHandle::use_sharded_grad_views() {
  check_sharded(flat_param_, "flat parameter");
  const Tensor grad = sharded_grad();
  if (!grad.defined()) {
    for (const Tensor& p : params_) SetGradUnchecked(p, Tensor());
    for (const Tensor& p : shared_params_) SetGradUnchecked(p, Tensor());
    return;
  }
  check_sharded(grad, "gradient");
  for (size_t i = 0; i < params_.size(); ++i) {
    const ShardParamInfo& info = shard_param_infos_[i];
    const Tensor& param = params_[i];
    if (info.in_shard && param.requires_grad() && !is_grad_none_mask_[i]) {
      SetGradUnchecked(param,
                       grad.narrow(0, info.offset_in_shard, info.numel_in_shard).view(param.sizes()));
    } else {
      SetGradUnchecked(param, Tensor());
    }
  }
  for (size_t i = 0; i < shared_params_.size(); ++i) {
    const SharedParamInfo& info = shared_param_infos_[i];
    const Tensor& param = shared_params_[i];
    const Tensor prim_param = info.prim_module->parameter(info.prim_param_name);
    if (param.is_same(prim_param)) continue;  // one tensor, one gradient
    SetGradUnchecked(param, param.requires_grad() ? prim_param.grad() : Tensor());
  }
}

bool FlatParamHandle::writeback_orig_params() {
  if (uses_sharded_strategy() && !is_sharded(flat_param_) && !skipped_use_sharded_views()) {
    return false;  // unsharded: the views are the data
  }
  const Tensor flat_param_tensor =
      skipped_use_sharded_views() && uses_sharded_strategy() ? unsharded_flat_param_for_skipped_views_
                                                             : flat_param_;
  bool wroteback = false;
  Tensor flat_param_grad =
      uses_sharded_strategy() || !options_.offload_params ? flat_param_.grad() : cpu_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    const ShardParamInfo& info = shard_param_infos_[i];
    const ParamInfo& param_info = param_infos_[i];
    if (!info.in_shard) continue;
    if (!param_info.module->has_parameter(param_info.param_name) &&
        !param_info.module->has_tensor_attribute(param_info.param_name)) {
      continue;  // deregistered (e.g. during checkpointing)
    }
    Tensor param = params_[i];
    if (skipped_use_sharded_views()) {
      param = tensors_[i];
      FSDP_INTERNAL_ASSERT(param.defined(), "Expects to have saved tensor for ", fqns_[i]);
    }
    const Tensor current = param_info.module->parameter(param_info.param_name);
    const bool param_changed = !current.is_same(param);
    const bool needs_param_writeback = param_changed || !SameStorage(param, flat_param_tensor);
    FSDP_CHECK_CODE(ErrorCode::kFailedPrecondition,
                    !(skipped_use_sharded_views() && needs_param_writeback),
                    "FSDP does not support changing the parameters between forward and backward "
                    "for ", ShardingStrategyName(options_.sharding_strategy), " (", fqns_[i], ")");
    if (param_changed) {
      // The gradient is not preserved after a parameter change.
      param = current;
      params_[i] = param;
    }
    if (needs_param_writeback) {
      writeback_tensor(param, flat_param_, i, info.numel_in_shard, info.offset_in_shard, true);
      wroteback = true;
    }
    if (skipped_use_sharded_views()) continue;  // gradients are not exposed then
    const Tensor param_grad = param.grad();
    if (!param_grad.defined() && flat_param_.grad().defined()) {
      writeback_tensor(Tensor(), flat_param_.grad(), i, info.numel_in_shard,
                       info.offset_in_shard, false);
    } else if (param_grad.defined()) {
      // NO_SHARD + CPU offload: the CPU gradient owns the storage; never written back.
      if (!uses_sharded_strategy() && options_.offload_params) continue;
      const bool needs_grad_writeback =
          !flat_param_grad.defined() || !SameStorage(param_grad, flat_param_grad);
      if (needs_grad_writeback) {
        if (!flat_param_grad.defined()) {
          flat_param_grad = Tensor::zeros(flat_param_.sizes(), flat_param_.dtype(),
                                          flat_param_.device());
        }
        writeback_tensor(param_grad, flat_param_grad, i, info.numel_in_shard,
                         info.offset_in_shard, false);
        SetGradUnchecked(flat_param_, flat_param_grad);
      }
    }
  }
  for (const SharedParamInfo& info : shared_param_infos_) {
    FSDP_CHECK_CODE(ErrorCode::kInvalidArgument,
                    info.module->parameter(info.param_name)
                        .is_same(info.prim_module->parameter(info.prim_param_name)),
                    "Changing shared parameters is not supported yet (",
                    info.module_name.empty() ? info.param_name
                                             : info.module_name + "." + info.param_name,
                    ")");
  }
  return wroteback;
}

void FlatParamHandle::writeback_tensor(const Tensor& src, const Tensor& dst, size_t index,
                                       int64_t expected_numel, int64_t offset, bool is_param) {
  FSDP_CHECK(!src.defined() || (src.dim() == 1 && src.numel() == expected_numel),
             "Cannot writeback when the ", is_param ? "parameter" : "gradient",
             " shape changes\nExpects torch.Size([", expected_numel, "]) but got torch.Size(",
             src.defined() ? ShapeStr(src.sizes()) : std::string("[]"), ") for ", fqns_[index]);
  Tensor region = dst.narrow(0, offset, expected_numel);
  if (src.defined()) {
    region.copy_(src.to(region.dtype()));
  } else {
    region.zero_();
    is_grad_none_mask_[index] = true;
  }
}

void FlatParamHandle::reset_flat_param_grad_info_if_needed() {
  if (!options_.use_orig_params) return;
  bool all_grad_none = true;
  bool requires_grad = false;
  for (const Tensor& p : params_) {
    all_grad_none = all_grad_none && !p.grad().defined();
    requires_grad = requires_grad || p.requires_grad();
  }
  if (all_grad_none) SetGradUnchecked(flat_param_, Tensor());
  flat_param_.set_requires_grad(requires_grad);
}

void FlatParamHandle::reset_is_grad_none() {
  if (!options_.use_orig_params) return;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].requires_grad()) is_grad_none_mask_[i] = false;
  }
}

// ---- Helpers -----------------------------------------------------------------------------

void FlatParamHandle::flat_param_to(Device target) {
  SetData(flat_param_, flat_param_.detach().to(target));
  if (!options_.use_orig_params) return;
  // The views must follow the moved data.
  if (is_sharded(flat_param_)) {
    use_sharded_views();
  } else {
    use_unsharded_views(/*as_params=*/true);
  }
}

void FlatParamHandle::check_sharded(const Tensor& tensor, const char* what) const {
  FSDP_CHECK_CODE(ErrorCode::kInternal, is_sharded(tensor) || !uses_sharded_strategy(),
                  "Expects the ", what, " of the FSDP flat parameter of ",
                  fully_sharded_module_->type_name(), " to be sharded (", sharded_numel_,
                  " elements) but got ", tensor.numel());
}

void FlatParamHandle::check_unsharded(const Tensor& tensor, const char* what) const {
  FSDP_CHECK_CODE(ErrorCode::kInternal, tensor.numel() == unpadded_unsharded_numel(),
                  "Expects the ", what, " of the FSDP flat parameter of ",
                  fully_sharded_module_->type_name(), " to be unsharded (",
                  unpadded_unsharded_numel(), " elements) but got ", tensor.numel());
}

}  // namespace fsdp::fsdp1
