"""`graphlint server` as an editor sees it: how long from opening a file to its first diagnostics, and from
saving a change to the new diagnostics, on the GPT-2-small shape (benchmarks/models.py:gpt2_small), against a
cold `graphlint check` of the same target measured in the same run.

    python benchmarks/server.py --repeat 5
    python benchmarks/run.py --only server

The client here is a few lines of JSON-RPC over the server's stdin and stdout, as an editor speaks it. Each
save appends a new comment to the model file, so the result cache never answers it and the target is linted
again in a fresh child of the server's warm parent; a save that changes nothing answers from the cache; a save
that adds a comment line at the top moves every line of the model, so the torch.compile analysis kept in the
cache does not answer either.
Timings run from starting the server (for the first open) or from sending didSave to receiving the model file's
publishDiagnostics.

`--pause S` (default 10) adds a server per round whose model is opened S seconds after `initialized`, timed from
didOpen: an editor that starts the server with the workspace, before the user opens a model. The server warms
up when the workspace folder holds a project with targets (torch, libcst, and dynamo where GL301/GL302 run), so
this is the time the first lint itself takes. `--pause 0` leaves it out.

Each round runs two servers, one on a project that ignores GL301/GL302 and one that selects them (`[tool.graphlint]`
ignore or extend-select, whatever the default selection is). With them, a lint is published twice: first the
other rules' findings, sent by the child before the torch.compile analysis starts, then the complete result; both
are timed, the second being what the editor would wait for if the first were not sent.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PYTHON = sys.executable


class Client:
    """A language client on a `graphlint server` subprocess: requests, notifications, and what it publishes."""

    def __init__(self, folder: Path) -> None:
        self.process = subprocess.Popen([PYTHON, "-m", "graphlint", "server", "--cache-dir", str(folder / "cache")],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                        cwd=folder)
        self.messages: queue.Queue = queue.Queue()
        self._next_id = 0
        threading.Thread(target=self._read, daemon=True).start()

    def request(self, method: str, params) -> dict:
        self._next_id += 1
        self._send({"jsonrpc": "2.0", "id": self._next_id, "method": method, "params": params})
        return self.wait(lambda m: m.get("id") == self._next_id and "method" not in m)

    def notify(self, method: str, params) -> None:
        self._send({"jsonrpc": "2.0", "method": method, "params": params})

    def diagnostics(self, uri: str, timeout: float = 600) -> list:
        message = self.wait(lambda m: m.get("method") == "textDocument/publishDiagnostics"
                            and m["params"]["uri"] == uri, timeout)
        return message["params"]["diagnostics"]

    def wait(self, wanted, timeout: float = 600) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            message = self.messages.get(timeout=max(0.0, deadline - time.monotonic()))
            if message is None:
                raise SystemExit("graphlint server closed its output")
            if wanted(message):
                return message

    def close(self) -> None:
        self.request("shutdown", None)
        self.notify("exit", None)
        self.process.wait(60)

    def _send(self, message: dict) -> None:
        body = json.dumps(message).encode()
        self.process.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        self.process.stdin.flush()

    def _read(self) -> None:
        stream = self.process.stdout
        while True:
            length = None
            while (line := stream.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode().partition(":")
                if name.lower() == "content-length":
                    length = int(value)
            if length is None:
                self.messages.put(None)
                return
            self.messages.put(json.loads(stream.read(length)))


GL3_OFF = 'ignore = ["GL3"]'
GL3_ON = 'extend-select = ["GL3"]'


def write_project(folder: Path, selection: str = GL3_OFF) -> Path:
    """A project whose one target is the GPT-2-small shape, with hand-written attention (GL101)."""
    shutil.copy(HERE / "models.py", folder / "models.py")
    (folder / "pyproject.toml").write_text(f'[tool.graphlint]\ntargets = ["models.py:gpt2_small"]\n{selection}\n',
                                           encoding="utf-8")
    return folder / "models.py"


def session(folder: Path, saves: int, selection: str = GL3_OFF) -> dict[str, list[float]]:
    """Seconds of one server: to the first diagnostics after opening ("open"), after each save of a change below
    the model ("save") and of a line added above it ("moved"), to the complete ones ("... complete": the same when
    GL3 is off), and per unchanged save ("unchanged")."""
    model = write_project(folder, selection)
    uri = model.as_uri()
    twice = selection == GL3_ON  # a lint that runs the torch.compile analysis is published twice
    times: dict[str, list[float]] = {"open": [], "open complete": [], "save": [], "save complete": [],
                                     "unchanged": [], "moved": [], "moved complete": []}
    start = time.perf_counter()
    client = Client(folder)
    client.request("initialize", {"processId": os.getpid(), "rootUri": folder.as_uri(), "capabilities": {}})
    client.notify("initialized", {})
    client.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "python", "version": 1,
                                                            "text": model.read_text(encoding="utf-8")}})
    _lint_times(client, uri, start, twice, times, "open")
    for number in range(saves):
        with open(model, "a", encoding="utf-8") as handle:
            handle.write(f"# edit {number}\n")
        _lint_times(client, uri, _save(client, uri), twice, times, "save")
        start = _save(client, uri)
        times["unchanged"].append(_until_found(client, uri) - start)  # the cache answers: published once
        # A line above the model moves every line of it: the torch.compile analysis kept by the cache no longer
        # answers (graphlint.capture.compile_memo keys on the traced functions' lines).
        model.write_text(f"# moved {number}\n" + model.read_text(encoding="utf-8"), encoding="utf-8")
        _lint_times(client, uri, _save(client, uri), twice, times, "moved")
    client.close()
    return times


def paused_open(folder: Path, pause: float, selection: str = GL3_OFF) -> dict[str, list[float]]:
    """Seconds from didOpen to the first (and complete) diagnostics, the file opened `pause` seconds after the
    server was initialized with the project's folder as its workspace."""
    model = write_project(folder, selection)
    uri = model.as_uri()
    times: dict[str, list[float]] = {"paused open": [], "paused open complete": []}
    client = Client(folder)
    client.request("initialize", {"processId": os.getpid(), "rootUri": folder.as_uri(), "capabilities": {},
                                  "workspaceFolders": [{"uri": folder.as_uri(), "name": folder.name}]})
    client.notify("initialized", {})
    time.sleep(pause)
    start = time.perf_counter()
    client.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "python", "version": 1,
                                                            "text": model.read_text(encoding="utf-8")}})
    _lint_times(client, uri, start, selection == GL3_ON, times, "paused open")
    client.close()
    return times


def _lint_times(client: Client, uri: str, start: float, twice: bool, times: dict, event: str) -> None:
    first = _until_found(client, uri)
    times[event].append(first - start)
    times[f"{event} complete"].append((_until_found(client, uri) if twice else first) - start)


def _save(client: Client, uri: str) -> float:
    start = time.perf_counter()
    client.notify("textDocument/didSave", {"textDocument": {"uri": uri}})
    return start


def _until_found(client: Client, uri: str) -> float:
    """When the model file's next diagnostics arrive; they must show its GL101."""
    diagnostics = client.diagnostics(uri)
    found = time.perf_counter()
    if not any(d.get("code") == "GL101" for d in diagnostics):
        raise SystemExit(f"expected GL101 in the diagnostics of {uri}; got {diagnostics}")
    return found


def cold_check(folder: Path) -> float:
    """Seconds of one cold `graphlint check` of the same target, as a whole process."""
    start = time.perf_counter()
    completed = subprocess.run([PYTHON, "-m", "graphlint", "check", "--no-cache", "--format", "sarif",
                                "--output", os.devnull], cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if completed.returncode not in (0, 1):
        raise SystemExit(f"graphlint check failed with exit status {completed.returncode}")
    return time.perf_counter() - start


def measure(repeat: int, saves: int = 5, pause: float = 10.0) -> None:
    runs: dict[str, dict[str, list[float]]] = {GL3_OFF: {}, GL3_ON: {}}
    colds = []
    with tempfile.TemporaryDirectory() as scratch:
        for number in range(repeat):  # interleaved: a server without GL3, one with it, then a cold check
            for selection, kept in runs.items():
                folder = Path(scratch) / f"session_{number}_{'on' if selection == GL3_ON else 'off'}"
                folder.mkdir()
                for event, seconds in session(folder, saves, selection).items():
                    kept.setdefault(event, []).extend(seconds)
                if pause:
                    paused = folder.with_name(folder.name + "_paused")
                    paused.mkdir()
                    for event, seconds in paused_open(paused, pause, selection).items():
                        kept.setdefault(event, []).extend(seconds)
            colds.append(cold_check(folder.with_name(f"session_{number}_off")))
    cold = statistics.median(colds)
    off, on = runs[GL3_OFF], runs[GL3_ON]
    print(f"\ngraphlint server on the GPT-2-small shape (median of {repeat} sessions, {saves} saves each)")
    print(f"  cold graphlint check, one target (GL3 off)  {cold:>6.2f} s")
    print("                                              GL3 off    GL3 on (first, complete)")
    print(f"  open to first diagnostics                   {_median(off, 'open')}    {_median(on, 'open')}  "
          f"{_median(on, 'open complete')}   ({statistics.median(off['open']) / cold:.2f}x the cold check)")
    if pause:
        label = f"open {pause:g} s after the server started"
        print(f"  {label:<44}{_median(off, 'paused open')}    "
              f"{_median(on, 'paused open')}  {_median(on, 'paused open complete')}   (timed from didOpen)")
    print(f"  save a change to diagnostics                {_median(off, 'save')}    {_median(on, 'save')}  "
          f"{_median(on, 'save complete')}   (goal for the first: 1.0 s)")
    print(f"    slowest                                   {max(off['save']):>6.2f} s  {max(on['save']):>6.2f} s  "
          f"{max(on['save complete']):>6.2f} s")
    print(f"  save a line above the model to diagnostics  {_median(off, 'moved')}    {_median(on, 'moved')}  "
          f"{_median(on, 'moved complete')}   (the kept compile analysis no longer answers)")
    print(f"  save, nothing changed (cache)               {_median(off, 'unchanged')}    {_median(on, 'unchanged')}")


def _median(times: dict[str, list[float]], event: str) -> str:
    return f"{statistics.median(times[event]):>6.2f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5, help="server sessions (and cold checks) to measure")
    parser.add_argument("--saves", type=int, default=5, help="saves per session")
    parser.add_argument("--pause", type=float, default=10.0,
                        help="also time a first open this many seconds after the server started (0: not)")
    options = parser.parse_args()
    measure(options.repeat, options.saves, options.pause)


if __name__ == "__main__":
    main()
