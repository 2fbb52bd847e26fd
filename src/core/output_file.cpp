// StagedFile, publish_together, sha256_file (kiln/core/output_file.h).
#include "kiln/core/output_file.h"

#include "kiln/core/error.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace kiln {
namespace {

namespace fs = std::filesystem;

constexpr size_t kBufferBytes = size_t{1} << 20;  // few syscalls for 100+ MB programs
constexpr int kNameAttempts = 64;                 // random names tried before giving up (EEXIST each time)

std::string directory_of(const std::string& target) {
  fs::path p(target);
  return p.has_parent_path() ? p.parent_path().string() : std::string(".");
}

std::string random_suffix() {
  static constexpr char kChars[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::random_device rd;
  std::string s;
  for (int i = 0; i < 12; ++i) s += kChars[rd() % (sizeof kChars - 1)];
  return s;
}

// An exclusive advisory lock on a directory, released on destruction (nothing is created).
class DirectoryLock {
 public:
  explicit DirectoryLock(const std::string& dir) {
    fd_ = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd_ >= 0)
      while (::flock(fd_, LOCK_EX) != 0 && errno == EINTR) {
      }
    // A file system without flock still publishes each file atomically; only the set's ordering is lost.
  }
  ~DirectoryLock() {
    if (fd_ >= 0) ::close(fd_);
  }
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace

StagedFile::StagedFile(std::string target) : target_(std::move(target)) {
  check(!target_.empty(), "cannot write a file with an empty name");
  struct stat st;
  if (::lstat(target_.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) fail("{}: is a directory", target_);
  const std::string dir = directory_of(target_);
  const std::string base = fs::path(target_).filename().string();
  check(!base.empty() && base != "." && base != "..", "{}: not a file name", target_);
  for (int attempt = 0; attempt < kNameAttempts; ++attempt) {
    std::string candidate = (fs::path(dir) / fmt::format(".{}.kiln-{}", base, random_suffix())).string();
    int fd = ::open(candidate.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd >= 0) {
      fd_ = fd;
      path_ = std::move(candidate);
      return;
    }
    if (errno != EEXIST) fail("{}: cannot create a file in {}: {}", target_, dir, std::strerror(errno));
  }
  fail("{}: cannot create a temporary file in {}", target_, dir);
}

StagedFile::~StagedFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!published_ && !path_.empty()) ::unlink(path_.c_str());
}

void StagedFile::flush() {
  if (hash_) hash_block(buf_.data(), buf_.size());
  size_t done = 0;
  while (done < buf_.size()) {
    ssize_t n = ::write(fd_, buf_.data() + done, buf_.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      buf_.clear();
      fail("{}: cannot write: {}", target_, std::strerror(err));
    }
    done += static_cast<size_t>(n);
  }
  buf_.clear();
}

void StagedFile::write(const void* data, size_t n) {
  check(fd_ >= 0, "{}: written after it was closed", target_);
  const auto* p = static_cast<const std::byte*>(data);
  while (n > 0) {
    if (buf_.capacity() < kBufferBytes) buf_.reserve(kBufferBytes);
    const size_t take = std::min(n, kBufferBytes - buf_.size());
    buf_.insert(buf_.end(), p, p + take);
    p += take;
    n -= take;
    written_ += take;
    if (buf_.size() == kBufferBytes) flush();
  }
}

void StagedFile::close() {
  if (fd_ < 0) return;
  flush();
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail("{}: cannot write: {}", target_, std::strerror(errno));
}

void StagedFile::publish() {
  StagedFile* self = this;
  publish_together(std::span<StagedFile* const>(&self, 1));
}

void publish_together(std::span<StagedFile* const> files, std::span<const std::string> stale) {
  if (files.empty()) return;
  for (StagedFile* f : files) f->close();
  // Check every target before renaming any, so a set is not left half published by a target
  // that cannot be replaced (a directory in its place).
  for (StagedFile* f : files) {
    struct stat st;
    if (::lstat(f->target().c_str(), &st) == 0 && S_ISDIR(st.st_mode)) fail("{}: is a directory", f->target());
  }
  DirectoryLock lock(directory_of(files.back()->target()));
  for (const std::string& s : stale) {
    struct stat st;
    if (::lstat(s.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) ::unlink(s.c_str());
  }
  for (StagedFile* f : files) {
    if (::rename(f->path_.c_str(), f->target().c_str()) != 0)
      fail("{}: cannot rename into place: {}", f->target(), std::strerror(errno));
    f->published_ = true;
  }
}

void write_file_atomically(const std::string& path, std::string_view bytes) {
  StagedFile f(path);
  f.write(bytes);
  f.publish();
}

// ---- SHA-256 (FIPS 180-4) ----

namespace {

constexpr std::array<uint32_t, 64> kK = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

#if defined(__x86_64__)
// The same compression with the x86 SHA extensions (sha256rnds2 does two rounds, sha256msg1/msg2 the message
// schedule): several times the scalar form's speed where the CPU has them (the .pte's hash is computed as its
// gigabytes are written). The state is kept as the instructions take it: ABEF and CDGH, a in the high lane.
__attribute__((target("sha,sse4.1,ssse3"))) void compress_sha_ni(uint32_t* h, const uint8_t* p) {
  const __m128i swap = _mm_set_epi64x(0x0c0d0e0f08090a0bLL, 0x0405060700010203LL);  // big-endian words
  __m128i abcd = _mm_loadu_si128(reinterpret_cast<const __m128i*>(h));
  __m128i efgh = _mm_loadu_si128(reinterpret_cast<const __m128i*>(h + 4));
  abcd = _mm_shuffle_epi32(abcd, 0xB1);                   // b a d c
  efgh = _mm_shuffle_epi32(efgh, 0x1B);                   // h g f e
  __m128i abef = _mm_alignr_epi8(abcd, efgh, 8);          // f e b a
  __m128i cdgh = _mm_blend_epi16(efgh, abcd, 0xF0);       // h g d c
  const __m128i abef0 = abef, cdgh0 = cdgh;
  __m128i w[4];
  for (int j = 0; j < 16; ++j) {
    __m128i cur;
    if (j < 4) {
      cur = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * j)), swap);
    } else {  // W[t] = s1(W[t-2]) + W[t-7] + s0(W[t-15]) + W[t-16] for t = 4j .. 4j+3
      __m128i t = _mm_sha256msg1_epu32(w[(j - 4) & 3], w[(j - 3) & 3]);
      t = _mm_add_epi32(t, _mm_alignr_epi8(w[(j - 1) & 3], w[(j - 2) & 3], 4));
      cur = _mm_sha256msg2_epu32(t, w[(j - 1) & 3]);
    }
    w[j & 3] = cur;
    __m128i m = _mm_add_epi32(cur, _mm_loadu_si128(reinterpret_cast<const __m128i*>(kK.data() + 4 * j)));
    cdgh = _mm_sha256rnds2_epu32(cdgh, abef, m);
    m = _mm_shuffle_epi32(m, 0x0E);
    abef = _mm_sha256rnds2_epu32(abef, cdgh, m);
  }
  abef = _mm_add_epi32(abef, abef0);
  cdgh = _mm_add_epi32(cdgh, cdgh0);
  const __m128i feba = _mm_shuffle_epi32(abef, 0x1B);     // a b e f
  cdgh = _mm_shuffle_epi32(cdgh, 0xB1);                   // g h c d
  _mm_storeu_si128(reinterpret_cast<__m128i*>(h), _mm_blend_epi16(feba, cdgh, 0xF0));       // a b c d
  _mm_storeu_si128(reinterpret_cast<__m128i*>(h + 4), _mm_alignr_epi8(cdgh, feba, 8));      // e f g h
}

bool has_sha_ni() {
  static const bool yes = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    const bool sha = (b >> 29) & 1u;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
    return sha && ((c >> 19) & 1u) && ((c >> 9) & 1u);  // and SSE4.1, SSSE3
  }();
  return yes;
}
#endif

struct Sha256 {
  std::array<uint32_t, 8> h = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                               0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  std::array<uint8_t, 64> block{};
  size_t used = 0;
  uint64_t bits = 0;

  void compress(const uint8_t* p) {
#if defined(__x86_64__)
    if (has_sha_ni()) return compress_sha_ni(h.data(), p);
#endif
    uint32_t w[64];
    for (int i = 0; i < 16; ++i)
      w[i] = uint32_t{p[4 * i]} << 24 | uint32_t{p[4 * i + 1]} << 16 | uint32_t{p[4 * i + 2]} << 8 |
             uint32_t{p[4 * i + 3]};
    for (int i = 16; i < 64; ++i) {
      const uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      const uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
    for (int i = 0; i < 64; ++i) {
      const uint32_t t1 = k + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + kK[i] + w[i];
      const uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      k = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
    }
    h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += k;
  }
  void compress() { compress(block.data()); }
  void update(const uint8_t* p, size_t n) {
    bits += uint64_t{n} * 8;
    while (n > 0) {
      if (used == 0 && n >= 64) {  // whole blocks straight from the input
        compress(p);
        p += 64, n -= 64;
        continue;
      }
      const size_t take = std::min(n, 64 - used);
      std::memcpy(block.data() + used, p, take);
      used += take, p += take, n -= take;
      if (used == 64) compress(), used = 0;
    }
  }
  std::string hex() {
    const uint64_t total = bits;
    const uint8_t one = 0x80, zero = 0;
    update(&one, 1);
    while (used != 56) update(&zero, 1);
    for (int i = 7; i >= 0; --i) block[static_cast<size_t>(63 - i)] = static_cast<uint8_t>(total >> (8 * i));
    compress();
    std::string out;
    for (uint32_t v : h) out += fmt::format("{:08x}", v);
    return out;
  }
};

}  // namespace

struct StagedFile::Hash : Sha256 {
  std::string digest;  // hex, once finished
};

void StagedFile::hash_contents() {
  check(written_ == 0, "{}: hashing asked for after the first write", target_);
  hash_ = std::make_shared<Hash>();
}

void StagedFile::hash_block(const std::byte* p, size_t n) { hash_->update(reinterpret_cast<const uint8_t*>(p), n); }

std::string StagedFile::sha256() {
  if (!hash_) return {};
  close();
  if (hash_->digest.empty()) hash_->digest = hash_->hex();
  return hash_->digest;
}

std::string sha256_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("{}: cannot read: {}", path, std::strerror(errno));
  Sha256 s;
  std::vector<uint8_t> buf(kBufferBytes);
  for (;;) {
    ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      fail("{}: cannot read: {}", path, std::strerror(err));
    }
    if (n == 0) break;
    s.update(buf.data(), static_cast<size_t>(n));
  }
  ::close(fd);
  return s.hex();
}

}  // namespace kiln
