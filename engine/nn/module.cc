#include "engine/nn/module.h"

#include <algorithm>
#include <sstream>
#include <unordered_set>

#include "engine/autograd/variable.h"
#include "engine/core/rank_context.h"

namespace fsdp::nn {

// The calling rank's global module forward hooks (module.py's `_global_forward_pre_hooks` and
// `_global_forward_hooks`), stored in the RankContext so that ranks-as-threads do not share
// them.
struct GlobalModuleHooks {
  uint64_t counter = 0;
  std::shared_ptr<std::vector<detail::ForwardPreHookEntry>> pre =
      std::make_shared<std::vector<detail::ForwardPreHookEntry>>();
  std::shared_ptr<std::vector<detail::ForwardHookEntry>> post =
      std::make_shared<std::vector<detail::ForwardHookEntry>>();

  static GlobalModuleHooks& Current() { return RankContext::Current().slot<GlobalModuleHooks>(); }
};

struct Module::DeepCopyMemo {
  std::unordered_map<const Module*, ModulePtr> modules;
  std::unordered_map<const TensorImpl*, Tensor> tensors;
};

namespace {

template <typename Entry>
RemovableHandle MakeHandle(const std::shared_ptr<std::vector<Entry>>& list, uint64_t id) {
  std::weak_ptr<std::vector<Entry>> weak = list;
  return RemovableHandle([weak, id] {
    if (auto l = weak.lock()) {
      l->erase(std::remove_if(l->begin(), l->end(), [id](const Entry& e) { return e.id == id; }),
               l->end());
    }
  });
}

template <typename Entry>
void InsertEntry(std::vector<Entry>& list, Entry entry, bool prepend) {
  if (prepend) {
    list.insert(list.begin(), std::move(entry));
  } else {
    list.push_back(std::move(entry));
  }
}

// utils/hooks.py-free version of module.py's `_addindent`.
std::string AddIndent(const std::string& s, int num_spaces) {
  std::vector<std::string> lines;
  std::stringstream ss(s);
  std::string line;
  while (std::getline(ss, line, '\n')) lines.push_back(line);
  if (lines.size() <= 1) return s;
  std::string out = lines[0];
  const std::string pad(static_cast<size_t>(num_spaces), ' ');
  for (size_t i = 1; i < lines.size(); ++i) out += "\n" + pad + lines[i];
  return out;
}

std::string JoinQuoted(const std::vector<std::string>& keys) {
  std::string out;
  for (size_t i = 0; i < keys.size(); ++i) out += (i ? ", \"" : "\"") + keys[i] + "\"";
  return out;
}

bool StartsWith(const std::string& s, const std::string& prefix) {
  return s.size() >= prefix.size() && s.compare(0, prefix.size(), prefix) == 0;
}

// Replaces the storage of `t` in place (identity preserved), like `t.data = converted`.
void ReplaceData(const Tensor& t, const Tensor& converted) {
  TensorImpl* impl = t.impl();
  impl->storage = converted.storage();
  impl->storage_offset = converted.storage_offset();
  impl->sizes = converted.sizes();
  impl->dtype = converted.dtype();
  ++impl->version;
}

}  // namespace

std::string TorchSizeStr(const Shape& shape) { return "torch.Size(" + ShapeStr(shape) + ")"; }

RemovableHandle RegisterModuleForwardPreHook(ForwardPreHook hook) {
  auto& g = GlobalModuleHooks::Current();
  const uint64_t id = ++g.counter;
  g.pre->push_back(detail::ForwardPreHookEntry{id, std::move(hook), nullptr});
  return MakeHandle(g.pre, id);
}

RemovableHandle RegisterModuleForwardHook(ForwardHook hook, bool always_call) {
  auto& g = GlobalModuleHooks::Current();
  const uint64_t id = ++g.counter;
  g.post->push_back(detail::ForwardHookEntry{id, always_call, std::move(hook), nullptr});
  return MakeHandle(g.post, id);
}

// ---- Construction ------------------------------------------------------------------------------

Module::Module(std::string type_name)
    : type_name_(std::move(type_name)),
      forward_pre_hooks_(std::make_shared<std::vector<PreHookEntry>>()),
      forward_hooks_(std::make_shared<std::vector<HookEntry>>()),
      state_dict_pre_hooks_(std::make_shared<std::vector<FnEntry<StateDictPreHook>>>()),
      state_dict_post_hooks_(std::make_shared<std::vector<FnEntry<StateDictPostHook>>>()),
      load_pre_hooks_(std::make_shared<std::vector<FnEntry<LoadStateDictPreHook>>>()),
      load_post_hooks_(std::make_shared<std::vector<FnEntry<LoadStateDictPostHook>>>()) {}

Module::~Module() = default;

Module::Module(const Module& other)
    : std::enable_shared_from_this<Module>(),
      type_name_(other.type_name_),
      training_(other.training_),
      parameters_(other.parameters_),
      buffers_(other.buffers_),
      non_persistent_buffers_(other.non_persistent_buffers_),
      children_(other.children_),
      tensor_attributes_(other.tensor_attributes_),
      hook_id_counter_(other.hook_id_counter_),
      forward_pre_hooks_(std::make_shared<std::vector<PreHookEntry>>(*other.forward_pre_hooks_)),
      forward_hooks_(std::make_shared<std::vector<HookEntry>>(*other.forward_hooks_)),
      state_dict_pre_hooks_(
          std::make_shared<std::vector<FnEntry<StateDictPreHook>>>(*other.state_dict_pre_hooks_)),
      state_dict_post_hooks_(
          std::make_shared<std::vector<FnEntry<StateDictPostHook>>>(*other.state_dict_post_hooks_)),
      load_pre_hooks_(
          std::make_shared<std::vector<FnEntry<LoadStateDictPreHook>>>(*other.load_pre_hooks_)),
      load_post_hooks_(
          std::make_shared<std::vector<FnEntry<LoadStateDictPostHook>>>(*other.load_post_hooks_)) {}

ModulePtr Module::shared() const {
  ModulePtr self = std::const_pointer_cast<Module>(weak_from_this().lock());
  FSDP_CHECK_CODE(ErrorCode::kFailedPrecondition, self != nullptr, "module ", type_name_,
                  " is not owned by a std::shared_ptr (create modules with std::make_shared)");
  return self;
}

std::string Module::repr() const {
  std::vector<std::string> extra_lines;
  const std::string extra = extra_repr();
  if (!extra.empty()) {
    std::stringstream ss(extra);
    std::string line;
    while (std::getline(ss, line, '\n')) extra_lines.push_back(line);
  }
  std::vector<std::string> child_lines;
  for (const auto& [name, child] : children_) {
    const std::string child_str = child ? child->repr() : "None";
    child_lines.push_back("(" + name + "): " + AddIndent(child_str, 2));
  }
  std::string out = type_name_ + "(";
  if (!extra_lines.empty() || !child_lines.empty()) {
    if (extra_lines.size() == 1 && child_lines.empty()) {
      out += extra_lines[0];
    } else {
      std::vector<std::string> lines = extra_lines;
      lines.insert(lines.end(), child_lines.begin(), child_lines.end());
      out += "\n";
      for (const auto& l : lines) out += "  " + l + "\n";
    }
  }
  return out + ")";
}

// ---- Registration ------------------------------------------------------------------------------

void Module::check_new_name(const std::string& name, const char* kind) const {
  FSDP_CHECK(name.find('.') == std::string::npos, type_name_, ": ", kind,
             " name can't contain \".\", got: ", name);
  FSDP_CHECK(!name.empty(), type_name_, ": ", kind, " name can't be empty string \"\"");
  const bool is_param = std::string(kind) == "parameter";
  const bool is_buffer = std::string(kind) == "buffer";
  const bool is_module = std::string(kind) == "module";
  const bool taken = (!is_param && parameters_.contains(name)) ||
                     (!is_buffer && buffers_.contains(name)) ||
                     (!is_module && children_.contains(name));
  FSDP_CHECK(!taken, type_name_, ": attribute '", name, "' already exists");
}

Tensor Module::register_parameter(const std::string& name, Tensor param, bool requires_grad) {
  check_new_name(name, "parameter");
  if (param.defined()) {
    FSDP_CHECK(param.grad_fn() == nullptr, "Cannot assign non-leaf Tensor to parameter '", name,
               "'. Model parameters must be created explicitly. To express '", name,
               "' as a function of another Tensor, compute the value in the forward() method.");
    if (requires_grad || param.requires_grad()) param.set_requires_grad(requires_grad);
  }
  tensor_attributes_.erase(name);
  parameters_.insert(name, param);
  return param;
}

Tensor Module::register_buffer(const std::string& name, Tensor buffer, bool persistent) {
  check_new_name(name, "buffer");
  buffers_.insert(name, buffer);
  if (persistent) {
    non_persistent_buffers_.erase(name);
  } else {
    non_persistent_buffers_.insert(name);
  }
  return buffer;
}

void Module::register_module_impl(const std::string& name, ModulePtr module) {
  check_new_name(name, "module");
  children_.insert(name, std::move(module));
}

Tensor Module::parameter(const std::string& name) const {
  if (const Tensor* t = parameters_.find(name)) return *t;
  auto it = tensor_attributes_.find(name);
  FSDP_CHECK_CODE(ErrorCode::kNotFound, it != tensor_attributes_.end(), "'", type_name_,
                  "' object has no parameter '", name, "'");
  return it->second;
}

void Module::set_tensor_attribute(const std::string& name, Tensor value) {
  FSDP_CHECK(!parameters_.contains(name), "cannot assign a Tensor as parameter '", name,
             "' of '", type_name_, "' (a Parameter or None expected); delete the parameter first");
  FSDP_CHECK(!buffers_.contains(name) && !children_.contains(name), type_name_, ": attribute '",
             name, "' already exists as a buffer or submodule");
  tensor_attributes_[name] = std::move(value);
}

bool Module::has_tensor_attribute(const std::string& name) const {
  return tensor_attributes_.count(name) > 0;
}

void Module::remove_tensor_attribute(const std::string& name) { tensor_attributes_.erase(name); }

void Module::set_parameter(const std::string& name, Tensor value) {
  Tensor* t = parameters_.find(name);
  FSDP_CHECK_CODE(ErrorCode::kNotFound, t != nullptr, "'", type_name_,
                  "' object has no parameter slot '", name, "' to set");
  *t = std::move(value);
}

void Module::set_parameter_slot(const std::string& name, Tensor value) {
  parameters_.insert(name, std::move(value));
}

void Module::remove_parameter(const std::string& name) {
  FSDP_CHECK_CODE(ErrorCode::kNotFound, parameters_.erase(name), "'", type_name_,
                  "' object has no parameter '", name, "'");
}

Tensor Module::buffer(const std::string& name) const {
  const Tensor* t = buffers_.find(name);
  FSDP_CHECK_CODE(ErrorCode::kNotFound, t != nullptr, "'", type_name_, "' object has no buffer '",
                  name, "'");
  return *t;
}

void Module::set_buffer(const std::string& name, Tensor value) {
  Tensor* t = buffers_.find(name);
  FSDP_CHECK_CODE(ErrorCode::kNotFound, t != nullptr, "'", type_name_,
                  "' object has no buffer slot '", name, "' to set");
  *t = std::move(value);
}

void Module::remove_buffer(const std::string& name) {
  FSDP_CHECK_CODE(ErrorCode::kNotFound, buffers_.erase(name), "'", type_name_,
                  "' object has no buffer '", name, "'");
  non_persistent_buffers_.erase(name);
}

bool Module::is_persistent_buffer(const std::string& name) const {
  return buffers_.contains(name) && non_persistent_buffers_.count(name) == 0;
}

ModulePtr Module::child(const std::string& name) const {
  const ModulePtr* c = children_.find(name);
  FSDP_CHECK_CODE(ErrorCode::kNotFound, c != nullptr, "'", type_name_,
                  "' object has no submodule '", name, "'");
  return *c;
}

Value Module::call_child(const std::string& name, Value args) {
  ModulePtr c = child(name);
  FSDP_CHECK(c != nullptr, type_name_, ": submodule '", name, "' is None and cannot be called");
  return (*c)(std::move(args));
}

// ---- Traversal ---------------------------------------------------------------------------------

void Module::collect_modules(const std::string& prefix, bool remove_duplicate,
                             std::set<const Module*>* memo,
                             std::vector<std::pair<std::string, const Module*>>* out) const {
  if (memo->count(this)) return;
  if (remove_duplicate) memo->insert(this);
  out->emplace_back(prefix, this);
  for (const auto& [name, child] : children_) {
    if (!child) continue;
    child->collect_modules(prefix.empty() ? name : prefix + "." + name, remove_duplicate, memo,
                           out);
  }
}

std::vector<NamedModule> Module::named_modules(const std::string& prefix,
                                               bool remove_duplicate) const {
  std::set<const Module*> memo;
  std::vector<std::pair<std::string, const Module*>> raw;
  collect_modules(prefix, remove_duplicate, &memo, &raw);
  std::vector<NamedModule> out;
  out.reserve(raw.size());
  for (const auto& [name, m] : raw) out.emplace_back(name, m->shared());
  return out;
}

std::vector<ModulePtr> Module::modules() const {
  std::vector<ModulePtr> out;
  for (auto& [name, m] : named_modules()) out.push_back(m);
  return out;
}

std::vector<NamedModule> Module::named_children() const {
  std::set<const Module*> memo;
  std::vector<NamedModule> out;
  for (const auto& [name, child] : children_) {
    if (child && memo.insert(child.get()).second) out.emplace_back(name, child);
  }
  return out;
}

std::vector<ModulePtr> Module::children() const {
  std::vector<ModulePtr> out;
  for (auto& [name, m] : named_children()) out.push_back(m);
  return out;
}

std::vector<NamedTensor> Module::named_members(const std::string& prefix, bool recurse,
                                               bool remove_duplicate, bool buffers) const {
  std::vector<std::pair<std::string, const Module*>> mods;
  if (recurse) {
    std::set<const Module*> module_memo;
    collect_modules(prefix, remove_duplicate, &module_memo, &mods);
  } else {
    mods.emplace_back(prefix, this);
  }
  std::unordered_set<const TensorImpl*> memo;
  std::vector<NamedTensor> out;
  for (const auto& [module_prefix, m] : mods) {
    const OrderedDict<Tensor>& members = buffers ? m->buffers_ : m->parameters_;
    for (const auto& [key, t] : members) {
      if (!t.defined() || memo.count(t.impl())) continue;
      if (remove_duplicate) memo.insert(t.impl());
      out.emplace_back(module_prefix.empty() ? key : module_prefix + "." + key, t);
    }
  }
  return out;
}

std::vector<NamedTensor> Module::named_parameters(const std::string& prefix, bool recurse,
                                                  bool remove_duplicate) const {
  return named_members(prefix, recurse, remove_duplicate, /*buffers=*/false);
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_parameters("", recurse)) out.push_back(t);
  return out;
}

std::vector<NamedTensor> Module::named_buffers(const std::string& prefix, bool recurse,
                                               bool remove_duplicate) const {
  return named_members(prefix, recurse, remove_duplicate, /*buffers=*/true);
}

std::vector<Tensor> Module::buffers(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_buffers("", recurse)) out.push_back(t);
  return out;
}

const Module* Module::find_submodule(const std::string& target) const {
  const Module* mod = this;
  if (target.empty()) return mod;
  std::stringstream ss(target);
  std::string item;
  while (std::getline(ss, item, '.')) {
    const ModulePtr* c = mod->children_.find(item);
    FSDP_CHECK_CODE(ErrorCode::kNotFound, c != nullptr && *c != nullptr, mod->type_name_,
                    " has no attribute `", item, "` (looking up submodule \"", target, "\")");
    mod = c->get();
  }
  return mod;
}

ModulePtr Module::get_submodule(const std::string& target) const {
  return find_submodule(target)->shared();
}

Tensor Module::get_parameter(const std::string& target) const {
  const size_t dot = target.rfind('.');
  const std::string module_path = dot == std::string::npos ? "" : target.substr(0, dot);
  const std::string name = dot == std::string::npos ? target : target.substr(dot + 1);
  const Module* mod = find_submodule(module_path);
  FSDP_CHECK_CODE(ErrorCode::kNotFound, mod->parameters_.contains(name), mod->type_name_,
                  " has no parameter `", name, "` (looking up \"", target, "\")");
  return mod->parameters_.at(name);
}

Tensor Module::get_buffer(const std::string& target) const {
  const size_t dot = target.rfind('.');
  const std::string module_path = dot == std::string::npos ? "" : target.substr(0, dot);
  const std::string name = dot == std::string::npos ? target : target.substr(dot + 1);
  const Module* mod = find_submodule(module_path);
  FSDP_CHECK_CODE(ErrorCode::kNotFound, mod->buffers_.contains(name), mod->type_name_,
                  " has no buffer `", name, "` (looking up \"", target, "\")");
  return mod->buffers_.at(name);
}

void Module::apply(const std::function<void(Module&)>& fn) {
  for (auto& c : children()) c->apply(fn);
  fn(*this);
}

// ---- Modes and conversions ---------------------------------------------------------------------

Module& Module::train(bool mode) {
  training_ = mode;
  for (auto& c : children()) c->train(mode);
  return *this;
}

void Module::zero_grad(bool set_to_none) {
  for (const Tensor& p : parameters()) autograd::zero_grad(p, set_to_none);
}

Module& Module::requires_grad_(bool requires_grad) {
  for (Tensor& p : parameters()) p.set_requires_grad(requires_grad);
  return *this;
}

Module& Module::to(DType dtype) {
  FSDP_CHECK(IsFloatingPoint(dtype), type_name_, ".to(", DTypeName(dtype),
             "): nn.Module.to only accepts floating point dtypes");
  std::unordered_set<const TensorImpl*> done;
  auto convert = [&](const Tensor& t) {
    if (!t.defined() || !IsFloatingPoint(t.dtype()) || !done.insert(t.impl()).second) return;
    if (t.dtype() != dtype) ReplaceData(t, t.to(dtype));
    Tensor g = t.grad();
    if (g.defined() && g.dtype() != dtype) ReplaceData(g, g.to(dtype));
  };
  std::set<const Module*> memo;
  std::vector<std::pair<std::string, const Module*>> mods;
  collect_modules("", true, &memo, &mods);
  for (const auto& [name, m] : mods) {
    for (const auto& [k, t] : m->parameters_) convert(t);
    for (const auto& [k, t] : m->buffers_) convert(t);
  }
  return *this;
}

Module& Module::to(Device device) {
  std::unordered_set<const TensorImpl*> done;
  auto convert = [&](const Tensor& t) {
    if (!t.defined() || !done.insert(t.impl()).second) return;
    if (t.device() != device) ReplaceData(t, t.to(device));
    Tensor g = t.grad();
    if (g.defined() && g.device() != device) ReplaceData(g, g.to(device));
  };
  std::set<const Module*> memo;
  std::vector<std::pair<std::string, const Module*>> mods;
  collect_modules("", true, &memo, &mods);
  for (const auto& [name, m] : mods) {
    for (const auto& [k, t] : m->parameters_) convert(t);
    for (const auto& [k, t] : m->buffers_) convert(t);
  }
  return *this;
}

// ---- Forward -----------------------------------------------------------------------------------

Value Module::forward(const Value& /*args*/) {
  FSDP_THROW(ErrorCode::kFailedPrecondition, "Module [", type_name_,
             "] is missing the required \"forward\" function");
}

Value Module::forward_with_kwargs(const Value& args, const Value& kwargs) {
  FSDP_CHECK(kwargs.is_none() || (kwargs.is_dict() && kwargs.size() == 0), type_name_,
             ".forward() got unexpected keyword arguments ", kwargs.str());
  return forward(args);
}

Value Module::call(Value args, Value kwargs) {
  GlobalModuleHooks& globals = GlobalModuleHooks::Current();
  if (globals.pre->empty() && globals.post->empty() && forward_pre_hooks_->empty() &&
      forward_hooks_->empty()) {
    return forward_with_kwargs(args, kwargs);
  }
  Value result;
  std::set<uint64_t> called_global;
  std::set<uint64_t> called_local;
  try {
    // Snapshots, like `(*_global_forward_pre_hooks.items(), *self._forward_pre_hooks.items())`.
    const std::vector<PreHookEntry> global_pre = *globals.pre;
    const std::vector<PreHookEntry> local_pre = *forward_pre_hooks_;
    for (const auto& e : global_pre) {
      if (auto r = e.hook(*this, args)) args = std::move(*r);
    }
    for (const auto& e : local_pre) {
      if (e.hook_with_kwargs) {
        if (auto r = e.hook_with_kwargs(*this, args, kwargs)) {
          args = std::move(r->first);
          kwargs = std::move(r->second);
        }
      } else if (auto r = e.hook(*this, args)) {
        args = std::move(*r);
      }
    }
    result = forward_with_kwargs(args, kwargs);
    const std::vector<HookEntry> global_post = *globals.post;
    const std::vector<HookEntry> local_post = *forward_hooks_;
    for (const auto& e : global_post) {
      if (e.always_call) called_global.insert(e.id);
      if (auto r = e.hook(*this, args, result)) result = std::move(*r);
    }
    for (const auto& e : local_post) {
      if (e.always_call) called_local.insert(e.id);
      std::optional<Value> r = e.hook_with_kwargs ? e.hook_with_kwargs(*this, args, kwargs, result)
                                                  : e.hook(*this, args, result);
      if (r) result = std::move(*r);
    }
    return result;
  } catch (...) {
    // module.py: run the always_call forward hooks that have not run yet; an exception they
    // raise is silenced (PyTorch turns it into a warning), then the original is re-raised.
    const std::vector<HookEntry> global_post = *globals.post;
    for (const auto& e : global_post) {
      if (!e.always_call || called_global.count(e.id)) continue;
      try {
        if (auto r = e.hook(*this, args, result)) result = std::move(*r);
      } catch (...) {  // NOLINT(bugprone-empty-catch): PyTorch semantics, see above
      }
    }
    const std::vector<HookEntry> local_post = *forward_hooks_;
    for (const auto& e : local_post) {
      if (!e.always_call || called_local.count(e.id)) continue;
      try {
        std::optional<Value> r = e.hook_with_kwargs
                                     ? e.hook_with_kwargs(*this, args, kwargs, result)
                                     : e.hook(*this, args, result);
        if (r) result = std::move(*r);
      } catch (...) {  // NOLINT(bugprone-empty-catch): PyTorch semantics, see above
      }
    }
    throw;
  }
}

RemovableHandle Module::register_forward_pre_hook(ForwardPreHook hook,
                                                  ForwardPreHookOptions options) {
  FSDP_CHECK(static_cast<bool>(hook), type_name_, ".register_forward_pre_hook: empty hook");
  const uint64_t id = next_hook_id();
  InsertEntry(*forward_pre_hooks_, PreHookEntry{id, std::move(hook), nullptr}, options.prepend);
  return MakeHandle(forward_pre_hooks_, id);
}

RemovableHandle Module::register_forward_pre_hook_with_kwargs(ForwardPreHookWithKwargs hook,
                                                              ForwardPreHookOptions options) {
  FSDP_CHECK(static_cast<bool>(hook), type_name_,
             ".register_forward_pre_hook_with_kwargs: empty hook");
  const uint64_t id = next_hook_id();
  InsertEntry(*forward_pre_hooks_, PreHookEntry{id, nullptr, std::move(hook)}, options.prepend);
  return MakeHandle(forward_pre_hooks_, id);
}

RemovableHandle Module::register_forward_hook(ForwardHook hook, ForwardHookOptions options) {
  FSDP_CHECK(static_cast<bool>(hook), type_name_, ".register_forward_hook: empty hook");
  const uint64_t id = next_hook_id();
  InsertEntry(*forward_hooks_, HookEntry{id, options.always_call, std::move(hook), nullptr},
              options.prepend);
  return MakeHandle(forward_hooks_, id);
}

RemovableHandle Module::register_forward_hook_with_kwargs(ForwardHookWithKwargs hook,
                                                          ForwardHookOptions options) {
  FSDP_CHECK(static_cast<bool>(hook), type_name_, ".register_forward_hook_with_kwargs: empty hook");
  const uint64_t id = next_hook_id();
  InsertEntry(*forward_hooks_, HookEntry{id, options.always_call, nullptr, std::move(hook)},
              options.prepend);
  return MakeHandle(forward_hooks_, id);
}

size_t Module::num_forward_pre_hooks() const { return forward_pre_hooks_->size(); }
size_t Module::num_forward_hooks() const { return forward_hooks_->size(); }

// ---- State dict --------------------------------------------------------------------------------

RemovableHandle Module::register_state_dict_pre_hook(StateDictPreHook hook) {
  const uint64_t id = next_hook_id();
  state_dict_pre_hooks_->push_back({id, std::move(hook)});
  return MakeHandle(state_dict_pre_hooks_, id);
}

RemovableHandle Module::register_state_dict_post_hook(StateDictPostHook hook) {
  const uint64_t id = next_hook_id();
  state_dict_post_hooks_->push_back({id, std::move(hook)});
  return MakeHandle(state_dict_post_hooks_, id);
}

RemovableHandle Module::register_load_state_dict_pre_hook(LoadStateDictPreHook hook) {
  const uint64_t id = next_hook_id();
  load_pre_hooks_->push_back({id, std::move(hook)});
  return MakeHandle(load_pre_hooks_, id);
}

RemovableHandle Module::register_load_state_dict_post_hook(LoadStateDictPostHook hook) {
  const uint64_t id = next_hook_id();
  load_post_hooks_->push_back({id, std::move(hook)});
  return MakeHandle(load_post_hooks_, id);
}

void StateDict::rename(const std::string& key, const std::string& new_key) {
  Tensor* value = find(key);
  if (value == nullptr) return;
  Tensor moved = *value;
  erase(key);
  insert(new_key, std::move(moved));
  if (const ShardedEntry* entry = sharded.find(key)) {
    ShardedEntry moved_entry = *entry;
    sharded.erase(key);
    sharded.insert(new_key, std::move(moved_entry));
  }
}

StateDict Module::state_dict(const std::string& prefix, bool keep_vars) {
  StateDict destination;
  state_dict_into(destination, prefix, keep_vars);
  return destination;
}

void Module::state_dict_into(StateDict& destination, const std::string& prefix, bool keep_vars) {
  destination.metadata.insert(prefix.empty() ? "" : prefix.substr(0, prefix.size() - 1), version());
  const auto pre_hooks = *state_dict_pre_hooks_;
  for (const auto& e : pre_hooks) e.fn(*this, prefix, keep_vars);
  save_to_state_dict(destination, prefix, keep_vars);
  // Copy: a hook may replace children (e.g. a wrapper); iterate what was registered now.
  const OrderedDict<ModulePtr> children = children_;
  for (const auto& [name, child] : children) {
    if (child) child->state_dict_into(destination, prefix + name + ".", keep_vars);
  }
  const auto post_hooks = *state_dict_post_hooks_;
  for (const auto& e : post_hooks) e.fn(*this, destination, prefix);
}

void Module::save_to_state_dict(StateDict& destination, const std::string& prefix,
                                bool keep_vars) const {
  for (const auto& [name, t] : parameters_) {
    if (t.defined()) destination.insert(prefix + name, keep_vars ? t : t.detach());
  }
  for (const auto& [name, t] : buffers_) {
    if (t.defined() && non_persistent_buffers_.count(name) == 0) {
      destination.insert(prefix + name, keep_vars ? t : t.detach());
    }
  }
}

void Module::load_from_state_dict(StateDict& state_dict, const std::string& prefix,
                                  std::optional<int64_t> /*version*/, LoadStateDictState& state) {
  const auto pre_hooks = *load_pre_hooks_;
  for (const auto& e : pre_hooks) e.fn(*this, state_dict, prefix, state);

  // local_state: own non-None parameters, then own non-None persistent buffers.
  struct Local {
    std::string name;
    Tensor tensor;
    bool is_param;
  };
  std::vector<Local> local;
  for (const auto& [name, t] : parameters_) {
    if (t.defined()) local.push_back({name, t, true});
  }
  for (const auto& [name, t] : buffers_) {
    if (t.defined() && non_persistent_buffers_.count(name) == 0) local.push_back({name, t, false});
  }

  for (const Local& entry : local) {
    const std::string key = prefix + entry.name;
    const Tensor* found = state_dict.find(key);
    if (found == nullptr) {
      state.keys.missing_keys.push_back(key);
      continue;
    }
    Tensor input = *found;
    if (!input.defined()) {
      state.error_msgs.push_back("While copying the parameter named \"" + key +
                                 "\", expected torch.Tensor or Tensor-like object from "
                                 "checkpoint but received <class 'NoneType'>");
      continue;
    }
    const Tensor& param = entry.tensor;
    if (param.dim() == 0 && input.dim() == 1) input = input.select(0);
    if (input.sizes() != param.sizes()) {
      state.error_msgs.push_back("size mismatch for " + key + ": copying a param with shape " +
                                 TorchSizeStr(input.sizes()) +
                                 " from checkpoint, the shape in current model is " +
                                 TorchSizeStr(param.sizes()) + ".");
      continue;
    }
    try {
      if (state.assign) {
        if (entry.is_param) {
          Tensor assigned = input.detach();
          if (param.requires_grad()) assigned.set_requires_grad(true);
          parameters_.insert(entry.name, assigned);
        } else {
          buffers_.insert(entry.name, input);
        }
      } else {
        Tensor dst = param;
        dst.copy_(input);
      }
    } catch (const std::exception& ex) {
      state.error_msgs.push_back(
          "While copying the parameter named \"" + key + "\", whose dimensions in the model are " +
          TorchSizeStr(param.sizes()) + " and whose dimensions in the checkpoint are " +
          TorchSizeStr(input.sizes()) + ", an exception occurred : ('" + ex.what() + "',).");
    }
  }

  const std::string extra_state_key = prefix + "_extra_state";
  for (const auto& [key, value] : state_dict) {
    if (!StartsWith(key, prefix) || key == extra_state_key) continue;
    const std::string rest = key.substr(prefix.size());
    const size_t dot = rest.find('.');
    if (dot != std::string::npos) {
      if (!children_.contains(rest.substr(0, dot))) state.keys.unexpected_keys.push_back(key);
    } else {
      const bool is_local =
          std::any_of(local.begin(), local.end(), [&](const Local& l) { return l.name == rest; });
      if (!is_local) state.keys.unexpected_keys.push_back(key);
    }
  }
}

void Module::load_recursive(StateDict& local_state_dict, const std::string& prefix,
                            const StateDict& full, LoadStateDictState& state) {
  std::optional<int64_t> version;
  if (const int64_t* v =
          full.metadata.find(prefix.empty() ? "" : prefix.substr(0, prefix.size() - 1))) {
    version = *v;
  }
  load_from_state_dict(local_state_dict, prefix, version, state);
  const OrderedDict<ModulePtr> children = children_;
  for (const auto& [name, child] : children) {
    if (!child) continue;
    const std::string child_prefix = prefix + name + ".";
    StateDict child_state_dict;
    for (const auto& [key, value] : local_state_dict) {
      if (!StartsWith(key, child_prefix)) continue;
      child_state_dict.insert(key, value);
      if (const ShardedEntry* sharding = local_state_dict.sharding(key)) {
        child_state_dict.sharded.insert(key, *sharding);
      }
    }
    child->load_recursive(child_state_dict, child_prefix, full, state);
  }
  const auto post_hooks = *load_post_hooks_;
  for (const auto& e : post_hooks) e.fn(*this, state.keys);
}

IncompatibleKeys Module::load_state_dict(const StateDict& state_dict, bool strict, bool assign) {
  LoadStateDictState state;
  state.assign = assign;
  StateDict local = state_dict;
  load_recursive(local, "", state_dict, state);
  if (strict) {
    if (!state.keys.unexpected_keys.empty()) {
      state.error_msgs.insert(
          state.error_msgs.begin(),
          "Unexpected key(s) in state_dict: " + JoinQuoted(state.keys.unexpected_keys) + ". ");
    }
    if (!state.keys.missing_keys.empty()) {
      state.error_msgs.insert(
          state.error_msgs.begin(),
          "Missing key(s) in state_dict: " + JoinQuoted(state.keys.missing_keys) + ". ");
    }
  }
  if (!state.error_msgs.empty()) {
    std::string msg = "Error(s) in loading state_dict for " + type_name_ + ":\n\t";
    for (size_t i = 0; i < state.error_msgs.size(); ++i) {
      msg += (i ? "\n\t" : "") + state.error_msgs[i];
    }
    FSDP_THROW(ErrorCode::kInvalidArgument, msg);
  }
  return state.keys;
}

// ---- Copies ------------------------------------------------------------------------------------

ModulePtr Module::shallow_copy() const {
  FSDP_THROW(ErrorCode::kFailedPrecondition, "module ", type_name_,
             " does not support deep_copy(): derive its class from nn::Cloneable<", type_name_,
             ">");
}

ModulePtr Module::deep_copy() const {
  DeepCopyMemo memo;
  return deep_copy_impl(memo);
}

ModulePtr Module::deep_copy_impl(DeepCopyMemo& memo) const {
  if (auto it = memo.modules.find(this); it != memo.modules.end()) return it->second;
  ModulePtr copy = shallow_copy();
  memo.modules.emplace(this, copy);
  auto copy_tensor = [&memo](const Tensor& t) -> Tensor {
    if (!t.defined()) return t;
    if (auto it = memo.tensors.find(t.impl()); it != memo.tensors.end()) return it->second;
    Tensor c = t.clone();
    if (t.requires_grad()) c.set_requires_grad(true);
    memo.tensors.emplace(t.impl(), c);
    return c;
  };
  for (auto& [name, t] : copy->parameters_) t = copy_tensor(t);
  for (auto& [name, t] : copy->buffers_) t = copy_tensor(t);
  for (auto& [name, t] : copy->tensor_attributes_) t = copy_tensor(t);
  for (auto& [name, c] : copy->children_) {
    if (c) c = c->deep_copy_impl(memo);
  }
  return copy;
}

// ---- Attachments -------------------------------------------------------------------------------

void Module::set_attachment(const std::string& key, std::shared_ptr<void> value) {
  attachments_[key] = std::move(value);
}

std::shared_ptr<void> Module::attachment(const std::string& key) const {
  auto it = attachments_.find(key);
  return it == attachments_.end() ? nullptr : it->second;
}

void Module::remove_attachment(const std::string& key) { attachments_.erase(key); }

}  // namespace fsdp::nn
