#!/usr/bin/env python3
"""One client of bench/serve_redis.sh: requests of --size raw rows, one at a
time on one persistent connection, and their p50/p99 latency, with where
the server took the embedding rows from (its /metrics, before and after).

--warm W (0..100): each request row is, with probability W%, one of the
rows sent during the warm-up, else a row never sent before; 0 sends the
same rows as the warm-up (a fixed set of 4096)."""
import argparse
import http.client
import json
import random
import time


def rows_of(path, skip, n):
    out = []
    with open(path) as f:
        for i, line in enumerate(f):
            if i < skip:
                continue
            if len(out) == n:
                break
            fields = line.rstrip("\n").split("\t")
            out.append((fields[1:14], fields[14:40]))
    return out


def body(rows):
    dense = [r[0] for r in rows]
    cat = [r[1] for r in rows]
    return json.dumps({"inputs": [
        {"name": "dense", "shape": [len(rows), 13], "datatype": "BYTES", "data": dense},
        {"name": "categorical", "shape": [len(rows), 26], "datatype": "BYTES", "data": cat}]})


def metrics(conn):
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    got = {}
    for src in ("cache", "redis", "table"):
        key = 'dlrec_redis_rows_total{source="%s"} ' % src
        i = text.find(key)
        got[src] = float(text[i + len(key):].split()[0]) if i >= 0 else 0.0
    return got


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--rows", required=True)
    ap.add_argument("--size", type=int, required=True)
    ap.add_argument("--requests", type=int, required=True)
    ap.add_argument("--warm", type=float, required=True)
    ap.add_argument("--label", required=True)
    a = ap.parse_args()
    rng = random.Random(7)
    warm_rows = rows_of(a.rows, 0, 4096)
    need_cold = int(a.requests * a.size * (1 - a.warm / 100)) + a.size if a.warm else 0
    cold_rows = rows_of(a.rows, 4096, need_cold)
    conn = http.client.HTTPConnection("127.0.0.1", a.port)
    path = "/v2/models/dlrm/infer"

    def send(rows):
        t = time.perf_counter()
        conn.request("POST", path, body(rows), {"Content-Type": "application/json"})
        r = conn.getresponse()
        r.read()
        if r.status != 200:
            raise SystemExit("serve_redis.py: HTTP %d" % r.status)
        return time.perf_counter() - t

    for i in range(0, len(warm_rows), 64):  # warm-up: every warm row once
        send(warm_rows[i:i + 64])
    before = metrics(conn)
    lat, cold_at = [], 0
    for _ in range(a.requests):
        rows = []
        for _ in range(a.size):
            if a.warm == 0 or rng.random() * 100 < a.warm or cold_at >= len(cold_rows):
                rows.append(warm_rows[rng.randrange(len(warm_rows))])
            else:
                rows.append(cold_rows[cold_at])
                cold_at += 1
        lat.append(send(rows))
    after = metrics(conn)
    lat.sort()
    p50 = lat[len(lat) // 2] * 1e6
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e6
    d = {k: after[k] - before[k] for k in after}
    total = sum(d.values()) or 1.0
    label = a.label if a.label in ("table", "0") else "warm" + a.label
    label = "0%" if label == "0" else label
    share = lambda k: "%.1f%%" % (100 * d[k] / total) if sum(d.values()) else "-"
    print("%5d %-8s %10.0f %10.0f %8s %8s %8s" % (a.size, label, p50, p99, share("cache"), share("redis"),
                                                 share("table")))


if __name__ == "__main__":
    main()
