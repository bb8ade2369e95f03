// Test-only: a catalog of toy scenarios that exercise the framework itself (launchers, judge
// plumbing, skips, failures), independent of the engine and of the fake process groups.
// Built into conformance_tests only.
//
//   toy/sum     axis mode {plain, doubled}, sizes scale=3 and bias=0 (every backend): each
//               rank reports
//               value = (rank+1)*scale*(2 if doubled), all-reduces it into `total`; the judge
//               expects the analytic values (+bias: a non-zero bias makes the case fail)
//   toy/matrix  axes a {x, y} x b {1, 2, 3}; (y, 3) is excluded; b=2 is skipped at odd worlds;
//               threaded only
//   toy/flaws   size flaw=none: none | rank_error | skip | sleep | bad_obs | no_checks |
//               judge_throws | nondeterministic (a value that changes between runs; the
//               scenario is ScenarioInfo::deterministic); bad_rank=1, sleep_ms=1500
//   toy/gpu     requires a GPU
//
// Backends: the defaults (threaded: fakes::ThreadedProcessGroup; gloo: GlooProcessGroup; nccl:
// no factory, needs a GPU) plus "toyproc" (processes with a file-based toy group, so that the
// process launcher is tested independently of Gloo).
//
// Thread-safety: ToyCatalog() is built once, thread-safe; the toy groups follow the
// ProcessGroup contract (one thread per group object).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "conformance/catalog.h"
#include "engine/distributed/process_group.h"

namespace fsdp::conformance::testing {

inline constexpr const char* kToyProcBackend = "toyproc";

// A fresh catalog: toy scenarios, default + toy backends, the engine subject.
std::unique_ptr<Catalog> MakeToyCatalog();
// The process-wide toy catalog (also what the test binary's `__worker` serves).
const Catalog& ToyCatalog();

// A toy group for ranks as processes that exchange values through the rendezvous `store`:
// all_reduce (SUM) and barrier only.
std::shared_ptr<distributed::ProcessGroup> MakeStoreToyGroup(
    int rank, int world, std::shared_ptr<distributed::Store> store);

}  // namespace fsdp::conformance::testing
