#include "conformance/session_launcher.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "conformance/interrupt.h"
#include "conformance/process_launcher.h"
#include "engine/core/error.h"
#include "engine/distributed/launch/process_launcher.h"

namespace fsdp::conformance {

bool DriverServesSessions(const std::vector<std::string>& command,
                          std::chrono::milliseconds timeout, std::string* why) {
  FSDP_CHECK(!command.empty() && !command.front().empty(), "the driver probe needs a program");
  auto no = [&](std::string reason) {
    if (why != nullptr) *why = std::move(reason);
    return false;
  };
  const std::string dir = MakeRunDir();
  const std::string out_path = dir + "/capabilities.out";
  distributed::RankCommand probe;
  probe.argv = command;
  probe.argv.push_back(kCapabilitiesFlag);
  probe.search_path = false;
  probe.out = distributed::OutputSink::File(out_path);
  probe.err = distributed::OutputSink::File(dir + "/capabilities.err");
  distributed::LaunchPolicy policy;
  policy.deadline = timeout;
  policy.kill_grace = std::chrono::milliseconds(1000);
  policy.forward_signals = true;
  const distributed::WorldExit exit = distributed::ProcessLauncher(policy).Run({probe});
  std::ifstream in(out_path);
  std::stringstream text;
  text << in.rdbuf();
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (exit.received_signal != 0) RunInterrupt::Note(exit.received_signal);
  if (!exit.ok()) return no(command.front() + " " + kCapabilitiesFlag + " " + exit.ranks[0].Describe());
  try {
    const nlohmann::json answer = ParseBoundedJson(text.str());
    if (!answer.is_object()) return no("the answer is not a JSON object");
    const auto protocol = answer.find("protocol");
    if (protocol == answer.end() || *protocol != kDriverProtocolVersion) {
      return no("the answer does not say \"protocol\": " + std::to_string(kDriverProtocolVersion));
    }
    const auto session = answer.find("session");
    if (session == answer.end() || *session != true) return no("the answer has no \"session\": true");
  } catch (const std::exception& e) {
    return no(std::string("the answer is not JSON: ") + e.what());
  }
  return true;
}

SessionLauncher::SessionLauncher(std::vector<std::string> command, int ranks_hint)
    : command_(std::move(command)), ranks_hint_(std::max(ranks_hint, 1)) {
  FSDP_CHECK(!command_.empty() && !command_.front().empty(), "SessionLauncher needs a program");
}

void SessionLauncher::Close() {
  if (!session_) return;
  session_->Close();
  if (session_->received_signal() != 0) RunInterrupt::Note(session_->received_signal());
  session_.reset();
}

std::vector<RankOutcome> SessionLauncher::Launch(const LaunchRequest& request) {
  FSDP_CHECK(request.scenario != nullptr, "SessionLauncher: no scenario");
  if (session_ && (!session_->healthy() || session_->size() < request.world ||
                   session_->backend() != request.backend)) {
    Close();
  }
  if (RunInterrupt::received() != 0) {
    // The runner was interrupted while the previous session ran: start nothing new.
    std::vector<RankOutcome> outcomes;
    for (int r = 0; r < request.world; ++r) {
      outcomes.push_back(RankOutcome::Failed(ErrorCode::kAborted,
                                             "not started: the run was interrupted", 0));
    }
    return outcomes;
  }
  if (!session_) {
    session_ = std::make_unique<DriverSession>(command_, std::max(ranks_hint_, request.world),
                                               request.backend);
    ++sessions_started_;
  }
  const std::string run_dir = MakeRunDir();
  std::vector<RankOutcome> outcomes = session_->Serve(request, run_dir);
  if (session_->received_signal() != 0) RunInterrupt::Note(session_->received_signal());
  if (!session_->healthy()) Close();
  return outcomes;
}

}  // namespace fsdp::conformance
