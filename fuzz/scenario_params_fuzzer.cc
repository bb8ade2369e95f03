// Fuzzes the scenario parameters a user gives (`run --param KEY=VALUE`): the input's first byte
// chooses a scenario of the default catalog (its index modulo their number), every following
// line is one assignment, parsed (ParseParamAssignment) and expanded against that scenario
// (ExpandCases: typed sizes, bounded ints, axes, domains). Any input is accepted or refused with
// an fsdp::Error naming the parameter, never a crash. One scenario per input (rather than the
// whole catalog) keeps an execution cheap enough for millions of them.
#include <cstddef>
#include <cstdint>
#include <map>
#include <sstream>
#include <string>

#include "conformance/catalog.h"
#include "conformance/params.h"
#include "conformance/scenario.h"
#include "engine/core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const fsdp::conformance::Catalog& catalog = fsdp::conformance::DefaultCatalog();
  static const auto scenarios = catalog.scenarios.All();
  if (size == 0 || scenarios.empty()) return 0;
  const fsdp::conformance::Scenario& scenario = *scenarios[data[0] % scenarios.size()];
  std::map<std::string, std::string> fixed;
  std::istringstream lines(std::string(reinterpret_cast<const char*>(data) + 1, size - 1));
  for (std::string line; std::getline(lines, line);) {
    try {
      auto [key, value] = fsdp::conformance::ParseParamAssignment(line);
      for (const auto& spec : scenario.info.params) {
        if (spec.name == key) fixed[key] = value;
      }
    } catch (const fsdp::Error&) {
    }
  }
  try {
    const auto cases =
        fsdp::conformance::ExpandCases(scenario.info.name, scenario.info.params, fixed);
    for (const auto& c : cases) (void)c.Label();
  } catch (const fsdp::Error&) {
  }
  return 0;
}
