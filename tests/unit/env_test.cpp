// The environment contract per rank.
#include <doctest/doctest.h>

#include <algorithm>

#include "runtime/job/env.hpp"

using namespace cafhvd;

TEST_CASE("rank environment carries Horovod's and torch's variables") {
  rank_env_input in;
  in.rank = 3;
  in.size = 4;
  in.local_rank = 1;
  in.local_size = 2;
  in.cross_rank = 1;
  in.cross_size = 2;
  in.group_rank = 1;
  in.hostname = "node-b";
  in.master_addr = "10.1.0.1";
  in.master_port = 29500;
  in.iface = "eth1";
  in.nccl_ifaces = {"eth1", "eth2"};
  in.base = {"PATH=/usr/bin", "HOROVOD_RANK=99", "KEEP=1"};
  in.extra = {"NCCL_SOCKET_IFNAME=ib0", "HOROVOD_SIZE=7", "MINE=x=y"};
  auto env = build_rank_env(in);
  auto get = [&](const char* k) { return env_lookup(env, k).value_or("<unset>"); };
  CHECK(get("HOROVOD_RANK") == "3");
  CHECK(get("HOROVOD_SIZE") == "4"); // identity wins over --env
  CHECK(get("HOROVOD_LOCAL_RANK") == "1");
  CHECK(get("HOROVOD_LOCAL_SIZE") == "2");
  CHECK(get("HOROVOD_CROSS_RANK") == "1");
  CHECK(get("HOROVOD_CROSS_SIZE") == "2");
  CHECK(get("HOROVOD_HOSTNAME") == "node-b");
  CHECK(get("HOROVOD_CONTROLLER") == "gloo");
  CHECK(get("HOROVOD_CPU_OPERATIONS") == "gloo");
  CHECK(get("HOROVOD_GLOO_IFACE") == "eth1");
  CHECK(get("NCCL_SOCKET_IFNAME") == "ib0"); // the user's --env may override tuning
  CHECK(get("RANK") == "3");
  CHECK(get("WORLD_SIZE") == "4");
  CHECK(get("LOCAL_RANK") == "1");
  CHECK(get("LOCAL_WORLD_SIZE") == "2");
  CHECK(get("GROUP_RANK") == "1");
  CHECK(get("MASTER_ADDR") == "10.1.0.1");
  CHECK(get("MASTER_PORT") == "29500");
  CHECK(get("PATH") == "/usr/bin");
  CHECK(get("KEEP") == "1");
  CHECK(get("MINE") == "x=y");
  CHECK(get("HOROVOD_GLOO_RENDEZVOUS_ADDR") == "<unset>");
  CHECK(std::is_sorted(env.begin(), env.end()));
}

TEST_CASE("NCCL_SOCKET_IFNAME joins the host's usable interfaces") {
  rank_env_input in;
  in.iface = "eth0";
  in.nccl_ifaces = {"eth0", "eth1"};
  CHECK(env_lookup(build_rank_env(in), "NCCL_SOCKET_IFNAME") == "eth0,eth1");
}

TEST_CASE("--env arguments are validated") {
  CHECK(parse_env_assignment("A_1=v=w") == std::pair<std::string, std::string>{"A_1", "v=w"});
  CHECK(parse_env_assignment("EMPTY=").second.empty());
  CHECK_THROWS_WITH(parse_env_assignment("NOEQUALS"), doctest::Contains("'=' is missing"));
  CHECK_THROWS_WITH(parse_env_assignment("1X=2"), doctest::Contains("not a valid variable"));
  CHECK_THROWS_WITH(parse_env_assignment("=2"), doctest::Contains("not a valid variable"));
}

TEST_CASE("forwarded environment drops per-shell state") {
  const char* vars[] = {"PATH=/bin",           "PWD=/x",     "SHLVL=2",
                        "BASH_FUNC_f%%=() {}", "HOME=/root", nullptr};
  auto fwd = forwardable_environment(const_cast<char**>(vars));
  CHECK(fwd == std::vector<std::string>{"PATH=/bin", "HOME=/root"});
}

TEST_CASE("with the launcher's torch store, env:// ranks are all clients of it") {
  rank_env_input in;
  in.master_port = 29400;
  CHECK_FALSE(env_lookup(build_rank_env(in), "TORCHELASTIC_USE_AGENT_STORE"));
  in.agent_store = true;
  auto env = build_rank_env(in);
  CHECK(env_lookup(env, "TORCHELASTIC_USE_AGENT_STORE") == "True");
  CHECK(env_lookup(env, "TORCHELASTIC_RESTART_COUNT") == "0");
  CHECK(env_lookup(env, "MASTER_PORT") == "29400");
  CHECK_FALSE(env_lookup(env, "USE_LIBUV")); // torch's agent-store client ignores it
}

TEST_CASE("without the launcher's store, rank 0's torch store needs no libuv") {
  rank_env_input in;
  CHECK(env_lookup(build_rank_env(in), "USE_LIBUV") == "0");
  in.base = {"USE_LIBUV=1"};
  CHECK(env_lookup(build_rank_env(in), "USE_LIBUV") == "1");
  in.base = {};
  in.extra = {"USE_LIBUV=1"};
  CHECK(env_lookup(build_rank_env(in), "USE_LIBUV") == "1");
}
