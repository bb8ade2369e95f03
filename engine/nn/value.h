// Value: the activations that flow through Module::operator(), as a tree (PyTorch's pytree).
//
// A Value is None, a Tensor, a scalar leaf (bool, int, double, string) or a container: list,
// tuple, named tuple (type name + field names, like collections.namedtuple) or dict (string
// keys in insertion order). FSDP and activation checkpointing need every tensor of a module's
// inputs and outputs: tensors() flattens them in depth-first order (dicts and named tuples in
// key/field order, as torch.utils._pytree does), and with_tensors() rebuilds the same
// structure around replacement tensors.
//
// Ownership: a value type; copies share the Tensor handles (a copy names the same tensors) and
// copy the container structure. Thread-safety: none; a Value belongs to one rank's thread.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/tensor.h"

namespace fsdp::nn {

class Value {
 public:
  enum class Kind : uint8_t {
    kNone,
    kTensor,
    kBool,
    kInt,
    kDouble,
    kString,
    kList,
    kTuple,
    kNamedTuple,
    kDict,
  };

  // None.
  Value() = default;
  // A tensor leaf. An undefined Tensor becomes None (PyTorch's "None" gradient/parameter).
  Value(Tensor tensor);  // NOLINT(google-explicit-constructor): Tensor → Value is the common case

  static Value None() { return Value(); }
  static Value Bool(bool v);
  static Value Int(int64_t v);
  static Value Double(double v);
  static Value String(std::string v);
  static Value List(std::vector<Value> items);
  static Value Tuple(std::vector<Value> items);
  // collections.namedtuple(type_name, fields)(*items): one item per field.
  static Value NamedTuple(std::string type_name, std::vector<std::string> fields,
                          std::vector<Value> items);
  // A dict with string keys in the given order; keys must be unique.
  static Value Dict(std::vector<std::pair<std::string, Value>> items);

  Kind kind() const { return kind_; }
  // "None", "Tensor", "bool", "int", "float", "str", "list", "tuple", the named tuple's type
  // name, "dict" (Python's type names).
  std::string type_name() const;
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_tensor() const { return kind_ == Kind::kTensor; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_tuple() const { return kind_ == Kind::kTuple; }
  bool is_named_tuple() const { return kind_ == Kind::kNamedTuple; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  // List, tuple, named tuple or dict.
  bool is_container() const;

  // Leaf accessors; each checks the kind and names the actual one on mismatch.
  const Tensor& tensor() const;
  bool to_bool() const;
  int64_t to_int() const;
  double to_double() const;  // int or double
  const std::string& to_string() const;

  // Containers: number of items, item by position (dict: value at that position), item by
  // key (dict key or named-tuple field), keys (dict keys or named-tuple field names).
  size_t size() const;
  const Value& operator[](size_t index) const;
  const Value& at(const std::string& key) const;
  bool contains(const std::string& key) const;
  const std::vector<Value>& items() const;
  const std::vector<std::string>& keys() const;
  // The named tuple's type name (e.g. "NT").
  const std::string& named_tuple_type() const;

  // Pytree: all tensor leaves in depth-first order.
  std::vector<Tensor> tensors() const;
  size_t num_tensors() const;
  // The same structure with the tensor leaves replaced, in tensors() order. `tensors` must
  // have num_tensors() entries.
  Value with_tensors(const std::vector<Tensor>& tensors) const;
  // The same structure with every tensor leaf t replaced by fn(t).
  Value map_tensors(const std::function<Tensor(const Tensor&)>& fn) const;
  // Same kinds, container sizes, keys and type names everywhere, and equal scalar leaves
  // (tensor leaves match any tensor).
  bool same_structure(const Value& other) const;

  // Python-like rendering: "None", "Tensor([2, 3], float32, cpu)", "[1, 2.5]", "(x,)",
  // "NT(a=1, b=None)", "{'k': True}".
  std::string str() const;

 private:
  Value with_tensors_impl(const std::vector<Tensor>& tensors, size_t* next) const;
  void collect(std::vector<Tensor>* out) const;

  Kind kind_ = Kind::kNone;
  Tensor tensor_;
  bool bool_ = false;
  int64_t int_ = 0;
  double double_ = 0.0;
  std::string string_;  // string leaf, or the named tuple's type name
  std::vector<Value> items_;
  std::vector<std::string> keys_;  // dict keys or named-tuple field names
};

}  // namespace fsdp::nn
