"""`graphlint server` as an editor sees it: how long from opening a file to its first diagnostics, and from
saving a change to the new diagnostics, on the GPT-2-small shape (benchmarks/models.py:gpt2_small), against a
cold `graphlint check` of the same target measured in the same run.

    python benchmarks/server.py --repeat 5
    python benchmarks/run.py --only server

The client here is a few lines of JSON-RPC over the server's stdin and stdout, as an editor speaks it. Each
save appends a new comment to the model file, so the result cache never answers it and the target is linted
again in a fresh child of the server's warm parent; a save that changes nothing answers from the cache.
Timings run from sending didOpen or didSave to receiving the model file's publishDiagnostics.
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


def write_project(folder: Path) -> Path:
    """A project whose one target is the GPT-2-small shape, with hand-written attention (GL101)."""
    shutil.copy(HERE / "models.py", folder / "models.py")
    (folder / "pyproject.toml").write_text('[tool.graphlint]\ntargets = ["models.py:gpt2_small"]\n', encoding="utf-8")
    return folder / "models.py"


def session(folder: Path, saves: int) -> tuple[float, list[float], list[float]]:
    """(seconds to the first diagnostics, seconds per changed save, seconds per unchanged save) of one server."""
    model = write_project(folder)
    uri = model.as_uri()
    start = time.perf_counter()
    client = Client(folder)
    client.request("initialize", {"processId": os.getpid(), "rootUri": folder.as_uri(), "capabilities": {}})
    client.notify("initialized", {})
    client.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "python", "version": 1,
                                                            "text": model.read_text(encoding="utf-8")}})
    first = _until_found(client, uri) - start
    changed, unchanged = [], []
    for number in range(saves):
        with open(model, "a", encoding="utf-8") as handle:
            handle.write(f"# edit {number}\n")
        changed.append(_save(client, uri))
        unchanged.append(_save(client, uri))
    client.close()
    return first, changed, unchanged


def _save(client: Client, uri: str) -> float:
    start = time.perf_counter()
    client.notify("textDocument/didSave", {"textDocument": {"uri": uri}})
    return _until_found(client, uri) - start


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


def measure(repeat: int, saves: int = 5) -> None:
    firsts, changed, unchanged, colds = [], [], [], []
    with tempfile.TemporaryDirectory() as scratch:
        for number in range(repeat):  # interleaved: a server session, then a cold check
            folder = Path(scratch) / f"session_{number}"
            folder.mkdir()
            first, saved, cached = session(folder, saves)
            firsts.append(first)
            changed += saved
            unchanged += cached
            colds.append(cold_check(folder))
    cold = statistics.median(colds)
    print(f"\ngraphlint server on the GPT-2-small shape (median of {repeat} sessions, {saves} saves each)")
    print(f"  cold graphlint check, one target      {cold:>6.2f} s")
    print(f"  server: open to first diagnostics     {statistics.median(firsts):>6.2f} s   "
          f"{statistics.median(firsts) / cold:.2f}x the cold check")
    print(f"  server: save a change to diagnostics  {statistics.median(changed):>6.2f} s   "
          f"(slowest {max(changed):.2f} s; goal: 1.0 s)")
    print(f"  server: save, nothing changed (cache) {statistics.median(unchanged):>6.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5, help="server sessions (and cold checks) to measure")
    parser.add_argument("--saves", type=int, default=5, help="saves per session")
    options = parser.parse_args()
    measure(options.repeat, options.saves)


if __name__ == "__main__":
    main()
