// OrderedDict: an insertion-ordered string-keyed map, the C++ counterpart of the Python dicts
// that nn.Module uses for `_parameters`, `_buffers`, `_modules` and state dicts.
//
// Semantics follow Python's dict: assigning to an existing key keeps its position, erasing and
// re-inserting a key moves it to the end, iteration is in insertion order.
// Ownership: owns its values (cheap handles in practice: Tensor, shared_ptr<Module>).
// Thread-safety: none; used by the owning rank's thread.
#pragma once

#include <cstddef>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/core/error.h"

namespace fsdp::nn {

template <typename V>
class OrderedDict {
 public:
  using Item = std::pair<std::string, V>;
  using iterator = typename std::vector<Item>::iterator;
  using const_iterator = typename std::vector<Item>::const_iterator;

  OrderedDict() = default;
  OrderedDict(std::initializer_list<Item> items) {
    for (const auto& item : items) insert(item.first, item.second);
  }

  // Sets `key` to `value`: an existing key keeps its position, a new key is appended.
  V& insert(const std::string& key, V value) {
    auto it = index_.find(key);
    if (it != index_.end()) {
      items_[it->second].second = std::move(value);
      return items_[it->second].second;
    }
    index_.emplace(key, items_.size());
    items_.emplace_back(key, std::move(value));
    return items_.back().second;
  }
  V& operator[](const std::string& key) {
    auto it = index_.find(key);
    if (it != index_.end()) return items_[it->second].second;
    return insert(key, V());
  }

  bool contains(const std::string& key) const { return index_.count(key) != 0; }
  // Pointer to the value, or nullptr when absent.
  V* find(const std::string& key) {
    auto it = index_.find(key);
    return it == index_.end() ? nullptr : &items_[it->second].second;
  }
  const V* find(const std::string& key) const {
    auto it = index_.find(key);
    return it == index_.end() ? nullptr : &items_[it->second].second;
  }
  V& at(const std::string& key) {
    V* v = find(key);
    FSDP_CHECK_CODE(ErrorCode::kNotFound, v != nullptr, "key \"", key, "\" not found");
    return *v;
  }
  const V& at(const std::string& key) const {
    const V* v = find(key);
    FSDP_CHECK_CODE(ErrorCode::kNotFound, v != nullptr, "key \"", key, "\" not found");
    return *v;
  }
  // Removes `key` (no-op when absent). Later items move up by one position.
  bool erase(const std::string& key) {
    auto it = index_.find(key);
    if (it == index_.end()) return false;
    const size_t pos = it->second;
    index_.erase(it);
    items_.erase(items_.begin() + static_cast<std::ptrdiff_t>(pos));
    for (size_t i = pos; i < items_.size(); ++i) index_[items_[i].first] = i;
    return true;
  }
  // Position of `key` in iteration order, or -1.
  std::ptrdiff_t position(const std::string& key) const {
    auto it = index_.find(key);
    return it == index_.end() ? -1 : static_cast<std::ptrdiff_t>(it->second);
  }
  void clear() {
    items_.clear();
    index_.clear();
  }

  size_t size() const { return items_.size(); }
  bool empty() const { return items_.empty(); }
  std::vector<std::string> keys() const {
    std::vector<std::string> out;
    out.reserve(items_.size());
    for (const auto& item : items_) out.push_back(item.first);
    return out;
  }
  const std::vector<Item>& items() const { return items_; }
  iterator begin() { return items_.begin(); }
  iterator end() { return items_.end(); }
  const_iterator begin() const { return items_.begin(); }
  const_iterator end() const { return items_.end(); }

 private:
  std::vector<Item> items_;
  std::unordered_map<std::string, size_t> index_;
};

}  // namespace fsdp::nn
