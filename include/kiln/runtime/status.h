// Errors as values for kiln's runtime, which builds without exceptions.
#pragma once

#include <cstdint>
#include <utility>

namespace kiln::rt {

enum class Status : uint8_t {
  Ok = 0,
  InvalidArgument,  // wrong dtype, shape, arity or value from the caller or program
  InvalidProgram,   // the .pte is malformed or inconsistent
  NotFound,         // method, operator, kernel or backend missing
  NotSupported,     // valid, but kiln does not implement it
  OutOfMemory,
  OutOfRange,       // index/offset past the end
  AccessFailed,     // file could not be opened or mapped
  Internal,
};

const char* status_name(Status s);

// A value or the Status saying why there is none. T must be movable.
template <typename T>
class Result {
 public:
  Result(T value) : ok_(true), status_(Status::Ok) { new (&storage_) T(std::move(value)); }  // NOLINT
  Result(Status s) : ok_(false), status_(s) {}                                                   // NOLINT
  Result(Result&& o) noexcept : ok_(o.ok_), status_(o.status_) {
    if (ok_) new (&storage_) T(std::move(*o.ptr()));
  }
  Result(const Result&) = delete;
  Result& operator=(const Result&) = delete;
  Result& operator=(Result&&) = delete;
  ~Result() {
    if (ok_) ptr()->~T();
  }

  bool ok() const { return ok_; }
  Status status() const { return status_; }
  T& value() { return *ptr(); }
  const T& value() const { return *ptr(); }
  T* operator->() { return ptr(); }
  T& operator*() { return *ptr(); }

 private:
  T* ptr() { return std::launder(reinterpret_cast<T*>(&storage_)); }
  const T* ptr() const { return std::launder(reinterpret_cast<const T*>(&storage_)); }
  bool ok_;
  Status status_;
  alignas(T) unsigned char storage_[sizeof(T)];
};

}  // namespace kiln::rt
