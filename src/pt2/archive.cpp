#include "kiln/pt2/archive.h"

#include "kiln/core/error.h"

#include <zip.h>

#include <algorithm>
#include <array>
#include <vector>

namespace kiln::pt2 {
namespace {

struct ZipFileCloser {
  void operator()(zip_file_t* f) const { zip_fclose(f); }
};
using ZipFile = std::unique_ptr<zip_file_t, ZipFileCloser>;

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
  zip_int64_t n = zip_get_num_entries(zip_, 0);
  entries_.reserve(static_cast<size_t>(std::max<zip_int64_t>(n, 0)));
  for (zip_int64_t i = 0; i < n; ++i) {
    const char* name = zip_get_name(zip_, static_cast<zip_uint64_t>(i), ZIP_FL_ENC_RAW);
    entries_.emplace_back(name ? name : "");
  }
}

Pt2Archive::~Pt2Archive() {
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
  // Skip to `offset`: seek where the entry is stored uncompressed, else read and drop.
  if (offset > 0 && zip_fseek(f.get(), static_cast<zip_int64_t>(offset), SEEK_SET) != 0) {
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

}  // namespace kiln::pt2
