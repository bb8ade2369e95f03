// Checks: what a scenario's judge records. Each check has a name, the expected and the actual
// value (JSON, so the report and --json show them as they are) and a verdict. A CheckList also
// keeps "figures" (e.g. the largest absolute error over all closeness checks) for the
// human-readable table.
//
// Ownership: a CheckList is owned by the runner for one case and handed to the judge.
// Thread-safety: none; one judge fills one list.
#pragma once

#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace fsdp::conformance {

struct Check {
  std::string name;         // e.g. "rank 0 forward _allgather_base_ count"
  nlohmann::json expected;  // the value the scenario expects
  nlohmann::json actual;    // the value the subject reported
  bool passed = false;
  std::string detail;  // e.g. "max abs err 3e-07 (atol 1e-05) at index 4"; may be empty

  nlohmann::json ToJson() const;  // {name, expected, actual, passed[, detail]}
};

// Tolerances of a closeness check: |a - e| <= atol + rtol * |e| element-wise (torch.allclose).
struct Tolerance {
  double atol = 1e-5;  // Default: 1e-5
  double rtol = 1e-5;  // Default: 1e-5 (exact comparison: {0, 0})
};

class CheckList {
 public:
  // expected == actual as JSON values. Returns the verdict.
  bool CheckEqual(const std::string& name, const nlohmann::json& expected,
                  const nlohmann::json& actual);
  // Element-wise closeness of two number arrays of equal length. The check's detail and the
  // list's figures report the max absolute and max relative error and where it occurred.
  bool CheckClose(const std::string& name, const std::vector<double>& expected,
                  const std::vector<double>& actual, Tolerance tolerance = {});
  // The same with atol[i] in place of a single atol for element i (e.g. an atol scaled by the
  // magnitude of the tensor the element belongs to); the detail names the atol `atol_label`.
  bool CheckClose(const std::string& name, const std::vector<double>& expected,
                  const std::vector<double>& actual, const std::vector<double>& atol, double rtol,
                  const std::string& atol_label);
  // The same for JSON arrays of numbers (e.g. the "data" of a tensor observation); a value
  // that is not a flat number array fails the check with a clear detail.
  bool CheckClose(const std::string& name, const nlohmann::json& expected,
                  const nlohmann::json& actual, Tolerance tolerance = {});
  // A boolean property; `detail` says what was seen.
  bool CheckTrue(const std::string& name, bool condition, const std::string& detail = "");
  // Records a failed check (e.g. "rank 1 reported no 'losses'").
  void Fail(const std::string& name, const std::string& detail);

  // A key figure for the table, e.g. ("steps", 10). Later values for a key overwrite.
  void SetFigure(const std::string& key, const nlohmann::json& value);

  const std::vector<Check>& checks() const { return checks_; }
  const std::map<std::string, nlohmann::json>& figures() const { return figures_; }
  bool empty() const { return checks_.empty(); }
  bool all_passed() const;
  int failed_count() const;

  // Failed checks (or all when `failed_only` is false) as an aligned text table.
  std::string Table(bool failed_only = true) const;
  // "checks=12/12 max_abs_err=3.1e-07 max_rel_err=2e-06 steps=10": the verdict count, the
  // closeness figures, then the judge's own figures.
  std::string Summary() const;

 private:
  // CheckClose's comparison: element i passes when |a - e| <= atol(i) + rtol * |e|.
  bool CheckCloseImpl(const std::string& name, const std::vector<double>& expected,
                      const std::vector<double>& actual, const std::function<double(size_t)>& atol,
                      double rtol, const std::string& atol_label);

  std::vector<Check> checks_;
  std::map<std::string, nlohmann::json> figures_;
  double max_abs_err_ = -1;  // over all CheckClose calls; -1: none yet
  double max_rel_err_ = -1;
};

// Short rendering of a JSON value for tables: long arrays are elided ("[1, 2, ... (96 more)]").
std::string BriefJson(const nlohmann::json& value, size_t max_chars = 60);

}  // namespace fsdp::conformance
