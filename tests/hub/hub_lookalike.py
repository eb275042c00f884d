"""A Hugging Face Hub lookalike on loopback, for the `k3d pull` tests (daemon/k3d/tests/pull_cli.rs).

It serves one model repository made from a local directory with the Hub's real API shapes, the
ones `huggingface_hub` reads (its own download of the same repository is part of the tests):

- GET /api/models/OWNER/NAME/revision/REV: repo info (`sha`, `siblings`, ...);
- GET /api/models/OWNER/NAME/tree/REV[/PATH]?recursive=true: the listing, paged with
  `Link: <...>; rel="next"` (`--page-size`), each file with its git blob `oid`, `size` and, for
  LFS files, `lfs: {oid: sha256, size, pointerSize}`;
- HEAD/GET /OWNER/NAME/resolve/REV/PATH: `X-Repo-Commit`, `ETag`; a small file's bytes directly
  (with Range), an LFS file as a 302 to the CDN with `X-Linked-Etag` and `X-Linked-Size`;
- the CDN on *another* loopback address (127.0.0.2): GET/HEAD /blobs/SHA256 with Range.
Refusals carry the Hub's `X-Error-Code` (`RepoNotFound`, `RevisionNotFound`, `EntryNotFound`,
`GatedRepo`) and `X-Error-Message`.

Faults, each once unless said: `--fail-503 N` (the first N data requests answer 503 with
`Retry-After: 1`), `--cut NAME:OFFSET` (the connection is cut after byte OFFSET of NAME),
`--flip NAME:OFFSET[:TIMES]` (that byte is served flipped), `--rate BYTES_PER_S` (data served
slowly), `--token T` (the repository is gated: a request without `Authorization: Bearer T` is
refused). Every request is logged to `--log` as `METHOD HOST PATH RANGE STATUS`.

Started by the tests; it writes its base URL to `--url-file` once both servers listen and
runs until killed.
"""

import argparse
import hashlib
import json
import os
import socket
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LFS_SUFFIXES = (".safetensors", ".bin", ".model", ".pt", ".gguf")


def git_blob_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class Repo:
    """The files of `root`, as the Hub would list them at one commit."""

    def __init__(self, root, repo_id):
        self.root = root
        self.repo_id = repo_id
        self.files = {}
        for dirpath, _, names in os.walk(root):
            for name in names:
                full = os.path.join(dirpath, name)
                path = os.path.relpath(full, root).replace(os.sep, "/")
                with open(full, "rb") as f:
                    data = f.read()
                entry = {"type": "file", "path": path, "size": len(data)}
                if path.endswith(LFS_SUFFIXES):
                    sha = hashlib.sha256(data).hexdigest()
                    pointer = (
                        "version https://git-lfs.github.com/spec/v1\n"
                        f"oid sha256:{sha}\nsize {len(data)}\n"
                    ).encode()
                    entry["oid"] = git_blob_oid(pointer)
                    entry["lfs"] = {"oid": sha, "size": len(data), "pointerSize": len(pointer)}
                else:
                    entry["oid"] = git_blob_oid(data)
                self.files[path] = (entry, data)
        listing = json.dumps(sorted(e["oid"] + e["path"] for e, _ in self.files.values()))
        self.commit = hashlib.sha1(listing.encode()).hexdigest()
        self.by_sha = {e["lfs"]["oid"]: p for p, (e, _) in self.files.items() if "lfs" in e}

    def revision(self, rev):
        return self.commit if rev in ("main", self.commit) else None


class Faults:
    def __init__(self, args):
        self.lock = threading.Lock()
        self.fail_503 = args.fail_503
        self.cut = dict(self._spec(c)[:2] for c in args.cut)
        self.flip = {}
        for f in args.flip:
            name, offset, times = self._spec(f)
            self.flip[name] = [offset, times]
        self.rate = args.rate

    @staticmethod
    def _spec(text):
        parts = text.split(":")
        times = int(parts[2]) if len(parts) > 2 else 1
        return parts[0], int(parts[1]), times

    def take_503(self):
        with self.lock:
            if self.fail_503 > 0:
                self.fail_503 -= 1
                return True
            return False

    def take_cut(self, name, start, end):
        with self.lock:
            at = self.cut.get(name)
            if at is not None and start <= at < end:
                del self.cut[name]
                return at
            return None

    def take_flip(self, name, start, end):
        with self.lock:
            spec = self.flip.get(name)
            if spec and spec[1] > 0 and start <= spec[0] < end:
                spec[1] -= 1
                return spec[0]
            return None


def make_handler(repo, faults, args, cdn_base, log_lock):
    owner_name = repo.repo_id.split("/")

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def log(self, status):
            if args.log:
                with log_lock, open(args.log, "a") as f:
                    host = self.server.server_address[0]
                    rng = self.headers.get("Range", "-")
                    f.write(f"{self.command} {host} {self.path} {rng} {status}\n")

        def reply(self, status, body=b"", headers=None, ctype="application/json"):
            self.log(status)
            self.send_response(status)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def refuse(self, status, code, message):
            headers = {"X-Error-Message": message}
            if code:
                headers["X-Error-Code"] = code
            self.reply(status, json.dumps({"error": message}).encode(), headers)

        def authorized(self):
            if not args.token:
                return True
            sent = self.headers.get("Authorization")
            if sent is None:
                self.refuse(401, "GatedRepo", f"Access to model {repo.repo_id} is restricted. You must have access to it and be authenticated to access it. Please log in.")
                return False
            if sent != f"Bearer {args.token}":
                self.refuse(401, None, "Invalid credentials in Authorization header")
                return False
            return True

        def do_HEAD(self):
            self.do_GET()

        def do_GET(self):
            url = urllib.parse.urlsplit(self.path)
            parts = [urllib.parse.unquote(p) for p in url.path.split("/")[1:]]
            query = urllib.parse.parse_qs(url.query)
            if self.server.is_cdn:
                return self.cdn(parts)
            if parts[:2] == ["api", "models"]:
                return self.api(parts[2:], query)
            if len(parts) >= 5 and parts[2] == "resolve":
                return self.resolve(parts)
            self.refuse(404, None, "Not Found")

        def repo_checked(self, parts):
            if parts[:2] != owner_name:
                self.refuse(401, "RepoNotFound", "Repository Not Found for url: " + self.path)
                return False
            return self.authorized()

        def api(self, parts, query):
            if not self.repo_checked(parts):
                return
            if len(parts) < 4 or parts[2] not in ("revision", "tree"):
                return self.refuse(404, None, "Not Found")
            commit = repo.revision(parts[3])
            if commit is None:
                return self.refuse(404, "RevisionNotFound", f"Invalid rev id: {parts[3]}")
            if parts[2] == "revision":
                info = {
                    "_id": "0" * 24, "id": repo.repo_id, "modelId": repo.repo_id,
                    "author": owner_name[0], "sha": commit, "private": False,
                    "gated": "manual" if args.token else False, "disabled": False,
                    "downloads": 0, "likes": 0, "tags": [], "library_name": None,
                    "lastModified": "2026-01-01T00:00:00.000Z",
                    "createdAt": "2026-01-01T00:00:00.000Z",
                    "siblings": [{"rfilename": p} for p in sorted(repo.files)],
                }
                return self.reply(200, json.dumps(info).encode())
            prefix = "/".join(parts[4:])
            recursive = query.get("recursive", ["false"])[0] in ("true", "1", "True")
            entries, dirs = [], set()
            for path in sorted(repo.files):
                if prefix and not path.startswith(prefix + "/"):
                    continue
                rest = path[len(prefix) + 1:] if prefix else path
                if not recursive and "/" in rest:
                    dirs.add((prefix + "/" if prefix else "") + rest.split("/")[0])
                    continue
                entries.append(repo.files[path][0])
            entries += [{"type": "directory", "oid": "0" * 40, "size": 0, "path": d} for d in sorted(dirs)]
            cursor = int(query.get("cursor", ["0"])[0])
            page = entries[cursor:cursor + args.page_size]
            headers = {}
            if cursor + args.page_size < len(entries):
                q = dict((k, v[0]) for k, v in query.items())
                q["cursor"] = str(cursor + args.page_size)
                host = self.headers.get("Host")
                headers["Link"] = f'<http://{host}{url_path(self.path)}?{urllib.parse.urlencode(q)}>; rel="next"'
            self.reply(200, json.dumps(page).encode(), headers)

        def resolve(self, parts):
            if not self.repo_checked(parts):
                return
            commit = repo.revision(parts[3])
            if commit is None:
                return self.refuse(404, "RevisionNotFound", f"Invalid rev id: {parts[3]}")
            path = "/".join(parts[4:])
            if path not in repo.files:
                return self.refuse(404, "EntryNotFound", f"{path} does not exist on \"{parts[3]}\"")
            entry, data = repo.files[path]
            headers = {"X-Repo-Commit": commit, "Accept-Ranges": "bytes"}
            if "lfs" in entry:
                sha = entry["lfs"]["oid"]
                headers.update({
                    "ETag": f'"{entry["oid"]}"',
                    "X-Linked-Etag": f'"{sha}"',
                    "X-Linked-Size": str(entry["size"]),
                    "Location": f"{cdn_base}/blobs/{sha}?X-Amz-Signature=lookalike",
                })
                return self.reply(302, b"", headers)
            headers["ETag"] = f'"{entry["oid"]}"'
            self.data(path, data, headers)

        def cdn(self, parts):
            if len(parts) != 2 or parts[0] != "blobs" or parts[1] not in repo.by_sha:
                return self.reply(404, b"NoSuchKey", ctype="text/plain")
            path = repo.by_sha[parts[1]]
            self.data(path, repo.files[path][1], {"Accept-Ranges": "bytes", "ETag": f'"{parts[1]}"'})

        def data(self, name, data, headers):
            if self.command == "GET" and faults.take_503():
                return self.reply(503, b"Service Unavailable", {"Retry-After": "1"}, "text/plain")
            start, end, status = 0, len(data), 200
            rng = self.headers.get("Range")
            if rng and rng.startswith("bytes="):
                a, _, b = rng[len("bytes="):].partition("-")
                start = int(a) if a else max(0, len(data) - int(b))
                end = min(len(data), int(b) + 1) if (a and b) else len(data)
                if start >= len(data) and len(data) > 0:
                    return self.reply(416, b"", {"Content-Range": f"bytes */{len(data)}"}, "text/plain")
                status = 206
                headers["Content-Range"] = f"bytes {start}-{max(start, end - 1)}/{len(data)}"
            body = bytearray(data[start:end])
            if self.command == "GET":
                flip = faults.take_flip(name, start, end)
                if flip is not None:
                    body[flip - start] ^= 0x01
            self.log(status)
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command == "HEAD":
                return
            cut = faults.take_cut(name, start, end)
            sent, step = 0, 16384
            limit = len(body) if cut is None else cut - start
            while sent < limit:
                n = min(step, limit - sent)
                self.wfile.write(body[sent:sent + n])
                sent += n
                if faults.rate:
                    self.wfile.flush()
                    time.sleep(n / faults.rate)
            if cut is not None:
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)

    return Handler


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        # A client that goes away mid-request (the SIGKILL test) is expected, not news.
        if not isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            super().handle_error(request, client_address)


def url_path(path):
    return urllib.parse.urlsplit(path).path


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True)
    p.add_argument("--repo", required=True)
    p.add_argument("--url-file", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--cdn-host", default="127.0.0.2")
    p.add_argument("--page-size", type=int, default=3)
    p.add_argument("--token")
    p.add_argument("--fail-503", type=int, default=0)
    p.add_argument("--cut", action="append", default=[])
    p.add_argument("--flip", action="append", default=[])
    p.add_argument("--rate", type=float, default=0.0)
    p.add_argument("--log")
    args = p.parse_args()
    repo = Repo(args.root, args.repo)
    faults = Faults(args)
    log_lock = threading.Lock()
    cdn = Server((args.cdn_host, 0), BaseHTTPRequestHandler)
    cdn_base = f"http://{args.cdn_host}:{cdn.server_address[1]}"
    cdn.RequestHandlerClass = make_handler(repo, faults, args, cdn_base, log_lock)
    cdn.is_cdn = True
    hub = Server((args.host, 0), make_handler(repo, faults, args, cdn_base, log_lock))
    hub.is_cdn = False
    for server in (cdn, hub):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    tmp = args.url_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(f"http://{args.host}:{hub.server_address[1]} {repo.commit}\n")
    os.rename(tmp, args.url_file)
    threading.Event().wait()


if __name__ == "__main__":
    main()
