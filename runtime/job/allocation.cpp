// Batch-system allocations (see allocation.hpp).
#include "runtime/job/allocation.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

#include <fmt/format.h>

namespace cafhvd {

namespace {

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

// One bracket group's numbers as strings (zero padding kept).
std::vector<std::string> expand_group(std::string_view group, std::string_view item) {
  std::vector<std::string> out;
  for (auto part : split_on(group, ',')) {
    auto dash = part.find('-');
    auto lo_text = part.substr(0, dash);
    auto hi_text = dash == std::string_view::npos ? lo_text : part.substr(dash + 1);
    auto numeric = [](std::string_view t) {
      return !t.empty() && t.size() <= 18 && std::all_of(t.begin(), t.end(), is_digit);
    };
    if (!numeric(lo_text) || !numeric(hi_text))
      throw spec_error(fmt::format("hostlist '{}': '{}' is not a number or a range like 1-4",
                                   item, part));
    auto lo = std::stoull(std::string{lo_text});
    auto hi = std::stoull(std::string{hi_text});
    if (hi < lo)
      throw spec_error(fmt::format("hostlist '{}': range '{}' goes backwards", item, part));
    if (hi - lo >= max_hostlist_hosts)
      throw spec_error(fmt::format("hostlist '{}': range '{}' has more than {} hosts", item,
                                   part, max_hostlist_hosts));
    // Slurm pads to the width of the range's first number when it has leading zeros
    size_t width = lo_text.size() > 1 && lo_text[0] == '0' ? lo_text.size() : 0;
    for (auto v = lo; v <= hi; ++v) {
      out.push_back(fmt::format("{:0{}}", v, width));
      if (out.size() > max_hostlist_hosts)
        throw spec_error(fmt::format("hostlist '{}': more than {} hosts", item,
                                     max_hostlist_hosts));
    }
  }
  return out;
}

void expand_item(std::string_view item, std::vector<std::string>& out) {
  // pieces: literal text and bracket groups, in order; the product of the groups
  std::vector<std::string> names{""};
  size_t pos = 0;
  while (pos < item.size()) {
    auto open = item.find('[', pos);
    auto literal = item.substr(pos, open == std::string_view::npos ? std::string_view::npos
                                                                    : open - pos);
    if (literal.find(']') != std::string_view::npos)
      throw spec_error(fmt::format("hostlist '{}': ']' without '['", item));
    for (auto& n : names)
      n.append(literal);
    if (open == std::string_view::npos)
      break;
    auto close = item.find(']', open);
    if (close == std::string_view::npos)
      throw spec_error(fmt::format("hostlist '{}': '[' without ']'", item));
    auto group = item.substr(open + 1, close - open - 1);
    if (group.find('[') != std::string_view::npos)
      throw spec_error(fmt::format("hostlist '{}': brackets do not nest", item));
    auto numbers = expand_group(group, item);
    if (names.size() * numbers.size() > max_hostlist_hosts)
      throw spec_error(fmt::format("hostlist '{}': more than {} hosts", item,
                                   max_hostlist_hosts));
    std::vector<std::string> next;
    next.reserve(names.size() * numbers.size());
    for (auto& n : names)
      for (auto& num : numbers)
        next.push_back(n + num);
    names.swap(next);
    pos = close + 1;
  }
  for (auto& n : names) {
    if (n.empty())
      throw spec_error(fmt::format("hostlist '{}': an empty host name", item));
    out.push_back(std::move(n));
    if (out.size() > max_hostlist_hosts)
      throw spec_error(fmt::format("hostlist: more than {} hosts", max_hostlist_hosts));
  }
}

} // namespace

std::vector<std::string> expand_hostlist(std::string_view text) {
  std::vector<std::string> out;
  size_t start = 0;
  int depth = 0;
  for (size_t i = 0; i <= text.size(); ++i) {
    char c = i < text.size() ? text[i] : ',';
    if (c == '[')
      ++depth;
    else if (c == ']')
      --depth;
    else if (c == ' ' || c == '\t' || c == '\n')
      throw spec_error(fmt::format("hostlist '{}': white space inside the list", text));
    if (depth < 0)
      throw spec_error(fmt::format("hostlist '{}': ']' without '['", text));
    if (c == ',' && depth == 0) {
      auto item = text.substr(start, i - start);
      if (item.empty())
        throw spec_error(fmt::format("hostlist '{}': an empty item", text));
      expand_item(item, out);
      start = i + 1;
    }
  }
  if (depth != 0)
    throw spec_error(fmt::format("hostlist '{}': '[' without ']'", text));
  return out;
}

std::vector<uint32_t> expand_tasks_per_node(std::string_view text) {
  std::vector<uint32_t> out;
  for (auto part : split_on(text, ',')) {
    auto paren = part.find('(');
    auto count_text = part.substr(0, paren);
    uint64_t repeat = 1;
    if (paren != std::string_view::npos) {
      if (part.size() < paren + 4 || part.substr(paren, 2) != "(x" || part.back() != ')')
        throw spec_error(fmt::format("SLURM_TASKS_PER_NODE '{}': '{}' is not N or N(xM)", text,
                                     part));
      repeat = static_cast<uint64_t>(parse_bounded_int(
          part.substr(paren + 2, part.size() - paren - 3), 1, max_hostlist_hosts,
          fmt::format("SLURM_TASKS_PER_NODE '{}': a repeat count", text)));
    }
    auto count = static_cast<uint32_t>(parse_bounded_int(
        count_text, 1, 1 << 20, fmt::format("SLURM_TASKS_PER_NODE '{}': a task count", text)));
    if (out.size() + repeat > max_hostlist_hosts)
      throw spec_error(fmt::format("SLURM_TASKS_PER_NODE '{}': more than {} nodes", text,
                                   max_hostlist_hosts));
    out.insert(out.end(), repeat, count);
  }
  return out;
}

std::optional<allocation> detect_allocation(uint16_t port,
                                            const std::function<const char*(const char*)>& env) {
  auto get = [&](const char* key) -> std::string {
    const char* v = env ? env(key) : std::getenv(key);
    return v ? std::string{v} : std::string{};
  };
  auto host = [&](std::string name, uint32_t slots) { return host_spec{std::move(name), port, slots}; };
  if (auto job = get("SLURM_JOB_ID"); !job.empty()) {
    auto var = get("SLURM_JOB_NODELIST").empty() ? "SLURM_NODELIST" : "SLURM_JOB_NODELIST";
    auto list = get(var);
    if (list.empty())
      throw spec_error(fmt::format("Slurm job {}: neither SLURM_JOB_NODELIST nor SLURM_NODELIST "
                                   "is set",
                                   job));
    auto names = expand_hostlist(list);
    std::vector<uint32_t> tasks;
    if (auto t = get("SLURM_TASKS_PER_NODE"); !t.empty())
      tasks = expand_tasks_per_node(t);
    if (!tasks.empty() && tasks.size() != names.size())
      throw spec_error(fmt::format("Slurm job {}: SLURM_TASKS_PER_NODE names {} nodes, {} has {}",
                                   job, tasks.size(), var, names.size()));
    allocation a{fmt::format("Slurm job {} ({})", job, var), {}};
    for (size_t i = 0; i < names.size(); ++i)
      a.hosts.push_back(host(names[i], tasks.empty() ? 1 : tasks[i]));
    if (a.hosts.empty())
      throw spec_error(fmt::format("Slurm job {}: the allocation has no nodes", job));
    return a;
  }
  if (auto path = get("PBS_NODEFILE"); !path.empty()) {
    std::ifstream in{path};
    if (!in)
      throw spec_error(fmt::format("PBS_NODEFILE {}: cannot read it", path));
    allocation a{fmt::format("PBS_NODEFILE {}", path), {}};
    std::map<std::string, size_t> index;
    for (std::string line; std::getline(in, line);) {
      while (!line.empty() && (line.back() == '\r' || line.back() == ' '))
        line.pop_back();
      if (line.empty())
        continue;
      if (auto it = index.find(line); it != index.end()) {
        ++a.hosts[it->second].slots; // one line per slot
      } else {
        index.emplace(line, a.hosts.size());
        a.hosts.push_back(host(line, 1));
      }
    }
    if (a.hosts.empty())
      throw spec_error(fmt::format("PBS_NODEFILE {}: the allocation has no nodes", path));
    return a;
  }
  if (auto list = get("LSB_MCPU_HOSTS"); !list.empty()) {
    std::istringstream in{list};
    allocation a{"LSB_MCPU_HOSTS", {}};
    std::string name, slots;
    while (in >> name) {
      if (!(in >> slots))
        throw spec_error(fmt::format("LSB_MCPU_HOSTS '{}': host {} has no slot count", list, name));
      a.hosts.push_back(host(name, static_cast<uint32_t>(parse_bounded_int(
                                       slots, 1, 1 << 20,
                                       fmt::format("LSB_MCPU_HOSTS: the slots of {}", name)))));
    }
    if (a.hosts.empty())
      throw spec_error("LSB_MCPU_HOSTS: the allocation has no hosts");
    return a;
  }
  return std::nullopt;
}

std::map<std::string, std::string> parse_slurm_node_addresses(const std::string& sinfo_output) {
  std::map<std::string, std::string> out;
  std::istringstream in{sinfo_output};
  std::string name, addr;
  while (in >> name >> addr)
    if (addr != "(null)")
      out.emplace(name, addr);
  return out;
}

std::map<std::string, std::string> slurm_node_addresses() {
  std::string text;
  if (FILE* p = ::popen("sinfo -h -N -o '%N %o' 2>/dev/null", "r")) {
    char buf[512];
    while (std::fgets(buf, sizeof(buf), p))
      text += buf;
    ::pclose(p);
  }
  return parse_slurm_node_addresses(text);
}

} // namespace cafhvd
