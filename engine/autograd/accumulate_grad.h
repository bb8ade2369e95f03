// AccumulateGrad: the node that ends every path to a leaf that requires grad and adds the
// incoming gradient into the leaf's .grad (torch::autograd::AccumulateGrad).
//
// Its sequence number is UINT64_MAX, so it outranks every other node in the ready queue and
// runs at the next pop after it becomes ready. Accumulation follows accumulate_grad.h: an
// undefined .grad steals the incoming gradient when nothing else references it (else stores
// a clone); a defined .grad is updated in place when grad mode is off (create_graph=false)
// and replaced by .grad + new otherwise. Then the leaf's post-accumulate-grad hooks run. An
// undefined incoming gradient returns at once (no accumulation, no post-accumulate hooks).
//
// Ownership: holds its leaf strongly (the leaf's meta holds the node weakly; see
// variable.h). Thread-safety: used by the thread running the backward.
#pragma once

#include <string>
#include <vector>

#include "engine/autograd/node.h"

namespace fsdp::autograd {

class AccumulateGrad : public Node {
 public:
  explicit AccumulateGrad(Tensor variable);

  std::string name() const override { return "AccumulateGrad"; }
  // The leaf's own tensor hooks, read live.
  std::vector<GradientsHook> tensor_pre_hooks() const override;
  const Tensor& variable() const { return variable_; }

 protected:
  TensorList apply(TensorList&& grads) override;

 private:
  Tensor variable_;
};

}  // namespace fsdp::autograd
