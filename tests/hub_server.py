"""A stand-in for the Hugging Face Hub, for tests: the endpoints `huggingface_hub` 2.x uses to
resolve a revision and download a snapshot, serving repositories held in memory at fixed
commits, on 127.0.0.1. Not part of the artifact.

    GET  /api/models/<repo>/revision/<rev>     repo info: {"id", "sha", "siblings"}
    GET  /api/models/<repo>/tree/<rev>         the file listing (LFS entries for weights)
    HEAD /<repo>/resolve/<rev>/<file>          X-Repo-Commit, ETag / X-Linked-Etag, sizes
    GET  /<repo>/resolve/<rev>/<file>          the bytes (Range supported)

Errors carry the Hub's `X-Error-Code` (RepoNotFound, RevisionNotFound, EntryNotFound), which the
client turns into its typed exceptions. Every request is recorded with the commit it resolved
to. `break_file(name, at)` makes the server go away after sending `at` bytes of that file."""

from __future__ import annotations

import hashlib
import json
import re
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

API = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/(?P<kind>revision|tree)/(?P<rev>[^/]+)/?$")
RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")
LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack")


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(data: bytes) -> bytes:
    return (f"version https://git-lfs.github.com/spec/v1\n"
            f"oid sha256:{hashlib.sha256(data).hexdigest()}\nsize {len(data)}\n").encode()


def is_lfs(path: str) -> bool:
    return path.endswith(LFS_SUFFIXES)


def tree_entry(path: str, data: bytes) -> dict:
    if not is_lfs(path):
        return {"type": "file", "path": path, "size": len(data), "oid": git_blob_id(data)}
    pointer = lfs_pointer(data)
    return {"type": "file", "path": path, "size": len(data), "oid": git_blob_id(pointer),
            "lfs": {"oid": hashlib.sha256(data).hexdigest(), "size": len(data),
                    "pointerSize": len(pointer)}}


@dataclass
class Repo:
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)
    refs: dict[str, str] = field(default_factory=dict)  # branch -> commit

    def resolve(self, rev: str) -> str | None:
        return self.refs.get(rev) or (rev if rev in self.commits else None)


@dataclass
class Request:
    method: str
    path: str
    commit: str | None  # the commit the request resolved to


class HubError(Exception):
    def __init__(self, code: str, message: str, commit: str | None = None):
        super().__init__(message)
        self.code, self.message, self.commit = code, message, commit


class HubServer:
    def __init__(self):
        self.repos: dict[str, Repo] = {}
        self.requests: list[Request] = []
        self.broken: dict[str, int] = {}
        self._httpd: ThreadingHTTPServer | None = None
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()

    # Content
    def add(self, repo_id: str, commit: str, files: dict[str, bytes],
            branch: str | None = None) -> None:
        assert re.fullmatch(r"[0-9a-f]{40}", commit), commit
        repo = self.repos.setdefault(repo_id, Repo())
        repo.commits[commit] = dict(files)
        if branch:
            repo.refs[branch] = commit

    def add_dir(self, repo_id: str, commit: str, directory: Path, **kw) -> None:
        files = {p.name: p.read_bytes() for p in sorted(Path(directory).iterdir()) if p.is_file()}
        self.add(repo_id, commit, files, **kw)

    def break_file(self, name: str, at: int) -> None:
        """Go away (drop every connection, stop listening) after `at` bytes of a GET of `name`."""
        self.broken[name] = at

    # Life cycle
    @property
    def url(self) -> str:
        assert self._httpd is not None, "server not started"
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def start(self) -> str:
        hub = self

        class Handler(HubHandler):
            server_hub = hub

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        return self.url

    def stop(self) -> None:
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        with self._lock:
            for conn in self._connections:
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self._connections.clear()

    def __enter__(self) -> HubServer:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # Answers
    def record(self, method: str, path: str, commit: str | None) -> None:
        with self._lock:
            self.requests.append(Request(method, path, commit))

    def lookup(self, repo_id: str, rev: str) -> tuple[str, dict[str, bytes]]:
        repo = self.repos.get(repo_id)
        if repo is None:
            raise HubError("RepoNotFound", "Repository not found")
        commit = repo.resolve(rev)
        if commit is None:
            raise HubError("RevisionNotFound", f"Invalid rev id: {rev}")
        return commit, repo.commits[commit]


class HubHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_hub: HubServer

    def setup(self):
        super().setup()
        with self.server_hub._lock:
            self.server_hub._connections.add(self.connection)

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.answer(send_body=True)

    def do_HEAD(self):
        self.answer(send_body=False)

    def answer(self, send_body: bool) -> None:
        hub, path = self.server_hub, unquote(urlsplit(self.path).path)
        commit = None
        try:
            if match := API.match(path):
                commit, files = hub.lookup(match["repo"], match["rev"])
                if match["kind"] == "revision":
                    info = {"id": match["repo"], "sha": commit,
                            "siblings": [{"rfilename": name} for name in files]}
                else:
                    info = [tree_entry(name, data) for name, data in files.items()]
                self.send_json(info, send_body)
            elif match := RESOLVE.match(path):
                commit, files = hub.lookup(match["repo"], match["rev"])
                if match["path"] not in files:
                    raise HubError("EntryNotFound", "Entry not found", commit)
                self.send_file(match["path"], files[match["path"]], commit, send_body)
            else:
                raise HubError("RepoNotFound", "Repository not found")
        except HubError as err:
            commit = commit or err.commit
            self.send_error_code(err)
        finally:
            hub.record(self.command, path, commit)

    def send_json(self, obj, send_body: bool) -> None:
        body = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if send_body:
            self.wfile.write(body)

    def send_file(self, name: str, data: bytes, commit: str, send_body: bool) -> None:
        start, status = self.range_start(len(data))
        self.send_response(status)
        self.send_header("X-Repo-Commit", commit)
        if is_lfs(name):
            etag = hashlib.sha256(data).hexdigest()
            self.send_header("X-Linked-Etag", f'"{etag}"')
            self.send_header("X-Linked-Size", str(len(data)))
        else:
            etag = git_blob_id(data)
        self.send_header("ETag", f'"{etag}"')
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Type", "application/octet-stream")
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.send_header("Content-Length", str(len(data) - start))
        self.end_headers()
        if not send_body:
            return
        at = self.server_hub.broken.get(name)
        if at is None:
            self.wfile.write(data[start:])
            return
        self.wfile.write(data[start:at])
        self.wfile.flush()
        self.close_connection = True
        threading.Thread(target=self.server_hub.stop).start()

    def range_start(self, size: int) -> tuple[int, int]:
        match = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", ""))
        if match and 0 < int(match[1]) < size:
            return int(match[1]), 206
        return 0, 200

    def send_error_code(self, err: HubError) -> None:
        body = json.dumps({"error": err.message}).encode()
        self.send_response(404)
        self.send_header("X-Error-Code", err.code)
        self.send_header("X-Error-Message", err.message)
        if err.commit:
            self.send_header("X-Repo-Commit", err.commit)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
