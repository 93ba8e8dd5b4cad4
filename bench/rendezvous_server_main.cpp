// A standalone rendezvous server for benchmarks: serves until SIGINT/SIGTERM.
// usage: rendezvous-server PORT [RANKS [--allowlist]]
// --allowlist: a job's allowlist, so every connection's owner is looked up (as in jobs).
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "runtime/horovod/rendezvous_server.hpp"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: rendezvous-server PORT [RANKS [--allowlist]]\n");
    return 2;
  }
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  cafhvd::rendezvous_options o;
  o.port = static_cast<uint16_t>(std::atoi(argv[1]));
  int ranks = argc > 2 ? std::atoi(argv[2]) : 1;
  if (argc > 3 && std::strcmp(argv[3], "--allowlist") == 0)
    o.allowlist = std::make_shared<cafhvd::address_allowlist>();
  cafhvd::rendezvous_server srv{o};
  srv.init(cafhvd::get_host_assignments({{"bench", ranks}}, ranks));
  std::printf("listening on %s:%u\n", srv.address().c_str(), srv.port());
  std::fflush(stdout);
  int sig = 0;
  sigwait(&set, &sig);
  return 0;
}
