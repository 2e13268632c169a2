"""The runners, behind one interface: tinyvit's layers of one tier (``TinyvitRunner``), the same
ViT in PyTorch eager (``TorchRunner``) and tinyvit from another source tree in a child process
(``BaselineRunner``); the configs and the batch they run; the check that they all compute the
same function.

Every runner trains and infers on the same float32 batch from the same weights (every tinyvit
model from seed 0; the torch model is ``tests/torch_reference.torch_vit_from(model, float32)``):

- train step: ``zero_grad``, forward, softmax cross-entropy with label smoothing 0.1,
  backward, AdamW (lr 1e-3, weight decay 0.05 on Linear and patch-embedding weights only:
  tinyvit's flat decay mask, torch param groups);
- inference: tinyvit ``model.eval()`` then ``model.forward(x)``; torch ``model.eval()`` under
  ``torch.inference_mode()``.

The "graph" tier (runner tinyvit-graph, on a GPU) is the fast tier with its training step's
device part, and its inference, captured in CUDA graphs (``tinyvit.fast.graphs``) and replayed.

Each ``--tiers`` runner builds tinyvit's layers of its tier (a layer's tier is fixed when it is
built; with ``--workers`` each worker builds its replica in the same tier). Before timing, one
batch goes through every model: each one's logits (train and eval mode) must agree with the
first tinyvit runner's to 1e-4 of their scale and the losses to 1e-5, or the script aborts.
"""

import dataclasses
import importlib
import importlib.util
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import numpy as np

from machine import blas_threads, torch, torch_sync
from tinyvit import backend
from tinyvit.fast import for_tier
from tinyvit.fast.graphs import Captured
from tinyvit.models import ViT, ViTConfig
from tinyvit.nn.loss import SoftmaxCrossEntropy
from tinyvit.nn.optim import AdamW
from tinyvit.train.gradients import forward_backward
from tinyvit.train.parallel import DataParallel

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # torch_reference.py lives with the tests
SCRIPT = Path(__file__).with_name("benchmark.py")  # the command; its child processes run it too

CONFIGS = {
    "A": ViTConfig(image_size=28, patch_size=7, in_channels=1, embed_dim=64, depth=4,
                   num_heads=4, mlp_ratio=2.0, num_classes=10),
    "B": ViTConfig(image_size=28, patch_size=4, in_channels=1, embed_dim=128, depth=6,
                   num_heads=4, mlp_ratio=2.0, num_classes=10),
    "C": ViTConfig(image_size=32, patch_size=4, in_channels=3, embed_dim=192, depth=6,
                   num_heads=3, mlp_ratio=2.0, num_classes=10),
}
LR, WEIGHT_DECAY, LABEL_SMOOTHING = 1e-3, 0.05, 0.1
LOGITS_TOL, LOSS_TOL = 1e-4, 1e-5
RUNNER_NAMES = {"fast": "tinyvit", "reference": "tinyvit-reference",  # tier -> runner's name
                "graph": "tinyvit-graph"}
TIER_OF = {name: tier for tier, name in RUNNER_NAMES.items()}


def make_batch(config, batch):
    """A fixed float32 batch of normalized-looking images and integer labels (host)."""
    rng = np.random.default_rng(1)
    shape = (batch, config.in_channels, config.image_size, config.image_size)
    return rng.standard_normal(shape, dtype=np.float32), rng.integers(0, config.num_classes, batch)


class TinyvitRunner:
    """tinyvit's layers of one tier ("fast" or "reference") in this process, or with
    ``workers > 1`` its training step and inference split over worker processes
    (``tinyvit.train.parallel``, as ``train_mnist.py`` trains)."""

    def __init__(self, config, images, labels, workers=1, tier="fast"):
        self.tier, self.name = tier, RUNNER_NAMES[tier]
        self.tiered = for_tier("fast" if tier == "graph" else tier)  # as the trainer's
        self.model = self.tiered(ViT(config, seed=0, dtype=np.float32))
        self.x, self.y = backend.to_device(images), backend.to_device(labels)
        self.loss_fn = self.tiered(SoftmaxCrossEntropy(label_smoothing=LABEL_SMOOTHING))
        self.optimizer = None
        self.workers, self.parallel = workers, None
        self.update, self.forward = self.device_step, self.eval_forward
        if tier == "graph":
            self.update, self.forward = Captured(self.device_step), Captured(self.eval_forward)

    def decay_names(self):
        """State-dict keys of the parameters AdamW decays (state_dict follows parameters())."""
        return {k for k, p in zip(self.model.state_dict(), self.model.parameters()) if p.decay}

    def start_workers(self):
        """With ``workers > 1``, start them (once)."""
        if self.workers > 1 and self.parallel is None:  # the workers run the model's tier
            self.parallel = DataParallel(self.model, self.workers, len(self.x)).__enter__()
            self.targets = self.loss_fn.targets(self.y, self.model.config.num_classes, self.x.dtype)

    def prepare_training(self):
        self.optimizer = self.tiered(AdamW(self.model, lr=LR, weight_decay=WEIGHT_DECAY))
        self.start_workers()

    def close(self):
        if self.parallel is not None:
            self.parallel.__exit__(None, None, None)

    def set_training(self, mode):
        self.model.train(mode)

    def train_step(self):
        self.optimizer.advance()
        if self.parallel is None:
            self.model.seed_dropout(0)
            loss, = self.update(self.x, self.y)
        else:  # the workers' gradients, combined in the model's gradient buffer
            loss, _ = self.parallel.gradients(self.x, self.targets)
            self.optimizer.update()
        self.last_loss = loss
        return loss

    def device_step(self, x, y):
        """The training step on the device: forward, loss, backward, AdamW's update."""
        loss, _ = forward_backward(self.model, self.loss_fn, x, y)
        self.optimizer.update()
        return (loss,)

    def eval_forward(self, x):
        return (self.model.forward(x),)

    def infer(self):
        return self.forward(self.x)[0] if self.parallel is None else self.parallel.forward(self.x)

    def logits_and_loss(self):
        """Host logits and loss of a forward in the current mode (for the check)."""
        logits = self.model.forward(self.x)
        return backend.to_host(logits), float(backend.to_host(self.loss_fn.forward(logits, self.y)))

    def final_loss(self):
        return float(backend.to_host(self.last_loss))

    sync = staticmethod(backend.synchronize)


class TorchRunner:
    name = "torch"

    def __init__(self, tinyvit_model, decay_names, images, labels, gpu):
        from torch_reference import torch_vit_from

        self.device = "cuda" if gpu else "cpu"
        self.model = torch_vit_from(tinyvit_model, torch.float32).to(self.device)
        self.x = torch.from_numpy(images).to(self.device)
        self.y = torch.from_numpy(labels).to(self.device)
        self.decay_names = decay_names
        self.sync = torch_sync(gpu)
        self.optimizer = None

    def close(self):
        """Nothing to stop: torch runs in this process."""

    def prepare_training(self):
        params = dict(self.model.named_parameters())
        unknown = self.decay_names - set(params)
        if unknown:
            raise RuntimeError(
                f"decayed tinyvit parameters missing from the torch model: {sorted(unknown)}"
            )
        decay = [p for n, p in params.items() if n in self.decay_names]
        no_decay = [p for n, p in params.items() if n not in self.decay_names]
        groups = [{"params": decay, "weight_decay": WEIGHT_DECAY},
                  {"params": no_decay, "weight_decay": 0.0}]
        self.optimizer = torch.optim.AdamW(groups, lr=LR)

    def set_training(self, mode):
        self.model.train(mode)

    def loss(self, logits):
        return torch.nn.functional.cross_entropy(logits, self.y, label_smoothing=LABEL_SMOOTHING)

    def train_step(self):
        self.model.zero_grad()
        loss = self.loss(self.model(self.x))
        loss.backward()
        self.optimizer.step()
        self.last_loss = loss
        return loss

    def infer(self):
        with torch.inference_mode():
            return self.model(self.x)

    def logits_and_loss(self):
        with torch.no_grad():
            logits = self.model(self.x)
            loss = self.loss(logits)
        return logits.cpu().numpy(), float(loss)

    def final_loss(self):
        return self.last_loss.item()


class BaselineRunner:
    """tinyvit from the source tree ``root`` (``--baseline``), timed in a child process.

    One process cannot import two packages named tinyvit, so the child is benchmark.py
    with ``--baseline-worker`` (``measure.baseline_worker``), started per config. It puts
    ``root`` first on ``sys.path``, imports that tree's tinyvit (``import_baseline``) and
    builds the same config (the fields both versions have), seed, dtype, batch, loss and
    optimizer as the tinyvit runners (``BaselineSteps``), with this process's OpenBLAS thread
    count (checked), the same allocator settings and its tree's default tier of layers
    (``TINYVIT_REFERENCE`` is removed from its environment). On the CPU only, in one process.

    One JSON line per command goes to its stdin and one reply comes back on its stdout:

        {"do": "train" | "infer", "n": k}    -> {"ms": [k step times], "loss": latest}
        {"do": "logits", "training": mode}   -> {"logits": [[...], ...], "loss": loss}

    The child times each step itself, as ``measure.time_calls`` does, so that neither the
    pipe nor this process's waiting is counted, and the interleaving is the same as for the
    other runners. Its errors go to this process's stderr."""

    def __init__(self, root, label, config_name, batch):
        self.name = f"tinyvit@{label}"
        self.training, self.last_loss = True, None
        env = {**os.environ, "OPENBLAS_NUM_THREADS": str(blas_threads())}  # this process's count
        env.pop("TINYVIT_REFERENCE", None)  # a tree that reads it builds its default layers
        command = [sys.executable, str(SCRIPT), "--baseline-worker", str(root),
                   "--configs", config_name, "--batch", str(batch)]
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True, env=env)
        threads = self._receive("its start")["blas_threads"]
        if threads != blas_threads():
            self.close()
            raise RuntimeError(f"{self.name}: expected {blas_threads()} BLAS thread(s) in the "
                               f"baseline process, as in this one; got {threads}")

    def _receive(self, what):
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.name}: the baseline process exited (rc "
                               f"{self.process.wait()}) instead of answering {what} "
                               "(its error, if any, is printed above)")
        return json.loads(line)

    def _ask(self, command):
        try:
            self.process.stdin.write(json.dumps(command) + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            pass  # the child is gone: _receive reports it
        return self._receive(command)

    def set_training(self, mode):
        self.training = mode  # sent with the next logits command

    def prepare_training(self):
        """Nothing to do: the child builds its optimizer when it starts."""

    def time_phase(self, phase, n):
        reply = self._ask({"do": phase, "n": n})
        self.last_loss = reply["loss"]
        return reply["ms"]

    def logits_and_loss(self):
        reply = self._ask({"do": "logits", "training": self.training})
        return np.array(reply["logits"], dtype=np.float32), reply["loss"]

    def final_loss(self):
        return self.last_loss

    def close(self):
        if self.process.poll() is None:
            self.process.stdin.close()  # end of input: the child's loop ends
            self.process.wait()


# where a source tree keeps what the baseline builds: the ViT and its config, the loss,
# AdamW and loss_and_gradients; the packages by layer, then the flat package before them
BASELINE_LAYOUTS = (
    {"model": "tinyvit.models", "loss": "tinyvit.nn.loss", "optim": "tinyvit.nn.optim",
     "gradients": "tinyvit.train.gradients"},
    {"model": "tinyvit.model", "loss": "tinyvit.loss", "optim": "tinyvit.optim",
     "gradients": "tinyvit.loss"},
)


def found_in_tree(module, tree):
    """Whether ``module`` would be imported from the directory ``tree``. An editable
    install of this tree answers for the modules the imported tinyvit lacks, so a
    module that exists somewhere is not enough."""
    spec = importlib.util.find_spec(module)
    return (spec is not None and spec.origin is not None
            and Path(spec.origin).resolve().is_relative_to(tree))


def import_baseline(root):
    """The modules of the source tree ``root`` that the baseline builds from
    (``BASELINE_LAYOUTS``), in place of this tree's, and the tree's ``fast``
    package, None where it has none (only the baseline's child calls this:
    afterwards ``import tinyvit`` means the baseline's)."""
    for name in [m for m in sys.modules if m == "tinyvit" or m.startswith("tinyvit.")]:
        del sys.modules[name]  # this tree's, imported at the top of the script
    sys.path.insert(0, str(root))
    package = importlib.import_module("tinyvit")
    found, expected = Path(package.__file__).resolve().parent, (Path(root) / "tinyvit").resolve()
    if found != expected:
        raise RuntimeError(f"--baseline: expected tinyvit imported from {expected}, got {found}")
    layout = next((layout for layout in BASELINE_LAYOUTS
                   if found_in_tree(layout["model"], expected)), None)
    if layout is None:
        raise RuntimeError(f"--baseline: {root} keeps its ViT in none of "
                           f"{', '.join(layout['model'] for layout in BASELINE_LAYOUTS)}")
    modules = {role: importlib.import_module(name) for role, name in layout.items()}
    has_fast = found_in_tree("tinyvit.fast", expected)
    fast = importlib.import_module("tinyvit.fast") if has_fast else None
    return types.SimpleNamespace(**modules, fast=fast)


def baseline_config(config_class, config):
    """``config`` as the baseline's ``config_class``: the fields both versions have.
    A field the baseline lacks keeps its meaning only at its default; where that
    changes the model, the logits check catches it."""
    theirs = {f.name for f in dataclasses.fields(config_class)}
    return config_class(**{k: v for k, v in dataclasses.asdict(config).items() if k in theirs})


class BaselineSteps:
    """In the baseline's child: TinyvitRunner's training step and inference, with
    the same config, seed, dtype, batch, loss and optimizer, on the baseline's
    modules (``package``), on the CPU in one process."""

    def __init__(self, package, config, batch):
        self.model = package.model.ViT(baseline_config(package.model.ViTConfig, config), seed=0,
                                       dtype=np.float32)
        accelerate_model = getattr(package.fast, "accelerate", None)
        if accelerate_model:  # a tree whose models start as reference layers
            accelerate_model(self.model)
        self.x, self.y = make_batch(config, batch)
        self.loss_fn = package.loss.SoftmaxCrossEntropy(label_smoothing=LABEL_SMOOTHING)
        self.optimizer = package.optim.AdamW(self.model, lr=LR, weight_decay=WEIGHT_DECAY)
        self.loss_and_gradients = package.gradients.loss_and_gradients
        self.last_loss = None

    def set_training(self, mode):
        self.model.train(mode)

    def train_step(self):
        loss, _ = self.loss_and_gradients(self.model, self.loss_fn, self.x, self.y, seed=0)
        self.optimizer.step()
        self.last_loss = loss

    def infer(self):
        return self.model.forward(self.x)

    def logits_and_loss(self):
        logits = self.model.forward(self.x)
        return logits, float(self.loss_fn.forward(logits, self.y))

    def sync(self):
        """NumPy computes synchronously: nothing to wait for."""


def build_runners(name, args):
    """The runners of config ``name``, in the order they take turns: one tinyvit
    runner per tier of ``--tiers``, the ``--baseline`` tree's, then torch's (with
    the first tinyvit runner's weights)."""
    config = CONFIGS[name]
    images, labels = make_batch(config, args.batch)
    runners = [TinyvitRunner(config, images, labels, args.workers, t) for t in args.tiers]
    if args.baseline:
        runners.append(BaselineRunner(args.baseline, args.baseline_label, name, args.batch))
    if torch:
        first = runners[0]
        runners.append(TorchRunner(first.model, first.decay_names(), images, labels, args.gpu))
    return runners


def make_runner(framework, config, batch, gpu, workers=1):
    """The runner named ``framework`` ("torch" or a tinyvit tier's runner name)."""
    images, labels = make_batch(config, batch)
    runner = TinyvitRunner(config, images, labels, workers, TIER_OF.get(framework, "fast"))
    if framework == "torch":
        runner = TorchRunner(runner.model, runner.decay_names(), images, labels, gpu)
    return runner


def check_same_function(a, b):
    """Abort unless runners ``a`` and ``b`` give the same logits (train and eval
    mode) and loss; return the largest differences."""
    worst = {}
    for mode in (True, False):
        a.set_training(mode)
        b.set_training(mode)
        (logits_a, loss_a), (logits_b, loss_b) = a.logits_and_loss(), b.logits_and_loss()
        scale = max(float(np.abs(logits_b).max()), 1e-30)
        rel, dloss = float(np.abs(logits_a - logits_b).max()) / scale, abs(loss_a - loss_b)
        label = "train" if mode else "eval"
        worst[label] = {"logits_rel_diff": rel, "loss_diff": dloss}
        if not (rel < LOGITS_TOL and dloss < LOSS_TOL):
            sys.exit(
                f"ABORT: {a.name} and {b.name} compute different things ({label} mode):\n"
                f"  logits max abs diff / max |logit| = {rel:.3e} (must be < {LOGITS_TOL:g})\n"
                f"  loss: {a.name} {loss_a:.8f}, {b.name} {loss_b:.8f}, diff {dloss:.3e} "
                f"(must be < {LOSS_TOL:g})"
            )
    return worst


def check_runners(runners):
    """{name: largest differences} of every runner against the first, or abort."""
    return {r.name: check_same_function(runners[0], r) for r in runners[1:]}
