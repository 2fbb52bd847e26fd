// Zip and torch.save writers (torch_archive.h).
#include "torch_archive.h"

#include "kiln/core/error.h"

#include <fmt/format.h>

#include <zlib.h>

#include <cstring>
#include <limits>

namespace kiln::etrecord {
namespace {

constexpr uint64_t kZipLimit = std::numeric_limits<uint32_t>::max();

void le(std::string& b, uint64_t v, int bytes) {
  for (int k = 0; k < bytes; ++k) b.push_back(static_cast<char>((v >> (8 * k)) & 0xff));
}

}  // namespace

void ZipWriter::put(const void* data, size_t n) {
  if (n == 0) return;
  sink_(data, n);
  offset_ += n;
}

void ZipWriter::begin(const std::string& name, size_t align) {
  check(!open_, "zip: entry {} begun inside another", name);
  check(offset_ < kZipLimit, "zip: {}: the archive passes 4 GiB (kiln writes no zip64 yet)", name);
  Entry e;
  e.name = name;
  e.header_offset = offset_;
  const uint64_t data_at = offset_ + 30 + name.size();
  if (align > 1 && data_at % align != 0) {
    uint64_t pad = align - data_at % align;
    if (pad < 4) pad += align;  // an extra field is at least its 4-byte header
    e.extra = static_cast<uint16_t>(pad);
  }
  std::string h;
  le(h, 0x04034b50, 4);  // local file header
  le(h, 20, 2);          // version needed
  le(h, 0x0808, 2);      // flags: data descriptor follows, UTF-8 name
  le(h, 0, 2);           // stored
  le(h, 0, 2);           // time
  le(h, 0x21, 2);        // date (1980-01-01)
  le(h, 0, 4);           // crc (in the descriptor)
  le(h, 0, 4);
  le(h, 0, 4);
  le(h, name.size(), 2);
  le(h, e.extra, 2);
  h += name;
  if (e.extra) {
    le(h, 0x4b46, 2);  // a private extra field id ("FK") holding the padding
    le(h, e.extra - 4u, 2);
    h.append(e.extra - 4u, 'Z');
  }
  put(h.data(), h.size());
  entries_.push_back(std::move(e));
  open_ = true;
  crc_ = static_cast<uint32_t>(crc32(0L, Z_NULL, 0));
  size_ = 0;
}

void ZipWriter::write(const void* data, size_t n) {
  check(open_, "zip: a write outside an entry");
  const auto* p = static_cast<const Bytef*>(data);
  for (size_t done = 0; done < n;) {
    const size_t chunk = std::min<size_t>(n - done, 1u << 30);
    crc_ = static_cast<uint32_t>(crc32(crc_, p + done, static_cast<uInt>(chunk)));
    done += chunk;
  }
  size_ += n;
  check(size_ < kZipLimit, "zip: {}: the entry passes 4 GiB (kiln writes no zip64 yet)", entries_.back().name);
  put(data, n);
}

void ZipWriter::end() {
  check(open_, "zip: end without an entry");
  Entry& e = entries_.back();
  e.crc = crc_;
  e.size = size_;
  std::string d;
  le(d, 0x08074b50, 4);
  le(d, e.crc, 4);
  le(d, e.size, 4);
  le(d, e.size, 4);
  put(d.data(), d.size());
  open_ = false;
}

void ZipWriter::finish() {
  check(!open_, "zip: finished inside an entry");
  const uint64_t cd_start = offset_;
  check(cd_start < kZipLimit && entries_.size() < 0xffff, "zip: the archive passes the sizes kiln writes (no zip64 yet)");
  for (const Entry& e : entries_) {
    std::string c;
    le(c, 0x02014b50, 4);  // central directory header
    le(c, 20, 2);          // made by
    le(c, 20, 2);
    le(c, 0x0808, 2);
    le(c, 0, 2);
    le(c, 0, 2);
    le(c, 0x21, 2);
    le(c, e.crc, 4);
    le(c, e.size, 4);
    le(c, e.size, 4);
    le(c, e.name.size(), 2);
    le(c, 0, 2);  // no extra field here
    le(c, 0, 2);  // comment
    le(c, 0, 2);  // disk
    le(c, 0, 2);  // internal attributes
    le(c, 0, 4);  // external attributes
    le(c, e.header_offset, 4);
    c += e.name;
    put(c.data(), c.size());
  }
  std::string z;
  le(z, 0x06054b50, 4);  // end of central directory
  le(z, 0, 2);
  le(z, 0, 2);
  le(z, entries_.size(), 2);
  le(z, entries_.size(), 2);
  le(z, offset_ - cd_start, 4);
  le(z, cd_start, 4);
  le(z, 0, 2);
  put(z.data(), z.size());
}

namespace {

// Pickle protocol 2, the opcodes torch's weights-only unpickler reads.
class Pickler {
 public:
  std::string out;

  void global(std::string_view module, std::string_view name) {
    out += 'c';
    out += module;
    out += '\n';
    out += name;
    out += '\n';
  }
  void integer(int64_t v) {
    if (v >= std::numeric_limits<int32_t>::min() && v <= std::numeric_limits<int32_t>::max()) {
      out += 'J';
      le(out, static_cast<uint32_t>(static_cast<int32_t>(v)), 4);
    } else {
      out += '\x8a';  // LONG1: little-endian two's complement
      out += '\x08';
      le(out, static_cast<uint64_t>(v), 8);
    }
  }
  void string(std::string_view s) {
    out += 'X';
    le(out, s.size(), 4);
    out += s;
  }
  void floating(double d) {
    out += 'G';  // BINFLOAT: big-endian double
    uint64_t bits;
    std::memcpy(&bits, &d, 8);
    for (int k = 7; k >= 0; --k) out.push_back(static_cast<char>((bits >> (8 * k)) & 0xff));
  }
  // MARK, what items() writes, then op (TUPLE 't', APPENDS 'e', SETITEMS 'u'), which takes them
  template <class F>
  void marked(char op, F&& items) {
    out += '(';
    items();
    out += op;
  }
  void ints_tuple(const std::vector<int64_t>& v) {
    marked('t', [&] { for (int64_t x : v) integer(x); });
  }
  void empty_ordered_dict() {
    global("collections", "OrderedDict");
    out += ')';
    out += 'R';
  }

  void value(const PyValue& v, const std::vector<Storage>& storages) {
    using K = PyValue::Kind;
    switch (v.kind) {
      case K::None: out += 'N'; break;
      case K::Bool: out += v.b ? '\x88' : '\x89'; break;
      case K::Int: integer(v.i); break;
      case K::Float: floating(v.f); break;
      case K::String: string(v.s); break;
      // (APPENDS to an EMPTY_LIST, SETITEMS to an EMPTY_DICT: only when there are items)
      case K::Tuple:
        marked('t', [&] { for (const PyValue& x : v.items) value(x, storages); });
        break;
      case K::List:
        out += ']';
        if (!v.items.empty()) marked('e', [&] { for (const PyValue& x : v.items) value(x, storages); });
        break;
      case K::Dict:
        out += '}';
        if (!v.dict.empty()) marked('u', [&] {
          for (const auto& [k, x] : v.dict) {
            string(k);
            value(x, storages);
          }
        });
        break;
      case K::Tensor: tensor(v, storages); break;
    }
  }

 private:
  void tensor(const PyValue& v, const std::vector<Storage>& storages) {
    check(v.storage < storages.size(), "torch.save: tensor refers to storage {} of {}", v.storage, storages.size());
    const Storage& s = storages[v.storage];
    if (v.parameter) {  // _rebuild_parameter(<the tensor>, requires_grad, hooks)
      global("torch._utils", "_rebuild_parameter");
      out += '(';
    }
    global("torch._utils", "_rebuild_tensor_v2");
    out += '(';
    // the storage: persistent id ('storage', torch.<Type>Storage, key, 'cpu', numel)
    out += '(';
    string("storage");
    global("torch", storage_class(s.dtype));
    string(std::to_string(v.storage));
    string("cpu");
    integer(s.numel);
    out += 't';
    out += 'Q';  // BINPERSID
    integer(0);  // storage offset
    ints_tuple(v.sizes);
    std::vector<int64_t> strides(v.sizes.size(), 1);
    for (size_t k = v.sizes.size(); k-- > 1;) strides[k - 1] = strides[k] * std::max<int64_t>(v.sizes[k], 1);
    ints_tuple(strides);
    out += '\x89';  // requires_grad False
    empty_ordered_dict();  // backward hooks
    out += 't';
    out += 'R';
    if (v.parameter) {
      out += '\x89';
      empty_ordered_dict();
      out += 't';
      out += 'R';
    }
  }

  static std::string_view storage_class(ScalarType t) {
    switch (t) {
      case ScalarType::Float: return "FloatStorage";
      case ScalarType::Double: return "DoubleStorage";
      case ScalarType::Half: return "HalfStorage";
      case ScalarType::BFloat16: return "BFloat16Storage";
      case ScalarType::Long: return "LongStorage";
      case ScalarType::Int: return "IntStorage";
      case ScalarType::Short: return "ShortStorage";
      case ScalarType::Char: return "CharStorage";
      case ScalarType::Byte: return "ByteStorage";
      case ScalarType::Bool: return "BoolStorage";
      default: fail("torch.save: no storage type for dtype {}", dtype_name(t));
    }
  }
};

}  // namespace

void torch_save(const Sink& out, const std::string& archive, const PyValue& value,
                const std::vector<Storage>& storages) {
  Pickler p;
  p.out += "\x80\x02";
  p.value(value, storages);
  p.out += '.';
  ZipWriter z(out);
  z.add(archive + "/data.pkl", p.out);
  z.add(archive + "/byteorder", "little");
  for (size_t k = 0; k < storages.size(); ++k) {
    z.begin(fmt::format("{}/data/{}", archive, k), 64);
    uint64_t written = 0;
    storages[k].write([&](const void* d, size_t n) {
      z.write(d, n);
      written += n;
    });
    const uint64_t want = static_cast<uint64_t>(storages[k].numel) * element_size(storages[k].dtype);
    check(written == want, "torch.save: storage {} wrote {} bytes, not {}", k, written, want);
    z.end();
  }
  z.add(archive + "/version", "3\n");
  z.add(archive + "/.data/serialization_id", "0000000000000000000000000000000000000000");
  z.finish();
}

}  // namespace kiln::etrecord
