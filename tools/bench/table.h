// Table: benchmark results as columns and rows, rendered as an aligned text table (the way
// nccl-tests prints, with a `#` header line and a units line) and as JSON (an array of
// objects keyed by column key). Shared by pg-bench and the other benchmark programs.
//
//   Table t({{"size", "size", "(B)"}, {"time_us", "time", "(us)", 2}, {"type", "type"}});
//   t.AddRow({int64_t{1024}, 12.5, std::string("float")});
//   std::cout << t.ToText();
//   nlohmann::json rows = t.ToJson();   // [{"size":1024,"time_us":12.5,"type":"float"}]
//
// Cells are integers, doubles (printed with the column's precision; JSON keeps full
// precision), strings, or empty (printed as "-", JSON null). Numbers are right-aligned,
// strings too unless the column says left-aligned.
//
// Ownership: a value type. Thread-safety: none (use from one thread).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <variant>
#include <vector>

namespace fsdp::bench {

struct TableColumn {
  std::string key;          // JSON key; also the header when `header` is empty
  std::string header;       // text header. Default: "" (the key)
  std::string unit;         // text units line, e.g. "(B)", "(GB/s)". Default: "" (blank)
  int precision = 2;        // digits after the point for double cells. Default: 2
  bool left_align = false;  // Default: false (right-aligned)
};

using TableCell = std::variant<std::monostate, int64_t, double, std::string>;

class Table {
 public:
  explicit Table(std::vector<TableColumn> columns);

  // Appends a row; throws InvalidArgument when it has a different number of cells than
  // there are columns.
  void AddRow(std::vector<TableCell> row);

  const std::vector<TableColumn>& columns() const { return columns_; }
  const std::vector<std::vector<TableCell>>& rows() const { return rows_; }
  // Index of the column with `key`; throws NotFound.
  size_t ColumnIndex(const std::string& key) const;

  // The aligned text: a header line starting with "#", a units line when any column has a
  // unit, then one line per row; every line is prefixed by `indent` and ends with '\n'.
  std::string ToText(const std::string& indent = "") const;
  // [{key: value, ...}, ...] in row order.
  nlohmann::json ToJson() const;
  // One cell as its text form (the precision of `column`).
  static std::string FormatCell(const TableCell& cell, const TableColumn& column);

 private:
  std::vector<TableColumn> columns_;
  std::vector<std::vector<TableCell>> rows_;
};

}  // namespace fsdp::bench
