#include "conformance/observation_schema.h"

#include <cmath>
#include <regex>
#include <set>

#include "engine/core/error.h"

namespace fsdp::conformance {

namespace {

using nlohmann::json;

json Described(json schema, const std::string& meaning) {
  schema["description"] = meaning;
  return schema;
}

json TensorValueSchema(const TensorObservation& t) {
  return {{"type", "object"},
          {"description", t.meaning + " (dtype: " + t.dtype + "; shape: " + t.shape + ")"},
          {"required", {"shape", "dtype", "data"}},
          {"additionalProperties", false},
          {"properties",
           {{"shape", {{"type", "array"}, {"items", {{"type", "integer"}, {"minimum", 0}}}}},
            {"dtype", {{"enum", {"float32", "float64", "float16", "bfloat16", "int64"}}}},
            {"data", {{"type", "array"}, {"items", {{"type", "number"}}}}}}}};
}

// JSON has no NaN or infinity: an in-process observation holding one is as malformed as the
// `null` a JSON writer turns it into, so both backends refuse it the same way.
bool IsNonFinite(const json& v) { return v.is_number_float() && !std::isfinite(v.get<double>()); }

std::string TypeOf(const json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "boolean";
  if (v.is_number_integer()) return "integer";
  if (IsNonFinite(v)) return "a non-finite number (NaN or infinity, which JSON cannot hold)";
  if (v.is_number()) return "number";
  if (v.is_string()) return "string";
  if (v.is_array()) return "array";
  return "object";
}

bool HasType(const json& v, const std::string& type) {
  if (IsNonFinite(v)) return false;
  if (type == "number") return v.is_number();
  if (type == "integer") {
    return v.is_number_integer() ||
           (v.is_number_float() && v.get<double>() == static_cast<double>(static_cast<int64_t>(v.get<double>())));
  }
  return TypeOf(v) == type;
}

[[noreturn]] void Invalid(const std::string& where, const std::string& what) {
  FSDP_THROW(ErrorCode::kDataLoss, where, ": ", what);
}

}  // namespace

ObservationKey ObservationKey::CommCounts(const std::string& meaning) {
  return {"comm_counts",
          Described({{"type", "object"},
                      {"additionalProperties",
                       {{"type", "object"},
                        {"additionalProperties", {{"type", "integer"}, {"minimum", 0}}}}}},
                    meaning),
          true};
}

ObservationKey ObservationKey::Events(const std::string& key, const std::string& meaning) {
  return {key,
          Described({{"type", "array"},
                     {"items",
                      {{"type", "array"},
                       {"prefixItems", {{{"type", "string"}}, {{"type", "string"}}, {{"type", "string"}}}},
                       {"minItems", 3},
                       {"maxItems", 3}}}},
                    meaning + " [[kind, fqn, training_state], ...]"),
          true};
}

ObservationKey ObservationKey::Losses(const std::string& meaning) {
  return {"losses",
          Described({{"type", "array"}, {"items", {{"type", "number"}}}}, meaning), true};
}

ObservationKey ObservationKey::Integer(const std::string& key, const std::string& meaning) {
  return {key, Described({{"type", "integer"}}, meaning), true};
}
ObservationKey ObservationKey::Number(const std::string& key, const std::string& meaning) {
  return {key, Described({{"type", "number"}}, meaning), true};
}
ObservationKey ObservationKey::Boolean(const std::string& key, const std::string& meaning) {
  return {key, Described({{"type", "boolean"}}, meaning), true};
}
ObservationKey ObservationKey::String(const std::string& key, const std::string& meaning) {
  return {key, Described({{"type", "string"}}, meaning), true};
}
ObservationKey ObservationKey::StringList(const std::string& key, const std::string& meaning) {
  return {key, Described({{"type", "array"}, {"items", {{"type", "string"}}}}, meaning), true};
}
ObservationKey ObservationKey::NumberList(const std::string& key, const std::string& meaning) {
  return {key, Described({{"type", "array"}, {"items", {{"type", "number"}}}}, meaning), true};
}
ObservationKey ObservationKey::IntegerList(const std::string& key, const std::string& meaning) {
  return {key, Described({{"type", "array"}, {"items", {{"type", "integer"}}}}, meaning), true};
}
ObservationKey ObservationKey::IntegerMap(const std::string& key, const std::string& meaning) {
  return {key,
          Described({{"type", "object"}, {"additionalProperties", {{"type", "integer"}}}}, meaning),
          true};
}
ObservationKey ObservationKey::Custom(const std::string& key, nlohmann::json schema,
                                      const std::string& meaning) {
  return {key, Described(std::move(schema), meaning), true};
}

std::string TensorObservation::Regex() const {
  std::string out = "^";
  for (size_t i = 0; i < pattern.size();) {
    if (pattern.compare(i, 3, "{k}") == 0) {
      out += "[0-9]+";
      i += 3;
    } else if (pattern.compare(i, 5, "{fqn}") == 0) {
      out += "[A-Za-z0-9_.]+";
      i += 5;
    } else if (pattern.compare(i, 6, "{name}") == 0) {
      out += "[^/]+";
      i += 6;
    } else {
      const char c = pattern[i++];
      if (std::string("\\^$.|?*+()[]{}").find(c) != std::string::npos) out += '\\';
      out += c;
    }
  }
  return out + "$";
}

ObservationSchema& ObservationSchema::Add(ObservationKey key) {
  for (const auto& k : keys) {
    FSDP_CHECK(k.key != key.key, "observation key '", key.key, "' declared twice");
  }
  FSDP_CHECK(key.key != "tensors", "declare tensors with AddTensors, not as a key");
  keys.push_back(std::move(key));
  return *this;
}

ObservationSchema& ObservationSchema::AddTensors(TensorObservation t) {
  tensors.push_back(std::move(t));
  return *this;
}

json ObservationSchema::ToJsonSchema() const {
  json properties = json::object();
  json required = json::array();
  for (const auto& k : keys) {
    properties[k.key] = k.schema;
    if (k.required) required.push_back(k.key);
  }
  if (!tensors.empty()) {
    json patterns = json::object();
    std::string names;
    for (const auto& t : tensors) {
      patterns[t.Regex()] = TensorValueSchema(t);
      names += (names.empty() ? "" : ", ") + t.pattern;
    }
    properties["tensors"] = {
        {"type", "object"},
        {"description", "named tensors (" + names +
                            "); a driver writes them to its --tensors-output .safetensors file"},
        {"patternProperties", patterns},
        {"additionalProperties", false}};
    bool any_required = false;
    for (const auto& t : tensors) any_required = any_required || t.required;
    if (any_required) required.push_back("tensors");
  }
  return {{"$schema", "https://json-schema.org/draft/2020-12/schema"},
          {"type", "object"},
          {"properties", properties},
          {"required", required},
          {"additionalProperties", false}};
}

void ObservationSchema::Validate(const nlohmann::json& observations, const std::string& who) const {
  ValidateJsonSchema(ToJsonSchema(), observations, who);
  if (tensors.empty() || !observations.contains("tensors")) return;
  for (const auto& t : tensors) {
    if (!t.required) continue;
    const std::regex re(t.Regex());
    bool matched = false;
    for (auto it = observations["tensors"].begin(); it != observations["tensors"].end() && !matched;
         ++it) {
      matched = std::regex_match(it.key(), re);
    }
    if (!matched) Invalid(who, "no tensor named like '" + t.pattern + "' (" + t.meaning + ")");
  }
}

namespace {

// Where a value sits ("rank 1.tensors.w.data[3]"), rendered only for an error message: the
// validator visits every item of every tensor and must not build a string for each.
struct JsonPath {
  const JsonPath* parent = nullptr;
  const std::string* key = nullptr;  // the object key, or nullptr for an array index
  size_t index = 0;
  const std::string* root = nullptr;  // set on the root only

  std::string Render() const {
    if (parent == nullptr) return *root;
    return parent->Render() + (key != nullptr ? "." + *key : "[" + std::to_string(index) + "]");
  }
};

// The type of a schema that says nothing but its type (and a description), else nullptr.
const std::string* OnlyType(const json& schema) {
  if (!schema.is_object() || !schema.contains("type") || !schema["type"].is_string()) {
    return nullptr;
  }
  for (auto it = schema.begin(); it != schema.end(); ++it) {
    if (it.key() != "type" && it.key() != "description") return nullptr;
  }
  return schema["type"].get_ptr<const std::string*>();
}

void ValidateAt(const json& schema, const json& value, const JsonPath& at) {
  if (schema.contains("type")) {
    const json& type = schema["type"];
    bool ok = false;
    if (type.is_string()) {
      ok = HasType(value, type.get_ref<const std::string&>());
    } else {
      for (const auto& t : type) ok = ok || HasType(value, t.get_ref<const std::string&>());
    }
    if (!ok) {
      std::string expected;
      for (const auto& t : type.is_string() ? json::array({type}) : type) {
        expected += (expected.empty() ? "" : " or ") + t.get<std::string>();
      }
      Invalid(at.Render(),
              "expected " + expected + ", got " + TypeOf(value) + " " + value.dump().substr(0, 80));
    }
  }
  if (schema.contains("enum")) {
    bool ok = false;
    for (const auto& e : schema["enum"]) ok = ok || e == value;
    if (!ok) Invalid(at.Render(), value.dump() + " is not one of " + schema["enum"].dump());
  }
  if (schema.contains("minimum") && value.is_number() &&
      value.get<double>() < schema["minimum"].get<double>()) {
    Invalid(at.Render(), value.dump() + " is below the minimum " + schema["minimum"].dump());
  }
  if (value.is_object()) {
    const json empty = json::object();
    const json& properties = schema.contains("properties") ? schema["properties"] : empty;
    if (schema.contains("required")) {
      for (const auto& r : schema["required"]) {
        const std::string key = r.get<std::string>();
        if (!value.contains(key)) {
          Invalid(at.Render(),
                  "missing required key '" + key + "'" +
                      (properties.contains(key) && properties[key].contains("description")
                           ? " (" + properties[key]["description"].get<std::string>() + ")"
                           : ""));
        }
      }
    }
    std::vector<std::pair<std::regex, const json*>> patterns;
    if (schema.contains("patternProperties")) {
      for (auto it = schema["patternProperties"].begin(); it != schema["patternProperties"].end();
           ++it) {
        patterns.emplace_back(std::regex(it.key()), &it.value());
      }
    }
    for (auto it = value.begin(); it != value.end(); ++it) {
      const std::string& key = it.key();
      const JsonPath child{&at, &key, 0};
      if (properties.contains(key)) {
        ValidateAt(properties[key], it.value(), child);
        continue;
      }
      bool matched = false;
      for (const auto& [re, sub] : patterns) {
        if (std::regex_match(key, re)) {
          ValidateAt(*sub, it.value(), child);
          matched = true;
          break;
        }
      }
      if (matched) continue;
      if (schema.contains("additionalProperties")) {
        const json& extra = schema["additionalProperties"];
        if (extra.is_boolean()) {
          if (!extra.get<bool>()) {
            std::string declared;
            for (auto p = properties.begin(); p != properties.end(); ++p) {
              declared += (declared.empty() ? "" : ", ") + p.key();
            }
            Invalid(at.Render(), "undeclared key '" + key + "'" +
                                     (declared.empty() ? "" : " (declared: " + declared + ")"));
          }
        } else {
          ValidateAt(extra, it.value(), child);
        }
      }
    }
  }
  if (value.is_array()) {
    if (schema.contains("minItems") && value.size() < schema["minItems"].get<size_t>()) {
      Invalid(at.Render(), "has " + std::to_string(value.size()) + " items, fewer than " +
                               schema["minItems"].dump());
    }
    if (schema.contains("maxItems") && value.size() > schema["maxItems"].get<size_t>()) {
      Invalid(at.Render(), "has " + std::to_string(value.size()) + " items, more than " +
                               schema["maxItems"].dump());
    }
    size_t first = 0;
    if (schema.contains("prefixItems")) {
      const json& prefix = schema["prefixItems"];
      for (size_t i = 0; i < prefix.size() && i < value.size(); ++i) {
        ValidateAt(prefix[i], value[i], JsonPath{&at, nullptr, i});
      }
      first = prefix.size();
    }
    if (schema.contains("items")) {
      const json& items = schema["items"];
      // Tensor data: thousands of numbers checked by type alone, without a path per item; the
      // first item that fails is validated again below for its message.
      const std::string* only_type = OnlyType(items);
      for (size_t i = first; i < value.size(); ++i) {
        if (only_type != nullptr && HasType(value[i], *only_type)) continue;
        ValidateAt(items, value[i], JsonPath{&at, nullptr, i});
      }
    }
  }
}

}  // namespace

void ValidateJsonSchema(const nlohmann::json& schema, const nlohmann::json& value,
                        const std::string& where) {
  ValidateAt(schema, value, JsonPath{nullptr, nullptr, 0, &where});
}

}  // namespace fsdp::conformance
