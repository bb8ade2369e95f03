// Catalog: everything a runner can choose from, namely scenarios, backends and in-process
// subjects. The CLI, the GoogleTest suite and the worker process all start from
// DefaultCatalog(); a third party builds its own catalog (DefaultCatalog() plus its subject)
// and hands it to CliMain or the GoogleTest macro.
//
// Ownership: owns its registries. Thread-safety: fill first; then read-only and shareable.
#pragma once

#include "conformance/scenario_registry.h"
#include "conformance/subject.h"
#include "engine/distributed/backend_registry.h"

namespace fsdp::conformance {

struct Catalog {
  ScenarioRegistry scenarios;
  distributed::BackendRegistry backends;
  SubjectRegistry subjects;
};

// Every scenario family, fakes::DefaultBackends() (threaded, gloo, nccl), and the
// "engine" subject.
void RegisterDefaults(Catalog& catalog);

// A process-wide catalog with the defaults, built on first use (thread-safe).
const Catalog& DefaultCatalog();

}  // namespace fsdp::conformance
