#include "fakes/mock_process_group.h"

#include <numeric>

namespace fsdp::fakes {

using ::testing::_;
using ::testing::Return;

MockProcessGroup::MockProcessGroup(int rank, int size) {
  std::vector<int> ranks(static_cast<size_t>(size));
  std::iota(ranks.begin(), ranks.end(), 0);
  ON_CALL(*this, rank()).WillByDefault(Return(rank));
  ON_CALL(*this, size()).WillByDefault(Return(size));
  ON_CALL(*this, backend_name()).WillByDefault(Return(std::string("mock")));
  ON_CALL(*this, global_ranks()).WillByDefault(Return(ranks));
  ON_CALL(*this, timeout()).WillByDefault(Return(std::chrono::milliseconds(30000)));
  ON_CALL(*this, group_name()).WillByDefault(Return(std::string("0")));
  auto completed = [](auto&&... /*args*/) -> std::shared_ptr<distributed::Work> {
    return std::make_shared<distributed::CompletedWork>("mock collective");
  };
  ON_CALL(*this, all_gather_into_tensor_impl(_, _, _)).WillByDefault(completed);
  ON_CALL(*this, reduce_scatter_tensor_impl(_, _, _, _)).WillByDefault(completed);
  ON_CALL(*this, all_reduce_impl(_, _, _)).WillByDefault(completed);
  ON_CALL(*this, broadcast_impl(_, _, _)).WillByDefault(completed);
  ON_CALL(*this, all_gather_impl(_, _, _)).WillByDefault(completed);
  ON_CALL(*this, new_group_impl(_, _)).WillByDefault(Return(nullptr));
}

}  // namespace fsdp::fakes
