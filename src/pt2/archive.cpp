#include "kiln/pt2/archive.h"

#include "kiln/core/error.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zip.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>
#include <vector>

namespace kiln::pt2 {
namespace {

struct ZipFileCloser {
  void operator()(zip_file_t* f) const { zip_fclose(f); }
};
using ZipFile = std::unique_ptr<zip_file_t, ZipFileCloser>;

// Limits on what an archive may make kiln inflate: a .pt2 is untrusted input, and a zip bomb (a few MB
// declaring or inflating to many GB) must be refused before anything is allocated or read.
// - No compressed entry inflates to more than kMaxCompressionRatio times its compressed size (deflated
//   JSON and weights stay far below it; a zip bomb is ~1000x), except entries below kRatioFreeBytes.
constexpr uint64_t kMaxCompressionRatio = 100;
constexpr uint64_t kRatioFreeBytes = uint64_t{1} << 20;
// - All entries together inflate to at most the archive's size times that ratio plus kTotalSlackBytes.
constexpr uint64_t kTotalSlackBytes = uint64_t{64} << 20;
// - Entry names: at most this long; no absolute paths, '..' components, backslashes or NULs; no duplicates.
constexpr size_t kMaxNameBytes = 4096;

struct NotDirect {};  // the hand-read directory disagrees with libzip or is not readable: read through libzip

// n bytes at `offset` of fd into p; false on an error or a short file.
bool pread_all(int fd, std::byte* p, size_t n, uint64_t offset) {
  while (n > 0) {
    const ssize_t got = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    p += got, n -= static_cast<size_t>(got), offset += static_cast<uint64_t>(got);
  }
  return true;
}

// A read-only mapping of part of a file, unmapped when it goes out of scope (a sink may throw).
struct Window {
  void* addr = MAP_FAILED;
  size_t len = 0;
  Window(int fd, uint64_t offset, size_t n) : len(n) {
    addr = ::mmap(nullptr, n, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, static_cast<off_t>(offset));
  }
  ~Window() {
    if (addr != MAP_FAILED) ::munmap(addr, len);
  }
  Window(const Window&) = delete;
  Window& operator=(const Window&) = delete;
};

bool traversal_name(const std::string& name) {
  if (name.empty() || name.front() == '/' || name.find('\\') != std::string::npos ||
      name.find('\0') != std::string::npos)
    return true;
  size_t at = 0;
  while (at <= name.size()) {
    size_t slash = name.find('/', at);
    if (slash == std::string::npos) slash = name.size();
    if (name.compare(at, slash - at, "..") == 0 && slash - at == 2) return true;
    at = slash + 1;
  }
  return false;
}

}  // namespace

Pt2Archive::Pt2Archive(const std::string& path) : path_(path) {
  int err = 0;
  zip_ = zip_open(path.c_str(), ZIP_RDONLY | ZIP_CHECKCONS, &err);
  if (zip_ == nullptr) {
    zip_error_t ze;
    zip_error_init_with_code(&ze, err);
    std::string msg = zip_error_strerror(&ze);
    zip_error_fini(&ze);
    fail("{}: not a readable .pt2 archive: {}", path, msg);
  }
  // A refused archive throws from here on: the handle is closed first (a constructor that throws runs no
  // destructor; a caller such as kiln::lower as a library must not leak one per refused file).
  try {
    std::error_code ec;
    const uint64_t archive_size = std::filesystem::file_size(path, ec);
    if (ec) fail("{}: not a readable .pt2 archive: {}", path, ec.message());
    uint64_t total_cap = 0;
    if (__builtin_mul_overflow(archive_size, kMaxCompressionRatio, &total_cap) ||
        __builtin_add_overflow(total_cap, kTotalSlackBytes, &total_cap))
      total_cap = UINT64_MAX;
    zip_int64_t n = zip_get_num_entries(zip_, 0);
    entries_.reserve(static_cast<size_t>(std::max<zip_int64_t>(n, 0)));
    std::set<std::string> seen;
    uint64_t total = 0;
    for (zip_int64_t i = 0; i < n; ++i) {
      zip_stat_t st;
      zip_stat_init(&st);
      if (zip_stat_index(zip_, static_cast<zip_uint64_t>(i), ZIP_FL_ENC_RAW, &st) != 0 || !(st.valid & ZIP_STAT_NAME) ||
          !(st.valid & ZIP_STAT_SIZE) || !(st.valid & ZIP_STAT_COMP_SIZE) || !(st.valid & ZIP_STAT_COMP_METHOD))
        fail("{}: not a readable .pt2 archive: entry {} cannot be read", path, i);
      // The name as the directory stores it (libzip cuts it at a NUL: such names then collide as duplicates).
      const std::string name = st.name;
      if (name.size() > kMaxNameBytes || traversal_name(name))
        fail("{}: archive entry {} has a name kiln refuses (absolute, '..', backslash or too long)", path, i);
      if (!seen.insert(name).second) fail("{}: archive holds two entries named '{}'", path, name);
      if (st.comp_method == ZIP_CM_STORE) {
        if (st.size != st.comp_size)
          fail("{}: archive entry '{}' is stored uncompressed but declares {} bytes and holds {}", path, name, st.size,
               st.comp_size);
      } else if (st.size > kRatioFreeBytes &&
                 (st.comp_size == 0 || st.size / st.comp_size >= kMaxCompressionRatio)) {
        fail("{}: archive entry '{}' would inflate {} bytes to {} (more than {}x: a zip bomb?)", path, name,
             st.comp_size, st.size, kMaxCompressionRatio);
      }
      if (st.comp_size > archive_size)
        fail("{}: archive entry '{}' declares {} compressed bytes in a {}-byte file", path, name, st.comp_size,
             archive_size);
      if (__builtin_add_overflow(total, st.size, &total) || total > total_cap)
        fail("{}: archive entries inflate to more than {} bytes ({}x the {}-byte archive plus {} MiB): a zip bomb?",
             path, total_cap, kMaxCompressionRatio, archive_size, kTotalSlackBytes >> 20);
      entries_.push_back(name);
    }
    index_stored_entries(archive_size);
  } catch (...) {
    zip_discard(zip_);
    zip_ = nullptr;
    throw;
  }
}

Pt2Archive::~Pt2Archive() {
  if (fd_ >= 0) ::close(fd_);
  if (zip_ != nullptr) zip_discard(zip_);
}

int64_t Pt2Archive::index_of(const std::string& entry) const {
  return zip_name_locate(zip_, entry.c_str(), ZIP_FL_ENC_RAW);
}

bool Pt2Archive::contains(const std::string& entry) const { return index_of(entry) >= 0; }

uint64_t Pt2Archive::entry_size(const std::string& entry) const {
  zip_stat_t st;
  zip_stat_init(&st);
  if (zip_stat(zip_, entry.c_str(), ZIP_FL_ENC_RAW, &st) != 0 || !(st.valid & ZIP_STAT_SIZE))
    fail("{}: archive entry '{}' is missing", path_, entry);
  return st.size;
}

void Pt2Archive::stream(const std::string& entry, uint64_t offset, uint64_t length,
                        const std::function<void(std::span<const std::byte>)>& sink) const {
  uint64_t size = entry_size(entry);
  check(offset <= size && length <= size - offset,
        "{}: archive entry '{}' holds {} bytes, but {} bytes from offset {} were requested", path_, entry, size,
        length, offset);
  if (const NestedMember* at = direct(entry)) {
    // In windows of 8 MiB mapped one at a time (a whole-file mapping would count every weight read in the process's
    // resident memory), handed out in chunks of 1 MiB as below (sinks size their buffers by them). A window that
    // cannot be mapped is read into a buffer instead.
    constexpr uint64_t kWindow = uint64_t{8} << 20, kChunk = uint64_t{1} << 20;
    const auto page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    uint64_t pos = at->offset + offset;
    const uint64_t end = pos + length;
    std::vector<std::byte> buf;
    while (pos < end) {
      const uint64_t start = pos - pos % page, stop = std::min(end, start + kWindow);
      Window w(fd_, start, static_cast<size_t>(stop - start));
      const std::byte* data = nullptr;  // the byte at file offset `origin`
      uint64_t origin = start;
      if (w.addr != MAP_FAILED) {
        data = static_cast<const std::byte*>(w.addr);
      } else {
        buf.resize(static_cast<size_t>(stop - pos));
        if (!pread_all(fd_, buf.data(), buf.size(), pos))
          fail("{}: archive entry '{}' is truncated or corrupt", path_, entry);
        data = buf.data(), origin = pos;
      }
      for (; pos < stop;) {
        const auto n = static_cast<size_t>(std::min(stop - pos, kChunk));
        sink(std::span<const std::byte>(data + (pos - origin), n));
        pos += n;
      }
    }
    return;
  }
  // Stored (uncompressed) entries, which is how torch writes weights, are read
  // raw: same bytes, without libzip's per-read CRC bookkeeping.
  zip_stat_t st;
  zip_stat_init(&st);
  zip_flags_t flags = ZIP_FL_ENC_RAW;
  if (zip_stat(zip_, entry.c_str(), ZIP_FL_ENC_RAW, &st) == 0 && (st.valid & ZIP_STAT_COMP_METHOD) &&
      st.comp_method == ZIP_CM_STORE && (!(st.valid & ZIP_STAT_ENCRYPTION_METHOD) || st.encryption_method == ZIP_EM_NONE))
    flags |= ZIP_FL_COMPRESSED;
  ZipFile f(zip_fopen(zip_, entry.c_str(), flags));
  if (!f) fail("{}: cannot open archive entry '{}': {}", path_, entry, zip_strerror(zip_));
  // 1 MiB chunks: few syscalls for 100+ MB weights, small enough to stay in cache.
  std::vector<std::byte> buf(std::min<uint64_t>(length + offset, uint64_t{1} << 20) + 1);
  // Skip to `offset`: seek where the entry is stored uncompressed, else read and drop. (A compressed
  // entry is not seekable in libzip 1.7, and a failed zip_fseek leaves the file in an error state that
  // every later read reports: why `lower` once called deflated archives corrupt.)
  if (offset > 0 && (flags & ZIP_FL_COMPRESSED)) {
    if (zip_fseek(f.get(), static_cast<zip_int64_t>(offset), SEEK_SET) != 0)
      fail("{}: archive entry '{}' is truncated or corrupt: {}", path_, entry, zip_file_strerror(f.get()));
  } else if (offset > 0) {
    uint64_t skip = offset;
    while (skip > 0) {
      auto want = static_cast<zip_uint64_t>(std::min<uint64_t>(skip, buf.size()));
      zip_int64_t got = zip_fread(f.get(), buf.data(), want);
      if (got <= 0) fail("{}: archive entry '{}' is truncated or corrupt", path_, entry);
      skip -= static_cast<uint64_t>(got);
    }
  }
  uint64_t left = length;
  while (left > 0) {
    auto want = static_cast<zip_uint64_t>(std::min<uint64_t>(left, buf.size()));
    zip_int64_t got = zip_fread(f.get(), buf.data(), want);
    if (got <= 0) fail("{}: archive entry '{}' is truncated or corrupt: {}", path_, entry, zip_file_strerror(f.get()));
    sink(std::span<const std::byte>(buf.data(), static_cast<size_t>(got)));
    left -= static_cast<uint64_t>(got);
  }
}

void Pt2Archive::read(const std::string& entry, uint64_t offset, std::span<std::byte> out) const {
  if (const NestedMember* at = direct(entry)) {
    check(offset <= at->size && out.size() <= at->size - offset,
          "{}: archive entry '{}' holds {} bytes, but {} bytes from offset {} were requested", path_, entry, at->size,
          out.size(), offset);
    if (!pread_all(fd_, out.data(), out.size(), at->offset + offset))
      fail("{}: archive entry '{}' is truncated or corrupt", path_, entry);
    return;
  }
  size_t pos = 0;
  stream(entry, offset, out.size(), [&](std::span<const std::byte> chunk) {
    std::copy(chunk.begin(), chunk.end(), out.begin() + static_cast<std::ptrdiff_t>(pos));
    pos += chunk.size();
  });
}

std::string Pt2Archive::read_text(const std::string& entry) const {
  std::string text(entry_size(entry), '\0');
  read(entry, 0, std::as_writable_bytes(std::span<char>(text.data(), text.size())));
  return text;
}

namespace {

// The zip directory read by hand, over `size` bytes that `bytes_at(offset, n)` returns (bounds-checked by the
// caller): the end record (zip64 too), the central directory and each member's local header, as torch.save and
// torch.export.save write them. Every member's name -> where its data starts and how many bytes it holds. A
// compressed member fails when `compressed_ok` is false and is left out otherwise. `bad(why)` throws.
template <typename BytesAt, typename Bad>
std::map<std::string, Pt2Archive::NestedMember> read_zip_directory(uint64_t size, BytesAt&& bytes_at, Bad&& bad,
                                                                   bool compressed_ok) {
  auto le = [](const std::byte* p, int n) {
    uint64_t v = 0;
    for (int j = 0; j < n; ++j) v |= static_cast<uint64_t>(p[j]) << (8 * j);
    return v;
  };
  // End of central directory: 22 bytes plus a comment of up to 64 KiB, at the end.
  if (size < 22) bad("no end-of-directory record");
  const uint64_t tail_len = std::min<uint64_t>(size, 22 + 65535 + 20);
  const std::vector<std::byte> tail = bytes_at(size - tail_len, tail_len);
  int64_t eocd = -1;
  for (int64_t p = static_cast<int64_t>(tail_len) - 22; p >= 0; --p)
    if (le(tail.data() + p, 4) == 0x06054b50) {
      eocd = p;
      break;
    }
  if (eocd < 0) bad("no end-of-directory record");
  const std::byte* e = tail.data() + eocd;
  uint64_t count = le(e + 10, 2), cd_size = le(e + 12, 4), cd_offset = le(e + 16, 4);
  if ((count == 0xffff || cd_size == 0xffffffff || cd_offset == 0xffffffff)) {
    if (eocd < 20 || le(e - 20, 4) != 0x07064b50) bad("zip64 sizes without a zip64 locator");
    const std::vector<std::byte> z = bytes_at(le(e - 20 + 8, 8), 56);
    if (le(z.data(), 4) != 0x06064b50) bad("bad zip64 end record");
    count = le(z.data() + 32, 8), cd_size = le(z.data() + 40, 8), cd_offset = le(z.data() + 48, 8);
  }
  const std::vector<std::byte> cd = bytes_at(cd_offset, cd_size);
  std::map<std::string, Pt2Archive::NestedMember> out;
  size_t p = 0;
  for (uint64_t m = 0; m < count; ++m) {
    if (p + 46 > cd.size() || le(cd.data() + p, 4) != 0x02014b50) bad("bad central directory");
    const std::byte* h = cd.data() + p;
    const uint64_t method = le(h + 10, 2), name_len = le(h + 28, 2), extra_len = le(h + 30, 2), comment_len = le(h + 32, 2);
    uint64_t comp = le(h + 20, 4), raw = le(h + 24, 4), local = le(h + 42, 4);
    if (p + 46 + name_len + extra_len > cd.size()) bad("bad central directory");
    std::string name(reinterpret_cast<const char*>(h + 46), static_cast<size_t>(name_len));
    // zip64 extra field: the 64-bit values of the fields set to all ones, in this order.
    for (uint64_t x = 0; x + 4 <= extra_len;) {
      const std::byte* f = h + 46 + name_len + x;
      const uint64_t id = le(f, 2), len = le(f + 2, 2);
      if (x + 4 + len > extra_len) break;
      if (id == 1) {
        uint64_t at = 4;
        for (uint64_t* v : {&raw, &comp, &local})
          if (*v == 0xffffffff && at + 8 <= 4 + len) *v = le(f + at, 8), at += 8;
      }
      x += 4 + len;
    }
    p += 46 + name_len + extra_len + comment_len;
    if (method != 0) {
      if (compressed_ok) continue;
      bad(fmt::format("member '{}' is compressed (method {})", name, method));
    }
    if (comp != raw) bad(fmt::format("member '{}' has two sizes", name));
    const std::vector<std::byte> lh = bytes_at(local, 30);
    if (le(lh.data(), 4) != 0x04034b50) bad(fmt::format("member '{}' has no local header", name));
    const uint64_t data = local + 30 + le(lh.data() + 26, 2) + le(lh.data() + 28, 2);
    if (data > size || raw > size - data) bad(fmt::format("member '{}' runs past the end", name));
    if (!out.emplace(name, Pt2Archive::NestedMember{data, raw}).second) bad(fmt::format("two members named '{}'", name));
  }
  return out;
}



}  // namespace

// Finds each stored entry's bytes in the file. Anything unexpected (a directory this reader does not take, a
// member whose size, name or method differs from what libzip reports) leaves every entry to libzip, as before:
// libzip stays the judge of what the archive is.
void Pt2Archive::index_stored_entries(uint64_t archive_size) {
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  struct stat sb {};
  if (::fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || static_cast<uint64_t>(sb.st_size) != archive_size) {
    ::close(fd);
    return;
  }
  try {
    auto bytes_at = [&](uint64_t offset, uint64_t n) {
      if (offset > archive_size || n > archive_size - offset) throw NotDirect{};
      std::vector<std::byte> b(static_cast<size_t>(n));
      if (!pread_all(fd, b.data(), b.size(), offset)) throw NotDirect{};
      return b;
    };
    auto bad = [](const std::string&) { throw NotDirect{}; };
    std::map<std::string, NestedMember> found = read_zip_directory(archive_size, bytes_at, bad, true);
    for (const std::string& name : entries_) {
      zip_stat_t st;
      zip_stat_init(&st);
      if (zip_stat(zip_, name.c_str(), ZIP_FL_ENC_RAW, &st) != 0 || !(st.valid & ZIP_STAT_COMP_METHOD) ||
          st.comp_method != ZIP_CM_STORE ||
          ((st.valid & ZIP_STAT_ENCRYPTION_METHOD) && st.encryption_method != ZIP_EM_NONE))
        continue;
      auto it = found.find(name);
      if (it == found.end() || it->second.size != st.size) throw NotDirect{};
      stored_.emplace(name, it->second);
    }
  } catch (const NotDirect&) {
    stored_.clear();
    ::close(fd);
    return;
  }
  fd_ = fd;
}

const Pt2Archive::NestedMember* Pt2Archive::direct(const std::string& entry) const {
  if (fd_ < 0) return nullptr;
  auto it = stored_.find(entry);
  return it == stored_.end() ? nullptr : &it->second;
}

// A zip stored inside an entry: the same reader over the entry's bytes; every member must be stored.
std::map<std::string, Pt2Archive::NestedMember> Pt2Archive::nested_members(const std::string& entry) const {
  const uint64_t size = entry_size(entry);
  auto bad = [&](const std::string& why) -> void { fail("{}: archive entry '{}' is not a readable zip: {}", path_, entry, why); };
  auto bytes_at = [&](uint64_t offset, uint64_t n) {
    if (offset > size || n > size - offset) bad("a record points past its end");
    std::vector<std::byte> b(static_cast<size_t>(n));
    read(entry, offset, b);
    return b;
  };
  return read_zip_directory(size, bytes_at, bad, false);
}

}  // namespace kiln::pt2
