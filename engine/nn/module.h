// Module: the C++ counterpart of torch.nn.Module (module.py), with PyTorch's naming, state-dict
// and forward-hook semantics. See docs/modules.md, "[Note: names]" and "[Note: forward call
// order]".
//
// A module owns three insertion-ordered registries, exactly like `_parameters`, `_buffers` and
// `_modules`:
//   * parameter slots: name → leaf Tensor (or undefined = None). Slots are replaceable:
//     set_parameter() swaps the tensor in place (`module._parameters[name] = t`), which is how
//     FSDP switches a module between its sharded and unsharded parameters.
//   * buffer slots: name → Tensor, persistent (in state_dict) or not.
//   * children: name → shared_ptr<Module> (or nullptr = None).
// Subclasses MUST read their parameters, buffers and children through these registries at
// every forward (parameter("weight"), call_child("lin1", x)), never cache them in members:
// FSDP swaps parameter slots, and wrappers (checkpoint_wrapper, FSDP1) replace children.
//
// Naming (named_modules / named_parameters / named_buffers) is a pre-order DFS with own
// entries before children's; with remove_duplicate a module or tensor seen before (identity)
// is skipped, so shared submodules and tied parameters keep their first name. state_dict()
// and load_state_dict() do not deduplicate: every path appears.
//
// operator()/call() run PyTorch's `_call_impl`: global then module forward pre-hooks, forward,
// global then module forward hooks; on an exception the always_call forward hooks that have
// not run yet still run, then the exception propagates.
//
// Ownership: modules are held by std::shared_ptr (shared submodules are shared pointers; the
// root must be owned by a shared_ptr for named_modules() to return it). Parameters and buffers
// are Tensor handles; a tied parameter is the same Tensor in two slots.
// Thread-safety: none; a module tree belongs to one rank's thread (global hooks are per rank).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <typeindex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/autograd/hooks.h"
#include "engine/core/device.h"
#include "engine/core/dtype.h"
#include "engine/core/tensor.h"
#include "engine/nn/ordered_dict.h"
#include "engine/nn/value.h"

namespace fsdp::nn {

class Module;
using ModulePtr = std::shared_ptr<Module>;
using NamedTensor = std::pair<std::string, Tensor>;
using NamedModule = std::pair<std::string, ModulePtr>;

// Where a sharded state-dict entry's tensor (this rank's piece, unpadded) lies in the global
// tensor: what FSDP's sharded state dicts carry (a ShardedTensor in FSDP1's SHARDED_STATE_DICT,
// a Shard(0) DTensor in FSDP2's state_dict()). The pieces of all ranks tile the global tensor.
struct ShardedEntry {
  Shape global_shape;            // the unsharded tensor's shape
  std::vector<int64_t> offsets;  // the piece's offset in every dimension of global_shape
};

// A state dict: FQN → tensor in PyTorch's order, plus `_metadata` (module prefix without the
// trailing dot → the module class's version) as state_dict() records it. A dict built by hand
// has no metadata, which (as in PyTorch) makes BatchNorm accept a missing num_batches_tracked.
// `sharded` marks the entries whose tensor is one rank's piece of a larger tensor (keyed like
// the entries; an entry without one is a full tensor). rename() keeps both in step.
class StateDict : public OrderedDict<Tensor> {
 public:
  using OrderedDict<Tensor>::OrderedDict;
  OrderedDict<int64_t> metadata;
  OrderedDict<ShardedEntry> sharded;

  // Moves `key` (with its sharding) to `new_key` at the end, as Python's
  // `d[new_key] = d.pop(key)` does. No-op when `key` is absent.
  void rename(const std::string& key, const std::string& new_key);
  // The sharding of `key`, or nullptr for a full tensor.
  const ShardedEntry* sharding(const std::string& key) const { return sharded.find(key); }
};

// torch.nn.modules.module._IncompatibleKeys.
struct IncompatibleKeys {
  std::vector<std::string> missing_keys;
  std::vector<std::string> unexpected_keys;
};

// The lists shared by every module of one load_state_dict() call (PyTorch passes them to each
// `_load_from_state_dict` and to the load hooks).
struct LoadStateDictState {
  IncompatibleKeys keys;
  std::vector<std::string> error_msgs;
  bool assign = false;  // Default: false (copy into the existing tensors)
};

// The handle every register_*_hook returns (torch.utils.hooks.RemovableHandle), shared with
// the autograd hooks: remove() once, later calls and calls after the module died are no-ops.
using RemovableHandle = autograd::RemovableHandle;

// Forward pre-hook (module, args) → replacement args or nullopt (None).
using ForwardPreHook = std::function<std::optional<Value>(Module& module, const Value& args)>;
// with_kwargs=True pre-hook (module, args, kwargs) → replacement (args, kwargs) or nullopt.
using ForwardPreHookWithKwargs = std::function<std::optional<std::pair<Value, Value>>(
    Module& module, const Value& args, const Value& kwargs)>;
// Forward hook (module, args, output) → replacement output or nullopt.
using ForwardHook =
    std::function<std::optional<Value>(Module& module, const Value& args, const Value& output)>;
// with_kwargs=True forward hook (module, args, kwargs, output) → replacement output or nullopt.
using ForwardHookWithKwargs = std::function<std::optional<Value>(
    Module& module, const Value& args, const Value& kwargs, const Value& output)>;

struct ForwardPreHookOptions {
  bool prepend = false;  // Default: false (run after the hooks registered earlier)
};
struct ForwardHookOptions {
  bool prepend = false;      // Default: false
  bool always_call = false;  // Default: false (skipped when forward or an earlier hook throws)
};

// state_dict pre-hook (module, prefix, keep_vars), run before the module saves its entries.
using StateDictPreHook =
    std::function<void(Module& module, const std::string& prefix, bool keep_vars)>;
// state_dict post-hook (module, state_dict, prefix): may rewrite the destination in place
// (PyTorch's `_register_state_dict_hook`).
using StateDictPostHook =
    std::function<void(Module& module, StateDict& state_dict, const std::string& prefix)>;
// load_state_dict pre-hook (module, local state_dict, prefix, shared lists): may rewrite the
// keys this module and its children will see (`_register_load_state_dict_pre_hook(...,
// with_module=True)`).
using LoadStateDictPreHook = std::function<void(
    Module& module, StateDict& state_dict, const std::string& prefix, LoadStateDictState& state)>;
// load_state_dict post-hook (module, incompatible_keys): may edit the shared lists in place.
using LoadStateDictPostHook = std::function<void(Module& module, IncompatibleKeys& keys)>;

namespace detail {
// One registered forward pre-hook / forward hook (internal to Module and the global hooks).
struct ForwardPreHookEntry {
  uint64_t id;
  ForwardPreHook hook;
  ForwardPreHookWithKwargs hook_with_kwargs;  // set for with_kwargs hooks
};
struct ForwardHookEntry {
  uint64_t id;
  bool always_call;
  ForwardHook hook;
  ForwardHookWithKwargs hook_with_kwargs;  // set for with_kwargs hooks
};
}  // namespace detail

// Global (all modules of the calling rank) forward hooks: torch.nn.modules.module.
// register_module_forward_pre_hook / register_module_forward_hook. They run before every
// module's own hooks and are called without kwargs.
RemovableHandle RegisterModuleForwardPreHook(ForwardPreHook hook);
RemovableHandle RegisterModuleForwardHook(ForwardHook hook, bool always_call = false);

class Module : public std::enable_shared_from_this<Module> {
 public:
  // `type_name` is the class name PyTorch prints and reports (`_get_name()`), e.g. "Linear".
  explicit Module(std::string type_name = "Module");
  virtual ~Module();
  Module& operator=(const Module&) = delete;

  const std::string& type_name() const { return type_name_; }
  // Renames the class as reported and printed (FSDP2 swaps a module's class to FSDP<Class>).
  void set_type_name(std::string type_name) { type_name_ = std::move(type_name); }
  // The module's own one-line description ("in_features=8, out_features=16, bias=True").
  virtual std::string extra_repr() const { return ""; }
  // PyTorch's repr(module): type name, extra_repr and indented children.
  std::string repr() const;

  // ---- Registration ---------------------------------------------------------------------------
  // nn.Module.register_parameter: `param` must be a leaf (or undefined = None); its
  // requires_grad is set to `requires_grad` (nn.Parameter(t, requires_grad)). Registering an
  // existing parameter name replaces it in place (this is how weight tying is written:
  // output->register_parameter("weight", tok->parameter("weight"))).
  Tensor register_parameter(const std::string& name, Tensor param, bool requires_grad = true);
  // nn.Module.register_buffer. Non-persistent buffers are in named_buffers() but not in
  // state_dict().
  Tensor register_buffer(const std::string& name, Tensor buffer, bool persistent = true);
  // nn.Module.register_module / add_module; nullptr registers a None child. Registering an
  // existing child name replaces the child in place.
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    register_module_impl(name, module);
    return module;
  }
  void register_module(const std::string& name, std::nullptr_t) {
    register_module_impl(name, nullptr);
  }

  // ---- Slots (own entries, no recursion) ------------------------------------------------------
  bool has_parameter(const std::string& name) const { return parameters_.contains(name); }
  // The tensor in parameter slot `name` (undefined for a None parameter), or the plain tensor
  // attribute `name` when there is no such slot (what `self.weight` reads in a Python forward).
  Tensor parameter(const std::string& name) const;
  // Replaces the tensor in an existing parameter slot without any check, keeping its position
  // (`module._parameters[name] = value`). FSDP's sharded ↔ unsharded swap.
  void set_parameter(const std::string& name, Tensor value);
  // `module._parameters[name] = value` for any tensor, a non-leaf included: sets the slot (a
  // new name at the end), leaving a plain tensor attribute of that name in place. FSDP1 under
  // use_orig_params lists its unsharded views among the parameters this way during forward.
  void set_parameter_slot(const std::string& name, Tensor value);
  // Removes a parameter slot (delattr).
  void remove_parameter(const std::string& name);
  // ---- Plain tensor attributes ----------------------------------------------------------------
  // `setattr(module, name, tensor)` for a tensor that is not a Parameter: an attribute outside
  // the parameter, buffer and child registries, so named_parameters(), parameters(),
  // state_dict() and load_state_dict() do not see it, while parameter(name) returns it. FSDP1
  // (use_orig_params=False) deletes the original parameters and sets its views into the flat
  // parameter this way. Setting a name that is a parameter, buffer or child throws
  // InvalidArgument; register_parameter(name, ...) removes the attribute (as Python's
  // `Module.__setattr__` does for a Parameter).
  void set_tensor_attribute(const std::string& name, Tensor value);
  bool has_tensor_attribute(const std::string& name) const;
  // Removes the attribute (delattr); a no-op when there is none.
  void remove_tensor_attribute(const std::string& name);

  bool has_buffer(const std::string& name) const { return buffers_.contains(name); }
  Tensor buffer(const std::string& name) const;
  // Replaces the tensor in an existing buffer slot, keeping position and persistence.
  void set_buffer(const std::string& name, Tensor value);
  void remove_buffer(const std::string& name);
  bool is_persistent_buffer(const std::string& name) const;
  bool has_child(const std::string& name) const { return children_.contains(name); }
  // The child named `name` (nullptr for a None child); throws NotFound if not registered.
  ModulePtr child(const std::string& name) const;
  template <typename M>
  std::shared_ptr<M> child_as(const std::string& name) const {
    return std::dynamic_pointer_cast<M>(child(name));
  }
  // Calls child `name` (its full operator(), hooks included).
  Value call_child(const std::string& name, Value args);

  // The raw registries, in registration order.
  const OrderedDict<Tensor>& parameter_slots() const { return parameters_; }
  const OrderedDict<Tensor>& buffer_slots() const { return buffers_; }
  const OrderedDict<ModulePtr>& child_slots() const { return children_; }

  // ---- Traversal (module.py semantics) --------------------------------------------------------
  // Pre-order DFS over (prefix, module), the root first under `prefix`.
  std::vector<NamedModule> named_modules(const std::string& prefix = "",
                                         bool remove_duplicate = true) const;
  std::vector<ModulePtr> modules() const;
  // Non-None children, each module once (first name wins).
  std::vector<NamedModule> named_children() const;
  std::vector<ModulePtr> children() const;
  // Own parameters first, then each module's in named_modules() order; with remove_duplicate
  // a tensor already yielded (identity) is skipped. Virtual: CheckpointWrapper strips its
  // `_checkpoint_wrapped_module.` prefix when called on the wrapper itself.
  virtual std::vector<NamedTensor> named_parameters(const std::string& prefix = "",
                                                    bool recurse = true,
                                                    bool remove_duplicate = true) const;
  std::vector<Tensor> parameters(bool recurse = true) const;
  // Includes non-persistent buffers.
  std::vector<NamedTensor> named_buffers(const std::string& prefix = "", bool recurse = true,
                                         bool remove_duplicate = true) const;
  std::vector<Tensor> buffers(bool recurse = true) const;
  // nn.Module.get_submodule("layers.0.attention"); "" is the module itself.
  ModulePtr get_submodule(const std::string& target) const;
  // nn.Module.get_parameter / get_buffer by FQN.
  Tensor get_parameter(const std::string& target) const;
  Tensor get_buffer(const std::string& target) const;
  // nn.Module.apply: fn on every child's subtree (children() order), then on this module.
  void apply(const std::function<void(Module&)>& fn);

  // ---- Modes and conversions ------------------------------------------------------------------
  // Sets training mode on this module and (recursively) its children.
  virtual Module& train(bool mode = true);
  Module& eval() { return train(false); }
  bool is_training() const { return training_; }
  // nn.Module.zero_grad over parameters().
  void zero_grad(bool set_to_none = true);
  // nn.Module.requires_grad_ over parameters().
  Module& requires_grad_(bool requires_grad = true);
  // Converts floating-point parameters and buffers (and their grads) in place, preserving
  // tensor identity (`param.data = param.data.to(...)`), so tied weights stay tied.
  Module& to(DType dtype);
  Module& to(Device device);

  // ---- Forward --------------------------------------------------------------------------------
  Value operator()(Value args) { return call(std::move(args), Value::Dict({})); }
  // nn.Module.__call__ with kwargs (a dict Value).
  Value call(Value args, Value kwargs);
  // The module's computation. `args` is the single positional input (use a tuple Value for
  // several).
  virtual Value forward(const Value& args);
  // The computation with keyword arguments; the default accepts only an empty dict/None.
  virtual Value forward_with_kwargs(const Value& args, const Value& kwargs);

  RemovableHandle register_forward_pre_hook(ForwardPreHook hook,
                                            ForwardPreHookOptions options = {});
  RemovableHandle register_forward_pre_hook_with_kwargs(ForwardPreHookWithKwargs hook,
                                                        ForwardPreHookOptions options = {});
  RemovableHandle register_forward_hook(ForwardHook hook, ForwardHookOptions options = {});
  RemovableHandle register_forward_hook_with_kwargs(ForwardHookWithKwargs hook,
                                                    ForwardHookOptions options = {});
  size_t num_forward_pre_hooks() const;
  size_t num_forward_hooks() const;

  // ---- State dict -----------------------------------------------------------------------------
  // Own non-None parameters, then own non-None persistent buffers, then each non-None child
  // recursively; every path, no dedupe. Values are detached unless keep_vars.
  StateDict state_dict(const std::string& prefix = "", bool keep_vars = false);
  // The recursive step of state_dict() into an existing destination (`state_dict(destination=
  // ..., prefix=...)`).
  void state_dict_into(StateDict& destination, const std::string& prefix, bool keep_vars);
  // Copies (or with `assign`, installs) the tensors of `state_dict`. Throws InvalidArgument
  // with PyTorch's text ("Error(s) in loading state_dict for <Class>:\n\t...") when strict and
  // keys are missing/unexpected, and for size mismatches even when not strict.
  IncompatibleKeys load_state_dict(const StateDict& state_dict, bool strict = true,
                                   bool assign = false);

  RemovableHandle register_state_dict_pre_hook(StateDictPreHook hook);
  RemovableHandle register_state_dict_post_hook(StateDictPostHook hook);
  RemovableHandle register_load_state_dict_pre_hook(LoadStateDictPreHook hook);
  RemovableHandle register_load_state_dict_post_hook(LoadStateDictPostHook hook);

  // The class's `_version` recorded in state-dict metadata (1 unless a subclass changes it).
  virtual int64_t version() const { return 1; }

  // ---- Copies ---------------------------------------------------------------------------------
  // copy.deepcopy(module): a new tree with cloned parameters and buffers (same requires_grad,
  // no grads), shared submodules and tied parameters stay shared inside the copy, hooks are
  // copied (the same callables). Attachments are not copied. Every module class in the tree
  // must derive from Cloneable<T>.
  ModulePtr deep_copy() const;

  // ---- Attachments ----------------------------------------------------------------------------
  // Per-module state owned by other units (composable APIs: checkpoint, fully_shard), keyed by
  // name, like the `_composable` registry of torch.distributed._composable.
  void set_attachment(const std::string& key, std::shared_ptr<void> value);
  std::shared_ptr<void> attachment(const std::string& key) const;
  template <typename T>
  std::shared_ptr<T> attachment_as(const std::string& key) const {
    return std::static_pointer_cast<T>(attachment(key));
  }
  void remove_attachment(const std::string& key);

  // shared_ptr to this module; throws FailedPrecondition if it is not owned by a shared_ptr.
  ModulePtr shared() const;

 protected:
  // Shallow copy for Cloneable: registries hold the same tensors and children (deep_copy
  // replaces them), hook lists are copied.
  Module(const Module& other);

  // A shallow copy of the most-derived object (Cloneable<T> implements it).
  virtual ModulePtr shallow_copy() const;

  // `_save_to_state_dict`: own parameters then own persistent buffers.
  virtual void save_to_state_dict(StateDict& destination, const std::string& prefix,
                                  bool keep_vars) const;
  // `_load_from_state_dict`: runs the load pre-hooks, loads own entries, records missing and
  // unexpected keys. `version` is the metadata version recorded for this module, if any.
  virtual void load_from_state_dict(StateDict& state_dict, const std::string& prefix,
                                    std::optional<int64_t> version, LoadStateDictState& state);

 private:
  using PreHookEntry = detail::ForwardPreHookEntry;
  using HookEntry = detail::ForwardHookEntry;
  template <typename Fn>
  struct FnEntry {
    uint64_t id;
    Fn fn;
  };
  struct DeepCopyMemo;

  void register_module_impl(const std::string& name, ModulePtr module);
  void check_new_name(const std::string& name, const char* kind) const;
  // named_modules() over raw pointers (works on a root not owned by a shared_ptr).
  void collect_modules(const std::string& prefix, bool remove_duplicate,
                       std::set<const Module*>* memo,
                       std::vector<std::pair<std::string, const Module*>>* out) const;
  const Module* find_submodule(const std::string& target) const;
  std::vector<NamedTensor> named_members(const std::string& prefix, bool recurse,
                                         bool remove_duplicate, bool buffers) const;
  void load_recursive(StateDict& local_state_dict, const std::string& prefix, const StateDict& full,
                      LoadStateDictState& state);
  ModulePtr deep_copy_impl(DeepCopyMemo& memo) const;
  Value call_impl(Value& args, Value& kwargs);
  uint64_t next_hook_id() { return ++hook_id_counter_; }

  std::string type_name_;
  bool training_ = true;
  OrderedDict<Tensor> parameters_;
  OrderedDict<Tensor> buffers_;
  std::set<std::string> non_persistent_buffers_;
  OrderedDict<ModulePtr> children_;
  std::unordered_map<std::string, Tensor> tensor_attributes_;

  uint64_t hook_id_counter_ = 0;
  std::shared_ptr<std::vector<PreHookEntry>> forward_pre_hooks_;
  std::shared_ptr<std::vector<HookEntry>> forward_hooks_;
  std::shared_ptr<std::vector<FnEntry<StateDictPreHook>>> state_dict_pre_hooks_;
  std::shared_ptr<std::vector<FnEntry<StateDictPostHook>>> state_dict_post_hooks_;
  std::shared_ptr<std::vector<FnEntry<LoadStateDictPreHook>>> load_pre_hooks_;
  std::shared_ptr<std::vector<FnEntry<LoadStateDictPostHook>>> load_post_hooks_;

  std::unordered_map<std::string, std::shared_ptr<void>> attachments_;
};

// CRTP helper that gives a module class deep_copy() support: `class Linear : public
// Cloneable<Linear>`; for a class deriving from another module class, name it as Base:
// `class MLPStack : public Cloneable<MLPStack, Sequential>`. Derived must be copy-constructible
// (its members are configuration only, see Module's header comment).
template <typename Derived, typename Base = Module>
class Cloneable : public Base {
 public:
  using Base::Base;

 protected:
  Cloneable(const Cloneable&) = default;
  ModulePtr shallow_copy() const override {
    return std::make_shared<Derived>(static_cast<const Derived&>(*this));
  }
};

// "torch.Size([3, 3])", as PyTorch prints shapes in state-dict errors.
std::string TorchSizeStr(const Shape& shape);

}  // namespace fsdp::nn
