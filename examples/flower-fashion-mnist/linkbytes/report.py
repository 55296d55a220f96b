"""The report: per round the mean over the nodes, the summary, the Markdown tables, the
machine and versions, and the JSON file."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import time
from importlib import metadata
from pathlib import Path
from typing import Any


def per_round(res: dict[str, Any]) -> list[dict[str, Any]]:
    """Per round, the mean over the nodes: TCP bytes up and down, the strategy's reply
    bytes, and the bytes up besides them: the reply's framing (its push-messages and
    push-object requests' bytes beyond the strategy's count: HTTP heads, protobuf fields,
    object ids), the requests that download the round's model (the pull that returned it,
    pull-object, confirm-message-received), polling (empty pulls, heartbeats) and the rest
    (get-run and get-fab in round 1)."""
    rows = []
    n = res["nodes"]
    for r in range(1, res["rounds"] + 1):
        segs = [node["rounds"][str(r)] for node in res["per-node"]]
        reply = res["strategy-bytes-up"][str(r)] / n

        def mean(get: Any, segs: list[dict[str, Any]] = segs) -> float:
            return sum(get(s) for s in segs) / n

        up = mean(lambda s: s["up"])
        rows.append({
            "round": r, "tcp-up": up, "tcp-down": mean(lambda s: s["down"]),
            "tcp-up-min": min(s["up"] for s in segs), "tcp-up-max": max(s["up"] for s in segs),
            "tcp-up-reply": mean(lambda s: s["by-category"]["reply"]["up"]),
            "tcp-up-poll": mean(lambda s: s["by-category"]["poll"]["up"]),
            "tcp-up-receive": mean(lambda s: s["by-category"]["receive"]["up"]),
            "tcp-up-rest": mean(lambda s: s["up"] - s["by-category"]["reply"]["up"]
                                - s["by-category"]["poll"]["up"]
                                - s["by-category"]["receive"]["up"]),
            "tcp-down-receive": mean(lambda s: s["by-category"]["receive"]["down"]),
            "tcp-down-setup": mean(lambda s: s["by-category"]["run-setup"]["down"]),
            "requests": mean(lambda s: s["requests"]),
            "tcp-up-http-heads": mean(lambda s: s["up-head"]),
            "seconds": mean(lambda s: s["seconds"]),
            "strategy-reply": reply, "overhead-up": up - reply,
            "reply-framing-up": mean(lambda s: s["by-category"]["reply"]["up"]) - reply})
    return rows


def summary(res: dict[str, Any]) -> dict[str, Any]:
    rows = per_round(res)
    steady = rows[1:] or rows

    def avg(key: str, rs: list[dict[str, Any]]) -> float:
        return sum(r[key] for r in rs) / len(rs)

    keys = [k for k in rows[0] if k != "round"]
    nodes = res["per-node"]
    before = [node["rounds"]["before"] for node in nodes]
    return {"rounds": rows, "round-1": rows[0],
            "steady": {k: avg(k, steady) for k in keys},
            "before-round-1": {"up": sum(b["up"] for b in before) / len(nodes),
                               "down": sum(b["down"] for b in before) / len(nodes)},
            "idle-up-per-s": sum(n["idle"]["up-per-s"] for n in nodes) / len(nodes),
            "idle-down-per-s": sum(n["idle"]["down-per-s"] for n in nodes) / len(nodes)}


def report(results: list[dict[str, Any]]) -> str:
    """Markdown tables: per round (mean per node) and FedAvg/RPS ratios."""
    head = ["model", "config", "round", "s", "TCP up", "TCP down", "reply (strategy)",
            "up besides the reply", "= reply framing", "+ model download requests",
            "+ polling", "+ rest", "HTTP requests", "HTTP heads up"]
    lines = ["**Per node and round** (bytes, mean over the nodes)", "",
             "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for res in results:
        for row in res["summary"]["rounds"]:
            lines.append("| " + " | ".join([
                res["model"], res["config"], str(row["round"]), f"{row['seconds']:.1f}",
                f"{row['tcp-up']:,.0f}", f"{row['tcp-down']:,.0f}",
                f"{row['strategy-reply']:,.0f}", f"{row['overhead-up']:,.0f}",
                f"{row['reply-framing-up']:,.0f}", f"{row['tcp-up-receive']:,.0f}",
                f"{row['tcp-up-poll']:,.0f}", f"{row['tcp-up-rest']:,.0f}",
                f"{row['requests']:.1f}", f"{row['tcp-up-http-heads']:,.0f}"]) + " |")
    lines += ["", "**Idle and setup** (bytes per node)", "",
              "| model | config | before round 1 up | before round 1 down | idle up / s "
              "| idle down / s |", "| --- | --- | --- | --- | --- | --- |"]
    for res in results:
        s = res["summary"]
        lines.append(f"| {res['model']} | {res['config']} | "
                     f"{s['before-round-1']['up']:,.0f} | {s['before-round-1']['down']:,.0f} | "
                     f"{s['idle-up-per-s']:,.1f} | {s['idle-down-per-s']:,.1f} |")
    lines += ["", "**FedAvg / Rand-Proj-Spatial** (per node; round 1 and the mean of the "
              "later rounds)", "",
              "| model | config | rounds | TCP up | reply bytes (strategy) | reply on TCP "
              "| TCP up+down |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for res in results:
        if res["config"] == "fedavg":
            continue
        base = next((b for b in results if b["model"] == res["model"]
                     and b["config"] == "fedavg"), None)
        if base is None:
            continue
        for label, a, b in (("1", base["summary"]["round-1"], res["summary"]["round-1"]),
                            ("2+", base["summary"]["steady"], res["summary"]["steady"])):
            lines.append(
                f"| {res['model']} | {res['config']} | {label} | "
                f"{a['tcp-up'] / b['tcp-up']:.1f}x | "
                f"{a['strategy-reply'] / b['strategy-reply']:.1f}x | "
                f"{a['tcp-up-reply'] / b['tcp-up-reply']:.1f}x | "
                f"{(a['tcp-up'] + a['tcp-down']) / (b['tcp-up'] + b['tcp-down']):.2f}x |")
    return "\n".join(lines)


def environment() -> dict[str, Any]:
    cpu = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    versions = {}
    for dist in ("flwr", "rpsagg", "rpsagg-flower", "torch", "numpy", "httpx", "uvicorn"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[dist] = metadata.version(dist)
    return {"machine": f"2-core x86 development machine (nproc {os.cpu_count()})"
            if os.cpu_count() == 2 else f"nproc {os.cpu_count()}",
            "platform": platform.platform(), "python": platform.python_version(), "cpu": cpu,
            "cpu-count": os.cpu_count(), "versions": versions}


def save(out: Path, command: str, started: float, results: list[dict[str, Any]],
         table: str) -> None:
    """Write the JSON file: the command, date, machine and versions, the results (less
    each segment's ``by-category``) and the printed tables."""
    out.parent.mkdir(parents=True, exist_ok=True)
    for res in results:  # by-category is by-path summed (CATEGORY): left out of the file
        for node in res["per-node"]:
            for seg in node["rounds"].values():
                del seg["by-category"]
    out.write_text(json.dumps({
        "command": command, "date": datetime.date.today().isoformat(),
        "environment": environment(), "wall-seconds": time.monotonic() - started,
        "counted": "TCP payload bytes through a proxy per SuperNode (HTTP/1.1 start lines, "
                   "headers, bodies); not TCP/IP headers, handshakes or acknowledgements",
        "request-heads": "per request path, the header names of one request of node 0 and "
                         "their values' lengths",
        "results": results, "table": table}, indent=1))
