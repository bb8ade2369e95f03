#include "conformance/driver_protocol.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <set>

#include "conformance/flight_recorder_file.h"
#include "conformance/observations.h"
#include "conformance/schema_doc.h"
#include "conformance/threaded_launcher.h"
#include "engine/core/error.h"
#include "engine/core/rank_context.h"
#include "engine/distributed/launch.h"
#include "engine/distributed/store/file_store.h"
#include "engine/serialization/atomic_file.h"
#include "engine/serialization/safetensors.h"

namespace fsdp::conformance {

namespace {

constexpr ErrorCode kAllCodes[] = {
    ErrorCode::kInvalidArgument, ErrorCode::kFailedPrecondition, ErrorCode::kDeadlineExceeded,
    ErrorCode::kDataLoss,        ErrorCode::kUnavailable,        ErrorCode::kNotFound,
    ErrorCode::kAborted,         ErrorCode::kInternal,
};

int ParseIntFlag(const std::string& flag, const std::string& value) {
  auto v = ParseInt(value);
  FSDP_CHECK(v.has_value() && *v >= 0 && *v <= 1 << 20, "driver protocol: ", flag,
             " expects a non-negative integer, got '", value, "'");
  return static_cast<int>(*v);
}

}  // namespace

std::vector<DriverRequest> WriteCaseRequests(const Scenario& scenario, const CaseParams& params,
                                             int world, const std::string& backend,
                                             const std::string& run_dir, double timeout_s,
                                             const std::string& subject, const CaseInputs* inputs) {
  const std::string store_dir = run_dir + "/store";
  std::error_code ec;
  std::filesystem::create_directory(store_dir, ec);
  FSDP_CHECK_CODE(ErrorCode::kUnavailable, !ec, "cannot create ", store_dir, ": ", ec.message());
  std::filesystem::permissions(store_dir, std::filesystem::perms::owner_all,
                               std::filesystem::perm_options::replace, ec);
  std::vector<std::map<std::string, std::string>> input_files(static_cast<size_t>(world));
  if (inputs != nullptr) input_files = inputs->WriteFiles(run_dir);
  std::vector<DriverRequest> requests;
  for (int r = 0; r < world; ++r) {
    const std::string stem = run_dir + "/rank" + std::to_string(r);
    DriverRequest dr;
    dr.scenario = scenario.info.name;
    dr.params = params.values();
    dr.rank = r;
    dr.world = world;
    dr.backend = backend;
    dr.store_dir = store_dir;
    dr.output = stem + ".result.json";
    dr.request_file = stem + ".request.json";
    dr.timeout_s = timeout_s;
    dr.subject = subject;
    dr.inputs = input_files[static_cast<size_t>(r)];
    dr.tensors_output = stem + ".tensors.safetensors";
    serialization::WriteFileAtomically(dr.request_file,
                                       RequestFileJson(dr, scenario).dump(2) + "\n");
    requests.push_back(std::move(dr));
  }
  return requests;
}

nlohmann::json RequestFileJson(const DriverRequest& request, const Scenario& scenario) {
  nlohmann::json j = request.ToJson();
  j["args"] = request.ToArgs();
  j["description"] = scenario.info.description;
  j["seed_test"] = scenario.info.seed_test;
  const nlohmann::json schema = ScenarioSchemaJson(scenario);
  j["inputs_doc"] = schema["inputs"];
  j["observations_schema"] = schema["observations"];
  return j;
}

RankOutcome ReadRankResult(const std::string& result_path, const std::string& tensors_path,
                           const std::string& who) {
  constexpr size_t kMaxResultBytes = size_t{64} << 20;
  try {
    const std::string text = serialization::ReadRegularFile(result_path, kMaxResultBytes);
    nlohmann::json result;
    try {
      result = ParseBoundedJson(text);
    } catch (const nlohmann::json::exception& e) {
      return RankOutcome::Failed(ErrorCode::kDataLoss,
                                 who + " wrote unreadable JSON to " + result_path + ": " + e.what(), 0);
    } catch (const Error& e) {
      return RankOutcome::Failed(
          ErrorCode::kDataLoss,
          who + " wrote unacceptable JSON to " + result_path + ": " + e.message(), 0);
    }
    RankOutcome outcome = ParseResult(result, who + " result " + result_path);
    if (outcome.status == RankOutcome::Status::kOk && !tensors_path.empty() &&
        std::filesystem::exists(tensors_path)) {
      MergeTensors(outcome.observations, serialization::LoadSafetensors(tensors_path).Tensors(),
                   who + " tensors " + tensors_path);
    }
    return outcome;
  } catch (const Error& e) {
    return RankOutcome::Failed(e.code(), e.message(), 0);
  }
}

std::optional<ErrorCode> ParseErrorCode(const std::string& name) {
  for (ErrorCode c : kAllCodes) {
    if (name == ErrorCodeName(c)) return c;
  }
  return std::nullopt;
}

std::vector<std::string> DriverRequest::ToArgs() const {
  char timeout[32];
  std::snprintf(timeout, sizeof(timeout), "%.3f", timeout_s);
  std::vector<std::string> args = {"--protocol",  std::to_string(protocol),
                                   "--scenario",  scenario,
                                   "--rank",      std::to_string(rank),
                                   "--world",     std::to_string(world),
                                   "--backend",   backend,
                                   "--store-dir", store_dir,
                                   "--output",    output,
                                   "--request",   request_file,
                                   "--timeout-s", timeout,
                                   "--tensors-output", tensors_output};
  if (!subject.empty()) {
    args.push_back("--subject");
    args.push_back(subject);
  }
  for (const auto& [k, v] : inputs) {
    args.push_back("--input");
    args.push_back(k + "=" + v);
  }
  for (const auto& [k, v] : params) {
    args.push_back("--param");
    args.push_back(k + "=" + v);
  }
  return args;
}

DriverRequest DriverRequest::FromArgs(const std::vector<std::string>& args) {
  DriverRequest r;
  std::set<std::string> seen;
  const std::set<std::string> known = {"--protocol",  "--scenario",  "--rank",   "--world",
                                       "--backend",   "--store-dir", "--output", "--request",
                                       "--timeout-s", "--subject",   "--param",
                                       "--tensors-output", "--input"};
  for (size_t i = 0; i < args.size(); i += 2) {
    const std::string& flag = args[i];
    FSDP_CHECK(known.count(flag), "driver protocol: unknown flag '", flag, "'");
    FSDP_CHECK(i + 1 < args.size(), "driver protocol: ", flag, " needs a value");
    const std::string& value = args[i + 1];
    if (flag == "--param") {
      auto [k, v] = ParseParamAssignment(value);
      FSDP_CHECK(r.params.count(k) == 0, "driver protocol: --param ", k, " given twice");
      r.params[k] = v;
      continue;
    }
    if (flag == "--input") {
      auto [k, v] = ParseParamAssignment(value);
      FSDP_CHECK(r.inputs.count(k) == 0, "driver protocol: --input ", k, " given twice");
      r.inputs[k] = v;
      continue;
    }
    FSDP_CHECK(seen.insert(flag).second, "driver protocol: ", flag, " given twice");
    if (flag == "--protocol") {
      r.protocol = ParseIntFlag(flag, value);
      FSDP_CHECK(r.protocol == kDriverProtocolVersion, "driver protocol version ", r.protocol,
                 " is not supported (this build speaks ", kDriverProtocolVersion, ")");
    } else if (flag == "--scenario") {
      r.scenario = value;
    } else if (flag == "--rank") {
      r.rank = ParseIntFlag(flag, value);
    } else if (flag == "--world") {
      r.world = ParseIntFlag(flag, value);
    } else if (flag == "--backend") {
      r.backend = value;
    } else if (flag == "--store-dir") {
      r.store_dir = value;
    } else if (flag == "--output") {
      r.output = value;
    } else if (flag == "--request") {
      r.request_file = value;
    } else if (flag == "--timeout-s") {
      // Bounded so that ToArgs() writes it back exactly ("%.3f" of at most 1e9 s fits).
      auto t = ParseDouble(value);
      FSDP_CHECK(t.has_value() && *t > 0 && *t <= kMaxDriverTimeoutSeconds,
                 "driver protocol: --timeout-s expects seconds in (0, ", kMaxDriverTimeoutSeconds,
                 "], got '", value, "'");
      r.timeout_s = *t;
    } else if (flag == "--subject") {
      r.subject = value;
    } else if (flag == "--tensors-output") {
      r.tensors_output = value;
    }
  }
  for (const char* required : {"--protocol", "--scenario", "--rank", "--world", "--backend",
                               "--store-dir", "--output", "--request", "--timeout-s",
                               "--tensors-output"}) {
    FSDP_CHECK(seen.count(required), "driver protocol: missing ", required);
  }
  FSDP_CHECK(r.world >= 1 && r.rank < r.world, "driver protocol: rank ", r.rank,
             " is outside world ", r.world);
  return r;
}

nlohmann::json DriverRequest::ToJson() const {
  nlohmann::json j = {{"protocol", protocol},   {"scenario", scenario}, {"params", params},
                      {"rank", rank},           {"world", world},       {"backend", backend},
                      {"store_dir", store_dir}, {"output", output},     {"timeout_s", timeout_s},
                      {"tensors_output", tensors_output}, {"inputs", inputs}};
  if (!subject.empty()) j["subject"] = subject;
  return j;
}

nlohmann::json ResultJson(const RankOutcome& outcome) {
  nlohmann::json result;
  switch (outcome.status) {
    case RankOutcome::Status::kOk:
      result = {{"protocol", kDriverProtocolVersion},
                {"status", "ok"},
                {"observations", outcome.observations}};
      break;
    case RankOutcome::Status::kSkipped:
      result = {
          {"protocol", kDriverProtocolVersion}, {"status", "skipped"}, {"reason", outcome.message}};
      break;
    case RankOutcome::Status::kError:
      result = {{"protocol", kDriverProtocolVersion},
                {"status", "error"},
                {"error", {{"code", ErrorCodeName(outcome.code)}, {"message", outcome.message}}}};
      break;
  }
  if (!outcome.end_session.empty()) result["end_session"] = outcome.end_session;
  return result;
}

nlohmann::json ParseBoundedJson(const std::string& text) {
  // The callback sees every value's depth as it is parsed: a document nested deeper than the
  // limit is refused before it is built (and before anything recurses over it).
  const nlohmann::json::parser_callback_t limit_depth = [](int depth, nlohmann::json::parse_event_t,
                                                           nlohmann::json&) {
    FSDP_CHECK_CODE(ErrorCode::kDataLoss, depth <= kMaxResultJsonDepth, "nesting deeper than ",
                    kMaxResultJsonDepth, " levels");
    return true;
  };
  return nlohmann::json::parse(text, limit_depth);
}

std::string BoundedMessage(const std::string& message) {
  if (message.size() <= kMaxResultMessageBytes) return message;
  return message.substr(0, kMaxResultMessageBytes) + "... [" +
         std::to_string(message.size() - kMaxResultMessageBytes) + " more bytes cut]";
}

namespace {

// The status part of a result (ParseResult).
RankOutcome ParseStatus(const nlohmann::json& result, const std::string& who) {
  const std::string status = result["status"].get<std::string>();
  if (status == "ok") {
    FSDP_CHECK_CODE(ErrorCode::kDataLoss, result.contains("observations"), who,
                    ": status \"ok\" without \"observations\"");
    return RankOutcome::Ok(result["observations"], 0);
  }
  if (status == "skipped") {
    FSDP_CHECK_CODE(ErrorCode::kDataLoss,
                    result.contains("reason") && result["reason"].is_string() &&
                        !result["reason"].get<std::string>().empty(),
                    who, ": status \"skipped\" without a \"reason\" string");
    return RankOutcome::Skipped(BoundedMessage(result["reason"].get<std::string>()), 0);
  }
  if (status == "error") {
    FSDP_CHECK_CODE(ErrorCode::kDataLoss,
                    result.contains("error") && result["error"].is_object() &&
                        result["error"].contains("message") &&
                        result["error"]["message"].is_string(),
                    who, ": status \"error\" without {\"error\": {\"code\", \"message\"}}");
    ErrorCode code = ErrorCode::kInternal;
    if (result["error"].contains("code") && result["error"]["code"].is_string()) {
      code = ParseErrorCode(result["error"]["code"].get<std::string>()).value_or(code);
    }
    return RankOutcome::Failed(code, BoundedMessage(result["error"]["message"].get<std::string>()),
                               0);
  }
  FSDP_THROW(ErrorCode::kDataLoss, who, ": unknown result status \"", status,
             "\" (expected ok, error or skipped)");
}

}  // namespace

RankOutcome ParseResult(const nlohmann::json& result, const std::string& who) {
  FSDP_CHECK_CODE(ErrorCode::kDataLoss, result.is_object(), who,
                  ": the result must be a JSON object, got ", result.type_name());
  if (result.contains("protocol")) {
    FSDP_CHECK_CODE(ErrorCode::kDataLoss,
                    result["protocol"].is_number_integer() &&
                        result["protocol"].get<int>() == kDriverProtocolVersion,
                    who, ": result protocol ", result["protocol"].dump(),
                    " is not supported (expected ", kDriverProtocolVersion, ")");
  }
  FSDP_CHECK_CODE(ErrorCode::kDataLoss, result.contains("status") && result["status"].is_string(),
                  who, ": the result has no \"status\" string (ok, error or skipped)");
  std::string end_session;
  if (result.contains("end_session")) {
    FSDP_CHECK_CODE(
        ErrorCode::kDataLoss,
        result["end_session"].is_string() && !result["end_session"].get<std::string>().empty(), who,
        ": \"end_session\" must be a non-empty string (why), got ",
        BoundedMessage(result["end_session"].dump()));
    end_session = BoundedMessage(result["end_session"].get<std::string>());
  }
  RankOutcome outcome = ParseStatus(result, who);
  outcome.end_session = std::move(end_session);
  return outcome;
}

int RunWorker(const std::vector<std::string>& args, const Catalog& catalog, std::ostream& err) {
  DriverRequest request;
  try {
    request = DriverRequest::FromArgs(args);
  } catch (const Error& e) {
    err << "fsdp-conform " << kWorkerCommand << ": " << e.message() << "\n";
    return 2;
  }
  const auto start = std::chrono::steady_clock::now();
  RankOutcome outcome = RunGuarded([&]() -> nlohmann::json {
    const Scenario& scenario = catalog.scenarios.Get(request.scenario);
    std::vector<CaseParams> cases =
        ExpandCases(scenario.info.name, scenario.info.params, request.params);
    FSDP_CHECK(cases.size() == 1 && request.params.size() == scenario.info.params.size(),
               "driver protocol: every parameter of ", scenario.info.name,
               " must be given with --param (got ", request.params.size(), " of ",
               scenario.info.params.size(), ")");
    const distributed::BackendSpec& backend = catalog.backends.Get(request.backend);
    const std::string subject_name =
        request.subject.empty() ? std::string(kEngineSubject) : request.subject;
    std::shared_ptr<Subject> subject = catalog.subjects.Create(subject_name);

    const Device device = backend.DeviceOf(request.rank);
    RankContext context(request.rank, request.world, device);
    RankContextGuard guard(context);
    // Before the group exists, so that its threads leave SIGTERM/SIGINT to the recorder's.
    FlightRecorderFile recorder_file(
        distributed::FlightRecorderOf(context), request.rank,
        FlightRecorderFile::PathFor(
            std::filesystem::path(request.output).parent_path().string(), request.rank));
    RankEnv env;  // destroyed (group included) before the context is uninstalled
    env.scenario = scenario.info.name;
    env.rank = request.rank;
    env.world = request.world;
    env.params = cases.front();
    env.backend = backend.name;
    env.device = device;
    if (!request.inputs.empty()) {
      for (const auto& [role, path] : request.inputs) {
        FSDP_CHECK(role == kWeightsInput || role == kRankInput, "driver protocol: unknown --input ",
                   "role '", role, "' (expected ", kWeightsInput, " or ", kRankInput, ")");
      }
      auto path_of = [&](const char* role) {
        auto it = request.inputs.find(role);
        return it == request.inputs.end() ? std::string() : it->second;
      };
      env.inputs = std::make_shared<const RankInputs>(
          RankInputs::Load(path_of(kWeightsInput), path_of(kRankInput)));
    }
    if (backend.process_group) {
      distributed::ProcessGroupSpec spec;
      spec.rank = request.rank;
      spec.world = request.world;
      spec.local_rank = request.rank;  // every rank of a case runs on this host
      spec.timeout = std::chrono::milliseconds(static_cast<int64_t>(request.timeout_s * 1000));
      spec.store = std::make_shared<distributed::FileStore>(request.store_dir, spec.timeout);
      spec.device = env.device;
      // The runner sets FSDP_CHECK_COLLECTIVES for its ranks (on unless
      // --no-check-collectives).
      const char* check = std::getenv("FSDP_CHECK_COLLECTIVES");
      spec.check_collectives = check == nullptr || std::string(check) != "0";
      // And FSDP_STRAGGLER_TIMEOUT_MS (StragglerTimeoutOf the case's timeout).
      spec.straggler_timeout = distributed::ReadStragglerTimeout();
      if (backend.capabilities.straggler_check) env.straggler_timeout = spec.straggler_timeout;
      env.pg = backend.process_group(spec);
      FSDP_CHECK_CODE(ErrorCode::kInternal,
                      env.pg && env.pg->rank() == request.rank && env.pg->size() == request.world,
                      "the '", backend.name, "' group factory returned a bad group for rank ",
                      request.rank, " of ", request.world);
    } else {
      FSDP_CHECK_CODE(ErrorCode::kUnavailable, request.world == 1, "backend '", backend.name,
                      "' has no process-group factory in this build; it can run one rank only");
    }
    if (auto reason = subject->Unsupported(scenario, env.params, backend.name)) {
      SkipCase(*reason);
    }
    // The world group is also the rank's default group, as under fakes::RunRanks.
    struct DefaultGroup {
      explicit DefaultGroup(std::shared_ptr<distributed::ProcessGroup> pg) {
        distributed::SetDefaultProcessGroup(std::move(pg));
      }
      ~DefaultGroup() { distributed::SetDefaultProcessGroup(nullptr); }
    } default_group(env.pg);
    nlohmann::json observations = subject->RunRank(scenario, env);
    const std::string who = "rank " + std::to_string(request.rank);
    ValidateObservations(observations, who);
    // Raw tensors travel as .safetensors, as a third-party driver's do.
    const NamedTensors tensors = TakeTensors(observations, who);
    if (!tensors.empty()) {
      serialization::SaveSafetensors(request.tensors_output, tensors, {{"format", "pt"}});
    }
    return observations;
  });
  outcome.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  try {
    serialization::WriteFileAtomically(request.output, ResultJson(outcome).dump());
  } catch (const Error& e) {
    err << "fsdp-conform " << kWorkerCommand << ": " << e.message() << "\n";
    return 2;
  }
  if (outcome.status == RankOutcome::Status::kError) {
    err << "fsdp-conform " << kWorkerCommand << ": " << outcome.Describe(request.rank) << "\n";
    return 1;
  }
  return 0;
}

}  // namespace fsdp::conformance
