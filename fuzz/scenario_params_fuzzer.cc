// Fuzzes the scenario parameters a user gives (`run --param KEY=VALUE`): every line of the input
// is one assignment, parsed (ParseParamAssignment) and expanded against every scenario of the
// default catalog (ExpandCases: typed sizes, bounded ints, axes, domains). Any input is
// accepted or refused with an fsdp::Error naming the parameter, never a crash.
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
  std::map<std::string, std::string> fixed;
  std::istringstream lines(std::string(reinterpret_cast<const char*>(data), size));
  for (std::string line; std::getline(lines, line);) {
    try {
      auto [key, value] = fsdp::conformance::ParseParamAssignment(line);
      fixed[key] = value;
    } catch (const fsdp::Error&) {
    }
  }
  for (const fsdp::conformance::Scenario* scenario : catalog.scenarios.All()) {
    std::map<std::string, std::string> mine;
    for (const auto& spec : scenario->info.params) {
      auto it = fixed.find(spec.name);
      if (it != fixed.end()) mine.insert(*it);
    }
    if (mine.empty()) continue;
    try {
      const auto cases =
          fsdp::conformance::ExpandCases(scenario->info.name, scenario->info.params, mine);
      for (const auto& c : cases) (void)c.Label();
    } catch (const fsdp::Error&) {
    }
  }
  return 0;
}
