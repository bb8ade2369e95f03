#include "conformance/checks.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <sstream>

namespace fsdp::conformance {

namespace {

std::string Sci(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3g", v);
  return buf;
}

// Flat number array from JSON; false (with a reason) otherwise.
bool JsonNumbers(const nlohmann::json& j, std::vector<double>* out, std::string* why) {
  if (j.is_number()) {
    out->assign(1, j.get<double>());
    return true;
  }
  if (!j.is_array()) {
    *why = std::string("not a number array (") + j.type_name() + ")";
    return false;
  }
  out->clear();
  out->reserve(j.size());
  for (size_t i = 0; i < j.size(); ++i) {
    if (!j[i].is_number()) {
      *why = "element " + std::to_string(i) + " is " + j[i].type_name() + ", not a number";
      return false;
    }
    out->push_back(j[i].get<double>());
  }
  return true;
}

// Arrays up to kMaxReportedElements are reported whole; longer ones as their length and head,
// so that --json stays readable for tensor-sized comparisons.
constexpr size_t kMaxReportedElements = 256;

nlohmann::json ArrayForReport(const std::vector<double>& values) {
  if (values.size() <= kMaxReportedElements) return values;
  return {{"numel", values.size()},
          {"head", std::vector<double>(values.begin(), values.begin() + 16)}};
}

}  // namespace

nlohmann::json Check::ToJson() const {
  nlohmann::json j = {
      {"name", name}, {"expected", expected}, {"actual", actual}, {"passed", passed}};
  if (!detail.empty()) j["detail"] = detail;
  return j;
}

bool CheckList::CheckEqual(const std::string& name, const nlohmann::json& expected,
                           const nlohmann::json& actual) {
  Check c{name, expected, actual, expected == actual, ""};
  checks_.push_back(std::move(c));
  return checks_.back().passed;
}

bool CheckList::CheckClose(const std::string& name, const std::vector<double>& expected,
                           const std::vector<double>& actual, Tolerance tolerance) {
  return CheckCloseImpl(
      name, expected, actual, [&](size_t) { return tolerance.atol; }, tolerance.rtol,
      Sci(tolerance.atol));
}

bool CheckList::CheckClose(const std::string& name, const std::vector<double>& expected,
                           const std::vector<double>& actual, const std::vector<double>& atol,
                           double rtol, const std::string& atol_label) {
  if (atol.size() != expected.size()) {
    Fail(name, "internal: " + std::to_string(atol.size()) + " atol values for " +
                   std::to_string(expected.size()) + " elements");
    return false;
  }
  return CheckCloseImpl(
      name, expected, actual, [&](size_t i) { return atol[i]; }, rtol, atol_label);
}

bool CheckList::CheckCloseImpl(const std::string& name, const std::vector<double>& expected,
                               const std::vector<double>& actual,
                               const std::function<double(size_t)>& atol, double rtol,
                               const std::string& atol_label) {
  Check c;
  c.name = name;
  c.expected = ArrayForReport(expected);
  c.actual = ArrayForReport(actual);
  if (expected.size() != actual.size()) {
    c.passed = false;
    c.detail =
        "length " + std::to_string(actual.size()) + ", expected " + std::to_string(expected.size());
    checks_.push_back(std::move(c));
    return false;
  }
  double max_abs = 0, max_rel = 0;
  size_t worst = 0, first_bad = expected.size();
  bool ok = true;
  for (size_t i = 0; i < expected.size(); ++i) {
    const double e = expected[i], a = actual[i];
    if (std::isnan(e) && std::isnan(a)) continue;  // NaN where NaN is expected
    double abs_err = std::fabs(a - e);
    if (std::isnan(abs_err)) abs_err = INFINITY;
    const double rel_err = e != 0 ? abs_err / std::fabs(e) : (abs_err == 0 ? 0 : INFINITY);
    if (abs_err > max_abs) {
      max_abs = abs_err;
      worst = i;
    }
    max_rel = std::max(max_rel, rel_err);
    if (!(abs_err <= atol(i) + rtol * std::fabs(e))) {
      if (ok) first_bad = i;
      ok = false;
    }
  }
  c.passed = ok;
  std::ostringstream d;
  d << "max abs err " << Sci(max_abs);
  if (!expected.empty()) d << " at [" << worst << "]";
  d << ", max rel err " << Sci(max_rel) << " (atol " << atol_label << ", rtol " << Sci(rtol) << ")";
  if (!ok) {
    d << "; first mismatch at [" << first_bad << "]: expected " << expected[first_bad] << ", got "
      << actual[first_bad];
  }
  c.detail = d.str();
  max_abs_err_ = std::max(max_abs_err_, max_abs);
  max_rel_err_ = std::max(max_rel_err_, max_rel);
  figures_["max_abs_err"] = max_abs_err_;
  figures_["max_rel_err"] = max_rel_err_;
  checks_.push_back(std::move(c));
  return ok;
}

bool CheckList::CheckClose(const std::string& name, const nlohmann::json& expected,
                           const nlohmann::json& actual, Tolerance tolerance) {
  std::vector<double> e, a;
  std::string why;
  if (!JsonNumbers(expected, &e, &why)) {
    checks_.push_back(Check{name, expected, actual, false, "expected value is " + why});
    return false;
  }
  if (!JsonNumbers(actual, &a, &why)) {
    checks_.push_back(Check{name, expected, actual, false, "actual value is " + why});
    return false;
  }
  return CheckClose(name, e, a, tolerance);
}

bool CheckList::CheckTrue(const std::string& name, bool condition, const std::string& detail) {
  checks_.push_back(Check{name, true, condition, condition, detail});
  return condition;
}

void CheckList::Fail(const std::string& name, const std::string& detail) {
  checks_.push_back(Check{name, nullptr, nullptr, false, detail});
}

void CheckList::SetFigure(const std::string& key, const nlohmann::json& value) {
  figures_[key] = value;
}

bool CheckList::all_passed() const { return failed_count() == 0; }

int CheckList::failed_count() const {
  return static_cast<int>(
      std::count_if(checks_.begin(), checks_.end(), [](const Check& c) { return !c.passed; }));
}

std::string CheckList::Table(bool failed_only) const {
  std::vector<std::vector<std::string>> rows;
  rows.push_back({"check", "expected", "actual", "verdict", "detail"});
  for (const auto& c : checks_) {
    if (failed_only && c.passed) continue;
    rows.push_back(
        {c.name, BriefJson(c.expected), BriefJson(c.actual), c.passed ? "ok" : "FAIL", c.detail});
  }
  if (rows.size() == 1) return "";
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& r : rows) {
    for (size_t i = 0; i < r.size(); ++i) width[i] = std::max(width[i], r[i].size());
  }
  std::ostringstream os;
  for (const auto& r : rows) {
    std::string line;
    for (size_t i = 0; i < r.size(); ++i) {
      line += r[i];
      if (i + 1 < r.size()) line += std::string(width[i] - r[i].size() + 2, ' ');
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    os << "  " << line << "\n";
  }
  return os.str();
}

std::string CheckList::Summary() const {
  std::vector<std::string> parts;
  if (!checks_.empty()) {
    parts.push_back("checks=" + std::to_string(checks_.size() - failed_count()) + "/" +
                    std::to_string(checks_.size()));
  }
  auto figure = [](const std::string& k, const nlohmann::json& v) {
    return k + "=" + (v.is_number_float() ? Sci(v.get<double>()) : BriefJson(v, 24));
  };
  for (const char* key : {"max_abs_err", "max_rel_err"}) {
    if (auto it = figures_.find(key); it != figures_.end())
      parts.push_back(figure(key, it->second));
  }
  for (const auto& [k, v] : figures_) {
    if (k != "max_abs_err" && k != "max_rel_err") parts.push_back(figure(k, v));
  }
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : " ") + p;
  return out;
}

std::string BriefJson(const nlohmann::json& value, size_t max_chars) {
  std::string s = value.is_null() ? "-" : value.dump();
  if (s.size() <= max_chars) return s;
  if (value.is_array()) {
    std::string out = "[";
    size_t shown = 0;
    for (const auto& e : value) {
      std::string piece = e.dump();
      if (out.size() + piece.size() + 24 > max_chars) break;
      if (shown) out += ", ";
      out += piece;
      ++shown;
    }
    out += (shown ? ", " : "") + std::string("... (") + std::to_string(value.size() - shown) +
           " more)]";
    return out;
  }
  return s.substr(0, max_chars - 3) + "...";
}

}  // namespace fsdp::conformance
