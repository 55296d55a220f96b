"""The runs: a local federation whose SuperNodes reach the SuperLink through counting
proxies (:class:`ProxiedFederation`), the configurations, and one configuration's run and
its per-node accounting (:func:`run_one`)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from federation import LocalFederation, _tool, free_port

from linkbytes.proxy import LinkProxy
from linkbytes.rounds import PULL, segment
from linkbytes.wideapp import wide_app

#: the example's folder: the Flower app of ``--models cnn`` and ``mlp``
HERE = Path(__file__).resolve().parent.parent

CONFIGS: dict[str, dict[str, dict[str, Any]]] = {
    "cnn": {
        "fedavg": {"method": "fedavg"},
        "rps-k4096-4bit": {"method": "rand-proj-spatial", "k": 4096, "value-bits": 4},
        "rps-k2058": {"method": "rand-proj-spatial", "k": 2058, "value-bits": 32},
    },
    "mlp": {  # frontier.py's 100x and 300x budgets (in-process replies)
        "fedavg": {"method": "fedavg"},
        "rps-k15238-4bit": {"method": "rand-proj-spatial", "k": 15238, "value-bits": 4},
        "rps-k4352-4bit": {"method": "rand-proj-spatial", "k": 4352, "value-bits": 4},
    },
    "wide": {
        "fedavg": {"method": "fedavg"},
        "rps-k20020": {"method": "rand-proj-spatial", "k": 20020, "value-bits": 32},
    },
}
DEFAULT_CONFIGS = {"cnn": ["fedavg", "rps-k4096-4bit", "rps-k2058"],
                   "mlp": ["fedavg", "rps-k15238-4bit", "rps-k4352-4bit"],
                   "wide": ["fedavg", "rps-k20020"]}


class ProxiedFederation(LocalFederation):
    """:class:`federation.LocalFederation` (deployment engine) whose SuperNode ``i``
    reaches the SuperLink through ``proxies[i]``, a :class:`LinkProxy` of its own."""

    def __init__(self, nodes: int, workdir: Path | None = None,
                 startup_timeout: float = 60.0) -> None:
        super().__init__(nodes, workdir, startup_timeout)
        self.proxies: list[LinkProxy] = []

    def start(self) -> ProxiedFederation:
        nodes, self.nodes = self.nodes, 0
        try:
            super().start()  # the SuperLink alone
        finally:
            self.nodes = nodes
        for i in range(self.nodes):
            proxy = LinkProxy(("127.0.0.1", self.port), http=True, keep_bodies=[PULL])
            self.proxies.append(proxy.start())
            self._spawn(f"supernode-{i}", [
                _tool("flower-supernode"), "--insecure", "--superlink",
                f"127.0.0.1:{proxy.port}", "--port", str(free_port()),
                "--node-config", f"partition-id={i} num-partitions={self.nodes}",
            ], home=self.home / f"node-{i}")
        return self

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            for proxy in self.proxies:
                proxy.stop()

    def __enter__(self) -> ProxiedFederation:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise


def run_one(model: str, name: str, nodes: int, rounds: int, idle: float, work: Path,
            timeout: float) -> dict[str, Any]:
    """One configuration on a fresh federation behind proxies: the run, then ``idle``
    seconds of the nodes' polling alone."""
    cfg = CONFIGS[model][name]
    results = work / f"{model}-{name}.json"
    if model in ("cnn", "mlp"):
        app = HERE
        run_config: dict[str, object] = {
            "model": model, "k": 785, "value-bits": 32, **cfg, "clients": nodes,
            "num-server-rounds": rounds, "examples-per-client": 64, "lr": 0.01,
            "batch-size": 32, "seed": 1, "results-path": str(results)}
    else:
        app = wide_app(work)
        run_config = {"k": 20020, "value-bits": 32, **cfg, "clients": nodes,
                      "num-server-rounds": rounds, "seed": 1, "examples-per-client": 200,
                      "results-path": str(results)}
    started = time.monotonic()
    with ProxiedFederation(nodes, workdir=work / f"fed-{model}-{name}") as fed:
        _wait_registered(fed, 60.0)
        t_run = time.monotonic()
        fed.run(app, run_config, timeout=timeout)
        t_end = time.monotonic()
        time.sleep(idle)
        t_idle = time.monotonic()
        per_node = []
        for i, proxy in enumerate(fed.proxies):
            segs = segment(proxy, t_run, t_end, rounds)
            raw_up, raw_down = proxy.totals()
            parsed_up = sum(e.up for e in proxy.exchanges)
            parsed_down = sum(e.down for e in proxy.exchanges)
            idle_up = sum(e.up for e in proxy.exchanges if e.t_request >= t_end)
            idle_down = sum(e.down for e in proxy.exchanges if e.t_request >= t_end)
            per_node.append({
                "node": i, "rounds": segs,
                "idle": {"seconds": t_idle - t_end, "up": idle_up, "down": idle_down,
                         "up-per-s": idle_up / (t_idle - t_end),
                         "down-per-s": idle_down / (t_idle - t_end)},
                "tcp-total": {"up": raw_up, "down": raw_down},
                "http-total": {"up": parsed_up, "down": parsed_down},
                "connections": proxy.connections, "parse-errors": proxy.parse_errors})
        heads = fed.proxies[0].sample_heads if fed.proxies else {}
    out = json.loads(results.read_text())
    return {"model": model, "config": name, "run-config": run_config, "d": out["d"],
            "nodes": nodes, "rounds": rounds,
            "strategy-bytes-up": {r: out["rounds"][r]["rpsagg.bytes-up"]
                                  for r in map(str, range(1, rounds + 1))},
            "per-node": per_node, "request-heads": heads, "run-seconds": t_end - t_run,
            "wall-seconds": time.monotonic() - started}


def _wait_registered(fed: ProxiedFederation, timeout: float) -> None:
    """Until every SuperNode has activated itself at the SuperLink (through its proxy)."""
    deadline = time.monotonic() + timeout
    while not all(any(e.path == "/v1/fleet/activate-node" and e.t_response is not None
                      for e in p.exchanges) for p in fed.proxies):
        for proc in fed.procs:
            if proc.poll() is not None:
                raise RuntimeError(f"a federation process exited with {proc.returncode}; "
                                   f"see {fed.workdir}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the SuperNodes did not register within {timeout} s")
        time.sleep(0.2)
