// Fuzz target: bytes a client sends to a job's rendezvous server, through the real server
// (its parser, its access rules, its elastic endpoints and lots) up to the calls that
// become the coordinator's messages. Whatever comes, every host those calls carry is a
// host name, every rank is one of the plan's, the event JSON the coordinator builds from
// them is written without a throw, and the server answers the next client.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "runtime/network/allowlist.hpp"
#include "runtime/horovod/rendezvous_server.hpp"
#include "runtime/observe/text.hpp"

namespace {

using namespace cafhvd;

void check_host(const std::string& host) {
  if (!valid_host_name(host))
    __builtin_trap();
  // what the coordinator's events do with it
  auto text = json_text(nlohmann::json{{"slot", slot_key(host, 0)}, {"host", host}});
  if (text.empty())
    __builtin_trap();
}

struct server {
  std::unique_ptr<rendezvous_server> srv;
  uint16_t lot = 0;
  server() {
    auto allow = std::make_shared<address_allowlist>();
    allow->add_host("a", {"10.0.0.1"}, true);   // on this machine: loopback speaks for it
    allow->add_host("b", {"10.0.0.2"}, false);  // remote: loopback never does
    rendezvous_options o;
    o.allowlist = allow;
    o.on_refused = [](const std::string& what) {
      for (char c : what)
        if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f)
          __builtin_trap(); // reaches a terminal: escaped
    };
    o.request_timeout = std::chrono::milliseconds(200);
    o.max_wait = std::chrono::milliseconds(20);
    srv = std::make_unique<rendezvous_server>(o);
    srv->init(get_host_assignments({{"a", 2}, {"b", 1}}, 3));
    srv->enable_elastic(
        [](const std::string& host, int lr) {
          check_host(host);
          if (host != "a" || lr < 0) // only a's own slots reach a vote from loopback
            __builtin_trap();
        },
        [](const std::string& host, int lr, const std::string&) {
          check_host(host);
          if (host != "a" || lr < 0)
            __builtin_trap();
        });
    srv->on_gloo_progress([](uint64_t, const std::string& scope, int rank, bool,
                             const std::string& client) {
      if (rank < 0 || rank >= 3 || (scope != "global" && scope.compare(0, 6, "cross_") != 0))
        __builtin_trap();
      json_text(nlohmann::json{{"scope", scope}, {"client", client}});
    });
    srv->on_parked([](uint64_t, int rank, const std::string&) {
      if (rank < 0)
        __builtin_trap();
    });
    lot = srv->open_lot(2);
  }
};

// Sends `bytes` on a fresh connection and reads what comes back for a short while (held
// requests are left held: the connection is closed under them).
std::string exchange(uint16_t port, std::string_view bytes) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  std::string out;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
    size_t sent = 0;
    while (sent < bytes.size()) {
      auto n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n <= 0)
        break;
      sent += static_cast<size_t>(n);
    }
    ::shutdown(fd, SHUT_WR); // the server closes once it answered all
    char buf[4096];
    pollfd p{fd, POLLIN, 0};
    while (::poll(&p, 1, 30) > 0) {
      auto n = ::read(fd, buf, sizeof(buf));
      if (n <= 0)
        break;
      out.append(buf, static_cast<size_t>(n));
    }
  }
  ::close(fd);
  return out;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static server s;
  std::string_view bytes{reinterpret_cast<const char*>(data), size};
  // the first byte picks the port: the main one or the generation's lot
  bool to_lot = size > 0 && (data[0] & 1);
  if (size > 0)
    bytes.remove_prefix(1);
  exchange(to_lot ? s.lot : s.srv->port(), bytes);
  // the server still serves
  auto probe = exchange(s.srv->port(), "GET /probe/x HTTP/1.1\r\nHost: h\r\n\r\n");
  if (probe.rfind("HTTP/1.1 404", 0) != 0)
    __builtin_trap();
  return 0;
}
