#include "engine/nn/value.h"

#include <sstream>
#include <unordered_set>

namespace fsdp::nn {

namespace {

std::string FormatDouble(double v) {
  std::ostringstream os;
  os.precision(17);
  os << v;
  std::string s = os.str();
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // Python prints 2.0, not 2
  return s;
}

}  // namespace

Value::Value(Tensor tensor) {
  if (tensor.defined()) {
    kind_ = Kind::kTensor;
    tensor_ = std::move(tensor);
  }
}

Value Value::Bool(bool v) {
  Value out;
  out.kind_ = Kind::kBool;
  out.bool_ = v;
  return out;
}

Value Value::Int(int64_t v) {
  Value out;
  out.kind_ = Kind::kInt;
  out.int_ = v;
  return out;
}

Value Value::Double(double v) {
  Value out;
  out.kind_ = Kind::kDouble;
  out.double_ = v;
  return out;
}

Value Value::String(std::string v) {
  Value out;
  out.kind_ = Kind::kString;
  out.string_ = std::move(v);
  return out;
}

Value Value::List(std::vector<Value> items) {
  Value out;
  out.kind_ = Kind::kList;
  out.items_ = std::move(items);
  return out;
}

Value Value::Tuple(std::vector<Value> items) {
  Value out;
  out.kind_ = Kind::kTuple;
  out.items_ = std::move(items);
  return out;
}

Value Value::NamedTuple(std::string type_name, std::vector<std::string> fields,
                        std::vector<Value> items) {
  FSDP_CHECK(fields.size() == items.size(), "Value::NamedTuple(", type_name, "): ", fields.size(),
             " fields but ", items.size(), " items");
  std::unordered_set<std::string> seen;
  for (const auto& f : fields) {
    FSDP_CHECK(seen.insert(f).second, "Value::NamedTuple(", type_name, "): duplicate field name '",
               f, "'");
  }
  Value out;
  out.kind_ = Kind::kNamedTuple;
  out.string_ = std::move(type_name);
  out.keys_ = std::move(fields);
  out.items_ = std::move(items);
  return out;
}

Value Value::Dict(std::vector<std::pair<std::string, Value>> items) {
  Value out;
  out.kind_ = Kind::kDict;
  std::unordered_set<std::string> seen;
  for (auto& [key, value] : items) {
    FSDP_CHECK(seen.insert(key).second, "Value::Dict: duplicate key '", key, "'");
    out.keys_.push_back(key);
    out.items_.push_back(std::move(value));
  }
  return out;
}

std::string Value::type_name() const {
  switch (kind_) {
    case Kind::kNone:
      return "None";
    case Kind::kTensor:
      return "Tensor";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kDouble:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return "list";
    case Kind::kTuple:
      return "tuple";
    case Kind::kNamedTuple:
      return string_;
    case Kind::kDict:
      return "dict";
  }
  return "?";
}

bool Value::is_container() const {
  return kind_ == Kind::kList || kind_ == Kind::kTuple || kind_ == Kind::kNamedTuple ||
         kind_ == Kind::kDict;
}

const Tensor& Value::tensor() const {
  FSDP_CHECK(kind_ == Kind::kTensor, "Value: expected a Tensor but got ", type_name(), " ", str());
  return tensor_;
}

bool Value::to_bool() const {
  FSDP_CHECK(kind_ == Kind::kBool, "Value: expected a bool but got ", type_name());
  return bool_;
}

int64_t Value::to_int() const {
  FSDP_CHECK(kind_ == Kind::kInt, "Value: expected an int but got ", type_name());
  return int_;
}

double Value::to_double() const {
  FSDP_CHECK(kind_ == Kind::kDouble || kind_ == Kind::kInt, "Value: expected a float but got ",
             type_name());
  return kind_ == Kind::kInt ? static_cast<double>(int_) : double_;
}

const std::string& Value::to_string() const {
  FSDP_CHECK(kind_ == Kind::kString, "Value: expected a str but got ", type_name());
  return string_;
}

size_t Value::size() const {
  FSDP_CHECK(is_container(), "Value: ", type_name(), " has no len()");
  return items_.size();
}

const Value& Value::operator[](size_t index) const {
  FSDP_CHECK(is_container(), "Value: ", type_name(), " is not subscriptable");
  FSDP_CHECK(index < items_.size(), "Value: index ", index, " out of range for a ", type_name(),
             " of size ", items_.size());
  return items_[index];
}

const Value& Value::at(const std::string& key) const {
  FSDP_CHECK(kind_ == Kind::kDict || kind_ == Kind::kNamedTuple, "Value: ", type_name(),
             " has no key '", key, "'");
  for (size_t i = 0; i < keys_.size(); ++i) {
    if (keys_[i] == key) return items_[i];
  }
  FSDP_THROW(ErrorCode::kNotFound, "Value: ", type_name(), " has no ",
             kind_ == Kind::kDict ? "key" : "field", " '", key, "'");
}

bool Value::contains(const std::string& key) const {
  if (kind_ != Kind::kDict && kind_ != Kind::kNamedTuple) return false;
  for (const auto& k : keys_) {
    if (k == key) return true;
  }
  return false;
}

const std::vector<Value>& Value::items() const {
  FSDP_CHECK(is_container(), "Value: ", type_name(), " has no items");
  return items_;
}

const std::vector<std::string>& Value::keys() const {
  FSDP_CHECK(kind_ == Kind::kDict || kind_ == Kind::kNamedTuple, "Value: ", type_name(),
             " has no keys");
  return keys_;
}

const std::string& Value::named_tuple_type() const {
  FSDP_CHECK(kind_ == Kind::kNamedTuple, "Value: expected a named tuple but got ", type_name());
  return string_;
}

void Value::collect(std::vector<Tensor>* out) const {
  if (kind_ == Kind::kTensor) {
    out->push_back(tensor_);
    return;
  }
  for (const auto& item : items_) item.collect(out);
}

std::vector<Tensor> Value::tensors() const {
  std::vector<Tensor> out;
  collect(&out);
  return out;
}

size_t Value::num_tensors() const {
  if (kind_ == Kind::kTensor) return 1;
  size_t n = 0;
  for (const auto& item : items_) n += item.num_tensors();
  return n;
}

Value Value::with_tensors_impl(const std::vector<Tensor>& tensors, size_t* next) const {
  if (kind_ == Kind::kTensor) return Value(tensors[(*next)++]);
  if (!is_container()) return *this;
  Value out = *this;
  for (auto& item : out.items_) item = item.with_tensors_impl(tensors, next);
  return out;
}

Value Value::with_tensors(const std::vector<Tensor>& tensors) const {
  const size_t expected = num_tensors();
  FSDP_CHECK(tensors.size() == expected, "Value::with_tensors: the structure ", str(), " has ",
             expected, " tensor leaves but ", tensors.size(), " tensors were given");
  size_t next = 0;
  return with_tensors_impl(tensors, &next);
}

Value Value::map_tensors(const std::function<Tensor(const Tensor&)>& fn) const {
  std::vector<Tensor> ts = tensors();
  for (auto& t : ts) t = fn(t);
  return with_tensors(ts);
}

bool Value::same_structure(const Value& other) const {
  if (kind_ != other.kind_) return false;
  switch (kind_) {
    case Kind::kNone:
    case Kind::kTensor:
      return true;
    case Kind::kBool:
      return bool_ == other.bool_;
    case Kind::kInt:
      return int_ == other.int_;
    case Kind::kDouble:
      return double_ == other.double_;
    case Kind::kString:
      return string_ == other.string_;
    case Kind::kList:
    case Kind::kTuple:
    case Kind::kNamedTuple:
    case Kind::kDict:
      if (string_ != other.string_ || keys_ != other.keys_ ||
          items_.size() != other.items_.size()) {
        return false;
      }
      for (size_t i = 0; i < items_.size(); ++i) {
        if (!items_[i].same_structure(other.items_[i])) return false;
      }
      return true;
  }
  return false;
}

std::string Value::str() const {
  std::ostringstream os;
  switch (kind_) {
    case Kind::kNone:
      return "None";
    case Kind::kTensor:
      return tensor_.str();
    case Kind::kBool:
      return bool_ ? "True" : "False";
    case Kind::kInt:
      return std::to_string(int_);
    case Kind::kDouble:
      return FormatDouble(double_);
    case Kind::kString:
      return "'" + string_ + "'";
    case Kind::kList:
    case Kind::kTuple:
      os << (kind_ == Kind::kList ? "[" : "(");
      for (size_t i = 0; i < items_.size(); ++i) os << (i ? ", " : "") << items_[i].str();
      if (kind_ == Kind::kTuple && items_.size() == 1) os << ",";
      os << (kind_ == Kind::kList ? "]" : ")");
      return os.str();
    case Kind::kNamedTuple:
      os << string_ << "(";
      for (size_t i = 0; i < items_.size(); ++i) {
        os << (i ? ", " : "") << keys_[i] << "=" << items_[i].str();
      }
      os << ")";
      return os.str();
    case Kind::kDict:
      os << "{";
      for (size_t i = 0; i < items_.size(); ++i) {
        os << (i ? ", " : "") << "'" << keys_[i] << "': " << items_[i].str();
      }
      os << "}";
      return os.str();
  }
  return "?";
}

}  // namespace fsdp::nn
