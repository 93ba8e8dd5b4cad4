// Coordinator behaviour over runtime/assignment's rank_registry.
#include "actors/coordinator.hpp"

namespace cafhvd {

coordinator_actor::behavior_type
coordinator_fn(coordinator_actor::stateful_pointer<coordinator_state> self) {
  return {
      [=](register_atom, const std::string& hostname, const std::string& node,
          uint32_t rank) -> caf::result<caf::ok_atom> {
        try {
          self->state.registry.add(hostname, node, static_cast<int>(rank));
        } catch (const std::exception& e) {
          return caf::make_error(caf::sec::invalid_argument, e.what());
        }
        return caf::ok_atom::value;
      },
      [=](finalize_atom) -> caf::result<std::vector<rank_info>> {
        try {
          auto values = self->state.registry.finalize();
          std::vector<rank_info> out;
          for (size_t r = 0; r < values.size(); ++r) {
            auto& v = values[r];
            out.push_back(rank_info{static_cast<int32_t>(r), v.local_rank, v.local_size,
                                    v.cross_rank, v.cross_size});
          }
          return out;
        } catch (const std::exception& e) {
          return caf::make_error(caf::sec::invalid_argument, e.what());
        }
      },
      [=](rendezvous_atom, const std::string& bind) -> caf::result<uint16_t> {
        try {
          auto& st = self->state;
          if (!st.server) {
            rendezvous_options opts;
            opts.bind = bind;
            st.server = std::make_unique<rendezvous_server>(opts);
          }
          st.server->init(st.registry.plan());
          return st.server->port();
        } catch (const std::exception& e) {
          return caf::make_error(caf::sec::runtime_error, e.what());
        }
      },
  };
}

} // namespace cafhvd
