#include "engine/fsdp/fsdp_param_group.h"

#include <set>
#include <sstream>

#include "engine/autograd/function.h"
#include "engine/autograd/grad_mode.h"
#include "engine/core/error.h"
#include "engine/distributed/comm_debug_mode.h"
#include "engine/fsdp/observer.h"
#include "engine/nn/module.h"
#include "engine/ops/broadcast.h"

namespace fsdp::fsdp2 {
namespace {

using nn::Value;

// Attribution of the group's collectives for CommDebugMode: FORWARD and IDLE (manual
// unshard/reshard) count as forward, everything else as backward.
distributed::CommPhase PhaseOf(TrainingState state) {
  return (state == TrainingState::kForward || state == TrainingState::kIdle)
             ? distributed::CommPhase::kForward
             : distributed::CommPhase::kBackward;
}

std::string DTypesStr(const std::set<std::optional<DType>>& dtypes) {
  std::ostringstream os;
  os << "{";
  bool first = true;
  for (const std::optional<DType>& d : dtypes) {
    os << (first ? "" : ", ") << (d ? std::string("torch.") + DTypeName(*d) : "None");
    first = false;
  }
  os << "}";
  return os.str();
}

}  // namespace

FsdpParamGroup::FsdpParamGroup(std::vector<ParamToShard> params, std::vector<nn::Module*> modules,
                               FsdpMeshInfo mesh_info,
                               std::optional<FsdpMeshInfo> post_forward_mesh_info, Device device,
                               MixedPrecisionPolicy mp_policy, OffloadPolicy offload_policy,
                               Semantics semantics)
    : modules_(std::move(modules)),
      mesh_info_(std::move(mesh_info)),
      post_forward_mesh_info_(std::move(post_forward_mesh_info)),
      device_(device),
      mp_policy_(mp_policy),
      offload_policy_(offload_policy),
      semantics_(semantics),
      comm_ctx_(std::make_shared<CommContext>()) {
  for (ParamToShard& p : params) {
    fsdp_params_.push_back(std::make_unique<FsdpParam>(p.param, std::move(p.module_info),
                                                       mesh_info_, post_forward_mesh_info_,
                                                       device_, offload_policy_,
                                                       p.fsdp_placement));
  }
}

std::vector<FsdpParam*> FsdpParamGroup::fsdp_param_ptrs() const {
  std::vector<FsdpParam*> out;
  out.reserve(fsdp_params_.size());
  for (const auto& p : fsdp_params_) out.push_back(p.get());
  return out;
}

void FsdpParamGroup::append_module_fqn(const std::string& fqn) {
  if (!module_fqn_) {
    module_fqn_ = fqn;
  } else {
    *module_fqn_ += ", " + fqn;
  }
}

std::string FsdpParamGroup::with_fqn(const std::string& label) const {
  return module_fqn_ ? label + " (" + *module_fqn_ + ")" : label;
}

void FsdpParamGroup::set_post_forward_mesh_info(std::optional<FsdpMeshInfo> info) {
  post_forward_mesh_info_ = std::move(info);
  for (auto& p : fsdp_params_) p->set_post_forward_mesh_info(post_forward_mesh_info_);
}

bool FsdpParamGroup::use_post_forward_mesh() const {
  return post_forward_mesh_info_.has_value() &&
         post_forward_mesh_info_->shard_process_group != mesh_info_.shard_process_group;
}

const std::shared_ptr<distributed::ProcessGroup>& FsdpParamGroup::all_gather_process_group() const {
  if (sharded_state_ == ShardedState::kShardedPostForward) {
    return post_forward_mesh_info_->shard_process_group;
  }
  return mesh_info_.shard_process_group;
}

// ---- Lazy init ---------------------------------------------------------------------------

void FsdpParamGroup::lazy_init() {
  comm_ctx_->lazy_init(device_);
  if (is_sharded() && !reset_sharded_params_) {
    for (auto& p : fsdp_params_) p->reset_sharded_param();
    reset_sharded_params_ = true;
  }
  validate_cpu_offload_params();
  init_mixed_precision();
}

void FsdpParamGroup::validate_cpu_offload_params() {
  if (!offload_policy_.offload_to_cpu) return;
  std::vector<std::string> not_on_cpu;
  for (auto& p : fsdp_params_) {
    if (!p->sharded_param().device().is_cpu()) {
      not_on_cpu.push_back("('" + p->fqn() + "', device(type='" +
                           p->sharded_param().device().str() + "'))");
    }
  }
  if (not_on_cpu.empty()) return;
  std::string list = "[";
  for (size_t i = 0; i < not_on_cpu.size(); ++i) list += (i ? ", " : "") + not_on_cpu[i];
  list += "]";
  FSDP_THROW(ErrorCode::kFailedPrecondition,
             "FSDP parameters should be materialized on CPU when enabling CPU offloading. For "
             "example, load a CPU state dict or call module.to_empty(device=\"cpu\"). Found "
             "following parameters on non-CPU device: ",
             list, "\n");
}

void FsdpParamGroup::init_mixed_precision() {
  // Frozen parameters are exempt from the uniformity checks from torch-2.8 on
  // (docs/fsdp-behaviour.md, "Dtypes").
  const bool cover_frozen = DtypeChecksCoverFrozenParams(semantics_);
  std::set<std::optional<DType>> orig_dtypes;
  std::set<std::optional<DType>> reduce_dtypes;
  for (auto& p : fsdp_params_) {
    p->init_dtype_attrs(mp_policy_, semantics_);
    if (!cover_frozen && !p->sharded_param().requires_grad()) continue;
    orig_dtypes.insert(p->orig_dtype());
    reduce_dtypes.insert(p->reduce_dtype());
  }
  if (orig_dtypes.empty()) return;  // no trainable parameters: no orig/reduce dtype
  FSDP_CHECK_CODE(ErrorCode::kInternal, orig_dtypes.size() == 1,
                  "FSDP expects uniform original parameter dtype but got ",
                  DTypesStr(orig_dtypes));
  orig_dtype_ = *orig_dtypes.begin();
  FSDP_CHECK_CODE(ErrorCode::kInternal, reduce_dtypes.size() == 1,
                  "FSDP expects uniform reduce dtype but got ", DTypesStr(reduce_dtypes));
  reduce_dtype_ = *reduce_dtypes.begin();
}

std::optional<DType> FsdpParamGroup::reduce_dtype_without_group_dtype(
    const std::vector<FsdpParam*>& params_with_grad) const {
  if (ReducesInParamDtypeWhenReduceDtypeUnset(semantics_)) return std::nullopt;
  std::optional<DType> promoted;
  for (const FsdpParam* p : params_with_grad) {
    const DType dtype = p->reduce_dtype().value_or(p->orig_dtype());
    promoted = promoted ? ops::kernels::PromoteTypes(*promoted, dtype) : dtype;
  }
  return promoted;
}

// ---- Unshard / reshard -------------------------------------------------------------------

void FsdpParamGroup::unshard(bool async_op) {
  // The event contract of PyTorch's patched unshard: recorded unless a result is pending or
  // the group is already unsharded.
  if (all_gather_result_ == nullptr && sharded_state_ != ShardedState::kUnsharded) {
    internal::NotifyObservers(EventKind::kUnshard, module_fqn(), training_state_);
  }
  if (all_gather_result_ != nullptr) return;  // already called, pending wait
  if (sharded_state_ == ShardedState::kUnsharded) return;  // no-op
  if (!unshard_in_backward && training_state_ == TrainingState::kPreBackward) return;
  comm_ctx_->lazy_init(device_);
  if (reshard_after_forward_event_) {
    // The post-forward-mesh shards were written on the current stream and are read by the
    // all-gather copy-in (FSDP2's _reshard_after_forward_event).
    comm_ctx_->wait_all_gather_streams_on_event(*reshard_after_forward_event_);
    reshard_after_forward_event_.reset();
  }
  auto [copy_in_stream, all_gather_stream] =
      comm_ctx_->get_all_gather_streams(async_op, training_state_);
  // Credited to the module whose hook issues the all-gather (a prefetch: the prefetching
  // module), as PyTorch's CommDebugMode credits the module its tracker is in.
  distributed::CommPhaseGuard phase(PhaseOf(training_state_));
  all_gather_result_ = foreach_all_gather(fsdp_param_ptrs(), all_gather_process_group(),
                                          async_op, *copy_in_stream, *all_gather_stream, device_);
}

void FsdpParamGroup::wait_for_unshard() {
  if (all_gather_result_ == nullptr) return;  // no preceding unshard
  const bool async_op = all_gather_result_->all_gather_work != nullptr;
  if (training_state_ == TrainingState::kForward && comm_ctx_->all_gather_state) {
    // Implicit prefetch: the previous group's all-gather buffer may be freed now (both
    // all-gather streams are ordered after its copy-out first).
    comm_ctx_->wait_all_gather_streams_on_event(comm_ctx_->all_gather_state->event);
    comm_ctx_->all_gather_state.reset();
  }
  foreach_all_gather_copy_out(*all_gather_result_, fsdp_param_ptrs(),
                              all_gather_process_group());
  for (auto& p : fsdp_params_) p->init_unsharded_param();
  to_unsharded();
  CommEvent copy_out_event = comm_ctx_->current_stream().record_event();
  if (!async_op && training_state_ == TrainingState::kForward) {
    // Keep the buffer until the next copy-out ([Note: implicit forward prefetch]).
    comm_ctx_->all_gather_state = AllGatherState{all_gather_result_, copy_out_event};
  } else {
    comm_ctx_->wait_all_gather_streams_on_event(copy_out_event);
  }
  all_gather_result_.reset();
}

void FsdpParamGroup::reshard() {
  const bool post_forward_no_op =
      training_state_ == TrainingState::kForward && !reshard_after_forward();
  if (!post_forward_no_op) {
    internal::NotifyObservers(EventKind::kReshard, module_fqn(), training_state_);
  }
  if (training_state_ == TrainingState::kForward) {
    if (!reshard_after_forward()) return;
    if (use_post_forward_mesh()) {
      to_sharded_post_forward();
      reshard_after_forward_event_ = comm_ctx_->current_stream().record_event();
      return;
    }
  }
  to_sharded();
}

void FsdpParamGroup::to_sharded() {
  if (sharded_state_ == ShardedState::kSharded) return;
  // A pending all-gather issued from the post-forward shards (a mistargeted backward prefetch)
  // is copied out with the post-forward layout: resharding under it would mismatch the
  // copy-out. The torch-2.8 end-of-backward sweep gives such a group its post_backward; it
  // stays SHARDED_POST_FORWARD until the all-gather is consumed or dropped. (PyTorch 2.7 and
  // later do switch to SHARDED here, and their copy-out then views the output over the shard
  // group with the post-forward split sizes and fails in split_with_sizes_copy.)
  if (sharded_state_ == ShardedState::kShardedPostForward && all_gather_result_ != nullptr) return;
  for (auto& p : fsdp_params_) p->to_sharded();
  sharded_state_ = ShardedState::kSharded;
}

void FsdpParamGroup::to_sharded_post_forward() {
  if (sharded_state_ == ShardedState::kShardedPostForward) return;
  FSDP_CHECK_CODE(ErrorCode::kFailedPrecondition, sharded_state_ == ShardedState::kUnsharded,
                  with_fqn("FSDP reshard to the post-forward mesh"), " expects UNSHARDED but got ",
                  ShardedStateName(sharded_state_));
  for (auto& p : fsdp_params_) p->to_sharded_post_forward();
  sharded_state_ = ShardedState::kShardedPostForward;
}

void FsdpParamGroup::to_unsharded() {
  if (sharded_state_ == ShardedState::kUnsharded) return;
  for (auto& p : fsdp_params_) p->to_unsharded();
  sharded_state_ = ShardedState::kUnsharded;
}

// ---- Forward -----------------------------------------------------------------------------

std::pair<Value, Value> FsdpParamGroup::pre_forward(const Value& args, const Value& kwargs) {
  training_state_ = TrainingState::kForward;
  unshard(unshard_async_op);
  wait_for_unshard();
  return register_post_backward_hook(args, kwargs);
}

Value FsdpParamGroup::post_forward(const Value& output) {
  reshard();
  record_post_forward();
  training_state_ = TrainingState::kIdle;
  return output;
}

void FsdpParamGroup::record_post_forward() {
  // One entry per use: a group used twice before backward appears twice.
  const int index = static_cast<int>(comm_ctx_->post_forward_order.size());
  comm_ctx_->post_forward_order.push_back(this);
  post_forward_indices_.push_back(index);
}

std::pair<Value, Value> FsdpParamGroup::register_post_backward_hook(const Value& args,
                                                                    const Value& kwargs) {
  if (!autograd::GradMode::is_enabled()) return {args, kwargs};
  std::vector<Tensor> arg_tensors = args.tensors();
  std::vector<Tensor> kwarg_tensors = kwargs.tensors();
  std::vector<std::pair<int, size_t>> where;  // (0 = args / 1 = kwargs, index)
  autograd::TensorList inputs;
  for (size_t i = 0; i < arg_tensors.size(); ++i) {
    if (arg_tensors[i].defined() && arg_tensors[i].requires_grad()) {
      where.emplace_back(0, i);
      inputs.push_back(arg_tensors[i]);
    }
  }
  for (size_t i = 0; i < kwarg_tensors.size(); ++i) {
    if (kwarg_tensors[i].defined() && kwarg_tensors[i].requires_grad()) {
      where.emplace_back(1, i);
      inputs.push_back(kwarg_tensors[i]);
    }
  }
  if (inputs.empty()) return {args, kwargs};  // no tensors that require gradients
  std::weak_ptr<FsdpParamGroup> weak = weak_from_this();
  // PyTorch's RegisterPostBackwardFunction: identity forward; its backward runs after every
  // gradient inside the module (it sits on the module's inputs).
  autograd::TensorList outputs = autograd::ApplyFunction(
      "RegisterPostBackwardFunctionBackward", inputs,
      [](autograd::FunctionCtx&, const autograd::TensorList& in) { return in; },
      [weak](autograd::FunctionCtx&, const autograd::TensorList& grads) {
        if (auto group = weak.lock()) group->post_backward();
        return grads;
      });
  for (size_t j = 0; j < where.size(); ++j) {
    auto& list = where[j].first == 0 ? arg_tensors : kwarg_tensors;
    list[where[j].second] = outputs[j];
  }
  return {args.with_tensors(arg_tensors), kwargs.with_tensors(kwarg_tensors)};
}

// ---- Backward ----------------------------------------------------------------------------

void FsdpParamGroup::pre_backward(bool default_prefetch) {
  if (training_state_ == TrainingState::kPreBackward) return;
  training_state_ = TrainingState::kPreBackward;
  internal::NotifyObservers(EventKind::kPreBackward, module_fqn(), training_state_);
  unshard(unshard_async_op);  // no-op if prefetched
  wait_for_unshard();
  if (default_prefetch) backward_prefetch();
}

void FsdpParamGroup::backward_prefetch() {
  if (training_state_ != TrainingState::kPreBackward) return;
  if (post_forward_indices_.empty()) return;  // cleared when running several backwards
  const int current_index = post_forward_indices_.back();
  post_forward_indices_.pop_back();
  const int target_index = current_index - 1;
  if (target_index < 0) return;
  // Naive: the previous entry of the post-forward order, which may be mistargeted when not
  // every module used in forward is used in this backward.
  FsdpParamGroup* target = comm_ctx_->post_forward_order.at(static_cast<size_t>(target_index));
  prefetch_unshard(*target, TrainingState::kPreBackward);
}

void FsdpParamGroup::prefetch_unshard(FsdpParamGroup& target, TrainingState pass_state) {
  TrainingStateGuard guard(target, pass_state);
  target.unshard(target.unshard_async_op);
}

void FsdpParamGroup::post_backward() {
  // Idempotent and safe on a group that did not take part in this backward.
  training_state_ = TrainingState::kPostBackward;
  distributed::CommPhaseGuard phase(comm_module_name_, distributed::CommPhase::kBackward);
  for (auto& p : fsdp_params_) p->accumulate_unsharded_grad_if_needed();
  if (!reduce_grads) {
    if (reshard_after_backward) reshard();
    for (auto& p : fsdp_params_) p->to_accumulated_grad_if_needed();
    internal::NotifyObservers(EventKind::kPostBackward, module_fqn(), training_state_);
    return;
  }
  // Take the autograd-computed gradients before resharding, while the unsharded parameters
  // are still registered.
  std::vector<FsdpParam*> params_with_grad;
  std::vector<Tensor> unsharded_grads;
  for (auto& p : fsdp_params_) {
    if (!p->has_unsharded_param()) continue;
    if (p->unsharded_accumulated_grad().defined()) {
      params_with_grad.push_back(p.get());
      unsharded_grads.push_back(p->unsharded_accumulated_grad());
      p->clear_unsharded_accumulated_grad();
    } else if (Tensor grad = p->unsharded_grad(); grad.defined()) {
      params_with_grad.push_back(p.get());
      unsharded_grads.push_back(grad);
      Tensor unsharded = p->unsharded_param();
      unsharded.set_grad(Tensor());
    }
  }
  if (reshard_after_backward) reshard();
  if (!params_with_grad.empty()) {
    ForeachReduceOptions options;
    options.orig_dtype = orig_dtype_.value_or(params_with_grad[0]->orig_dtype());
    options.reduce_dtype =
        reduce_dtype_ ? reduce_dtype_ : reduce_dtype_without_group_dtype(params_with_grad);
    options.device = device_;
    if (mesh_info_.is_hsdp()) {
      options.all_reduce_group = mesh_info_.replicate_process_group;
      options.all_reduce_grads = all_reduce_grads;
      options.partial_reduce_output = partial_reduce_output_;
    }
    options.gradient_divide_factor = gradient_divide_factor;
    options.force_sum_reduction_for_comms = force_sum_reduction_for_comms;
    options.reduce_scatter_stream = &comm_ctx_->reduce_scatter_stream();
    if (mesh_info_.is_hsdp()) options.all_reduce_stream = &comm_ctx_->all_reduce_stream();
    if (comm_ctx_->reduce_scatter_state) {
      // The previous reduce-scatter input is freed when the state is replaced below: order
      // the current stream (and so the free) after that reduce-scatter.
      comm_ctx_->current_stream().wait_event(comm_ctx_->reduce_scatter_state->event);
    }
    ForeachReduceResult result = foreach_reduce(params_with_grad, std::move(unsharded_grads),
                                                mesh_info_.shard_process_group, options);
    if (mesh_info_.is_hsdp()) partial_reduce_output_ = result.partial_reduce_output;
    post_reduce_event_ = result.post_reduce_event;
    comm_ctx_->reduce_scatter_state =
        ReduceScatterState{result.reduce_scatter_input, result.reduce_scatter_event};
  }
  internal::NotifyObservers(EventKind::kPostBackward, module_fqn(), training_state_);
}

void FsdpParamGroup::finalize_backward() {
  if (post_reduce_event_) {
    // The optimizer step (on the current stream) must see the reduced gradient shards.
    comm_ctx_->current_stream().wait_event(*post_reduce_event_);
    post_reduce_event_.reset();
  }
  // With CPU offload the optimizer reads the gradients on the host: wait for their copies.
  for (const auto& fsdp_param : fsdp_params_) fsdp_param->wait_for_grad_offload();
  if (all_gather_result_ != nullptr) {
    // A mistargeted prefetch nobody waited for: wait for it and drop it.
    comm_ctx_->current_stream().wait_event(all_gather_result_->all_gather_event);
    if (all_gather_result_->all_gather_work) all_gather_result_->all_gather_work->wait();
    all_gather_result_.reset();
  }
  post_forward_indices_.clear();
}

TrainingStateGuard::TrainingStateGuard(FsdpParamGroup& group, TrainingState state)
    : group_(group), previous_(group.training_state()) {
  group_.set_training_state(state);
}

TrainingStateGuard::~TrainingStateGuard() { group_.set_training_state(previous_); }

}  // namespace fsdp::fsdp2
