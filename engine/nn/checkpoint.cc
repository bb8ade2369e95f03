#include "engine/nn/checkpoint.h"

#include <utility>

namespace fsdp::nn {

namespace {

constexpr const char* kComposableCheckpointKey = "checkpoint";

bool StartsWith(const std::string& s, const std::string& prefix) {
  return s.size() >= prefix.size() && s.compare(0, prefix.size(), prefix) == 0;
}

// Replaces every occurrence of `from` in `s` (str.replace).
std::string ReplaceAll(std::string s, const std::string& from, const std::string& to) {
  size_t pos = 0;
  while ((pos = s.find(from, pos)) != std::string::npos) {
    s.replace(pos, from.size(), to);
    pos += to.size();
  }
  return s;
}

// The state of composable checkpoint(module) (checkpoint.state(module)).
struct ComposableCheckpointState {
  bool enable_hook = true;
  autograd::CheckpointOptions options;
  std::unique_ptr<autograd::CheckpointRegion> region;
};

// Restores enable_hook when a recompute leaves (also through StopRecomputationError).
class NoHookGuard {
 public:
  explicit NoHookGuard(ComposableCheckpointState* state)
      : state_(state), previous_(state->enable_hook) {
    state_->enable_hook = false;
  }
  ~NoHookGuard() { state_->enable_hook = previous_; }
  NoHookGuard(const NoHookGuard&) = delete;
  NoHookGuard& operator=(const NoHookGuard&) = delete;

 private:
  ComposableCheckpointState* state_;
  bool previous_;
};

}  // namespace

void ReplaceByPrefix(StateDict& state_dict, const std::string& old_prefix,
                     const std::string& new_prefix) {
  FSDP_CHECK(old_prefix != new_prefix,
             "_replace_by_prefix: old_prefix and new_prefix must be "
             "distinct (both \"",
             old_prefix, "\")");
  for (const std::string& key : state_dict.keys()) {
    if (!StartsWith(key, old_prefix)) continue;
    const std::string new_key = new_prefix + key.substr(old_prefix.size());
    state_dict.rename(key, new_key);
  }
}

// ---- CheckpointWrapper -------------------------------------------------------------------------

CheckpointWrapper::CheckpointWrapper(ModulePtr module, autograd::CheckpointOptions options)
    : Cloneable<CheckpointWrapper>("CheckpointWrapper"), options_(options) {
  FSDP_CHECK(module != nullptr, "checkpoint_wrapper: the module to wrap is None");
  register_module(kCheckpointWrappedModule, std::move(module));
  // state_dict post hook: strip the prefix so the result loads into an unwrapped module.
  register_state_dict_post_hook([](Module&, StateDict& state_dict, const std::string& prefix) {
    ReplaceByPrefix(state_dict, prefix + kCheckpointPrefix, prefix);
  });
  // load_state_dict pre hook: add the prefix back for the wrapped module's keys.
  register_load_state_dict_pre_hook(
      [](Module&, StateDict& state_dict, const std::string& prefix, LoadStateDictState&) {
        ReplaceByPrefix(state_dict, prefix, prefix + kCheckpointPrefix);
      });
}

Value CheckpointWrapper::forward(const Value& args) {
  return forward_with_kwargs(args, Value::Dict({}));
}

Value CheckpointWrapper::forward_with_kwargs(const Value& args, const Value& kwargs) {
  ModulePtr inner = wrapped_module();
  FSDP_CHECK(inner != nullptr, "CheckpointWrapper: the wrapped module is None");
  const Value packed = Value::Tuple({args, kwargs});
  autograd::CheckpointRegion region(
      [inner, packed](const autograd::TensorList& inputs) {
        const Value p = packed.with_tensors(inputs);
        inner->call(p[0], p[1]);
      },
      packed.tensors(), options_);
  Value out = inner->call(args, kwargs);
  region.exit();
  return out;
}

std::vector<NamedTensor> CheckpointWrapper::named_parameters(const std::string& prefix,
                                                             bool recurse,
                                                             bool remove_duplicate) const {
  std::vector<NamedTensor> out = Module::named_parameters(prefix, recurse, remove_duplicate);
  for (auto& [name, t] : out) name = ReplaceAll(name, kCheckpointPrefix, "");
  return out;
}

std::shared_ptr<CheckpointWrapper> checkpoint_wrapper(ModulePtr module,
                                                      autograd::CheckpointOptions options) {
  return std::make_shared<CheckpointWrapper>(std::move(module), options);
}

namespace {

void RecursiveWrap(const ModulePtr& module, const std::function<bool(Module&)>& check_fn,
                   const autograd::CheckpointOptions& options) {
  for (const auto& [name, child] : module->named_children()) {
    RecursiveWrap(child, check_fn, options);
    if (check_fn(*child)) module->register_module(name, checkpoint_wrapper(child, options));
  }
}

}  // namespace

void apply_activation_checkpointing(const ModulePtr& model,
                                    const std::function<bool(Module&)>& check_fn,
                                    autograd::CheckpointOptions options) {
  FSDP_CHECK(model != nullptr, "apply_activation_checkpointing: model is None");
  RecursiveWrap(model, check_fn, options);
}

// ---- Composable checkpoint ---------------------------------------------------------------------

ModulePtr checkpoint(const ModulePtr& module, autograd::CheckpointOptions options) {
  FSDP_CHECK(module != nullptr, "checkpoint: module is None");
  FSDP_CHECK(!HasComposableCheckpoint(*module),
             "Each distinct composable distributed API can "
             "only be applied to a module once. checkpoint has already been applied to the "
             "following module: ",
             module->type_name());
  auto state = std::make_shared<ComposableCheckpointState>();
  state->options = options;
  module->set_attachment(kComposableCheckpointKey, state);
  std::weak_ptr<ComposableCheckpointState> weak_state = state;
  std::weak_ptr<Module> weak_module = module;

  module->register_forward_pre_hook_with_kwargs(
      [weak_state, weak_module](Module&, const Value& args,
                                const Value& kwargs) -> std::optional<std::pair<Value, Value>> {
        auto st = weak_state.lock();
        if (!st || !st->enable_hook) return std::nullopt;
        const Value packed = Value::Tuple({args, kwargs});
        st->region = std::make_unique<autograd::CheckpointRegion>(
            [weak_state, weak_module, packed](const autograd::TensorList& inputs) {
              auto mod = weak_module.lock();
              auto s = weak_state.lock();
              FSDP_CHECK_CODE(ErrorCode::kFailedPrecondition, mod && s,
                              "checkpoint: the checkpointed module was destroyed before its "
                              "recompute");
              const Value p = packed.with_tensors(inputs);
              NoHookGuard no_hook(s.get());
              mod->call(p[0], p[1]);
            },
            packed.tensors(), st->options);
        return std::nullopt;
      });
  module->register_forward_hook(
      [weak_state](Module&, const Value&, const Value&) -> std::optional<Value> {
        auto st = weak_state.lock();
        if (!st) return std::nullopt;
        if (st->enable_hook && st->region) st->region->exit();
        // Never keep the region past the forward (always_call also clears it on errors).
        st->region.reset();
        return std::nullopt;
      },
      {.prepend = true, .always_call = true});
  return module;
}

bool HasComposableCheckpoint(const Module& module) {
  return module.attachment(kComposableCheckpointKey) != nullptr;
}

Value CheckpointModuleCall(const ModulePtr& module, const Value& args,
                           autograd::CheckpointOptions options) {
  FSDP_CHECK(module != nullptr, "checkpoint: module is None");
  const Value structure = args;
  autograd::CheckpointRegion region(
      [module, structure](const autograd::TensorList& inputs) {
        (*module)(structure.with_tensors(inputs));
      },
      args.tensors(), options);
  Value out = (*module)(args);
  region.exit();
  return out;
}

}  // namespace fsdp::nn
