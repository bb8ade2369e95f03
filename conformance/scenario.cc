#include "conformance/scenario.h"

#include <algorithm>
#include <cctype>

#include "engine/core/error.h"

namespace fsdp::conformance {

namespace {

bool IsNamePart(const std::string& s) {
  if (s.empty()) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return std::islower(static_cast<unsigned char>(c)) ||
           std::isdigit(static_cast<unsigned char>(c)) || c == '_';
  });
}

}  // namespace

dist::ProcessGroup& RankEnv::group() const {
  FSDP_CHECK_CODE(ErrorCode::kFailedPrecondition, pg != nullptr, "scenario ", scenario, ", rank ",
                  rank, " of ", world, ": no process group on backend '", backend,
                  "' (a group may be absent only for a single rank)");
  return *pg;
}

// The family is everything before the LAST '/', so families may nest ("parity/single").
std::string ScenarioInfo::family() const {
  const size_t slash = name.rfind('/');
  return slash == std::string::npos ? name : name.substr(0, slash);
}

std::string ScenarioInfo::case_name() const {
  const size_t slash = name.rfind('/');
  return slash == std::string::npos ? std::string() : name.substr(slash + 1);
}

bool ScenarioInfo::SupportsBackend(const std::string& backend) const {
  return std::find(backends.begin(), backends.end(), backend) != backends.end();
}

void SkipCase(const std::string& reason) { throw CaseSkipped(reason); }

void ValidateScenario(const Scenario& s) {
  const ScenarioInfo& i = s.info;
  bool parts_ok = i.name.find('/') != std::string::npos;
  size_t begin = 0;
  while (parts_ok) {
    const size_t slash = i.name.find('/', begin);
    parts_ok = IsNamePart(i.name.substr(begin, slash == std::string::npos ? slash : slash - begin));
    if (slash == std::string::npos) break;
    begin = slash + 1;
  }
  FSDP_CHECK(parts_ok, "scenario name '", i.name,
             "' must be 'family/case' (the family may nest, e.g. 'parity/single/mlp') with each "
             "part of lowercase letters, digits and '_'");
  FSDP_CHECK(!i.description.empty(), "scenario ", i.name, ": description is empty");
  FSDP_CHECK(!i.seed_test.empty(), "scenario ", i.name,
             ": seed_test is empty (name the mirrored test as file::Class::test)");
  FSDP_CHECK(i.min_world >= 1 && i.min_world <= i.default_world && i.default_world <= i.max_world,
             "scenario ", i.name, ": world sizes must satisfy 1 <= min_world (", i.min_world,
             ") <= default_world (", i.default_world, ") <= max_world (", i.max_world, ")");
  FSDP_CHECK(!i.backends.empty(), "scenario ", i.name, ": lists no backends");
  ValidateParamSpecs(i.name, i.params);
  FSDP_CHECK(static_cast<bool>(s.run_rank), "scenario ", i.name, ": run_rank is not set");
  FSDP_CHECK(static_cast<bool>(s.judge), "scenario ", i.name, ": judge is not set");
}

}  // namespace fsdp::conformance
