// SGD: torch.optim.SGD (single-tensor implementation, `_single_tensor_sgd`).
//
//   g = grad (negated when maximize); if weight_decay: g = g + weight_decay * p
//   if momentum: buf = g on the first step, else buf = momentum * buf + (1 - dampening) * g;
//                g = g + momentum * buf (nesterov) or g = buf
//   p = p - lr * g
// State: "momentum_buffer" (only when momentum != 0).
// Ownership/thread-safety: see Optimizer.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "engine/optim/optimizer.h"

namespace fsdp::optim {

struct SGDOptions {
  double lr = 1e-3;           // Default: 1e-3
  double momentum = 0.0;      // Default: 0
  double dampening = 0.0;     // Default: 0
  double weight_decay = 0.0;  // Default: 0
  bool nesterov = false;      // Default: false
  bool maximize = false;      // Default: false
};

class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, SGDOptions options = {});
  SGD(std::vector<std::pair<std::string, Tensor>> named_params, SGDOptions options = {});
  void step() override;
  const SGDOptions& options() const { return options_; }

 private:
  void validate() const;
  SGDOptions options_;
};

}  // namespace fsdp::optim
