// A torch.distributed TCPStore server (the wire protocol of torch 1.13, Debian's), as
// torchrun's agent runs one: with TORCHELASTIC_USE_AGENT_STORE=True every rank is a
// client of it, so no rank waits for rank 0's freshly imported torch to listen (torch's
// client retries a refused connection only after a full second).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace cafhvd {

class torch_store_server {
public:
  /// Listens on `bind`:`port` (0 = a free port). Throws std::runtime_error on failure.
  torch_store_server(const std::string& bind, uint16_t port);
  ~torch_store_server();
  torch_store_server(const torch_store_server&) = delete;
  torch_store_server& operator=(const torch_store_server&) = delete;
  uint16_t port() const;

private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

} // namespace cafhvd
