// Writers for the two containers an ETRecord is made of (etrecord.cpp): a zip
// archive of stored (uncompressed) entries, streamed to a sink, and inside it
// torch.save's format (a zip holding a pickle `data.pkl` whose tensors refer to
// storages `data/<key>`), which torch.load(weights_only=True) reads.
//
// Learned from the formats (PKWARE's APPNOTE, Python's pickle protocol 2,
// torch/serialization.py's zip layout); kiln's own code.
#pragma once

#include "kiln/core/dtype.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kiln::etrecord {

using Sink = std::function<void(const void* data, size_t n)>;

// A zip archive written front to back: every entry stored, its CRC-32 and sizes in a
// data descriptor after its bytes (so an entry can be streamed without knowing them first),
// then the central directory. Archives and entries are limited to 4 GiB (no zip64): a larger
// one is an error naming the entry.
class ZipWriter {
 public:
  explicit ZipWriter(Sink sink) : sink_(std::move(sink)) {}
  // Starts an entry; `align` > 1 pads the local header's extra field so the data starts at a
  // multiple of it (torch aligns its storages to 64 bytes).
  void begin(const std::string& name, size_t align = 1);
  void write(const void* data, size_t n);
  void end();
  void add(const std::string& name, std::string_view bytes, size_t align = 1) {
    begin(name, align);
    write(bytes.data(), bytes.size());
    end();
  }
  // Writes the central directory. The writer takes no entry after it.
  void finish();
  uint64_t offset() const { return offset_; }

 private:
  struct Entry {
    std::string name;
    uint32_t crc = 0;
    uint64_t size = 0, header_offset = 0;
    uint16_t extra = 0;
  };
  void put(const void* data, size_t n);
  Sink sink_;
  uint64_t offset_ = 0;
  std::vector<Entry> entries_;
  bool open_ = false;
  uint32_t crc_ = 0;
  uint64_t size_ = 0;
};

// A Python value to pickle: what an ETRecord's torch.save blobs hold (dicts of tensors, lists
// of tensors, tuples, strings, ints, floats, bools, None).
struct PyValue {
  enum class Kind { None, Bool, Int, Float, String, Tuple, List, Dict, Tensor } kind = Kind::None;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::vector<PyValue> items;                          // Tuple, List
  std::vector<std::pair<std::string, PyValue>> dict;   // Dict (string keys, in order)
  // Tensor: a contiguous tensor over the whole of storage `storage`
  size_t storage = 0;
  std::vector<int64_t> sizes;
  bool parameter = false;  // an nn.Parameter (torch._utils._rebuild_parameter)

  static PyValue none() { return {}; }
  static PyValue string(std::string v) {
    PyValue p;
    p.kind = Kind::String;
    p.s = std::move(v);
    return p;
  }
  static PyValue list(std::vector<PyValue> v, Kind k = Kind::List) {
    PyValue p;
    p.kind = k;
    p.items = std::move(v);
    return p;
  }
  static PyValue dict_of(std::vector<std::pair<std::string, PyValue>> v) {
    PyValue p;
    p.kind = Kind::Dict;
    p.dict = std::move(v);
    return p;
  }
};

// A storage of a torch.save blob: its dtype, element count and a writer of its bytes
// (row-major, exactly numel * element size of them, through the given sink).
struct Storage {
  ScalarType dtype = ScalarType::Float;
  int64_t numel = 0;
  std::function<void(const Sink&)> write;
};

// torch.save(value) into `out` (the archive's entries are named "<archive>/..."), with
// `storages` the tensors' bytes (PyValue::storage indexes it).
void torch_save(const Sink& out, const std::string& archive, const PyValue& value,
                const std::vector<Storage>& storages);

}  // namespace kiln::etrecord
