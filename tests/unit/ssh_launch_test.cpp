// The pieces of starting agents over ssh that need no ssh: quoting for the remote shell,
// the agent's command line, and reading its port.
#include <doctest/doctest.h>

#include "runtime/ssh_launch.hpp"

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
