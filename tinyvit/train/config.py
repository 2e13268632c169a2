"""What a training run is: ``TrainConfig``, saved in every checkpoint."""

import dataclasses
import os
from pathlib import Path

from ..backend import BACKENDS
from ..checks import check_fields, check_number_types, type_name
from ..data import dataset_info
from ..models import preset_config


class RunRefused(ValueError):
    """A run that cannot train as configured, on its data or the machine it runs on (no full
    batch, more processes than images in a batch, more memory than there is); the
    message says what to change."""


@dataclasses.dataclass
class TrainConfig:
    """Everything that defines a run (saved in every checkpoint)."""

    dataset: str = "mnist"
    model: str = "mnist"  # a preset of tinyvit.models.PRESETS
    model_overrides: dict = dataclasses.field(default_factory=dict)  # e.g. {"depth": 6}
    epochs: int = 18
    batch_size: int = 128
    optimizer: str = "adamw"  # or "sgd" (momentum 0.9, Nesterov)
    lr: float = 3e-3  # peak learning rate
    min_lr: float = 0.0
    warmup_epochs: float = 1.0
    weight_decay: float = 0.05
    label_smoothing: float = 0.1
    clip_grad: float = 0.0  # max global gradient norm; 0 = no clipping
    max_shift: int = 1  # random translation by up to this many pixels (0 = off)
    flip: bool = False  # random horizontal flip
    erasing: float = 0.0  # random erasing probability
    mixup: float = 0.0  # mixup alpha (0 = off)
    cutmix: float = 0.0  # cutmix alpha (0 = off); with both, each batch picks one
    seed: int = 0
    data_dir: str = None
    out_dir: str = "runs/mnist"
    backend: str = "numpy"
    eval_batch_size: int = 500
    eval_every: int = 1  # epochs between test evaluations (the last epoch is always evaluated)
    workers: int = 1  # processes sharing each batch (train/parallel.py; NumPy only); 1 = this one
    log_every: int = 20  # steps between progress-bar updates (host transfers)
    train_subset: int = 0  # use only the first N training images (0 = all)
    test_subset: int = 0
    init: str = None  # start from these weights: any file or folder tinyvit.weights reads
    reset_head: bool = False  # with init: a zero head even when the class count is the file's
    freeze_backbone: bool = False  # train the head alone (a linear probe)
    budget: float = 0.0  # minutes for the whole run: epochs planned after the first (0: off)
    tier: str = "fast"  # "fast": the kernels of tinyvit.fast; "reference": the layers as written
    cuda_graph: bool = False  # capture the step on the GPU in a CUDA graph (tinyvit.fast.graphs)

    def __post_init__(self):
        """Every value is checked here, so that a bad one is named before a run starts."""
        check_number_types(self)
        check_paths(self, ("data_dir", "out_dir", "init"))
        if not isinstance(self.model_overrides, dict):
            raise ValueError(f"model_overrides must be a dict of ViTConfig fields, got "
                             f"{self.model_overrides!r} ({type_name(self.model_overrides)})")
        if self.init is None:  # with init, the weights' file is read when the run starts
            self.model_config()  # the dataset, the preset and its overrides
        if self.optimizer not in ("adamw", "sgd"):
            raise ValueError(f"optimizer must be 'adamw' or 'sgd', got {self.optimizer!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.tier not in ("fast", "reference"):
            raise ValueError(f"tier must be 'fast' or 'reference', got {self.tier!r}")
        if self.cuda_graph:
            self.check_cuda_graph()
        check_fields(self, ("epochs", "batch_size", "eval_batch_size", "eval_every", "log_every",
                            "workers"),
                     lambda n: n >= 1, "at least 1")
        check_fields(self, ("lr",), lambda x: x > 0, "positive")
        check_fields(self, ("min_lr", "warmup_epochs", "weight_decay", "clip_grad", "max_shift",
                            "mixup", "cutmix", "train_subset", "test_subset", "budget"),
                     lambda x: x >= 0, "at least 0")
        if self.min_lr > self.lr:
            raise ValueError(f"min_lr must be at most lr (the schedule decays from lr to "
                             f"min_lr), got min_lr {self.min_lr:g} and lr {self.lr:g}")
        check_fields(self, ("label_smoothing",), lambda p: 0.0 <= p < 1.0, "in [0, 1)")
        check_fields(self, ("erasing",), lambda p: 0.0 <= p <= 1.0, "in [0, 1]")
        check_fields(self, ("seed",), lambda n: n >= 0, "at least 0")  # as NumPy's seeds
        if self.reset_head and self.init is None:
            raise ValueError("reset_head: a zero head for the weights of init, but no init is "
                             "given (--reset-head goes with --init)")
        if self.data_dir:  # kept in the checkpoints: a resumed run may start in another folder
            self.data_dir = os.path.abspath(os.path.expanduser(self.data_dir))
        self.out_dir = os.path.expanduser(self.out_dir)  # "~/runs" quoted, as a shell would

    def check_cuda_graph(self):
        """A CUDA graph captures the fast tier's kernels on a GPU, AdamW's included (its
        learning rate read from device memory), in one process."""
        needs = {"backend": "cupy", "tier": "fast", "optimizer": "adamw", "workers": 1}
        for field, value in needs.items():
            if getattr(self, field) != value:
                raise ValueError(f"cuda_graph needs {field} {value!r}, got "
                                 f"{getattr(self, field)!r}")

    def model_fields(self):
        """The ViTConfig fields the run sets: the dataset's channels, image size and
        classes, then ``model_overrides``."""
        return {**dataset_info(self.dataset).model_fields(), **self.model_overrides}

    def model_config(self):
        """The ViT config of a run from a preset: the preset with ``model_fields``."""
        return preset_config(self.model, **self.model_fields())

    def image_size(self):
        """The side of the images the model sees (batches are resized to it)."""
        return self.model_fields()["image_size"]


def check_paths(config, names):
    """Each of the fields ``names`` a path (a str or an os.PathLike, kept as str), or None
    where None is its default."""
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if field.name not in names or (value is None and field.default is None):
            continue
        if not isinstance(value, (str, os.PathLike)):
            raise ValueError(f"{field.name} must be a path (a str), got {value!r} "
                             f"({type_name(value)})")
        setattr(config, field.name, os.fspath(value))


def check_out_folder(path):
    """A RunRefused unless the run's folder ``path`` is a folder or can become one: not a
    file, and no file where a folder above it would be. Checked where a run starts to
    write, not in the config: a checkpoint's saved out_dir is no destination."""
    for folder in (Path(path), *Path(path).parents):
        if folder.is_symlink() and not folder.exists():
            raise RunRefused(f"out_dir: expected a folder, but {folder} is a link to "
                             f"{os.readlink(folder)}, which does not exist")
        if folder.exists():
            if not folder.is_dir():
                what = "is" if folder == Path(path) else f"has {folder}, which is"
                raise RunRefused(f"out_dir: expected a folder, but {path} {what} a file")
            return
