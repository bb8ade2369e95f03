#include "engine/distributed/functional_collectives.h"

#include "engine/distributed/comm_debug_mode.h"

namespace fsdp::distributed::funcol {

Tensor all_gather_tensor(const Tensor& input, ProcessGroup& group) {
  FunctionalCollectiveGuard guard(FunctionalCollective::kAllGatherIntoTensor);
  FSDP_CHECK(input.defined() && input.dim() >= 1, "funcol::all_gather_tensor on ", group.describe(),
             ": input must have at least one dim, got ",
             input.defined() ? input.str() : "an undefined tensor");
  Shape shape = input.sizes();
  shape[0] *= group.size();
  Tensor output = Tensor::empty(shape, input.dtype(), input.device());
  group.all_gather_into_tensor(output, input);
  return output;
}

Tensor reduce_scatter_tensor(const Tensor& input, ReduceOptions options, ProcessGroup& group) {
  FunctionalCollectiveGuard guard(FunctionalCollective::kReduceScatterTensor);
  FSDP_CHECK(input.defined() && input.dim() >= 1 && input.size(0) % group.size() == 0,
             "funcol::reduce_scatter_tensor on ", group.describe(), ": input ",
             input.defined() ? input.str() : "undefined",
             " must have a dim 0 divisible by the group size ", group.size());
  Shape shape = input.sizes();
  shape[0] /= group.size();
  Tensor output = Tensor::empty(shape, input.dtype(), input.device());
  group.reduce_scatter_tensor(output, input, options);
  return output;
}

Tensor all_reduce(const Tensor& input, ReduceOptions options, ProcessGroup& group) {
  FunctionalCollectiveGuard guard(FunctionalCollective::kAllReduce);
  Tensor output = input.clone();
  group.all_reduce(output, options);
  return output;
}

Tensor broadcast(const Tensor& input, int root, ProcessGroup& group) {
  FunctionalCollectiveGuard guard(FunctionalCollective::kBroadcast);
  Tensor output = input.clone();
  group.broadcast(output, root);
  return output;
}

}  // namespace fsdp::distributed::funcol
