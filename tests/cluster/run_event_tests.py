"""Event log tests: real jobs (static on this machine and across node agents, failing,
elastic with a failure and a host join) write --events; the logs are checked event by
event (order, names, contexts) and replayed to the job's final state, which must match
what the job did. Run by `meson test`; prints a closing 'N passed, N failed' line."""

import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (Cluster, pid_with_env, rank_lines, raw_http, read_line,  # noqa: E402
                     run_suite, wait_until)

ALLREDUCE = os.environ.get("CAF_HVD_ALLREDUCE", "caf-hvd-allreduce")


def read_events(path):
    with open(path) as f:
        events = [json.loads(line) for line in f]
    for e in events:
        assert set(e) == {"timestamp", "name", "context"}, e
        assert isinstance(e["timestamp"], float) and isinstance(e["context"], dict), e
    stamps = [e["timestamp"] for e in events]
    assert stamps == sorted(stamps), "timestamps go back"
    return events


def replay(events):
    """The job's final state from its event log alone."""
    state = {"hosts": {}, "ranks": {}, "generation": 0, "released": 0, "exit_code": None,
             "blacklisted": set(), "failures": []}
    for e in events:
        n, c = e["name"], e["context"]
        if n == "host.ready":
            state["hosts"][c["host"]] = "ready"
        elif n == "host.lost":
            state["hosts"][c["host"]] = "lost"
        elif n == "host.blacklisted":
            state["blacklisted"].add(c["host"])
        elif n == "host.returned":
            state["blacklisted"].discard(c["host"])
        elif n == "generation.begin":
            state["generation"] = c["generation"]
            state["plan"] = {p["rank"]: (p["host"], p["local_rank"]) for p in c["plan"]}
        elif n == "generation.released":
            state["released"] = c["generation"]
        elif n == "rank.started":
            state["ranks"][c["slot"]] = {"rank": c["rank"], "state": "running", "pid": c["pid"]}
        elif n == "rank.ended":
            state["ranks"][c["slot"]].update(state="ended", code=c["code"])
        elif n == "failure":
            state["failures"].append(c["cause"])
        elif n == "job.end":
            state["exit_code"] = c["code"]
    return state


def parse_page(html):
    """The timeline page's structure: lanes in order, each with its bars (class, label,
    x, width, hover text); markers (kind, words, x); generation labels; table rows."""
    page = {"lanes": [], "bars": {}, "markers": [], "generations": [], "tables": {}}
    for lane in re.findall(r'<g class="lane">(.*?)\n</g>', html, re.S):
        name = re.match(r'<text x="4" y="[\d.]+">([^<]*)</text>', lane).group(1)
        page["lanes"].append(name)
        page["bars"][name] = [
            {"cls": m[0], "x": float(m[1]), "w": float(m[2]), "label": m[3], "title": m[4]}
            for m in re.findall(r'<g class="bar (\w+)"><rect x="([\d.]+)" y="[\d.]+" '
                                r'width="([\d.]+)"[^>]*/>(?:<text[^>]*>([^<]*)</text>)?'
                                r'<title>([^<]*)</title>', lane)]
    page["markers"] = [{"kind": m[0], "x": float(m[1]), "text": m[2]}
                       for m in re.findall(r'<g class="marker (\w+)"><line x1="([\d.]+)"[^>]*/>'
                                           r'<text[^>]*>([^<]*)</text>', html)]
    page["generations"] = re.findall(r'<g class="generation">.*?<title>([^<]*)</title>', html)
    for table in ("hosts", "generations", "processes"):
        body = re.search(rf'<table class="{table}">(.*?)</table>', html, re.S).group(1)
        page["tables"][table] = [re.findall(r"<td>([^<]*)</td>", row)
                                 for row in re.findall(r"<tr[^>]*>(.*?)</tr>", body)][1:]
    page["exit"] = re.search(r'<p class="exit">([^<]*)</p>', html).group(1)
    return page


class EventTest(unittest.TestCase):
    def setUp(self):
        self.c = Cluster()
        self.addCleanup(self.c.close)
        self.dir = tempfile.mkdtemp(prefix="caf-hvd-events-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.log = os.path.join(self.dir, "events.jsonl")

    def names(self, events):
        return [e["name"] for e in events]

    def draw(self, lanes):
        """caf-hvd timeline: a trace that is valid JSON and a page with one lane each."""
        page, trace = os.path.join(self.dir, "job.html"), os.path.join(self.dir, "job.json")
        for out in (page, trace):
            rc, _, err = self.c.run(["timeline", self.log, "-o", out])
            self.assertEqual(rc, 0, err)
        with open(trace) as f:
            names = {e["args"]["name"] for e in json.load(f)["traceEvents"]
                     if e["name"] == "thread_name"}
        with open(page) as f:
            html = f.read()
        for lane in lanes:
            self.assertIn(lane, names)
            self.assertIn(f">{lane}<", html)
        # plain words everywhere: no JSON lists or objects printed into the page
        self.assertNotRegex(html, r'\[&quot;|\["|\{&quot;')
        self.assertIn('class="legend"', html)
        self.screenshot(page)
        return parse_page(html)

    def screenshot(self, page):
        """The page in a real browser: not blank (skipped without Chromium)."""
        browser = shutil.which("chromium") or shutil.which("chromium-browser")
        if not browser:
            self.skipTest("the timeline screenshot needs Debian's chromium (scripts/test.sh "
                          "installs it)")
        png = page + ".png"
        r = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                            "--window-size=1300,700", f"--screenshot={png}", f"file://{page}"],
                           capture_output=True, text=True, timeout=120)
        self.assertTrue(os.path.exists(png), r.stderr[-2000:])
        with open(png, "rb") as f:
            data = f.read()
        self.assertEqual(data[:8], b"\x89PNG\r\n\x1a\n")
        # A blank page compresses to a few KiB; lanes, bands and labels do not.
        self.assertGreater(len(data), 15000, f"{png} looks blank")

    def test_static_job_on_this_machine(self):
        rc, out, err = self.c.run(["run", "-np", "2", "--events", self.log, "true"])
        self.assertEqual(rc, 0, err)
        ev = read_events(self.log)
        self.assertEqual(self.names(ev), [
            "job.start", "phase.begin", "phase.end", "phase.begin", "host.ready", "rendezvous",
            "torch_store", "phase.end", "phase.begin", "generation.begin",
            "generation.released", "rank.started", "rank.started", "phase.end", "phase.begin",
            "rank.ended", "rank.ended", "phase.end", "job.end"])
        self.assertEqual([e["context"]["phase"] for e in ev if e["name"].startswith("phase")],
                         ["connect", "connect", "nic", "nic", "launch", "launch", "run", "run"])
        self.assertEqual(ev[0]["context"], {"kind": "static", "command": ["true"], "np": 2,
                                            "hosts": ["localhost"]})
        gen = next(e["context"] for e in ev if e["name"] == "generation.begin")
        self.assertEqual([p["rank"] for p in gen["plan"]], [0, 1])
        for e in ev:
            if e["name"].startswith("rank."):
                self.assertIsInstance(e["context"]["rank"], int)
                self.assertIn("host", e["context"])
        state = replay(ev)
        self.assertEqual(state["exit_code"], rc)
        self.assertEqual(sorted(r["code"] for r in state["ranks"].values()), [0, 0])
        self.assertEqual(state["released"], 1)
        host = next(e["context"]["host"] for e in ev if e["name"] == "host.ready")
        self.draw(["job", f"host {host}", f"slot {host}:0", f"slot {host}:1"])

    def test_failing_job_across_agents_via_environment(self):
        self.c.node("ea")
        self.c.node("eb")
        spec = f"{self.c.spec('ea', 1)},{self.c.spec('eb', 1)}"
        env = dict(os.environ, CAF_HVD_EVENTS=self.log)
        # rank 1 fails a second after its start, once every host has answered its launch
        # and the run phase has begun (at once, its exit report could overtake the other
        # host's launch answer and the job would fail inside the launch phase)
        rc, out, err = self.c.run(["driver", "-np", "2", "-H", spec, "--kill-grace-seconds", "1",
                                   "sh", "-c", 'if [ "$HOROVOD_RANK" = 1 ]; then sleep 1; exit 4; '
                                   'fi; exec sleep 30'], env=env)
        self.assertEqual(rc, 4, err)
        ev = read_events(self.log)
        names = self.names(ev)
        self.assertEqual(names.count("host.connected"), 2)
        self.assertTrue(all(e["context"]["tls"] for e in ev if e["name"] == "host.connected"))
        ended = [e["context"] for e in ev if e["name"] == "rank.ended"]
        self.assertEqual(ended[0]["rank"], 1)
        self.assertEqual((ended[0]["host"], ended[0]["code"]), ("eb", 4))
        self.assertEqual((ended[1]["rank"], ended[1]["signal"]), (0, signal.SIGTERM))
        # the failure comes before the teardown, which comes before the end
        self.assertLess(names.index("failure"), names.index("job.end"))
        self.assertEqual([e["context"]["phase"] for e in ev if e["name"] == "phase.begin"][-1],
                         "teardown")
        state = replay(ev)
        self.assertEqual(state["exit_code"], 4)
        self.assertIn("rank 1 on host eb ended with exit code 4", state["failures"][0])
        page = self.draw(["job", "host ea", "host eb", "slot ea:0", "slot eb:0"])
        self.assertEqual(page["lanes"], ["job", "host ea", "host eb", "slot ea:0", "slot eb:0"])
        # the failing rank red, the one the launcher stopped orange, not both "failed"
        self.assertEqual([b["cls"] for b in page["bars"]["slot eb:0"]], ["failed"])
        self.assertEqual([b["cls"] for b in page["bars"]["slot ea:0"]], ["stopped"])
        self.assertIn("exit code 4", page["bars"]["slot eb:0"][0]["title"])
        self.assertEqual([m["text"] for m in page["markers"]], ["failure"])
        self.assertEqual([b["title"].split(":")[0] for b in page["bars"]["job"]],
                         ["connect", "nic", "launch", "run", "teardown"])
        self.assertTrue(page["exit"].startswith("exit 4: rank 1 on host eb"), page["exit"])
        self.assertEqual(sorted(map(tuple, page["tables"]["processes"])),
                         [("failed (non-zero exit, signal, or could not start)", "1"),
                          ("stopped by the launcher (the job was ending)", "1")])

    def test_elastic_job_with_a_failure_and_a_join(self):
        script, set_hosts = self.elastic_hosts(("xa", "xb", "xc"))
        set_hosts("xa", "xb")
        d = self.c.start(["driver", "--host-discovery-script", script, "--discovery-interval",
                          "0.1", "--min-np", "1", "--events", self.log, ALLREDUCE, "--elastic",
                          "--steps", "150", "--step-ms", "20"])
        line, deadline = "", time.monotonic() + 60
        while "step 5 " not in line:
            line = read_line(d.stdout.fileno(), deadline)
            self.assertTrue(line.endswith("\n"), "the job ended early"
                            if time.monotonic() < deadline else "no step 5 within 60 s")
        os.kill(pid_with_env(ALLREDUCE, prefix=True, HOROVOD_HOSTNAME="xb"), signal.SIGKILL)
        wait_until(lambda: '"host.blacklisted"' in open(self.log).read(), 10,
                   "xb to be blacklisted")
        set_hosts("xa", "xb", "xc")
        out, err = d.communicate(timeout=60)
        self.assertEqual(d.returncode, 0, err)
        ev = read_events(self.log)
        names = self.names(ev)
        self.assertEqual(ev[0]["context"]["kind"], "elastic")
        gens = [e["context"] for e in ev if e["name"] == "generation.begin"]
        self.assertEqual([g["generation"] for g in gens], [1, 2, 3])
        self.assertEqual([g["hosts"] for g in gens], [["xa", "xb"], ["xa"], ["xa", "xc"]])
        self.assertEqual(gens[1]["removed"], ["xb"])
        self.assertEqual(gens[2]["added"], ["xc"])
        killed = next(e["context"] for e in ev if e["name"] == "rank.ended")
        self.assertEqual((killed["host"], killed["signal"]), ("xb", signal.SIGKILL))
        self.assertEqual(next(e["context"] for e in ev if e["name"] == "host.blacklisted"),
                         {"host": "xb", "failures": 1, "cooldown_seconds": None})
        self.assertLess(names.index("host.blacklisted"), [i for i, n in enumerate(names)
                                                          if n == "generation.begin"][1])
        self.assertIn("discovery", names)
        state = replay(ev)
        self.assertEqual(state["exit_code"], 0)
        self.assertEqual(state["released"], 3)
        self.assertEqual(state["blacklisted"], {"xb"})
        self.assertEqual(state["plan"], {0: ("xa", 0), 1: ("xc", 0)})
        self.assertEqual(sorted(r["code"] for s, r in state["ranks"].items()
                                if s in ("xa:0", "xc:0")), [0, 0])
        page = self.draw(["host xa", "host xb", "host xc", "slot xa:0", "slot xb:0",
                          "slot xc:0"])
        self.assertEqual(page["lanes"][:4], ["job", "host xa", "host xb", "host xc"])
        self.assertEqual(page["bars"]["host xb"][-1]["cls"], "blacklisted")
        texts = [m["text"] for m in page["markers"]]
        self.assertIn("blacklisted xb", texts)
        self.assertIn("join: xc", texts)
        self.assertIn("generation 3 released", texts)
        self.assertEqual(page["generations"],
                         ["generation 1: 2 ranks on xa, xb", "generation 2: 1 rank on xa",
                          "generation 3: 2 ranks on xa, xc"])
        job = [b["cls"] for b in page["bars"]["job"]]
        self.assertEqual(job[0], "waiting")
        for stretch in ("barrier", "running"):
            self.assertIn(stretch, job)
        self.assertEqual(page["bars"]["slot xb:0"][-1]["cls"], "failed")
        hosts = {row[0]: row[3] for row in page["tables"]["hosts"]}
        self.assertTrue(hosts["xb"].startswith("blacklisted at "), hosts)
        self.assertEqual(hosts["xc"], "to the end of the job")
        self.assertEqual([row[0] for row in page["tables"]["generations"]], ["1", "2", "3"])
        self.assertEqual(page["exit"], "exit 0")
        # the closing summary: every host the job used, and its time per generation
        self.assertIn("hosts        3 (xa, xb blacklisted, xc)", err)
        self.assertRegex(err, r"time +[\d.]+ ms \(generation 1 [\d.]+, generation 2 [\d.]+, "
                              r"generation 3 [\d.]+ ms\)")

    def elastic_hosts(self, names):
        """A discovery script listing `names` (in that order); returns (script, set_hosts)."""
        hosts = os.path.join(self.dir, "hosts")
        script = os.path.join(self.dir, "discover.sh")
        with open(script, "w") as f:
            f.write(f"#!/bin/sh\ncat {hosts}\n")
        os.chmod(script, stat.S_IRWXU)
        for n in names:
            self.c.node(n)

        def set_hosts(*listed):
            with open(hosts + ".tmp", "w") as f:
                for n in listed:
                    f.write(f"127.0.0.1:{self.c.nodes[n][1]}:1\n")
            os.replace(hosts + ".tmp", hosts)
        return script, set_hosts

    @staticmethod
    def fetch(url):
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.headers, r.read().decode()

    def test_live_dashboard_and_a_host_lost_after_a_join(self):
        """The issue's scenario: n2 and n1 train, n0 joins, n1's agent is killed. Watched
        live through --dashboard, then drawn from the log: n1's slot ends where n1 was
        lost (drawn as lost), n0's slot shows its rank in each generation, the hosts are
        in the job's order (not alphabetical), and the summary counts all three hosts."""
        script, set_hosts = self.elastic_hosts(("n2", "n1", "n0"))
        set_hosts("n2", "n1")
        d = self.c.start(["driver", "--host-discovery-script", script, "--discovery-interval",
                          "0.1", "--min-np", "1", "--events", self.log, "--dashboard", "0",
                          "--dashboard-keep", "30", ALLREDUCE, "--elastic", "--steps", "600",
                          "--step-ms", "20"])
        line = read_line(d.stderr.fileno(), time.monotonic() + 20)
        url = re.search(r"dashboard at (http://127\.0\.0\.1:\d+/)", line)
        self.assertTrue(url, line)
        url = url.group(1)
        status, headers, html = self.fetch(url)
        self.assertEqual(status, 200)
        self.assertIn("script-src", headers["Content-Security-Policy"].replace(
            "default-src 'none'", "script-src"))  # default-src 'none' covers scripts
        self.assertNotIn("<script", html)

        def page_now():
            return parse_page(self.fetch(url)[2])
        wait_until(lambda: page_now()["generations"][:1] == ["generation 1: 2 ranks on n2, n1"],
                   20, "the live page to show generation 1")
        self.assertIn('http-equiv="refresh"', self.fetch(url)[2])
        line, deadline = "", time.monotonic() + 60
        while "step 5 " not in line:
            line = read_line(d.stdout.fileno(), deadline)
            self.assertTrue(line.endswith("\n"), "the job ended early"
                            if time.monotonic() < deadline else "no step 5 within 60 s")
        rest = []  # the ranks' output must keep flowing while the test watches the page
        reader = threading.Thread(target=lambda: rest.extend(d.stdout), daemon=True)
        reader.start()
        set_hosts("n2", "n1", "n0")
        wait_until(lambda: "generation 2 released" in [m["text"] for m in page_now()["markers"]],
                   20, "the live page to show generation 2 released")
        self.assertEqual(page_now()["generations"][1], "generation 2: 3 ranks on n2, n1, n0")
        # n1 goes once n0's new process trains with it (killed within milliseconds of
        # the release, n0's process waits out its Gloo timeout before it can vote)
        try:
            wait_until(lambda: any(" size 3 sum 3 " in line for line in rest), 20,
                       "n0's process to train in generation 2")
        except AssertionError:
            raise AssertionError("n0 did not train: " + "".join(rest[-20:]))
        os.kill(self.c.nodes["n1"][0].pid, signal.SIGKILL)
        try:
            wait_until(lambda: page_now()["exit"] != "the job has not ended (yet)", 60,
                       "the final page")
        except AssertionError:
            d.kill()
            raise AssertionError(f"no final page; the driver said:\n{d.communicate()[1]}\n"
                                 f"its events ended with:\n"
                                 f"{''.join(open(self.log).readlines()[-6:])}")
        self.assertEqual(page_now()["exit"], "exit 0")
        final = self.fetch(url)[2]
        self.assertNotIn('http-equiv="refresh"', final)  # the final page stays still
        self.assertIn("ended: exit 0", final)
        d.send_signal(signal.SIGINT)  # ends --dashboard-keep early
        err = d.stderr.read()
        d.wait(timeout=30)
        reader.join(timeout=10)
        self.assertEqual(d.returncode, 0, err)

        ev = read_events(self.log)
        gens = {e["context"]["generation"]: e["context"] for e in ev
                if e["name"] == "generation.begin"}
        rank_in = {g: {(p["host"], p["local_rank"]): p["rank"] for p in c["plan"]}
                   for g, c in gens.items()}
        page = self.draw(["host n2", "host n1", "host n0", "slot n2:0", "slot n1:0",
                          "slot n0:0"])
        self.assertEqual(page["lanes"], ["job", "host n2", "host n1", "host n0", "slot n2:0",
                                         "slot n1:0", "slot n0:0"])
        lost = [m for m in page["markers"] if m["text"] == "lost n1"]
        self.assertEqual(len(lost), 1, page["markers"])
        n1 = page["bars"]["slot n1:0"][-1]
        self.assertEqual(n1["cls"], "lost")
        self.assertAlmostEqual(n1["x"] + n1["w"], lost[0]["x"], delta=1.0)
        self.assertIn("lost", [b["cls"] for b in page["bars"]["host n1"]])
        # n0's process lived through generations 2 and 3: a segment for each, with the
        # rank it had there (the plans say which; they differ)
        last = max(gens)
        want = [f"rank {rank_in[2][('n0', 0)]}", f"rank {rank_in[last][('n0', 0)]}"]
        self.assertNotEqual(want[0], want[1])
        n0 = page["bars"]["slot n0:0"]
        # (the label is drawn only where it fits; the hover text always says it)
        self.assertEqual([b["title"].split(" on ")[0] for b in n0], want, n0)
        self.assertEqual([b["cls"] for b in n0], ["carried", "ok"])
        self.assertIn("join: n0", [m["text"] for m in page["markers"]])
        hosts = {row[0]: row[3] for row in page["tables"]["hosts"]}
        self.assertTrue(hosts["n1"].startswith("lost at "), hosts)
        self.assertIn("hosts        3 (n2, n1 lost, n0)", err)

    def test_blacklist_cooldown_on_the_page(self):
        script, set_hosts = self.elastic_hosts(("ca", "cb"))
        set_hosts("ca", "cb")
        d = self.c.start(["driver", "--host-discovery-script", script, "--discovery-interval",
                          "0.1", "--min-np", "1", "--blacklist-cooldown-range", "1", "1",
                          "--events", self.log, ALLREDUCE, "--elastic", "--steps", "250",
                          "--step-ms", "20"])
        line, deadline = "", time.monotonic() + 60
        while "step 5 " not in line:
            line = read_line(d.stdout.fileno(), deadline)
            self.assertTrue(line.endswith("\n"), "the job ended early"
                            if time.monotonic() < deadline else "no step 5 within 60 s")
        os.kill(pid_with_env(ALLREDUCE, prefix=True, HOROVOD_HOSTNAME="cb"), signal.SIGKILL)
        out, err = d.communicate(timeout=60)
        self.assertEqual(d.returncode, 0, err)
        self.assertIn('"host.returned"', open(self.log).read(), err)
        page = self.draw(["host ca", "host cb", "slot ca:0", "slot cb:0"])
        texts = [m["text"] for m in page["markers"]]
        self.assertIn("blacklisted cb", texts)
        self.assertIn("cooldown over: cb", texts)
        self.assertLess(texts.index("blacklisted cb"), texts.index("cooldown over: cb"))
        # cb is ready again after its cooldown: a second "ready" stretch on its lane
        self.assertGreaterEqual([b["cls"] for b in page["bars"]["host cb"]].count("up"), 2)

    def test_dashboard_options(self):
        rc, _, err = self.c.run(["run", "-np", "1", "--dashboard", "abc", "true"])
        self.assertEqual(rc, 2)
        self.assertIn("--dashboard abc: 'abc' is not a port", err)
        rc, _, err = self.c.run(["run", "-np", "1", "--dashboard", "10.0.0.999:80", "true"])
        self.assertEqual(rc, 2)
        self.assertIn("'10.0.0.999' is not an IP address", err)
        rc, _, err = self.c.run(["run", "-np", "1", "--dashboard-keep", "5", "true"])
        self.assertEqual(rc, 2)
        self.assertIn("--dashboard-keep needs --dashboard", err)
        # anything but loopback is said to be open to whoever reaches it
        rc, _, err = self.c.run(["run", "-np", "1", "--dashboard", "0.0.0.0:0", "true"])
        self.assertEqual(rc, 0, err)
        self.assertRegex(err, r"WARNING: the dashboard on 0\.0\.0\.0:\d+ is plain HTTP without "
                              r"authentication")
        rc, _, err = self.c.run(["run", "-np", "1", "--dashboard", "0", "true"])
        self.assertEqual(rc, 0, err)
        self.assertNotIn("WARNING", err)
        # a port in use: an error before anything runs
        with socket.socket() as busy:
            busy.bind(("127.0.0.1", 0))
            busy.listen()
            port = busy.getsockname()[1]
            rc, out, err = self.c.run(["run", "-np", "1", "--dashboard", str(port), "echo",
                                       "ran"])
        self.assertEqual(rc, 1)
        self.assertIn(f"--dashboard {port}: the dashboard cannot listen on 127.0.0.1:{port}",
                      err)
        self.assertNotIn("ran", out)

    def test_dashboard_answers_only_its_addresses_and_given_names(self):
        """DNS rebinding: a page of attacker.example whose name resolves to the dashboard's
        address reads it with `Host: attacker.example`: refused (421). IP literals,
        localhost (a tunnel's port too) and --dashboard-name names are served."""
        rc, _, err = self.c.run(["run", "-np", "1", "--dashboard-name", "head", "true"])
        self.assertEqual(rc, 2)
        self.assertIn("--dashboard-name needs --dashboard", err)
        rc, _, err = self.c.run(["run", "-np", "1", "--dashboard", "0", "--dashboard-name",
                                 "bad\x1b[2Jname", "true"])
        self.assertEqual(rc, 2)
        self.assertIn("--dashboard-name 'bad\\x1b[2Jname': give a host name", err)
        p = self.c.start(["run", "-np", "1", "--dashboard", "0", "--dashboard-name",
                          "head.example", "sleep", "5"])
        port, deadline = None, time.monotonic() + 20
        for _ in range(20):
            m = re.search(r"dashboard at http://127\.0\.0\.1:(\d+)/",
                          read_line(p.stderr.fileno(), deadline))
            if m:
                port = int(m.group(1))
                break
        self.assertIsNotNone(port, "no dashboard address printed (within 20 s)")

        def status(host):
            return raw_http(("127.0.0.1", port), "GET", "/trace.json", host=host)[0]

        self.assertEqual(status(f"attacker.example:{port}"), 421)
        self.assertEqual(status("localhost:9999"), 200)
        self.assertEqual(status(f"127.0.0.1:{port}"), 200)
        self.assertEqual(status("head.example"), 200)
        p.kill()
        p.communicate()

    def test_closing_summary_and_quiet(self):
        # rank 1 fails at once: its exit report may come in before the launch reply of
        # this host's ranks, and waits for it, so the run phase has begun when it counts
        rc, _, err = self.c.run(["run", "-np", "2", "sh", "-c",
                                 'if [ "$HOROVOD_RANK" = 1 ]; then exit 6; fi; exec sleep 30'])
        self.assertEqual(rc, 6, err)
        self.assertIn("caf-hvd: summary: exit 6 (rank 1 on host ", err)
        self.assertRegex(err, r"processes +2 \(1 x code 143, 1 x code 6\); 1 generation, the "
                              r"last of 2 ranks")
        self.assertRegex(err, r"time +[\d.]+ ms \(connect [\d.]+, nic [\d.]+, launch [\d.]+, "
                              r"run [\d.]+ ms\)")
        rc, _, err = self.c.run(["run", "-np", "2", "--quiet", "true"])
        self.assertEqual((rc, err), (0, ""))

    def test_events_file_that_cannot_be_written(self):
        rc, _, err = self.c.run(["run", "-np", "1", "--events", "/proc/no/such/file", "true"])
        self.assertEqual(rc, 2)
        self.assertIn("--events /proc/no/such/file: cannot write it", err)


if __name__ == "__main__":
    sys.exit(run_suite(EventTest, sys.argv[1:]))
