// Safetensors: reading and writing the `.safetensors` file format (Hugging Face's
// specification), the format of every tensor file the project writes or reads: a case's
// inputs, a driver's tensor observations, checkpoints.
//
// Layout of a file:
//   8 bytes      N, the header's length, unsigned little-endian
//   N bytes      the header: a JSON object (UTF-8), padded with trailing spaces
//                {"__metadata__": {"k": "v", ...},                     (optional, strings only)
//                 "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...}
//   rest         the byte buffer; each tensor's row-major little-endian elements lie at
//                [begin, end) of it
//
// Writing: tensors are laid out in the order given, the header is padded to a multiple of 8
// bytes (so every tensor of a file written here starts 8-aligned), and the file is written
// atomically: a temporary file in the same directory, fsync, rename over the target, fsync of
// the directory. A crash leaves either the old file or the new one, never half of one.
//
// Reading is strict, as the reference implementation: the header must be a JSON object of at
// most 100 MB, every entry must have a known dtype, a shape of non-negative dimensions whose
// element count times the element size equals its byte range, ranges must tile the byte buffer
// exactly (no gap, no overlap, nothing after the last), and the file must be exactly as long as
// the header says. Any violation is DataLoss naming the file and, where one is involved, the
// tensor. Dtypes the engine has no tensors for (I32, U8, BOOL, F8_*, ...) are read as raw
// entries (SafetensorsEntry) but cannot become engine Tensors (InvalidArgument naming them).
//
// Thread-safety: stateless functions; a SafetensorsFile is a value.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/dtype.h"
#include "engine/core/tensor.h"

namespace fsdp::serialization {

// The specification's dtype spelling of an engine dtype: F32, F64, F16, BF16, I64.
const char* SafetensorsDTypeName(DType dtype);
// The engine dtype of a specification spelling; InvalidArgument for the ones the engine has no
// tensors of.
DType DTypeFromSafetensors(const std::string& name);
// Bytes per element of any dtype of the specification (BOOL, U8, I8, F8_E4M3, F8_E5M2: 1;
// I16, U16, F16, BF16: 2; I32, U32, F32: 4; I64, U64, F64: 8); 0 when unknown.
size_t SafetensorsElementSize(const std::string& name);

// One tensor of a file, as stored.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;                // the specification's spelling, e.g. "F32"
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;       // row-major, little-endian

  // The entry as a CPU engine tensor; InvalidArgument naming the entry for dtypes the engine
  // has no tensors of.
  Tensor ToTensor() const;
};

// A whole file: the metadata and the entries in the order of their data offsets.
struct SafetensorsFile {
  std::map<std::string, std::string> metadata;
  std::vector<SafetensorsEntry> entries;

  // The entry named `name`, or nullptr.
  const SafetensorsEntry* Find(const std::string& name) const;
  // Every entry as a CPU engine tensor, in file order.
  std::vector<std::pair<std::string, Tensor>> Tensors() const;
};

// The bytes of a file holding `tensors` (any device; copied to the host) in the given order
// with `metadata`. InvalidArgument on an empty or duplicate name or the reserved name
// "__metadata__".
std::string EncodeSafetensors(const std::vector<std::pair<std::string, Tensor>>& tensors,
                              const std::map<std::string, std::string>& metadata = {});
// Parses the bytes of a file; `source` names it in errors (a path, or "<memory>").
SafetensorsFile DecodeSafetensors(const std::string& bytes, const std::string& source);

// EncodeSafetensors written atomically to `path` (see above). Unavailable naming the path and
// the system's reason when it cannot be written; the previous file, if any, is then intact.
void SaveSafetensors(const std::string& path,
                     const std::vector<std::pair<std::string, Tensor>>& tensors,
                     const std::map<std::string, std::string>& metadata = {});
// Reads and parses `path`: NotFound when it does not exist, InvalidArgument when it is not a
// regular file, DataLoss when it is malformed (see above).
SafetensorsFile LoadSafetensors(const std::string& path);

}  // namespace fsdp::serialization
