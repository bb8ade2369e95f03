// Adam and AdamW: torch.optim.Adam / torch.optim.AdamW, single-tensor implementation
// (`_single_tensor_adam(w)`, foreach=False, capturable=False).
//
//   step += 1;  g = grad (negated when maximize)
//   AdamW: p = p * (1 - lr * weight_decay)          Adam: g = g + weight_decay * p
//   m = lerp(m, g, 1 - beta1);  v = v * beta2 + (1 - beta2) * g * g
//   bias_correction1 = 1 - beta1^step;  bias_correction2 = 1 - beta2^step
//   denom = sqrt(v) / sqrt(bias_correction2) + eps   (v := max(max_v, v) with amsgrad)
//   p = p - (lr / bias_correction1) * m / denom
// State: "step" (a float32 scalar tensor, like PyTorch), "exp_avg", "exp_avg_sq" and, with
// amsgrad, "max_exp_avg_sq", all in the parameter's dtype and on its device.
// Ownership/thread-safety: see Optimizer.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "engine/optim/optimizer.h"

namespace fsdp::optim {

struct AdamOptions {
  double lr = 1e-3;           // Default: 1e-3
  double beta1 = 0.9;         // Default: 0.9
  double beta2 = 0.999;       // Default: 0.999
  double eps = 1e-8;          // Default: 1e-8
  double weight_decay = 0.0;  // Default: 0 (L2 penalty added to the gradient)
  bool amsgrad = false;       // Default: false
  bool maximize = false;      // Default: false
};

// AdamW's options differ only in the weight-decay default and meaning (decoupled).
struct AdamWOptions {
  double lr = 1e-3;            // Default: 1e-3
  double beta1 = 0.9;          // Default: 0.9
  double beta2 = 0.999;        // Default: 0.999
  double eps = 1e-8;           // Default: 1e-8
  double weight_decay = 1e-2;  // Default: 1e-2 (decoupled: p *= 1 - lr * weight_decay)
  bool amsgrad = false;        // Default: false
  bool maximize = false;       // Default: false
};

class Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor> params, AdamOptions options = {});
  Adam(std::vector<std::pair<std::string, Tensor>> named_params, AdamOptions options = {});
  void step() override;
  const AdamOptions& options() const { return options_; }

 protected:
  Adam(std::string name, std::vector<Tensor> params, AdamOptions options, bool decoupled);
  Adam(std::string name, std::vector<std::pair<std::string, Tensor>> named_params,
       AdamOptions options, bool decoupled);

 private:
  void validate() const;
  AdamOptions options_;
  bool decoupled_weight_decay_ = false;
};

class AdamW : public Adam {
 public:
  AdamW(std::vector<Tensor> params, AdamWOptions options = {});
  AdamW(std::vector<std::pair<std::string, Tensor>> named_params, AdamWOptions options = {});
};

}  // namespace fsdp::optim
