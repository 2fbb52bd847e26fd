// Error messages of the tokenizer library as one printable line.
#pragma once

#include <string>
#include <string_view>

namespace kiln::tok {

// `what` as one printable line (a file's strings, a chat template's text or its raise_exception()
// messages may hold newlines): control characters escaped, at most 300 bytes.
std::string one_line(std::string_view what);

}  // namespace kiln::tok
