// Whose account a rank runs as. A node agent that can switch users (root, or
// CAP_SETUID and CAP_SETGID) runs a job's ranks as the account named like the job's
// owner (its driver certificate's name), never as uid 0 unless told, never as a system
// account or as the agent's own user; an owner with no account here maps to the site's
// job account, if it has one, else the job is refused. The switch itself happens in
// caf-hvd-exec (the rank's shim), before it starts the command.
#pragma once

#include <optional>
#include <string>
#include <sys/types.h>
#include <vector>

namespace cafhvd {

struct rank_identity {
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups; // the account's own (supplementary) groups
  std::string user, home;
};

/// --rank-user: the owner's account (when the agent can switch users) or the agent's own.
enum class rank_user_mode { owner, agent };

struct rank_user_policy {
  rank_user_mode mode = rank_user_mode::owner;
  std::string job_account; // for owners with no account on this node ("" = refuse them)
  bool allow_root = false; // an owner named like a uid-0 account may run as it
};

/// Whether this process can start processes under another account: its effective uid is
/// 0, or CAP_SETUID and CAP_SETGID are in its effective set.
bool can_switch_users();

/// The account ranks of `owner` run as here, or why they may not run (a sentence naming
/// both ways out where there are two). `owner` is "" when the agent knows no owner
/// (--insecure).
struct account_answer {
  std::optional<rank_identity> id;
  std::string error;
};
account_answer account_for(const std::string& owner, const rank_user_policy& policy);

/// "UID:GID:G1,G2,..." for caf-hvd-exec's --as (which parses it itself: it links nothing).
std::string identity_arg(const rank_identity& id);

} // namespace cafhvd
