// A Gloo rendezvous store over caf-hvd's rendezvous server (Horovod's HTTP protocol).
// Waits use the server's long-poll GET, so a peer's key is seen the moment it arrives,
// and ask for a snapshot of the scope, so that one answer brings every peer's value
// that already exists (Gloo writes each key once, so they are cached).
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <gloo/rendezvous/store.h>

namespace cafhvd {

class http_store : public gloo::rendezvous::Store {
public:
  /// `scope` is the key prefix (global, local_<host>, cross_<lr>); `rank` is this
  /// process's rank in it (the key DELETEd by finalize). `timeout` bounds every wait.
  http_store(std::string host, uint16_t port, std::string scope, int rank,
             std::chrono::milliseconds timeout);
  ~http_store() override;

  void set(const std::string& key, const std::vector<char>& data) override;
  /// Blocks until the key exists (Gloo's connectFullMesh reads some keys without a wait).
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;
  /// DELETE /<scope>/<rank>, as Horovod does once the context is connected.
  void finalize();

  /// A plain GET that does not wait: the value, or nullopt when the key is absent.
  std::optional<std::string> try_get(const std::string& key);

  /// The server may hold a request this much longer than `timeout` before answering it (a
  /// newcomer's first request waits at its plan's lot until the release: warm joins).
  void allow_hold(std::chrono::milliseconds hold) { hold_ = hold; }

  /// Number of HTTP requests sent (for benchmarks).
  size_t requests() const { return requests_; }

private:
  struct connection;
  struct response {
    int status = 0;
    std::string body;
  };
  response request(const char* method, const std::string& key, const std::string& query,
                   const std::string& body);
  std::string fetch(const std::string& key, std::chrono::milliseconds timeout);
  void absorb_snapshot(const std::string& body);

  std::string host_;
  uint16_t port_;
  std::string scope_;
  int rank_;
  std::chrono::milliseconds timeout_;
  std::chrono::milliseconds hold_{0};
  std::unique_ptr<connection> conn_;
  std::map<std::string, std::string> cache_; // Gloo writes each key once
  size_t requests_ = 0;
};

} // namespace cafhvd
