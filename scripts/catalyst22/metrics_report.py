"""What the metrics_*.py scripts print last: one JSON line of metric values and a checksum of the final weights,
the same under torchstage and under Catalyst 22.04 (see metrics_reference.py), so the tests can compare them."""
import hashlib
import json

import torch


def weights_sha256(model: torch.nn.Module) -> str:
    """SHA-256 of the state dict's tensors, in key order: equal only for bitwise-equal weights."""
    digest = hashlib.sha256()
    for key, value in sorted(model.state_dict().items()):
        digest.update(key.encode())
        digest.update(value.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def report(metrics: dict, model: torch.nn.Module = None, **extra) -> None:
    """Print ``RESULT {json}``: ``metrics`` as floats, the weights' checksum, and ``extra`` values as given."""
    result = {"metrics": {key: float(value) for key, value in sorted(metrics.items())}, **extra}
    if model is not None:
        result["weights_sha256"] = weights_sha256(model)
    print("RESULT " + json.dumps(result, sort_keys=True))
