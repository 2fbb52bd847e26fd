// Every file kiln writes (.pte, its metadata and debug map, .npy outputs, profiles, views) goes
// through StagedFile: a new file with a random name, created exclusively (O_CREAT | O_EXCL |
// O_NOFOLLOW) in the target's own directory, renamed onto the target only once it is complete.
// No fixed temporary name, nothing opened through a planted link, no half-written target, and
// nothing left behind on failure (the destructor removes an unpublished staged file).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kiln {

class StagedFile;
void publish_together(std::span<StagedFile* const> files, std::span<const std::string> stale);

class StagedFile {
 public:
  // Creates the staged file beside `target`. Fails (kiln::Error naming the target) if the target
  // is a directory or its directory does not exist or is not writable.
  explicit StagedFile(std::string target);
  ~StagedFile();
  StagedFile(const StagedFile&) = delete;
  StagedFile& operator=(const StagedFile&) = delete;

  const std::string& target() const { return target_; }
  const std::string& path() const { return path_; }  // the staged (temporary) file

  // Buffered writes; an I/O error (a full disk) fails naming the target.
  void write(const void* data, size_t n);
  void write(std::string_view s) { write(s.data(), s.size()); }
  uint64_t written() const { return written_; }
  // Hashes what is written from here on (call before the first write): sha256() after close() is the
  // file's SHA-256 without reading it back (kiln lower's metadata; a 3 GB program takes ~40 s to re-read).
  void hash_contents();
  std::string sha256();  // hex; empty unless hash_contents() was called
  // Flushes and closes; fails naming the target on any write error. Idempotent.
  void close();
  // close(), then renames the staged file onto the target.
  void publish();

 private:
  friend void publish_together(std::span<StagedFile* const> files, std::span<const std::string> stale);
  void flush();

  std::string target_, path_;
  int fd_ = -1;
  bool published_ = false;
  uint64_t written_ = 0;
  std::vector<std::byte> buf_;
  struct Hash;
  std::shared_ptr<Hash> hash_;
  void hash_block(const std::byte* p, size_t n);
};

// Publishes staged files as one set: closes them all, then renames them in order (the last is the
// file the others describe: a .pte after its metadata), holding an advisory lock on the directory
// so concurrent kiln processes publish whole sets one after another. `stale` files (a companion an
// earlier set had and this one has not) are removed under the same lock.
void publish_together(std::span<StagedFile* const> files, std::span<const std::string> stale = {});

// `bytes` to `path` through a StagedFile.
void write_file_atomically(const std::string& path, std::string_view bytes);

// SHA-256 of a file's contents, lowercase hex (the .pte's digest in its metadata).
std::string sha256_file(const std::string& path);

}  // namespace kiln
