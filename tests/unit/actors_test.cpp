// Actor-level tests on CAF's deterministic test scheduler (one thread, virtual time).
#include <doctest/doctest.h>

#include <caf/scheduler/test_coordinator.hpp>

#include "actors/config.hpp"
#include "actors/coordinator.hpp"
#include "actors/protocol.hpp"

using namespace cafhvd;

namespace {

struct fixture {
  static hvd_config& init(hvd_config& c) {
    c.set("scheduler.policy", caf::atom("testing"));
    return c;
  }
  hvd_config cfg;
  caf::actor_system sys{init(cfg)};
  caf::scheduler::test_coordinator& sched =
      dynamic_cast<caf::scheduler::test_coordinator&>(sys.scheduler());
};

} // namespace

TEST_CASE_FIXTURE(fixture, "coordinator registers ranks in order and computes 3+1") {
  auto coord = sys.spawn(coordinator_fn);
  std::vector<rank_info> infos;
  std::string error;
  sys.spawn([&](caf::event_based_actor* self) {
    int r = 0;
    for (auto node : {"A", "A", "A", "B"})
      self->request(coord, caf::infinite, register_atom::value, std::string{node},
                    std::string{node}, static_cast<uint32_t>(r++))
          .then([](caf::ok_atom) {}, [&](caf::error& e) { error = sys.render(e); });
    self->request(coord, caf::infinite, finalize_atom::value)
        .then([&](std::vector<rank_info>& xs) { infos = xs; },
              [&](caf::error& e) { error = sys.render(e); });
  });
  sched.run();
  CHECK(error.empty());
  REQUIRE(infos.size() == 4);
  CHECK(infos[0].cross_size == 2);
  CHECK(infos[1].cross_size == 1);
  CHECK(infos[3].local_rank == 0);
  CHECK(infos[3].cross_rank == 1);
  caf::anon_send_exit(coord, caf::exit_reason::user_shutdown);
  sched.run();
}

TEST_CASE_FIXTURE(fixture, "coordinator refuses a rank registered twice") {
  auto coord = sys.spawn(coordinator_fn);
  std::string error;
  sys.spawn([&](caf::event_based_actor* self) {
    for (auto node : {"A", "B"})
      self->request(coord, caf::infinite, register_atom::value, std::string{node},
                    std::string{node}, uint32_t{0})
          .then([](caf::ok_atom) {}, [&](caf::error& e) { error = sys.render(e); });
  });
  sched.run();
  CHECK(error.find("rank 0 registered twice") != std::string::npos);
  caf::anon_send_exit(coord, caf::exit_reason::user_shutdown);
  sched.run();
}

TEST_CASE("protocol messages survive serialization") {
  hvd_config cfg;
  caf::actor_system sys{cfg};
  output_batch batch{3, 1, {"a", "", "line with spaces"}};
  auto msg = caf::make_message(output_atom::value, batch);
  std::vector<char> buf;
  caf::binary_serializer sink{sys, buf};
  REQUIRE(!sink(msg));
  caf::message copy;
  caf::binary_deserializer source{sys, buf};
  REQUIRE(!source(copy));
  REQUIRE(copy.match_elements<output_atom, output_batch>());
  auto& got = copy.get_as<output_batch>(1);
  CHECK(got.rank == 3);
  CHECK(got.stream == 1);
  CHECK(got.lines == batch.lines);
}
