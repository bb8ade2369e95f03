#include "fakes/process_group_wrapper.h"

namespace fsdp::fakes {

ProcessGroupWrapper::ProcessGroupWrapper(std::shared_ptr<distributed::ProcessGroup> inner)
    : inner_(std::move(inner)) {
  FSDP_CHECK(inner_ != nullptr, "ProcessGroupWrapper: the wrapped process group is null");
}

std::shared_ptr<distributed::Work> ProcessGroupWrapper::Intercept(const distributed::CollectiveInfo& /*info*/,
                                                           const std::vector<Tensor>& /*outputs*/,
                                                           const Forward& forward) {
  return forward();
}

std::shared_ptr<distributed::Work> ProcessGroupWrapper::all_gather_into_tensor_impl(
    const Tensor& output, const Tensor& input, const distributed::CollectiveInfo& info) {
  return Intercept(info, {output},
                   [&] { return inner_->all_gather_into_tensor(output, input, info.async_op); });
}

std::shared_ptr<distributed::Work> ProcessGroupWrapper::reduce_scatter_tensor_impl(
    const Tensor& output, const Tensor& input, const distributed::ReduceOptions& options,
    const distributed::CollectiveInfo& info) {
  return Intercept(info, {output}, [&] {
    return inner_->reduce_scatter_tensor(output, input, options, info.async_op);
  });
}

std::shared_ptr<distributed::Work> ProcessGroupWrapper::all_reduce_impl(const Tensor& tensor,
                                                                 const distributed::ReduceOptions& options,
                                                                 const distributed::CollectiveInfo& info) {
  return Intercept(info, {tensor}, [&] { return inner_->all_reduce(tensor, options, info.async_op); });
}

std::shared_ptr<distributed::Work> ProcessGroupWrapper::broadcast_impl(const Tensor& tensor, int root,
                                                                const distributed::CollectiveInfo& info) {
  return Intercept(info, {tensor}, [&] { return inner_->broadcast(tensor, root, info.async_op); });
}

std::shared_ptr<distributed::Work> ProcessGroupWrapper::all_gather_impl(const std::vector<Tensor>& outputs,
                                                                 const Tensor& input,
                                                                 const distributed::CollectiveInfo& info) {
  return Intercept(info, outputs, [&] { return inner_->all_gather(outputs, input, info.async_op); });
}

void ProcessGroupWrapper::barrier_impl(const distributed::CollectiveInfo& info) {
  Intercept(info, {}, [&] {
    inner_->barrier();
    return std::shared_ptr<distributed::Work>();
  });
}

std::shared_ptr<distributed::ProcessGroup> ProcessGroupWrapper::new_group_impl(
    const std::vector<int>& ranks, const distributed::CollectiveInfo& info) {
  std::shared_ptr<distributed::ProcessGroup> sub;
  Intercept(info, {}, [&] {
    sub = inner_->new_group(ranks);
    return std::shared_ptr<distributed::Work>();
  });
  return sub == nullptr ? nullptr : Wrap(std::move(sub));
}

}  // namespace fsdp::fakes
