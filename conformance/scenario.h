// Scenario: one mirrored seed test, as data plus two functions.
//
//   ScenarioInfo  name ("family/case"), description, the seed test it mirrors, parameters,
//                 world sizes, backends, GPU requirement
//   run_rank      the per-rank body: runs on every rank of a case (on the rank's own thread or
//                 in the rank's own process) and returns that rank's OBSERVATIONS as JSON
//                 (conventions in observations.h and docs/scenarios.md). Bodies report; they
//                 never judge.
//   judge         runs once per case in the parent, over all ranks' observations, and adds
//                 checks to a CheckList.
//
// See docs/scenarios.md ("How to add a scenario"). Families register their scenarios with an
// explicit function (e.g. RegisterFullyShardCommScenarios(ScenarioRegistry&)) that
// conformance/all_scenarios.cc calls.
//
// Thread-safety: a registered Scenario is immutable; run_rank is called concurrently for the
// ranks of a case and must not share mutable state between calls; judge is called once.
#pragma once

#include <chrono>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "conformance/case_inputs.h"
#include "conformance/checks.h"
#include "conformance/observation_schema.h"
#include "conformance/params.h"
#include "engine/core/device.h"
#include "engine/distributed/backend_registry.h"
#include "engine/distributed/process_group.h"

namespace fsdp::conformance {

// What a rank's body gets. Built by the launcher for each rank of a case.
struct RankEnv {
  std::string scenario;  // "family/case"
  int rank = 0;
  int world = 1;
  CaseParams params;    // every declared parameter resolved to one value
  std::string backend;  // "threaded", "gloo", "nccl", ...
  Device device;        // the rank's device (CPU, or cuda:<local index> on GPU backends)
  // The world group (rank() == rank, size() == world). Null only when world == 1 and the
  // backend provides no group (a single rank that does not communicate).
  std::shared_ptr<distributed::ProcessGroup> pg;
  // How long pg waits for every rank to reach a collective before failing with an error naming
  // the ranks that did not (process backends: the runner's StragglerTimeoutOf the case
  // timeout); 0 when its group has no such check (the threaded fake).
  std::chrono::milliseconds straggler_timeout{0};

  // The case's runner-owned inputs for this rank (case_inputs.h); null when the scenario
  // declares none.
  std::shared_ptr<const RankInputs> inputs;

  // The world group, or FailedPrecondition naming the scenario when there is none.
  distributed::ProcessGroup& group() const;
  // *inputs, or FailedPrecondition naming the scenario when it has none.
  const RankInputs& Inputs() const;
};

using RankBody = std::function<nlohmann::json(RankEnv& env)>;
using JudgeFn = std::function<void(const CaseParams& params, int world,
                                   const std::vector<nlohmann::json>& per_rank, CheckList& checks)>;
// The runner-owned inputs of a case (case_inputs.h): a pure function of the parameters and
// the world size, so that the judge can recompute what every subject was given.
using InputsFn = std::function<CaseInputs(const CaseParams& params, int world)>;
// What a conforming subject reports on each rank of a case (element r for rank r), in the
// schema's form, holding what the judge compares against: computed by the oracle or by the
// rules the judge applies, never by the engine.
using ExpectFn = std::function<std::vector<nlohmann::json>(const CaseParams& params, int world)>;
// Returns a reason when a case must not run (see Scenario::excluded and Scenario::skip).
using CaseFilter = std::function<std::optional<std::string>(const CaseParams& params, int world)>;

inline constexpr const char* kBackendThreaded = "threaded";
inline constexpr const char* kBackendGloo = "gloo";
inline constexpr const char* kBackendNccl = "nccl";

// What a scenario needs of a backend, compared with the backend's capabilities
// (distributed::BackendCapabilities): a backend registered later is picked up by every
// scenario whose requirements it meets, with no list of backend names anywhere.
struct ScenarioRequirements {
  // The ranks must be threads of one process (the scenario reaches into the in-process world:
  // 128 ranks, faults injected into one rank's group). Default: false (threads or processes).
  bool in_process = false;
  // Devices the scenario's ranks may run on. Default: the CPU and CUDA devices.
  std::vector<DeviceType> devices = {DeviceType::kCPU, DeviceType::kCUDA};
  // Collectives the scenario issues beyond the all-gather/reduce-scatter/all-reduce every
  // backend has. Default: none.
  std::vector<distributed::CollectiveOp> collectives;

  // Only a CUDA device will do.
  bool requires_gpu() const;
  // nullopt when `backend` meets the requirements; otherwise why not ("needs ranks as threads
  // of one process; backend gloo runs them as processes").
  std::optional<std::string> UnmetBy(const distributed::BackendSpec& backend) const;
  // "in-process ranks, cpu" style summary; "any backend" when nothing is required.
  std::string str() const;
};

// One extra configuration the GoogleTest suite runs besides the default (conformance/
// scenarios_test.cc): the scenario at `world` with `params` fixed as `--param` fixes them, e.g.
// {128, {{"dtype", "bfloat16"}}} keeps a large world cheap by fixing an axis.
struct TestRun {
  int world = 2;
  std::map<std::string, std::string> params;  // Default: none fixed (every axis value)
};

struct ScenarioInfo {
  std::string name;         // "family/case", see docs/seed-tests.md
  std::string description;  // one line
  // The seed test mirrored, as file::Class::test, e.g.
  // "test_fully_shard_comm.py::TestFullyShardCommunication::test_fully_shard_communication_count"
  std::string seed_test;
  std::vector<ParamSpec> params;  // Default: none
  // What each rank reports (observation_schema.h); the runner validates every rank's
  // observations against it strictly before judging.
  ObservationSchema observations;
  // What the runner-owned inputs hold (required when Scenario::inputs is set).
  InputsDoc inputs;
  int default_world = 2;          // Default: 2; the seed's world size
  int min_world = 1;              // Default: 1
  int max_world = 8;              // Default: 8
  // The observations are a pure function of the case's parameters, world and inputs (true of
  // every family that trains): the runner runs such a case twice and requires bit-identical
  // observations (RunOptions::determinism), so an engine that reads uninitialised memory or
  // reduces in a run-dependent order fails. Default: false.
  bool deterministic = false;
  // Runs the runner also plans, after default_world, when no --world is given: typically an
  // uneven world at which torch.chunk and a balanced split shard the scenario's parameters
  // differently (DiscriminatingWorld, conformance/uneven_world.h), so that a wrong sharding
  // rule fails a default run, with axes that play no part in the sharding fixed to keep it
  // cheap (a value the user fixes with --param wins); or, at the default world, the later
  // semantics profile of a scenario whose expectations depend on it (LaterProfileRuns),
  // planned only when the run leaves the profile open (no --semantics or --param semantics=).
  // Each world lies in [min_world, max_world] and differs from default_world unless the run
  // fixes a parameter. Default: none.
  std::vector<TestRun> extra_default_runs;
  // What the scenario needs of a backend. Default: nothing (every backend).
  ScenarioRequirements requirements;
  // Extra configurations ctest runs on the threaded backend (e.g. other worlds), all in one
  // test per scenario named "<scenario>__worlds_<N>_<M>...". Default: none (the default world
  // only).
  std::vector<TestRun> test_runs;

  std::string family() const;     // the part before '/'
  std::string case_name() const;  // the part after '/'
};

struct Scenario {
  ScenarioInfo info;
  RankBody run_rank;  // required
  JudgeFn judge;      // required
  // Optional. The tensors the runner materialises for every case (weights, per-rank inputs and
  // targets); a body reads them with env.Inputs(). Unset: the case has no tensor inputs (its
  // data follow from the parameters by rules its description states).
  InputsFn inputs;
  // Optional. The expected observations (`fsdp-conform expect` writes them for third parties
  // to debug against). A scenario that has it should judge against it too.
  ExpectFn expect;
  // Optional. Combinations the seed never runs (e.g. an int reshard_after_forward with
  // async_op): dropped from the product of unfixed axes; when every case of a run is excluded,
  // the scenario is reported skipped with the reason.
  CaseFilter excluded;
  // Optional. Cases that cannot run in this configuration (e.g. world not divisible by the
  // reshard_after_forward int): reported as skipped with the reason.
  CaseFilter skip;
};

// Thrown by a body (or a subject) that cannot run a case here: the case is reported SKIPPED
// with the reason. Use SkipCase().
class CaseSkipped : public std::exception {
 public:
  explicit CaseSkipped(std::string reason) : reason_(std::move(reason)) {}
  const char* what() const noexcept override { return reason_.c_str(); }
  const std::string& reason() const { return reason_; }

 private:
  std::string reason_;
};

[[noreturn]] void SkipCase(const std::string& reason);

// Checks a scenario before registration: name "family/case" of [a-z0-9_], info consistent
// (1 <= min_world <= default_world <= max_world, some device allowed), parameters valid,
// run_rank and judge set. Throws InvalidArgument naming the scenario.
void ValidateScenario(const Scenario& scenario);

}  // namespace fsdp::conformance
