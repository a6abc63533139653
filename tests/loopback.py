"""Loopback HTTP servers that stand in for the Hugging Face Hub and for a
plain download site, so the pretrained-weights code downloads for real
(huggingface_hub, keras.utils.get_file) without the internet.

The Hub part answers ``/{repo}/resolve/{revision}/{file}`` HEAD and GET
requests with the headers huggingface_hub reads: ``X-Repo-Commit``, and for
an LFS file ``X-Linked-Etag`` (its sha256) and ``X-Linked-Size``. A served
file can advertise the sha256 of other content (a tampered download), and a
repository can refuse access as the Hub does (401, 403).
"""
from __future__ import annotations

import hashlib
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class LoopbackServer:
    def __init__(self):
        self.routes: dict[str, tuple[bytes, dict[str, str]]] = {}
        self.requests: list[tuple[str, str]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_HEAD(self):
                self._answer(body=False)

            def do_GET(self):
                self._answer(body=True)

            def _answer(self, body: bool):
                server.requests.append((self.command, self.path))
                route = server.routes.get(self.path)
                if route is None:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                content, headers = route
                self.send_response(int(headers.get("Status", 200)))
                self.send_header("Content-Length", str(len(content)))
                for key, value in headers.items():
                    self.send_header(key, value)
                self.end_headers()
                if body:
                    self.wfile.write(content)

            def log_message(self, *args):
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()

    def hub_file(self, repo: str, filename: str, content: bytes, *, advertised: bytes | None = None) -> str:
        """Serve ``content`` as an LFS file of Hub repository ``repo``,
        advertising the sha256 of ``advertised`` (default: of ``content``)."""
        sha256 = hashlib.sha256(content if advertised is None else advertised).hexdigest()
        commit = hashlib.sha1(repo.encode()).hexdigest()
        self.routes[f"/{repo}/resolve/main/{filename}"] = (content, {
            "X-Repo-Commit": commit, "X-Linked-Etag": f'"{sha256}"', "X-Linked-Size": str(len(content)),
            "ETag": f'"{sha256}"'})
        return sha256

    def hub_refusal(self, repo: str, filename: str, status: int, error_code: str = "", message: str = "") -> None:
        """Answer requests for ``filename`` of ``repo`` as the Hub answers for a
        gated repository (403, ``GatedRepo``), an unknown or private one
        without a token (401, ``RepoNotFound``) or an invalid token (401 and
        its message)."""
        self.routes[f"/{repo}/resolve/main/{filename}"] = (b"", {"Status": str(status), "X-Error-Code": error_code,
                                                                 "X-Error-Message": message})

    def plain_file(self, url: str, content: bytes) -> None:
        """Serve ``content`` for ``url`` fetched through this server as a mirror
        (``https://host/path`` -> ``/host/path``)."""
        self.routes["/" + url.split("://", 1)[1]] = (content, {})

    def hits(self, fragment: str) -> int:
        """GET requests whose path contains ``fragment``."""
        return sum(1 for method, path in self.requests if method == "GET" and fragment in path)

    def close(self):
        self._httpd.shutdown()
        self._httpd.server_close()
