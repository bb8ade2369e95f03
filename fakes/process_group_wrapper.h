// ProcessGroupWrapper: the base of process-group decorators (RecordingProcessGroup,
// FaultInjectingProcessGroup). Every *_impl forwards to the wrapped group's public API (whose
// front validates and runs the backend; nested front calls are not recorded twice by
// CommDebugMode or the flight recorder) through one interception point, Intercept(), which is
// all a decorator overrides besides Wrap(). new_group wraps the inner subgroup with Wrap(), so
// a decorator stays in place on subgroups and mesh groups.
//
// Ownership: holds the wrapped group (shared_ptr).
// Thread-safety: like any ProcessGroup, used by its rank's thread only.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "engine/distributed/process_group.h"

namespace fsdp::fakes {

class ProcessGroupWrapper : public distributed::ProcessGroup {
 public:
  explicit ProcessGroupWrapper(std::shared_ptr<distributed::ProcessGroup> inner);

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string backend_name() const override { return inner_->backend_name(); }
  Device default_device() const override { return inner_->default_device(); }
  std::vector<int> global_ranks() const override { return inner_->global_ranks(); }
  std::chrono::milliseconds timeout() const override { return inner_->timeout(); }
  std::string group_name() const override { return inner_->group_name(); }
  const std::shared_ptr<distributed::ProcessGroup>& inner() const { return inner_; }

 protected:
  // Issues the call on the wrapped group; its Work, or null for barrier and new_group.
  using Forward = std::function<std::shared_ptr<distributed::Work>()>;

  // The same decorator around a subgroup of the inner group.
  virtual std::shared_ptr<distributed::ProcessGroup> Wrap(std::shared_ptr<distributed::ProcessGroup> inner) = 0;
  // Called for every call (collectives, barrier, new_group) with its info and the tensors it
  // writes (empty for barrier and new_group); returns what the call returns. Default: forward().
  virtual std::shared_ptr<distributed::Work> Intercept(const distributed::CollectiveInfo& info,
                                                const std::vector<Tensor>& outputs,
                                                const Forward& forward);

  std::shared_ptr<distributed::Work> all_gather_into_tensor_impl(
      const Tensor& output, const Tensor& input, const distributed::CollectiveInfo& info) final;
  std::shared_ptr<distributed::Work> reduce_scatter_tensor_impl(const Tensor& output, const Tensor& input,
                                                         const distributed::ReduceOptions& options,
                                                         const distributed::CollectiveInfo& info) final;
  std::shared_ptr<distributed::Work> all_reduce_impl(const Tensor& tensor,
                                              const distributed::ReduceOptions& options,
                                              const distributed::CollectiveInfo& info) final;
  std::shared_ptr<distributed::Work> broadcast_impl(const Tensor& tensor, int root,
                                             const distributed::CollectiveInfo& info) final;
  std::shared_ptr<distributed::Work> all_gather_impl(const std::vector<Tensor>& outputs,
                                              const Tensor& input,
                                              const distributed::CollectiveInfo& info) final;
  void barrier_impl(const distributed::CollectiveInfo& info) final;
  std::shared_ptr<distributed::ProcessGroup> new_group_impl(const std::vector<int>& ranks,
                                                     const distributed::CollectiveInfo& info) final;

 private:
  std::shared_ptr<distributed::ProcessGroup> inner_;
};

}  // namespace fsdp::fakes
