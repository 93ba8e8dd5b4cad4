// Loads caf-hvd-net.so (runtime/network/net.hpp says why it is a module).
#include "runtime/network/net.hpp"

#include <dlfcn.h>
#include <stdexcept>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "runtime/launch/process.hpp"

// Defined when a program links net/ itself (the unit tests); then nothing is loaded.
#pragma weak cafhvd_net_api

#ifndef CAF_HVD_NET_MODULE_DIR
#define CAF_HVD_NET_MODULE_DIR "../lib/caf-hvd"
#endif

namespace cafhvd::net {

namespace {

constexpr const char* module_file = "caf-hvd-net.so";

const api* load() {
  if (cafhvd_net_api)
    return cafhvd_net_api();
  auto dir = executable_dir();
  // Next to the binary in a build tree; in the module directory once installed (meson
  // gives it relative to the binary's directory, or absolute).
  std::string installed = CAF_HVD_NET_MODULE_DIR;
  if (installed.empty() || installed.front() != '/')
    installed = dir + "/" + installed;
  std::vector<std::string> tried;
  std::string why;
  for (const auto& d : {dir, installed}) {
    auto path = d + "/" + module_file;
    tried.push_back(path);
    if (::access(path.c_str(), F_OK) != 0)
      continue;
    // RTLD_NOW: a missing library or symbol is reported here, not at a later call.
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      const char* e = ::dlerror();
      why = e ? e : path + ": cannot be loaded"; // dlerror names the file
      break;
    }
    using entry_fn = const api* (*)();
    auto entry = reinterpret_cast<entry_fn>(::dlsym(handle, "cafhvd_net_api"));
    const api* table = entry ? entry() : nullptr;
    if (!table || table->abi != abi_version || table->size != sizeof(api)) {
      why = fmt::format("{} is not the module of this caf-hvd build (reinstall caf-hvd, or "
                        "rebuild the tree)",
                        path);
      break;
    }
    return table;
  }
  if (why.empty())
    why = fmt::format("no {} in {}", module_file, fmt::join(tried, " or "));
  throw std::runtime_error(
      fmt::format("cannot load caf-hvd's network module ({}); node agents, drivers, cluster "
                  "credentials and Horovod's elastic notifications need it, and it is "
                  "built and installed with caf-hvd",
                  why));
}

} // namespace

const api& module() {
  static const api* table = load();
  return *table;
}

} // namespace cafhvd::net
