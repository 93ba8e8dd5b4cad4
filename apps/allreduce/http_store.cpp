// http_store: Boost.Beast synchronous client with one keep-alive connection.
#include "apps/allreduce/http_store.hpp"

#include <cctype>
#include <optional>
#include <thread>
#include <utility>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <fmt/format.h>
#include <gloo/common/error.h>

namespace cafhvd {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

struct http_store::connection {
  net::io_context io;
  std::optional<beast::tcp_stream> stream;
  beast::flat_buffer buffer;
};

namespace {

std::string encode(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~')
      out += static_cast<char>(c);
    else
      out += fmt::format("%{:02X}", c);
  }
  return out;
}

} // namespace

http_store::http_store(std::string host, uint16_t port, std::string scope, int rank,
                       std::chrono::milliseconds timeout)
    : host_(std::move(host)), port_(port), scope_(std::move(scope)), rank_(rank), timeout_(timeout),
      conn_(std::make_unique<connection>()) {}

http_store::~http_store() = default;

http_store::response http_store::request(const char* method, const std::string& key,
                                         const std::string& query, const std::string& body) {
  auto target = fmt::format("/{}/{}{}", encode(scope_), encode(key), query);
  std::string last_error;
  // A fresh connection is tried again at once; then three more tries 200 ms apart
  // cover a server that is briefly overloaded.
  for (int attempt = 0; attempt < 5; ++attempt) {
    try {
      auto& c = *conn_;
      if (!c.stream) {
        c.stream.emplace(c.io);
        c.stream->expires_after(std::chrono::seconds(10));
        c.stream->connect(tcp::endpoint{net::ip::make_address(host_), port_});
        c.stream->socket().set_option(tcp::no_delay(true));
      }
      http::request<http::string_body> req{http::string_to_verb(method), target, 11};
      req.set(http::field::host, host_);
      req.body() = body;
      req.prepare_payload();
      c.stream->expires_after(timeout_ + hold_ + std::chrono::seconds(10));
      http::write(*c.stream, req);
      http::response_parser<http::string_body> parser;
      parser.body_limit(1u << 30);
      http::read(*c.stream, c.buffer, parser);
      auto res = parser.release();
      ++requests_;
      if (!res.keep_alive())
        c.stream.reset();
      return {static_cast<int>(res.result_int()), std::move(res.body())};
    } catch (const std::exception& e) {
      last_error = e.what();
      conn_->stream.reset();
      conn_->buffer.clear();
      if (attempt >= 1)
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  }
  throw gloo::IoException(fmt::format("rendezvous server {}:{} unreachable ({} {}): {}", host_,
                                      port_, method, target, last_error));
}

void http_store::set(const std::string& key, const std::vector<char>& data) {
  auto res = request("PUT", key, "", std::string(data.begin(), data.end()));
  if (res.status != 200)
    throw gloo::IoException(
        fmt::format("rendezvous server refused PUT {}/{}: HTTP {}", scope_, key, res.status));
}

std::string http_store::fetch(const std::string& key, std::chrono::milliseconds timeout) {
  if (auto it = cache_.find(key); it != cache_.end())
    return it->second;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0)
      break;
    auto res = request("GET", key, fmt::format("?wait_ms={}&snapshot=1", left.count()), "");
    if (res.status == 200) {
      absorb_snapshot(res.body);
      if (auto it = cache_.find(key); it != cache_.end())
        return it->second;
      throw gloo::IoException(
          fmt::format("rendezvous server's snapshot of scope '{}' lacks key '{}'", scope_, key));
    }
    if (res.status != 404)
      throw gloo::IoException(fmt::format("rendezvous server answered GET {}/{} with HTTP {}",
                                          scope_, key, res.status));
  }
  throw gloo::IoException(fmt::format(
      "timed out after {} s waiting for key '{}' of scope '{}' on the rendezvous server (raise "
      "HOROVOD_GLOO_TIMEOUT_SECONDS if peers start slowly)",
      timeout.count() / 1000.0, key, scope_));
}

void http_store::absorb_snapshot(const std::string& body) {
  size_t pos = 0;
  auto field = [&](std::string& out) {
    auto colon = body.find(':', pos);
    if (colon == std::string::npos)
      throw gloo::IoException("malformed snapshot from the rendezvous server");
    auto len = std::stoul(body.substr(pos, colon - pos));
    if (colon + 1 + len > body.size())
      throw gloo::IoException("truncated snapshot from the rendezvous server");
    out = body.substr(colon + 1, len);
    pos = colon + 1 + len;
  };
  while (pos < body.size()) {
    std::string k, v;
    field(k);
    field(v);
    cache_.emplace(std::move(k), std::move(v));
  }
}

std::vector<char> http_store::get(const std::string& key) {
  auto v = fetch(key, timeout_);
  return {v.begin(), v.end()};
}

void http_store::wait(const std::vector<std::string>& keys) {
  wait(keys, timeout_);
}

void http_store::wait(const std::vector<std::string>& keys,
                      const std::chrono::milliseconds& timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (auto& k : keys)
    fetch(k, std::max(std::chrono::milliseconds(1),
                      std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())));
}

std::optional<std::string> http_store::try_get(const std::string& key) {
  auto res = request("GET", key, "", "");
  if (res.status == 200)
    return std::move(res.body);
  return std::nullopt;
}

void http_store::finalize() {
  request("DELETE", std::to_string(rank_), "", "");
}

} // namespace cafhvd
