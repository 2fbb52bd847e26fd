// Pt2Archive: read access to the zip container torch.export.save writes.
// Entries are streamed from the file on demand; nothing is cached, so a weight
// is never held twice (callers read it straight into its final destination).
// Stored (uncompressed) entries, which is how torch writes weights, are read
// from the file directly: streamed through read-only mappings of 8 MiB windows
// (no copy through the kernel), read into a buffer with pread. Neither makes
// libzip's CRC pass, which libzip computes on every stored read and never
// compares (a read of exactly an entry's bytes does not reach its end).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

struct zip;

namespace kiln::pt2 {

class Pt2Archive {
 public:
  // Opens `path`; throws kiln::Error naming the file if it is not a readable zip.
  explicit Pt2Archive(const std::string& path);
  ~Pt2Archive();
  Pt2Archive(const Pt2Archive&) = delete;
  Pt2Archive& operator=(const Pt2Archive&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<std::string>& entries() const { return entries_; }
  bool contains(const std::string& entry) const;
  uint64_t entry_size(const std::string& entry) const;

  // Whole entry as a string (for the small JSON entries).
  std::string read_text(const std::string& entry) const;
  // Reads out.size() bytes starting at `offset` within the entry into `out`.
  void read(const std::string& entry, uint64_t offset, std::span<std::byte> out) const;
  // Streams the entry from `offset` for `length` bytes through `sink` in chunks.
  void stream(const std::string& entry, uint64_t offset, uint64_t length,
              const std::function<void(std::span<const std::byte>)>& sink) const;

  // A zip stored inside `entry` (torch.save's format: a .pt2 keeps a tensor subclass that way):
  // each member's name -> where its bytes lie within `entry`, so they are read like any entry's.
  // Fails, naming the entry, if it is not a zip or a member is compressed.
  struct NestedMember {
    uint64_t offset = 0;  // within the outer entry
    uint64_t size = 0;
  };
  std::map<std::string, NestedMember> nested_members(const std::string& entry) const;

 private:
  int64_t index_of(const std::string& entry) const;

  // Where a stored entry's bytes lie in the file (nullptr if they are read through libzip: compressed, or the
  // archive's directory could not be read by hand in agreement with libzip's).
  const NestedMember* direct(const std::string& entry) const;
  void index_stored_entries(uint64_t archive_size);

  std::string path_;
  zip* zip_ = nullptr;
  std::vector<std::string> entries_;
  int fd_ = -1;  // the archive, for the direct reads of stored entries, or -1
  std::map<std::string, NestedMember> stored_;  // offset within the file, size
};

}  // namespace kiln::pt2
