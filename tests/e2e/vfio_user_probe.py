"""A minimal vfio-user client for e2e tests: what a VM's trapped accesses look like to a
borrower worker, without a VM (docs/interop/vfio-user.rst: VERSION, then REGION_READ and
REGION_WRITE, each answered).

    with ConfigReader(socket_path) as r:
        latencies = r.read_many(200)     # seconds per read
        r.write_region(BAR0, 0x28, b"...")
"""
import socket
import struct
import time

CMD_VERSION = 1
CMD_SET_IRQS = 8
CMD_REGION_READ = 9
CMD_REGION_WRITE = 10
BAR0 = 0                                 # VFIO_PCI_BAR0_REGION_INDEX
CONFIG_REGION = 7                        # VFIO_PCI_CONFIG_REGION_INDEX
HDR = struct.Struct("<HHIII")            # id, cmd, size, flags, error
RW = struct.Struct("<QII")               # offset, region, count
IRQ_SET = struct.Struct("<IIIII")        # argsz, flags, index, start, count
IRQ_EVENTFD_TRIGGER = (1 << 2) | (1 << 5)  # VFIO_IRQ_SET_DATA_EVENTFD | ACTION_TRIGGER
MSIX = 2                                 # VFIO_PCI_MSIX_IRQ_INDEX


class VfioUserError(Exception):
    pass


class ConfigReader:
    def __init__(self, path, timeout=10.0):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(str(path))
        self.msg_id = 0
        caps = b'{"capabilities":{"max_msg_fds":8,"max_data_xfer_size":1048576}}\0'
        self._call(CMD_VERSION, struct.pack("<HH", 0, 0) + caps)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.sock.close()

    def _recv(self, n):
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise VfioUserError("the server closed the connection")
            buf += chunk
        return buf

    def _call(self, cmd, payload, fds=()):
        self.msg_id = (self.msg_id + 1) & 0xffff
        msg = HDR.pack(self.msg_id, cmd, HDR.size + len(payload), 0, 0) + payload
        if fds:
            sent = socket.send_fds(self.sock, [msg], list(fds))
            self.sock.sendall(msg[sent:])
        else:
            self.sock.sendall(msg)
        mid, rcmd, size, flags, error = HDR.unpack(self._recv(HDR.size))
        body = self._recv(size - HDR.size)
        if mid != self.msg_id or rcmd != cmd or error:
            raise VfioUserError(f"reply id {mid} cmd {rcmd} error {error} to {self.msg_id}/{cmd}")
        return body

    def read_region(self, region, offset, count=4):
        body = self._call(CMD_REGION_READ, RW.pack(offset, region, count))
        return body[RW.size:RW.size + count]

    def write_region(self, region, offset, data):
        self._call(CMD_REGION_WRITE, RW.pack(offset, region, len(data)) + data)

    def set_irqs(self, index, start, fds):
        """Vectors [start, start + len(fds)) of @index signal @fds (eventfds), as QEMU sets
        a device's MSI-X up; the borrower exports each as an interrupt route to its lender."""
        self._call(CMD_SET_IRQS, IRQ_SET.pack(IRQ_SET.size, IRQ_EVENTFD_TRIGGER, index, start,
                                              len(fds)), fds)

    def read_config(self, offset, count=4):
        return self.read_region(CONFIG_REGION, offset, count)

    def read_many(self, n, offset=0):
        """@n reads of one dword at @offset (the vendor and device ids: read from the device,
        forwarded to the lender); their latencies in seconds."""
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            self.read_config(offset)
            out.append(time.perf_counter() - t0)
        return out
