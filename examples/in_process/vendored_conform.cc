// vendored-conform: an FSDP implementation that joins the conformance suite in process, the
// way a third party links it (docs/in_process.md). It builds against the installed
// fsdp_conformance package, registers its subject "vendored" in a catalog beside the defaults
// and hands the catalog to the suite's own command line, so `vendored-conform run PATTERN
// --subject vendored [--backend gloo]` judges it exactly like `fsdp-conform` judges the engine;
// with a process backend the ranks re-execute this binary (`__worker --subject vendored`).
//
// The implementation here is the project's engine itself, wrapped: each case runs the
// scenario's own body (a real third party runs its implementation and reports the
// observations the scenario's schema names; `fsdp-conform schema`). It claims the
// collectives and FSDP2 communication families only; the suite reports every other scenario
// as skipped with the reason Unsupported gives.
//
// Ownership: the catalog lives in main(); the subject is shared by the ranks of a run.
// Thread-safety: RunRank is called concurrently for the ranks of a case (threaded backend);
// it keeps no state.
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "conformance/catalog.h"
#include "conformance/cli.h"
#include "conformance/subject.h"

namespace {

namespace conf = fsdp::conformance;

class VendoredSubject final : public conf::Subject {
 public:
  std::string name() const override { return "vendored"; }

  std::optional<std::string> Unsupported(const conf::Scenario& scenario,
                                         const conf::CaseParams& /*params*/,
                                         const std::string& /*backend*/) const override {
    const std::string& name = scenario.info.name;
    const std::string family = name.substr(0, name.find('/'));
    if (kFamilies.count(family) != 0) return std::nullopt;
    return "subject vendored implements only the collectives and fully_shard_comm families, not " +
           name;
  }

  nlohmann::json RunRank(const conf::Scenario& scenario, conf::RankEnv& env) const override {
    return scenario.run_rank(env);
  }

 private:
  inline static const std::set<std::string> kFamilies = {"collectives", "fully_shard_comm"};
};

}  // namespace

int main(int argc, char** argv) {
  conf::Catalog catalog;
  conf::RegisterDefaults(catalog);
  catalog.subjects.Add("vendored", [] { return std::make_shared<VendoredSubject>(); });
  return conf::CliMain(argc, argv, catalog);
}
