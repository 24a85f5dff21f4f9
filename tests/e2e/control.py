"""A minimal client of vfio-ntbd's control socket (docs/control.md), for tests."""
import json
import socket
import time


class ControlError(Exception):
    def __init__(self, klass, desc):
        super().__init__(f"{klass}: {desc}")
        self.klass = klass
        self.desc = desc


class Control:
    def __init__(self, path, timeout=10.0):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(str(path))
        self.buf = b""
        self.events = []
        self.next_id = 1
        self.greeting = self._line()

    def close(self):
        self.sock.close()

    def _line(self):
        while b"\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("control socket closed")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def raw(self, text):
        """Send raw bytes (a line) and return the next non-event answer."""
        self.sock.sendall(text if isinstance(text, bytes) else text.encode())
        while True:
            msg = self._line()
            if "event" in msg:
                self.events.append(msg)
                continue
            return msg

    def execute(self, cmd, **args):
        rid = self.next_id
        self.next_id += 1
        req = {"execute": cmd, "id": rid}
        if args:
            req["arguments"] = args
        ans = self.raw(json.dumps(req) + "\n")
        if ans.get("id") != rid:
            raise ControlError("Protocol", f"answer id {ans.get('id')} for request {rid}")
        if "error" in ans:
            raise ControlError(ans["error"]["class"], ans["error"]["desc"])
        return ans["return"]

    def wait_event(self, name, timeout=10.0):
        deadline = time.monotonic() + timeout
        while True:
            for e in self.events:
                if e["event"] == name:
                    self.events.remove(e)
                    return e
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {name} event")
            self.sock.settimeout(max(0.05, deadline - time.monotonic()))
            try:
                self.events.append(self._line())
            except socket.timeout:
                pass
