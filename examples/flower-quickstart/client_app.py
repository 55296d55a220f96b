"""ClientApp: linear regression on this node's data; rpsagg_mod compresses the update."""

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from rpsagg_flower import rpsagg_mod

app = ClientApp(mods=[rpsagg_mod])  # compresses every training reply


def local_data(node_id: int) -> tuple[np.ndarray, np.ndarray]:
    """200 examples y = x @ W + b + noise: one W and b for all nodes, x of this node."""
    truth = np.random.default_rng(0)
    w, b = truth.standard_normal((100, 10)), truth.standard_normal(10)
    rng = np.random.default_rng(node_id)
    x = rng.standard_normal((200, 100))
    return x, x @ w + b + 0.1 * rng.standard_normal((200, 10))


def mse(arrays: ArrayRecord, x: np.ndarray, y: np.ndarray) -> float:
    """The model's mean squared error on (x, y)."""
    w, b = arrays["weight"].numpy(), arrays["bias"].numpy()
    return float(np.mean((x @ w + b - y) ** 2))


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Five steps of gradient descent from the received model; reply with the new one."""
    x, y = local_data(context.node_id)
    arrays = msg.content.array_records["arrays"]
    w = arrays["weight"].numpy().astype(np.float64)
    b = arrays["bias"].numpy().astype(np.float64)
    for _ in range(5):
        err = x @ w + b - y
        w -= 0.1 * x.T @ err / len(x)
        b -= 0.1 * err.mean(axis=0)
    new = ArrayRecord({"weight": Array(w.astype(np.float32)),
                       "bias": Array(b.astype(np.float32))})
    metrics = MetricRecord({"train-loss": mse(new, x, y), "num-examples": len(x)})
    return Message(RecordDict({"arrays": new, "metrics": metrics}), reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """The received (global) model's loss on this node's data."""
    x, y = local_data(context.node_id)
    loss = mse(msg.content.array_records["arrays"], x, y)
    metrics = MetricRecord({"eval-loss": loss, "num-examples": len(x)})
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)
