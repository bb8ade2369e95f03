// CommContext / CommStream / CommEvent on the host (docs/fsdp-behaviour.md, "Streams and the
// implicit forward prefetch"): a CPU context uses
// named no-op streams that never reach the CUDA runtime, the current-stream kind resolves the
// thread's CudaStreamGuard at each use, the preconditions fail with clear errors, and a CUDA
// context either owns four dedicated streams (device visible) or fails with Unavailable.
// None of these tests needs a GPU; the one CUDA-context test checks whichever case applies.
#include <gtest/gtest.h>

#include <cstdint>

#include "engine/core/allocator.h"
#include "engine/core/cuda_stream.h"
#include "engine/core/error.h"
#include "engine/fsdp/comm_context.h"

namespace fsdp::fsdp2 {
namespace {

// A stream handle that is never passed to the runtime (guards only store it).
CudaStreamHandle FakeStream(uintptr_t v) { return reinterpret_cast<CudaStreamHandle>(v); }  // NOLINT(performance-no-int-to-ptr)

std::vector<CommStream*> AllStreams(CommContext& ctx) {
  return {&ctx.current_stream(), &ctx.all_gather_copy_in_stream(), &ctx.all_gather_stream(),
          &ctx.reduce_scatter_stream(), &ctx.all_reduce_stream()};
}

TEST(CommContext, CpuDeviceUsesNamedNoOpStreams) {
  CommContext ctx;
  ctx.lazy_init(Device::CPU());
  EXPECT_TRUE(ctx.initialized());
  EXPECT_TRUE(ctx.device().is_cpu());
  for (CommStream* stream : AllStreams(ctx)) {
    EXPECT_FALSE(stream->is_cuda()) << stream->name();
    EXPECT_FALSE(stream->is_dedicated()) << stream->name();
  }
  EXPECT_EQ(ctx.all_gather_copy_in_stream().name(), "all_gather_copy_in");
  EXPECT_EQ(ctx.reduce_scatter_stream().name(), "reduce_scatter");
  // Waits, records and guards of CPU streams touch no CUDA state: the thread's current stream
  // of cuda:0 stays the default stream and no event is created.
  CommEvent event = ctx.all_gather_stream().record_event();
  EXPECT_TRUE(event.recorded());
  EXPECT_EQ(event.cuda_event(), nullptr);
  event.synchronize();
  ctx.all_gather_copy_in_stream().wait_stream(ctx.current_stream());
  ctx.wait_all_gather_streams_on_event(event);
  {
    CommStreamGuard guard(ctx.reduce_scatter_stream());
    EXPECT_TRUE(CurrentCudaStream(Device::CUDA(0)).is_default());
  }
  EXPECT_TRUE(CurrentCudaStream(Device::CUDA(0)).is_default());
  // A CPU stream has no CUDA stream to name.
  try {
    (void)ctx.all_gather_stream().ref();
    FAIL() << "expected FailedPrecondition";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kFailedPrecondition);
    EXPECT_NE(std::string(e.what()).find("'all_gather' on cpu has no CUDA stream"), std::string::npos)
        << e.what();
  }
}

TEST(CommContext, UninitializedContextIsCpuAndIdempotentLazyInit) {
  CommContext ctx;
  EXPECT_FALSE(ctx.initialized());
  EXPECT_FALSE(ctx.current_stream().is_cuda());
  ctx.lazy_init(Device::CPU());
  // A second lazy_init (e.g. a group's own before the root's) keeps the first device.
  ctx.lazy_init(Device::CUDA(0));
  EXPECT_TRUE(ctx.device().is_cpu());
  EXPECT_FALSE(ctx.all_gather_stream().is_cuda());
}

TEST(CommContext, AllGatherStreamsFollowFsdp2) {
  CommContext ctx;
  ctx.lazy_init(Device::CPU());
  for (TrainingState state : {TrainingState::kForward, TrainingState::kPreBackward}) {
    auto [copy_in, gather] = ctx.get_all_gather_streams(/*async_op=*/false, state);
    EXPECT_EQ(copy_in, &ctx.all_gather_copy_in_stream());
    EXPECT_EQ(gather, &ctx.all_gather_stream());
    auto [async_copy_in, async_gather] = ctx.get_all_gather_streams(/*async_op=*/true, state);
    EXPECT_EQ(async_copy_in, &ctx.current_stream());
    EXPECT_EQ(async_gather, &ctx.current_stream());
  }
  for (TrainingState state : {TrainingState::kIdle, TrainingState::kPostBackward}) {
    auto [copy_in, gather] = ctx.get_all_gather_streams(/*async_op=*/false, state);
    EXPECT_EQ(copy_in, &ctx.current_stream());
    EXPECT_EQ(gather, &ctx.current_stream());
  }
}

TEST(CommStream, CurrentResolvesTheThreadsGuardAtEachUse) {
  const CommStream current = CommStream::Current(Device::CUDA(1));
  EXPECT_TRUE(current.is_cuda());
  EXPECT_FALSE(current.is_dedicated());
  EXPECT_TRUE(current.ref().is_default());
  EXPECT_EQ(current.ref().device_index, 1);
  {
    CudaStreamGuard guard({FakeStream(0x700), 1});
    EXPECT_EQ(current.ref().handle, FakeStream(0x700));
    // Waiting for itself is ordered already: returns without calling the runtime.
    current.wait_stream(CommStream::Current(Device::CUDA(1)));
    {
      CommStreamGuard nested(current);  // re-installs the same stream
      EXPECT_EQ(CurrentCudaStream(Device::CUDA(1)).handle, FakeStream(0x700));
    }
    EXPECT_EQ(CurrentCudaStream(Device::CUDA(1)).handle, FakeStream(0x700));
  }
  EXPECT_TRUE(current.ref().is_default());
}

TEST(CommStream, CpuAndCudaStreamsDoNotOrderEachOther) {
  const CommStream cuda = CommStream::Current(Device::CUDA(0));
  const CommStream cpu = CommStream::Current(Device::CPU());
  EXPECT_FALSE(cpu.is_cuda());
  cuda.wait_stream(cpu);   // no-op: nothing on a CPU stream to wait for
  cpu.wait_stream(cuda);   // no-op: the CPU thread is already ordered
  CommEvent cpu_event;
  cpu_event.record(cpu);
  cuda.wait_event(cpu_event);  // a CPU event is complete when recorded
  CommEvent never_recorded;
  EXPECT_FALSE(never_recorded.recorded());
  cuda.wait_event(never_recorded);
  EXPECT_TRUE(CurrentCudaStream(Device::CUDA(0)).is_default());
}

TEST(CommStream, WaitAcrossDevicesIsRejected) {
  const CommStream a = CommStream::Current(Device::CUDA(0));
  const CommStream b = CommStream::Current(Device::CUDA(1));
  try {
    a.wait_stream(b);
    FAIL() << "expected InvalidArgument";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("on cuda:0 cannot wait for stream 'current' on cuda:1"),
              std::string::npos)
        << e.what();
  }
}

TEST(CommContext, CudaDeviceOwnsFourDedicatedStreamsOrIsUnavailable) {
  CommContext ctx;
  if (CudaDeviceCount() == 0) {
    // No device (or a CPU-only build): creating the streams fails with a clear error and the
    // context stays uninitialised.
    try {
      ctx.lazy_init(Device::CUDA(0));
      FAIL() << "expected Unavailable";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kUnavailable) << e.what();
    }
    EXPECT_FALSE(ctx.initialized());
    return;
  }
  ctx.lazy_init(Device::CUDA(0));
  EXPECT_FALSE(ctx.current_stream().is_dedicated());
  EXPECT_TRUE(ctx.current_stream().is_cuda());
  std::vector<CudaStreamHandle> handles;
  for (CommStream* stream : AllStreams(ctx)) {
    EXPECT_TRUE(stream->is_cuda()) << stream->name();
    if (stream == &ctx.current_stream()) continue;
    EXPECT_TRUE(stream->is_dedicated()) << stream->name();
    EXPECT_FALSE(stream->ref().is_default()) << stream->name();
    for (CudaStreamHandle h : handles) EXPECT_NE(h, stream->ref().handle) << stream->name();
    handles.push_back(stream->ref().handle);
  }
  // Orders the all-gather stream after the current stream and back, then drains both.
  ctx.all_gather_stream().wait_stream(ctx.current_stream());
  CommEvent event = ctx.all_gather_stream().record_event();
  ASSERT_NE(event.cuda_event(), nullptr);
  ctx.current_stream().wait_event(event);
  event.synchronize();
  EXPECT_TRUE(event.cuda_event()->Query());
}

}  // namespace
}  // namespace fsdp::fsdp2
