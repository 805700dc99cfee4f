#!/usr/bin/env python3
"""A TCP forwarder for tests/cli/tls_warn.sh: listen on ADDR (a port the
kernel picks), forward each connection to TARGET_HOST:TARGET_PORT. Prints the
port, then serves until killed.   tls_warn.py ADDR TARGET_HOST TARGET_PORT"""
import socket
import sys
import threading


def pump(a, b):
    try:
        while True:
            d = a.recv(65536)
            if not d:
                break
            b.sendall(d)
    except OSError:
        pass
    for s in (a, b):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def main():
    addr, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((addr, 0))
    ls.listen(64)
    print(ls.getsockname()[1], flush=True)
    while True:
        c, _ = ls.accept()
        try:
            u = socket.create_connection((host, port))
        except OSError:
            c.close()
            continue
        for a, b in ((c, u), (u, c)):
            threading.Thread(target=pump, args=(a, b), daemon=True).start()


main()
