#include "conformance/offline_case.h"

#include <filesystem>

#include "conformance/driver_protocol.h"
#include "conformance/observations.h"
#include "engine/core/error.h"
#include "engine/serialization/atomic_file.h"
#include "engine/serialization/safetensors.h"

namespace fsdp::conformance {

namespace {

constexpr size_t kMaxRequestBytes = size_t{16} << 20;

}  // namespace

ResolvedCase ResolveCase(const Catalog& catalog, const std::string& scenario_name, int world,
                         const std::map<std::string, std::string>& params) {
  ResolvedCase c;
  c.scenario = &catalog.scenarios.Get(scenario_name);
  const ScenarioInfo& info = c.scenario->info;
  c.world = world == 0 ? info.default_world : world;
  FSDP_CHECK(c.world >= info.min_world && c.world <= info.max_world, "scenario ", info.name,
             " runs at worlds ", info.min_world, "..", info.max_world, ", not ", c.world);
  const std::vector<CaseParams> cases = ExpandCases(info.name, info.params, params);
  if (cases.size() != 1) {
    std::string unfixed;
    for (const ParamSpec& p : info.params) {
      if (p.kind == ParamKind::kAxis && params.count(p.name) == 0) {
        unfixed += (unfixed.empty() ? "" : ", ") + p.name + " (" + p.ValuesText() + ")";
      }
    }
    FSDP_THROW(ErrorCode::kInvalidArgument, "scenario ", info.name, " has ", cases.size(),
               " cases with these parameters; fix every axis with --param: ", unfixed);
  }
  c.params = cases.front();
  for (const CaseFilter& filter : {c.scenario->excluded, c.scenario->skip}) {
    if (!filter) continue;
    if (auto why = filter(c.params, c.world)) {
      FSDP_THROW(ErrorCode::kInvalidArgument, "scenario ", info.name, " does not run this case: ",
                 *why);
    }
  }
  return c;
}

PreparedCase PrepareCase(const ResolvedCase& c, const std::string& backend, const std::string& dir) {
  std::error_code ec;
  if (std::filesystem::exists(dir)) {
    FSDP_CHECK(std::filesystem::is_directory(dir) && std::filesystem::is_empty(dir), dir,
               " exists and is not an empty directory");
  } else {
    std::filesystem::create_directories(dir, ec);
    FSDP_CHECK_CODE(ErrorCode::kUnavailable, !ec, "cannot create ", dir, ": ", ec.message());
  }
  const Scenario& scenario = *c.scenario;
  std::shared_ptr<CaseInputs> inputs;
  if (scenario.inputs) {
    inputs = std::make_shared<CaseInputs>(scenario.inputs(c.params, c.world));
    inputs->Validate(scenario.info.name, c.world);
  }
  PreparedCase prepared;
  for (const DriverRequest& r :
       WriteCaseRequests(scenario, c.params, c.world, backend, dir, 300, "", inputs.get())) {
    prepared.request_files.push_back(r.request_file);
  }
  if (scenario.expect) {
    std::vector<nlohmann::json> expected = scenario.expect(c.params, c.world);
    FSDP_CHECK_CODE(ErrorCode::kInternal, static_cast<int>(expected.size()) == c.world, "scenario ",
                    scenario.info.name, " expected ", expected.size(), " ranks for world ", c.world);
    const std::string out = dir + "/expected";
    std::filesystem::create_directory(out, ec);
    FSDP_CHECK_CODE(ErrorCode::kUnavailable, !ec, "cannot create ", out, ": ", ec.message());
    for (int r = 0; r < c.world; ++r) {
      nlohmann::json& obs = expected[static_cast<size_t>(r)];
      const std::string stem = out + "/rank" + std::to_string(r);
      const NamedTensors tensors = TakeTensors(obs, "expected rank " + std::to_string(r));
      if (!tensors.empty()) {
        serialization::SaveSafetensors(stem + ".tensors.safetensors", tensors, {{"format", "pt"}});
      }
      serialization::WriteFileAtomically(
          stem + ".json", nlohmann::json{{"status", "ok"}, {"observations", obs}}.dump(2) + "\n");
    }
    prepared.has_expected = true;
  }
  return prepared;
}

CaseResult CheckCase(const Catalog& catalog, const std::string& dir) {
  const std::string request_path = dir + "/rank0.request.json";
  nlohmann::json request;
  try {
    request = nlohmann::json::parse(serialization::ReadRegularFile(request_path, kMaxRequestBytes));
  } catch (const nlohmann::json::exception& e) {
    FSDP_THROW(ErrorCode::kDataLoss, request_path, " is not valid JSON: ", e.what());
  }
  FSDP_CHECK_CODE(ErrorCode::kDataLoss,
                  request.is_object() && request.contains("scenario") &&
                      request["scenario"].is_string() && request.contains("world") &&
                      request["world"].is_number_integer() && request.contains("params") &&
                      request["params"].is_object(),
                  request_path, " lacks scenario, world or params");
  const ResolvedCase c =
      ResolveCase(catalog, request["scenario"].get<std::string>(), request["world"].get<int>(),
                  request["params"].get<std::map<std::string, std::string>>());
  std::vector<RankOutcome> outcomes;
  for (int r = 0; r < c.world; ++r) {
    const std::string stem = dir + "/rank" + std::to_string(r);
    const std::string who = "rank " + std::to_string(r);
    if (!std::filesystem::exists(stem + ".result.json")) {
      outcomes.push_back(RankOutcome::Failed(ErrorCode::kNotFound,
                                             who + " wrote no " + stem + ".result.json", 0));
      continue;
    }
    outcomes.push_back(ReadRankResult(stem + ".result.json", stem + ".tensors.safetensors", who));
  }
  CaseResult result;
  result.scenario = c.scenario->info.name;
  result.subject = kExternalSubject;
  result.backend = request.value("backend", "");
  result.world = c.world;
  result.params = c.params;
  JudgeOutcomes(*c.scenario, c.params, c.world, std::move(outcomes), result);
  return result;
}

}  // namespace fsdp::conformance
