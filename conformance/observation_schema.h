// ObservationSchema: what one rank of a scenario must report, declared once per scenario and
// used three ways, so that they cannot drift apart:
//   * the runner validates every rank's observations against it before judging (strictly: an
//     undeclared key, a missing required key, a wrong type, or a tensor whose name matches no
//     declared pattern fails the case with DataLoss naming the rank and the key);
//   * `fsdp-conform list --json` and `fsdp-conform schema` print it as JSON Schema (draft
//     2020-12) for drivers;
//   * docs/observations.md is generated from it (`fsdp-conform schema --markdown`), and a test
//     keeps the committed page equal to the generated one.
// Since the engine's own observations pass strict validation in every test run and the judges
// pass on them, a judge cannot read a key the schema does not declare.
//
// A schema holds JSON keys (ObservationKey: a name, a JSON Schema fragment for its value, a
// meaning, required or not) and tensor observations (TensorObservation: a name pattern such as
// "step{k}/{fqn}", the dtype and shape it must have, a meaning). Tensors travel in the
// `tensors` key in process (and in a driver's --tensors-output .safetensors file).
//
// The validator implements the JSON Schema subset the fragments use: type (string or array of
// strings), properties, required, additionalProperties (bool or schema), patternProperties,
// items, prefixItems, minItems, maxItems, enum, minimum.
//
// Thread-safety: immutable values; stateless functions.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace fsdp::conformance {

// One JSON key of the observations.
struct ObservationKey {
  std::string key;
  nlohmann::json schema;  // JSON Schema fragment of its value (with "description")
  bool required = true;   // Default: required

  // The conventional keys (docs/scenarios.md, "observation conventions").
  static ObservationKey CommCounts(const std::string& meaning);
  static ObservationKey Events(const std::string& key, const std::string& meaning);
  static ObservationKey Losses(const std::string& meaning);
  // Plain values.
  static ObservationKey Integer(const std::string& key, const std::string& meaning);
  static ObservationKey Number(const std::string& key, const std::string& meaning);
  static ObservationKey Boolean(const std::string& key, const std::string& meaning);
  static ObservationKey String(const std::string& key, const std::string& meaning);
  static ObservationKey StringList(const std::string& key, const std::string& meaning);
  static ObservationKey NumberList(const std::string& key, const std::string& meaning);
  static ObservationKey IntegerList(const std::string& key, const std::string& meaning);
  // {name: integer}.
  static ObservationKey IntegerMap(const std::string& key, const std::string& meaning);
  // Any schema.
  static ObservationKey Custom(const std::string& key, nlohmann::json schema,
                               const std::string& meaning);
  ObservationKey& Optional() {
    required = false;
    return *this;
  }
};

// A family of named tensors of the observations.
struct TensorObservation {
  // The names, with placeholders: {k} a step number, {fqn} a parameter or buffer FQN
  // (PyTorch's spelling, "" impossible), {name} any name without '/'. E.g. "step{k}/{fqn}".
  std::string pattern;
  std::string dtype;    // the dtype it must have, e.g. "the case's dtype" or "float32"
  std::string shape;    // its shape, in words
  std::string meaning;
  bool required = true;  // at least one tensor must match. Default: true

  // The ECMAScript regular expression of `pattern` (anchored).
  std::string Regex() const;
};

struct ObservationSchema {
  std::vector<ObservationKey> keys;
  std::vector<TensorObservation> tensors;  // empty: the observations hold no `tensors`

  bool empty() const { return keys.empty() && tensors.empty(); }
  ObservationSchema& Add(ObservationKey key);
  ObservationSchema& AddTensors(TensorObservation tensors);

  // The JSON Schema of one rank's observations object.
  nlohmann::json ToJsonSchema() const;
  // Throws DataLoss naming `who` and the key when `observations` do not follow the schema.
  void Validate(const nlohmann::json& observations, const std::string& who) const;
};

// Validates `value` against a JSON Schema fragment of the supported subset; DataLoss naming
// `where` (e.g. "rank 1: forward_events[3]") on the first violation.
void ValidateJsonSchema(const nlohmann::json& schema, const nlohmann::json& value,
                        const std::string& where);

}  // namespace fsdp::conformance
