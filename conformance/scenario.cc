#include "conformance/scenario.h"

#include <algorithm>
#include <cctype>

#include "engine/core/error.h"

namespace fsdp::conformance {

namespace {

bool IsNamePart(const std::string& s) {
  if (s.empty()) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return std::islower(static_cast<unsigned char>(c)) ||
           std::isdigit(static_cast<unsigned char>(c)) || c == '_';
  });
}

}  // namespace

distributed::ProcessGroup& RankEnv::group() const {
  FSDP_CHECK_CODE(ErrorCode::kFailedPrecondition, pg != nullptr, "scenario ", scenario, ", rank ",
                  rank, " of ", world, ": no process group on backend '", backend,
                  "' (a group may be absent only for a single rank)");
  return *pg;
}

const RankInputs& RankEnv::Inputs() const {
  FSDP_CHECK_CODE(ErrorCode::kFailedPrecondition, inputs != nullptr, "scenario ", scenario,
                  ", rank ", rank, ": the scenario declares no inputs (Scenario::inputs)");
  return *inputs;
}

// The family is everything before the LAST '/', so families may nest ("parity/single").
std::string ScenarioInfo::family() const {
  const size_t slash = name.rfind('/');
  return slash == std::string::npos ? name : name.substr(0, slash);
}

std::string ScenarioInfo::case_name() const {
  const size_t slash = name.rfind('/');
  return slash == std::string::npos ? std::string() : name.substr(slash + 1);
}

bool ScenarioRequirements::requires_gpu() const {
  return std::find(devices.begin(), devices.end(), DeviceType::kCPU) == devices.end();
}

std::optional<std::string> ScenarioRequirements::UnmetBy(
    const distributed::BackendSpec& backend) const {
  const distributed::BackendCapabilities& c = backend.capabilities;
  if (in_process && c.ranks != distributed::RankPlacement::kThreads) {
    return "scenario needs ranks as threads of one process; backend " + backend.name +
           " runs them as " + distributed::RankPlacementName(c.ranks);
  }
  if (std::find(devices.begin(), devices.end(), c.device) == devices.end()) {
    return "scenario runs on " + std::string(requires_gpu() ? "a CUDA device" : "the CPU") +
           "; backend " + backend.name + " runs on " +
           (c.device == DeviceType::kCPU ? "the CPU" : "CUDA devices");
  }
  for (distributed::CollectiveOp op : collectives) {
    if (!c.Supports(op)) {
      return "scenario issues " + std::string(distributed::CollectiveOpName(op)) +
             ", which backend " + backend.name + " does not implement";
    }
  }
  return std::nullopt;
}

std::string ScenarioRequirements::str() const {
  std::vector<std::string> parts;
  if (in_process) parts.push_back("in-process ranks");
  if (requires_gpu()) {
    parts.push_back("cuda");
  } else if (std::find(devices.begin(), devices.end(), DeviceType::kCUDA) == devices.end()) {
    parts.push_back("cpu");
  }
  for (distributed::CollectiveOp op : collectives) {
    parts.push_back(distributed::CollectiveOpName(op));
  }
  if (parts.empty()) return "any backend";
  std::string s;
  for (const auto& p : parts) s += (s.empty() ? "" : ", ") + p;
  return s;
}

void SkipCase(const std::string& reason) { throw CaseSkipped(reason); }

void ValidateScenario(const Scenario& s) {
  const ScenarioInfo& i = s.info;
  bool parts_ok = i.name.find('/') != std::string::npos;
  size_t begin = 0;
  while (parts_ok) {
    const size_t slash = i.name.find('/', begin);
    parts_ok = IsNamePart(i.name.substr(begin, slash == std::string::npos ? slash : slash - begin));
    if (slash == std::string::npos) break;
    begin = slash + 1;
  }
  FSDP_CHECK(parts_ok, "scenario name '", i.name,
             "' must be 'family/case' (the family may nest, e.g. 'parity/single/mlp') with each "
             "part of lowercase letters, digits and '_'");
  FSDP_CHECK(!i.description.empty(), "scenario ", i.name, ": description is empty");
  FSDP_CHECK(!i.seed_test.empty(), "scenario ", i.name,
             ": seed_test is empty (name the mirrored test as file::Class::test)");
  FSDP_CHECK(i.min_world >= 1 && i.min_world <= i.default_world && i.default_world <= i.max_world,
             "scenario ", i.name, ": world sizes must satisfy 1 <= min_world (", i.min_world,
             ") <= default_world (", i.default_world, ") <= max_world (", i.max_world, ")");
  for (const TestRun& run : i.extra_default_runs) {
    const int w = run.world;
    FSDP_CHECK(
        w >= i.min_world && w <= i.max_world && (w != i.default_world || !run.params.empty()),
        "scenario ", i.name, ": extra default world ", w, " must differ from default_world (",
        i.default_world, ") or fix a parameter, and lie in [min_world, max_world] = [", i.min_world,
        ", ", i.max_world, "]");
  }
  FSDP_CHECK(!i.requirements.devices.empty(), "scenario ", i.name, ": allows no device");
  ValidateParamSpecs(i.name, i.params);
  FSDP_CHECK(static_cast<bool>(s.run_rank), "scenario ", i.name, ": run_rank is not set");
  FSDP_CHECK(static_cast<bool>(s.judge), "scenario ", i.name, ": judge is not set");
  FSDP_CHECK(!s.inputs || !i.inputs.empty(), "scenario ", i.name,
             ": declares inputs but no ScenarioInfo::inputs description");
  FSDP_CHECK(i.inputs.empty() || s.inputs, "scenario ", i.name,
             ": describes inputs but Scenario::inputs is not set");
}

}  // namespace fsdp::conformance
