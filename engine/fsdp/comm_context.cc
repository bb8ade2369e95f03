#include "engine/fsdp/comm_context.h"

#include "engine/core/error.h"
#include "engine/fsdp/fsdp_collectives.h"

namespace fsdp::fsdp2 {

// ---- CommEvent / CommStream -------------------------------------------------------------------

void CommEvent::record(const CommStream& stream) {
  recorded_ = true;
  if (!stream.is_cuda()) {
    cuda_event_.reset();
    return;
  }
  // A fresh event per record: copies of the previous record keep meaning the earlier point.
  auto event = std::make_shared<CudaEvent>();
  event->Record(stream.ref());
  cuda_event_ = std::move(event);
}

void CommEvent::synchronize() const {
  if (cuda_event_) cuda_event_->Synchronize();
}

CommStream CommStream::Current(Device device) {
  CommStream stream("current");
  stream.device_ = device;
  return stream;
}

CommStream CommStream::Dedicated(std::string name, Device device, int priority) {
  CommStream stream(std::move(name));
  stream.device_ = device;
  if (device.is_cuda()) stream.stream_ = std::make_shared<CudaStream>(device, priority);
  return stream;
}

CudaStreamRef CommStream::ref() const {
  FSDP_CHECK_CODE(ErrorCode::kFailedPrecondition, is_cuda(), "CommStream '", name_,
                  "' on ", device_.str(), " has no CUDA stream");
  return stream_ ? stream_->ref() : CurrentCudaStream(device_);
}

void CommStream::wait_stream(const CommStream& other) const {
  if (!is_cuda() || !other.is_cuda()) return;
  FSDP_CHECK(device_ == other.device_, "CommStream '", name_, "' on ", device_.str(),
             " cannot wait for stream '", other.name_, "' on ", other.device_.str());
  const CudaStreamRef self = ref();
  const CudaStreamRef producer = other.ref();
  if (self.handle == producer.handle) return;  // one stream: already ordered
  CudaEvent event;
  event.Record(producer);
  event.Wait(self);
}

void CommStream::wait_event(const CommEvent& event) const {
  if (!is_cuda() || event.cuda_event() == nullptr) return;
  event.cuda_event()->Wait(ref());
}

CommEvent CommStream::record_event() const {
  CommEvent event;
  event.record(*this);
  return event;
}

CommStreamGuard::CommStreamGuard(const CommStream& stream) {
  if (stream.is_cuda()) guard_.emplace(stream.ref());
}

// ---- CommContext ------------------------------------------------------------------------------

CommContext::CommContext() = default;

void CommContext::lazy_init(Device device) {
  if (initialized_) return;
  device_ = device;
  if (device.is_cuda()) {
    // FSDP2 gives every communication stream high priority so that collectives are not queued
    // behind compute.
    constexpr int kHighPriority = -1;
    current_stream_ = CommStream::Current(device);
    all_gather_copy_in_stream_ = CommStream::Dedicated("all_gather_copy_in", device, kHighPriority);
    all_gather_stream_ = CommStream::Dedicated("all_gather", device, kHighPriority);
    reduce_scatter_stream_ = CommStream::Dedicated("reduce_scatter", device, kHighPriority);
    all_reduce_stream_ = CommStream::Dedicated("all_reduce", device, kHighPriority);
  }
  initialized_ = true;
}

std::pair<CommStream*, CommStream*> CommContext::get_all_gather_streams(
    bool async_op, TrainingState training_state) {
  if (!async_op && (training_state == TrainingState::kForward ||
                    training_state == TrainingState::kPreBackward)) {
    return {&all_gather_copy_in_stream_, &all_gather_stream_};
  }
  return {&current_stream_, &current_stream_};
}

void CommContext::wait_all_gather_streams_on_event(const CommEvent& event) {
  all_gather_copy_in_stream_.wait_event(event);
  all_gather_stream_.wait_event(event);
}

}  // namespace fsdp::fsdp2
