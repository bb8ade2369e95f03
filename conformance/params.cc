#include "conformance/params.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <set>
#include <sstream>

#include "engine/core/error.h"

namespace fsdp::conformance {

namespace {

bool IsIdentifier(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  }
  return true;
}

std::string JoinValues(const std::vector<std::string>& values, const char* sep) {
  std::string out;
  for (size_t i = 0; i < values.size(); ++i) {
    if (i) out += sep;
    out += values[i];
  }
  return out;
}

// The shortest decimal that reads back as `v` ("1e-05", not "1.0000000000000001e-05").
std::string FormatDouble(double v) {
  std::string text;
  for (int precision = 1; precision <= 17; ++precision) {
    std::ostringstream os;
    os.precision(precision);
    os << v;
    text = os.str();
    if (std::strtod(text.c_str(), nullptr) == v) break;
  }
  return text;
}

std::string ParamNames(const std::vector<ParamSpec>& specs) {
  if (specs.empty()) return "(it has no parameters)";
  std::vector<std::string> names;
  for (const auto& s : specs) names.push_back(s.name + " (" + s.ValuesText() + ")");
  return JoinValues(names, ", ");
}

}  // namespace

const char* ParamKindName(ParamKind kind) {
  switch (kind) {
    case ParamKind::kAxis:
      return "axis";
    case ParamKind::kSize:
      return "size";
  }
  return "?";
}

const char* ParamTypeName(ParamType type) {
  switch (type) {
    case ParamType::kInt:
      return "int";
    case ParamType::kDouble:
      return "double";
    case ParamType::kBool:
      return "bool";
    case ParamType::kString:
      return "string";
  }
  return "?";
}

std::optional<bool> ParseBool(const std::string& text) {
  if (text == "true" || text == "True" || text == "TRUE" || text == "1") return true;
  if (text == "false" || text == "False" || text == "FALSE" || text == "0") return false;
  return std::nullopt;
}

std::optional<int64_t> ParseInt(const std::string& text) {
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0]))) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || end != text.c_str() + text.size()) return std::nullopt;
  return static_cast<int64_t>(v);
}

std::optional<double> ParseDouble(const std::string& text) {
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0]))) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  if (errno != 0 || end != text.c_str() + text.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

ParamSpec ParamSpec::Axis(std::string name, std::string description,
                          std::vector<std::string> values) {
  ParamSpec s;
  s.name = std::move(name);
  s.description = std::move(description);
  s.kind = ParamKind::kAxis;
  s.type = ParamType::kString;
  s.values = std::move(values);
  return s;
}

ParamSpec ParamSpec::SizeInt(std::string name, std::string description, int64_t default_value,
                             std::optional<int64_t> minimum) {
  ParamSpec s;
  s.name = std::move(name);
  s.description = std::move(description);
  s.kind = ParamKind::kSize;
  s.type = ParamType::kInt;
  s.values = {std::to_string(default_value)};
  if (minimum) {
    const int64_t lo = *minimum;
    s.domain = ParamDomain{"an int >= " + std::to_string(lo),
                           [lo](const std::string& value) -> std::optional<std::string> {
                             const std::optional<int64_t> v = ParseInt(value);
                             if (!v || *v < lo) return std::nullopt;
                             return std::to_string(*v);
                           }};
  }
  return s;
}

ParamSpec ParamSpec::SizeDouble(std::string name, std::string description, double default_value) {
  ParamSpec s;
  s.name = std::move(name);
  s.description = std::move(description);
  s.kind = ParamKind::kSize;
  s.type = ParamType::kDouble;
  s.values = {FormatDouble(default_value)};
  return s;
}

ParamSpec ParamSpec::SizeBool(std::string name, std::string description, bool default_value) {
  ParamSpec s;
  s.name = std::move(name);
  s.description = std::move(description);
  s.kind = ParamKind::kSize;
  s.type = ParamType::kBool;
  s.values = {default_value ? "True" : "False"};
  return s;
}

ParamSpec ParamSpec::SizeString(std::string name, std::string description,
                                std::string default_value) {
  ParamSpec s;
  s.name = std::move(name);
  s.description = std::move(description);
  s.kind = ParamKind::kSize;
  s.type = ParamType::kString;
  s.values = {std::move(default_value)};
  return s;
}

std::string ParamSpec::ValuesText() const {
  if (kind == ParamKind::kAxis) {
    const std::string listed = JoinValues(values, "|");
    return domain ? listed + " (accepts " + domain->text + ")" : listed;
  }
  if (domain) return domain->text + ", default " + default_value();
  return std::string(ParamTypeName(type)) + ", default " + default_value();
}

std::string ParamSpec::Canonicalize(const std::string& value) const {
  if (kind == ParamKind::kAxis) {
    for (const auto& v : values) {
      if (v == value) return v;
    }
    // Bool spellings match the listed bool ("true" -> "True"); digits never do, so that
    // reshard_after_forward=1 is not mistaken for True.
    const bool is_word_bool = ParseBool(value).has_value() && value != "1" && value != "0";
    if (is_word_bool) {
      for (const auto& v : values) {
        const bool listed_word_bool = ParseBool(v).has_value() && v != "1" && v != "0";
        if (listed_word_bool && *ParseBool(v) == *ParseBool(value)) return v;
      }
    }
    if (domain) {
      if (std::optional<std::string> canonical = domain->canonicalize(value)) return *canonical;
      FSDP_THROW(ErrorCode::kInvalidArgument, "parameter '", name, "' has no value '", value,
                 "'; it accepts ", domain->text, " (by default it runs ",
                 JoinValues(values, ", "), ")");
    }
    FSDP_THROW(ErrorCode::kInvalidArgument, "parameter '", name, "' has no value '", value,
               "'; valid values: ", JoinValues(values, ", "));
  }
  if (domain) {
    if (std::optional<std::string> canonical = domain->canonicalize(value)) return *canonical;
    FSDP_THROW(ErrorCode::kInvalidArgument, "parameter '", name, "' takes ", domain->text,
               "; got '", value, "' (default ", default_value(), ")");
  }
  switch (type) {
    case ParamType::kInt:
      FSDP_CHECK(ParseInt(value).has_value(), "parameter '", name, "' takes an int; got '", value,
                 "' (default ", default_value(), ")");
      return std::to_string(*ParseInt(value));
    case ParamType::kDouble:
      FSDP_CHECK(ParseDouble(value).has_value(), "parameter '", name,
                 "' takes a finite number; got '", value, "' (default ", default_value(), ")");
      return value;
    case ParamType::kBool:
      FSDP_CHECK(ParseBool(value).has_value(), "parameter '", name,
                 "' takes a bool (true/false/True/False/1/0); got '", value, "' (default ",
                 default_value(), ")");
      return *ParseBool(value) ? "True" : "False";
    case ParamType::kString:
      FSDP_CHECK(!value.empty(), "parameter '", name, "' takes a non-empty string (default ",
                 default_value(), ")");
      return value;
  }
  return value;
}

std::vector<ParamSpec> OverrideParam(std::vector<ParamSpec> params, ParamSpec spec) {
  for (ParamSpec& p : params) {
    if (p.name == spec.name) {
      p = std::move(spec);
      return params;
    }
  }
  FSDP_THROW(ErrorCode::kInternal, "no parameter '", spec.name, "' to override");
}

void ValidateParamSpecs(const std::string& scenario, const std::vector<ParamSpec>& specs) {
  std::set<std::string> seen;
  for (const auto& s : specs) {
    FSDP_CHECK(IsIdentifier(s.name), "scenario ", scenario, ": parameter name '", s.name,
               "' must be non-empty and use only letters, digits and '_'");
    FSDP_CHECK(seen.insert(s.name).second, "scenario ", scenario, ": parameter '", s.name,
               "' is declared twice");
    FSDP_CHECK(!s.values.empty(), "scenario ", scenario, ": parameter '", s.name,
               "' lists no values");
    if (s.kind == ParamKind::kSize) {
      FSDP_CHECK(s.values.size() == 1, "scenario ", scenario, ": size parameter '", s.name,
                 "' must have exactly one default value, has ", s.values.size());
      s.Canonicalize(s.values.front());
    } else {
      std::set<std::string> distinct(s.values.begin(), s.values.end());
      FSDP_CHECK(distinct.size() == s.values.size(), "scenario ", scenario, ": axis '", s.name,
                 "' lists a value twice: ", JoinValues(s.values, ", "));
      for (const auto& v : s.values) {
        FSDP_CHECK(!v.empty() && v.find_first_of(",=") == std::string::npos, "scenario ", scenario,
                   ": axis '", s.name, "' value '", v,
                   "' must be non-empty and contain neither ',' nor '='");
      }
    }
    if (s.domain) {
      FSDP_CHECK(static_cast<bool>(s.domain->canonicalize) && !s.domain->text.empty(),
                 "scenario ", scenario, ": parameter '", s.name,
                 "' has a domain without text or canonicalize function");
      for (const auto& v : s.values) {
        const std::optional<std::string> canonical = s.domain->canonicalize(v);
        FSDP_CHECK(canonical.has_value() && *canonical == v, "scenario ", scenario,
                   ": parameter '", s.name, "' lists '", v, "', which its domain (",
                   s.domain->text, ") does not spell that way");
      }
    }
  }
}

const std::string& CaseParams::GetString(const std::string& key) const {
  auto it = values_.find(key);
  if (it == values_.end()) {
    std::vector<std::string> keys;
    for (const auto& [k, v] : values_) keys.push_back(k);
    FSDP_THROW(ErrorCode::kNotFound, "case parameter '", key, "' does not exist; parameters: ",
               keys.empty() ? std::string("(none)") : JoinValues(keys, ", "));
  }
  return it->second;
}

int64_t CaseParams::GetInt(const std::string& key) const {
  const std::string& v = GetString(key);
  auto parsed = ParseInt(v);
  FSDP_CHECK(parsed.has_value(), "case parameter '", key, "' = '", v, "' is not an int");
  return *parsed;
}

double CaseParams::GetDouble(const std::string& key) const {
  const std::string& v = GetString(key);
  auto parsed = ParseDouble(v);
  FSDP_CHECK(parsed.has_value(), "case parameter '", key, "' = '", v, "' is not a number");
  return *parsed;
}

bool CaseParams::GetBool(const std::string& key) const {
  const std::string& v = GetString(key);
  auto parsed = ParseBool(v);
  FSDP_CHECK(parsed.has_value(), "case parameter '", key, "' = '", v,
             "' is not a bool (valid: true, false, True, False, 1, 0)");
  return *parsed;
}

bool CaseParams::IsBool(const std::string& key) const {
  return ParseBool(GetString(key)).has_value();
}

std::string CaseParams::Label() const {
  std::string out;
  for (const auto& [k, v] : values_) {
    if (!out.empty()) out += ",";
    out += k + "=" + v;
  }
  return out;
}

std::pair<std::string, std::string> ParseParamAssignment(const std::string& text) {
  const size_t eq = text.find('=');
  FSDP_CHECK(eq != std::string::npos, "--param expects KEY=VALUE, got '", text, "'");
  std::string key = text.substr(0, eq);
  std::string value = text.substr(eq + 1);
  FSDP_CHECK(IsIdentifier(key),
             "--param expects KEY=VALUE with a key of letters, digits and "
             "'_', got '",
             text, "'");
  FSDP_CHECK(!value.empty(), "--param ", key, "= has an empty value");
  return {key, value};
}

std::vector<CaseParams> ExpandCases(const std::string& scenario,
                                    const std::vector<ParamSpec>& specs,
                                    const std::map<std::string, std::string>& fixed) {
  std::map<std::string, std::string> canonical;
  for (const auto& [key, value] : fixed) {
    const ParamSpec* spec = nullptr;
    for (const auto& s : specs) {
      if (s.name == key) spec = &s;
    }
    FSDP_CHECK(spec != nullptr, "scenario ", scenario, " has no parameter '", key,
               "'; its parameters: ", ParamNames(specs));
    try {
      canonical[key] = spec->Canonicalize(value);
    } catch (const Error& e) {
      FSDP_THROW(e.code(), "scenario ", scenario, ": ", e.message());
    }
  }
  // Each parameter's choices, then every combination built once (mixed radix, the last
  // parameter varying fastest), rather than copying partial cases once per parameter.
  std::vector<std::vector<std::string>> choices;
  choices.reserve(specs.size());
  size_t total = 1;
  for (const auto& s : specs) {
    if (auto it = canonical.find(s.name); it != canonical.end()) {
      choices.push_back({it->second});
    } else if (s.kind == ParamKind::kAxis) {
      choices.push_back(s.values);
    } else {
      choices.push_back({s.default_value()});
    }
    total *= choices.back().size();
  }
  std::vector<CaseParams> cases;
  cases.reserve(total);
  std::vector<size_t> digit(specs.size(), 0);
  for (size_t k = 0; k < total; ++k) {
    std::map<std::string, std::string> values;
    for (size_t i = 0; i < specs.size(); ++i) values[specs[i].name] = choices[i][digit[i]];
    cases.emplace_back(std::move(values));
    for (size_t i = specs.size(); i-- > 0;) {
      if (++digit[i] < choices[i].size()) break;
      digit[i] = 0;
    }
  }
  return cases;
}

}  // namespace fsdp::conformance
