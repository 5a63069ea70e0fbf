"""The warm parent: a process that has imported torch, graphlint's capture and rules, and finished torch's lazy
imports, so that each target's child starts from there instead of from nothing.

On Linux children are forked: each starts with everything above already in memory, shared copy-on-write, and
dies with whatever its target did to the interpreter (imported modules, `sys.path`, torch's global settings,
hooks, monkeypatches, random states). Where fork is unavailable or unsafe (Windows, macOS) they are spawned
with the same protocol and import what they need themselves. The parent never imports the user's code and
never initialises CUDA.
"""

from __future__ import annotations

import contextlib
import importlib
import multiprocessing
import sys
from collections.abc import Callable

from graphlint.libraries import note_fork
from graphlint.run.child import child_main
from graphlint.run.heap import long_lived
from graphlint.run.wire import Job, Launch, LintJob


def start_method() -> str:
    """fork where it is safe (Linux and other POSIX systems but macOS), spawn elsewhere."""
    return "fork" if sys.platform not in ("darwin", "win32", "cygwin") else "spawn"


# The modules children imported, noted by every warm parent of this process (a test worker or a notebook makes one
# for each check, whose children would otherwise import graphlint's fixers and span finder every time): those to
# import before the next child starts, and those already tried.
_WANTED: list[str] = []
_TRIED: set[str] = set()


class WarmParent:
    """Starts one child process per job (graphlint.run.wire); `preload` notes modules (graphlint's, libraries') that
    children keep importing, imported before the next child of any warm parent of this process starts.
    `close_in_children` are file descriptors of the parent that a forked child closes first (the language
    server's protocol pipes, which must close when the server does)."""

    def __init__(self, close_in_children: tuple[int, ...] = ()) -> None:
        self.context = multiprocessing.get_context(start_method())
        self.close_in_children = tuple(close_in_children)
        if self.context.get_start_method() == "fork":
            with long_lived():
                _warm_up()
        self._tried, self._wanted = _TRIED, _WANTED
        self._compile_warm = False

    def start(self, job: Job, more: bool = True):
        """(the child process running `job`, the parent's end of its pipe); `more`: other lint jobs may follow, so
        that warming dynamo up for them is worth its CPU (a run of one target has no child to give it to)."""
        receiving, sending = self.context.Pipe(duplex=False)
        sys.stdout.flush()  # a forked child would otherwise write the parent's buffered output again
        sys.stderr.flush()
        launch = Launch()
        warm_compile = False
        if self.context.get_start_method() == "fork":
            self._import_wanted()
            warm_compile = more and not self._compile_warm and isinstance(job, LintJob) and _needs_compile(job)
            # A forked child cannot use the parent's OpenMP thread pool if the parent ever ran parallel CPU work
            # (graphlint.session.check in a test session, a notebook): its first parallel op would wait forever. The
            # pool cannot be detected reliably (torch starts a thread at import), so children run CPU ops on one
            # thread; captures on the meta device compute nothing, and -j N parallelises across targets.
            launch = Launch(single_threaded=True, close_fds=self.close_in_children)
            note_fork()  # what the child inherits of loaded modules, read here where reading copies nothing
        process = self.context.Process(target=child_main, args=(job, launch, sending), daemon=True)
        process.start()
        sending.close()  # the child holds the only writing end: its death closes the pipe
        if warm_compile:
            # The torch.compile rules: dynamo warmed up once for all the next children, after this first one is
            # on its way, so that its capture (and the editor's first diagnostics) never waits for it.
            self._warm_compile()
        return process, receiving

    def warm_ahead(self, compile_rules: bool, wanted: Callable[[], bool]) -> None:
        """While nothing waits for a child (a language server between its start and the first file opened): import
        what locating a finding needs (libcst) and, for `compile_rules`, warm dynamo up, so that the first child
        pays for neither. Each step is a fraction of a second; none starts once `wanted()` says a child waits."""
        if self.context.get_start_method() != "fork":
            return  # a spawned child imports everything itself
        steps = [self._import_locating] + ([self._warm_compile] if compile_rules else [])
        for step in steps:
            if wanted():
                return
            try:
                step()
            except Exception:  # only a head start: the first child that needs it does the same and reports it
                return

    def _import_locating(self) -> None:
        with long_lived():
            import graphlint.locate.spans  # noqa: F401 - libcst, which every finding's location needs

    def _warm_compile(self) -> None:
        if self._compile_warm:
            return
        from graphlint.capture.compile import warm_up

        warm_up()
        self._compile_warm = True

    def preload(self, names: list[str]) -> None:
        """Note modules of graphlint's and of installed libraries that a child imported, to import them once before
        the next child starts, so that it and later ones inherit them; a run whose last child imported them never
        pays for them twice."""
        if self.context.get_start_method() == "fork":
            self._wanted.extend(name for name in names if name not in self._tried and name not in self._wanted)

    def _import_wanted(self) -> None:
        wanted = list(self._wanted)
        self._wanted.clear()
        for name in wanted:
            if name in self._tried or name in sys.modules:
                continue
            self._tried.add(name)
            try:
                # What a library prints at import goes where a child's output goes, never into the report on stdout.
                with long_lived(), contextlib.redirect_stdout(sys.stderr):
                    importlib.import_module(name)
            except (Exception, SystemExit):  # a library that fails or exits here (argparse at import) is only
                continue  # imported again, by the child that needs it


def _needs_compile(job: LintJob) -> bool:
    """Whether a rule of the job reads the torch.compile analysis (its tag)."""
    from graphlint.engine import load_rules
    from graphlint.tags import COMPILE_TAG

    return any(COMPILE_TAG in rule.tags for rule in load_rules() if rule.id in job.rules)


def _warm_up() -> None:
    """Import what every child needs and run one op on the meta device: torch imports torch._dynamo and more
    the first time a Python meta kernel runs, and a child should not pay that again and again."""
    import torch

    # Not libcst, which only locating a finding needs: the first child that imports it reports it and the modules
    # that use it, and `preload` imports them here for the children after it; a run with no finding never does.
    import graphlint.capture  # noqa: F401 - imported for the children
    import graphlint.pipeline  # noqa: F401
    from graphlint.engine import load_rules

    load_rules()
    torch.tril(torch.ones(4, 4, device="meta"))
    # The installed distributions' metadata is read before each fork (note_fork), for the children.
