// Text from the network made safe (see text.hpp).
#include "runtime/observe/text.hpp"

#include <algorithm>

#include <fmt/format.h>

namespace cafhvd {

std::string printable(std::string_view s, size_t max) {
  std::string out;
  out.reserve(std::min(s.size(), max) + 8);
  for (size_t i = 0; i < s.size() && i < max; ++i) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\')
      out += static_cast<char>(c);
    else
      out += fmt::format("\\x{:02x}", c);
  }
  if (s.size() > max)
    out += "...";
  return out;
}

bool valid_host_name(std::string_view s) {
  return !s.empty() && s.size() <= 255 && std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.'
           || c == '-' || c == '_';
  });
}

} // namespace cafhvd
