"""torchvision classification models by name (``torchvision:resnet18``, ``torchvision:vit_b_16``),
with random weights (``weights=None``): nothing downloads.

Built with torchvision's documented API (``torchvision.models.list_models``, ``get_model``) and
trained on perfkit's image task (a class prototype plus noise, cross-entropy over the logits).
``model_size`` gives ``get_model``'s keyword arguments (``num_classes``, ...) and the images'
``image_size`` (default 224). Where torchvision does not import (on these CPU machines PyPI's
torchvision is a CUDA build whose ``_C.so`` needs ``libtorch_cuda.so``: "operator
torchvision::nms does not exist"), a ``torchvision:`` model is refused with that reason before
any work.
"""

from __future__ import annotations

import difflib
import functools
import math

import torch
import torch.nn.functional as F

from perfkit.core.errors import BadInputError
from perfkit.measuring.workloads.user import (UserModelSpec, find_blocks, image_task, non_embedding_params,
                                              seed_generator_batch)
from perfkit.measuring.workloads.workload import Workload, constructing_on

__all__ = ["check_torchvision", "build_torchvision"]


@functools.lru_cache(maxsize=1)
def _torchvision():
    try:
        import torchvision
        import torchvision.models
    except Exception as err:  # noqa: BLE001 - ImportError, or a RuntimeError from a mismatched _C.so
        raise BadInputError(
            f"torchvision: models need a torchvision built for this torch ({torch.__version__}), and it "
            f"does not import here ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); "
            "install the matching build (pip install 'perfkit[torchvision]' on a GPU node), or use "
            "hf:resnet / hf:vit") from None
    return torchvision


def _image_size(sizes: dict) -> int:
    return int(sizes.pop("image_size", 224))


def check_torchvision(spec: UserModelSpec) -> None:
    """Refuse a torchvision model that does not exist, or a torchvision that does not import."""
    names = _torchvision().models.list_models()
    if spec.target not in names:
        close = difflib.get_close_matches(spec.target, names, n=5)
        hint = f"; close: {', '.join(close)}" if close else ""
        raise BadInputError(f"torchvision:{spec.target}: torchvision has no model {spec.target!r}{hint}")


def build_torchvision(spec: UserModelSpec, *, device="cpu", dtype=torch.float32) -> Workload:
    """The workload of ``torchvision:<name>`` (``weights=None``), on ``device`` in ``dtype``."""
    check_torchvision(spec)
    sizes = spec.sizes
    image_size = _image_size(sizes)
    with torch.random.fork_rng(devices=[]), constructing_on(device):
        torch.manual_seed(spec.seed)
        model = _torchvision().models.get_model(spec.target, weights=None, **sizes)
    batch = image_task(3, image_size, int(sizes.get("num_classes", 1000)), spec.seed)

    def loss(output, targets):
        logits = output.logits if hasattr(output, "logits") else output  # inception's tuple-like output
        return F.cross_entropy(logits.float(), targets)

    return Workload(
        spec=spec, model=model.to(device=device, dtype=dtype), loss_fn=loss,
        n_params=sum(p.numel() for p in model.parameters()), n_params_non_embedding=non_embedding_params(model),
        flop_per_sample=math.nan, flop_reason=f"no analytic FLOP model for {spec.name}",
        block_names=find_blocks(model), family="torchvision", _batch=seed_generator_batch(batch))
