#include "engine/fsdp/comm_context.h"

#include <atomic>
#include <string_view>

#include "engine/core/error.h"
#include "engine/fsdp/fsdp_collectives.h"

namespace fsdp::fsdp2 {

// ---- StreamTrace ------------------------------------------------------------------------------

namespace {

thread_local StreamTrace* current_trace = nullptr;
std::atomic<int64_t> next_event_id{1};

// Appends to the calling thread's trace; without one nothing is built (a hot path).
void Trace(StreamOp::Kind kind, std::string_view stream, std::string_view other = {},
           int64_t event = 0) {
  if (current_trace != nullptr) {
    current_trace->append({kind, std::string(stream), std::string(other), event});
  }
}

}  // namespace

void TraceWork(std::string_view work, int64_t event) {
  Trace(StreamOp::Kind::kWork, "current", work, event);
}

std::string StreamOp::str() const {
  switch (kind) {
    case Kind::kRecord: return stream + ".record(e" + std::to_string(event) + ")";
    case Kind::kWaitEvent: return stream + ".wait_event(e" + std::to_string(event) + ")";
    case Kind::kWaitStream: return stream + ".wait_stream(" + other + ")";
    case Kind::kEnterGuard: return "enter stream(" + stream + ")";
    case Kind::kExitGuard: return "exit stream(" + stream + ")";
    case Kind::kWork:
      return stream + ".work(" + other + (event != 0 ? ", e" + std::to_string(event) : "") + ")";
  }
  return "?";
}

std::string StreamTrace::str() const {
  std::string out;
  for (const StreamOp& op : ops_) out += op.str() + "\n";
  return out;
}

std::string StreamTrace::resolve(const std::string& stream) const {
  return stream == "current" && !guards_.empty() ? guards_.back() : stream;
}

void StreamTrace::append(StreamOp op) {
  if (op.kind == StreamOp::Kind::kExitGuard) {
    if (guards_.empty()) return;  // the guard was entered before this trace was installed
    op.stream = guards_.back();   // the name its enter was logged under
    guards_.pop_back();
  } else {
    op.stream = resolve(op.stream);
    op.other = resolve(op.other);
    if (op.kind == StreamOp::Kind::kEnterGuard) guards_.push_back(op.stream);
  }
  ops_.push_back(std::move(op));
}

StreamTraceScope::StreamTraceScope(StreamTrace* trace) : previous_(current_trace) {
  current_trace = trace;
}

StreamTraceScope::~StreamTraceScope() { current_trace = previous_; }

// ---- CommEvent / CommStream -------------------------------------------------------------------

void CommEvent::record(const CommStream& stream) {
  recorded_ = true;
  id_ = next_event_id.fetch_add(1);
  Trace(StreamOp::Kind::kRecord, stream.name(), "", id_);
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
  Trace(StreamOp::Kind::kWaitStream, name_, other.name_);
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
  if (event.recorded()) Trace(StreamOp::Kind::kWaitEvent, name_, "", event.id());
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
  if (current_trace != nullptr) {
    traced_name_ = stream.name();
    Trace(StreamOp::Kind::kEnterGuard, *traced_name_);
  }
}

CommStreamGuard::~CommStreamGuard() {
  if (!traced_name_) return;
  try {
    Trace(StreamOp::Kind::kExitGuard, *traced_name_);
  } catch (...) {  // NOLINT(bugprone-empty-catch): out of memory while logging; the guard still ends
  }
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
