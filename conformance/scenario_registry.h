// ScenarioRegistry: the scenarios a runner knows, by name, filled by explicit registration
// functions (no static initialisers: static libraries drop those). Each family file defines
// `void Register<Family>Scenarios(ScenarioRegistry&)`; conformance/all_scenarios.cc calls them
// all (RegisterAllScenarios). Tests build their own registry instances with toy scenarios.
//
// Ownership: owns its scenarios; pointers returned stay valid for the registry's lifetime.
// Thread-safety: Add is not thread-safe; const member functions may be called concurrently
// once registration is over.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "conformance/scenario.h"

namespace fsdp::conformance {

// Shell-style glob over a whole name: '*' matches any run of characters (including '/'),
// '?' one character; everything else matches itself.
bool GlobMatch(std::string_view pattern, std::string_view text);

class ScenarioRegistry {
 public:
  // Validates (ValidateScenario) and adds; a second scenario with the same name is an error.
  void Add(Scenario scenario);

  const Scenario* Find(const std::string& name) const;  // null when absent
  // Throws NotFound listing the registered names when absent.
  const Scenario& Get(const std::string& name) const;

  // Scenarios matching any of the glob patterns, sorted by name, each once. Every pattern must
  // match at least one scenario; otherwise NotFound names the pattern and lists the scenarios.
  std::vector<const Scenario*> Match(const std::vector<std::string>& patterns) const;

  std::vector<const Scenario*> All() const;  // sorted by name
  std::vector<std::string> Names() const;    // sorted
  size_t size() const { return scenarios_.size(); }

 private:
  std::map<std::string, Scenario> scenarios_;
};

// Registers every family of the suite (conformance/all_scenarios.cc).
void RegisterAllScenarios(ScenarioRegistry& registry);

}  // namespace fsdp::conformance
