// MockProcessGroup: a gMock ProcessGroup for unit tests of code that issues collectives
// (FSDP's collective helpers, meshes). The backend hooks (*_impl) are mocked, so calls still
// pass through the ProcessGroup front: arguments are validated and CommDebugMode and the
// flight recorder record them. Defaults (ON_CALL): rank/size from the constructor, global
// ranks 0..size-1, backend "mock", group name "0", timeout 30 s, collectives return a
// CompletedWork without touching data, new_group returns nullptr. Use
// testing::NiceMock<MockProcessGroup> to silence uninteresting calls.
//
//   testing::NiceMock<fakes::MockProcessGroup> pg(/*rank=*/1, /*size=*/4);
//   EXPECT_CALL(pg, all_reduce_impl(_, _, _)).Times(1);
//   pg.all_reduce(t);
//
// Ownership: owned by the test (may be held by shared_ptr).
// Thread-safety: gMock mocks are thread-safe for calls; set expectations before use.
#pragma once

#include <gmock/gmock.h>

#include "engine/distributed/process_group.h"

namespace fsdp::fakes {

class MockProcessGroup : public distributed::ProcessGroup {
 public:
  explicit MockProcessGroup(int rank = 0, int size = 1);

  MOCK_METHOD(int, rank, (), (const, override));
  MOCK_METHOD(int, size, (), (const, override));
  MOCK_METHOD(std::string, backend_name, (), (const, override));
  MOCK_METHOD(std::vector<int>, global_ranks, (), (const, override));
  MOCK_METHOD(std::chrono::milliseconds, timeout, (), (const, override));
  MOCK_METHOD(std::string, group_name, (), (const, override));

  MOCK_METHOD(std::shared_ptr<distributed::Work>, all_gather_into_tensor_impl,
              (const Tensor& output, const Tensor& input, const distributed::CollectiveInfo& info),
              (override));
  MOCK_METHOD(std::shared_ptr<distributed::Work>, reduce_scatter_tensor_impl,
              (const Tensor& output, const Tensor& input, const distributed::ReduceOptions& options,
               const distributed::CollectiveInfo& info),
              (override));
  MOCK_METHOD(std::shared_ptr<distributed::Work>, all_reduce_impl,
              (const Tensor& tensor, const distributed::ReduceOptions& options,
               const distributed::CollectiveInfo& info),
              (override));
  MOCK_METHOD(std::shared_ptr<distributed::Work>, broadcast_impl,
              (const Tensor& tensor, int root, const distributed::CollectiveInfo& info), (override));
  MOCK_METHOD(std::shared_ptr<distributed::Work>, all_gather_impl,
              (const std::vector<Tensor>& outputs, const Tensor& input,
               const distributed::CollectiveInfo& info),
              (override));
  MOCK_METHOD(void, barrier_impl, (const distributed::CollectiveInfo& info), (override));
  MOCK_METHOD(std::shared_ptr<distributed::ProcessGroup>, new_group_impl,
              (const std::vector<int>& ranks, const distributed::CollectiveInfo& info), (override));
};

}  // namespace fsdp::fakes
