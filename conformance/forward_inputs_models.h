// The models of PyTorch's mixed-precision forward-cast tests (FSDP2's
// TestFullyShardMixedPrecisionCasts and FSDP1's TestFSDPDifferentSubmodulePrecision), which
// record the dtype each module's forward receives:
//
//   auto seen = std::make_shared<ForwardInputs>();
//   auto model = std::make_shared<SaveForwardInputsModel>(seen, /*dim=*/100,
//                                                         /*cast_forward_inputs=*/false);
//   (*model)(x);  // (*seen)[""], (*seen)["c1"], (*seen)["c2"]: dtype names
//
// Every Linear is Linear(dim, dim) in float32; the values play no part. The models share
// their ForwardInputs map with the caller; one map per rank.
//
// Ownership: each module holds a shared_ptr to the map. Thread-safety: none (one rank's thread
// builds and runs its own model).
#pragma once

#include <map>
#include <memory>
#include <string>

#include "conformance/observation_schema.h"
#include "engine/nn/module.h"

namespace fsdp::conformance {

// What forward saw: dtype names by the test's forward_inputs key.
using ForwardInputs = std::map<std::string, std::string>;

// common_distributed.py's SaveForwardInputsModule: l = Linear(dim, dim); forward saves x under
// `key`, then l(x), casting x to l.weight's dtype first when `cast_forward_inputs`.
class SaveForwardInputsModule : public nn::Cloneable<SaveForwardInputsModule> {
 public:
  SaveForwardInputsModule(std::shared_ptr<ForwardInputs> forward_inputs, std::string key,
                          int64_t dim, bool cast_forward_inputs);
  nn::Value forward(const nn::Value& input) override;

 private:
  std::shared_ptr<ForwardInputs> forward_inputs_;
  std::string key_;
  bool cast_forward_inputs_;
};

// common_distributed.py's SaveForwardInputsModel: c1, c2 (SaveForwardInputsModule); forward
// saves x under "" and returns c2(c1(x)).
class SaveForwardInputsModel : public nn::Cloneable<SaveForwardInputsModel> {
 public:
  SaveForwardInputsModel(std::shared_ptr<ForwardInputs> forward_inputs, int64_t dim,
                         bool cast_forward_inputs);
  nn::Value forward(const nn::Value& x) override;

 private:
  std::shared_ptr<ForwardInputs> forward_inputs_;
};

// The tests' ToyModule: l = Linear(dim, dim); forward(x, y) saves both (keys l2_input_x,
// l2_input_y) and returns l(x). Takes y positionally or as the keyword argument y.
class ToyModule : public nn::Cloneable<ToyModule> {
 public:
  ToyModule(std::shared_ptr<ForwardInputs> forward_inputs, int64_t dim);
  nn::Value forward(const nn::Value& args) override;
  nn::Value forward_with_kwargs(const nn::Value& args, const nn::Value& kwargs) override;

 private:
  nn::Value Forward(const Tensor& x, const Tensor& y);
  std::shared_ptr<ForwardInputs> forward_inputs_;
};

// The tests' ToyModel: l1 = Linear(dim, dim), l2 = ToyModule; forward(x) saves x (key
// model_input_x) and returns l2(l1(x), y) with y = ones(2, dim) in float32 made inside forward
// (the external input), passed positionally or, with `y_by_keyword`, as l2(h, y=y).
class ToyModel : public nn::Cloneable<ToyModel> {
 public:
  ToyModel(std::shared_ptr<ForwardInputs> forward_inputs, int64_t dim, bool y_by_keyword);
  nn::Value forward(const nn::Value& input) override;

 private:
  std::shared_ptr<ForwardInputs> forward_inputs_;
  int64_t dim_;
  bool y_by_keyword_;
};

// The observation keys of the cast scenarios.
inline constexpr const char* kForwardInputDtypes = "forward_input_dtypes";
inline constexpr const char* kForwardOutputDtype = "output_dtype";

// forward_input_dtypes ({keys}: dtype names) and output_dtype (the model output's dtype name).
ObservationSchema ForwardInputsSchema(const std::string& keys);

}  // namespace fsdp::conformance
