// PteFile: a .pte program file, memory-mapped (private copy-on-write: the file
// itself is never changed, and a damaged program whose kernel writes into a
// constant cannot fault) and verified once at
// open, so that everything after open() may follow its offsets and indices
// without re-checking them: the frame (identifier, extended header), the
// flatbuffer (flatbuffers Verifier), every segment against the file size,
// constant/delegate/named-data references, and in every execution plan the
// value, operator, delegate and planned-memory indices that instructions and
// tensors use. Runtime code: no exceptions; failures are a Status plus a
// one-line message saying what is wrong and where.
//
// The flatbuffer types (kiln::fb, generated from schema/kiln_program.fbs) are
// only declared here: code that reads the program's tables (the executor,
// `kiln inspect`, tests) includes "kiln/fb/kiln_program_generated.h" itself;
// a runtime user who only loads and runs programs never needs it.
#pragma once

#include "kiln/format/pte_frame.h"
#include "kiln/runtime/status.h"

#include <cstddef>
#include <cstdint>
#include <new>
#include <span>
#include <string_view>

namespace kiln::fb {
struct Program;
struct ExecutionPlan;
}  // namespace kiln::fb

namespace kiln::rt {

// A fixed-size, allocation-free error message (printf-style).
class ErrorMessage {
 public:
  void set(const char* format, ...) __attribute__((format(printf, 2, 3)));
  const char* c_str() const { return text_; }
  bool empty() const { return text_[0] == '\0'; }

 private:
  char text_[320] = {};
};

class PteFile {
 public:
  // Maps and verifies `path`. On failure returns AccessFailed (cannot open or
  // map), InvalidProgram (malformed) or NotSupported, with `error` (if given)
  // saying why.
  static Result<PteFile> open(const char* path, ErrorMessage* error = nullptr);

  PteFile(PteFile&& other) noexcept;
  PteFile& operator=(PteFile&& other) noexcept;
  PteFile(const PteFile&) = delete;
  PteFile& operator=(const PteFile&) = delete;
  ~PteFile();

  // The verified program root (flatbuffer types generated from schema/kiln_program.fbs).
  const fb::Program& program() const { return *program_; }
  std::span<const std::byte> bytes() const { return {data_, size_}; }
  uint64_t file_size() const { return size_; }
  // The extended header, if the file has one (files without segment data do not).
  bool has_extended_header() const { return has_header_; }
  const format::ExtendedHeader& extended_header() const { return header_; }
  // Bytes of the flatbuffer (header included).
  uint64_t program_size() const { return program_size_; }

  // Program.segments[i] as bytes of the file.
  size_t segment_count() const;
  Result<std::span<const std::byte>> segment(size_t index, ErrorMessage* error = nullptr) const;

  // Constant buffers, slot 0 (reserved, empty) included; from the constant
  // segment, or from the older inline Program.constant_buffer. A constant's
  // bytes run to the start of the next one (alignment padding included).
  size_t constant_count() const;
  Result<std::span<const std::byte>> constant(size_t index, ErrorMessage* error = nullptr) const;

  // Item `index` of Program.mutable_data_segments[which]: the initial contents of
  // a mutable (planned) tensor, runs to the next item like a constant.
  Result<std::span<const std::byte>> mutable_data(size_t which, size_t index, ErrorMessage* error = nullptr) const;

  // The payload of delegate `delegate_index` of plan `plan_index` (inline or in a segment).
  Result<std::span<const std::byte>> delegate_payload(size_t plan_index, size_t delegate_index,
                                                      ErrorMessage* error = nullptr) const;

  // The bytes stored under `key` in Program.named_data; NotFound if absent.
  Result<std::span<const std::byte>> named_data(std::string_view key, ErrorMessage* error = nullptr) const;

  // Drops the whole pages inside `bytes` (a range of this file, e.g. weights a
  // backend has packed into its own layout) from memory. They are read from
  // the file again if touched later, so this only lowers resident memory.
  void release_pages(std::span<const std::byte> bytes) const;

  // Advises the pages of `bytes` (a range of this file: an embedding table that
  // only lookups read) for sparse reads: no readahead around a fault
  // (MADV_RANDOM) and no huge-page mappings (MADV_NOHUGEPAGE), so that reading
  // one row brings in the pages near that row, not the 2 MiB folio of the page
  // cache around it (a filesystem with large folios maps whole 2 MiB blocks of
  // a file: Gemma 4 E2B's per-layer table held ~3 MB per token seen). Advice
  // only: what a read returns does not change.
  void advise_sparse(std::span<const std::byte> bytes) const;

  // The execution plan called `name`; NotFound if absent.
  Result<const fb::ExecutionPlan*> plan(std::string_view name, ErrorMessage* error = nullptr) const;

 private:
  PteFile() = default;
  void release();

  const std::byte* data_ = nullptr;
  uint64_t size_ = 0;
  const fb::Program* program_ = nullptr;
  bool has_header_ = false;
  format::ExtendedHeader header_{};
  uint64_t program_size_ = 0;
};

// Bytes per element of a dtype code as stored in a .pte (0 if kiln does not know it).
size_t pte_element_size(int8_t scalar_type);

}  // namespace kiln::rt
