#include "conformance/scenario_registry.h"

#include <set>

#include "engine/core/error.h"

namespace fsdp::conformance {

namespace {

std::string NameList(const std::vector<std::string>& names) {
  if (names.empty()) return "(no scenarios are registered)";
  std::string out;
  for (const auto& n : names) {
    if (!out.empty()) out += ", ";
    out += n;
  }
  return out;
}

}  // namespace

bool GlobMatch(std::string_view pattern, std::string_view text) {
  // Iterative matcher with single-star backtracking: linear in practice, no recursion.
  size_t p = 0, t = 0;
  size_t star_p = std::string_view::npos, star_t = 0;
  while (t < text.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == text[t])) {
      ++p;
      ++t;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star_p = p++;
      star_t = t;
    } else if (star_p != std::string_view::npos) {
      p = star_p + 1;
      t = ++star_t;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

void ScenarioRegistry::Add(Scenario scenario) {
  ValidateScenario(scenario);
  const std::string name = scenario.info.name;
  FSDP_CHECK(scenarios_.count(name) == 0, "scenario ", name, " is registered twice");
  scenarios_.emplace(name, std::move(scenario));
}

const Scenario* ScenarioRegistry::Find(const std::string& name) const {
  auto it = scenarios_.find(name);
  return it == scenarios_.end() ? nullptr : &it->second;
}

const Scenario& ScenarioRegistry::Get(const std::string& name) const {
  const Scenario* s = Find(name);
  if (s == nullptr) {
    FSDP_THROW(ErrorCode::kNotFound, "unknown scenario '", name,
               "'; scenarios: ", NameList(Names()));
  }
  return *s;
}

std::vector<const Scenario*> ScenarioRegistry::Match(
    const std::vector<std::string>& patterns) const {
  FSDP_CHECK(!patterns.empty(), "no scenario pattern given; scenarios: ", NameList(Names()));
  std::set<std::string> picked;
  for (const auto& pattern : patterns) {
    bool any = false;
    for (const auto& [name, s] : scenarios_) {
      if (GlobMatch(pattern, name)) {
        picked.insert(name);
        any = true;
      }
    }
    if (!any) {
      FSDP_THROW(ErrorCode::kNotFound, "no scenario matches '", pattern,
                 "'; scenarios: ", NameList(Names()));
    }
  }
  std::vector<const Scenario*> out;
  for (const auto& name : picked) out.push_back(&scenarios_.at(name));
  return out;
}

std::vector<const Scenario*> ScenarioRegistry::All() const {
  std::vector<const Scenario*> out;
  for (const auto& [name, s] : scenarios_) out.push_back(&s);
  return out;
}

std::vector<std::string> ScenarioRegistry::Names() const {
  std::vector<std::string> out;
  for (const auto& [name, s] : scenarios_) out.push_back(name);
  return out;
}

}  // namespace fsdp::conformance
