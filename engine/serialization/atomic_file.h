// Atomic file writes and bounded reads: the one way the project writes a file that another
// process or a later run reads (safetensors files, driver requests and results, reports), and
// reads one it did not write.
//
// WriteFileAtomically writes a temporary file next to the target (same directory, so the
// rename cannot cross file systems), fsyncs it, renames it over the target and fsyncs the
// directory: a reader, or a crash at any point, sees the old file or the new one, never a
// prefix. ReadRegularFile refuses anything that is not a regular file (a FIFO would block, a
// directory or device is not data) and anything longer than a limit.
//
// Thread-safety: stateless functions; concurrent writers of one path each leave a complete file
// (the last rename wins).
#pragma once

#include <cstddef>
#include <string>

namespace fsdp::serialization {

// Writes `bytes` to `path` atomically. Unavailable naming the path and the system's reason on
// failure; the previous file, if any, is then unchanged and no temporary file is left.
void WriteFileAtomically(const std::string& path, const std::string& bytes);

// The whole content of the regular file `path`. NotFound when it does not exist,
// InvalidArgument when it is not a regular file, DataLoss when it is longer than `max_bytes`,
// Unavailable when it cannot be read; each naming the path.
std::string ReadRegularFile(const std::string& path, size_t max_bytes);

}  // namespace fsdp::serialization
