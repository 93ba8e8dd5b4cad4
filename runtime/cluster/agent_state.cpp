#include "runtime/cluster/agent_state.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <stdexcept>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

namespace cafhvd {

std::string drain_mark_path(const std::string& dir) {
  return dir + "/drained";
}

std::optional<std::string> read_drain_mark(const std::string& dir) {
  struct stat st{};
  if (::stat(dir.c_str(), &st) != 0)
    throw std::runtime_error(fmt::format("state directory {}: {}", dir, std::strerror(errno)));
  if (!S_ISDIR(st.st_mode))
    throw std::runtime_error(fmt::format("state directory {}: not a directory", dir));
  auto path = drain_mark_path(dir);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT)
      return std::nullopt;
    throw std::runtime_error(fmt::format("cannot read {}: {}", path, std::strerror(errno)));
  }
  std::string text;
  char buf[512];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof(buf))) > 0 && text.size() < 4096)
    text.append(buf, static_cast<size_t>(n));
  ::close(fd);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r'))
    text.pop_back();
  return text.empty() ? std::string{"(no reason kept)"} : text;
}

namespace {

// Replaces `path` with `text` (a temporary file, fsync, rename).
std::string replace_file(const std::string& path, const std::string& text) {
  auto tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    return fmt::format("cannot write {}: {}", tmp, std::strerror(errno));
  bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size())
            && ::fsync(fd) == 0;
  int err = errno;
  ::close(fd);
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    if (ok)
      err = errno;
    ::unlink(tmp.c_str());
    return fmt::format("cannot write {}: {}", path, std::strerror(err));
  }
  return {};
}

} // namespace

std::string write_drain_mark(const std::string& dir, bool on, const std::string& why) {
  auto path = drain_mark_path(dir);
  if (!on) {
    if (::unlink(path.c_str()) != 0 && errno != ENOENT)
      return fmt::format("cannot remove {}: {}", path, std::strerror(errno));
    return {};
  }
  return replace_file(path, why + "\n");
}

std::string read_table_placements(const std::string& dir) {
  FILE* f = std::fopen((dir + "/placements").c_str(), "re");
  if (!f)
    return {};
  std::string text;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0 && text.size() < (64u << 20))
    text.append(buf, n);
  std::fclose(f);
  return text;
}

std::string write_table_placements(const std::string& dir, const std::string& text) {
  return replace_file(dir + "/placements", text);
}

std::vector<std::string> read_table_members(const std::string& dir) {
  std::vector<std::string> names;
  FILE* f = std::fopen((dir + "/members").c_str(), "re");
  if (!f)
    return names;
  char line[512];
  while (std::fgets(line, sizeof(line), f) && names.size() < 100000) {
    std::string name = line;
    while (!name.empty() && (name.back() == '\n' || name.back() == '\r'))
      name.pop_back();
    if (!name.empty())
      names.push_back(name);
  }
  std::fclose(f);
  return names;
}

std::string write_table_members(const std::string& dir, const std::vector<std::string>& names) {
  std::string text;
  for (auto& n : names)
    text += n + "\n";
  return replace_file(dir + "/members", text);
}

} // namespace cafhvd
