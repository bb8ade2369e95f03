#include "engine/fsdp1/fully_sharded_data_parallel.h"

#include <cmath>
#include <limits>
#include <set>

#include "engine/autograd/grad_mode.h"
#include "engine/core/error.h"
#include "engine/fsdp1/init_utils.h"
#include "engine/fsdp1/runtime_utils.h"
#include "engine/fsdp1/state_dict_utils.h"
#include "engine/fsdp1/wrap.h"
#include "engine/nn/checkpoint.h"
#include "engine/ops/elementwise.h"

namespace fsdp::fsdp1 {
namespace {

// Marks a module wrapped by an instance (so that wrapping it again is refused).
constexpr const char* kWrappedAttachment = "fsdp1.fully_sharded_data_parallel";

// sum |g|^p (p finite) or max |g| (p infinite) over `grads`, in double.
double LocalNormPower(const std::vector<Tensor>& grads, double norm_type) {
  double acc = 0.0;
  for (const Tensor& g : grads) {
    for (double v : g.to_doubles()) {
      const double a = std::fabs(v);
      acc = std::isinf(norm_type) ? std::max(acc, a) : acc + std::pow(a, norm_type);
    }
  }
  return acc;
}

// torch.promote_types over floating dtypes (float32 when there is none).
DType PromoteFloatingTypes(const std::vector<Tensor>& tensors) {
  std::set<DType> dtypes;
  for (const Tensor& t : tensors) dtypes.insert(t.dtype());
  if (dtypes.empty()) return DType::kFloat32;
  if (dtypes.count(DType::kFloat64)) return DType::kFloat64;
  if (dtypes.size() == 1) return *dtypes.begin();
  return DType::kFloat32;  // float32 present, or float16 with bfloat16
}

}  // namespace

FullyShardedDataParallel* AsFsdp(nn::Module& module) {
  return dynamic_cast<FullyShardedDataParallel*>(&module);
}

const FullyShardedDataParallel* AsFsdp(const nn::Module& module) {
  return dynamic_cast<const FullyShardedDataParallel*>(&module);
}

// ---- NoSync ------------------------------------------------------------------------------

NoSync::NoSync(NoSync&& other) noexcept : old_flags_(std::move(other.old_flags_)) {
  other.old_flags_.clear();
}

NoSync::~NoSync() {
  for (auto& [state, old_flag] : old_flags_) state->sync_gradients = old_flag;
}

// ---- Construction ------------------------------------------------------------------------

FullyShardedDataParallel::FullyShardedDataParallel(nn::ModulePtr module,
                                                   FullyShardedDataParallelOptions options)
    : nn::Module("FullyShardedDataParallel"), options_(std::move(options)) {
  FSDP_CHECK(module != nullptr, "FullyShardedDataParallel: null module");
  const std::string who = DescribeWrappedModule(*module);
  FSDP_CHECK(module->attachment(kWrappedAttachment) == nullptr,
             "FSDP has already been applied to this ", module->type_name(),
             " (it is the `_fsdp_wrapped_module` of an FSDP instance); wrap each module once");
  InitIgnoredModuleStates(*this, *module, options_.ignored_modules);
  InitProcessGroupState(*this, options_, options_.auto_wrap_policy != nullptr, who);
  if (options_.auto_wrap_policy) {
    // Children get the root's arguments (hybrid strategies: the resolved group pair, so
    // that every instance shares the same groups).
    FullyShardedDataParallelOptions root_options = options_;
    root_options.auto_wrap_policy = nullptr;
    if (IsHybridStrategy(options_.sharding_strategy) && !options_.device_mesh) {
      root_options.process_group = process_group;
      root_options.inter_node_process_group = inter_node_process_group;
    }
    AutoWrap(module, *options_.auto_wrap_policy, ignored_modules, ignored_params, root_options);
  }
  InitCoreState(*this, options_);
  InitBufferState(*this, *module);
  InitParamHandleFromModule(*this, *module, options_.sync_module_states, who);
  register_module(kFsdpWrappedModule, module);
  if (!use_orig_params && handle) {
    // `_register_flat_param`: the flat parameter is `.module`'s `_flat_param`.
    this->module()->register_parameter(kFlatParam, handle->flat_param(),
                                       handle->flat_param().requires_grad());
  }
  module->set_attachment(kWrappedAttachment, std::make_shared<bool>(true));
  RegisterAllStateDictHooks(*this);
}

FullyShardedDataParallel::~FullyShardedDataParallel() {
  if (const nn::ModulePtr* wrapped = child_slots().find(kFsdpWrappedModule); wrapped && *wrapped) {
    (*wrapped)->remove_attachment(kWrappedAttachment);
  }
}

nn::ModulePtr FullyShardedDataParallel::module() const {
  nn::ModulePtr wrapped = fsdp_wrapped_module();
  if (auto checkpoint_wrapper = std::dynamic_pointer_cast<nn::CheckpointWrapper>(wrapped)) {
    return checkpoint_wrapper->wrapped_module();
  }
  return wrapped;
}

bool FullyShardedDataParallel::check_is_root() {
  LazyInit(*this);
  return is_root.value_or(false);
}

std::vector<FullyShardedDataParallel*> FullyShardedDataParallel::fsdp_modules(
    const nn::ModulePtr& module, bool root_only) {
  FSDP_CHECK(module != nullptr, "fsdp_modules: null module");
  std::vector<FullyShardedDataParallel*> states = GetFsdpStates(*module);
  if (!root_only) return states;
  std::vector<FullyShardedDataParallel*> roots;
  for (FullyShardedDataParallel* state : states) {
    if (state->check_is_root()) roots.push_back(state);  // forces lazy init
  }
  return roots;
}

// ---- Forward -----------------------------------------------------------------------------

nn::Value FullyShardedDataParallel::forward(const nn::Value& args) {
  return forward_with_kwargs(args, nn::Value::Dict({}));
}

nn::Value FullyShardedDataParallel::forward_with_kwargs(const nn::Value& args,
                                                        const nn::Value& kwargs) {
  auto [root_args, root_kwargs] = RootPreForward(*this, args, kwargs);
  auto [new_args, new_kwargs] = PreForward(*this, root_args, root_kwargs);
  if (handle) {
    FSDP_CHECK_CODE(ErrorCode::kFailedPrecondition,
                    handle->flat_param().device() == compute_device,
                    "Expected `FlatParameter` to be on the compute device ", compute_device.str(),
                    " but got ", handle->flat_param().device().str(), " (", DescribeInstance(*this), ")");
  }
  nn::Value output = fsdp_wrapped_module()->call(new_args, new_kwargs);
  return PostForward(*this, output);
}

std::vector<nn::NamedTensor> FullyShardedDataParallel::named_parameters(
    const std::string& prefix, bool recurse, bool remove_duplicate) const {
  std::vector<nn::NamedTensor> out = nn::Module::named_parameters(prefix, recurse, remove_duplicate);
  if (training_state != TrainingState::kSummonFullParams) return out;
  const std::string fsdp_prefix = kFsdpPrefix;
  for (auto& [name, param] : out) {
    for (size_t pos = name.find(fsdp_prefix); pos != std::string::npos;
         pos = name.find(fsdp_prefix, pos)) {
      name.erase(pos, fsdp_prefix.size());
    }
  }
  return out;
}

// ---- no_sync -----------------------------------------------------------------------------

NoSync FullyShardedDataParallel::no_sync() {
  LazyInit(*this);
  FSDP_CHECK_CODE(ErrorCode::kFailedPrecondition, is_root.value_or(false),
                  "`no_sync()` on inner FSDP instances is not supported. Please call "
                  "`no_sync()` on root FSDP module. (called on the ", DescribeInstance(*this), ")");
  AssertInTrainingStates(*this, {TrainingState::kIdle});
  std::vector<std::pair<FullyShardedDataParallel*, bool>> old_flags;
  for (FullyShardedDataParallel* state : GetFsdpStates(*this)) {
    old_flags.emplace_back(state, state->sync_gradients);
    state->sync_gradients = false;
  }
  return NoSync(std::move(old_flags));
}

// ---- clip_grad_norm_ ---------------------------------------------------------------------

Tensor FullyShardedDataParallel::clip_grad_norm_(double max_norm, double norm_type) {
  LazyInit(*this);
  FSDP_CHECK_CODE(ErrorCode::kFailedPrecondition, is_root.value_or(false),
                  "`clip_grad_norm_()` should only be called on the root FSDP instance (called "
                  "on the ", DescribeInstance(*this), ")");
  AssertInTrainingStates(*this, {TrainingState::kIdle});
  autograd::NoGradGuard no_grad;
  // Sharded flat parameters (or their original parameters) contribute their shards, which
  // are summed over the shard group; NO_SHARD and unmanaged parameters are counted once.
  std::set<const TensorImpl*> seen;
  std::vector<Tensor> sharded_grads;
  std::vector<Tensor> nonsharded_grads;
  bool any_sharded = false;
  for (FlatParamHandle* h : exec_order_data->all_handles()) {
    const bool sharded = h->uses_sharded_strategy();
    any_sharded = any_sharded || sharded;
    std::vector<Tensor> params =
        h->use_orig_params() ? h->orig_params() : std::vector<Tensor>{h->flat_param()};
    for (const Tensor& p : params) {
      if (!seen.insert(p.impl()).second) continue;
      if (Tensor g = p.grad(); g.defined()) (sharded ? sharded_grads : nonsharded_grads).push_back(g);
    }
  }
  for (const Tensor& p : parameters()) {
    if (!seen.insert(p.impl()).second) continue;  // FSDP-managed
    if (Tensor g = p.grad(); g.defined()) nonsharded_grads.push_back(g);
  }
  const bool inf = std::isinf(norm_type);
  double total = 0.0;
  if (!any_sharded) {
    // Every instance uses NO_SHARD: torch.nn.utils.clip_grad_norm_ over the local gradients.
    const double local = LocalNormPower(nonsharded_grads, norm_type);
    total = inf ? local : std::pow(local, 1.0 / norm_type);
  } else if (inf) {
    // The local maximum over both parts, then the maximum over the ranks: gradients FSDP does
    // not reduce (those of ignored_modules) differ per rank, and every rank's counts.
    Tensor reduced = Tensor::full({1},
                                  std::max(LocalNormPower(sharded_grads, norm_type),
                                           LocalNormPower(nonsharded_grads, norm_type)),
                                  DType::kFloat32, compute_device);
    process_group->all_reduce(reduced, distributed::Max());
    total = reduced.item();
  } else {
    Tensor reduced = Tensor::full({1}, LocalNormPower(sharded_grads, norm_type), DType::kFloat32,
                                  compute_device);
    process_group->all_reduce(reduced, distributed::Sum());
    // All-reducing the non-sharded part would count it world-size times.
    total = std::pow(reduced.item() + LocalNormPower(nonsharded_grads, norm_type), 1.0 / norm_type);
  }
  const double clip_coef_clamped = std::min(max_norm / (total + 1e-6), 1.0);
  std::vector<Tensor> grads = sharded_grads;
  grads.insert(grads.end(), nonsharded_grads.begin(), nonsharded_grads.end());
  for (Tensor& g : grads) g.copy_(ops::kernels::MulScalar(g, clip_coef_clamped));
  // The "largest" gradient dtype (float32 for a rank without gradients).
  return Tensor::full({}, total, PromoteFloatingTypes(grads),
                      cpu_offload.offload_params ? Device::CPU() : compute_device);
}

}  // namespace fsdp::fsdp1
