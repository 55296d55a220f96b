"""ServerApp: FedAvg whose model updates arrive compressed by Rand-Proj-Spatial."""

import numpy as np
from flwr.app import Array, ArrayRecord, Context
from flwr.serverapp import Grid, ServerApp

from rpsagg_flower import CompressionConfig, RandProjSpatialFedAvg

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Train the linear model; print each round's compression and loss."""
    rounds = int(context.run_config["num-server-rounds"])
    compression = CompressionConfig("rand-proj-spatial", k=int(context.run_config["k"]))
    strategy = RandProjSpatialFedAvg(compression)  # and FedAvg's own arguments, as FedAvg
    arrays = ArrayRecord({"weight": Array(np.zeros((100, 10), np.float32)),
                          "bias": Array(np.zeros(10, np.float32))})  # d = 1,010
    result = strategy.start(grid=grid, initial_arrays=arrays, num_rounds=rounds)
    for rnd in range(1, rounds + 1):
        ratio = result.train_metrics_clientapp[rnd]["rpsagg.compression-ratio"]
        loss = result.evaluate_metrics_clientapp[rnd]["eval-loss"]
        print(f"round {rnd}: {ratio:.2f}x fewer bytes up than FedAvg, eval-loss {loss:.2f}")
