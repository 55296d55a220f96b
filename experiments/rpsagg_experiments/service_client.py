"""A client process for ``--via-service``: the experiment's shard and seed rule over gRPC.

``rpsagg-client`` shards the data in contiguous blocks and draws a random client seed per
submission; to replay a service run in-process exactly, this client uses the experiment's
split (:func:`rpsagg_experiments.optimization.run_shards`) and passes
``client_seed(run, task_step, index)`` to :meth:`AggregationClient.encode`. It writes, per
round, the nonce and (for index 0) the server's estimate to a JSON file.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from rpsagg_experiments.optimization import (
    Job,
    build_task,
    client_seed,
    load_dataset,
    run_shards,
)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: ``python -m rpsagg_experiments.service_client ...``."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--server", required=True)
    p.add_argument("--client-id", required=True)
    p.add_argument("--task", required=True)
    p.add_argument("--split", required=True)
    p.add_argument("--n", type=int, required=True)
    p.add_argument("--k", type=int, required=True)
    p.add_argument("--run", type=int, required=True)
    p.add_argument("--data-path", default=None)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)

    from rpsagg_client.client import AggregationClient

    job = Job(args.task, args.split, args.n, args.k, "rand-k", args.run, 0, args.data_path)
    data = load_dataset(args.task, args.data_path)
    record: dict[str, object] = {"client_id": args.client_id, "rounds": []}
    rounds: list[dict[str, object]] = []
    with AggregationClient(args.server, args.client_id, insecure=True, timeout=60.0,
                           wait_timeout=600.0) as client:
        joined = client.join()
        task = build_task(args.task, tuple(joined.task_params.items()))  # the server's params
        index = joined.client_index
        record["index"] = index
        shard = run_shards(job, data)[index]
        for rnd in client.rounds():
            assert rnd.global_state is not None
            vectors = task.client_vectors(rnd.global_state, shard, rnd.task_step)
            sub = client.encode(rnd, vectors, client_seed(args.run, rnd.task_step, index))
            client.submit_encoded(sub)
            entry: dict[str, object] = {"round_id": rnd.round_id, "step": rnd.task_step,
                                        "nonce": str(rnd.nonce)}
            if index == 0:
                res = client.result(rnd.round_id, wait=True)
                assert res.estimate is not None
                entry["estimate"] = res.estimate.tolist()
                entry["n_prime"] = res.n_prime
            rounds.append(entry)
    record["rounds"] = rounds
    args.out.write_text(json.dumps(record))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
