#include "conformance/report.h"

#include <algorithm>
#include <cstdio>
#include <ostream>
#include <sstream>

namespace fsdp::conformance {

namespace {

constexpr size_t kMaxCaseWidth = 60;

std::string Pad(const std::string& s, size_t width) {
  return s.size() >= width ? s : s + std::string(width - s.size(), ' ');
}

constexpr size_t kMaxFiguresWidth = 80;

// The parameters that tell cases apart, in declaration order: every axis, and the sizes set
// to something other than their default ("-" when none). --json carries all of them.
std::string CaseLabel(const ScenarioInfo& info, const CaseParams& params) {
  std::string label;
  for (const ParamSpec& p : info.params) {
    if (!params.has(p.name)) continue;
    const std::string& value = params.GetString(p.name);
    if (p.kind == ParamKind::kSize && value == p.default_value()) continue;
    label += (label.empty() ? "" : ",") + p.name + "=" + value;
  }
  return label.empty() ? "-" : label;
}

std::string Indent(const std::string& text, const std::string& prefix) {
  std::istringstream in(text);
  std::string out;
  for (std::string line; std::getline(in, line);) out += prefix + line + "\n";
  return out;
}

}  // namespace

Tally CountResults(const std::vector<CaseResult>& results) {
  Tally t;
  for (const auto& r : results) {
    switch (r.status) {
      case CaseStatus::kPassed:
        ++t.passed;
        break;
      case CaseStatus::kFailed:
        ++t.failed;
        break;
      case CaseStatus::kSkipped:
        ++t.skipped;
        break;
    }
  }
  return t;
}

std::string SummaryLine(const Tally& tally) {
  return std::to_string(tally.passed) + " passed, " + std::to_string(tally.failed) + " failed, " +
         std::to_string(tally.skipped) + " skipped";
}

TableWriter::TableWriter(std::ostream& out, const std::vector<PlannedCase>& plan,
                         const std::string& backend)
    : out_(out) {
  backend_width_ = std::max(backend_width_, backend.size());
  for (const auto& pc : plan) {
    infos_[pc.scenario->info.name] = &pc.scenario->info;
    scenario_width_ = std::max(scenario_width_, pc.scenario->info.name.size());
    case_width_ = std::max(case_width_,
                           std::min(kMaxCaseWidth, CaseLabel(pc.scenario->info, pc.params).size()));
  }
}

void TableWriter::Header() {
  out_ << Pad("SCENARIO", scenario_width_) << "  " << Pad("CASE", case_width_) << "  "
       << Pad("BACKEND", backend_width_) << "  WORLD  STATUS  " << Pad("FIGURES", 24) << "  TIME\n";
  out_.flush();
}

void TableWriter::Row(const CaseResult& r) {
  std::string label = r.params.Label();
  if (auto it = infos_.find(r.scenario); it != infos_.end())
    label = CaseLabel(*it->second, r.params);
  if (label.empty()) label = "-";
  if (label.size() > case_width_) label = label.substr(0, case_width_ - 3) + "...";
  const char* status = r.status == CaseStatus::kPassed   ? "PASS  "
                       : r.status == CaseStatus::kFailed ? "FAIL  "
                                                         : "SKIP  ";
  std::string figures = r.status == CaseStatus::kSkipped ? r.skip_reason : r.checks.Summary();
  if (r.status == CaseStatus::kFailed && !r.errors.empty()) {
    figures = std::to_string(r.errors.size()) + " error(s)";
  }
  if (figures.empty()) figures = "-";
  if (r.status != CaseStatus::kSkipped && figures.size() > kMaxFiguresWidth) {
    figures = figures.substr(0, kMaxFiguresWidth - 3) + "...";
  }
  char time[32];
  std::snprintf(time, sizeof(time), "%.2fs", r.seconds);
  std::string world = std::to_string(r.world);
  out_ << Pad(r.scenario, scenario_width_) << "  " << Pad(label, case_width_) << "  "
       << Pad(r.backend, backend_width_) << "  " << Pad(world, 5) << "  " << status << "  "
       << Pad(figures, 24) << "  " << time << "\n";
  if (r.status == CaseStatus::kFailed) {
    for (const auto& e : r.errors) out_ << Indent(e, "    ");
    out_ << r.checks.Table(/*failed_only=*/true);
  }
  out_.flush();
}

std::string SemanticsLine(const std::string& semantics, const std::set<std::string>& others) {
  std::string line = "semantics: " + semantics;
  if (others.empty()) return line;
  line += " (extra default runs of the profile-dependent scenarios:";
  for (const std::string& other : others) line += " " + other;
  return line + ")";
}

nlohmann::json ResultsJson(const std::vector<CaseResult>& results, const std::string& semantics) {
  const Tally t = CountResults(results);
  nlohmann::json cases = nlohmann::json::array();
  for (const auto& r : results) cases.push_back(r.ToJson());
  return {{"version", 1},
          {"semantics", semantics},
          {"summary", {{"passed", t.passed}, {"failed", t.failed}, {"skipped", t.skipped}}},
          {"cases", std::move(cases)}};
}

}  // namespace fsdp::conformance
