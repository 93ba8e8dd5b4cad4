// A torch.distributed TCPStore server, as torchrun's agent runs one: with
// TORCHELASTIC_USE_AGENT_STORE=True every rank is a client of it, so no rank waits for
// rank 0's freshly imported torch to listen (torch's client retries a refused
// connection only after a full second). It speaks every store protocol torch has used
// since 1.13, chosen per connection (runtime/torch/torch_store_protocol.hpp).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "runtime/network/allowlist.hpp"
#include "runtime/torch/torch_store_protocol.hpp"

namespace cafhvd {

class torch_store_server {
public:
  /// Called on the server's thread when a connection is closed for a protocol
  /// violation: a line that names the client, its dialect and what it sent.
  using problem_handler = std::function<void(const std::string&)>;

  /// Listens on `bind`:`port` (0 = a free port). Throws std::runtime_error on failure.
  /// With `allowlist`, only its clients connect; others are closed at once and reported
  /// (once per address) through `on_refused`.
  torch_store_server(const std::string& bind, uint16_t port, problem_handler on_problem = {},
                     torch_store_limits limits = {},
                     std::shared_ptr<address_allowlist> allowlist = {},
                     problem_handler on_refused = {});
  ~torch_store_server();
  torch_store_server(const torch_store_server&) = delete;
  torch_store_server& operator=(const torch_store_server&) = delete;
  uint16_t port() const;
  /// A fresh key space (a new generation of an elastic job); returns once it is done,
  /// so no client of the new generation can see an old key.
  void clear();

private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

} // namespace cafhvd
