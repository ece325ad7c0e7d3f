"""A Hub imitation on loopback for tests (never the real Hub): model and dataset repositories with one branch,
regular and LFS uploads, tree / paths-info / resolve, repo info. Used through `hub_env(tmp_path, hub.url)` in a
subprocess (huggingface_hub reads its endpoint at import time)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


REPO = Path(__file__).resolve().parents[1]


def hub_env(tmp_path, endpoint):
    return {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "HF_ENDPOINT": endpoint,
        "HF_HUB_OFFLINE": "0",
        "HF_HOME": str(tmp_path / "hf-home"),
        "HF_TOKEN": "hf_test_token",
        "HF_HUB_DISABLE_XET": "1",  # the imitation speaks the plain LFS protocol
    }


class MockHub:
    """A minimal Hub: model and dataset repos with one branch, regular and LFS uploads, tree/paths-info/resolve."""

    def __init__(self):
        self.repos = {}  # repo_id -> {"refs": {"main": sha}, "commits": {sha: {path: bytes}}}
        self.log = []
        self.auth = set()
        self.lfs = {}  # sha256 -> bytes
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                hub.handle(self, "GET")

            def do_HEAD(self):
                hub.handle(self, "HEAD")

            def do_POST(self):
                hub.handle(self, "POST")

            def do_PUT(self):
                hub.handle(self, "PUT")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    # ----------------------------------------------------------------------------------------------- helpers
    def send(self, h, status, body=b"", headers=None, method="GET"):
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
            headers = {"Content-Type": "application/json", **(headers or {})}
        h.send_response(status)
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if method != "HEAD":
            h.wfile.write(body)

    def error(self, h, status, code, method="GET"):
        self.send(h, status, {"error": code}, {"X-Error-Code": code, "X-Error-Message": code}, method)

    def snapshot(self, repo_id, rev):
        repo = self.repos.get(repo_id)
        if repo is None:
            return None, None
        sha = repo["refs"].get(urllib.parse.unquote(rev), rev)
        return sha, repo["commits"].get(sha)

    @staticmethod
    def entry(path, data):
        return {"type": "file", "path": path, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}

    # ------------------------------------------------------------------------------------------------ routes
    def handle(self, h, method):
        parsed = urllib.parse.urlsplit(h.path)
        path, query = parsed.path, urllib.parse.parse_qs(parsed.query)
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else b""
        self.log.append((method, path))
        if h.headers.get("Authorization"):
            self.auth.add(h.headers["Authorization"])
        m = re.fullmatch(r"/api/(?:datasets|models)/([^/]+/[^/]+)(?:/revision/(.+))?", path)
        if m and method == "GET":
            repo_id, rev = m.group(1), m.group(2) or "main"
            if repo_id not in self.repos:
                return self.error(h, 404, "RepoNotFound")
            sha, files = self.snapshot(repo_id, rev)
            if files is None:
                return self.error(h, 404, "RevisionNotFound")
            return self.send(
                h,
                200,
                {
                    "id": repo_id,
                    "_id": repo_id,
                    "sha": sha,
                    "private": True,
                    "siblings": [{"rfilename": p} for p in sorted(files)],
                    "tags": [],
                    "downloads": 0,
                    "likes": 0,
                    "author": repo_id.split("/")[0],
                },
            )
        if path == "/api/repos/create" and method == "POST":
            payload = json.loads(body)
            repo_id = f"{payload.get('organization') or 'me'}/{payload['name']}"
            if repo_id not in self.repos:
                sha = hashlib.sha1(repo_id.encode()).hexdigest()
                self.repos[repo_id] = {"refs": {"main": sha}, "commits": {sha: {}}}
            prefix = "datasets/" if payload.get("type") == "dataset" else ""
            return self.send(h, 200, {"url": f"{self.url}/{prefix}{repo_id}", "name": repo_id})
        m = re.fullmatch(r"/api/(?:datasets|models)/([^/]+/[^/]+)/preupload/(.+)", path)
        if m and method == "POST":
            files = json.loads(body)["files"]
            return self.send(
                h,
                200,
                {
                    "files": [
                        {
                            "path": f["path"],
                            "uploadMode": "lfs" if f["path"].endswith((".parquet", ".safetensors")) else "regular",
                            "shouldIgnore": False,
                        }
                        for f in files
                    ]
                },
            )
        m = re.fullmatch(r"(?:/datasets)?/([^/]+/[^/]+)\.git/info/lfs/objects/batch", path)
        if m and method == "POST":
            objects = []
            for obj in json.loads(body)["objects"]:
                actions = (
                    {}
                    if obj["oid"] in self.lfs
                    else {"actions": {"upload": {"href": f"{self.url}/lfs-upload/{obj['oid']}"}}}
                )
                objects.append({"oid": obj["oid"], "size": obj["size"], **actions})
            return self.send(h, 200, {"transfer": "basic", "objects": objects})
        m = re.fullmatch(r"/lfs-upload/([0-9a-f]{64})", path)
        if m and method == "PUT":
            if hashlib.sha256(body).hexdigest() != m.group(1):
                return self.error(h, 400, "BadHash")
            self.lfs[m.group(1)] = body
            return self.send(h, 200, b"")
        m = re.fullmatch(r"/api/(?:datasets|models)/([^/]+/[^/]+)/commit/(.+)", path)
        if m and method == "POST":
            repo_id, rev = m.group(1), urllib.parse.unquote(m.group(2))
            sha, files = self.snapshot(repo_id, rev)
            files = dict(files)
            for line in body.decode().splitlines():
                item = json.loads(line)
                if item["key"] == "file":
                    files[item["value"]["path"]] = base64.b64decode(item["value"]["content"])
                elif item["key"] == "lfsFile":
                    files[item["value"]["path"]] = self.lfs[item["value"]["oid"]]
                elif item["key"] == "deletedFile":
                    files.pop(item["value"]["path"], None)
                elif item["key"] != "header":
                    return self.error(h, 400, f"unsupported {item['key']}")
            new = hashlib.sha1(body + sha.encode()).hexdigest()
            self.repos[repo_id]["commits"][new] = files
            self.repos[repo_id]["refs"]["main"] = new
            return self.send(h, 200, {"commitUrl": f"{self.url}/datasets/{repo_id}/commit/{new}", "commitOid": new})
        m = re.fullmatch(r"/api/(?:datasets|models)/([^/]+/[^/]+)/tree/([^/]+)(?:/(.*))?", path)
        if m and method == "GET":
            sha, files = self.snapshot(m.group(1), m.group(2))
            if files is None:
                return self.error(h, 404, "RevisionNotFound")
            base = (m.group(3) or "").strip("/")
            recursive = query.get("recursive", ["false"])[0] in ("1", "true", "True")
            out, dirs = [], set()
            for p, data in sorted(files.items()):
                if base and not p.startswith(base + "/"):
                    continue
                rest = p[len(base) + 1 :] if base else p
                if "/" in rest and not recursive:
                    d = (base + "/" if base else "") + rest.split("/")[0]
                    if d not in dirs:
                        dirs.add(d)
                        out.append({"type": "directory", "path": d, "oid": "0" * 40, "size": 0})
                    continue
                if recursive:
                    parts = rest.split("/")[:-1]
                    for i in range(1, len(parts) + 1):
                        d = "/".join(([base] if base else []) + parts[:i])
                        if d not in dirs:
                            dirs.add(d)
                            out.append({"type": "directory", "path": d, "oid": "0" * 40, "size": 0})
                out.append(self.entry(p, data))
            if base and not out and base not in files:
                return self.error(h, 404, "EntryNotFound")
            return self.send(h, 200, out)
        m = re.fullmatch(r"/api/(?:datasets|models)/([^/]+/[^/]+)/paths-info/(.+)", path)
        if m and method == "POST":
            sha, files = self.snapshot(m.group(1), m.group(2))
            if files is None:
                return self.error(h, 404, "RevisionNotFound")
            ctype = h.headers.get("Content-Type", "")
            if "json" in ctype:
                paths = json.loads(body).get("paths", [])
            else:
                paths = urllib.parse.parse_qs(body.decode()).get("paths", [])
            out = []
            for p in paths:
                if p in files:
                    out.append(self.entry(p, files[p]))
                elif any(f.startswith(p.rstrip("/") + "/") for f in files):
                    out.append({"type": "directory", "path": p, "oid": "0" * 40, "size": 0})
            return self.send(h, 200, out)
        m = re.fullmatch(r"(?:/datasets)?/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if m and method in ("GET", "HEAD"):
            repo_id = m.group(1)
            if repo_id not in self.repos:
                return self.error(h, 404, "RepoNotFound", method)
            sha, files = self.snapshot(repo_id, m.group(2))
            if files is None:
                return self.error(h, 404, "RevisionNotFound", method)
            name = urllib.parse.unquote(m.group(3))
            if name not in files:
                return self.error(h, 404, "EntryNotFound", method)
            data = files[name]
            return self.send(
                h,
                200,
                data,
                {
                    "X-Repo-Commit": sha,
                    "ETag": f'"{hashlib.sha1(data).hexdigest()}"',
                    "Content-Type": "application/octet-stream",
                },
                method,
            )
        if path == "/api/validate-yaml" and method == "POST":
            return self.send(h, 200, {"errors": [], "warnings": []})
        self.log.append(("UNHANDLED", method, h.path))
        return self.error(h, 404, "NotImplementedByMock", method)
