#include "conformance/stream_order_recorder.h"

#include <map>

namespace fsdp::conformance {

namespace {

using Kind = fsdp2::StreamOp::Kind;

const char* OpName(Kind kind) {
  switch (kind) {
    case Kind::kRecord: return "record";
    case Kind::kWaitEvent: return "wait_event";
    case Kind::kWaitStream: return "wait_stream";
    case Kind::kEnterGuard: return "enter_stream";
    case Kind::kExitGuard: return "exit_stream";
    case Kind::kWork: return "work";
  }
  return "?";
}

// "unshard layers.0 FORWARD" / "forward": the label of an FSDP event or phase entry.
std::string Label(const nlohmann::json& mark) {
  if (mark.at("op") == "phase") return mark.at("what").get<std::string>();
  return mark.at("what").get<std::string>() + " " + mark.at("module").get<std::string>() + " " +
         mark.at("state").get<std::string>();
}

}  // namespace

StreamOrderRecorder::StreamOrderRecorder() : trace_scope_(&trace_), observer_scope_(*this) {}

void StreamOrderRecorder::Phase(const std::string& phase) {
  marks_.push_back({trace_.ops().size(), {{"op", "phase"}, {"what", phase}}});
}

void StreamOrderRecorder::AddEvent(const char* kind, const std::string& fqn,
                                   fsdp2::TrainingState state) {
  marks_.push_back({trace_.ops().size(),
                    {{"op", "fsdp_event"},
                     {"what", kind},
                     {"module", fqn},
                     {"state", fsdp2::TrainingStateName(state)}}});
}

void StreamOrderRecorder::unshard(const std::string& fqn, fsdp2::TrainingState state) {
  AddEvent("unshard", fqn, state);
}
void StreamOrderRecorder::reshard(const std::string& fqn, fsdp2::TrainingState state) {
  AddEvent("reshard", fqn, state);
}
void StreamOrderRecorder::pre_backward(const std::string& fqn, fsdp2::TrainingState state) {
  AddEvent("pre_backward", fqn, state);
}
void StreamOrderRecorder::post_backward(const std::string& fqn, fsdp2::TrainingState state) {
  AddEvent("post_backward", fqn, state);
}

nlohmann::json StreamOrderRecorder::Json() const {
  std::map<int64_t, int64_t> event_numbers;  // process-wide id -> order of first appearance
  auto number = [&](int64_t id) {
    if (id == 0) return int64_t{0};
    auto [it, inserted] =
        event_numbers.emplace(id, static_cast<int64_t>(event_numbers.size()) + 1);
    return it->second;
  };
  nlohmann::json out = nlohmann::json::array();
  std::string fsdp_op = "none";
  size_t next_mark = 0;
  auto flush_marks = [&](size_t index) {
    for (; next_mark < marks_.size() && marks_[next_mark].index <= index; ++next_mark) {
      out.push_back(marks_[next_mark].entry);
      fsdp_op = Label(marks_[next_mark].entry);
    }
  };
  const std::vector<fsdp2::StreamOp>& ops = trace_.ops();
  for (size_t i = 0; i < ops.size(); ++i) {
    flush_marks(i);
    const fsdp2::StreamOp& op = ops[i];
    nlohmann::json entry = {{"op", OpName(op.kind)}, {"stream", op.stream}, {"fsdp_op", fsdp_op}};
    if (op.kind == Kind::kWaitStream) entry["other"] = op.other;
    if (op.kind == Kind::kWork) entry["what"] = op.other;
    if (op.event != 0) entry["event"] = number(op.event);
    out.push_back(std::move(entry));
  }
  flush_marks(ops.size());
  return out;
}

}  // namespace fsdp::conformance
