#include "conformance/catalog.h"

#include <memory>

#include "fakes/threaded_backend.h"

namespace fsdp::conformance {

void RegisterDefaults(Catalog& catalog) {
  RegisterAllScenarios(catalog.scenarios);
  catalog.backends = fakes::DefaultBackends();
  catalog.subjects.Add(kEngineSubject, [] { return std::make_shared<EngineSubject>(); });
}

const Catalog& DefaultCatalog() {
  static const Catalog* catalog = [] {
    auto* c = new Catalog();  // never destroyed: detached rank threads may still use it
    RegisterDefaults(*c);
    return c;
  }();
  return *catalog;
}

}  // namespace fsdp::conformance
