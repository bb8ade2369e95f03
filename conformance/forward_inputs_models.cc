#include "conformance/forward_inputs_models.h"

#include "engine/core/error.h"
#include "engine/functional/functional.h"
#include "engine/nn/layers.h"

namespace fsdp::conformance {

SaveForwardInputsModule::SaveForwardInputsModule(std::shared_ptr<ForwardInputs> forward_inputs,
                                                 std::string key, int64_t dim,
                                                 bool cast_forward_inputs)
    : nn::Cloneable<SaveForwardInputsModule>("SaveForwardInputsModule"),
      forward_inputs_(std::move(forward_inputs)),
      key_(std::move(key)),
      cast_forward_inputs_(cast_forward_inputs) {
  register_module("l", std::make_shared<nn::Linear>(dim, dim));
}

nn::Value SaveForwardInputsModule::forward(const nn::Value& input) {
  Tensor x = input.tensor();
  (*forward_inputs_)[key_] = DTypeName(x.dtype());
  if (cast_forward_inputs_) x = fsdp::to(x, child("l")->parameter("weight").dtype());
  return call_child("l", nn::Value(x));
}

SaveForwardInputsModel::SaveForwardInputsModel(std::shared_ptr<ForwardInputs> forward_inputs,
                                               int64_t dim, bool cast_forward_inputs)
    : nn::Cloneable<SaveForwardInputsModel>("SaveForwardInputsModel"),
      forward_inputs_(forward_inputs) {
  for (const char* name : {"c1", "c2"}) {
    register_module(name, std::make_shared<SaveForwardInputsModule>(forward_inputs, name, dim,
                                                                    cast_forward_inputs));
  }
}

nn::Value SaveForwardInputsModel::forward(const nn::Value& x) {
  (*forward_inputs_)[""] = DTypeName(x.tensor().dtype());
  return call_child("c2", call_child("c1", x));
}

ToyModule::ToyModule(std::shared_ptr<ForwardInputs> forward_inputs, int64_t dim)
    : nn::Cloneable<ToyModule>("ToyModule"), forward_inputs_(std::move(forward_inputs)) {
  register_module("l", std::make_shared<nn::Linear>(dim, dim));
}

nn::Value ToyModule::forward(const nn::Value& args) {
  FSDP_CHECK(args.is_tuple() && args.size() == 2, "ToyModule.forward takes (x, y); got ",
             args.str());
  return Forward(args[0].tensor(), args[1].tensor());
}

nn::Value ToyModule::forward_with_kwargs(const nn::Value& args, const nn::Value& kwargs) {
  if (kwargs.is_dict() && kwargs.contains("y")) {
    FSDP_CHECK(args.is_tuple() && args.size() == 1 && kwargs.size() == 1,
               "ToyModule.forward takes (x, y=...); got args ", args.str(), " and kwargs ",
               kwargs.str());
    return Forward(args[0].tensor(), kwargs.at("y").tensor());
  }
  return nn::Module::forward_with_kwargs(args, kwargs);
}

nn::Value ToyModule::Forward(const Tensor& x, const Tensor& y) {
  (*forward_inputs_)["l2_input_x"] = DTypeName(x.dtype());
  (*forward_inputs_)["l2_input_y"] = DTypeName(y.dtype());
  return call_child("l", nn::Value(x));
}

ToyModel::ToyModel(std::shared_ptr<ForwardInputs> forward_inputs, int64_t dim, bool y_by_keyword)
    : nn::Cloneable<ToyModel>("ToyModel"),
      forward_inputs_(forward_inputs),
      dim_(dim),
      y_by_keyword_(y_by_keyword) {
  register_module("l1", std::make_shared<nn::Linear>(dim, dim));
  register_module("l2", std::make_shared<ToyModule>(forward_inputs, dim));
}

nn::Value ToyModel::forward(const nn::Value& input) {
  const Tensor& x = input.tensor();
  (*forward_inputs_)["model_input_x"] = DTypeName(x.dtype());
  Tensor y = Tensor::ones({2, dim_}, DType::kFloat32, x.device());
  nn::Value h = call_child("l1", input);
  nn::Module& l2 = *child("l2");
  if (y_by_keyword_) return l2.call(nn::Value::Tuple({h}), nn::Value::Dict({{"y", nn::Value(y)}}));
  return l2(nn::Value::Tuple({h, nn::Value(y)}));
}

ObservationSchema ForwardInputsSchema(const std::string& keys) {
  ObservationSchema schema;
  schema.Add(ObservationKey::Custom(
      kForwardInputDtypes, {{"type", "object"}, {"additionalProperties", {{"type", "string"}}}},
      "{" + keys + "}: the dtype name of the tensor each module's forward received"));
  schema.Add(ObservationKey::String(kForwardOutputDtype, "the model output's dtype name"));
  return schema;
}

}  // namespace fsdp::conformance
