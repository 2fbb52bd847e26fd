// Helpers of the ProgramModel (include/kiln/pte/program_model.h).
#include "kiln/pte/program_model.h"

#include <memory>
#include <utility>

namespace kiln::pte {

DataBlob DataBlob::from_bytes(std::vector<std::byte> bytes) {
  // Shared so the DataBlob stays copyable (std::function) without copying the bytes.
  auto owned = std::make_shared<const std::vector<std::byte>>(std::move(bytes));
  DataBlob blob;
  blob.size = owned->size();
  blob.write = [owned](const std::function<void(std::span<const std::byte>)>& sink) {
    if (!owned->empty()) sink(std::span<const std::byte>(owned->data(), owned->size()));
  };
  return blob;
}

}  // namespace kiln::pte
