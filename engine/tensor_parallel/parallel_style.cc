#include "engine/tensor_parallel/parallel_style.h"

#include <utility>

#include "engine/core/error.h"
#include "engine/nn/layers.h"
#include "engine/nn/models.h"
#include "engine/tensor_parallel/dtensor.h"
#include "engine/tensor_parallel/dtensor_parameter.h"

namespace fsdp::tensor_parallel {
namespace {

using distributed::DeviceMesh;
using MeshPtr = std::shared_ptr<DeviceMesh>;

nn::Linear& CheckLinear(nn::Module& module, const std::string& style, const std::string& fqn) {
  auto* linear = dynamic_cast<nn::Linear*>(&module);
  FSDP_CHECK(linear != nullptr, style, " currently only supports nn.Linear: module '", fqn, "' is ",
             module.type_name());
  FSDP_CHECK(!GetDTensorParameter(module, "weight").has_value(), style, ": module '", fqn,
             "' is already tensor-parallel (its weight is ",
             GetDTensorParameter(module, "weight")->str(), ")");
  return *linear;
}

void CheckUseLocalOutput(const ParallelStyleOptions& options, const char* style) {
  FSDP_CHECK(options.use_local_output, style,
             "(use_local_output=False) is not implemented: module outputs (nn::Value) cannot "
             "carry DTensors");
}

// The input tensor of a Linear call (args is the tensor itself or a one-tensor tuple).
Tensor InputTensor(const nn::Value& args, const std::string& fqn) {
  if (args.is_tensor()) return args.tensor();
  FSDP_CHECK((args.is_tuple() || args.is_list()) && args.size() == 1 && args[0].is_tensor(),
             "parallel style on '", fqn, "': expected one tensor input, got ", args.type_name());
  return args[0].tensor();
}

// Shards every parameter of `module` with its style placement (distribute_tensor,
// src_data_rank 0).
void ShardParameters(nn::Module& module, const ParallelStyle& style, const MeshPtr& mesh) {
  for (const auto& [name, placement] : style.parameter_placements()) {
    const Tensor param = module.has_parameter(name) ? module.parameter(name) : Tensor();
    if (!param.defined()) continue;
    RegisterDTensorParameter(module, name, distribute_tensor(param, mesh, {placement}));
  }
}

// The prepare-input step of a style: `x` annotated with `input_layout` (from_local, global
// shape inferred unless `global_shape`) is redistributed to `desired` and returned as a local
// tensor whose gradient arrives with `grad_placement`.
Tensor PrepareInput(const Tensor& x, const MeshPtr& mesh, const Placement& input_layout,
                    const Placement& desired, const Placement& grad_placement,
                    std::optional<Shape> global_shape = std::nullopt) {
  DTensor input = DTensor::from_local(x, mesh, {input_layout}, std::move(global_shape));
  if (input.placements() != Placements{desired.normalized(x.dim())}) {
    input = input.redistribute({desired});
  }
  return input.to_local(Placements{grad_placement});
}

// The prepare-output step: the local result `y` with `local_placement` and `global_shape` is
// redistributed to `output_layout` and returned as a local tensor.
Tensor PrepareOutput(const Tensor& y, const MeshPtr& mesh, const Placement& local_placement,
                     const Shape& global_shape, const Placement& output_layout) {
  DTensor output = DTensor::from_local(y, mesh, {local_placement}, global_shape);
  if (output.placements() != Placements{output_layout.normalized(y.dim())}) {
    output = output.redistribute({output_layout});
  }
  return output.to_local();
}

std::string StyleStr(const char* name, const Placement& input, const Placement& output) {
  return std::string(name) + "(input_layouts=" + input.str() + ", output_layouts=" + output.str() +
         ", use_local_output=True)";
}

}  // namespace

// ---- ColwiseParallel ---------------------------------------------------------------------------

ColwiseParallel::ColwiseParallel(ParallelStyleOptions options)
    : input_layout_(options.input_layouts.value_or(Placement::Replicate())),
      output_layout_(options.output_layouts.value_or(Placement::Shard(-1))) {
  CheckUseLocalOutput(options, "ColwiseParallel");
}

void ColwiseParallel::apply(nn::Module& module, const MeshPtr& mesh, const std::string& fqn) const {
  nn::Linear& linear = CheckLinear(module, "ColwiseParallel", fqn);
  const int64_t out_features = linear.out_features();
  ShardParameters(module, *this, mesh);
  const Placement input_layout = input_layout_;
  const Placement output_layout = output_layout_;
  // The local product x @ W_local^T reads all of x: its gradient is a Partial sum.
  module.register_forward_pre_hook(
      [mesh, input_layout, fqn](nn::Module&, const nn::Value& args) -> std::optional<nn::Value> {
        return nn::Value(PrepareInput(InputTensor(args, fqn), mesh, input_layout,
                                      Placement::Replicate(), Placement::Partial()));
      });
  module.register_forward_hook(
      [mesh, output_layout, out_features](nn::Module&, const nn::Value&,
                                          const nn::Value& output) -> std::optional<nn::Value> {
        const Tensor& y = output.tensor();
        Shape global = y.sizes();
        global.back() = out_features;
        return nn::Value(PrepareOutput(y, mesh, Placement::Shard(-1), global, output_layout));
      });
}

std::vector<std::pair<std::string, Placement>> ColwiseParallel::parameter_placements() const {
  return {{"weight", Placement::Shard(0)}, {"bias", Placement::Shard(0)}};
}

std::string ColwiseParallel::str() const {
  return StyleStr("ColwiseParallel", input_layout_, output_layout_);
}

// ---- RowwiseParallel ---------------------------------------------------------------------------

RowwiseParallel::RowwiseParallel(ParallelStyleOptions options)
    : input_layout_(options.input_layouts.value_or(Placement::Shard(-1))),
      output_layout_(options.output_layouts.value_or(Placement::Replicate())) {
  CheckUseLocalOutput(options, "RowwiseParallel");
}

void RowwiseParallel::apply(nn::Module& module, const MeshPtr& mesh, const std::string& fqn) const {
  nn::Linear& linear = CheckLinear(module, "RowwiseParallel", fqn);
  const int64_t in_features = linear.in_features();
  ShardParameters(module, *this, mesh);
  const Placement input_layout = input_layout_;
  const Placement output_layout = output_layout_;
  // The bias takes part in the local product as Replicate -> Partial (bias / W on every
  // rank): its Partial local tensor sits in the bias slot for the duration of the call. The
  // bias is whatever tensor the slot holds at the call (the leaf, FSDP's unsharded
  // parameter under fully_shard, or the view FSDP1 installed), wrapped with from_local(Replicate()): its gradient arrives
  // Replicate; the slot gets that tensor back after forward.
  const bool has_bias = GetDTensorParameter(module, "bias").has_value();
  auto bias_in_slot = std::make_shared<Tensor>();
  module.register_forward_pre_hook([mesh, input_layout, in_features, has_bias, bias_in_slot, fqn](
                                       nn::Module& m,
                                       const nn::Value& args) -> std::optional<nn::Value> {
    const Tensor x = InputTensor(args, fqn);
    Shape global = x.sizes();
    if (!global.empty()) global.back() = in_features;
    std::optional<Shape> shape;
    if (input_layout.is_shard() && input_layout.normalized(x.dim()).dim() == x.dim() - 1) {
      shape = global;  // the sharded feature dim's full size is the weight's
    }
    Tensor local =
        PrepareInput(x, mesh, input_layout, Placement::Shard(-1), Placement::Shard(-1), shape);
    if (has_bias) {
      const DTensor spec = *GetDTensorParameter(m, "bias");  // placements and shape
      *bias_in_slot = m.parameter("bias");
      SetParameterOrAttribute(
          m, "bias",
          DTensor::from_local(*bias_in_slot, mesh, spec.placements(), spec.shape())
              .redistribute({Placement::Partial()})
              .to_local(Placements{Placement::Replicate()}));
    }
    return nn::Value(local);
  });
  nn::ForwardHookOptions options;
  options.always_call = true;  // the bias slot gets its tensor back even when forward throws
  module.register_forward_hook(
      [mesh, output_layout, bias_in_slot](nn::Module& m, const nn::Value&,
                                          const nn::Value& output) -> std::optional<nn::Value> {
        if (bias_in_slot->defined()) {
          SetParameterOrAttribute(m, "bias", *bias_in_slot);
          *bias_in_slot = Tensor();
        }
        if (output.is_none()) return std::nullopt;  // forward threw
        const Tensor& y = output.tensor();
        return nn::Value(PrepareOutput(y, mesh, Placement::Partial(), y.sizes(), output_layout));
      },
      options);
}

std::vector<std::pair<std::string, Placement>> RowwiseParallel::parameter_placements() const {
  return {{"weight", Placement::Shard(1)}, {"bias", Placement::Replicate()}};
}

std::string RowwiseParallel::str() const {
  return StyleStr("RowwiseParallel", input_layout_, output_layout_);
}

// ---- SequenceParallel --------------------------------------------------------------------------

SequenceParallel::SequenceParallel(int64_t sequence_dim, bool use_local_output)
    : sequence_dim_(sequence_dim), use_local_output_(use_local_output) {}

void SequenceParallel::apply(nn::Module& module, const MeshPtr& mesh,
                             const std::string& fqn) const {
  FSDP_CHECK(dynamic_cast<nn::LayerNorm*>(&module) != nullptr ||
                 dynamic_cast<nn::RMSNormPython*>(&module) != nullptr,
             "SequenceParallel currently only supports nn.LayerNorm and RMSNorm: module '", fqn,
             "' is ", module.type_name());
  FSDP_CHECK(!GetDTensorParameter(module, "weight").has_value(), "SequenceParallel: module '", fqn,
             "' is already tensor-parallel (its weight is ",
             GetDTensorParameter(module, "weight")->str(), ")");
  std::vector<std::string> names;
  for (const auto& [name, placement] : parameter_placements()) {
    const Tensor param = module.has_parameter(name) ? module.parameter(name) : Tensor();
    if (!param.defined()) continue;
    // _replicate_module_fn: nn.Parameter(DTensor.from_local(param, [Replicate()])): a leaf
    // over this rank's own values, no communication (the replicas are equal by construction).
    RegisterDTensorParameter(module, name,
                             distribute_tensor(param, mesh, {placement}, /*src_data_rank=*/std::nullopt));
    names.push_back(name);
  }
  const Placement sequence_sharding = Placement::Shard(sequence_dim_);
  // The tensors the slots held before the call (restored after it).
  auto in_slots = std::make_shared<std::vector<Tensor>>();
  module.register_forward_pre_hook([mesh, names, sequence_sharding, in_slots, fqn](
                                       nn::Module& m,
                                       const nn::Value& args) -> std::optional<nn::Value> {
    const Tensor x = InputTensor(args, fqn);
    in_slots->clear();
    for (const std::string& name : names) {
      const Tensor param = m.parameter(name);
      in_slots->push_back(param);
      m.set_parameter(name, DTensor::from_local(param, mesh, {Placement::Replicate()})
                                .to_local(Placements{Placement::Partial()}));
    }
    // The input is this rank's piece along the sequence dim already (from_local, as PyTorch
    // assumes for a plain tensor); its gradient comes back with the same placement.
    const Placement normalized = sequence_sharding.normalized(x.dim());
    return nn::Value(DTensor::from_local(x, mesh, {normalized}).to_local());
  });
  nn::ForwardHookOptions options;
  options.always_call = true;  // the slots get their tensors back even when forward throws
  module.register_forward_hook(
      [names, in_slots](nn::Module& m, const nn::Value&,
                        const nn::Value& output) -> std::optional<nn::Value> {
        for (size_t i = 0; i < in_slots->size() && i < names.size(); ++i) {
          m.set_parameter(names[i], (*in_slots)[i]);
        }
        in_slots->clear();
        return std::nullopt;  // the local output, Shard(sequence_dim)
      },
      options);
}

std::vector<std::pair<std::string, Placement>> SequenceParallel::parameter_placements() const {
  return {{"weight", Placement::Replicate()}, {"bias", Placement::Replicate()}};
}

std::string SequenceParallel::str() const {
  return "SequenceParallel(sequence_dim=" + std::to_string(sequence_dim_) +
         ", use_local_output=" + (use_local_output_ ? "True" : "False") + ")";
}

}  // namespace fsdp::tensor_parallel
