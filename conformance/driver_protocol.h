// The out-of-process driver protocol (docs/scenarios.md, "The driver protocol"): how one rank
// of one scenario case runs as its own process and reports back through a file. It is used
//   * by the process backends (gloo, nccl): the runner re-executes its own binary as
//     `<binary> __worker --subject NAME <flags>` once per rank (RunWorker is that side), and
//   * by third parties: `fsdp-conform run --subject external --driver PATH` runs
//     `PATH <flags>` once per rank; the driver runs the scenario in its own framework.
//
// Flags (all given, in this order; values never empty except as noted):
//   --protocol 2 --scenario NAME --rank R --world W --backend B --store-dir DIR
//   --output FILE --request FILE --timeout-s SECONDS --tensors-output FILE
//   [--input ROLE=FILE]... [--param KEY=VALUE]...
// FILE of --request holds the same as JSON (DriverRequest::ToJson) plus the scenario's
// description, seed test and observation schema. `--input` names the case's runner-owned
// input files (case_inputs.h: "weights", "rank"). The driver writes FILE of --output, one
// JSON object:
//   {"status": "ok", "observations": {...}}
//   {"status": "error", "error": {"code": "InvalidArgument", "message": "..."}}
//   {"status": "skipped", "reason": "..."}
// and, when it observed tensors, the `.safetensors` FILE of --tensors-output (tensor name ->
// tensor; the observations' `tensors`), and exits 0 (ok, skipped) or non-zero (error). The
// runner judges the observations exactly like an in-process subject's.
//
// Thread-safety: stateless functions; value types.
#pragma once

#include <iosfwd>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "conformance/catalog.h"
#include "conformance/launcher.h"

namespace fsdp::conformance {

inline constexpr int kDriverProtocolVersion = 2;
inline constexpr const char* kWorkerCommand = "__worker";

struct DriverRequest {
  int protocol = kDriverProtocolVersion;
  std::string scenario;
  std::map<std::string, std::string> params;  // every parameter of the case
  int rank = 0;
  int world = 1;
  std::string backend;
  std::string store_dir;     // fresh empty directory shared by the case's ranks (rendezvous)
  std::string output;        // where the driver writes its result JSON
  std::string request_file;  // this request as JSON
  double timeout_s = 300;    // the case's deadline; the runner kills the rank after it
  std::string subject;       // __worker only: the in-process subject to run ("" otherwise)
  // Where the driver writes its tensor observations (a .safetensors file; none: no tensors).
  std::string tensors_output;
  // The case's input files by role ("weights", "rank"); empty when the case has none.
  std::map<std::string, std::string> inputs;

  std::vector<std::string> ToArgs() const;
  // Strict: every required flag exactly once, no unknown flags; InvalidArgument otherwise.
  static DriverRequest FromArgs(const std::vector<std::string>& args);
  nlohmann::json ToJson() const;
};

// The driver requests of one case whose files live in `run_dir` (an existing directory): makes
// `run_dir/store/` (0700), writes the case's input files (when `inputs` is given) and, per
// rank, `rankR.request.json` (RequestFileJson); the requests name `rankR.result.json` and
// `rankR.tensors.safetensors` there. `subject` is for the __worker only ("" for drivers).
std::vector<DriverRequest> WriteCaseRequests(const Scenario& scenario, const CaseParams& params,
                                             int world, const std::string& backend,
                                             const std::string& run_dir, double timeout_s,
                                             const std::string& subject, const CaseInputs* inputs);
// What `rankR.request.json` holds: the request (DriverRequest::ToJson), the flags as "args",
// and the scenario's description, seed test, input description and observation schema.
nlohmann::json RequestFileJson(const DriverRequest& request, const Scenario& scenario);

// Limits on what a driver's result may hold: JSON nesting depth (deeper documents are refused
// before they are built) and the length of an error message or skip reason (longer ones are
// cut, saying how much was cut).
inline constexpr int kMaxResultJsonDepth = 64;
// The longest --timeout-s a request may carry (about 31 years).
inline constexpr double kMaxDriverTimeoutSeconds = 1e9;
inline constexpr size_t kMaxResultMessageBytes = 16 * 1024;
// nlohmann::json::parse with the depth limit; DataLoss beyond it.
nlohmann::json ParseBoundedJson(const std::string& text);

// The result file of a rank for an outcome, and back. ParseResult throws DataLoss naming
// `who` when the JSON does not follow the protocol; messages are cut to the limit.
nlohmann::json ResultJson(const RankOutcome& outcome);
RankOutcome ParseResult(const nlohmann::json& result, const std::string& who);

// One rank's outcome from the files it wrote: its result JSON at `result_path` (a regular file
// of at most 64 MiB, nested at most kMaxResultJsonDepth deep) and, when it exists, its tensors file
// at `tensors_path`, merged into the observations. Errors in the files become a failed outcome
// (DataLoss naming the file), never an exception.
RankOutcome ReadRankResult(const std::string& result_path, const std::string& tensors_path,
                           const std::string& who);

// Parses "InvalidArgument" etc. (ErrorCodeName's spellings); nullopt for anything else.
std::optional<ErrorCode> ParseErrorCode(const std::string& name);

// The `__worker` side: parses the flags (args exclude the program name and "__worker"),
// builds the rank's RankContext and world group from `catalog`, runs the subject and writes
// the result file. Returns the process exit code: 0 when the result is ok or skipped, 1 when
// it is an error, 2 when the flags are unusable (then nothing is written; the reason goes to
// `err`).
int RunWorker(const std::vector<std::string>& args, const Catalog& catalog, std::ostream& err);

}  // namespace fsdp::conformance
