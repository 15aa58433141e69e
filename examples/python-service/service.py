"""A signup service in Python: POST /signup {"email": ...} writes the user
and submits its welcome task in one transaction, with outbox_submit. If the
insert fails (the email is taken), the task is rolled back with it.

Run with: DATABASE_URL=postgresql://... SERVICE_ADDR=127.0.0.1:8000 python3 service.py
Needs psycopg 3 (Debian: python3-psycopg, for the system's /usr/bin/python3,
not a pyenv or venv interpreter; PyPI: psycopg[binary]).
"""

import json
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psycopg
from psycopg.types.json import Jsonb

DATABASE_URL = os.environ["DATABASE_URL"]


class Signup(BaseHTTPRequestHandler):
    def do_POST(self):
        if self.path != "/signup":
            return self.reply(404, {"error": "no such page"})
        try:
            length = int(self.headers.get("Content-Length", "0"))
            email = json.loads(self.rfile.read(length))["email"]
        except (ValueError, KeyError, TypeError):
            return self.reply(400, {"error": 'send {"email": "..."}'})
        try:
            # One transaction: the user and its task commit together. No
            # statement prepared by name, so the same code runs behind
            # PgBouncer in transaction mode (guide, section 14).
            with psycopg.connect(DATABASE_URL, prepare_threshold=None) as conn, conn.transaction():
                user_id = conn.execute(
                    "INSERT INTO users (email) VALUES (%s) RETURNING id", (email,)
                ).fetchone()[0]
                task_id = conn.execute(
                    "SELECT outbox_submit('email.welcome', %s)",
                    (Jsonb({"user_id": user_id, "email": email}),),
                ).fetchone()[0]
        except psycopg.errors.UniqueViolation:
            return self.reply(409, {"error": "that email has signed up already"})
        self.reply(201, {"user_id": user_id, "task_id": task_id})

    def reply(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    host, port = os.environ.get("SERVICE_ADDR", "127.0.0.1:8000").rsplit(":", 1)
    ThreadingHTTPServer((host, int(port)), Signup).serve_forever()
