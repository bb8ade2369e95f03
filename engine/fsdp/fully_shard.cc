#include "engine/fsdp/fully_shard.h"

#include <algorithm>
#include <map>
#include <set>

#include "engine/core/error.h"
#include "engine/core/rank_context.h"
#include "engine/fsdp/state_dict.h"

namespace fsdp::fsdp2 {
namespace {

constexpr const char* kFsdpAttachment = "fully_shard";

// `_get_managed_modules`: post-order DFS from a given module, not descending into modules that
// already have an FSDP state (nested fully_shard) unless given, each module once.
void CollectManagedModules(nn::Module* module, const std::vector<nn::Module*>& roots,
                           std::set<nn::Module*>* visited, std::vector<nn::Module*>* out) {
  const bool is_root = std::find(roots.begin(), roots.end(), module) != roots.end();
  if (!is_root && GetFsdpState(*module) != nullptr) return;
  visited->insert(module);
  for (const nn::ModulePtr& child : module->children()) {
    if (!visited->count(child.get())) CollectManagedModules(child.get(), roots, visited, out);
  }
  out->push_back(module);
}

Device DeviceFor(const FullyShardOptions& options) {
  if (options.mesh && options.mesh->device_type() == "cpu") return Device::CPU();
  return RankContext::Current().device();
}

// `tensor.data = tensor.to(device)`: moves the data while keeping the tensor's identity.
void MoveDataToDevice(const Tensor& tensor, Device device) {
  if (!tensor.defined() || tensor.device() == device) return;
  Tensor moved = tensor.to(device);
  tensor.impl()->storage = moved.storage();
  tensor.impl()->storage_offset = moved.storage_offset();
}

}  // namespace

bool IsFsdpModule(const nn::Module& module) { return GetFsdpState(module) != nullptr; }

FSDPModule fully_shard(const nn::ModulePtr& module, const FullyShardOptions& options) {
  FSDP_CHECK(module != nullptr, "fully_shard: null module");
  return fully_shard(std::vector<nn::ModulePtr>{module}, options).front();
}

std::vector<FSDPModule> fully_shard(const std::vector<nn::ModulePtr>& modules,
                                    const FullyShardOptions& options) {
  FSDP_CHECK(!modules.empty(), "fully_shard: expects a module or a non-empty list of modules");
  for (const nn::ModulePtr& module : modules) {
    FSDP_CHECK(module != nullptr, "fully_shard: null module");
    FSDP_CHECK(module->type_name() != "ModuleList" && module->type_name() != "ModuleDict",
               "fully_shard does not support containers that do not implement forward: ",
               module->type_name());
    FSDP_CHECK(!IsFsdpModule(*module),
               "Each distinct composable distributed API can only be applied to a module once. "
               "fully_shard has already been applied to the following module: ",
               module->type_name());
  }
  // `_get_root_modules`: a module whose ancestor is also given is managed through it.
  std::vector<nn::Module*> roots;
  for (const nn::ModulePtr& module : modules) {
    bool under_another = false;
    for (const nn::ModulePtr& other : modules) {
      if (other == module) continue;
      for (const nn::ModulePtr& m : other->modules()) {
        if (m == module) under_another = true;
      }
    }
    if (!under_another && std::find(roots.begin(), roots.end(), module.get()) == roots.end()) {
      roots.push_back(module.get());
    }
  }
  FsdpMeshInfo mesh_info =
      options.mesh ? FsdpMeshInfo::FromMesh(options.mesh)
                   : FsdpMeshInfo::FromProcessGroup(options.process_group
                                                        ? options.process_group
                                                        : distributed::GetDefaultProcessGroup());
  const Device device = DeviceFor(options);
  // None (torch-2.8) is True until lazy init finds the root; torch-2.4's unset value is its
  // default True, and its lazy init keeps the root unsharded whatever the value (semantics.h).
  const bool auto_reshard_after_forward =
      !options.reshard_after_forward.has_value() &&
      HasReshardAfterForwardNone(options.semantics);
  std::optional<FsdpMeshInfo> post_forward_mesh_info =
      GetPostForwardMeshInfo(options.reshard_after_forward.value_or(true), mesh_info);

  auto state = std::make_shared<FsdpState>(roots, device, options.mp_policy, options.semantics,
                                           auto_reshard_after_forward);

  // Managed modules (post-order from each given module in turn) and their parameters: direct
  // parameters in registration order, tied parameters once, ignored ones skipped.
  std::vector<nn::Module*> managed_modules;
  std::set<nn::Module*> visited;
  for (nn::Module* root : roots) CollectManagedModules(root, roots, &visited, &managed_modules);
  std::set<const TensorImpl*> ignored;
  for (const Tensor& t : options.ignored_params) {
    if (t.defined()) ignored.insert(t.impl());
  }
  std::vector<Tensor> params;
  std::set<const TensorImpl*> seen_params;
  std::set<const TensorImpl*> seen_buffers;
  for (nn::Module* m : managed_modules) {
    for (const auto& [name, param] : m->parameter_slots()) {
      if (!param.defined() || ignored.count(param.impl())) continue;
      if (seen_params.insert(param.impl()).second) params.push_back(param);
    }
    for (const auto& [name, buffer] : m->buffer_slots()) {
      if (!buffer.defined() || !seen_buffers.insert(buffer.impl()).second) continue;
      MoveDataToDevice(buffer, device);
    }
  }

  if (!params.empty()) {
    // `_get_param_module_infos`: the owning (module, name) is the first location in a
    // pre-order walk with duplicates of each given module in turn; every further location is a
    // shared one. The FQN is relative to the given module that holds it.
    std::map<const TensorImpl*, ParamModuleInfo> infos;
    for (nn::Module* root : roots) {
      for (const auto& [name, submodule] : root->named_modules("", /*remove_duplicate=*/false)) {
        for (const auto& [param_name, param] : submodule->parameter_slots()) {
          if (!param.defined() || !seen_params.count(param.impl()) || ignored.count(param.impl())) {
            continue;
          }
          auto it = infos.find(param.impl());
          if (it == infos.end()) {
            infos[param.impl()] = ParamModuleInfo{
                submodule.get(), param_name, {}, {}, (name.empty() ? "" : name + ".") + param_name};
          } else {
            it->second.shared_modules.push_back(submodule.get());
            it->second.shared_param_names.push_back(param_name);
          }
        }
      }
    }
    FSDP_CHECK(infos.size() == params.size(), "Some parameters are not in the module tree of ",
               roots.front()->type_name());
    std::vector<ParamToShard> to_shard;
    for (const Tensor& p : params) {
      std::optional<tensor_parallel::Placement> placement;
      if (options.shard_placement_fn) placement = options.shard_placement_fn(p);
      to_shard.push_back({p, infos.at(p.impl()), placement});
    }
    auto group = std::make_shared<FsdpParamGroup>(std::move(to_shard), roots, mesh_info,
                                                  post_forward_mesh_info, device, options.mp_policy,
                                                  options.offload_policy, options.semantics);
    RegisterStateDictHooks(group);
    state->set_param_group(std::move(group));
  }
  for (nn::Module* root : roots) root->set_attachment(kFsdpAttachment, state);
  state->register_hooks();
  // The handles in the order given (a module under another given one included: PyTorch
  // returns the argument, whose every module then is an FSDPModule).
  std::vector<FSDPModule> out;
  for (const nn::ModulePtr& module : modules) {
    if (IsFsdpModule(*module)) out.emplace_back(module);
  }
  return out;
}

// ---- UnshardHandle -----------------------------------------------------------------------

void UnshardHandle::wait() {
  if (auto group = group_.lock()) group->wait_for_unshard();
}

// ---- FSDPModule --------------------------------------------------------------------------

FSDPModule::FSDPModule(nn::ModulePtr module) : module_(std::move(module)) {
  FSDP_CHECK(module_ != nullptr, "FSDPModule: null module");
  state_ = GetFsdpState(*module_);
  FSDP_CHECK(state_ != nullptr, "FSDPModule: fully_shard was not applied to this ",
             module_->type_name());
}

std::vector<FsdpState*> FSDPModule::states(bool recurse) const {
  if (!recurse) return {state_};
  std::vector<FsdpState*> out;
  for (const nn::ModulePtr& m : module_->modules()) {
    FsdpState* s = GetFsdpState(*m);
    // A state of several modules (fully_shard([m1, m2])) once.
    if (s != nullptr && std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
  }
  return out;
}

UnshardHandle FSDPModule::unshard(bool async_op) {
  const auto& group = state_->param_group();
  if (group) {
    group->lazy_init();
    group->unshard(async_op);
  }
  UnshardHandle handle(group);
  if (!async_op) handle.wait();
  return handle;
}

void FSDPModule::reshard() {
  if (const auto& group = state_->param_group()) group->reshard();
}

void FSDPModule::set_is_last_backward(bool is_last_backward) {
  state_->state_ctx()->is_last_backward = is_last_backward;
}

void FSDPModule::set_requires_gradient_sync(bool requires_gradient_sync, bool recurse) {
  for (FsdpState* s : states(recurse)) {
    if (const auto& group = s->param_group()) {
      group->reduce_grads = requires_gradient_sync;
      group->all_reduce_grads = requires_gradient_sync;
    }
  }
}

void FSDPModule::set_requires_all_reduce(bool requires_all_reduce, bool recurse) {
  for (FsdpState* s : states(recurse)) {
    if (const auto& group = s->param_group()) group->all_reduce_grads = requires_all_reduce;
  }
}

void FSDPModule::set_reshard_after_backward(bool reshard_after_backward, bool recurse) {
  for (FsdpState* s : states(recurse)) {
    if (const auto& group = s->param_group()) group->reshard_after_backward = reshard_after_backward;
  }
}

void FSDPModule::set_reshard_after_forward(bool reshard_after_forward, bool recurse) {
  for (FsdpState* s : states(recurse)) {
    s->set_auto_reshard_after_forward(false);
    if (const auto& group = s->param_group()) {
      group->set_post_forward_mesh_info(
          GetPostForwardMeshInfo(reshard_after_forward, group->mesh_info()));
    }
  }
}

namespace {
std::vector<FsdpState*> StatesOf(const std::vector<nn::ModulePtr>& modules, const char* api) {
  std::vector<FsdpState*> out;
  for (const nn::ModulePtr& m : modules) {
    FSDP_CHECK(m != nullptr && IsFsdpModule(*m), api, ": expects FSDPModule but got ",
               m ? m->type_name() : std::string("None"));
    out.push_back(GetFsdpState(*m));
  }
  return out;
}
}  // namespace

void FSDPModule::set_modules_to_forward_prefetch(const std::vector<nn::ModulePtr>& modules) {
  state_->states_to_forward_prefetch = StatesOf(modules, "set_modules_to_forward_prefetch");
}

void FSDPModule::set_modules_to_backward_prefetch(const std::vector<nn::ModulePtr>& modules) {
  state_->states_to_backward_prefetch = StatesOf(modules, "set_modules_to_backward_prefetch");
}

void FSDPModule::set_gradient_divide_factor(double factor) {
  if (const auto& group = state_->param_group()) group->gradient_divide_factor = factor;
}

void FSDPModule::set_force_sum_reduction_for_comms(bool enable) {
  if (const auto& group = state_->param_group()) group->force_sum_reduction_for_comms = enable;
}

void FSDPModule::set_unshard_in_backward(bool unshard_in_backward) {
  if (const auto& group = state_->param_group()) group->unshard_in_backward = unshard_in_backward;
}

void FSDPModule::set_unshard_async_op(bool async_op) {
  // PyTorch's _set_unshard_async_op sets every FSDP module's groups under this one (it loops
  // over self.modules(), no recurse argument).
  for (FsdpState* s : states(/*recurse=*/true)) {
    if (const auto& group = s->param_group()) group->unshard_async_op = async_op;
  }
}

void FSDPModule::set_post_optim_event(const CommEvent& event) {
  state_->state_ctx()->post_optim_event = event;
}

}  // namespace fsdp::fsdp2
