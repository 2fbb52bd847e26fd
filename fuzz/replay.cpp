// A main() for kiln's fuzz targets without libFuzzer: the CI fuzz smoke (scripts/fuzz --replay,
// docs/FUZZING.md). Linked with one target's fuzz/<name>.cpp into fuzz_replay_<name>, built by
// any compiler (CI: GCC with ASan + UBSan, build-asan/), it feeds LLVMFuzzerTestOneInput -- the
// same entry point libFuzzer drives -- every seed file given, then a fixed number of inputs
// mutated from them by a seeded PRNG (bit flips, interesting integers, cut, repeated, spliced
// and truncated runs of bytes). The same arguments give the same inputs, so a finding
// reproduces. No coverage guidance: this is a smoke that keeps the targets built and the
// readers clean on a few thousand near-valid inputs, not a replacement for scripts/fuzz.
//
//   fuzz_replay_<name> [--mutations N] [--seed S] [--max-len N] [--seconds S] [--timeout S]
//                      [--artifact PATH] FILE_OR_DIR...
//
// A finding (a sanitizer report, a crash, an abort -- the harnesses abort on what they check --,
// an uncaught exception, an input running over --timeout seconds) writes the input to
// --artifact (default ./replay-crash) before the process dies; exit status non-zero.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KILN_REPLAY_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define KILN_REPLAY_ASAN 1
#endif
#ifdef KILN_REPLAY_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

// The input being run, for the handlers that write it out when the process dies.
std::vector<uint8_t> g_current;
char g_artifact[4096] = "replay-crash";

void write_current() {  // async-signal-safe: open/write/close only
  int fd = open(g_artifact, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return;
  size_t done = 0;
  while (done < g_current.size()) {
    ssize_t n = write(fd, g_current.data() + done, g_current.size() - done);
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  close(fd);
  static const char msg[] = "replay: the input is written to the --artifact path\n";
  ssize_t ignored = write(2, msg, sizeof msg - 1);
  (void)ignored;
}

void on_signal(int sig) {
  write_current();
  if (sig == SIGALRM) {
    static const char msg[] = "replay: an input ran over --timeout seconds\n";
    ssize_t ignored = write(2, msg, sizeof msg - 1);
    (void)ignored;
    _exit(70);
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

void on_terminate() {
  static const char msg[] = "replay: an exception escaped the target (std::terminate)\n";
  ssize_t ignored = write(2, msg, sizeof msg - 1);
  (void)ignored;
  write_current();
  _exit(71);
}

// xorshift64*: a fixed sequence per --seed, the same on every machine.
struct Rng {
  uint64_t s;
  uint64_t next() {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return s * 0x2545F4914F6CDD1DULL;
  }
  size_t below(size_t n) { return n == 0 ? 0 : static_cast<size_t>(next() % n); }
};

bool read_file(const std::string& path, std::vector<uint8_t>* out) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return false;
  out->clear();
  uint8_t buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out->insert(out->end(), buf, buf + n);
  std::fclose(f);
  return true;
}

void collect(const std::string& path, std::vector<std::string>* files) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) {
    std::fprintf(stderr, "replay: cannot read '%s'\n", path.c_str());
    std::exit(2);
  }
  if (!S_ISDIR(st.st_mode)) {
    files->push_back(path);
    return;
  }
  DIR* d = opendir(path.c_str());
  if (!d) return;
  std::vector<std::string> names;
  while (dirent* e = readdir(d))
    if (e->d_name[0] != '.') names.push_back(e->d_name);
  closedir(d);
  std::sort(names.begin(), names.end());  // a fixed order: the same inputs on every run
  for (const std::string& n : names) collect(path + "/" + n, files);
}

const uint64_t kInteresting[] = {0,          1,          0x7f,       0x80,       0xff,       0x7fff,
                                 0x8000,     0xffff,     0x7fffffff, 0x80000000, 0xffffffff, 0x100000000ULL,
                                 0x7fffffffffffffffULL,  0x8000000000000000ULL,  0xffffffffffffffffULL,
                                 0x10000,    0x40000000};
const char* const kTokens[] = {"-1", "0", "1e308", "18446744073709551615", "-9223372036854775808", "null",
                               "[]", "{}", "\"", "\\u0000", "{{", "}}", "{%", "%}", "for", "in", "if",
                               "range(", ")", "[[[[", "]]]]", "(-1, 16)", "True", "'<f4'", ",", ":"};

void mutate_once(std::vector<uint8_t>& b, const std::vector<std::vector<uint8_t>>& seeds, Rng& rng,
                 size_t max_len) {
  switch (rng.below(9)) {
    case 0:  // flip a bit
      if (!b.empty()) b[rng.below(b.size())] ^= static_cast<uint8_t>(1u << rng.below(8));
      break;
    case 1:  // a random byte
      if (!b.empty()) b[rng.below(b.size())] = static_cast<uint8_t>(rng.next());
      break;
    case 2: {  // an interesting integer, 1/2/4/8 bytes little-endian, over the bytes at a place
      if (b.empty()) break;
      const uint64_t v = kInteresting[rng.below(sizeof kInteresting / sizeof kInteresting[0])];
      const size_t width = size_t{1} << rng.below(4);
      const size_t at = rng.below(b.size());
      for (size_t i = 0; i < width && at + i < b.size(); ++i) b[at + i] = static_cast<uint8_t>(v >> (8 * i));
      break;
    }
    case 3: {  // cut a run
      if (b.empty()) break;
      const size_t at = rng.below(b.size());
      const size_t n = 1 + rng.below(std::min<size_t>(b.size() - at, 64));
      b.erase(b.begin() + static_cast<ptrdiff_t>(at), b.begin() + static_cast<ptrdiff_t>(at + n));
      break;
    }
    case 4: {  // repeat a run in place
      if (b.empty()) break;
      const size_t at = rng.below(b.size());
      const size_t n = 1 + rng.below(std::min<size_t>(b.size() - at, 64));
      std::vector<uint8_t> run(b.begin() + static_cast<ptrdiff_t>(at), b.begin() + static_cast<ptrdiff_t>(at + n));
      const size_t times = 1 + rng.below(8);
      for (size_t k = 0; k < times; ++k) b.insert(b.begin() + static_cast<ptrdiff_t>(at), run.begin(), run.end());
      break;
    }
    case 5: {  // a text token (the JSON, Jinja and .npy header readers)
      const char* t = kTokens[rng.below(sizeof kTokens / sizeof kTokens[0])];
      const size_t at = rng.below(b.size() + 1);
      b.insert(b.begin() + static_cast<ptrdiff_t>(at), t, t + std::strlen(t));
      break;
    }
    case 6: {  // splice: this input's head, another seed's tail
      const std::vector<uint8_t>& o = seeds[rng.below(seeds.size())];
      if (o.empty()) break;
      const size_t at = rng.below(b.size() + 1);
      const size_t from = rng.below(o.size());
      b.resize(at);
      b.insert(b.end(), o.begin() + static_cast<ptrdiff_t>(from), o.end());
      break;
    }
    case 7:  // truncate
      b.resize(rng.below(b.size() + 1));
      break;
    case 8: {  // a byte copied over another (offsets and lengths pointing elsewhere)
      if (b.size() < 2) break;
      b[rng.below(b.size())] = b[rng.below(b.size())];
      break;
    }
  }
  if (b.size() > max_len) b.resize(max_len);
}

void run_one(const std::vector<uint8_t>& input, unsigned timeout) {
  g_current = input;
  if (timeout) alarm(timeout);
  LLVMFuzzerTestOneInput(g_current.data(), g_current.size());
  if (timeout) alarm(0);
}

}  // namespace

int main(int argc, char** argv) {
  size_t mutations = 2000, max_len = 65536;
  uint64_t seed = 1;
  double seconds = 0;
  unsigned timeout = 30;
  std::vector<std::string> paths;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "replay: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--mutations") mutations = std::strtoull(value(), nullptr, 10);
    else if (a == "--seed") seed = std::strtoull(value(), nullptr, 10);
    else if (a == "--max-len") max_len = std::strtoull(value(), nullptr, 10);
    else if (a == "--seconds") seconds = std::strtod(value(), nullptr);
    else if (a == "--timeout") timeout = static_cast<unsigned>(std::strtoul(value(), nullptr, 10));
    else if (a == "--artifact") std::snprintf(g_artifact, sizeof g_artifact, "%s", value());
    else if (!a.empty() && a[0] == '-') {
      std::fprintf(stderr, "replay: unknown argument '%s'\n", a.c_str());
      return 2;
    } else paths.push_back(a);
  }
  std::vector<std::string> files;
  for (const std::string& p : paths) collect(p, &files);
  std::vector<std::vector<uint8_t>> seeds;
  for (const std::string& f : files) {
    std::vector<uint8_t> b;
    if (!read_file(f, &b)) {
      std::fprintf(stderr, "replay: cannot read '%s'\n", f.c_str());
      return 2;
    }
    if (b.size() > max_len) b.resize(max_len);
    seeds.push_back(std::move(b));
  }
  if (seeds.empty()) {
    std::fprintf(stderr, "replay: no seed files\n");
    return 2;
  }

  std::set_terminate(on_terminate);
  signal(SIGALRM, on_signal);
#ifdef KILN_REPLAY_ASAN
  // The sanitizers report and die through their own handlers; this runs just before the end.
  __sanitizer_set_death_callback(write_current);
  signal(SIGABRT, on_signal);  // a harness's own check (ASan leaves SIGABRT alone by default)
#else
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) signal(sig, on_signal);
#endif

  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  for (const std::vector<uint8_t>& s : seeds) run_one(s, timeout);
  Rng rng{seed * 0x9E3779B97F4A7C15ULL + 1};
  size_t done = 0;
  for (; done < mutations; ++done) {
    if (seconds > 0 && (done & 15) == 0 && elapsed() > seconds) break;
    std::vector<uint8_t> b = seeds[done % seeds.size()];
    const size_t n = 1 + rng.below(4);
    for (size_t k = 0; k < n; ++k) mutate_once(b, seeds, rng, max_len);
    run_one(b, timeout);
  }
  std::printf("replay: %zu seeds and %zu mutated inputs (--seed %llu) in %.1f s, no finding%s\n", seeds.size(), done,
              static_cast<unsigned long long>(seed), elapsed(),
              done < mutations ? " (stopped at --seconds)" : "");
  return 0;
}
