#include "engine/fsdp1/runtime_utils.h"

#include <functional>
#include <memory>
#include <set>

#include "engine/autograd/engine.h"
#include "engine/autograd/grad_mode.h"
#include "engine/autograd/graph.h"
#include "engine/autograd/node.h"
#include "engine/autograd/variable.h"
#include "engine/core/error.h"
#include "engine/distributed/comm_debug_mode.h"
#include "engine/fsdp/fsdp_collectives.h"
#include "engine/fsdp/observer.h"
#include "engine/fsdp1/fully_sharded_data_parallel.h"
#include "engine/fsdp1/tensor_data.h"
#include "engine/functional/functional.h"
#include "engine/nn/module.h"
#include "engine/ops/elementwise.h"

namespace fsdp::fsdp1 {
namespace {

using nn::Value;

enum class PrefetchMode { kBackward, kForward };

void Notify(fsdp2::EventKind kind, const FlatParamHandle& handle) {
  fsdp2::internal::NotifyObservers(kind, handle.module_fqn, ToObserverState(handle.training_state));
}

distributed::CommPhase PhaseOf(HandleTrainingState state) {
  return state == HandleTrainingState::kBackwardPre || state == HandleTrainingState::kBackwardPost
             ? distributed::CommPhase::kBackward
             : distributed::CommPhase::kForward;
}

std::vector<FlatParamHandle*> AllHandles(const FullyShardedDataParallel& root) {
  return root.exec_order_data ? root.exec_order_data->all_handles()
                              : std::vector<FlatParamHandle*>{};
}

// `_cast_forward_inputs`: floating-point tensors not already in `dtype` through a
// differentiable cast; anything else unchanged.
Value CastForwardInputs(const Value& value, DType dtype) {
  if (value.num_tensors() == 0) return value;
  return value.map_tensors([dtype](const Tensor& t) {
    if (!t.defined() || !IsFloatingPoint(t.dtype()) || t.dtype() == dtype) return t;
    return ::fsdp::to(t, dtype);
  });
}

// `_cast_buffers_to_dtype_and_device`.
void CastBuffersToDtypeAndDevice(const std::vector<Tensor>& buffers,
                                 const std::vector<std::optional<DType>>& dtypes, Device device) {
  for (size_t i = 0; i < buffers.size(); ++i) {
    const Tensor& buffer = buffers[i];
    Tensor converted = buffer.to(device);
    if (dtypes[i] && IsFloatingPoint(buffer.dtype())) converted = converted.to(*dtypes[i]);
    if (converted.storage() != buffer.storage() || converted.dtype() != buffer.dtype()) {
      SetData(buffer, converted);
    }
  }
}

// `_check_flat_params_on_expected_device`.
void CheckFlatParamsOnExpectedDevice(const FullyShardedDataParallel& root) {
  for (FullyShardedDataParallel* state : GetFsdpStates(root)) {
    const FlatParamHandle* handle = state->handle.get();
    if (handle == nullptr) continue;
    const Device device = handle->flat_param().device();
    if (!handle->offload_params()) {
      FSDP_CHECK_CODE(ErrorCode::kFailedPrecondition, device == root.compute_device,
                      "An FSDP-managed module unexpectedly has parameters on ", device.str(),
                      ". Make sure to move the module to ", root.compute_device.str(),
                      " before training. (", DescribeInstance(*state), ")");
    } else {
      FSDP_CHECK_CODE(ErrorCode::kFailedPrecondition, device.is_cpu(),
                      "An FSDP-managed module with parameter CPU offloading enabled has "
                      "parameters on ", device.str(), ". Make sure to not move the module from "
                      "CPU when offloading parameters. (", DescribeInstance(*state), ")");
    }
  }
}

// `_share_state_and_init_handle_attrs`.
void ShareStateAndInitHandleAttrs(FullyShardedDataParallel& root) {
  if (root.handle) root.handle->init_flat_param_attributes();
  std::set<bool> use_orig_params_values;
  std::set<bool> limit_all_gathers_values;
  for (FullyShardedDataParallel* state : root.all_fsdp_states) {
    use_orig_params_values.insert(state->use_orig_params);
    limit_all_gathers_values.insert(state->limit_all_gathers);
    if (state == &root) continue;
    // Relaxed for an instance wrapped again later (a nested root re-initialized).
    FSDP_CHECK_CODE(ErrorCode::kFailedPrecondition, !state->is_root.value_or(false),
                    "Non-root FSDP instance's `_is_root` should not have been set yet or should "
                    "have been set to `False` (", DescribeInstance(*state), ")");
    state->is_root = false;
    state->exec_order_data = root.exec_order_data;
    if (state->handle) state->handle->init_flat_param_attributes();
  }
  FSDP_CHECK(use_orig_params_values.size() == 1,
             "Expects one homogeneous value for _use_orig_params but got {False, True}");
  FSDP_CHECK(limit_all_gathers_values.size() == 1,
             "Expects one homogeneous value for limit_all_gathers but got {False, True}");
}

// `_get_buffers_and_dtypes_for_computation`: bottom-up, so the owning instance's buffer dtype
// wins.
void CastBuffersForComputation(FullyShardedDataParallel& root) {
  std::vector<Tensor> buffers;
  std::vector<std::optional<DType>> dtypes;
  std::set<const TensorImpl*> visited;
  const std::vector<FullyShardedDataParallel*> states = GetFsdpStates(root);
  for (auto it = states.rbegin(); it != states.rend(); ++it) {
    for (const auto& [name, buffer] : (*it)->named_buffers()) {
      if (!visited.insert(buffer.impl()).second) continue;
      if ((*it)->ignored_buffer_names.count(CleanTensorName(name))) continue;
      buffers.push_back(buffer);
      dtypes.push_back((*it)->mixed_precision.buffer_dtype);
    }
  }
  CastBuffersToDtypeAndDevice(buffers, dtypes, root.compute_device);
}

// ---- Prefetch ------------------------------------------------------------------------------

FlatParamHandle* GetHandleToPrefetch(FsdpState& state, FlatParamHandle& current) {
  const HandleTrainingState training_state = current.training_state;
  FSDP_INTERNAL_ASSERT(training_state == HandleTrainingState::kBackwardPre ||
                           training_state == HandleTrainingState::kBackwardPost ||
                           training_state == HandleTrainingState::kForward,
                       "Prefetching is only supported in (BACKWARD_PRE, BACKWARD_POST, FORWARD) "
                       "but currently in ", HandleTrainingStateName(training_state));
  const ExecOrderData& eod = *state.exec_order_data;
  const bool backward_pre = training_state == HandleTrainingState::kBackwardPre &&
                            state.backward_prefetch == BackwardPrefetch::kBackwardPre;
  const bool backward_post = training_state == HandleTrainingState::kBackwardPost &&
                             state.backward_prefetch == BackwardPrefetch::kBackwardPost;
  if (backward_pre || backward_post) {
    FlatParamHandle* candidate = eod.get_handle_to_backward_prefetch(current);
    if (candidate && candidate->needs_pre_backward_unshard && !candidate->prefetched) return candidate;
  } else if (training_state == HandleTrainingState::kForward && state.forward_prefetch) {
    FlatParamHandle* candidate = eod.get_handle_to_forward_prefetch(current);
    if (candidate && candidate->needs_pre_forward_unshard && !candidate->prefetched) return candidate;
  }
  return nullptr;
}

// `_prefetch_handle`: unshards the next handle without waiting, its state temporarily set to
// the pass it is prefetched for.
void PrefetchHandle(FsdpState& state, FlatParamHandle* current, PrefetchMode mode) {
  if (current == nullptr) return;
  FlatParamHandle* handle = GetHandleToPrefetch(state, *current);
  if (handle == nullptr) return;
  const HandleTrainingState previous = handle->training_state;
  handle->training_state = mode == PrefetchMode::kBackward ? HandleTrainingState::kBackwardPre
                                                           : HandleTrainingState::kForward;
  Unshard(*handle);
  handle->training_state = previous;
  handle->prefetched = true;
}

// ---- Backward ----------------------------------------------------------------------------

bool ShouldFreeInBackward(const FsdpState& state, const FlatParamHandle& handle) {
  if (!handle.uses_sharded_strategy()) return false;
  // Without gradient sync, strategies that keep parameters after forward keep them after
  // backward too (memory for throughput).
  return state.sync_gradients || ReshardsAfterForward(handle.sharding_strategy());
}

void PostBackwardReshard(FsdpState& state, FlatParamHandle& handle) {
  Reshard(handle, ShouldFreeInBackward(state, handle));
  PrefetchHandle(state, &handle, PrefetchMode::kBackward);
}

// `_cast_grad_to_param_dtype`.
void CastGradToParamDtype(Tensor& sharded_grad, const Tensor& param) {
  if (sharded_grad.dtype() != param.dtype()) SetData(sharded_grad, sharded_grad.to(param.dtype()));
}

// `_accumulate_sharded_grad`: returns the gradient to offload.
Tensor AccumulateShardedGrad(FlatParamHandle& handle, Tensor sharded_grad) {
  CastGradToParamDtype(sharded_grad, handle.flat_param());
  // Gradient accumulation across backwards: reductions may finish in any order.
  if (handle.has_saved_grad_shard && handle.saved_grad_shard.defined()) {
    Tensor& saved = handle.saved_grad_shard;
    FSDP_CHECK_CODE(ErrorCode::kInternal, saved.sizes() == sharded_grad.sizes(),
                    "Shape mismatch when accumulating gradients: existing gradient shape=",
                    ShapeStr(saved.sizes()), " new gradient shape=", ShapeStr(sharded_grad.sizes()));
    FSDP_CHECK_CODE(ErrorCode::kInternal, saved.device() == sharded_grad.device(),
                    "Device mismatch when accumulating gradients: existing gradient device=",
                    saved.device().str(), " new gradient device=", sharded_grad.device().str());
    saved.copy_(ops::kernels::Add(saved, sharded_grad));
  } else {
    handle.has_saved_grad_shard = true;
    handle.saved_grad_shard = sharded_grad;
  }
  return handle.saved_grad_shard;
}

// `_post_reduce_grad_callback`: CPU offload of the gradient, then (use_orig_params) the
// sharded gradient views.
void PostReduceGradCallback(FlatParamHandle& handle, const Tensor& grad_to_offload) {
  if (handle.offload_params()) handle.cpu_grad.copy_(grad_to_offload.detach());
  if (!handle.use_orig_params()) return;
  handle.reset_is_grad_none();
  handle.use_sharded_grad_views();
}

// `_reduce_grad`: pre-divide, SUM reduce-scatter over the shard group, (hybrid) SUM all-reduce
// over the replicate group, post-divide, accumulate into the saved shard.
void ReduceGrad(FsdpState& state, FlatParamHandle& handle) {
  const Tensor& flat_param = handle.flat_param();
  // Cleared to permit several backwards (the reduction reads its own reference).
  Tensor unsharded_grad = flat_param.grad();
  SetGradUnchecked(flat_param, Tensor());
  // `_get_reduce_scatter_tensors`: pad to W chunks of the first chunk's size.
  const int64_t chunk_numel = handle.sharded_numel();
  const int64_t numel_to_pad = state.world_size * chunk_numel - unsharded_grad.numel();
  Tensor padded_unsharded_grad = unsharded_grad;
  if (numel_to_pad > 0) {
    // F.pad: the gradient, then zeros (the reduce-scatter reads the padding).
    padded_unsharded_grad = Tensor::empty_uninitialized(
        {state.world_size * chunk_numel}, unsharded_grad.dtype(), unsharded_grad.device());
    padded_unsharded_grad.narrow(0, 0, unsharded_grad.numel()).copy_(unsharded_grad);
    padded_unsharded_grad.narrow(0, unsharded_grad.numel(), numel_to_pad).zero_();
  }
  Tensor new_sharded_grad = Tensor::empty_uninitialized({chunk_numel}, unsharded_grad.dtype(),
                                                        unsharded_grad.device());
  fsdp2::DivIfNeeded(padded_unsharded_grad, state.gradient_predivide_factor);
  state.process_group->reduce_scatter_tensor(new_sharded_grad, padded_unsharded_grad,
                                             distributed::Sum());
  if (IsHybridStrategy(handle.sharding_strategy())) {
    state.inter_node_process_group->all_reduce(new_sharded_grad, distributed::Sum());
  }
  fsdp2::DivIfNeeded(new_sharded_grad, state.gradient_postdivide_factor);
  const Tensor grad_to_offload = AccumulateShardedGrad(handle, new_sharded_grad);
  PostReduceGradCallback(handle, grad_to_offload);
}

// `_reduce_grad_no_shard`: pre-divide, SUM all-reduce of the whole gradient, post-divide;
// accumulation across backwards happens in .grad itself.
void ReduceGradNoShard(FsdpState& state, FlatParamHandle& handle) {
  const Tensor& flat_param = handle.flat_param();
  Tensor grad = flat_param.grad();
  fsdp2::DivIfNeeded(grad, state.gradient_predivide_factor);
  state.process_group->all_reduce(grad, distributed::Sum());
  fsdp2::DivIfNeeded(grad, state.gradient_postdivide_factor);
  if (!handle.keep_low_precision_grads()) CastGradToParamDtype(grad, flat_param);
  PostReduceGradCallback(handle, grad);
}

// `_post_backward_hook`: runs after the flat parameter's AccumulateGrad.
void PostBackwardHook(FullyShardedDataParallel& state, FlatParamHandle& handle) {
  const Tensor& flat_param = handle.flat_param();
  handle.post_backward_called = true;
  AssertInTrainingStates(state, {TrainingState::kForwardBackward});
  // Reentrant checkpointing over modules sharing a flat parameter may run it twice.
  FSDP_CHECK_CODE(ErrorCode::kFailedPrecondition,
                  handle.training_state == HandleTrainingState::kBackwardPre ||
                      handle.training_state == HandleTrainingState::kBackwardPost,
                  "Expects `BACKWARD_PRE` or `BACKWARD_POST` state but got ",
                  HandleTrainingStateName(handle.training_state), " (", DescribeInstance(state), ")");
  handle.training_state = HandleTrainingState::kBackwardPost;
  distributed::CommPhaseGuard phase(state.fqn, distributed::CommPhase::kBackward);
  const Tensor grad = flat_param.grad();
  if (grad.defined()) {
    FSDP_CHECK(!grad.requires_grad(), "FSDP does not support gradients of gradients");
    PostBackwardReshard(state, handle);
    if (!state.sync_gradients) {
      // no_sync(): the unsharded gradient stays in .grad and accumulates.
      if (handle.use_orig_params()) handle.use_unsharded_grad_views();
    } else {
      if (grad.dtype() != handle.reduce_dtype() && !handle.force_full_precision()) {
        SetGradUnchecked(flat_param, grad.to(handle.reduce_dtype()));
      }
      if (handle.uses_sharded_strategy()) {
        ReduceGrad(state, handle);
      } else {
        ReduceGradNoShard(state, handle);
      }
    }
  }
  Notify(fsdp2::EventKind::kPostBackward, handle);
}

// `_post_backward_reshard_only_hook`: for a flat parameter that does not require grad.
void PostBackwardReshardOnlyHook(FullyShardedDataParallel& state, FlatParamHandle& handle) {
  state.training_state = TrainingState::kForwardBackward;
  handle.training_state = HandleTrainingState::kBackwardPost;
  distributed::CommPhaseGuard phase(state.fqn, distributed::CommPhase::kBackward);
  PostBackwardReshard(state, handle);
  Notify(fsdp2::EventKind::kPostBackward, handle);
}

// `_catch_all_reshard`: parameters unsharded by a pre-backward whose post-backward never ran.
void CatchAllReshard(FullyShardedDataParallel& state) {
  FlatParamHandle* handle = state.handle.get();
  if (handle == nullptr) return;
  const Tensor& flat_param = handle->flat_param();
  const Tensor& local_shard = handle->local_shard();
  const bool already_resharded = flat_param.storage() == local_shard.storage() &&
                                 flat_param.storage_offset() == local_shard.storage_offset() &&
                                 !handle->skipped_use_sharded_views();
  if (already_resharded) return;
  distributed::CommPhaseGuard phase(state.fqn, distributed::CommPhase::kBackward);
  Reshard(*handle, ShouldFreeInBackward(state, *handle));
}

// `_finalize_params`.
void FinalizeParams(FullyShardedDataParallel& state) {
  FlatParamHandle* handle = state.handle.get();
  if (handle == nullptr) return;
  handle->post_backward_hook_handle.remove();
  handle->post_backward_hook_handle = autograd::RemovableHandle();
  handle->post_backward_acc_grad.reset();
  if (!handle->flat_param().requires_grad()) return;
  // no_sync(): .grad keeps the unsharded accumulated gradient, saved_grad_shard the sharded
  // one of the last synced iteration.
  if (!state.sync_gradients) return;
  handle->prepare_gradient_for_optim();
  handle->post_backward_called = false;
}

// `_post_backward_final_callback`: the root's end of backward.
void PostBackwardFinalCallback(FullyShardedDataParallel& root) {
  FSDP_INTERNAL_ASSERT(root.is_root.value_or(false),
                       "The post-backward callback should only be called on the root FSDP "
                       "instance");
  root.exec_order_data->next_iter();
  for (FullyShardedDataParallel* state : root.all_fsdp_states) {
    CatchAllReshard(*state);
    FinalizeParams(*state);
    state->training_state = TrainingState::kIdle;
    if (FlatParamHandle* handle = state->handle.get()) {
      handle->ran_pre_backward_hook = false;
      handle->needs_pre_backward_unshard = false;
      handle->post_forward_index.reset();
      handle->training_state = HandleTrainingState::kIdle;
      handle->prefetched = false;
    }
  }
  // Reset for one forward followed by several backwards.
  root.post_backward_callback_queued = false;
}

void RegisterPostBackwardFinalCallback(FullyShardedDataParallel& state) {
  FSDP_INTERNAL_ASSERT(state.is_root.value_or(false),
                       "Only the root FSDP instance should register the post-backward callback");
  if (state.post_backward_callback_queued) return;
  AssertInTrainingStates(state, {TrainingState::kIdle});
  state.post_backward_callback_queued = true;
  std::weak_ptr<nn::Module> weak = state.weak_from_this();
  autograd::Engine::queue_callback([weak] {
    if (auto module = weak.lock()) {
      PostBackwardFinalCallback(static_cast<FullyShardedDataParallel&>(*module));
    }
  });
}

// `_pre_backward_hook`: once per handle per backward.
void PreBackwardHook(FullyShardedDataParallel& state, FlatParamHandle* handle) {
  if (handle != nullptr && handle->ran_pre_backward_hook) return;
  if (state.is_root.value_or(false) && !state.post_backward_callback_queued) {
    // Queued once, on the root, so that it runs after every backward computation.
    RegisterPostBackwardFinalCallback(state);
    ResetFlatParamGradInfoIfNeeded(AllHandles(state));
  } else if (handle != nullptr) {
    AssertInTrainingStates(state, {TrainingState::kIdle});
  }
  state.training_state = TrainingState::kForwardBackward;
  if (handle == nullptr) return;
  handle->training_state = HandleTrainingState::kBackwardPre;
  Notify(fsdp2::EventKind::kPreBackward, *handle);
  if (handle->needs_pre_backward_unshard && !handle->prefetched) Unshard(*handle);
  // A mistargeted prefetch of this handle must not unshard it later.
  handle->needs_pre_backward_unshard = false;
  PrefetchHandle(state, handle, PrefetchMode::kBackward);
  handle->prepare_gradient_for_backward();
  handle->ran_pre_backward_hook = true;
}

// `_register_pre_backward_hooks`: a hook on every output tensor that requires grad.
Value RegisterPreBackwardHooks(FullyShardedDataParallel& state, const Value& outputs,
                               FlatParamHandle* handle) {
  if (!autograd::GradMode::is_enabled()) return outputs;
  if (state.is_root.value_or(false)) state.post_backward_callback_queued = false;
  if (handle != nullptr) {
    handle->needs_pre_backward_unshard = false;
    // Participated in forward: conservatively assume it takes part in backward.
    handle->ran_pre_backward_hook = false;
  }
  std::weak_ptr<nn::Module> weak_state = state.weak_from_this();
  std::weak_ptr<FlatParamHandle> weak_handle =
      handle != nullptr ? handle->weak_from_this() : std::weak_ptr<FlatParamHandle>();
  const bool has_handle = handle != nullptr;
  for (const Tensor& t : outputs.tensors()) {
    if (!t.defined() || !t.requires_grad()) continue;
    autograd::register_hook(t, [weak_state, weak_handle, has_handle](const Tensor& /*grad*/) {
      auto module = weak_state.lock();
      if (!module) return;
      auto locked_handle = weak_handle.lock();
      if (has_handle && !locked_handle) return;
      PreBackwardHook(static_cast<FullyShardedDataParallel&>(*module), locked_handle.get());
    });
    if (handle != nullptr) handle->needs_pre_backward_unshard = true;
  }
  return outputs;
}

// `_register_post_backward_hook`: on the flat parameter's AccumulateGrad, once, in the first
// forward the flat parameter takes part in (kept until the end of backward).
void RegisterPostBackwardHook(FullyShardedDataParallel& state, FlatParamHandle* handle) {
  if (!autograd::GradMode::is_enabled() || handle == nullptr) return;
  const Tensor& flat_param = handle->flat_param();
  if (handle->post_backward_hook_handle.active() || !flat_param.requires_grad()) return;
  std::shared_ptr<autograd::Node> acc_grad = autograd::grad_accumulator(flat_param);
  std::weak_ptr<nn::Module> weak_state = state.weak_from_this();
  std::weak_ptr<FlatParamHandle> weak_handle = handle->weak_from_this();
  handle->post_backward_hook_handle = acc_grad->register_hook(
      [weak_state, weak_handle](const autograd::TensorList&, const autograd::TensorList&) {
        auto module = weak_state.lock();
        auto locked_handle = weak_handle.lock();
        if (module && locked_handle) {
          PostBackwardHook(static_cast<FullyShardedDataParallel&>(*module), *locked_handle);
        }
      });
  handle->post_backward_acc_grad = std::move(acc_grad);
}

// `_register_post_backward_reshard_only_hook`: a flat parameter that does not require grad is
// resharded once the module inputs' gradients are computed.
void RegisterPostBackwardReshardOnlyHook(FullyShardedDataParallel& state,
                                         FlatParamHandle* handle, const Value& args,
                                         const Value& kwargs) {
  if (!autograd::GradMode::is_enabled() || handle == nullptr) return;
  if (handle->post_backward_hook_handle.active() || handle->flat_param().requires_grad()) return;
  autograd::TensorList inp_tensors;
  for (const Value* value : {&args, &kwargs}) {
    for (const Tensor& t : value->tensors()) {
      if (t.defined() && t.requires_grad()) inp_tensors.push_back(t);
    }
  }
  if (inp_tensors.empty()) return;
  std::weak_ptr<nn::Module> weak_state = state.weak_from_this();
  std::weak_ptr<FlatParamHandle> weak_handle = handle->weak_from_this();
  handle->post_backward_hook_handle = autograd::register_multi_grad_hook(
      inp_tensors, [weak_state, weak_handle](const autograd::TensorList&) {
        auto module = weak_state.lock();
        auto locked_handle = weak_handle.lock();
        if (module && locked_handle) {
          PostBackwardReshardOnlyHook(static_cast<FullyShardedDataParallel&>(*module),
                                      *locked_handle);
        }
      });
}

// `_pre_forward_unshard`.
void PreForwardUnshard(FullyShardedDataParallel& state, FlatParamHandle* handle) {
  if (handle == nullptr) return;
  // A prefetched handle is already unsharded (or being unsharded).
  if (!handle->prefetched) Unshard(*handle);
  handle->needs_pre_forward_unshard = false;
  PrefetchHandle(state, handle, PrefetchMode::kForward);
}

// `_post_forward_reshard`: the root keeps its parameters for the imminent backward.
void PostForwardReshard(FullyShardedDataParallel& state, FlatParamHandle* handle) {
  if (handle == nullptr) return;
  const bool free_unsharded_flat_param =
      !state.is_root.value_or(false) && ReshardsAfterForward(handle->sharding_strategy());
  Reshard(*handle, free_unsharded_flat_param);
}

}  // namespace

// ---- Public ------------------------------------------------------------------------------

std::string DescribeInstance(const FullyShardedDataParallel& state) {
  return "FSDP instance '" + state.fqn + "' wrapping " + state.fsdp_wrapped_module()->type_name();
}

std::vector<FullyShardedDataParallel*> GetFsdpStates(const nn::Module& module) {
  std::vector<FullyShardedDataParallel*> out;
  std::set<const FullyShardedDataParallel*> visited;
  for (const nn::ModulePtr& submodule : module.modules()) {
    FullyShardedDataParallel* state = AsFsdp(*submodule);
    if (state != nullptr && visited.insert(state).second) out.push_back(state);
  }
  return out;
}

void AssertInTrainingStates(const FullyShardedDataParallel& state,
                            std::initializer_list<TrainingState> states) {
  for (TrainingState s : states) {
    if (state.training_state == s) return;
  }
  std::string expected;
  for (TrainingState s : states) {
    expected += std::string(expected.empty() ? "" : ", ") + "TrainingState." + TrainingStateName(s);
  }
  FSDP_THROW(ErrorCode::kFailedPrecondition, "expected to be in states [", expected,
             "] but current state is TrainingState.", TrainingStateName(state.training_state),
             " (", DescribeInstance(state), ")");
}

void LazyInit(FullyShardedDataParallel& state) {
  if (state.is_root.has_value()) return;  // already lazily initialized
  // Only the root runs the rest: it sets is_root = false on the others.
  state.is_root = true;
  AssertInTrainingStates(state, {TrainingState::kIdle});
  CheckFlatParamsOnExpectedDevice(state);
  state.all_fsdp_states = GetFsdpStates(state);
  CastBuffersForComputation(state);
  state.exec_order_data = std::make_shared<ExecOrderData>();
  std::vector<FlatParamHandle*> handles;
  for (FullyShardedDataParallel* s : state.all_fsdp_states) {
    if (s->handle) handles.push_back(s->handle.get());
  }
  state.exec_order_data->init(std::move(handles));
  // FQNs from the root, without the wrapper prefixes (also a trailing one: an instance inside
  // a checkpoint wrapper is named after the wrapped module).
  for (const auto& [name, module] : state.named_modules()) {
    if (FullyShardedDataParallel* s = AsFsdp(*module)) {
      const std::string clean = CleanTensorName(name + ".");
      s->fqn = clean.substr(0, clean.size() - 1);
      if (s->handle) s->handle->module_fqn = s->fqn;
    }
  }
  ShareStateAndInitHandleAttrs(state);
}

std::pair<Value, Value> RootPreForward(FullyShardedDataParallel& state, const Value& args,
                                       const Value& kwargs) {
  LazyInit(state);
  if (!state.is_root.value_or(false)) return {args, kwargs};
  if (state.forward_prefetch) {
    for (FullyShardedDataParallel* s : state.all_fsdp_states) {
      if (s->handle) {
        s->handle->needs_pre_forward_unshard = true;
        s->handle->prefetched = false;
      }
    }
  }
  ResetFlatParamGradInfoIfNeeded(AllHandles(state));
  Value new_args = args;
  Value new_kwargs = kwargs;
  if (state.compute_device.is_cuda()) {
    auto to_device = [&state](const Tensor& t) { return t.defined() ? t.to(state.compute_device) : t; };
    new_args = new_args.map_tensors(to_device);
    new_kwargs = new_kwargs.map_tensors(to_device);
  }
  // `_root_cast_forward_input`.
  const bool force_full_precision = state.handle && state.handle->force_full_precision();
  if (!force_full_precision && state.mixed_precision.cast_root_forward_inputs &&
      state.mixed_precision.param_dtype) {
    new_args = CastForwardInputs(new_args, *state.mixed_precision.param_dtype);
    new_kwargs = CastForwardInputs(new_kwargs, *state.mixed_precision.param_dtype);
  }
  return {new_args, new_kwargs};
}

std::pair<Value, Value> PreForward(FullyShardedDataParallel& state, const Value& args,
                                   const Value& kwargs) {
  FlatParamHandle* handle = state.handle.get();
  // Activation-checkpoint recompute: the parameters were unsharded by the pre-backward.
  if (handle != nullptr && handle->training_state == HandleTrainingState::kBackwardPre) {
    return {args, kwargs};
  }
  state.training_state = TrainingState::kForwardBackward;
  state.exec_order_data->record_pre_forward(handle);
  if (handle != nullptr) handle->training_state = HandleTrainingState::kForward;
  PreForwardUnshard(state, handle);
  // Re-registered every forward in case the AccumulateGrad changed.
  RegisterPostBackwardHook(state, handle);
  if (handle != nullptr && handle->offload_params() && !handle->cpu_grad.defined()) {
    handle->cpu_grad = Tensor::zeros(handle->local_shard().sizes(), handle->local_shard().dtype(),
                                     Device::CPU());
  }
  Value new_args = args;
  Value new_kwargs = kwargs;
  if (handle != nullptr && !handle->force_full_precision() &&
      state.mixed_precision.cast_forward_inputs && state.mixed_precision.param_dtype) {
    new_args = CastForwardInputs(new_args, *state.mixed_precision.param_dtype);
    new_kwargs = CastForwardInputs(new_kwargs, *state.mixed_precision.param_dtype);
  }
  RegisterPostBackwardReshardOnlyHook(state, handle, new_args, new_kwargs);
  return {new_args, new_kwargs};
}

Value PostForward(FullyShardedDataParallel& state, const Value& output) {
  FlatParamHandle* handle = state.handle.get();
  if (handle != nullptr && handle->training_state == HandleTrainingState::kBackwardPre) {
    return output;  // checkpoint recompute
  }
  state.exec_order_data->record_post_forward(handle);
  PostForwardReshard(state, handle);
  Value new_output = RegisterPreBackwardHooks(state, output, handle);
  state.training_state = TrainingState::kIdle;
  if (handle != nullptr) handle->training_state = HandleTrainingState::kIdle;
  return new_output;
}

void Unshard(FlatParamHandle& handle) {
  distributed::CommPhaseGuard phase(handle.module_fqn, PhaseOf(handle.training_state));
  handle.pre_unshard();
  // limit_all_gathers' rate limiter waits on CUDA free events; nothing to wait for otherwise.
  if (handle.needs_unshard()) Notify(fsdp2::EventKind::kUnshard, handle);
  handle.unshard();
  handle.post_unshard();
}

void Reshard(FlatParamHandle& handle, bool free_unsharded_flat_param) {
  if (free_unsharded_flat_param) Notify(fsdp2::EventKind::kReshard, handle);
  handle.reshard(free_unsharded_flat_param);
  handle.post_reshard();
  // Freed or not, the next access must "unshard" to switch the views back.
  handle.prefetched = false;
}

void ResetFlatParamGradInfoIfNeeded(const std::vector<FlatParamHandle*>& handles) {
  for (FlatParamHandle* handle : handles) handle->reset_flat_param_grad_info_if_needed();
}

}  // namespace fsdp::fsdp1
