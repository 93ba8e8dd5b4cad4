// Whose account a rank runs as (identity.hpp).
#include "runtime/launch/identity.hpp"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <grp.h>
#include <linux/capability.h>
#include <pwd.h>
#include <sstream>
#include <sys/syscall.h>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "runtime/observe/text.hpp"

namespace cafhvd {

bool can_switch_users() {
  if (geteuid() == 0)
    return true;
  __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2]{};
  if (::syscall(SYS_capget, &hdr, data) != 0)
    return false;
  auto has = [&](int cap) { return (data[cap / 32].effective >> (cap % 32)) & 1u; };
  return has(CAP_SETUID) && has(CAP_SETGID);
}

namespace {

// UID_MIN and UID_MAX of /etc/login.defs (Debian's defaults when absent): accounts
// outside are system accounts.
std::pair<uid_t, uid_t> login_uid_range() {
  uid_t lo = 1000, hi = 60000;
  std::ifstream in{"/etc/login.defs"};
  for (std::string line; std::getline(in, line);) {
    std::istringstream words{line};
    std::string key;
    unsigned long value = 0;
    if (!(words >> key >> value))
      continue;
    if (key == "UID_MIN")
      lo = static_cast<uid_t>(value);
    else if (key == "UID_MAX")
      hi = static_cast<uid_t>(value);
  }
  return {lo, hi};
}

std::optional<rank_identity> lookup(const std::string& name) {
  passwd pw{};
  passwd* found = nullptr;
  std::vector<char> buf(16384);
  if (getpwnam_r(name.c_str(), &pw, buf.data(), buf.size(), &found) != 0 || !found)
    return std::nullopt;
  rank_identity id;
  id.uid = pw.pw_uid;
  id.gid = pw.pw_gid;
  id.user = pw.pw_name;
  id.home = pw.pw_dir ? pw.pw_dir : "/";
  int n = 64;
  std::vector<gid_t> groups(static_cast<size_t>(n));
  while (getgrouplist(pw.pw_name, pw.pw_gid, groups.data(), &n) < 0) {
    if (n > 65536)
      break;
    groups.resize(static_cast<size_t>(n) + 16);
    n = static_cast<int>(groups.size());
  }
  groups.resize(static_cast<size_t>(std::max(0, n)));
  id.groups = std::move(groups);
  return id;
}

} // namespace

account_answer account_for(const std::string& owner, const rank_user_policy& policy) {
  account_answer a;
  auto ways_out = [&](const std::string& name) {
    return fmt::format("create an account '{}' on this node, give the agent a job account for "
                       "owners without one (--job-account NAME; CAF_HVD_NODE_JOB_ACCOUNT in "
                       "/etc/default/caf-hvd-node), or run ranks as the agent's user "
                       "(--rank-user agent)",
                       name);
  };
  auto [uid_min, uid_max] = login_uid_range();
  uid_t agent = geteuid();
  // A usable account, or why not (`what` names it in the message).
  auto check = [&](const rank_identity& id, const std::string& what, bool site_choice) {
    if (id.uid == 0 && !policy.allow_root)
      return fmt::format("{} is uid 0: ranks run as root only on an agent started with "
                         "--allow-root-ranks",
                         what);
    if (id.uid == agent && id.uid != 0)
      return fmt::format("{} is the agent's own account: ranks never run as it (a rank could "
                         "then read the agent's key and signal it)",
                         what);
    if (!site_choice && id.uid != 0 && (id.uid < uid_min || id.uid > uid_max))
      return fmt::format("{} is a system account (uid {}, outside UID_MIN {} to UID_MAX {} of "
                         "/etc/login.defs): ranks never run as one",
                         what, id.uid, uid_min, uid_max);
    return std::string{};
  };
  auto job_account = [&](const std::string& why) {
    auto id = lookup(policy.job_account);
    if (!id) {
      a.error = fmt::format("{}; its job account '{}' does not exist on this node", why,
                            printable(policy.job_account));
      return a;
    }
    if (auto e = check(*id, fmt::format("the job account '{}'", printable(policy.job_account)),
                       true);
        !e.empty()) {
      a.error = fmt::format("{}; {}", why, e);
      return a;
    }
    a.id = std::move(id);
    return a;
  };
  if (owner.empty()) {
    auto why = std::string{"the agent knows no owner for this job (it runs --insecure)"};
    if (!policy.job_account.empty())
      return job_account(why);
    a.error = fmt::format("{}: give it a job account (--job-account NAME) or run ranks as its "
                          "user (--rank-user agent)",
                          why);
    return a;
  }
  if (auto id = lookup(owner)) {
    if (auto e = check(*id, fmt::format("the job's owner '{}'", printable(owner)), false);
        !e.empty()) {
      a.error = e;
      return a;
    }
    a.id = std::move(id);
    return a;
  }
  auto why = fmt::format("there is no account named '{}' (the job's owner) on this node",
                         printable(owner));
  if (!policy.job_account.empty())
    return job_account(why);
  a.error = fmt::format("{}: {}", why, ways_out(printable(owner)));
  return a;
}

std::string identity_arg(const rank_identity& id) {
  return fmt::format("{}:{}:{}", id.uid, id.gid, fmt::join(id.groups, ","));
}

} // namespace cafhvd
