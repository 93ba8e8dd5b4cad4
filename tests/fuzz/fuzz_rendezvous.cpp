// Fuzz target: bytes a rendezvous client may send, through the same HTTP parser limits
// as the server and its request handling, against a store that lives across inputs.
#include <cstddef>
#include <cstdint>
#include <string>

#include <boost/beast/http.hpp>

#include "runtime/horovod/rendezvous_server.hpp"

namespace http = boost::beast::http;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static cafhvd::kv_store store{cafhvd::kv_store::limits{4096, 1 << 20}};
  static int inputs = 0;
  if (++inputs % 10000 == 0)
    store.init(cafhvd::get_host_assignments({{"a", 2}, {"b", 1}}, 3));
  // Several pipelined requests per input, as on a keep-alive connection.
  std::string_view rest{reinterpret_cast<const char*>(data), size};
  for (int n = 0; n < 8 && !rest.empty(); ++n) {
    http::request_parser<http::string_body> parser;
    parser.body_limit(4096);
    parser.header_limit(16 * 1024);
    boost::beast::error_code ec;
    size_t used = 0;
    while (!ec && !parser.is_done() && used < rest.size()) {
      auto n_used = parser.put(boost::asio::buffer(rest.data() + used, rest.size() - used), ec);
      if (n_used == 0 && !ec)
        break;
      used += n_used;
    }
    if (ec || !parser.is_done())
      return 0;
    auto req = parser.release();
    auto verb = req.method_string();
    auto target = req.target();
    // The elastic endpoints' parser (the server tries it first for GETs).
    auto e = cafhvd::parse_elastic_request({target.data(), target.size()}, 600000);
    if (e.what == cafhvd::elastic_request::kind::rank_and_size
        && (e.local_rank < 0 || e.host.empty() || e.host.find('/') != std::string::npos))
      __builtin_trap();
    if (e.wait_ms < 0 || e.wait_ms > 600000)
      __builtin_trap();
    auto a =
        cafhvd::answer_request(store, {verb.data(), verb.size()}, {target.data(), target.size()},
                               std::move(req.body()), req.has_content_length() || req.chunked());
    if (a.status != 0 && (a.status < 200 || a.status > 599))
      __builtin_trap();
    rest.remove_prefix(used);
  }
  return 0;
}
