// caf-hvd-allreduce: does at start what Horovod's core does at hvd.init() with the Gloo
// controller (global, local and cross contexts over the rendezvous server), then runs
// ring allreduce on float32 buffers, checks every element, and in --bench mode reports
// latency and bandwidth.
#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <dirent.h>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>
#include <unistd.h>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include "apps/allreduce/http_store.hpp"

namespace {

using clock_type = std::chrono::steady_clock;

struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  if (v && *v)
    return v;
  if (fallback)
    return fallback;
  throw usage_error(fmt::format("{} is not set (run me under caf-hvd, e.g. caf-hvd run -np 4 "
                                "-- caf-hvd-allreduce)",
                                name));
}

int env_int(const char* name, const char* fallback = nullptr) {
  auto s = env_or(name, fallback);
  try {
    size_t used = 0;
    int v = std::stoi(s, &used);
    if (used != s.size())
      throw std::invalid_argument(s);
    return v;
  } catch (const std::exception&) {
    throw usage_error(fmt::format("{}='{}' is not an integer", name, s));
  }
}

size_t parse_size(const std::string& s) {
  size_t used = 0;
  unsigned long long v = 0;
  try {
    v = std::stoull(s, &used);
  } catch (const std::exception&) {
    throw usage_error(fmt::format("bad size '{}': expected e.g. 4096, 64K, 16M", s));
  }
  auto unit = s.substr(used);
  if (unit == "K" || unit == "KiB")
    v <<= 10;
  else if (unit == "M" || unit == "MiB")
    v <<= 20;
  else if (unit == "G" || unit == "GiB")
    v <<= 30;
  else if (!unit.empty() && unit != "B")
    throw usage_error(fmt::format("bad size '{}': unit must be K, M or G", s));
  if (v < sizeof(float) || v % sizeof(float) != 0)
    throw usage_error(fmt::format("size '{}' must be a positive multiple of 4 bytes", s));
  return static_cast<size_t>(v);
}

std::string human(size_t bytes) {
  if (bytes >= (1u << 20) && bytes % (1u << 20) == 0)
    return fmt::format("{}M", bytes >> 20);
  if (bytes >= 1024 && bytes % 1024 == 0)
    return fmt::format("{}K", bytes >> 10);
  return fmt::format("{}", bytes);
}

struct options {
  std::vector<size_t> sizes{1024, 1u << 20};
  int iters = 20;
  bool bench = false;
  // --connect-bench: time only the global context's connectFullMesh, with every rank
  // released at the same wall-clock instant, through the rendezvous server or (for
  // comparison) Gloo's FileStore in a directory.
  bool connect_bench = false;
  long long start_at_ms = 0;
  std::string file_store;
  // --elastic: a Horovod-style elastic training loop (see elastic_main)
  bool elastic = false;
  long steps = 100;
  long step_ms = 20;
  size_t elements = 1024;
};

options parse_args(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc)
        throw usage_error(fmt::format("{} needs a value", a));
      return argv[++i];
    };
    if (a == "--sizes") {
      o.sizes.clear();
      auto list = value();
      size_t start = 0;
      while (start <= list.size()) {
        auto comma = list.find(',', start);
        o.sizes.push_back(parse_size(list.substr(start, comma - start)));
        if (comma == std::string::npos)
          break;
        start = comma + 1;
      }
    } else if (a == "--iters") {
      o.iters = std::max(1, std::atoi(value().c_str()));
    } else if (a == "--bench") {
      o.bench = true;
    } else if (a == "--connect-bench") {
      o.connect_bench = true;
    } else if (a == "--start-at") {
      o.start_at_ms = std::atoll(value().c_str());
    } else if (a == "--file-store") {
      o.file_store = value();
    } else if (a == "--elastic") {
      o.elastic = true;
    } else if (a == "--steps") {
      o.steps = std::atol(value().c_str());
      if (o.steps < 1)
        throw usage_error("--steps needs a positive number");
    } else if (a == "--step-ms") {
      o.step_ms = std::atol(value().c_str());
      if (o.step_ms < 0)
        throw usage_error("--step-ms must not be negative");
    } else if (a == "--elements") {
      o.elements = static_cast<size_t>(std::atol(value().c_str()));
      if (o.elements < 1 || o.elements > (64u << 20))
        throw usage_error("--elements must be between 1 and 67108864");
    } else if (a == "--help" || a == "-h") {
      std::printf("usage: caf-hvd-allreduce [--sizes 1K,1M,...] [--bench [--iters N]]\n"
                  "Run under caf-hvd: connects Gloo's global, local and cross contexts through\n"
                  "the rendezvous server, allreduces float32 buffers and checks every element.\n"
                  "--bench: rank 0 prints latency, algbw and busbw per size (table and JSON).\n"
                  "--connect-bench [--start-at EPOCH_MS] [--file-store DIR]: rank 0 prints the\n"
                  "  slowest rank's connectFullMesh time of the global context (JSON).\n"
                  "--elastic [--steps N] [--step-ms MS] [--elements K]: an elastic training\n"
                  "  loop under `caf-hvd driver --host-discovery-script`: one allreduce per\n"
                  "  step, state (step, checksum) committed every step, re-joins through\n"
                  "  rank_and_size on a peer's failure or a host change.\n");
      std::exit(0);
    } else {
      throw usage_error(fmt::format("unknown argument '{}' (see --help)", a));
    }
  }
  return o;
}

struct scope_context {
  std::string name; // global, local, cross
  std::shared_ptr<gloo::rendezvous::Context> ctx;
};

// TCP ports of this process's own sockets (from /proc), so that a peer whose
// connection to us breaks can tell which rank we were: Gloo names a lost peer only by
// its address ("... [ip]:port").
std::string own_tcp_ports() {
  std::set<std::string> inodes;
  if (auto dir = opendir("/proc/self/fd")) {
    while (auto e = readdir(dir)) {
      char target[64] = {};
      auto path = fmt::format("/proc/self/fd/{}", e->d_name);
      auto n = readlink(path.c_str(), target, sizeof(target) - 1);
      std::string t(target, n > 0 ? static_cast<size_t>(n) : 0);
      if (t.rfind("socket:[", 0) == 0)
        inodes.insert(t.substr(8, t.size() - 9));
    }
    closedir(dir);
  }
  std::string ports;
  for (auto file : {"/proc/self/net/tcp", "/proc/self/net/tcp6"}) {
    std::ifstream in{file};
    std::string line;
    std::getline(in, line); // header
    while (std::getline(in, line)) {
      std::istringstream fields{line};
      std::string sl, local, remote, st, queues, tr, retr, uid, timeout, inode;
      fields >> sl >> local >> remote >> st >> queues >> tr >> retr >> uid >> timeout >> inode;
      if (inodes.count(inode)) {
        auto port = std::stoul(local.substr(local.rfind(':') + 1), nullptr, 16);
        ports += fmt::format("{}{}", ports.empty() ? "" : ",", port);
      }
    }
  }
  return ports;
}

// Which rank owned the TCP port in Gloo's error message, from the ports every rank
// published after connecting; "" if unknown.
std::string name_peer(const std::string& what, cafhvd::http_store& peers, int size) {
  auto close = what.rfind("]:");
  if (close == std::string::npos)
    return "";
  // Debian's Gloo prints sin_port without ntohs: try the number and its byte swap.
  auto printed = static_cast<uint16_t>(std::atoi(what.c_str() + close + 2));
  auto swapped = static_cast<uint16_t>((printed >> 8) | (printed << 8));
  try {
    for (int r = 0; r < size; ++r) {
      auto list = peers.try_get(std::to_string(r));
      if (!list)
        continue;
      auto padded = "," + *list + ",";
      for (auto port : {printed, swapped})
        if (padded.find(fmt::format(",{},", port)) != std::string::npos)
          return fmt::format(" (peer: rank {})", r);
    }
  } catch (const std::exception&) {
    // the rendezvous server may be gone too; the error stands on its own
  }
  return "";
}

// Connects one Horovod scope: rendezvous through the server, barrier so nobody
// finalizes before everyone connected, then DELETE its key (Horovod's order).
scope_context connect_scope(const std::string& kind, const std::string& scope, int rank, int size,
                            const std::string& addr, int port,
                            std::shared_ptr<gloo::transport::Device>& dev,
                            std::chrono::milliseconds timeout,
                            std::chrono::milliseconds hold = std::chrono::milliseconds(0)) {
  cafhvd::http_store store{addr, static_cast<uint16_t>(port), scope, rank, timeout};
  store.allow_hold(hold);
  auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
  ctx->setTimeout(timeout);
  ctx->connectFullMesh(store, dev);
  gloo::BarrierOptions b(ctx);
  b.setTimeout(timeout);
  gloo::barrier(b);
  store.finalize();
  return {kind, ctx};
}

// Element i of context rank r holds (r + 1) * (i % 17 + 1): small integers whose sums
// are exact in float32 for any realistic world size.
float expected_sum(size_t i, int n) {
  return static_cast<float>((i % 17 + 1) * static_cast<size_t>(n) * (n + 1) / 2);
}

void fill(std::vector<float>& buf, int rank) {
  for (size_t i = 0; i < buf.size(); ++i)
    buf[i] = static_cast<float>((rank + 1) * static_cast<int>(i % 17 + 1));
}

void allreduce(const scope_context& sc, std::vector<float>& buf, uint32_t tag) {
  gloo::AllreduceOptions o(sc.ctx);
  o.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
  o.setOutput(buf.data(), buf.size());
  void (*fn)(void*, const void*, const void*, size_t) = &gloo::sum<float>;
  o.setReduceFunction(fn);
  o.setTag(tag);
  gloo::allreduce(o);
}

void check(const scope_context& sc, const std::vector<float>& buf, int world_rank) {
  int n = sc.ctx->size;
  for (size_t i = 0; i < buf.size(); ++i) {
    if (buf[i] != expected_sum(i, n))
      throw std::runtime_error(fmt::format(
          "rank {}: wrong sum in the {} context (size {}) at element {} of {}: got {}, expected {}",
          world_rank, sc.name, n, i, buf.size(), buf[i], expected_sum(i, n)));
  }
}

int connect_bench(const options& opts, int rank, int size, const std::string& addr, int port,
                  std::shared_ptr<gloo::transport::Device>& dev,
                  std::chrono::milliseconds timeout) {
  if (opts.start_at_ms > 0)
    std::this_thread::sleep_until(
        std::chrono::system_clock::time_point{std::chrono::milliseconds(opts.start_at_ms)});
  auto t0 = clock_type::now();
  auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
  ctx->setTimeout(timeout);
  if (opts.file_store.empty()) {
    cafhvd::http_store store{addr, static_cast<uint16_t>(port), "global", rank, timeout};
    ctx->connectFullMesh(store, dev);
  } else {
    gloo::rendezvous::FileStore store{opts.file_store};
    ctx->connectFullMesh(store, dev);
  }
  double ms = std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
  gloo::AllreduceOptions o(ctx);
  o.setOutput(&ms, 1);
  void (*fn)(void*, const void*, const void*, size_t) = &gloo::max<double>;
  o.setReduceFunction(fn);
  gloo::allreduce(o);
  if (rank == 0)
    std::printf("{\"store\": \"%s\", \"ranks\": %d, \"connect_ms\": %.2f}\n",
                opts.file_store.empty() ? "rendezvous-http" : "gloo-filestore", size, ms);
  return 0;
}

// Six integers "rank,size,local_rank,local_size,cross_rank,cross_size".
std::vector<int> parse_rank_and_size(const std::string& body) {
  std::vector<int> v;
  std::stringstream in{body};
  std::string item;
  while (std::getline(in, item, ','))
    v.push_back(std::stoi(item));
  if (v.size() != 6)
    throw std::runtime_error(fmt::format("malformed rank_and_size answer '{}'", body));
  return v;
}

// "generation N\n..." from GET /elastic/update.
long parse_generation(const std::optional<std::string>& body) {
  if (!body || body->rfind("generation ", 0) != 0)
    return 0;
  return std::atol(body->c_str() + 11);
}

long long epoch_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A Horovod elastic loop in Gloo terms, with a real Horovod worker's protocol. State =
// (step, checksum = 1 + 2 + ... + step), committed after every step. The first join takes
// this slot's place from the environment the launcher started it with (as hvd.init()
// does); every re-join asks rank_and_size for it (as Horovod's re-init does),
// connects the global context, and takes the state from the new rank 0 (a broadcast by
// allreduce). On a peer's failure: drop the context (which closes its sockets, so peers
// blocked on us fail at once too), keep the last commit, re-join. Rank 0 reads the
// launcher's generation at every step and shares it in the step's allreduce; a newer
// one (a host was added or removed) makes every rank re-join after that commit.
int elastic_main(const options& opts, const std::string& host, int local_rank,
                 const std::string& addr, int port, const std::string& iface,
                 std::shared_ptr<gloo::transport::Device>& dev, std::chrono::milliseconds timeout) {
  std::chrono::milliseconds join_timeout{1000L * env_int("HOROVOD_ELASTIC_TIMEOUT", "600") + 60000};
  cafhvd::http_store ras{addr, static_cast<uint16_t>(port), "rank_and_size", 0, join_timeout};
  cafhvd::http_store updates{addr, static_cast<uint16_t>(port), "elastic", 0, timeout};
  long step = 0, checksum = 0; // the last commit
  long known_gen = 0;
  bool joined_before = false;
  int joins = 0;
  long env_generation = 0;
  for (;;) {
    auto slot = fmt::format("{}:{}", host, local_rank);
    std::vector<int> v;
    if (joins == 0) {
      v = {env_int("HOROVOD_RANK"),       env_int("HOROVOD_SIZE"),
           env_int("HOROVOD_LOCAL_RANK"), env_int("HOROVOD_LOCAL_SIZE"),
           env_int("HOROVOD_CROSS_RANK"), env_int("HOROVOD_CROSS_SIZE")};
      // The plan it was started with; a newer generation may have formed since.
      env_generation = env_int("CAF_HVD_GENERATION", "0");
    } else {
      auto rs = ras.try_get(slot);
      if (!rs)
        throw std::runtime_error("rank_and_size: the rendezvous server has no answer for " + slot);
      v = parse_rank_and_size(*rs);
    }
    int rank = v[0], size = v[1];
    if (rank < 0) {
      std::printf("slot %s is no longer in the job (committed step %ld); exiting\n", slot.c_str(),
                  step);
      std::fflush(stdout);
      return 0;
    }
    ++joins;
    scope_context global;
    try {
      // A newcomer's first request may wait at its plan's lot until the running ranks
      // re-join (warm joins): up to the elastic timeout.
      global = connect_scope("global", "global", rank, size, addr, port, dev, timeout,
                             joins == 1 ? join_timeout : std::chrono::milliseconds(0));
      // The new rank 0 holds the state; everybody takes it.
      std::vector<long> state(3, 0);
      if (rank == 0)
        state = {step, checksum,
                 joins == 1 && env_generation > 0 ? env_generation
                                                  : parse_generation(updates.try_get("update"))};
      gloo::AllreduceOptions o(global.ctx);
      o.setOutput(state.data(), state.size());
      void (*fn)(void*, const void*, const void*, size_t) = &gloo::sum<long>;
      o.setReduceFunction(fn);
      o.setTag(1);
      gloo::allreduce(o);
      if (joined_before && (state[0] > step + 1 || state[0] < step - 1))
        throw std::logic_error(fmt::format("rank {}: state from rank 0 is at step {} but this "
                                           "rank committed step {}",
                                           rank, state[0], step));
      step = state[0];
      checksum = state[1];
      known_gen = state[2];
      joined_before = true;
      if (checksum != step * (step + 1) / 2)
        throw std::logic_error(fmt::format("rank {}: checksum {} does not match step {}: a "
                                           "committed step was lost or repeated",
                                           rank, checksum, step));
      std::printf("joined generation %ld: slot %s is rank %d of %d (local %d/%d, cross %d/%d) "
                  "iface %s\n",
                  known_gen, slot.c_str(), rank, size, v[2], v[3], v[4], v[5], iface.c_str());
      if (rank == 0)
        std::printf("generation %ld: rank 0 of %d on %s resumes at step %ld t=%lld\n", known_gen,
                    size, host.c_str(), step, epoch_ms());
      std::fflush(stdout);
      uint32_t tag = 2;
      bool rejoin = false;
      std::vector<float> buf(opts.elements + 1);
      while (step < opts.steps && !rejoin) {
        std::fill(buf.begin(), buf.end() - 1, 1.0f);
        buf.back() =
            rank == 0 ? static_cast<float>(parse_generation(updates.try_get("update"))) : 0.0f;
        allreduce(global, buf, tag++);
        for (size_t i = 0; i + 1 < buf.size(); ++i)
          if (buf[i] != static_cast<float>(size))
            throw std::logic_error(fmt::format("rank {}: step {}: element {} is {}, expected the "
                                               "world size {}",
                                               rank, step + 1, i, buf[i], size));
        // commit
        ++step;
        checksum += step;
        if (rank == 0)
          std::printf("step %ld size %d sum %.0f t=%lld\n", step, size, buf[0], epoch_ms());
        std::fflush(stdout);
        auto gen = static_cast<long>(buf.back());
        if (gen > known_gen) {
          if (rank == 0)
            std::printf("hosts changed (generation %ld): re-joining after step %ld\n", gen, step);
          rejoin = true;
        } else if (opts.step_ms > 0) {
          std::this_thread::sleep_for(std::chrono::milliseconds(opts.step_ms));
        }
      }
      if (!rejoin) {
        if (rank == 0)
          std::printf("caf-hvd-allreduce: elastic run done: %ld steps, checksum %ld, %d joins of "
                      "rank 0's slot\n",
                      step, checksum, joins);
        std::fflush(stdout);
        return 0;
      }
    } catch (const gloo::IoException& e) {
      std::printf("rank %d: a peer failed (%s); back to step %ld, re-joining\n", rank, e.what(),
                  step);
      std::fflush(stdout);
    }
    global.ctx.reset(); // closes our pairs: peers blocked on us fail now, not at a timeout
  }
}

} // namespace

int main(int argc, char** argv) {
  std::signal(SIGPIPE, SIG_IGN); // Gloo writes without MSG_NOSIGNAL
  int rank = -1;
  int size = 0;
  std::string phase = "start";
  std::unique_ptr<cafhvd::http_store> peers;
  try {
    auto opts = parse_args(argc, argv);
    rank = env_int("HOROVOD_RANK");
    size = env_int("HOROVOD_SIZE");
    int local_rank = env_int("HOROVOD_LOCAL_RANK");
    int local_size = env_int("HOROVOD_LOCAL_SIZE");
    int cross_rank = env_int("HOROVOD_CROSS_RANK");
    int cross_size = env_int("HOROVOD_CROSS_SIZE");
    auto host = env_or("HOROVOD_HOSTNAME", nullptr);
    auto addr = env_or("HOROVOD_GLOO_RENDEZVOUS_ADDR", nullptr);
    int port = env_int("HOROVOD_GLOO_RENDEZVOUS_PORT");
    auto iface = env_or("HOROVOD_GLOO_IFACE", "");
    std::chrono::milliseconds timeout{1000L * env_int("HOROVOD_GLOO_TIMEOUT_SECONDS", "30")};

    phase = "device";
    gloo::transport::tcp::attr attr;
    if (!iface.empty())
      attr.iface = iface;
    else
      attr.hostname = "127.0.0.1";
    attr.ai_family = AF_INET;
    auto dev = gloo::transport::tcp::CreateDevice(attr);

    if (opts.connect_bench)
      return connect_bench(opts, rank, size, addr, port, dev, timeout);
    if (opts.elastic) {
      phase = "elastic loop";
      return elastic_main(opts, host, local_rank, addr, port, iface.empty() ? "(default)" : iface,
                          dev, timeout);
    }

    auto t0 = clock_type::now();
    phase = "rendezvous";
    std::vector<scope_context> contexts;
    contexts.push_back(connect_scope("global", "global", rank, size, addr, port, dev, timeout));
    contexts.push_back(
        connect_scope("local", "local_" + host, local_rank, local_size, addr, port, dev, timeout));
    contexts.push_back(connect_scope("cross", "cross_" + std::to_string(local_rank), cross_rank,
                                     cross_size, addr, port, dev, timeout));
    // Published in an ad-hoc scope that outlives the planned ones' cleanup, only to name
    // a failing peer; a server that refuses it (its ad-hoc budget spent) costs just that.
    peers = std::make_unique<cafhvd::http_store>(addr, static_cast<uint16_t>(port), "tcp_ports",
                                                 rank, timeout);
    try {
      peers->set(std::to_string(rank), [] {
        auto p = own_tcp_ports();
        return std::vector<char>(p.begin(), p.end());
      }());
    } catch (const std::exception& e) {
      std::fprintf(stderr,
                   "caf-hvd-allreduce: rank %d: cannot publish its ports (%s); a failure will "
                   "not name the peer\n",
                   rank, e.what());
      peers.reset();
    }
    std::printf("rank %d/%d on %s: local %d/%d, cross %d/%d, iface %s, rendezvous %s:%d\n", rank,
                size, host.c_str(), local_rank, local_size, cross_rank, cross_size,
                iface.empty() ? "(default)" : iface.c_str(), addr.c_str(), port);
    auto connect_ms = std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
    if (rank == 0)
      std::printf("caf-hvd-allreduce: %d ranks, contexts global/local/cross connected in %.1f ms "
                  "(%s)\n",
                  size, connect_ms, dev->str().c_str());

    uint32_t tag = 1;
    for (auto bytes : opts.sizes) {
      std::vector<float> buf(bytes / sizeof(float));
      for (auto& sc : contexts) {
        phase = fmt::format("allreduce of {} in the {} context", human(bytes), sc.name);
        fill(buf, sc.ctx->rank);
        allreduce(sc, buf, tag++);
        check(sc, buf, rank);
      }
    }
    if (rank == 0 && !opts.bench)
      std::printf("caf-hvd-allreduce: all sums correct (%zu sizes x global/local/cross)\n",
                  opts.sizes.size());

    if (opts.bench) {
      auto& global = contexts.front();
      if (rank == 0)
        std::printf("%10s %12s %14s %14s\n", "size", "latency_us", "algbw_GB/s", "busbw_GB/s");
      std::vector<std::string> json;
      for (auto bytes : opts.sizes) {
        phase = fmt::format("benchmark of {}", human(bytes));
        std::vector<float> buf(bytes / sizeof(float));
        std::vector<double> times;
        for (int it = -3; it < opts.iters; ++it) {
          fill(buf, global.ctx->rank);
          gloo::BarrierOptions b(global.ctx);
          gloo::barrier(b);
          auto s = clock_type::now();
          allreduce(global, buf, tag++);
          auto us = std::chrono::duration<double, std::micro>(clock_type::now() - s).count();
          if (it >= 0)
            times.push_back(us);
        }
        check(global, buf, rank);
        std::sort(times.begin(), times.end());
        double med = times[times.size() / 2];
        double algbw = static_cast<double>(bytes) / (med * 1e3); // bytes/us -> GB/s
        double busbw = algbw * 2.0 * (size - 1) / size;
        if (rank == 0) {
          std::printf("%10s %12.1f %14.3f %14.3f\n", human(bytes).c_str(), med, algbw, busbw);
          json.push_back(fmt::format("{{\"size_bytes\": {}, \"ranks\": {}, \"latency_us\": {:.1f}, "
                                     "\"algbw_gbps\": {:.4f}, \"busbw_gbps\": {:.4f}}}",
                                     bytes, size, med, algbw, busbw));
        }
      }
      for (auto& j : json)
        std::printf("%s\n", j.c_str());
    }
    std::fflush(stdout);
    return 0;
  } catch (const usage_error& e) {
    std::fprintf(stderr, "caf-hvd-allreduce: error: %s\n", e.what());
    return 2;
  } catch (const gloo::IoException& e) {
    std::fprintf(stderr, "caf-hvd-allreduce: rank %d: %s failed%s: %s\n", rank, phase.c_str(),
                 peers ? name_peer(e.what(), *peers, size).c_str() : "", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "caf-hvd-allreduce: rank %d: %s failed: %s\n", rank, phase.c_str(),
                 e.what());
    return 1;
  }
}
