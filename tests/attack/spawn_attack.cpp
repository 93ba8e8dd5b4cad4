// A peer that holds a node agent's key (a joining agent's, or one a rank stole) connects to
// another agent and tries to run a command there the way a driver would: remote-spawn a
// colocator (without a ticket, then with one signed by its node key), ask it to spawn
// workers and launch them, and spawn a worker directly. Prints what each step got; the
// cluster suite checks that every step was refused and the command never ran. Given a
// driver's credentials too, it tries that driver's tickets made for another agent (its
// certificate, then its node id) as steps 3 and 4.
//
// usage: caf-hvd-spawn-attack NODE_CREDENTIALS_DIR HOST PORT FILE_THE_COMMAND_WOULD_CREATE
//        [DRIVER_CREDENTIALS_DIR]
#include <chrono>
#include <cstdio>
#include <ctime>
#include <string>
#include <vector>

#include "actors/config.hpp"
#include "actors/protocol.hpp"
#include "runtime/cluster/credential_files.hpp"
#include "runtime/network/net.hpp"

using namespace cafhvd;

int main(int argc, char** argv) {
  if (argc != 5 && argc != 6) {
    std::fprintf(stderr, "usage: %s NODE_DIR HOST PORT FILE [DRIVER_DIR]\n", argv[0]);
    return 2;
  }
  auto& net = net::module();
  auto creds = net.load_cluster(argv[1], cert_role::node);
  hvd_config cfg;
  cfg.enable_network(liveness{}, &creds);
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  auto port = static_cast<uint16_t>(std::stoi(argv[3]));
  caf::node_id nid;
  self->request(net.connector(sys, true), std::chrono::seconds(10), caf::connect_atom::value,
                std::string{argv[2]}, port)
      .receive([&](caf::node_id& n, caf::strong_actor_ptr&, std::set<std::string>&) { nid = n; },
               [&](caf::error& e) { std::printf("connect: %s\n", sys.render(e).c_str()); });
  if (!nid)
    return 1;
  std::printf("connect: ok\n");
  // The colocator is spawned naming this program's own actor as its driver, so its
  // requests pass the sender check and meet the ticket check.
  auto driver = caf::actor_cast<driver_actor>(self);
  auto mm = net.connector(sys, false);
  auto now = static_cast<long>(std::time(nullptr));
  const std::string touch = argv[4];
  int step = 0;
  std::vector<signed_ticket> tickets{
      signed_ticket{},
      net.sign_ticket(creds, ticket_body("colocator", to_string(nid), "pwn", now))};
  if (argc == 6) {
    // a driver's own tickets, each for another agent: the agent's node id with another
    // certificate (this peer's: as if it had claimed that node id to the driver), then
    // another node id with the agent's own certificate
    auto driver_creds = net.load_cluster(argv[5], cert_role::driver);
    tickets.push_back(net.sign_ticket(
        driver_creds,
        ticket_body("colocator", colocator_audience(to_string(nid), net.own_certificate(creds)),
                    "pwn", now)));
    tickets.push_back(net.sign_ticket(
        driver_creds, ticket_body("colocator",
                                  colocator_audience(to_string(sys.node()),
                                                     net.certificate_of(nid)),
                                  "pwn", now)));
  }
  for (auto& ticket : tickets) {
    ++step;
    colocator_actor c;
    self->request(mm, std::chrono::seconds(10), caf::spawn_atom::value, nid,
                  std::string{colocator_type_name},
                  caf::make_message(driver, coordinator_actor{}, std::string{"pwn"}, int32_t{1000},
                                    ticket),
                  sys.message_types<colocator_actor>())
        .receive([&](caf::strong_actor_ptr& p) { c = caf::actor_cast<colocator_actor>(p); },
                 [&](caf::error& e) { std::printf("spawn %d: %s\n", step, sys.render(e).c_str()); });
    if (!c)
      continue;
    // What a driver does next, in the order it does it (each answered or refused).
    self->request(c, std::chrono::seconds(10), workers_atom::value, std::vector<uint32_t>{0},
                  uint32_t{0})
        .receive(
            [&](std::vector<worker_actor>& ws) {
              std::printf("workers %d: %zu\n", step, ws.size());
            },
            [&](caf::error& e) { std::printf("workers %d: %s\n", step, sys.render(e).c_str()); });
    launch_batch b;
    b.argv = {"/usr/bin/touch", touch};
    b.cwd = "/";
    b.slots = {0};
    b.envs = {{}};
    self->request(c, std::chrono::seconds(10), launch_atom::value, b)
        .receive(
            [&](std::vector<int32_t>& pids) {
              std::printf("launch %d: %zu pids, first %d\n", step, pids.size(),
                          pids.empty() ? 0 : pids[0]);
            },
            [&](caf::error& e) { std::printf("launch %d: %s\n", step, sys.render(e).c_str()); });
    self->request(c, std::chrono::seconds(10), node_atom::value)
        .receive([&](node_info& i) { std::printf("node %d: served as %s\n", step, i.name.c_str()); },
                 [&](caf::error& e) { std::printf("node %d: %s\n", step, sys.render(e).c_str()); });
  }
  // Workers are not offered for remote spawn at all.
  self->request(mm, std::chrono::seconds(10), caf::spawn_atom::value, nid,
                std::string{worker_type_name},
                caf::make_message(colocator_actor{}, driver, coordinator_actor{}, uint32_t{0}),
                sys.message_types<worker_actor>())
      .receive([&](caf::strong_actor_ptr& p) { std::printf("worker spawn: %s\n", p ? "ok" : "null"); },
               [&](caf::error& e) { std::printf("worker spawn: %s\n", sys.render(e).c_str()); });
  std::fflush(stdout);
  std::_Exit(0);
}
