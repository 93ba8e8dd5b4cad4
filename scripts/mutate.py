#!/usr/bin/env python3
"""Mutation testing: plants each bug of MUTANTS alone in a scratch copy of the committed
tree, builds it, and runs the tests that must catch it; prints caught or survived with
the catching test, and the counts.

    scripts/mutate.py [--scratch DIR] [--only ID[,ID...]] [--keep-going]
    scripts/mutate.py --check     (each mutant's text is in its file exactly once; fast)
    scripts/mutate.py --list

A mutant is a small change of the kind a real edit makes (a dropped line, a flipped
comparison, a check that always passes), on a core path: launch and exit codes, rank
assignment, elastic generations and host order, drain, placement, TLS roles and
revocation, tickets, owner accounts, rendezvous scopes, output, the wire guard and the
actors' sender checks. Its catchers are tests of `.ci/run`'s suites: a doctest filter of
the unit suite (`unit:` + a -tc pattern) or a harness suite's test (`SUITE:` + the
runner's test name). Each catcher first runs on the unmutated build and must pass there
(a doctest filter must match at least one case): a test that fails anyway, or matches
nothing, proves nothing. A mutant is caught when one of its catchers fails; the first
that does is named. A mutant that does not build is reported as such, not as caught.

The scratch copy is a git worktree of HEAD (uncommitted changes are not in it) with its
own build directory, kept between runs (default /var/tmp/caf-hvd-mutate), so a rerun
only rebuilds what the mutants touch. Runs the suites one at a time: not alongside
another test run on this machine (the harness suites count processes by pattern).
Exit status: 0 when every mutant was caught, 1 otherwise, 2 on a broken mutant list.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def m(ident, area, path, old, new, *catchers):
    return {"id": ident, "area": area, "path": path, "old": old, "new": new,
            "catchers": list(catchers)}


MUTANTS = [
    # -- launch and exit codes ----------------------------------------------------------
    m("exit-signal-code", "launch and exit codes", "runtime/launch/process.cpp",
      "return signal != 0 ? 128 + signal : code;",
      "return signal != 0 ? signal : code;",
      "unit:signals reach the whole group*",
      "cluster:ClusterTest.test_exit_code_of_the_first_failing_rank"),
    m("rank-in-agents-session", "launch and exit codes", "runtime/launch/process.cpp",
      "POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSID);",
      "POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP);",
      "unit:a rank leads a session of its own*"),
    m("exit-interrupted-code", "launch and exit codes", "actors/job/job.cpp",
      "code = 128 + interrupted_;", "code = 1;",
      "elastic:ElasticTest.test_interrupt_and_driver_kill_stop_every_rank"),
    m("lost-driver-ranks-kept", "launch and exit codes", "actors/colocator.cpp",
      "      for (auto& w : st.workers)\n"
      "        self->send(w, terminate_atom::value, int32_t{SIGTERM});\n"
      "      self->delayed_send(self, std::chrono::milliseconds(grace_ms), kill_atom::value);",
      "",
      "cluster:ClusterTest.test_driver_killed_agents_stop_the_job_and_stay_up",
      "unit:a driver's teardown escalates too*"),
    m("stderr-tagged-stdout", "output integrity", "actors/job/output.cpp",
      "auto tag = output_tag(s ? s->rank : -1, b.stream);",
      "auto tag = output_tag(s ? s->rank : -1, 0);",
      "cluster:ClusterTest.test_output_integrity_under_load"),
    # -- rank assignment ----------------------------------------------------------------
    m("local-size-not-capped", "rank assignment", "runtime/job/assignment.cpp",
      "size, static_cast<int>(ranks.size()),", "size, h->slots,",
      "unit:get_host_assignments: homogeneous*",
      "elastic:ElasticTest.test_local_and_cross_sizes_count_only_the_ranks_max_np_leaves"),
    m("cross-size-is-host-count", "rank assignment", "runtime/job/assignment.cpp",
      "static_cast<int>(peers.size())});", "static_cast<int>(placed.size())});",
      "unit:get_host_assignments: homogeneous*"),
    m("cross-rank-is-local-rank", "rank assignment", "runtime/job/assignment.cpp",
      "cross_rank[ranks[lr]] = cross_size[lr]++;", "cross_rank[ranks[lr]] = lr, cross_size[lr]++;",
      "unit:coordinator: 5/4/3 ranks on three nodes*"),
    m("local-rank-is-rank", "rank assignment", "runtime/job/env.cpp",
      'env["HOROVOD_LOCAL_RANK"] = s(in.local_rank);', 'env["HOROVOD_LOCAL_RANK"] = s(in.rank);',
      "unit:rank environment carries Horovod's*"),
    # -- elastic generations, host order, drain -----------------------------------------
    m("host-order-from-discovery", "elastic host order", "actors/job/generations.cpp",
      "auto before = order_;\n  order_ = order_hosts(before, available);",
      "auto before = order_;\n  order_ = available;",
      "unit:elastic: a new host that discovery lists before the survivors*"),
    m("reset-limit-one-late", "elastic generations", "actors/job/generations.cpp",
      "resets_ >= static_cast<uint64_t>(*ec_.reset_limit)",
      "resets_ > static_cast<uint64_t>(*ec_.reset_limit)",
      "elastic:ElasticTest.test_reset_limit"),
    m("blacklist-never-cools-down", "elastic generations", "actors/job/hosts.cpp",
      "      h.blacklisted = false;\n", "",
      "elastic:ElasticTest.test_cooldown_host_returns"),
    m("fewer-slots-not-a-removal", "elastic generations", "runtime/job/elastic.cpp",
      "if (it == a.end() || it->second < s)", "if (it == a.end())",
      "unit:host changes: added / removed*"),
    m("draining-host-stays-listed", "drain", "actors/job/hosts.cpp",
      "h.listed = !h.draining;", "h.listed = true;",
      "elastic:ElasticTest.test_a_draining_agent_is_left_like_a_host_gone_from_discovery"),
    # -- placement ----------------------------------------------------------------------
    m("drained-node-placed", "placement and drain", "runtime/cluster/membership.cpp",
      "    if (e.row.state != \"alive\" || m.draining || e.row.drained || !has_labels(m, r.labels))\n"
      "      continue;\n"
      "    auto f = fit_of(name, e.row, r.job, r.cpus_per_slot, r.gpus_per_slot, &holders);",
      "    if (e.row.state != \"alive\" || m.draining || !has_labels(m, r.labels))\n"
      "      continue;\n"
      "    auto f = fit_of(name, e.row, r.job, r.cpus_per_slot, r.gpus_per_slot, &holders);",
      "unit:placement: a node the administrator drained*"),
    m("placement-jumps-the-queue", "placement", "runtime/cluster/membership.cpp",
      "if (free < r.np || ahead > 0) {", "if (free < r.np) {",
      "unit:placement: packed or spread*"),
    m("packed-emptiest-first", "placement", "runtime/cluster/membership.cpp",
      "return a.free != b.free ? a.free > b.free : a.name < b.name;",
      "return a.free != b.free ? a.free < b.free : a.name < b.name;",
      "unit:placement: packed or spread*"),
    # -- what outlives an agent's or the table's restart --------------------------------
    m("drain-not-kept", "restarts", "actors/cluster.cpp",
      "  if (!n.state_dir.empty())\n    if (auto why = write_drain_mark(",
      "  if (false)\n    if (auto why = write_drain_mark(",
      "membership:MembershipTest.test_a_drain_outlives_its_agents_restart_and_an_undrain_"
      "given_while_away_ends_it"),
    m("undrain-while-away-ignored", "restarts", "actors/joiner.cpp",
      "} else if (answer.undrained && n.draining->load()) {", "} else if (false) {",
      "membership:MembershipTest.test_a_drain_outlives_its_agents_restart_and_an_undrain_"
      "given_while_away_ends_it"),
    m("restarted-table-final-at-once", "restarts", "runtime/cluster/membership.cpp",
      "  if (missing.empty())\n    return {};", "  if (true)\n    return {};",
      "unit:placement: a table whose agent restarted*",
      "membership:MembershipTest.test_an_elastic_job_keeps_its_hosts_while_the_tables_agent_"
      "restarts"),
    m("waiting-job-fails-with-its-table", "restarts", "apps/cmd_job.cpp",
      "if (said.empty() || std::chrono::steady_clock::now() >= deadline)", "if (true)",
      "membership:MembershipTest.test_a_job_waiting_for_slots_outlives_a_restart_of_the_"
      "tables_agent"),
    m("placements-not-restored", "restarts", "actors/cluster.cpp",
      "          st.table.restore_placements(kept, unix_ms());", "          (void)kept;",
      "membership:MembershipTest.test_a_job_waiting_for_slots_outlives_a_restart_of_the_"
      "tables_agent"),
    m("restored-hold-dropped-while-rejoining", "restarts", "runtime/cluster/membership.cpp",
      "bool away = row == rows_.end() ? rejoining(now_ms).empty()",
      "bool away = row == rows_.end() ? true",
      "unit:placement: a restarted table keeps*"),
    # -- slots: a replaced rank's handover, a full node, cancel -------------------------
    m("handover-refused-at-once", "slots", "actors/colocator.cpp",
      "if (!st.book->fits_once_own_end(st.book_id, static_cast<uint32_t>(slots.size()),",
      "if (true || !st.book->fits_once_own_end(st.book_id, static_cast<uint32_t>(slots.size()),",
      "unit:a job's new worker waits for the node slot*"),
    m("full-node-blacklisted", "slots", "actors/job/launch.cpp",
      "              if (keeps)\n                return host_full(ep, ids, why);",
      "              if (keeps)\n                return fail_running(ids, why);",
      "elastic:ElasticTest.test_growing_onto_a_node_another_job_filled_keeps_the_node_and_"
      "its_ranks"),
    # (the table's owner check and each colocator's are two layers: with either gone the
    # other still keeps bob's cancel from alice's ranks; each has its own catcher)
    m("table-cancels-any-owners-job", "slots", "actors/cluster.cpp",
      "if (who.only.empty() || j.owner == who.only)", "if (true)",
      "membership:MembershipTest.test_a_job_is_cancelled_by_its_owner_or_an_administrator_and_"
      "by_no_other_driver"),
    m("colocator-cancels-any-owners-job", "slots", "actors/colocator.cpp",
      "|| (!only.empty() && only != owner))", "|| (only.empty() && only != owner))",
      "unit:a cancel from the agent stops that job's ranks*"),
    # -- slow is not dead --------------------------------------------------------------
    m("slow-rank-failed-at-once", "barrier", "runtime/job/generation.cpp",
      "std::max(g.began, p.alive) + elastic_timeout", "g.began + elastic_timeout",
      "unit:coordinator: a late slot that holds state is told once*",
      "unit:elastic: a rank that holds state and misses the elastic timeout*"),
    m("cpu-time-not-a-sign-of-life", "barrier", "actors/worker.cpp",
      "  if (ticks != st.cpu_ticks) {", "  if (false) {",
      "horovod-elastic:HorovodElastic.test_rank_in_a_long_step_is_waited_for_past_the_"
      "elastic_timeout"),
    # -- growth holds, a table that restarts under new jobs ---------------------------
    m("growth-not-held", "placement", "runtime/cluster/membership.cpp",
      "  if (it != held_.end() && !it->second.growth)\n    return; // placed: its own hold stands",
      "  if (true)\n    return;",
      "unit:placement: a growing elastic job holds the free slots*"),
    m("driver-gives-up-on-a-restarting-table", "placement", "apps/cmd_job.cpp",
      "    if (!restarting() || wait.count() == 0)\n      return why;",
      "    if (true)\n      return why;",
      "membership:MembershipTest.test_jobs_started_while_the_tables_agent_restarts_wait_for_it"),
    m("drained-state-carrier-dropped", "elastic", "actors/job/generations.cpp",
      "std::string kept = survives ? std::string{} : draining_carrier(before);",
      "std::string kept;",
      "unit:elastic: a node that drains with the job's only state keeps one rank*",
      "membership:MembershipTest.test_draining_the_only_node_of_an_elastic_job_carries_its_"
      "state_to_another"),
    # -- rendezvous scopes --------------------------------------------------------------
    m("scope-cleared-at-first-finish", "rendezvous scopes", "runtime/horovod/kv_store.cpp",
      "if (static_cast<int>(done.size()) >= size->second) {", "if (!done.empty()) {",
      "unit:store: plan sizes*",
      "cluster:ClusterTest.test_a_rendezvous_scope_is_kept_until_its_last_rank_finishes"),
    # -- TLS roles, revocation, tickets -------------------------------------------------
    # (a driver's own role check, `: peer == cert_role::node`, is a second layer: with it
    # gone, OpenSSL's purpose check still refuses a driver or admin certificate posing as
    # an agent, since theirs are issued for TLS clients only; the mutant is equivalent)
    m("agent-refuses-admins", "TLS roles", "net/tls_context.cpp",
      "\n                        || peer == cert_role::admin", "",
      "membership:MembershipTest.test_a_node_drained_while_its_agent_was_away_is_drained_when"
      "_it_joins_again"),
    m("revocation-unchecked", "TLS revocation", "net/tls_context.cpp",
      "    X509_STORE_set_flags(store, X509_V_FLAG_CRL_CHECK);",
      "    X509_STORE_set_flags(store, 0);",
      "unit:revocation: a revoked driver is refused*"),
    m("ticket-any-role", "tickets", "net/credentials.cpp",
      "if (found != role && found != cert_role::member)", "if (false)",
      "unit:tickets: who signed a statement*"),
    m("ticket-any-audience", "tickets", "net/credentials.cpp",
      "if (lines[1] != purpose || lines[2] != audience)", "if (lines[1] != purpose)",
      "unit:tickets: who signed a statement*"),
    m("ticket-never-stale", "tickets", "net/credentials.cpp",
      "made < now - 300 || made > now + 300", "made > now + 300",
      "unit:tickets: who signed a statement*"),
    # -- owner accounts -----------------------------------------------------------------
    m("shim-keeps-agent-account", "owner accounts", "apps/caf-hvd-exec.cpp",
      "if (int e = become(uid, gid, groups, n); e != 0) {", "if (int e = 0; e != 0) {",
      "unit:the shim becomes the rank's account*",
      "isolation:IsolationTest.test_a_rank_reaches_nothing_of_another_owner_nor_the_root_agent"),
    m("root-ranks-allowed", "owner accounts", "runtime/launch/identity.cpp",
      "if (id.uid == 0 && !policy.allow_root)", "if (false)",
      "isolation:IsolationTest.test_owners_that_must_not_run_are_refused_saying_both_ways_out"),
    # -- the wire guard -----------------------------------------------------------------
    m("guard-node-id-unbound", "wire guard", "runtime/network/basp_guard.cpp",
      "if (auto why = claim_(node); !why.empty())", "if (auto why = claim_(node); false)",
      "unit:wire guard: *"),
    m("guard-own-node-id", "wire guard", "runtime/network/basp_guard.cpp",
      "if (node == policy_.this_node)", "if (false)",
      "unit:wire guard: *"),
    m("guard-down-about-any-node", "wire guard", "runtime/network/basp_guard.cpp",
      "if (in.substr(0, source) != peer_)", "if (false)",
      "unit:wire guard: *"),
    m("guard-any-named-actor", "wire guard", "runtime/network/basp_guard.cpp",
      "if (std::find(ok.begin(), ok.end(), dest_actor_) == ok.end())", "if (false)",
      "unit:wire guard: *"),
    m("guard-no-cap", "wire guard", "runtime/network/basp_guard.cpp",
      "if (payload_len_ > policy_.max_payload)", "if (false)",
      "unit:wire guard: *"),
    m("guard-links-pass", "wire guard", "runtime/network/basp_guard.cpp",
      "if (atom == policy_.link_atom || atom == policy_.unlink_atom)", "if (false)",
      "unit:wire guard: *"),
    # -- the actors' sender checks ------------------------------------------------------
    m("colocator-obeys-anyone", "sender checks", "actors/colocator.cpp",
      'return admitted(self, sent_by(self, self->state.driver), "a colocator", what);',
      'return admitted(self, true, "a colocator", what);',
      "unit:a colocator obeys only its driver*"),
    m("worker-obeys-anyone", "sender checks", "actors/worker.cpp",
      "(colocator_may && sent_by(self, colocator))", "(colocator_may)",
      "unit:a worker obeys only its colocator*"),
    m("job-takes-any-worker", "sender checks", "actors/job/job.cpp",
      "if (s && sent_by(this, s->worker))", "if (s)",
      "unit:the job takes a rank's exit*"),
    m("coordinator-takes-anyone", "sender checks", "actors/coordinator.cpp",
      'return admitted(this, sent_by(this, job_), "the coordinator", what);',
      'return admitted(this, true, "the coordinator", what);',
      "unit:coordinator: the job's messages are taken from the job only"),
    m("table-takes-any-member-news", "sender checks", "actors/cluster.cpp",
      "m != self->state.members.end() && sent_by(self, m->second.joiner),",
      "m != self->state.members.end(),",
      "unit:the cluster's table takes a join only*"),
]


def run(cmd, timeout=None, cwd=None):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd)


def check_texts(tree):
    """Problems with the list against `tree`: texts not found exactly once, bad catchers."""
    problems = []
    seen = set()
    for mu in MUTANTS:
        if mu["id"] in seen:
            problems.append(f"{mu['id']}: the id is used twice")
        seen.add(mu["id"])
        path = os.path.join(tree, mu["path"])
        if not os.path.exists(path):
            problems.append(f"{mu['id']}: {mu['path']} does not exist")
            continue
        n = open(path).read().count(mu["old"])
        if n != 1:
            problems.append(f"{mu['id']}: its text is in {mu['path']} {n} times, not once")
        if mu["old"] == mu["new"]:
            problems.append(f"{mu['id']}: the mutant changes nothing")
        if not mu["catchers"]:
            problems.append(f"{mu['id']}: no test is named to catch it")
        for c in mu["catchers"]:
            if ":" not in c:
                problems.append(f"{mu['id']}: catcher '{c}' is not SUITE:TEST")
            elif c.startswith("unit:") and "," in c:
                problems.append(f"{mu['id']}: catcher '{c}' has a comma, where doctest's "
                                f"-tc splits its filters: write * instead")
    return problems


def run_catcher(build, catcher, timeout):
    """(passed, matched, tail of its output) of one catcher on the build as it is."""
    suite, test = catcher.split(":", 1)
    if suite == "unit":
        exe = os.path.join(build, "tests", "unit-tests")
        limit = min(timeout, 90)  # the whole unit suite takes 20 s: a case this slow hangs
        try:
            r = run([exe, f"-tc={test}"], timeout=limit)
        except subprocess.TimeoutExpired:
            return False, True, f"timed out after {limit} s (a hang)"
        out = r.stdout + r.stderr
        cases = re.search(r"test cases:\s+(\d+)", out)
        matched = bool(cases and int(cases.group(1)) > 0)
        return r.returncode == 0, matched, out[-1500:]
    try:
        r = run(["meson", "test", "-C", build, "--no-rebuild", "--print-errorlogs", suite,
                 "--test-args", test], timeout=timeout + 60)
    except subprocess.TimeoutExpired:
        return False, True, f"timed out after {timeout} s"
    log = r.stdout + r.stderr
    testlog = os.path.join(build, "meson-logs", "testlog.txt")
    if os.path.exists(testlog):
        log = open(testlog, errors="replace").read()
    ran = re.search(r"^Ran (\d+) tests?", log, re.M)
    matched = bool(ran and int(ran.group(1)) > 0)
    return r.returncode == 0, matched, log[-1500:]


def prepare(scratch):
    """A worktree of HEAD at scratch/src with its build at scratch/build, built."""
    src, build = os.path.join(scratch, "src"), os.path.join(scratch, "build")
    head = run(["git", "-C", ROOT, "rev-parse", "HEAD"]).stdout.strip()
    if not os.path.isdir(os.path.join(src, ".git")) and not os.path.isfile(
            os.path.join(src, ".git")):
        os.makedirs(scratch, exist_ok=True)
        run(["git", "-C", ROOT, "worktree", "prune"])
        r = run(["git", "-C", ROOT, "worktree", "add", "--detach", "--force", src, head])
        if r.returncode != 0:
            sys.exit(f"mutate: cannot make the worktree {src}: {r.stderr.strip()}")
    else:
        for cmd in (["git", "-C", src, "checkout", "--detach", "--force", head],
                    ["git", "-C", src, "reset", "--hard", head]):
            r = run(cmd)
            if r.returncode != 0:
                sys.exit(f"mutate: cannot move {src} to HEAD: {r.stderr.strip()}")
    if not os.path.isdir(build):
        print(f"mutate: setting up {build} (first run: a whole build, 10-20 minutes)",
              flush=True)
        r = run(["meson", "setup", build, "-Dbuildtype=debugoptimized"], cwd=src)
        if r.returncode != 0:
            sys.exit(f"mutate: meson setup failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    print(f"mutate: building {head[:12]} in {build}", flush=True)
    r = run(["ninja", "-C", build])
    if r.returncode != 0:
        sys.exit(f"mutate: the unmutated tree does not build:\n{r.stdout[-3000:]}")
    return src, build


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scratch", default="/var/tmp/caf-hvd-mutate")
    ap.add_argument("--only", default="", help="comma-separated mutant ids")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per catcher")
    ap.add_argument("--check", action="store_true",
                    help="only check that each mutant's text is in its file exactly once")
    ap.add_argument("--list", action="store_true", help="print the mutants and their catchers")
    args = ap.parse_args()
    if args.list:
        for mu in MUTANTS:
            print(f"{mu['id']:32} {mu['area']:24} {mu['path']}")
            for c in mu["catchers"]:
                print(f"{'':32}   caught by {c}")
        return 0
    problems = check_texts(ROOT)
    if problems:
        print("mutate: the mutant list does not fit the tree:\n  " + "\n  ".join(problems))
        return 2
    if args.check:
        print(f"mutate: {len(MUTANTS)} mutants, each text found once")
        return 0
    chosen = MUTANTS
    if args.only:
        want = set(args.only.split(","))
        unknown = want - {mu["id"] for mu in MUTANTS}
        if unknown:
            ap.error(f"--only: no mutant named {', '.join(sorted(unknown))}")
        chosen = [mu for mu in MUTANTS if mu["id"] in want]
    t_start = time.monotonic()
    src, build = prepare(args.scratch)
    # Every catcher must pass, and match a test, on the unmutated build.
    baseline = {}
    for c in dict.fromkeys(c for mu in chosen for c in mu["catchers"]):
        passed, matched, tail = run_catcher(build, c, args.timeout)
        baseline[c] = passed and matched
        if not (passed and matched):
            print(f"mutate: catcher {c} {'matches no test' if passed else 'fails'} on the "
                  f"unmutated build; it proves nothing:\n{tail}", flush=True)
    results = []
    for mu in chosen:
        t0 = time.monotonic()
        path = os.path.join(src, mu["path"])
        original = open(path).read()
        verdict, by = "survived", ""
        try:
            with open(path, "w") as f:
                f.write(original.replace(mu["old"], mu["new"], 1))
            b = run(["ninja", "-C", build])
            if b.returncode != 0:
                verdict, by = "does not build", b.stdout[-600:].strip().splitlines()[-1:]
            else:
                for c in mu["catchers"]:
                    if not baseline.get(c):
                        continue
                    passed, _, _ = run_catcher(build, c, args.timeout)
                    if not passed:
                        verdict, by = "caught", c
                        break
        finally:
            with open(path, "w") as f:
                f.write(original)
        took = time.monotonic() - t0
        results.append((mu, verdict, by, took))
        print(f"{mu['id']:32} {verdict:15} {by if isinstance(by, str) else by} ({took:.0f} s)",
              flush=True)
    run(["ninja", "-C", build])  # back to the unmutated build for the next run
    caught = sum(1 for _, v, _, _ in results if v == "caught")
    print(f"\nmutate: {caught} of {len(results)} mutants caught in "
          f"{(time.monotonic() - t_start) / 60:.1f} min")
    print("\n| mutant | area | caught by |\n|---|---|---|")
    for mu, v, by, _ in results:
        print(f"| {mu['id']} | {mu['area']} | {by if v == 'caught' else '**' + v + '**'} |")
    bad = [c for c, ok in baseline.items() if not ok]
    return 0 if caught == len(results) and not bad else 1


if __name__ == "__main__":
    sys.exit(main())
