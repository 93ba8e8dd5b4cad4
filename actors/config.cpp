// Registration of caf-hvd's message types and spawnable actors.
#include "actors/config.hpp"

#include <caf/openssl/all.hpp>

#include "actors/node_actors.hpp"
#include "actors/protocol.hpp"

namespace cafhvd {

hvd_config::hvd_config() {
  add_message_type<interface_addr>("cafhvd::interface_addr");
  add_message_type<node_info>("cafhvd::node_info");
  add_message_type<probe_target>("cafhvd::probe_target");
  add_message_type<probe_result>("cafhvd::probe_result");
  add_message_type<launch_spec>("cafhvd::launch_spec");
  add_message_type<output_batch>("cafhvd::output_batch");
  add_message_type<rank_exit>("cafhvd::rank_exit");
  add_message_type<rank_info>("cafhvd::rank_info");
  add_message_type<driver_actor>("cafhvd::driver_actor");
  add_actor_type(colocator_type_name, colocator_fn);
  add_actor_type(worker_type_name, worker_fn);
  // A foreign CAF application that finds the port is refused at the handshake.
  set("middleman.app-identifiers", std::vector<std::string>{"caf-hvd/1"});
  // Two scheduler threads fit this kind of machine; more only adds polling.
  set("scheduler.max-threads", size_t{2});
}

void hvd_config::enable_network(const liveness& l, const cluster_credentials* creds) {
  set("middleman.heartbeat-interval", caf::timespan{l.heartbeat});
  set("middleman.connection-timeout", caf::timespan{l.timeout});
  // Never: it opens a second, unauthenticated plain-TCP port (reference/caf.md §6.5).
  set("middleman.enable-automatic-connections", false);
  load<caf::io::middleman>();
  if (creds) {
    openssl_certificate = creds->member_cert;
    openssl_key = creds->member_key;
    openssl_cafile = creds->ca_cert;
    load<caf::openssl::manager>();
  }
}

const node_settings& settings_of(caf::actor_system& sys) {
  return *static_cast<const hvd_config&>(sys.config()).node;
}

caf::actor spawn_guardian(caf::actor_system& sys) {
  return sys.spawn([](caf::event_based_actor* self) -> caf::behavior {
    self->set_exit_handler([](caf::exit_msg&) {});
    return {[=](shutdown_atom) { self->quit(caf::exit_reason::user_shutdown); }};
  });
}

} // namespace cafhvd
