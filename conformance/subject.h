// Subject: the FSDP implementation under test. A scenario's run_rank body drives our engine
// (EngineSubject, named "engine"); a third party that links this library registers its own
// subject, which runs its implementation of each scenario and reports the same observations.
// The scenario's judge is the same for every subject: subjects report, they never judge.
//
// Out-of-process implementations do not implement Subject: they are run with
// `--subject external --driver PATH` under the driver protocol (driver_protocol.h).
//
// Ownership: SubjectRegistry owns factories; a created subject is shared (std::shared_ptr) by
// the ranks of a run. Thread-safety: Subject::RunRank is called concurrently for the ranks of
// a case (threaded backend) and must be thread-safe (for the ranks of several cases at once
// where supports_concurrent_cases()); the registry is filled before use.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "conformance/scenario.h"

namespace fsdp::conformance {

inline constexpr const char* kEngineSubject = "engine";
inline constexpr const char* kExternalSubject = "external";  // reserved: the driver protocol

class Subject {
 public:
  virtual ~Subject() = default;
  virtual std::string name() const = 0;
  // nullopt when the subject can run this case on `backend`; otherwise the reason it cannot
  // (the case is reported SKIPPED with it). Default: supports everything.
  virtual std::optional<std::string> Unsupported(const Scenario& scenario, const CaseParams& params,
                                                 const std::string& backend) const;
  // Runs one rank of a case on the calling thread and returns its observations. May throw
  // fsdp::Error (reported as the rank's error) or CaseSkipped.
  virtual nlohmann::json RunRank(const Scenario& scenario, RankEnv& env) const = 0;
  // Whether the ranks of different cases may run at the same time (fsdp-conform run --jobs):
  // true only for a subject that keeps no state across the ranks of different cases. Default
  // false: the runner takes one case at a time.
  virtual bool supports_concurrent_cases() const { return false; }
};

// Our engine: runs the scenario's own body.
class EngineSubject final : public Subject {
 public:
  std::string name() const override { return kEngineSubject; }
  nlohmann::json RunRank(const Scenario& scenario, RankEnv& env) const override;
  // The engine's state lives in each rank's modules, process group and RankContext.
  bool supports_concurrent_cases() const override { return true; }
};

// A subject assembled from per-scenario bodies: the easy way for a third party to join in
// process. Scenarios without a body are reported as unsupported (skipped).
class TableSubject final : public Subject {
 public:
  explicit TableSubject(std::string name) : name_(std::move(name)) {}
  // Adds the body that runs `scenario_name` on this subject; replaces an earlier one.
  TableSubject& Add(const std::string& scenario_name, RankBody body);

  // Declares that the bodies keep no state across cases (see Subject); default false.
  TableSubject& set_supports_concurrent_cases(bool supports) {
    concurrent_cases_ = supports;
    return *this;
  }

  std::string name() const override { return name_; }
  std::optional<std::string> Unsupported(const Scenario& scenario, const CaseParams& params,
                                         const std::string& backend) const override;
  nlohmann::json RunRank(const Scenario& scenario, RankEnv& env) const override;
  bool supports_concurrent_cases() const override { return concurrent_cases_; }

 private:
  std::string name_;
  std::map<std::string, RankBody> bodies_;
  bool concurrent_cases_ = false;
};

using SubjectFactory = std::function<std::shared_ptr<Subject>()>;

class SubjectRegistry {
 public:
  // Registers a factory under `name` (letters, digits, '_', '-'; not "external").
  void Add(const std::string& name, SubjectFactory factory);
  bool Has(const std::string& name) const { return factories_.count(name) != 0; }
  // Creates the subject; NotFound listing the registered names when absent.
  std::shared_ptr<Subject> Create(const std::string& name) const;
  std::vector<std::string> Names() const;

 private:
  std::map<std::string, SubjectFactory> factories_;
};

}  // namespace fsdp::conformance
