"""A throwaway PostgreSQL server in a temporary directory (initdb + pg_ctl), for tests of shared studies."""
from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
from pathlib import Path


def find_pg_bin() -> "Path | None":
    """The directory holding initdb and pg_ctl: PATH first, then the Debian/Ubuntu layout."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(found).resolve().parent
    for candidate in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if os.access(os.path.join(candidate, "initdb"), os.X_OK):
            return Path(candidate)
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PgServer:
    def __init__(self, bin_dir: Path, root: Path):
        self.bin, self.root = bin_dir, root
        self.data, self.sock = root / "data", root / "sock"
        self.port = _free_port()
        self.user = "gemmgen"

    def _run(self, *args, **kw):
        cmd = [str(self.bin / args[0]), *args[1:]]
        if os.geteuid() == 0:
            # PostgreSQL refuses to run as root (CI containers often are): run it as nobody.
            cmd = ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups", *cmd]
        return subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=60, **kw)

    def start(self) -> "PgServer":
        self.sock.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            import pwd

            nobody = pwd.getpwnam("nobody")
            self.uid, self.gid = nobody.pw_uid, nobody.pw_gid
            for path in (self.root, self.sock):
                os.chown(path, self.uid, self.gid)
        self._run("initdb", "-D", str(self.data), "-U", self.user, "--auth=trust", "--no-sync", "-E", "UTF8")
        self.pg_ctl("start")
        self._run("createdb", "-h", str(self.sock), "-p", str(self.port), "-U", self.user, "studies")
        return self

    def pg_ctl(self, action: str, *extra: str) -> None:
        opts = f"-p {self.port} -k {self.sock} -c listen_addresses='' -c fsync=off -c max_connections=200"
        args = ["pg_ctl", "-D", str(self.data), "-l", str(self.root / "log"), "-w", "-t", "60"]
        if action in ("start", "restart"):
            args += ["-o", opts]
        self._run(*args, action, *extra)

    @property
    def url(self) -> str:
        return f"postgresql+psycopg2://{self.user}@/studies?host={self.sock}&port={self.port}"

    def stop(self) -> None:
        try:
            self.pg_ctl("stop", "-m", "immediate")
        except subprocess.CalledProcessError:
            pass


def running_server():
    """A started server in a fresh folder for one test (a pytest fixture's body: `yield from running_server()`);
    skips the test where initdb and pg_ctl are not installed; stops the server and removes the folder after."""
    import tempfile

    import pytest

    bin_dir = find_pg_bin()
    if bin_dir is None:
        pytest.skip("PostgreSQL (initdb, pg_ctl) is not installed")
    root = Path(tempfile.mkdtemp(prefix="gemmgen-pg-"))  # not under pytest's 0700 tmp: the server may be nobody
    os.chmod(root, 0o755)
    server = PgServer(bin_dir, root).start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
