"""The guide (docs/): it builds with warnings as errors (scripts/docs.sh), every page is
built and reachable from the index, the README's links into it resolve, and every
message of the troubleshooting page is brought about and printed by caf-hvd exactly as
the page shows it (a value in angle brackets, <LIKE_THIS>, stands for any text).
Prints 'N passed, N failed'."""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from harness import free_port, reap, run_suite  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(HERE))
DOCS = os.path.join(ROOT, "docs")
CAF_HVD = os.environ.get("CAF_HVD", "caf-hvd")
ALLREDUCE = os.environ.get("CAF_HVD_ALLREDUCE", "caf-hvd-allreduce")


def page_messages(path):
    """The lines of the page's ```text blocks, each block one message (its lines)."""
    blocks, current = [], None
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if current is None and line.strip() == "```text":
                current = []
            elif current is not None and line.strip() == "```":
                blocks.append(current)
                current = None
            elif current is not None:
                current.append(line)
    return blocks


def pattern_of(message_lines):
    """A regex matching the message's lines in order, each a whole line of output, with
    <PLACEHOLDER> for any text on that line."""
    parts = []
    for line in message_lines:
        pieces = re.split(r"<[A-Z_]+>", line)
        parts.append("^" + ".+?".join(re.escape(p) for p in pieces) + "$")
    return re.compile("\n".join(parts), re.M)


class DocsTest(unittest.TestCase):
    def setUp(self):
        self.procs = []
        self.addCleanup(reap, self.procs)
        self.dir = tempfile.mkdtemp(prefix="caf-hvd-docs-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        # no installed agent's cluster, no allocation: the driver has no hosts by default
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("SLURM_", "PBS_", "LSB_", "CAF_HVD_CLUSTER"))}
        self.env["CAF_HVD_NODE_DEFAULTS"] = os.path.join(self.dir, "no-installed-agent")

    def caf_hvd(self, *args, timeout=60, cwd=None):
        p = subprocess.Popen([CAF_HVD, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=self.env, cwd=cwd or self.dir,
                             start_new_session=True)
        self.procs.append(p)
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            raise AssertionError(f"caf-hvd {' '.join(args)} did not end in {timeout} s:\n{err}")
        return p.returncode, out + err

    # -- the site ---------------------------------------------------------------------------

    def test_the_site_builds_strictly_with_every_page(self):
        out = os.path.join(self.dir, "site")
        r = subprocess.run([os.path.join(ROOT, "scripts", "docs.sh"), out],
                           capture_output=True, text=True, env=self.env, timeout=600)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertTrue(os.path.exists(os.path.join(out, "index.html")))
        pages = []
        for base, _, files in os.walk(DOCS):
            for f in files:
                if f.endswith(".md"):
                    pages.append(os.path.relpath(os.path.join(base, f), DOCS)[:-3])
        for page in pages:
            self.assertTrue(os.path.exists(os.path.join(out, page + ".html")), page)
        # the generated references carry what they were generated from
        with open(os.path.join(out, "reference", "cli.html")) as f:
            cli = f.read()
        for sub in ("run", "driver", "node", "status", "drain", "cluster", "timeline"):
            self.assertIn(f"caf-hvd {sub}", cli)
        self.assertIn("--host-discovery-script", cli)
        with open(os.path.join(out, "reference", "python.html")) as f:
            python = f.read()
        for name in ("RayExecutor", "ElasticExecutor", "execute_single", "HorovodTrainer"):
            self.assertIn(name, python)

    def test_the_readme_is_one_screen_with_the_two_commands_first(self):
        with open(os.path.join(ROOT, "README.md")) as f:
            readme = f.read()
        self.assertLess(len(readme.splitlines()), 90, "the README grew past a screen or two")
        first = [l.strip() for l in readme.splitlines() if l.startswith("    ")][:2]
        self.assertEqual(first, ["scripts/demo.sh", "scripts/test.sh"])
        for link in re.findall(r"\]\((docs/[^)#]+)", readme):
            self.assertTrue(os.path.exists(os.path.join(ROOT, link)), link)

    # -- the troubleshooting page -------------------------------------------------------------

    def reproduce(self, lines):
        """Brings about the message whose first line is lines[0]; returns the output."""
        first = lines[0]
        script = os.path.join(self.dir, "discover.sh")
        if first.startswith("caf-hvd run: error: -np is required"):
            return self.caf_hvd("run", "--", "true")
        if "is not this machine" in first:
            return self.caf_hvd("run", "-np", "2", "-H", "otherhost:2", "--", "true")
        if "--mpi is not supported" in first:
            return self.caf_hvd("run", "--mpi", "-np", "1", "--", "true")
        if first.startswith("caf-hvd driver: error: give the hosts"):
            return self.caf_hvd("driver", "-np", "2", "--", "true")
        if "no cluster credentials in" in first:
            return self.caf_hvd("driver", "-np", "2", "-H", "127.0.0.1:2", "--cluster-dir",
                                os.path.join(self.dir, "nowhere"), "--", "true")
        if first.startswith("caf-hvd: error: cannot reach every node agent"):
            return self.caf_hvd("driver", "--insecure", "-np", "2", "-H",
                                f"127.0.0.1:{free_port()}:2", "--", "true")
        if "slots of host spec" in first:
            return self.caf_hvd("hosts", "-H", "a:x")
        if "failed first: exit code" in first:
            return self.caf_hvd("run", "-np", "2", "--", "sh", "-c", "exit 3")
        if "failed first: signal 9" in first:
            return self.caf_hvd("run", "-np", "1", "--", "sh", "-c", "kill -9 $$")
        if "cannot execute" in first:
            return self.caf_hvd("run", "-np", "1", "--", "./no-such-program")
        if "elastic timeout" in first:
            with open(script, "w") as f:
                f.write(f"#!/bin/sh\necho 127.0.0.1:{free_port()}:2\n")
            os.chmod(script, 0o755)
            return self.caf_hvd("driver", "--insecure", "--host-discovery-script", script,
                                "--min-np", "2", "--elastic-timeout", "1", "--", "true")
        if first.startswith("caf-hvd status: error: cannot reach the cluster"):
            return self.caf_hvd("status", "--insecure", "--cluster", f"127.0.0.1:{free_port()}")
        if "the rendezvous server refused a connection" in first:
            if os.geteuid() != 0:
                self.skipTest("a client of another account needs root")
            # the rank forks a child of another account that asks the job's server
            child = ("import os,socket,sys\n"
                     "port=int(os.environ['HOROVOD_GLOO_RENDEZVOUS_PORT'])\n"
                     "os.setgid(54321); os.setuid(54321)\n"
                     "s=socket.create_connection(('127.0.0.1',port),timeout=5)\n"
                     "s.sendall(b'GET /global/0 HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n')\n"
                     "print('answer', len(s.recv(100)))\n")
            return self.caf_hvd("run", "-np", "1", "--", "/usr/bin/python3", "-c", child)
        if "413 store full" in first:
            # the rank writes 8 MiB values to an ad-hoc scope until the server says no
            flood = ("import os,urllib.request,urllib.error\n"
                     "a=os.environ['HOROVOD_GLOO_RENDEZVOUS_ADDR']\n"
                     "p=os.environ['HOROVOD_GLOO_RENDEZVOUS_PORT']\n"
                     "for n in range(100):\n"
                     "  r=urllib.request.Request(f'http://{a}:{p}/mine/{n}',data=b'y'*(8<<20),"
                     "method='PUT')\n"
                     "  try: urllib.request.urlopen(r,timeout=30).read()\n"
                     "  except urllib.error.HTTPError as e: print('answer',e.code); break\n")
            return self.caf_hvd("run", "-np", "1", "--", "/usr/bin/python3", "-c", flood)
        self.fail(f"the troubleshooting page shows a message this test cannot bring about: "
                  f"{first!r}; add its reproduction to run_docs_tests.py")

    def test_every_troubleshooting_message_is_what_caf_hvd_prints(self):
        messages = page_messages(os.path.join(DOCS, "troubleshooting.md"))
        self.assertGreaterEqual(len(messages), 10)
        for lines in messages:
            with self.subTest(message=lines[0][:60]):
                rc, output = self.reproduce(lines)
                self.assertRegex(output, pattern_of(lines), f"exit {rc}")
                if "warning" not in lines[0]:
                    self.assertNotEqual(rc, 0, output)

    def test_every_flag_a_page_gives_a_command_is_in_its_help(self):
        """Every flag that a page, the README or a Python docstring gives `caf-hvd SUB`
        exists in `caf-hvd SUB --help` (the reference page is made from those texts)."""
        helps = {}
        sources = [os.path.join(ROOT, "README.md")]
        sources += [os.path.join(DOCS, f) for f in sorted(os.listdir(DOCS)) if f.endswith(".md")]
        pkg = os.path.join(ROOT, "python", "caf_hvd")
        sources += [os.path.join(pkg, f) for f in sorted(os.listdir(pkg)) if f.endswith(".py")]
        wrong, commands = [], 0
        for path in sources:
            with open(path) as f:
                text = f.read()
            commands += len(commands_in(text, helps))
            wrong += unknown_flags(text, os.path.relpath(path, ROOT), helps)
        self.assertGreater(commands, 50, "the pages' commands were not found")
        self.assertEqual(wrong, [], "flags the pages give that the command's --help lacks")

    def test_the_flag_check_finds_a_flag_that_does_not_exist(self):
        """The check above on a deliberately wrong page: a made-up flag and a flag of
        another subcommand are found, on the right line; the program's own flags after
        `--`, and a continued line, are read as a shell reads them."""
        page = ("Run it:\n\n"
                "    caf-hvd run -np 2 --no-such-flag -- python3 train.py --epochs 3\n"
                "    caf-hvd run -np 2 -H localhost:2 python3 train.py --lr 0.1\n"
                "    caf-hvd status --slots 4\n"
                "    caf-hvd driver -np 2 \\\n"
                "        --made-up 1 -H a:2 -- true\n"
                "Inline: `caf-hvd run -np 1 --verbose -- true` and `caf-hvd hosts --bogus`.\n")
        self.assertEqual(unknown_flags(page, "page.md", {}),
                         ["page.md:3: caf-hvd run --no-such-flag",
                          "page.md:5: caf-hvd status --slots",
                          "page.md:6: caf-hvd driver --made-up",
                          "page.md:8: caf-hvd hosts --bogus"])

    def test_every_default_a_page_gives_a_flag_is_the_code_s(self):
        """A number a page calls a flag's default is the one its --help states."""
        entries = option_entries()
        wrong, claims = [], 0
        for path in [os.path.join(ROOT, "README.md")] + [
                os.path.join(DOCS, f) for f in sorted(os.listdir(DOCS)) if f.endswith(".md")]:
            with open(path) as f:
                text = f.read()
            claims += len(default_claims(text))
            wrong += wrong_defaults(text, os.path.relpath(path, ROOT), entries)
        self.assertGreaterEqual(claims, 4, "the pages' defaults were not found")
        self.assertEqual(wrong, [], "defaults the pages give that --help does not state")

    def test_the_default_check_finds_a_default_that_differs(self):
        """The check above on a deliberately wrong page."""
        entries = option_entries()
        page = ("Agents wait `--link-timeout` seconds (default 99) for a byte.\n"
                "A job waits `--slot-wait SECONDS` (default 60; more below).\n"
                "The cap is `--max-message-mb`, 257 MB by default.\n"
                "`--cpus-per-slot N` sets OMP_NUM_THREADS (torchrun sets 1 by default).\n")
        self.assertEqual([w.split(": the page")[0] for w in wrong_defaults(page, "p.md", entries)],
                         ["p.md:1: --link-timeout"])

    def test_every_python_name_and_keyword_a_page_gives_exists(self):
        """Every caf_hvd name a page or the README mentions (`caf_hvd.x`, `from caf_hvd
        import x`) exists, and every keyword argument a page gives one of caf_hvd's
        classes or functions (`RayExecutor(..., cpus_per_worker=...)`) is in its
        signature."""
        sources = [os.path.join(ROOT, "README.md")] + [
            os.path.join(DOCS, f) for f in sorted(os.listdir(DOCS)) if f.endswith(".md")]
        count, wrong = wrong_python(sources)
        self.assertGreater(count, 40, "the pages' Python names were not found")
        self.assertEqual(wrong, [], "what the pages say of caf_hvd that it does not have")

    def test_the_python_check_finds_a_name_and_a_keyword_that_do_not_exist(self):
        page = os.path.join(self.dir, "page.md")
        with open(page, "w") as f:
            f.write("Use `caf_hvd.Executor(num_workers=2, no_such_kwarg=1)` and\n"
                    "`caf_hvd.train.NoSuchTrainer`; `from caf_hvd import Nothing`.\n"
                    "horovod.ray's `Unrelated(x=1)` is not ours; `RayExecutor(num_workers=2)`.\n")
        _, wrong = wrong_python([page])
        rel = os.path.relpath(page, ROOT)
        self.assertEqual([w.split(" (")[0] for w in wrong],
                         [f"{rel}:2: caf_hvd.train.NoSuchTrainer: no such name",
                          f"{rel}:2: caf_hvd.Nothing: no such name",
                          f"{rel}:1: caf_hvd.Executor() takes no keyword 'no_such_kwarg'"])

    def block_env(self):
        """What a reader who built caf-hvd has: its programs on PATH, a home of their own."""
        env = dict(self.env)
        env["HOME"] = os.path.join(self.dir, "home")
        os.makedirs(env["HOME"], exist_ok=True)
        apps = {os.path.dirname(os.path.abspath(CAF_HVD)),
                os.path.dirname(os.path.abspath(ALLREDUCE))}
        env["PATH"] = os.pathsep.join(sorted(apps) + [env.get("PATH", "/usr/bin:/bin")])
        return env

    def test_every_runnable_block_of_the_pages_runs(self):
        """Every code block a page marks `<!-- runnable -->` runs as its reader would run
        it (from the checkout, with caf-hvd on PATH): a block of commands exits 0; in a
        block with `$ ` prompts, each command prints exactly the lines shown under it."""
        blocks = []
        for path in [os.path.join(ROOT, "README.md")] + [
                os.path.join(DOCS, f) for f in sorted(os.listdir(DOCS)) if f.endswith(".md")]:
            with open(path) as f:
                blocks += [(f"{os.path.relpath(path, ROOT)}:{line}", block)
                           for line, block in runnable_blocks(f.read())]
        self.assertGreaterEqual(len(blocks), 4, "the pages' runnable blocks were not found")
        env = self.block_env()
        wrong = []
        for where, block in blocks:
            wrong += [f"{where}: {w}" for w in block_problems(block, env, ROOT)]
        self.assertEqual(wrong, [], "runnable blocks that do not run as their page shows")

    def test_the_block_check_finds_a_failing_block_and_output_that_differs(self):
        """The check above on a deliberately wrong page: a block with a flag that does not
        exist fails, a prompt's output that differs from the page's is told line by line,
        and a block that is not marked is not run."""
        page = ("<!-- runnable -->\n\n"
                "    caf-hvd cluster init ~/c\n"
                "    caf-hvd run -np 2 --no-such-flag -- true\n\n"
                "<!-- runnable -->\n\n"
                "    $ caf-hvd hosts -H a:2,b:1\n"
                "    a:2\n"
                "    b:2\n"
                "    caf-hvd: 2 hosts, 3 slots, from -H\n\n"
                "Not marked:\n\n"
                "    caf-hvd run --not-run-at-all\n\n"
                "<!-- runnable -->\n\n"
                "```\n"
                "test -f ~/c/ca.pem && echo fine\n"
                "```\n")
        blocks = runnable_blocks(page)
        self.assertEqual([line for line, _ in blocks], [1, 6, 17])
        env = self.block_env()
        got = [block_problems(b, env, self.dir) for _, b in blocks]
        self.assertEqual(len(got[0]), 1, got)
        self.assertRegex(got[0][0], r"(?s)^exit 2: .*caf-hvd run: error: unrecognised option "
                                    r"'--no-such-flag'")
        self.assertEqual(got[1], ["caf-hvd hosts -H a:2,b:1: line 2 is 'b:1', the page "
                                  "shows 'b:2'"])
        self.assertEqual(got[2], [])

    def test_every_planted_bug_of_the_mutation_script_fits_the_code(self):
        """scripts/mutate.py --check: each mutant's text is in its file exactly once (a
        refactoring that moves one is told here, not at the next mutation run)."""
        r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "mutate.py"),
                            "--check"], capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertRegex(r.stdout, r"mutate: (\d\d+) mutants, each text found once")

    def test_every_horovodrun_flag_does_what_the_migration_table_says(self):
        """Every flag of horovodrun 0.28.1 (read from the vendored horovod/runner/launch.py)
        has a row in the migration page's table, and each row's claim holds."""
        rows = horovodrun_table(os.path.join(DOCS, "migrating.md"))
        theirs = horovodrun_flags()
        self.assertGreater(len(theirs), 60)
        given = {tok.split("=")[0] for invs, _ in rows for inv in invs for tok in inv.split()
                 if tok.startswith("-")}
        self.assertEqual(sorted(set(theirs) - given), [],
                         "horovodrun flags with no row in migrating.md's table")
        env = dict(self.env, CAF_HVD_CLUSTER_DIR=os.path.join(self.dir, "none"))
        for invocations, claim in rows:
            for inv in invocations:
                with self.subTest(flag=inv):
                    self.check_claim(inv.split(), claim, env)

    def check_claim(self, flag, claim, env):
        kind = claim.split(":")[0].split()[0]
        if kind == "driver":
            r = subprocess.run([CAF_HVD, "driver", *flag, "--", "true"], env=env,
                               capture_output=True, text=True, timeout=60, cwd=self.dir)
            self.assertNotIn("unrecognised option", r.stderr)
            self.assertNotIn("unrecognized option", r.stderr)
            return
        np = [] if flag[0] in ("-np", "--num-proc") else ["-np", "1"]
        r = subprocess.run([CAF_HVD, "run", *np, *flag, "--", "env"], env=env,
                           capture_output=True, text=True, timeout=60, cwd=self.dir)
        if kind == "refused":
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn("not supported", r.stderr)
            return
        self.assertEqual(r.returncode, 0, r.stderr)
        if flag[0] in ("-v", "--version"):
            self.assertRegex(r.stdout, r"^caf-hvd \d+\.\d+\.\d+ ")
            return
        if flag[0] in ("-cb", "--check-build"):
            self.assertIn("[X] Gloo", r.stdout)
            return
        if kind == "warns":
            self.assertIn(f"warning: {flag[0].split('=')[0]}", r.stderr)
        for entry in re.findall(r"`([A-Z_]+=[^`]*)`", claim):
            self.assertIn(f"[0]<stdout>:{entry}", r.stdout.splitlines(), claim)


SUBCOMMANDS = ("run", "driver", "node", "status", "jobs", "drain", "undrain", "cancel",
               "cluster", "timeline", "hosts")
FLAG = re.compile(r"^--?[A-Za-z][\w-]*$")


def commands_in(text, helps=None):
    """(line number, subcommand, [flags]) of every `caf-hvd SUBCOMMAND ...` in the text:
    a shell line (backslash continuations joined) or an inline code span, up to the end
    of the command (`--`, a pipe, `;`, `&&`, a quote, a closing parenthesis or backtick,
    and for run and driver the program: the first word that is no option nor an
    option's value, as their parsers read it). Flags are the tokens that look like one
    (`--name`, `-np`, `--name=value`)."""
    found = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line, start = lines[i], i
        while line.endswith("\\") and i + 1 < len(lines):
            i += 1
            line = line[:-1] + " " + lines[i]
        for m in re.finditer(r"(?<![\w/.-])caf-hvd\s+([a-z-]+)", line):
            sub = m.group(1)
            if sub not in SUBCOMMANDS:
                continue
            rest = re.split(r"`|'|\"|\s--(?:\s|$)|\||;|&&|\)|\s#\s", line[m.end():])[0]
            valued = help_spec(sub)[1] if helps is not None and sub in ("run", "driver") else None
            flags, tokens = [], rest.split()
            k = 0
            while k < len(tokens):
                name = tokens[k].split("=")[0]
                if FLAG.match(name):
                    flags.append(name)
                    if valued is not None and name in valued and "=" not in tokens[k]:
                        k += 1
                elif valued is not None:
                    break  # the program starts here
                k += 1
            found.append((start + 1, sub, flags))
        i += 1
    return found


HELP_SPECS = {}
HELP_TEXTS = {}


RUNNABLE = "<!-- runnable -->"


def runnable_blocks(text):
    """(line of the marker, text) of each code block that follows a `<!-- runnable -->`
    line: an indented block (its indentation taken off) or a fenced one."""
    lines = text.split("\n")
    found = []
    for i, line in enumerate(lines):
        if line.strip() != RUNNABLE:
            continue
        j = i + 1
        while j < len(lines) and not lines[j].strip():
            j += 1
        block = []
        if j < len(lines) and lines[j].startswith("```"):
            j += 1
            while j < len(lines) and not lines[j].startswith("```"):
                block.append(lines[j])
                j += 1
        else:
            while j < len(lines) and (lines[j].startswith("    ") or not lines[j].strip()):
                block.append(lines[j][4:])
                j += 1
        found.append((i + 1, "\n".join(block).strip("\n")))
    return found


def block_problems(block, env, cwd, timeout=300):
    """Runs a block in bash, from `cwd`. Without `$ ` prompts it is one script that must
    exit 0. With them, each prompt's command must exit 0 and print (stdout and stderr, as
    a terminal shows them) exactly the lines under it. Returns what went wrong."""
    def run(script, merge):
        try:
            r = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], cwd=cwd,
                               env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT if merge else subprocess.PIPE,
                               text=True, timeout=timeout, start_new_session=True)
        except subprocess.TimeoutExpired:
            return None, f"did not end within {timeout} s"
        return r.returncode, r.stdout + (r.stderr or "")

    lines = block.split("\n")
    if not any(line.startswith("$ ") for line in lines):
        rc, out = run(block, False)
        if rc is None:
            return [out]
        return [] if rc == 0 else [f"exit {rc}: {out.strip()[-600:]}"]
    problems, i = [], 0
    while i < len(lines):
        if not lines[i].startswith("$ "):
            i += 1
            continue
        command, shown = lines[i][2:], []
        i += 1
        while i < len(lines) and not lines[i].startswith("$ "):
            shown.append(lines[i])
            i += 1
        while shown and not shown[-1].strip():
            shown.pop()
        rc, out = run(command, True)
        if rc is None or rc != 0:
            problems.append(f"{command}: "
                            + (out if rc is None else f"exit {rc}: {out.strip()[-600:]}"))
            continue
        got = out.rstrip("\n").split("\n") if out.strip() else []
        for k in range(max(len(got), len(shown))):
            a = got[k] if k < len(got) else "(nothing)"
            b = shown[k] if k < len(shown) else "(nothing)"
            if a != b:
                problems.append(f"{command}: line {k + 1} is {a!r}, the page shows {b!r}")
                break
    return problems


def help_text(sub):
    """What `caf-hvd SUB --help` prints (asked once per run)."""
    if sub not in HELP_TEXTS:
        r = subprocess.run([CAF_HVD, sub, "--help"], capture_output=True, text=True, timeout=30)
        HELP_TEXTS[sub] = r.stdout + r.stderr
    return HELP_TEXTS[sub]


def help_spec(sub):
    """(the flags `caf-hvd SUB --help` names, those that take a value)."""
    if sub not in HELP_SPECS:
        text = help_text(sub)
        names = set(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", text)) | {"-h", "--help"}
        valued = set()
        for m in re.finditer(r"^  (-[\w-]+)(?: \[ (--[\w-]+) \])?( arg)?", text, re.M):
            if m.group(3):
                valued.update(n for n in m.group(1, 2) if n)
        # the usage lines: a flag followed by a placeholder (-np N, -H HOST:SLOTS)
        valued.update(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*) [A-Z][A-Z_:,.]*\b", text))
        HELP_SPECS[sub] = (names, valued)
    return HELP_SPECS[sub]


def unknown_flags(text, where, helps):
    """'where:line: caf-hvd SUB FLAG' for each flag a command of the text gives that its
    subcommand's --help does not name."""
    return [f"{where}:{line}: caf-hvd {sub} {f}" for line, sub, flags in commands_in(text, helps)
            for f in flags if f not in help_spec(sub)[0]]


def option_entries():
    """flag -> the text of its entries in every subcommand's --help (its line and the
    deeper-indented lines that continue it)."""
    entries = {}
    for sub in SUBCOMMANDS:
        lines = help_text(sub).splitlines()
        for i, line in enumerate(lines):
            m = re.match(r"^  (-[\w-]+)(?: \[ (--[\w-]+) \])?", line)
            if not m:
                continue
            text = line
            for more in lines[i + 1:]:
                if not more.startswith("   ") or re.match(r"^  -", more):
                    break
                text += " " + more.strip()
            for name in m.group(1, 2):
                if name:
                    entries.setdefault(name, []).append(text)
    return entries


DEFAULT_CLAIM = re.compile(r"\(default(?:\s+[a-z]+)?:?\s+(\d+(?:\.\d+)?)|"
                           r"(\d+(?:\.\d+)?)\s?[A-Za-z]*\s+by\s+default|"
                           r"\bdefault\s+(\d+(?:\.\d+)?)\b")


def default_claims(text):
    """(line, flag, number) for each default a page gives a flag: a number called the
    default within the same clause as the flag in backticks, before the next flag."""
    out = []
    for m in re.finditer(r"`(--[\w-]+)[^`]*`", text):
        tail = text[m.end():m.end() + 160]
        nxt = re.search(r"`--|\.\s|\n\n|;", tail)
        tail = tail[:nxt.start()] if nxt else tail
        d = DEFAULT_CLAIM.search(tail)
        # "(torchrun sets 1 by default)": another tool's default, not the flag's
        if d and not re.search(r"torchrun|horovodrun|mpirun|Horovod|Ray\b", tail[:d.start()]):
            number = next(g for g in d.groups() if g)
            out.append((text.count("\n", 0, m.start()) + 1, m.group(1), number))
    return out


def wrong_defaults(text, where, entries):
    """'where:line: FLAG: the page says N, --help says ...' for each default the page
    gives that no --help entry of that flag states."""
    out = []
    for line, flag, number in default_claims(text):
        said = entries.get(flag, [])
        if not any(re.search(r"(?<![\d.])" + re.escape(number) + r"(?![\d.])", e) for e in said):
            out.append(f"{where}:{line}: {flag}: the page says {number}, --help says "
                       f"{' | '.join(said) or 'nothing (no such flag)'}")
    return out


PY_NAME = re.compile(r"\bcaf_hvd(?:\.[A-Za-z_]\w*)+")
PY_IMPORT = re.compile(r"from (caf_hvd(?:\.\w+)*) import ([\w, ]+)")
PY_CALL = re.compile(r"(?<![\w.])((?:caf_hvd\.(?:[a-z_]\w*\.)*)?[A-Z]\w*(?:\.\w+)?)"
                     r"\(((?:[^()`]|\([^()`]*\))*)\)")


def python_mentions(text):
    """(line, dotted name, [keyword arguments] or None) of what a page says of caf_hvd:
    `caf_hvd.x.y`, `from caf_hvd.x import a, b`, and calls `Name(...)`/`Name.attr(...)`
    (their keyword arguments; names that are not caf_hvd's are left to the check)."""
    out = []
    line_of = lambda pos: text.count("\n", 0, pos) + 1  # noqa: E731
    for m in PY_NAME.finditer(text):
        out.append((line_of(m.start()), m.group(0), None))
    for m in PY_IMPORT.finditer(text):
        for name in m.group(2).split(","):
            if name.strip():
                out.append((line_of(m.start()), f"{m.group(1)}.{name.strip()}", None))
    for m in PY_CALL.finditer(text):
        kwargs = re.findall(r"(?:^|,)\s*(\w+)\s*=(?!=)", m.group(2))
        out.append((line_of(m.start()), m.group(1), kwargs))
    return out


PY_CHECK = r"""
import importlib, inspect, json, sys
import caf_hvd
mentions = json.load(sys.stdin)
spaces = [caf_hvd, importlib.import_module("caf_hvd.train"),
          importlib.import_module("caf_hvd.train.horovod"),
          importlib.import_module("caf_hvd.ray_elastic")]
def resolve(dotted):
    parts = dotted.split(".")
    if parts[0] == "caf_hvd":
        for k in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:k]))
            except ImportError:
                continue
            for p in parts[k:]:
                obj = getattr(obj, p)
            return obj
    for space in spaces:  # a bare name: caf_hvd's only if it is one of its exports
        if hasattr(space, parts[0]):
            obj = getattr(space, parts[0])
            for p in parts[1:]:
                obj = getattr(obj, p)
            return obj
    return None
wrong = []
for where, dotted, kwargs in mentions:
    try:
        obj = resolve(dotted)
    except AttributeError as e:
        wrong.append(f"{where}: {dotted}: no such name ({e})")
        continue
    if obj is None or kwargs is None or not callable(obj):
        continue
    try:
        params = inspect.signature(obj).parameters
    except (TypeError, ValueError):
        continue
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        continue
    for k in kwargs:
        if k not in params:
            wrong.append(f"{where}: {dotted}() takes no keyword '{k}' "
                         f"(it takes {', '.join(params)})")
print(json.dumps(wrong))
"""


def wrong_python(sources):
    """What the sources say of caf_hvd that its code does not have (by introspection)."""
    import json
    mentions = []
    for path in sources:
        with open(path) as f:
            text = f.read()
        mentions += [(f"{os.path.relpath(path, ROOT)}:{line}", name, kw)
                     for line, name, kw in python_mentions(text)]
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    r = subprocess.run(["/usr/bin/python3", "-c", PY_CHECK], input=json.dumps(mentions),
                       capture_output=True, text=True, timeout=120, env=env)
    if r.returncode != 0:
        raise AssertionError(f"the introspection failed:\n{r.stderr[-3000:]}")
    return len(mentions), json.loads(r.stdout)


TARBALL = os.path.join(os.path.dirname(ROOT), "shared", "vendor", "horovod-0.28.1-src.tar.xz")


def horovodrun_flags():
    """Every option string of horovodrun's parser (horovod/runner/launch.py)."""
    import lzma
    import tarfile
    with lzma.open(TARBALL) as xz, tarfile.open(fileobj=xz) as tar:
        text = tar.extractfile("horovod-0.28.1/horovod/runner/launch.py").read().decode()
    flags = set()
    for call in re.findall(r"add_argument\(((?:'[^']*'\s*,\s*)+)", text):
        flags.update(f for f in re.findall(r"'(-[^']*)'", call))
    return sorted(flags)


def horovodrun_table(path):
    """The rows of the page's "Every flag of horovodrun" table: (the invocations of its
    first cell, its second cell)."""
    rows, inside = [], False
    with open(path) as f:
        for line in f:
            if line.startswith("### Every flag of horovodrun"):
                inside = True
            elif inside and line.startswith("#"):
                break
            elif inside and line.startswith("| `"):
                first, second = line.strip().strip("|").split("|", 1)
                rows.append((re.findall(r"`([^`]+)`", first), second.strip().strip("|").strip()))
    return rows


if __name__ == "__main__":
    sys.exit(run_suite(DocsTest, sys.argv[1:]))
