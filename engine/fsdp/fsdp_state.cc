#include "engine/fsdp/fsdp_state.h"

#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <unordered_map>

#include "engine/autograd/engine.h"
#include "engine/autograd/grad_mode.h"
#include "engine/autograd/variable.h"
#include "engine/core/error.h"
#include "engine/distributed/comm_debug_mode.h"
#include "engine/functional/functional.h"
#include "engine/nn/module.h"

namespace fsdp::fsdp2 {
namespace {

using nn::Value;

constexpr const char* kFsdpAttachment = "fully_shard";

// `_cast_fp_tensor`: floating-point tensors not already in `dtype` go through a
// differentiable cast; anything else is returned as is.
Value CastFloatingTensors(const Value& value, DType dtype) {
  if (value.num_tensors() == 0) return value;
  return value.map_tensors([dtype](const Tensor& t) {
    if (!t.defined() || !IsFloatingPoint(t.dtype()) || t.dtype() == dtype) return t;
    return ::fsdp::to(t, dtype);
  });
}

}  // namespace

FsdpState* GetFsdpState(const nn::Module& module) {
  return static_cast<FsdpState*>(module.attachment(kFsdpAttachment).get());
}

FsdpState::FsdpState(std::vector<nn::Module*> modules, Device device,
                     MixedPrecisionPolicy mp_policy, Semantics semantics,
                     bool auto_reshard_after_forward)
    : modules_(std::move(modules)),
      device_(device),
      mp_policy_(mp_policy),
      semantics_(semantics),
      auto_reshard_after_forward_(auto_reshard_after_forward),
      state_ctx_(std::make_shared<StateContext>()),
      comm_ctx_(std::make_shared<CommContext>()) {}

FsdpState::~FsdpState() {
  for (autograd::RemovableHandle& handle : forward_hook_handles_) handle.remove();
}

void FsdpState::register_hooks() {
  std::weak_ptr<FsdpState> weak = weak_from_this();
  if (modules_.size() == 1) {
    forward_hook_handles_.push_back(modules_.front()->register_forward_pre_hook_with_kwargs(
        [weak](nn::Module& module, const Value& args,
               const Value& kwargs) -> std::optional<std::pair<Value, Value>> {
          auto state = weak.lock();
          if (!state) return std::nullopt;
          return state->pre_forward(module, args, kwargs);
        },
        nn::ForwardPreHookOptions{/*prepend=*/true}));
    forward_hook_handles_.push_back(modules_.front()->register_forward_hook(
        [weak](nn::Module& module, const Value& /*args*/,
               const Value& output) -> std::optional<Value> {
          auto state = weak.lock();
          if (!state) return std::nullopt;
          return state->post_forward(module, output);
        },
        nn::ForwardHookOptions{/*prepend=*/false, /*always_call=*/false}));
    return;
  }
  // `_register_group_forward_hooks`: the pre-hook runs upon the first module's pre-forward, the
  // post-hook upon the last module's post-forward; if one of the modules does not run forward,
  // the post-hook does not run.
  for (nn::Module* m : modules_) {
    forward_hook_handles_.push_back(m->register_forward_pre_hook_with_kwargs(
        [weak](nn::Module& module, const Value& args,
               const Value& kwargs) -> std::optional<std::pair<Value, Value>> {
          auto state = weak.lock();
          if (!state || !state->modules_to_run_forward_.empty()) return std::nullopt;
          state->modules_to_run_forward_.insert(state->modules_.begin(), state->modules_.end());
          return state->pre_forward(module, args, kwargs);
        },
        nn::ForwardPreHookOptions{/*prepend=*/true}));
  }
  for (nn::Module* m : modules_) {
    forward_hook_handles_.push_back(m->register_forward_hook(
        [weak](nn::Module& module, const Value& /*args*/,
               const Value& output) -> std::optional<Value> {
          auto state = weak.lock();
          if (!state) return std::nullopt;
          state->modules_to_run_forward_.erase(&module);
          if (!state->modules_to_run_forward_.empty()) return std::nullopt;
          return state->post_forward(module, output);
        },
        nn::ForwardHookOptions{/*prepend=*/false, /*always_call=*/true}));
  }
}

void FsdpState::check_module(const nn::Module& module) const {
  // Module::deep_copy copies hooks but not attachments: the copy's hooks would drive this
  // state. PyTorch refuses deepcopy of an FSDP module.
  FSDP_CHECK_CODE(ErrorCode::kFailedPrecondition,
                  std::find(modules_.begin(), modules_.end(), &module) != modules_.end(),
                  "FSDP does not support deepcopy. Please use state dict for serialization.");
}

// ---- Forward -----------------------------------------------------------------------------

std::optional<std::pair<Value, Value>> FsdpState::pre_forward(nn::Module& module,
                                                              const Value& args,
                                                              const Value& kwargs) {
  check_module(module);
  // Activation-checkpoint recompute: the pre-backward already unsharded the parameters.
  if (training_state_ == TrainingState::kPreBackward) return std::nullopt;
  training_state_ = TrainingState::kForward;
  root_pre_forward();
  // The module's forward, for CommDebugMode: its all-gather and the prefetches it issues are
  // credited to it and to the modules enclosing it (PyTorch's tracker enters the module in a
  // global forward pre-hook, before FSDP's).
  if (forward_comm_depth_) distributed::ExitCommModule(*forward_comm_depth_);
  forward_comm_depth_ =
      distributed::EnterCommModule(comm_module_name(module), distributed::CommPhase::kForward);
  Value new_args = args;
  Value new_kwargs = kwargs;
  if (state_ctx_->iter_forward_root == this && device_.is_cuda()) {
    auto to_device = [this](const Tensor& t) { return t.defined() ? t.to(device_) : t; };
    new_args = new_args.map_tensors(to_device);
    new_kwargs = new_kwargs.map_tensors(to_device);
  }
  if (mp_policy_.cast_forward_inputs && mp_policy_.param_dtype) {
    new_args = CastFloatingTensors(new_args, *mp_policy_.param_dtype);
    new_kwargs = CastFloatingTensors(new_kwargs, *mp_policy_.param_dtype);
  }
  if (param_group_) {
    std::tie(new_args, new_kwargs) = param_group_->pre_forward(new_args, new_kwargs);
  }
  for (FsdpState* state : states_to_forward_prefetch) {
    if (state->param_group_) {
      FsdpParamGroup::prefetch_unshard(*state->param_group_, TrainingState::kForward);
    }
  }
  return std::make_pair(new_args, new_kwargs);
}

std::optional<Value> FsdpState::post_forward(nn::Module& module, const Value& output) {
  check_module(module);
  if (training_state_ == TrainingState::kPreBackward) return std::nullopt;
  if (forward_comm_depth_) {
    distributed::ExitCommModule(*forward_comm_depth_);
    forward_comm_depth_.reset();
  }
  Value new_output = output;
  if (param_group_) new_output = param_group_->post_forward(new_output);
  new_output = register_pre_backward_hook(new_output);
  training_state_ = TrainingState::kIdle;
  if (state_ctx_->iter_forward_root == this) {
    if (comm_ctx_->all_gather_state) {
      // Free the last all-gather result ([Note: implicit forward prefetch]).
      comm_ctx_->all_gather_copy_in_stream().wait_event(comm_ctx_->all_gather_state->event);
      comm_ctx_->all_gather_stream().wait_event(comm_ctx_->all_gather_state->event);
      comm_ctx_->all_gather_state.reset();
    }
    state_ctx_->iter_forward_root = nullptr;
  }
  if (mp_policy_.output_dtype) new_output = CastFloatingTensors(new_output, *mp_policy_.output_dtype);
  return new_output;
}

void FsdpState::root_pre_forward() {
  lazy_init();
  if (state_ctx_->iter_forward_root != nullptr) return;
  state_ctx_->iter_forward_root = this;
  // The all-gather streams wait for the optimizer step before prefetching: for the user's
  // post-optimizer event when one was set (once), else for everything on the current stream.
  if (std::optional<CommEvent>& event = state_ctx_->post_optim_event; event.has_value()) {
    comm_ctx_->wait_all_gather_streams_on_event(*event);
    event.reset();
    return;
  }
  comm_ctx_->all_gather_copy_in_stream().wait_stream(comm_ctx_->current_stream());
  comm_ctx_->all_gather_stream().wait_stream(comm_ctx_->current_stream());
}

// ---- Lazy init ---------------------------------------------------------------------------

void FsdpState::lazy_init() {
  if (is_root_.has_value()) return;  // already initialized
  is_root_ = true;
  if (modules_.size() > 1) {
    std::ostringstream names;
    for (size_t i = 0; i < modules_.size(); ++i) {
      names << (i ? ", " : "") << modules_[i]->type_name();
    }
    FSDP_THROW(ErrorCode::kFailedPrecondition, "FSDP requires a single root module but got [",
               names.str(), "]");
  }
  nn::Module* const root = modules_.front();
  std::set<FsdpState*> visited;
  for (const auto& [name, module] : root->named_modules()) {
    FsdpState* state = GetFsdpState(*module);
    if (state == nullptr || visited.count(state)) continue;  // a state of several modules once
    if (state != this) {
      FSDP_CHECK_CODE(ErrorCode::kFailedPrecondition, !state->is_root_.has_value(),
                      "FSDP state has already been lazily initialized for ", name,
                      "\nFSDP requires running forward through the root module first");
      state->is_root_ = false;
    }
    state_ctx_->all_states.push_back(state);
    visited.insert(state);
  }
  if (param_group_ && LazyInitKeepsRootUnsharded(semantics_, auto_reshard_after_forward_)) {
    // The root does not reshard after forward, since for training its parameters would be
    // freed and all-gathered again immediately: always under torch-2.4, only for None under
    // torch-2.8 (semantics.h).
    param_group_->set_post_forward_mesh_info(std::nullopt);
  }
  init_fqns();
  init_shared_state();
  for (FsdpState* state : state_ctx_->all_states) {
    if (state->param_group_) state->param_group_->lazy_init();
  }
}

void FsdpState::init_fqns() {
  std::unordered_map<const TensorImpl*, FsdpParam*> param_to_fsdp_param;
  std::map<const nn::Module*, FsdpParamGroup*> module_to_group;
  for (FsdpState* state : state_ctx_->all_states) {
    if (!state->param_group_) continue;
    for (const auto& p : state->param_group_->fsdp_params()) {
      param_to_fsdp_param[p->sharded_param().impl()] = p.get();
      if (p->has_unsharded_param()) param_to_fsdp_param[p->unsharded_param().impl()] = p.get();
    }
    for (nn::Module* m : state->param_group_->modules()) {
      module_to_group[m] = state->param_group_.get();
    }
  }
  for (const auto& [name, param] : module()->named_parameters()) {
    auto it = param_to_fsdp_param.find(param.impl());
    if (it != param_to_fsdp_param.end()) it->second->set_fqn(name);
  }
  for (const auto& [name, module] : module()->named_modules()) {
    auto it = module_to_group.find(module.get());
    if (it != module_to_group.end()) it->second->append_module_fqn(name);
  }
  // CommDebugMode's module names (ModTracker._get_mod_name): the root's class name, as
  // fully_shard renames it, then each child's FQN under it.
  const std::string root_name = "FSDP" + module()->type_name();
  for (const auto& [name, module] : module()->named_modules()) {
    FsdpState* state = GetFsdpState(*module);
    if (state == nullptr || state->comm_module_names_.count(module.get())) continue;
    const std::string comm_name = name.empty() ? root_name : root_name + "." + name;
    state->comm_module_names_[module.get()] = comm_name;
    if (state->param_group_ && state->param_group_->comm_module_name().empty()) {
      state->param_group_->set_comm_module_name(comm_name);
    }
  }
}

std::string FsdpState::comm_module_name(const nn::Module& module) const {
  auto it = comm_module_names_.find(&module);
  return it == comm_module_names_.end() ? std::string() : it->second;
}

void FsdpState::init_shared_state() {
  comm_ctx_->lazy_init(device_);
  for (FsdpState* state : state_ctx_->all_states) {
    state->state_ctx_ = state_ctx_;
    state->comm_ctx_ = comm_ctx_;
    if (state->param_group_) state->param_group_->set_comm_ctx(comm_ctx_);
  }
}

// ---- Backward ----------------------------------------------------------------------------

Value FsdpState::register_pre_backward_hook(const Value& output) {
  if (!autograd::GradMode::is_enabled()) return output;
  std::weak_ptr<FsdpState> weak = weak_from_this();
  for (const Tensor& t : output.tensors()) {
    if (!t.defined() || !t.requires_grad()) continue;
    // One hook per output tensor; the group-level pre-backward is guarded, so the first
    // gradient w.r.t. any output of this use triggers it once.
    autograd::register_hook(t, [weak](const Tensor& /*grad*/) {
      if (auto state = weak.lock()) state->pre_backward();
    });
  }
  return output;
}

void FsdpState::pre_backward() {
  // The all-gathers this hook issues (its own, its prefetches) are credited to its module, as
  // PyTorch's tracker enters the module in its backward pre-hook first.
  distributed::CommPhaseGuard comm(comm_module_name(*modules_.front()),
                                   distributed::CommPhase::kBackward);
  training_state_ = TrainingState::kPreBackward;
  register_root_post_backward_final_callback();
  if (param_group_) {
    const bool default_prefetch = states_to_backward_prefetch.empty();
    param_group_->pre_backward(default_prefetch);
  }
  backward_prefetch();
}

void FsdpState::backward_prefetch() {
  for (FsdpState* state : states_to_backward_prefetch) {
    if (state->param_group_) {
      FsdpParamGroup::prefetch_unshard(*state->param_group_, TrainingState::kPreBackward);
    }
  }
}

void FsdpState::register_root_post_backward_final_callback() {
  if (state_ctx_->post_backward_final_callback_queued) return;
  state_ctx_->post_backward_final_callback_queued = true;
  std::weak_ptr<FsdpState> weak = weak_from_this();
  autograd::Engine::queue_callback([weak] {
    if (auto state = weak.lock()) state->root_post_backward_final_callback();
  });
}

void FsdpState::root_post_backward_final_callback() {
  const bool is_last_backward = state_ctx_->is_last_backward;
  for (FsdpState* state : state_ctx_->all_states) {
    FsdpParamGroup* group = state->param_group_.get();
    // [Note: end-of-backward sweep] torch-2.4 (E2 / early E3): only groups still UNSHARDED
    // get the post-backward they missed (inputs without grad, e.g. the root fed token ids).
    // Groups with only a pending (mistargeted) prefetch, or unused, are skipped. So is no group
    // whose pre-backward ran without its post-backward (still PRE_BACKWARD): with
    // set_unshard_in_backward(False) it stayed sharded, but its gradients are on the unsharded
    // parameters all the same. torch-2.8 sweeps every group not yet in POST_BACKWARD.
    const bool swept =
        group != nullptr &&
        (EndOfBackwardSweepsEveryGroup(state->semantics())
             ? group->training_state() != TrainingState::kPostBackward
             : group->is_unsharded() || group->training_state() == TrainingState::kPreBackward);
    if (swept) {
      group->post_backward();
    }
    state->training_state_ = TrainingState::kIdle;
    if (group != nullptr) group->set_training_state(TrainingState::kIdle);
    if (is_last_backward) state->finalize_backward();
  }
  if (is_last_backward) {
    comm_ctx_->post_forward_order.clear();
    if (comm_ctx_->reduce_scatter_state) {
      comm_ctx_->current_stream().wait_event(comm_ctx_->reduce_scatter_state->event);
      comm_ctx_->reduce_scatter_state.reset();
    }
  }
  state_ctx_->post_backward_final_callback_queued = false;
}

void FsdpState::finalize_backward() {
  if (param_group_) param_group_->finalize_backward();
}

}  // namespace fsdp::fsdp2
