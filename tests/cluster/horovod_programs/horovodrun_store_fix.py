"""horovodrun (Horovod 0.28.1's launcher, imported from PYTHONPATH) with one fault of its
rendezvous server worked around; used by run_horovod_tests.py only when the unchanged
horovodrun could not finish Horovod's test_torch.py for a baseline.

The fault: when a planned scope (global, local_<host>, cross_<local_rank>) has been
finished by all its ranks, horovod/runner/http/http_server.py empties the finished lists
of *every* scope (`self.server.finished_list.clear()`), not just its own. A scope whose
list was wiped never counts to its size again, so its keys are never cleared, and the
next hvd.init() of a rank can read a peer's address from the previous init (before that
peer wrote its new one): Gloo's connect is refused and the rank aborts in hvd.init()
(std::terminate from gloo::transport::tcp::Pair). On one host a cross_<n> scope has one
rank and is finished at once, so any slowness of another rank's DELETE triggers it; on a
loaded 2-core machine most runs of test_torch.py die this way.

The workaround gives the server a finished-list map whose clear() drops only the lists of
scopes that are complete, which is what a per-scope clear does; nothing else changes."""

import collections

import horovod.runner.http.http_server as http_server


class PerScopeFinished(collections.defaultdict):
    def __init__(self, server):
        super().__init__(list)
        self._server = server

    def clear(self):
        sizes = self._server.scope_size
        for scope in [s for s, done in self.items() if len(done) >= sizes.get(s, 0)]:
            del self[scope]


_init = http_server.RendezvousHTTPServer.__init__


def _patched_init(self, *args, **kwargs):
    _init(self, *args, **kwargs)
    self.finished_list = PerScopeFinished(self)


http_server.RendezvousHTTPServer.__init__ = _patched_init

if __name__ == "__main__":  # horovodrun starts helpers with multiprocessing's spawn
    from horovod.runner.launch import run_commandline
    run_commandline()
