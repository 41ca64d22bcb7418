#!/usr/bin/env python3
"""hold_reused.py: held requests on reused keep-alive connections (held-memory.sh REUSE=1).

Opens CONNS connections to thaw, sends one request to a warm service on each and reads its
answer (the connection is now a kept-alive HTTP/1.1 connection that hyper has served), touches
--ready-file, waits for --go-file (so the caller can read thaw's RSS with the connections idle),
then sends one request to a cold service on each and waits for every answer. Prints a summary in
hey's format (Latency distribution, Status code distribution, Error distribution) so
held-memory.sh reads it the same way. Loopback only; bounded by --timeout.
"""
import argparse
import os
import selectors
import socket
import time


def request(host):
    return f"GET / HTTP/1.1\r\nHost: {host}\r\nUser-Agent: hold_reused\r\n\r\n".encode()


def response_done(buf):
    """(status, complete) for a Content-Length response in buf."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return None, False
    head = buf[:end].decode("latin-1").split("\r\n")
    status = int(head[0].split()[1])
    length = 0
    for line in head[1:]:
        k, _, v = line.partition(":")
        if k.strip().lower() == "content-length":
            length = int(v.strip())
    return status, len(buf) >= end + 4 + length


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--addr", required=True)
    ap.add_argument("--conns", type=int, required=True)
    ap.add_argument("--warm-host", required=True)
    ap.add_argument("--cold-host", required=True)
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--ready-file", help="touched once every connection is idle and kept alive")
    ap.add_argument("--go-file", help="the cold requests wait until this file exists")
    a = ap.parse_args()
    host, port = a.addr.rsplit(":", 1)
    deadline = time.monotonic() + a.timeout
    socks = []
    for _ in range(a.conns):
        s = socket.create_connection((host, int(port)), timeout=30)
        s.sendall(request(a.warm_host))
        buf = b""
        while True:
            status, done = response_done(buf)
            if done:
                break
            chunk = s.recv(65536)
            if not chunk:
                raise SystemExit("warm request: connection closed")
            buf += chunk
        if status != 200:
            raise SystemExit(f"warm request answered {status}")
        socks.append(s)
    if a.ready_file:
        open(a.ready_file, "w").close()
    while a.go_file and not os.path.exists(a.go_file):
        if time.monotonic() > deadline:
            raise SystemExit("no go file")
        time.sleep(0.05)
    sel = selectors.DefaultSelector()
    started = {}
    bufs = {}
    for s in socks:
        s.setblocking(False)
        s.sendall(request(a.cold_host))
        started[s] = time.monotonic()
        bufs[s] = b""
        sel.register(s, selectors.EVENT_READ)
    codes, errors, latencies = {}, {}, []
    while sel.get_map() and time.monotonic() < deadline:
        for key, _ in sel.select(timeout=1):
            s = key.fileobj
            try:
                chunk = s.recv(65536)
            except OSError as e:
                chunk, err = b"", str(e)
            else:
                err = "connection closed before an answer"
            if chunk:
                bufs[s] += chunk
                status, done = response_done(bufs[s])
                if not done:
                    continue
                codes[status] = codes.get(status, 0) + 1
                latencies.append(time.monotonic() - started[s])
            else:
                errors[err] = errors.get(err, 0) + 1
            sel.unregister(s)
            s.close()
    left = len(sel.get_map())
    if left:
        errors["timeout"] = left
    latencies.sort()
    print("Summary:")
    print(f"  Requests/sec:\t{len(latencies) / max(a.timeout, 1e-9):.4f}")
    print("\nLatency distribution:")
    for p in (50, 99):
        if latencies:
            i = min(len(latencies) - 1, int(len(latencies) * p / 100))
            print(f"  {p}% in {latencies[i]:.4f} secs")
    print("\nStatus code distribution:")
    for code, n in sorted(codes.items()):
        print(f"  [{code}]\t{n} responses")
    if errors:
        print("\nError distribution:")
        for e, n in errors.items():
            print(f"  [{n}]\t{e}")


if __name__ == "__main__":
    main()
