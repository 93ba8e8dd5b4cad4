// Gloo's own full-mesh rendezvous through http_store and the rendezvous server, with
// ranks as threads of this process, then an allreduce on the mesh.
#include <doctest/doctest.h>

#include <thread>

#include <gloo/allreduce.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>

#include "apps/allreduce/http_store.hpp"
#include "runtime/horovod/rendezvous_server.hpp"

using namespace cafhvd;
using namespace std::chrono_literals;

TEST_CASE("four ranks connect a Gloo mesh through the server and allreduce") {
  rendezvous_server srv{rendezvous_options{}};
  srv.init(get_host_assignments({{"h", 4}}, 4));
  std::vector<std::string> errors(4);
  std::vector<float> results(4);
  std::vector<size_t> requests(4);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 4; ++r)
    ranks.emplace_back([&, r] {
      try {
        gloo::transport::tcp::attr attr;
        attr.hostname = "127.0.0.1";
        auto dev = gloo::transport::tcp::CreateDevice(attr);
        http_store store{"127.0.0.1", srv.port(), "global", r, 10s};
        auto ctx = std::make_shared<gloo::rendezvous::Context>(r, 4);
        ctx->connectFullMesh(store, dev);
        std::vector<float> buf(1000, static_cast<float>(r + 1));
        gloo::AllreduceOptions o(ctx);
        o.setOutput(buf.data(), buf.size());
        void (*fn)(void*, const void*, const void*, size_t) = &gloo::sum<float>;
        o.setReduceFunction(fn);
        o.setTag(1);
        gloo::allreduce(o);
        results[r] = buf[999];
        store.finalize();
        requests[r] = store.requests();
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : ranks)
    t.join();
  for (int r = 0; r < 4; ++r) {
    CHECK(errors[r] == "");
    CHECK(results[r] == 10.0f);
    // set rank_r, 3 peers' rank_i/blob reads at most, one DELETE: no polling loops.
    CHECK(requests[r] <= 10);
  }
}

TEST_CASE("a missing peer ends the wait with a clear timeout") {
  rendezvous_server srv{rendezvous_options{}};
  http_store store{"127.0.0.1", srv.port(), "global", 0, 300ms};
  auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(store.wait({"1"}), doctest::Contains("HOROVOD_GLOO_TIMEOUT_SECONDS"),
                       gloo::IoException);
  CHECK(std::chrono::steady_clock::now() - t0 < 2s);
}

TEST_CASE("an unreachable server is an IoException that names it") {
  uint16_t port;
  {
    rendezvous_server srv{rendezvous_options{}};
    port = srv.port();
  }
  http_store store{"127.0.0.1", port, "global", 0, 300ms};
  CHECK_THROWS_WITH_AS(store.set("k", {'v'}), doctest::Contains("unreachable"), gloo::IoException);
}
