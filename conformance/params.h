// Scenario parameters: the declared parameters of a scenario (ParamSpec), one resolved
// combination of values (CaseParams), and the expansion of a scenario's axes into cases.
//
// A scenario mirrors a seed test. The seed's parametrization axes (`run_subtests` configs,
// `@parametrize`) are AXIS parameters: they list the seed's values, and a run that does not fix
// an axis runs every value (the cartesian product over all unfixed axes, each combination one
// "case"). Sizes the seed hard-codes (layers, dims, batch, iterations) are SIZE parameters with
// the seed's value as the single default. Values are kept as strings, spelled as the seed
// spells them ("True", "False", "2", "separate"), and read through typed getters. A parameter
// may declare a DOMAIN, every value of its type: an axis with a domain still runs its listed
// values by default and accepts any value of the domain when fixed; a size with a domain
// accepts exactly the domain.
//
// Thread-safety: value types; const member functions are safe to call concurrently.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace fsdp::conformance {

enum class ParamKind {
  kAxis,  // the seed's values; all are run unless fixed by --param
  kSize,  // one default value; any value of `type` is accepted by --param
};

// The value type a SIZE parameter accepts (axes accept exactly their listed values).
enum class ParamType { kInt, kDouble, kBool, kString };

const char* ParamKindName(ParamKind kind);  // "axis", "size"
const char* ParamTypeName(ParamType type);  // "int", "double", "bool", "string"

// The values a parameter accepts (see the file comment), e.g. reshard_after_forward's "True,
// False, None or an int >= 1".
struct ParamDomain {
  std::string text;  // the accepted values in words, for `list` and error messages
  // The canonical spelling of `value` ("true" -> "True", "02" -> "2"), or nullopt when the
  // domain does not contain it. Must be pure (called from any thread).
  std::function<std::optional<std::string>(const std::string& value)> canonicalize;
};

// One declared parameter of a scenario.
struct ParamSpec {
  std::string name;                     // e.g. "reshard_after_forward"; [A-Za-z0-9_] only
  std::string description;              // one line for `fsdp-conform list`
  ParamKind kind = ParamKind::kAxis;    // Default: axis
  ParamType type = ParamType::kString;  // Default: string; used to validate SIZE values
  // AXIS: the seed's values in the seed's order (at least one). SIZE: exactly one, the default.
  std::vector<std::string> values;
  // Every accepted value (see ParamDomain). Default: none (an axis accepts exactly `values`, a
  // size any value of `type`).
  std::optional<ParamDomain> domain;

  static ParamSpec Axis(std::string name, std::string description, std::vector<std::string> values);
  // An int size accepting any int >= `minimum` (Default: 0: a count, a length,
  // a seed); nullopt accepts negative ints too (a root rank counted from the
  // end). The default must be in range.
  static ParamSpec SizeInt(std::string name, std::string description, int64_t default_value,
                           std::optional<int64_t> minimum = 0);
  static ParamSpec SizeDouble(std::string name, std::string description, double default_value);
  static ParamSpec SizeBool(std::string name, std::string description, bool default_value);
  static ParamSpec SizeString(std::string name, std::string description, std::string default_value);

  // The default of a SIZE parameter; the first value of an axis.
  const std::string& default_value() const { return values.front(); }
  // "True|False|2" for an axis ("True|False|2 (accepts True, False, None or an int >= 1)"
  // with a domain); "int, default 2" for a size ("torch-2.4 or torch-2.8, default torch-2.4"
  // with a domain).
  std::string ValuesText() const;
  // Validates a user-supplied value and returns it in canonical form (for an axis, the listed
  // spelling: "true" becomes "True" when "True" is listed; otherwise the domain's spelling).
  // Throws InvalidArgument naming the parameter and its valid values.
  std::string Canonicalize(const std::string& value) const;
};

// `params` with the spec named like `spec` replaced by it (e.g. a family's own default for a
// zoo model's parameter, or an axis fixed to the seed's value). Throws Internal when there is
// none.
std::vector<ParamSpec> OverrideParam(std::vector<ParamSpec> params, ParamSpec spec);

// Checks a scenario's parameter list (unique names, valid identifiers, values present, SIZE
// defaults of their type). Throws InvalidArgument naming `scenario` and the parameter.
void ValidateParamSpecs(const std::string& scenario, const std::vector<ParamSpec>& specs);

// One resolved case: every parameter of the scenario mapped to one value.
class CaseParams {
 public:
  CaseParams() = default;
  explicit CaseParams(std::map<std::string, std::string> values) : values_(std::move(values)) {}

  bool has(const std::string& key) const { return values_.count(key) != 0; }
  const std::map<std::string, std::string>& values() const { return values_; }
  void set(const std::string& key, std::string value) { values_[key] = std::move(value); }

  // Typed getters. Each throws InvalidArgument naming the key when the value does not parse,
  // and NotFound listing the available keys when the key is absent.
  const std::string& GetString(const std::string& key) const;
  int64_t GetInt(const std::string& key) const;
  double GetDouble(const std::string& key) const;
  // Accepts true/false, True/False, TRUE/FALSE and 1/0.
  bool GetBool(const std::string& key) const;
  // True when the value parses as a bool (e.g. reshard_after_forward's True/False next to 2).
  bool IsBool(const std::string& key) const;

  // "k1=v1,k2=v2" in key order; "" for no parameters. Used as the case label.
  std::string Label() const;

  bool operator==(const CaseParams& other) const { return values_ == other.values_; }

 private:
  std::map<std::string, std::string> values_;
};

// Parses "true"/"false"/"True"/"False"/"TRUE"/"FALSE"/"1"/"0"; nullopt otherwise.
std::optional<bool> ParseBool(const std::string& text);
// Strict integer/double parsing of the whole string; nullopt otherwise.
std::optional<int64_t> ParseInt(const std::string& text);
std::optional<double> ParseDouble(const std::string& text);

// Splits "KEY=VALUE" (as given to --param). Throws InvalidArgument on a missing '=' or key.
std::pair<std::string, std::string> ParseParamAssignment(const std::string& text);

// The cases of a scenario: every combination of its axes in declaration order (the last axis
// varies fastest, like nested loops over the seed's config), with `fixed` values overriding
// (a fixed axis contributes its one value; a fixed size replaces the default). Every key in
// `fixed` must be a declared parameter and every value valid (canonicalised here); errors
// name the scenario and list its parameters.
std::vector<CaseParams> ExpandCases(const std::string& scenario,
                                    const std::vector<ParamSpec>& specs,
                                    const std::map<std::string, std::string>& fixed);

}  // namespace fsdp::conformance
