"""The client side of tests/perf/http-load.sh: loopback clients of a running agent.

  http_load.py unread PID PORT HOLD PIPELINED
      256 clients (32 from each of 127.0.0.2-9) send PIPELINED pipelined `GET /metrics`
      each to the plain port PORT and never read; for HOLD seconds a scraper on
      127.0.0.1 scrapes every 0.5 s. Prints the agent's RSS before and its peak
      (sampled, and VmHWM), the peak of what the kernel held in the agent's send queues
      (tx_queue of /proc/net/tcp: memory charged to the agent's cgroup, not in its RSS),
      and the scraper's statuses.
  http_load.py flood PID MAIN TOKENLESS CAFILE SAMPLES
      main-port scrape latency (a new connection each, as Prometheus scraping every
      15 s or more) alone, 1.1 s apart (each renders the page, as a Prometheus scrape
      does), then while 32 keep-alive HTTPS scrapers flood the token-free port TOKENLESS;
      SAMPLES scrapes each. Prints p50/p95 of both, the flood's rate and the agent's CPU.

Standard library only; every socket has a timeout, so a stuck agent fails the run.
"""

import http.client
import socket
import ssl
import statistics
import sys
import threading
import time

REQUEST = b"GET /metrics HTTP/1.1\r\nHost: agent\r\n\r\n"


def status_field(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise SystemExit(f"no {field} for {pid}")


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100.0  # utime + stime, clock ticks of 10 ms


def kernel_queued(port):
    """Bytes queued to send on the sockets of local port PORT (the agent's side)."""
    total = 0
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            fields = line.split()
            if int(fields[1].split(":")[1], 16) == port:
                total += int(fields[4].split(":")[0], 16)
    return total


def scrape(port, source="127.0.0.1"):
    """(status or None, seconds) of one scrape on a new connection."""
    started = time.monotonic()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(source, 0)) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n")
            data = b""
            while chunk := s.recv(1 << 16):
                data += chunk
        status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else None
    except OSError:
        status = None
    return status, time.monotonic() - started


def percentile(values, p):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def unread(pid, port, hold, pipelined):
    before = status_field(pid, "VmRSS")
    held = []
    for address in range(2, 10):
        for _ in range(32):
            s = socket.socket()
            s.settimeout(5)
            try:
                s.bind((f"127.0.0.{address}", 0))
                s.connect(("127.0.0.1", port))
                s.sendall(REQUEST * pipelined)
            except OSError:
                pass
            held.append(s)
    peak, kernel, statuses = before, 0, []
    end = time.monotonic() + hold
    while time.monotonic() < end:
        statuses.append(scrape(port)[0])
        peak = max(peak, status_field(pid, "VmRSS"))
        kernel = max(kernel, kernel_queued(port))
        time.sleep(0.5)
    hwm = status_field(pid, "VmHWM")
    for s in held:
        s.close()
    served = sum(1 for s in statuses if s == 200)
    print(
        f"rss before {before // 1024} MiB, peak {peak // 1024} MiB sampled, VmHWM {hwm // 1024} MiB; "
        f"kernel send queues at most {kernel / (1 << 20):.0f} MiB; "
        f"scrapes from 127.0.0.1 answered 200: {served}/{len(statuses)} (others: {sorted(set(map(str, statuses)) - {'200'})})"
    )


def spaced_scrape(port):
    seconds = scrape(port)[1]
    time.sleep(1.1)  # past the agent's page reuse (PAGE_MAX_AGE, 1 s)
    return seconds


def flood(pid, main, tokenless, cafile, samples):
    alone = [spaced_scrape(main) for _ in range(samples)]
    stop, counts, errors = threading.Event(), [0] * 32, [0] * 32

    def scraper(i):
        context = ssl.create_default_context(cafile=cafile)
        connection = None
        while not stop.is_set():
            try:
                if connection is None:
                    connection = http.client.HTTPSConnection("127.0.0.1", tokenless, context=context, timeout=30)
                connection.request("GET", "/metrics")
                connection.getresponse().read()
                counts[i] += 1
            except (OSError, http.client.HTTPException):
                errors[i] += 1
                connection = None
                time.sleep(0.1)

    threads = [threading.Thread(target=scraper, args=(i,), daemon=True) for i in range(32)]
    for t in threads:
        t.start()
    time.sleep(3)  # every scraper connected
    cpu0, flood0, t0 = cpu_seconds(pid), sum(counts), time.monotonic()
    during = [scrape(main) for _ in range(samples)]
    cpu1, flood1, t1 = cpu_seconds(pid), sum(counts), time.monotonic()
    stop.set()
    for t in threads:
        t.join(timeout=60)
    failed = sum(1 for status, _ in during if status != 200)
    during = [seconds for _, seconds in during]
    print(
        f"main port alone: p50 {percentile(alone, 50):.3f} s, p95 {percentile(alone, 95):.3f} s; "
        f"during the flood: p50 {percentile(during, 50):.3f} s, p95 {percentile(during, 95):.3f} s "
        f"({failed} not 200); token-free scrapes {(flood1 - flood0) / (t1 - t0):.1f}/s ({sum(errors)} failed); "
        f"agent CPU {100 * (cpu1 - cpu0) / (t1 - t0):.0f} % of a core, "
        f"{1000 * (cpu1 - cpu0) / max(1, flood1 - flood0):.1f} ms a token-free scrape"
    )


if __name__ == "__main__":
    case = sys.argv[1]
    if case == "unread":
        unread(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]))
    elif case == "flood":
        flood(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], int(sys.argv[6]))
    else:
        raise SystemExit(f"unknown case {case}")
