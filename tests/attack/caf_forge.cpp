// A forging peer as an ordinary CAF program: caf-hvd's own message types, a connection
// opened as a driver opens one (the network module's TLS connector, a driver's
// credentials), and a proxy for each actor id taken from the middleman's BASP broker (its
// proxy registry's get_or_put), the way another user's driver certificate first reached a
// job's colocator. It asks every actor id 1..N what a driver would ask (node info,
// workers, launch batches, a rank's launch) and sends what a driver or a worker would
// send (calls, results, logs, output, SIGKILL), all at once, then prints per request kind
// how many were answered with data, refused by their receiver ("refused, the sender has
// no right to it") or got no answer (no such actor, another type, timeout).
//
// usage: caf-hvd-caf-forge CREDS_DIR HOST PORT MARKER MAX_ACTOR_ID
//   CREDS_DIR: a driver's credentials (another user's, in the isolation suite)
//   MARKER: the file the forged launches' command would write
#include <chrono>
#include <cstdio>
#include <future>
#include <map>
#include <string>
#include <vector>

#include <caf/io/basp_broker.hpp>
#include <caf/io/middleman.hpp>

#include "actors/config.hpp"
#include "actors/protocol.hpp"
#include "runtime/network/net.hpp"

using namespace cafhvd;

namespace {

// The middleman's BASP broker (looked up on the middleman's own thread).
caf::io::basp_broker* basp_broker_of(caf::actor_system& sys) {
  std::promise<caf::io::basp_broker*> got;
  auto& mm = sys.middleman();
  mm.backend().post([&] {
    auto broker = mm.named_broker<caf::io::basp_broker>(caf::atom("BASP"));
    got.set_value(dynamic_cast<caf::io::basp_broker*>(caf::actor_cast<caf::abstract_actor*>(broker)));
  });
  return got.get_future().get();
}

// The proxy of actor `aid` on node `nid` from the broker's registry, made here as CAF's
// own workers make one when they deserialize a handle (not on the middleman's thread:
// there the broker takes the last received message's node as a route).
caf::strong_actor_ptr proxy_of(caf::io::basp_broker* bb, const caf::node_id& nid, caf::actor_id aid) {
  return bb->instance.proxies().get_or_put(nid, aid);
}

struct tally {
  std::map<std::string, int> answered, refused, silent;
  void error(const std::string& kind, const std::string& text) {
    if (text.find("refused, the sender has no right to it") != std::string::npos)
      ++refused[kind];
    else
      ++silent[kind];
  }
};

} // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s CREDS_DIR HOST PORT MARKER MAX_ACTOR_ID\n", argv[0]);
    return 2;
  }
  std::string dir = argv[1], host = argv[2], marker = argv[4];
  auto port = static_cast<uint16_t>(std::stoi(argv[3]));
  auto max_id = static_cast<caf::actor_id>(std::stoul(argv[5]));
  auto creds = net::module().load_cluster(dir, cert_role::driver);
  hvd_config cfg;
  cfg.enable_network(liveness{}, &creds);
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  caf::node_id nid;
  std::string problem;
  self->request(net::module().connector(sys, true), std::chrono::seconds(10),
                caf::connect_atom::value, host, port)
      .receive([&](caf::node_id& n, caf::strong_actor_ptr&, std::set<std::string>&) { nid = n; },
               [&](caf::error& e) { problem = sys.render(e); });
  if (!nid) {
    std::printf("connect: failed: %s\n", problem.c_str());
    return 1;
  }
  std::printf("connect: ok\n");
  std::fflush(stdout);
  launch_batch batch;
  batch.argv = {"/bin/sh", "-c", "id -un > " + marker};
  batch.slots = {0};
  batch.envs = {{}};
  launch_spec spec;
  spec.argv = batch.argv;
  tally t;
  const auto wait = std::chrono::seconds(10);
  // Every request at once (a timeout each, not one after the other), then every answer.
  using colocator_requests =
      std::tuple<decltype(self->request(colocator_actor{}, wait, node_atom::value)),
                 decltype(self->request(colocator_actor{}, wait, workers_atom::value,
                                        std::vector<uint32_t>{}, uint32_t{0})),
                 decltype(self->request(colocator_actor{}, wait, launch_atom::value, batch)),
                 decltype(self->request(worker_actor{}, wait, launch_atom::value, spec))>;
  std::vector<colocator_requests> pending;
  auto* bb = basp_broker_of(sys);
  if (!bb) {
    std::printf("no BASP broker\n");
    return 1;
  }
  for (caf::actor_id aid = 1; aid <= max_id; ++aid) {
    auto p = proxy_of(bb, nid, aid);
    if (!p) {
      std::printf("proxy %llu: none\n", static_cast<unsigned long long>(aid));
      return 1;
    }
    auto as_colocator = caf::actor_cast<colocator_actor>(p);
    auto as_worker = caf::actor_cast<worker_actor>(p);
    pending.emplace_back(self->request(as_colocator, wait, node_atom::value),
                         self->request(as_colocator, wait, workers_atom::value,
                                       std::vector<uint32_t>{0}, uint32_t{0}),
                         self->request(as_colocator, wait, launch_atom::value, batch),
                         self->request(as_worker, wait, launch_atom::value, spec));
    // what a driver or a worker sends without asking
    self->send(as_worker, call_atom::value, uint64_t{1}, uint32_t{0}, std::string{"payload"});
    self->send(as_colocator, call_atom::value, uint64_t{1}, uint32_t{0}, std::string{"payload"},
               std::vector<uint32_t>{0});
    self->send(as_worker, result_atom::value, uint64_t{1}, std::string{"forged"});
    self->send(as_worker, log_atom::value, std::string{"forged"});
    self->send(as_worker, output_atom::value, output_batch{0, 0, {"forged output"}});
    self->send(as_worker, terminate_atom::value, int32_t{9});
    self->send(as_colocator, terminate_atom::value, int32_t{0});
  }
  for (auto& [info, workers, launch, rank_launch] : pending) {
    info.receive([&](node_info&) { ++t.answered["node info"]; },
                 [&](caf::error& e) { t.error("node info", sys.render(e)); });
    workers.receive(
        [&](std::vector<worker_actor>& ws) {
          bool any = false;
          for (auto& w : ws)
            any |= static_cast<bool>(w);
          if (any)
            ++t.answered["workers"];
          else
            ++t.silent["workers"];
        },
        [&](caf::error& e) { t.error("workers", sys.render(e)); });
    launch.receive([&](std::vector<int32_t>&) { ++t.answered["launch batch"]; },
                   [&](caf::error& e) { t.error("launch batch", sys.render(e)); });
    rank_launch.receive([&](int32_t) { ++t.answered["rank launch"]; },
                        [&](caf::error& e) { t.error("rank launch", sys.render(e)); });
  }
  for (auto kind : {"node info", "workers", "launch batch", "rank launch"})
    std::printf("%s: answered %d, refused %d, no answer %d\n", kind, t.answered[kind],
                t.refused[kind], t.silent[kind]);
  std::fflush(stdout);
  return 0;
}
