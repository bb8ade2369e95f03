#include "engine/tensor_parallel/distribute_module.h"

#include <utility>
#include <vector>

#include "engine/core/error.h"
#include "engine/tensor_parallel/dtensor_parameter.h"

namespace fsdp::tensor_parallel {
namespace {

using MeshPtr = std::shared_ptr<distributed::DeviceMesh>;

Placements AllReplicate(const distributed::DeviceMesh& mesh) {
  return Placements(static_cast<size_t>(mesh.ndim()), Placement::Replicate());
}

// `replicate_module_params_buffers`: every parameter and buffer of `module` itself that is not
// a DTensor yet becomes Replicate() on every mesh dim.
void ReplicateParamsBuffers(const std::string&, nn::Module& module, const MeshPtr& mesh) {
  for (const auto& [name, param] : module.parameter_slots()) {
    if (!param.defined() || GetDTensorParameter(module, name)) continue;
    RegisterDTensorParameter(module, name, distribute_tensor(param, mesh, AllReplicate(*mesh)));
  }
  for (const auto& [name, buffer] : module.named_buffers("", /*recurse=*/false)) {
    if (!buffer.defined()) continue;
    const DTensor replicated = distribute_tensor(buffer, mesh, AllReplicate(*mesh));
    module.register_buffer(name, replicated.local_tensor(), module.is_persistent_buffer(name));
  }
}

// The input tensor of a call (the tensor itself or the first element of a tuple or list).
Tensor FirstTensor(const nn::Value& args, const std::string& what) {
  if (args.is_tensor()) return args.tensor();
  FSDP_CHECK((args.is_tuple() || args.is_list()) && args.size() >= 1 && args[0].is_tensor(), what,
             ": expected a tensor input, got ", args.type_name());
  return args[0].tensor();
}

// What the pre-hook hands the post-hook for one call.
struct CallState {
  std::optional<DTensor> input;
  std::vector<std::pair<std::string, Tensor>> saved_slots;
};

}  // namespace

Placements ReplicatedParamGradPlacements(const Placements& input_placements, int64_t input_ndim,
                                         const std::string& what) {
  Placements out;
  for (size_t i = 0; i < input_placements.size(); ++i) {
    const Placement& p = input_placements[i];
    FSDP_CHECK(!p.is_partial(), what, ": the input is ", PlacementsStr(input_placements),
               "; a Partial input on mesh dim ", i,
               " needs sharding propagation through the module's ops (no DTensor op dispatch)");
    if (p.is_replicate()) {
      out.push_back(Placement::Replicate());
      continue;
    }
    FSDP_CHECK(p.dim() != input_ndim - 1, what, ": the input is ", PlacementsStr(input_placements),
               " on ", input_ndim, " dims; Shard on the last (feature) dim on mesh dim ", i,
               " meets the replicated parameters' own dims and needs sharding propagation "
               "(no DTensor op dispatch); only batch dims (0..", input_ndim - 2,
               ") may be sharded");
    out.push_back(Placement::Partial());
  }
  return out;
}

nn::Module& distribute_module(nn::Module& module, const MeshPtr& device_mesh,
                              PartitionFn partition_fn, InputFn input_fn, OutputFn output_fn) {
  FSDP_CHECK(device_mesh != nullptr, "distribute_module: device_mesh is null");
  const std::string what = "distribute_module(" + module.type_name() + ")";
  if (!partition_fn) partition_fn = ReplicateParamsBuffers;
  for (const auto& [name, submodule] : module.named_modules()) {
    partition_fn(name, *submodule, device_mesh);
  }
  // The module's own replicated parameters (the hooks' rule covers those only).
  std::vector<std::string> replicated;
  for (const auto& [name, submodule] : module.named_modules()) {
    for (const auto& [param_name, param] : submodule->parameter_slots()) {
      const std::optional<DTensor> dt = GetDTensorParameter(*submodule, param_name);
      if (!param.defined() || !dt) continue;
      for (const Placement& p : dt->placements()) {
        FSDP_CHECK(p.is_replicate(), what, ": parameter '",
                   name.empty() ? param_name : name + "." + param_name, "' is ", dt->str(),
                   "; distribute_module's forward handles Replicate() parameters only");
      }
      FSDP_CHECK(name.empty(), what, ": parameter '", name, ".", param_name,
                 "' belongs to a submodule; distribute_module's forward wraps the module's own "
                 "parameters only");
      replicated.push_back(param_name);
    }
  }
  auto state = std::make_shared<CallState>();
  module.register_forward_pre_hook(
      [device_mesh, input_fn, replicated, state, what](
          nn::Module& m, const nn::Value& args) -> std::optional<nn::Value> {
        DTensor input = input_fn ? input_fn(m, args, device_mesh)
                                 : DTensor::from_local(FirstTensor(args, what), device_mesh,
                                                       AllReplicate(*device_mesh));
        const Placements grad = ReplicatedParamGradPlacements(
            input.placements(), static_cast<int64_t>(input.shape().size()), what);
        for (const std::string& name : replicated) {
          const DTensor spec = *GetDTensorParameter(m, name);
          const Tensor slot = m.parameter(name);
          state->saved_slots.emplace_back(name, slot);
          SetParameterOrAttribute(
              m, name,
              DTensor::from_local(slot, device_mesh, spec.placements(), spec.shape()).to_local(grad));
        }
        state->input = input;
        return nn::Value(input.to_local());
      });
  nn::ForwardHookOptions options;
  options.always_call = true;  // the slots get their tensors back even when forward throws
  module.register_forward_hook(
      [device_mesh, output_fn, state, what](nn::Module& m, const nn::Value&,
                                            const nn::Value& output) -> std::optional<nn::Value> {
        for (const auto& [name, slot] : state->saved_slots) SetParameterOrAttribute(m, name, slot);
        state->saved_slots.clear();
        std::optional<DTensor> input = std::move(state->input);
        state->input.reset();
        if (output.is_none() || !input) return std::nullopt;  // forward threw
        FSDP_CHECK(output.is_tensor(), what, ": expected a tensor output, got ", output.type_name());
        const Tensor& y = output.tensor();
        // Rows stay where they are: the output keeps the input's placements.
        Shape global = input->shape();
        if (!global.empty() && y.dim() == static_cast<int64_t>(global.size())) {
          global.back() = y.sizes().back();
        } else {
          FSDP_CHECK(false, what, ": the output ", y.dim(), " dims differ from the input's ",
                     global.size(), "; a row-by-row module keeps the input's dims");
        }
        const DTensor out = DTensor::from_local(y, device_mesh, input->placements(), global);
        return output_fn ? output_fn(m, out, device_mesh) : nn::Value(out.to_local());
      },
      options);
  return module;
}

}  // namespace fsdp::tensor_parallel
