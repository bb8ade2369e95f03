#include "engine/serialization/safetensors.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "engine/core/error.h"
#include "engine/serialization/atomic_file.h"

namespace fsdp::serialization {

namespace {

// The reference implementation's limit on the header (safetensors' MAX_HEADER_SIZE).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// Files read here are inputs, observations and checkpoints: 64 GiB is far above any of them and
// keeps a corrupt length from asking for an absurd allocation first.
constexpr size_t kMaxFileBytes = size_t{64} << 30;
constexpr const char* kMetadataKey = "__metadata__";

[[noreturn]] void Malformed(const std::string& source, const std::string& what) {
  FSDP_THROW(ErrorCode::kDataLoss, source, ": not a valid safetensors file: ", what);
}

uint64_t ReadLe64(const std::string& bytes) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
  return v;
}

void AppendLe64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// A non-negative integer of the header, or DataLoss naming the field.
uint64_t HeaderUint(const nlohmann::json& v, const std::string& source, const std::string& what) {
  if (!v.is_number_unsigned()) {
    if (v.is_number_integer() && v.get<int64_t>() >= 0) return v.get<uint64_t>();
    Malformed(source, what + " must be a non-negative integer, got " + v.dump());
  }
  return v.get<uint64_t>();
}

}  // namespace

const char* SafetensorsDTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "F32";
    case DType::kFloat64: return "F64";
    case DType::kFloat16: return "F16";
    case DType::kBFloat16: return "BF16";
    case DType::kInt64: return "I64";
  }
  return "F32";
}

DType DTypeFromSafetensors(const std::string& name) {
  if (name == "F32") return DType::kFloat32;
  if (name == "F64") return DType::kFloat64;
  if (name == "F16") return DType::kFloat16;
  if (name == "BF16") return DType::kBFloat16;
  if (name == "I64") return DType::kInt64;
  FSDP_THROW(ErrorCode::kInvalidArgument, "safetensors dtype ", name,
             " has no engine tensor type (the engine has F32, F64, F16, BF16, I64)");
}

size_t SafetensorsElementSize(const std::string& name) {
  static const std::map<std::string, size_t> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"I16", 2},
      {"U16", 2},  {"F16", 2}, {"BF16", 2}, {"I32", 4},    {"U32", 4},     {"F32", 4},
      {"I64", 8},  {"U64", 8}, {"F64", 8}};
  auto it = sizes.find(name);
  return it == sizes.end() ? 0 : it->second;
}

Tensor SafetensorsEntry::ToTensor() const {
  DType dtype;
  try {
    dtype = DTypeFromSafetensors(this->dtype);
  } catch (const Error& e) {
    FSDP_THROW(ErrorCode::kInvalidArgument, "tensor '", name, "': ", e.message());
  }
  Tensor t = Tensor::empty(shape, dtype);
  FSDP_INTERNAL_ASSERT(t.nbytes() == bytes.size(), "entry ", name, " size");
  if (!bytes.empty()) std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
  return t;
}

const SafetensorsEntry* SafetensorsFile::Find(const std::string& name) const {
  for (const auto& e : entries) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

std::vector<std::pair<std::string, Tensor>> SafetensorsFile::Tensors() const {
  std::vector<std::pair<std::string, Tensor>> out;
  out.reserve(entries.size());
  for (const auto& e : entries) out.emplace_back(e.name, e.ToTensor());
  return out;
}

std::string EncodeSafetensors(const std::vector<std::pair<std::string, Tensor>>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  std::set<std::string> names;
  std::vector<Tensor> host;
  host.reserve(tensors.size());
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    FSDP_CHECK(!name.empty(), "safetensors: a tensor name must not be empty");
    FSDP_CHECK(name != kMetadataKey, "safetensors: '", kMetadataKey, "' is reserved");
    FSDP_CHECK(names.insert(name).second, "safetensors: tensor name '", name, "' given twice");
    FSDP_CHECK(tensor.defined(), "safetensors: tensor '", name, "' is undefined");
    Tensor h = tensor.device().is_cpu() ? tensor : tensor.to(Device::CPU());
    const uint64_t end = offset + h.nbytes();
    header[name] = {{"dtype", SafetensorsDTypeName(h.dtype())},
                    {"shape", h.sizes()},
                    {"data_offsets", {offset, end}}};
    offset = end;
    host.push_back(std::move(h));
  }
  std::string text = header.dump();
  // Pad with spaces so the byte buffer starts 8-aligned (8 + N is a multiple of 8).
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out;
  out.reserve(8 + text.size() + offset);
  AppendLe64(out, text.size());
  out += text;
  for (const Tensor& h : host) {
    out.append(static_cast<const char*>(h.data_ptr()), h.nbytes());
  }
  return out;
}

SafetensorsFile DecodeSafetensors(const std::string& bytes, const std::string& source) {
  if (bytes.size() < 8) {
    Malformed(source, std::to_string(bytes.size()) + " bytes, shorter than the 8-byte header length");
  }
  const uint64_t n = ReadLe64(bytes);
  if (n > kMaxHeaderBytes) {
    Malformed(source, "header length " + std::to_string(n) + " exceeds the limit of " +
                          std::to_string(kMaxHeaderBytes) + " bytes");
  }
  if (n > bytes.size() - 8) {
    Malformed(source, "header length " + std::to_string(n) + " but only " +
                          std::to_string(bytes.size() - 8) + " bytes follow (truncated file?)");
  }
  const std::string text = bytes.substr(8, n);
  if (text.empty() || text.front() != '{') Malformed(source, "the header does not start with '{'");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    Malformed(source, std::string("the header is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) Malformed(source, "the header is not a JSON object");

  SafetensorsFile file;
  struct Range {
    uint64_t begin, end;
    size_t entry;
  };
  std::vector<Range> ranges;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name == kMetadataKey) {
      if (!v.is_object()) Malformed(source, "__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) {
          Malformed(source, "__metadata__ value of '" + m.key() + "' is not a string");
        }
        file.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string who = "tensor '" + name + "'";
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") ||
        !v.contains("data_offsets")) {
      Malformed(source, who + " needs dtype, shape and data_offsets, got " + v.dump());
    }
    SafetensorsEntry entry;
    entry.name = name;
    if (!v["dtype"].is_string()) Malformed(source, who + ": dtype is not a string");
    entry.dtype = v["dtype"].get<std::string>();
    const size_t element = SafetensorsElementSize(entry.dtype);
    if (element == 0) Malformed(source, who + ": unknown dtype '" + entry.dtype + "'");
    if (!v["shape"].is_array()) Malformed(source, who + ": shape is not an array");
    // Element count with overflow checks: a shape like [2^32, 2^32] is refused, not wrapped.
    uint64_t numel = 1;
    for (const auto& d : v["shape"]) {
      const uint64_t dim = HeaderUint(d, source, who + ": a shape dimension");
      if (dim != 0 && numel > std::numeric_limits<uint64_t>::max() / dim) {
        Malformed(source, who + ": shape " + v["shape"].dump() + " overflows");
      }
      numel *= dim;
      if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        Malformed(source, who + ": shape dimension " + std::to_string(dim) + " too large");
      }
      entry.shape.push_back(static_cast<int64_t>(dim));
    }
    const auto& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2) {
      Malformed(source, who + ": data_offsets must be [begin, end]");
    }
    const uint64_t begin = HeaderUint(off[0], source, who + ": data_offsets[0]");
    const uint64_t end = HeaderUint(off[1], source, who + ": data_offsets[1]");
    if (end < begin) Malformed(source, who + ": data_offsets end before begin");
    if (numel > std::numeric_limits<uint64_t>::max() / element || numel * element != end - begin) {
      Malformed(source, who + ": shape " + v["shape"].dump() + " of " + entry.dtype + " needs " +
                            std::to_string(numel) + " x " + std::to_string(element) +
                            " bytes but data_offsets span " + std::to_string(end - begin));
    }
    ranges.push_back({begin, end, file.entries.size()});
    file.entries.push_back(std::move(entry));
  }
  // The ranges must tile the byte buffer exactly, as the reference implementation requires.
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  const uint64_t buffer = bytes.size() - 8 - n;
  uint64_t expected = 0;
  for (const Range& r : ranges) {
    const std::string& name = file.entries[r.entry].name;
    if (r.begin != expected) {
      Malformed(source, "tensor '" + name + "' starts at byte " + std::to_string(r.begin) +
                            " of the buffer, expected " + std::to_string(expected) +
                            (r.begin < expected ? " (overlaps another tensor)" : " (gap)"));
    }
    expected = r.end;
  }
  if (expected != buffer) {
    Malformed(source, "the tensors span " + std::to_string(expected) + " bytes but the buffer holds " +
                          std::to_string(buffer) +
                          (expected > buffer ? " (truncated file?)" : " (trailing bytes)"));
  }
  // Copy the bytes and order the entries as they lie in the file.
  const size_t base = 8 + static_cast<size_t>(n);
  for (const Range& r : ranges) {
    SafetensorsEntry& e = file.entries[r.entry];
    e.bytes.assign(bytes.begin() + static_cast<std::ptrdiff_t>(base + r.begin),
                   bytes.begin() + static_cast<std::ptrdiff_t>(base + r.end));
  }
  std::vector<SafetensorsEntry> ordered;
  ordered.reserve(file.entries.size());
  for (const Range& r : ranges) ordered.push_back(std::move(file.entries[r.entry]));
  file.entries = std::move(ordered);
  return file;
}

void SaveSafetensors(const std::string& path,
                     const std::vector<std::pair<std::string, Tensor>>& tensors,
                     const std::map<std::string, std::string>& metadata) {
  WriteFileAtomically(path, EncodeSafetensors(tensors, metadata));
}

SafetensorsFile LoadSafetensors(const std::string& path) {
  return DecodeSafetensors(ReadRegularFile(path, kMaxFileBytes), path);
}

}  // namespace fsdp::serialization
