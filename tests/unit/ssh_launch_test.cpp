// The pieces of starting agents over ssh that need no ssh: quoting for the remote shell,
// the agent's command line, the launcher's options, reusing a running agent, and reading
// its port.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "runtime/launch/ssh_launch.hpp"

using namespace cafhvd;

TEST_CASE("arguments are quoted for the remote shell only when they need it") {
  CHECK(shell_quote("/usr/bin/caf-hvd") == "/usr/bin/caf-hvd");
  CHECK(shell_quote("10.0.0.2") == "10.0.0.2");
  CHECK(shell_quote("my dir") == "'my dir'");
  CHECK(shell_quote("it's") == "'it'\\''s'");
  CHECK(shell_quote("$HOME;rm") == "'$HOME;rm'");
  CHECK(shell_quote("") == "''");
}

TEST_CASE("an agent for one job: port 0, named, bound, tied to its session") {
  ssh_options o;
  o.agent_path = "/opt/caf hvd/caf-hvd";
  o.cluster_dir = "/shared/cluster";
  CHECK(agent_command(o, {"h1", "h1", "10.0.0.1"})
        == "'/opt/caf hvd/caf-hvd' node --port 0 --name h1 --bind 10.0.0.1 --exit-on-stdin-eof "
           "--rank-user agent "
           "--cluster-dir /shared/cluster");
  o.cluster_dir.clear();
  CHECK(agent_command(o, {"h1", "h1", "10.0.0.1"}).find("--insecure") != std::string::npos);
  // the driver's --link-timeout reaches the agents it starts
  o.link_timeout = 2.5;
  CHECK(agent_command(o, {"h1", "h1", "10.0.0.1"}).find(" --link-timeout 2.5") != std::string::npos);
}

TEST_CASE("the agent's port comes from its first line") {
  CHECK(parse_listening_port("caf-hvd node 'h1' listening on 10.0.0.1:40123 (mutual TLS, "
                             "cluster /c)")
        == 40123);
  CHECK(parse_listening_port("caf-hvd node 'h1' listening on *:24780 (INSECURE)") == 24780);
  CHECK(parse_listening_port("Warning: Permanently added 'h1' to the list of known hosts.") == 0);
  CHECK(parse_listening_port("caf-hvd node 'h1' listening on 10.0.0.1:99999 (x)") == 0);
  CHECK(parse_listening_port("caf-hvd node 'h1' listening on nowhere (x)") == 0);
}

TEST_CASE("the launcher's options: the agent, its credentials and the client --launcher names") {
  launcher_config l;
  l.kind = "ssh";
  l.ssh_command = "/usr/bin/ssh";
  l.ssh_port = 2222;
  l.ssh_identity = "/k/id";
  l.ssh_extra = {"StrictHostKeyChecking=no"};
  l.agent_path = "/opt/caf-hvd";
  l.srun_command = "/usr/bin/srun";
  l.link_timeout = 7;
  auto o = launcher_options(l, "/c", "/shim", std::chrono::milliseconds(5000));
  CHECK(o.client == "/usr/bin/ssh");
  CHECK(o.port == 2222);
  CHECK(o.identity == "/k/id");
  CHECK(o.extra == std::vector<std::string>{"StrictHostKeyChecking=no"});
  CHECK(o.agent_path == "/opt/caf-hvd");
  CHECK(o.cluster_dir == "/c");
  CHECK(o.shim == "/shim");
  CHECK(o.timeout == std::chrono::milliseconds(5000));
  CHECK(o.link_timeout == 7);
  l.kind = "slurm";
  l.agent_path.clear();
  o = launcher_options(l, "", "/shim", std::chrono::milliseconds(5000));
  CHECK(o.client == "/usr/bin/srun");
  CHECK(o.port == 0);
  CHECK(o.extra.empty());
  CHECK(o.agent_path.size() > 8);
  CHECK(o.agent_path.substr(o.agent_path.size() - 8) == "/caf-hvd");
}

TEST_CASE("--launcher ssh reuses an agent that already answers at the host's port") {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  REQUIRE(::listen(fd, 4) == 0);
  socklen_t len = sizeof(addr);
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  uint16_t port = ntohs(addr.sin_port);
  ssh_options o;
  o.client = "/nonexistent/ssh"; // never run: no session is needed
  std::vector<launch_target> targets{{"user@h1", "127.0.0.1", port}};
  std::unique_ptr<ssh_agents> agents;
  CHECK(start_agents_over_ssh(o, targets, agents).empty());
  CHECK(agents == nullptr);
  CHECK(targets[0].port == port);
  ::close(fd);
}
