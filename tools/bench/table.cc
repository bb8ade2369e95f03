#include "tools/bench/table.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "engine/core/error.h"

namespace fsdp::bench {

Table::Table(std::vector<TableColumn> columns) : columns_(std::move(columns)) {
  FSDP_CHECK(!columns_.empty(), "Table: needs at least one column");
  for (size_t i = 0; i < columns_.size(); ++i) {
    FSDP_CHECK(!columns_[i].key.empty(), "Table: column ", i, " has an empty key");
    FSDP_CHECK(columns_[i].precision >= 0 && columns_[i].precision <= 17, "Table: column '",
               columns_[i].key, "' has precision ", columns_[i].precision, " (0..17)");
    for (size_t j = 0; j < i; ++j) {
      FSDP_CHECK(columns_[j].key != columns_[i].key, "Table: duplicate column key '",
                 columns_[i].key, "'");
    }
  }
}

void Table::AddRow(std::vector<TableCell> row) {
  FSDP_CHECK(row.size() == columns_.size(), "Table::AddRow: row has ", row.size(),
             " cells but the table has ", columns_.size(), " columns");
  rows_.push_back(std::move(row));
}

size_t Table::ColumnIndex(const std::string& key) const {
  for (size_t i = 0; i < columns_.size(); ++i) {
    if (columns_[i].key == key) return i;
  }
  FSDP_THROW(ErrorCode::kNotFound, "Table: no column '", key, "'");
}

std::string Table::FormatCell(const TableCell& cell, const TableColumn& column) {
  if (std::holds_alternative<int64_t>(cell)) return std::to_string(std::get<int64_t>(cell));
  if (std::holds_alternative<std::string>(cell)) return std::get<std::string>(cell);
  if (std::holds_alternative<double>(cell)) {
    const double v = std::get<double>(cell);
    if (std::isnan(v)) return "nan";
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.*f", column.precision, v);
    return buf;
  }
  return "-";
}

std::string Table::ToText(const std::string& indent) const {
  const size_t n = columns_.size();
  std::vector<std::vector<std::string>> text(rows_.size(), std::vector<std::string>(n));
  std::vector<size_t> width(n, 0);
  bool any_unit = false;
  for (size_t c = 0; c < n; ++c) {
    const auto& col = columns_[c];
    width[c] = std::max((col.header.empty() ? col.key : col.header).size(), col.unit.size());
    any_unit = any_unit || !col.unit.empty();
  }
  for (size_t r = 0; r < rows_.size(); ++r) {
    for (size_t c = 0; c < n; ++c) {
      text[r][c] = FormatCell(rows_[r][c], columns_[c]);
      width[c] = std::max(width[c], text[r][c].size());
    }
  }
  auto line = [&](const std::vector<std::string>& cells, char lead) {
    std::string s = indent;
    s += lead;
    for (size_t c = 0; c < n; ++c) {
      const std::string& t = cells[c];
      const std::string pad(width[c] - std::min(width[c], t.size()), ' ');
      s += "  ";
      s += columns_[c].left_align ? t + pad : pad + t;
    }
    while (!s.empty() && s.back() == ' ') s.pop_back();
    return s + "\n";
  };
  std::vector<std::string> headers(n), units(n);
  for (size_t c = 0; c < n; ++c) {
    headers[c] = columns_[c].header.empty() ? columns_[c].key : columns_[c].header;
    units[c] = columns_[c].unit;
  }
  std::string out = line(headers, '#');
  if (any_unit) out += line(units, '#');
  for (const auto& row : text) out += line(row, ' ');
  return out;
}

nlohmann::json Table::ToJson() const {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& row : rows_) {
    nlohmann::json obj = nlohmann::json::object();
    for (size_t c = 0; c < columns_.size(); ++c) {
      const TableCell& cell = row[c];
      const std::string& key = columns_[c].key;
      if (std::holds_alternative<int64_t>(cell)) {
        obj[key] = std::get<int64_t>(cell);
      } else if (std::holds_alternative<double>(cell)) {
        const double v = std::get<double>(cell);
        obj[key] = std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
      } else if (std::holds_alternative<std::string>(cell)) {
        obj[key] = std::get<std::string>(cell);
      } else {
        obj[key] = nullptr;
      }
    }
    rows.push_back(std::move(obj));
  }
  return rows;
}

}  // namespace fsdp::bench
