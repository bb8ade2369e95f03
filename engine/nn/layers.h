// Standard layers with PyTorch's registration order, names, shapes and default initialisation
// (drawn from the calling rank's generator): Linear, Embedding, LayerNorm, RMSNorm,
// BatchNorm1d, Dropout, ReLU, GELU, Identity and the containers Sequential, ModuleList and
// ParameterList. Forwards use the differentiable ops of engine/functional/functional.h and read every
// parameter from its slot at call time (see Module).
//
// Ownership: parameters and buffers live in the Module registries; the classes keep only
// configuration. Thread-safety: as Module.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/core/dtype.h"
#include "engine/nn/module.h"

namespace fsdp::nn {

// y = x Wᵀ + b. weight [out, in] ~ kaiming_uniform(a=sqrt(5)) = U(±1/sqrt(in)), bias [out] ~
// U(±1/sqrt(in)); without bias the "bias" slot is registered as None.
class Linear : public Cloneable<Linear> {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true,
         DType dtype = DType::kFloat32);
  void reset_parameters();
  Tensor weight() const { return parameter("weight"); }
  Tensor bias() const { return parameter("bias"); }
  int64_t in_features() const { return in_features_; }
  int64_t out_features() const { return out_features_; }
  Value forward(const Value& input) override;
  std::string extra_repr() const override;

 protected:
  // For subclasses that only change the class name (NonDynamicallyQuantizableLinear).
  Linear(std::string type_name, int64_t in_features, int64_t out_features, bool bias, DType dtype);

 private:
  int64_t in_features_;
  int64_t out_features_;
};

// torch.nn.modules.linear.NonDynamicallyQuantizableLinear: a Linear under another class name
// (MultiheadAttention.out_proj).
class NonDynamicallyQuantizableLinear : public Cloneable<NonDynamicallyQuantizableLinear, Linear> {
 public:
  NonDynamicallyQuantizableLinear(int64_t in_features, int64_t out_features, bool bias = true,
                                  DType dtype = DType::kFloat32)
      : Cloneable<NonDynamicallyQuantizableLinear, Linear>(
            "NonDynamicallyQuantizableLinear", in_features, out_features, bias, dtype) {}
};

// Lookup table: weight [num_embeddings, embedding_dim] ~ N(0, 1); input int64 indices.
class Embedding : public Cloneable<Embedding> {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim, DType dtype = DType::kFloat32);
  void reset_parameters();
  Tensor weight() const { return parameter("weight"); }
  Value forward(const Value& input) override;
  std::string extra_repr() const override;

 private:
  int64_t num_embeddings_;
  int64_t embedding_dim_;
};

// LayerNorm over the trailing normalized_shape dims; weight = ones, bias = zeros (None slots
// when elementwise_affine / bias are off).
class LayerNorm : public Cloneable<LayerNorm> {
 public:
  LayerNorm(Shape normalized_shape, double eps = 1e-5, bool elementwise_affine = true,
            bool bias = true, DType dtype = DType::kFloat32);
  LayerNorm(int64_t dim, double eps = 1e-5, bool elementwise_affine = true, bool bias = true,
            DType dtype = DType::kFloat32)
      : LayerNorm(Shape{dim}, eps, elementwise_affine, bias, dtype) {}
  void reset_parameters();
  Value forward(const Value& input) override;
  std::string extra_repr() const override;
  const Shape& normalized_shape() const { return normalized_shape_; }
  double eps() const { return eps_; }

 private:
  Shape normalized_shape_;
  double eps_;
  bool elementwise_affine_;
};

// torch.nn.RMSNorm: y = x * rsqrt(mean(x², dims) + eps) * weight, weight = ones; eps nullopt
// means torch.finfo(x.dtype).eps.
class RMSNorm : public Cloneable<RMSNorm> {
 public:
  RMSNorm(Shape normalized_shape, std::optional<double> eps = std::nullopt,
          bool elementwise_affine = true, DType dtype = DType::kFloat32);
  RMSNorm(int64_t dim, std::optional<double> eps = std::nullopt, bool elementwise_affine = true,
          DType dtype = DType::kFloat32)
      : RMSNorm(Shape{dim}, eps, elementwise_affine, dtype) {}
  void reset_parameters();
  Value forward(const Value& input) override;
  std::string extra_repr() const override;

 private:
  Shape normalized_shape_;
  std::optional<double> eps_;
  bool elementwise_affine_;
};

// BatchNorm1d over [N, C] or [N, C, L]. Parameters weight (ones), bias (zeros); buffers
// running_mean (zeros), running_var (ones), num_batches_tracked (int64 scalar 0). Class
// version 2: loading a state dict without metadata (or version < 2) that lacks
// num_batches_tracked fills it in instead of reporting it missing, as PyTorch does.
class BatchNorm1d : public Cloneable<BatchNorm1d> {
 public:
  BatchNorm1d(int64_t num_features, double eps = 1e-5, std::optional<double> momentum = 0.1,
              bool affine = true, bool track_running_stats = true, DType dtype = DType::kFloat32);
  void reset_running_stats();
  void reset_parameters();
  Value forward(const Value& input) override;
  std::string extra_repr() const override;
  int64_t version() const override { return 2; }

 protected:
  void load_from_state_dict(StateDict& state_dict, const std::string& prefix,
                            std::optional<int64_t> version, LoadStateDictState& state) override;

 private:
  int64_t num_features_;
  double eps_;
  std::optional<double> momentum_;
  bool affine_;
  bool track_running_stats_;
};

// Dropout(p): active only in training mode.
class Dropout : public Cloneable<Dropout> {
 public:
  explicit Dropout(double p = 0.5);
  Value forward(const Value& input) override;
  std::string extra_repr() const override;
  double p() const { return p_; }

 private:
  double p_;
};

class ReLU : public Cloneable<ReLU> {
 public:
  ReLU() : Cloneable<ReLU>("ReLU") {}
  Value forward(const Value& input) override;
};

// GELU with approximate="none" (erf) or "tanh".
class GELU : public Cloneable<GELU> {
 public:
  explicit GELU(std::string approximate = "none");
  Value forward(const Value& input) override;
  std::string extra_repr() const override;

 private:
  std::string approximate_;
};

class Identity : public Cloneable<Identity> {
 public:
  Identity() : Cloneable<Identity>("Identity") {}
  Value forward(const Value& input) override { return input; }
};

// Sequential(*modules): children "0", "1", ...; forward feeds each child's output to the next
// (every registered child, in order, as `for module in self._modules.values()`).
class Sequential : public Cloneable<Sequential> {
 public:
  Sequential() : Sequential(std::vector<ModulePtr>{}) {}
  explicit Sequential(std::vector<ModulePtr> modules);
  // Sequential(OrderedDict): children under the given names.
  explicit Sequential(std::vector<NamedModule> named_modules);
  void append(ModulePtr module);
  size_t size() const { return child_slots().size(); }
  // self[i] (negative counts from the end).
  ModulePtr operator[](int64_t index) const;
  Value forward(const Value& input) override;

 protected:
  Sequential(std::string type_name, std::vector<ModulePtr> modules);
};

// ModuleList: children "0", "1", ...; no forward of its own.
class ModuleList : public Cloneable<ModuleList> {
 public:
  ModuleList() : ModuleList(std::vector<ModulePtr>{}) {}
  explicit ModuleList(std::vector<ModulePtr> modules);
  void append(ModulePtr module);
  size_t size() const { return child_slots().size(); }
  ModulePtr operator[](int64_t index) const;
  // The children in index order (what `for m in module_list` yields).
  std::vector<ModulePtr> list() const;
};

// ParameterList: parameters "0", "1", ...; no forward of its own.
class ParameterList : public Cloneable<ParameterList> {
 public:
  ParameterList() : ParameterList(std::vector<Tensor>{}) {}
  explicit ParameterList(std::vector<Tensor> params);
  void append(Tensor param);
  size_t size() const { return parameter_slots().size(); }
  Tensor operator[](int64_t index) const;
};

}  // namespace fsdp::nn
