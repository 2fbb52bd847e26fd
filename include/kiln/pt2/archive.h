// Pt2Archive: read access to the zip container torch.export.save writes.
// Entries are streamed from the file on demand; nothing is cached, so a weight
// is never held twice (callers read it straight into its final destination).
// Stored (uncompressed) entries, which is how torch writes weights, are read
// from a read-only mapping of the file: no copy through the kernel and no CRC
// pass for a streamed weight (libzip computes the CRC of every stored read and
// never compares it: a read of exactly an entry's bytes does not reach its end).
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

  // Where a stored entry's bytes lie in the mapped file (nullptr if it is not mapped: compressed, or the
  // archive's directory could not be read by hand in agreement with libzip's).
  const NestedMember* mapped(const std::string& entry) const;
  void map_stored_entries(uint64_t archive_size);

  std::string path_;
  zip* zip_ = nullptr;
  std::vector<std::string> entries_;
  const std::byte* map_ = nullptr;  // the whole file, read-only (PROT_READ, MAP_PRIVATE), or nullptr
  size_t map_size_ = 0;
  std::map<std::string, NestedMember> stored_;  // offset within the file, size
};

}  // namespace kiln::pt2
