#include "conformance/subject.h"

#include <algorithm>
#include <cctype>

#include "engine/core/error.h"

namespace fsdp::conformance {

std::optional<std::string> Subject::Unsupported(const Scenario& /*scenario*/,
                                                const CaseParams& /*params*/,
                                                const std::string& /*backend*/) const {
  return std::nullopt;
}

nlohmann::json EngineSubject::RunRank(const Scenario& scenario, RankEnv& env) const {
  return scenario.run_rank(env);
}

TableSubject& TableSubject::Add(const std::string& scenario_name, RankBody body) {
  FSDP_CHECK(static_cast<bool>(body), "subject ", name_, ": empty body for ", scenario_name);
  bodies_[scenario_name] = std::move(body);
  return *this;
}

std::optional<std::string> TableSubject::Unsupported(const Scenario& scenario,
                                                     const CaseParams& /*params*/,
                                                     const std::string& /*backend*/) const {
  if (bodies_.count(scenario.info.name)) return std::nullopt;
  return "subject " + name_ + " does not implement " + scenario.info.name;
}

nlohmann::json TableSubject::RunRank(const Scenario& scenario, RankEnv& env) const {
  auto it = bodies_.find(scenario.info.name);
  if (it == bodies_.end()) SkipCase(*Unsupported(scenario, env.params, env.backend));
  return it->second(env);
}

void SubjectRegistry::Add(const std::string& name, SubjectFactory factory) {
  const bool valid = !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
  });
  FSDP_CHECK(valid, "subject name '", name, "' must use only letters, digits, '_' and '-'");
  FSDP_CHECK(name != kExternalSubject, "subject name '", kExternalSubject,
             "' is reserved for the out-of-process driver protocol");
  FSDP_CHECK(static_cast<bool>(factory), "subject ", name, ": empty factory");
  FSDP_CHECK(factories_.count(name) == 0, "subject ", name, " is registered twice");
  factories_[name] = std::move(factory);
}

std::shared_ptr<Subject> SubjectRegistry::Create(const std::string& name) const {
  auto it = factories_.find(name);
  if (it == factories_.end()) {
    std::string names;
    for (const auto& n : Names()) names += (names.empty() ? "" : ", ") + n;
    FSDP_THROW(ErrorCode::kNotFound, "unknown subject '", name, "'; subjects: ", names,
               names.empty() ? "" : ", ", kExternalSubject, " (with --driver PATH)");
  }
  std::shared_ptr<Subject> subject = it->second();
  FSDP_CHECK_CODE(ErrorCode::kInternal, subject != nullptr, "subject factory ", name,
                  " returned null");
  return subject;
}

std::vector<std::string> SubjectRegistry::Names() const {
  std::vector<std::string> out;
  for (const auto& [n, f] : factories_) out.push_back(n);
  return out;
}

}  // namespace fsdp::conformance
