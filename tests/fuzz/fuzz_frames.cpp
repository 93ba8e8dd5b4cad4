// Fuzz target: the executor frame decoder. The input is fed in chunks whose sizes come
// from its first byte, with a small payload limit so the limit path is reachable; every
// frame that decodes must re-encode to exactly the bytes it came from, and a decoder
// that failed must stay failed.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "runtime/launch/channel.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0)
    return 0;
  size_t chunk = data[0] % 31 + 1;
  std::string stream(reinterpret_cast<const char*>(data) + 1, size - 1);
  cafhvd::frame_decoder dec{4096};
  std::vector<cafhvd::frame> out;
  std::string reencoded;
  bool failed = false;
  for (size_t off = 0; off < stream.size(); off += chunk) {
    auto n = std::min(chunk, stream.size() - off);
    auto bad = dec.feed(stream.data() + off, n, out);
    for (auto& f : out)
      reencoded += cafhvd::encode_frame(f);
    out.clear();
    if (bad) {
      failed = true;
      break;
    }
  }
  if (failed) {
    if (!dec.failed() || !dec.feed("x", 1, out) || !out.empty())
      std::abort();
    return 0;
  }
  // everything decoded so far is a prefix of the input; the rest is the unfinished frame
  if (stream.compare(0, reencoded.size(), reencoded) != 0)
    std::abort();
  bool rest = reencoded.size() < stream.size();
  if (rest == dec.at_eof().empty())
    std::abort();
  return 0;
}
